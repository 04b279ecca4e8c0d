"""Record the fused step's attention forms against the unfused step, whole steps per context:
data/gpu/fused_tails.json (notebooks 06 and 10).

Arms (every one captured; `lab.measure.bench.run_sweep`, seek to each context, reps interleaved):
  graph, graph+pdl                  the unfused step (37 launches per token)
  fused grid graph, ... graph+pdl   LAB_FUSION=1, the grid tail (attn_fused_grid; 18 launches)
  fused grid split graph+pdl        ... its attention split into attn_partial + attn_combine (22)
  fused heads graph+pdl             LAB_FUSION=1 LAB_ATTN_TAIL=heads (attn_fused; 18)

  python scripts/record_gpu_tails.py --out DIR [--reps 5] [--tokens 32] [--contexts 64,900]
                                     [--backend cuda|sim]

`--backend sim` is a dry run on the simulator, labelled simulated.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lab.config import LabConfig  # noqa: E402
from lab.errors import LabError  # noqa: E402
from lab.measure import bench  # noqa: E402
from lab.measure.report import format_sweep  # noqa: E402
from scripts import recorder  # noqa: E402

ARMS = {   # name -> toggles over the base configuration (graph replay on)
    "graph": {},
    "graph+pdl": {"pdl": True},
    "fused grid graph": {"fusion": True},
    "fused grid graph+pdl": {"fusion": True, "pdl": True},
    "fused grid split graph+pdl": {"fusion": True, "pdl": True, "split_combine": True},
    "fused heads graph+pdl": {"fusion": True, "pdl": True, "attn_tail": "heads"},
}


def main() -> int:
    ap = recorder.arguments(__doc__, backends=recorder.BACKENDS, reps=5, tokens=32)
    ap.add_argument("--contexts", default="64,900", help="comma-separated context lengths")
    args = ap.parse_args()
    try:
        contexts = [int(c) for c in args.contexts.split(",") if c.strip()]
    except ValueError:
        raise LabError(f"--contexts {args.contexts!r}: give comma-separated integers") from None
    if not contexts or args.reps < 2 or args.tokens < 1:
        raise LabError("give at least one context, --reps 2 or more and --tokens 1 or more")
    out = recorder.out_dir(args.out)
    model = recorder.load(args)
    base = LabConfig(backend=args.backend, graph=True)
    arms = {name: base.replace(**kw) for name, kw in ARMS.items()}
    res = bench.run_sweep(model, arms, contexts, reps=args.reps, tokens=args.tokens,
                          progress=recorder.stopwatch())
    res["recorded_by"] = "scripts/record_gpu_tails.py"
    res["date"] = recorder.now()
    recorder.record(out, "fused_tails", res, format_sweep(res))
    return 0 if res["meaningful"] else 1


if __name__ == "__main__":
    sys.exit(recorder.run(main))
