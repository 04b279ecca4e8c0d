"""pdl_context*.json: which kernel's PDL edge pays and which turns into a wait, at a short and a
long context (notebook 7; lab/measure/pdl_edges.py, which conformance runs too).

The unfused step at each of CONTEXTS, captured as a chain of steps (`advance` left out), per arm
(graph, graph+pdl, pdl - <kernel>) the device time per step, arms interleaved round after round.
Three experiments, one per trigger placement (TRIGGERS); where a kernel triggers is compiled
into it, so the two that move it run in processes of their own, on a GPU only:
  pdl_context        the lab's kernels                        pdl_context.json
  pdl_context_early  attention's kernels trigger right after their wait   pdl_context_early.json
  pdl_context_none   no kernel triggers (dependents launch at its exit)   pdl_context_none.json
"""
from __future__ import annotations

import sys

from lab.config import LabConfig
from lab.measure.experiment import experiment, now

CONTEXTS = (64, 900)
QUICK = dict(rounds=2, replays=2, edges=False)   # graph and graph+pdl only
TRIGGERS = {"lab": "the lab's kernels (each triggers first, attn_partial at its end)",
            "early": "every kernel triggers first (attn_partial too)",
            "none": "no kernel triggers (dependents launch when a kernel exits)"}


def patch_trigger(mode: str) -> None:
    """Before any kernel compiles, move where the kernels trigger their dependents: "none":
    every kernel module's `pdl_launch_dependents` emits nothing; "early": kernels/attention.py's
    kernels trigger right after their wait (their trigger at the end is then a no-op)."""
    from numba import cuda

    import kernels  # noqa: F401  (every kernel module imported)
    from kernels import attention
    from kernels.pdl import pdl_launch_dependents, pdl_wait

    @cuda.jit(device=True)
    def nothing():
        pass

    @cuda.jit(device=True)
    def wait_then_trigger():
        pdl_wait()
        pdl_launch_dependents()
    if mode == "none":
        for name, mod in list(sys.modules.items()):
            if name.startswith("kernels.") and hasattr(mod, "pdl_launch_dependents"):
                mod.pdl_launch_dependents = nothing
    elif mode == "early":
        attention.pdl_wait = wait_then_trigger


def format_table(res: dict) -> str:
    lines = []
    for c in res["contexts"]:
        lines.append(f"context {c['context']} (splits {c['splits']}, {c['launches']} launches "
                     f"per step, advance left out), us per step; arm - graph+pdl:")
        for r in c["rows"]:
            lines.append(f"  {r['arm']:<24} {r['us_per_step']:8.2f} ± {r['sem_us']:.2f}   "
                         f"{r['minus_pdl_us']:+7.2f} ± {r['minus_pdl_sem_us']:.2f}")
    lines.append(f"trigger: {res['trigger']}; source: {res['source']}")
    return "\n".join(lines)


def measure(ctx, trigger: str) -> None:
    """The arms at every context with the kernels' trigger `trigger`, written to its file."""
    from lab.measure import pdl_edges
    if trigger != "lab":
        patch_trigger(trigger)
    from lab.engine.runner import DecodeEngine
    p = QUICK if ctx.quick else dict(rounds=pdl_edges.ROUNDS, replays=pdl_edges.REPLAYS, edges=True)
    rounds, replays = p["rounds"], p["replays"]
    eng = DecodeEngine(ctx.model, LabConfig(backend=ctx.backend, graph=False))
    eng.bind()
    name = "pdl_context" if trigger == "lab" else f"pdl_context_{trigger}"
    res = {"what": "PDL edge by edge: the unfused step's chain with every launch programmatic "
                   "but one kernel's", "source": eng.backend.describe(), "date": now(),
           "recorded_by": f"decode-lab record {name}", "trigger": TRIGGERS[trigger],
           "method": {"steps_per_chain": pdl_edges.STEPS, "replays": replays, "rounds": rounds,
                      "order": "rotating per round", "advance": "left out",
                      "code": "lab/measure/pdl_edges.py"},
           "contexts": []}
    for c in CONTEXTS:
        res["contexts"].append(pdl_edges.measure(eng, c - 1, **p))
        ctx.progress(f"context {c}: {res['contexts'][-1]['launches']} launches per chained step")
    ctx.write_json(f"{name}.json", res)
    ctx.progress(f"== {name} ==\n{format_table(res)}")


@experiment("pdl_context", files=("pdl_context.json",), priority=150,
            doc="PDL edge by edge at contexts 64 and 900, the lab's kernels (notebook 7)")
def record_lab(ctx) -> None:
    measure(ctx, "lab")


@experiment("pdl_context_early", files=("pdl_context_early.json",), priority=160,
            backends=("cuda",), isolated=True,
            doc="the same, attention's kernels triggering right after their wait (notebook 7)")
def record_early(ctx) -> None:
    measure(ctx, "early")


@experiment("pdl_context_none", files=("pdl_context_none.json",), priority=210,
            backends=("cuda",), isolated=True,
            doc="the same, no kernel triggering its dependents (notebook 7)")
def record_none(ctx) -> None:
    measure(ctx, "none")
