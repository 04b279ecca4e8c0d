"""fused_tails.json: the fused step's attention forms against the unfused step (notebooks 06, 10).

Arms (every one captured; lab.measure.bench.run_sweep, seek to each context, reps interleaved):
  graph, graph+pdl                  the unfused step (37 launches per token)
  fused grid graph, ... graph+pdl   LAB_FUSION=1, the grid tail (attn_fused_grid; 18 launches)
  fused grid split graph+pdl        ... its attention split into attn_partial + attn_combine (22)
  fused heads graph+pdl             LAB_FUSION=1 LAB_ATTN_TAIL=heads (attn_fused; 18)
"""
from __future__ import annotations

from lab.config import LabConfig
from lab.errors import LabError
from lab.measure import bench
from lab.measure.experiment import experiment, now
from lab.measure.report import format_sweep

CONTEXTS = (64, 900)
ARMS = {   # name -> toggles over the base configuration (graph replay on)
    "graph": {},
    "graph+pdl": {"pdl": True},
    "fused grid graph": {"fusion": True},
    "fused grid graph+pdl": {"fusion": True, "pdl": True},
    "fused grid split graph+pdl": {"fusion": True, "pdl": True, "split_combine": True},
    "fused heads graph+pdl": {"fusion": True, "pdl": True, "attn_tail": "heads"},
}


@experiment("tails", ("fused_tails.json",), priority=45)
def tails(ctx) -> None:
    """The fused step's attention tails (grid, grid split, heads) against the unfused step,
    whole captured steps at a short and a long context (notebooks 06 and 10)."""
    reps, tokens = (2, 4) if ctx.quick else (5, 32)
    base = LabConfig(backend=ctx.backend, graph=True)
    arms = {name: base.replace(**kw) for name, kw in ARMS.items()}
    res = bench.run_sweep(ctx.model, arms, CONTEXTS, reps=reps, tokens=tokens)
    res["date"] = now()
    res["recorded_by"] = "decode-lab record tails"
    ctx.write_json("fused_tails.json", res)
    print(format_sweep(res))
    if not res["meaningful"]:
        raise LabError(f"fused_tails.json is not meaningful: {res.get('reason', '')}")
