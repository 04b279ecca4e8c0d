"""Which kernel's PDL edge pays and which turns into a wait, at a short and a long context:
DIR/pdl_context.json.

  python scripts/record_gpu_pdl_context.py --out DIR [--backend cuda] [--trigger early|none]

The unfused step at each context of CONTEXTS, captured as a chain of steps (the `advance` node
left out, so every step of the chain attends over the same context), replayed; per arm, the
device time per step (lab/measure/pdl_edges.py, which the simulator's conformance check runs
too):
  graph           no launch programmatic
  graph+pdl       every launch programmatic (LAB_PDL=1's step)
  pdl - <kernel>  every launch programmatic except the launches of <kernel>: that kernel waits
                  for its predecessor as on a plain stream, so the arm minus graph+pdl is what
                  the edges INTO <kernel> save (positive) or cost (negative: that kernel's
                  early launch turns into a wait)
Arms interleaved in rotating order, round after round; mean and standard error over the rounds.

--trigger early compiles kernels/attention.py's kernels with their dependents triggered right
after their wait (attn_partial as it was before it triggered at its end); --trigger none with
`pdl_launch_dependents()` emitting nothing anywhere (a kernel's dependents launch when it exits).
The same arms: where a kernel triggers is what moves its dependents' edge. Kernels compile once
per process, so each of these is a process of its own (DIR/pdl_context_<mode>.json).
"""
from __future__ import annotations

import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lab.config import LabConfig  # noqa: E402
from lab.measure import pdl_edges  # noqa: E402
from scripts import recorder  # noqa: E402

CONTEXTS = (64, 900)

TRIGGERS = {"lab": "the lab's kernels (each triggers first, attn_partial at its end)",
            "early": "every kernel triggers first (attn_partial too)",
            "none": "no kernel triggers (dependents launch when a kernel exits)"}


def _patch_trigger(mode: str) -> None:
    """Before any kernel compiles, change where the kernels trigger their dependents:
    "none": every kernel module's `pdl_launch_dependents` emits nothing (dependents launch when
    a kernel exits); "early": kernels/attention.py's kernels trigger right after their wait, as
    attn_partial did before it triggered at its end (its trigger at the end is then a no-op)."""
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


def main(argv=None) -> int:
    ap = recorder.arguments(__doc__, backends=("cuda", "sim"), weights=True)
    ap.add_argument("--quick", action="store_true",
                    help="2 rounds of 3 replays (a dry run of the script, not a measurement)")
    ap.add_argument("--trigger", choices=("lab", "early", "none"), default="lab",
                    help="where the kernels trigger their dependents (see above)")
    args = ap.parse_args(argv)
    out = recorder.out_dir(args.out)
    rounds, replays = (2, 3) if args.quick else (pdl_edges.ROUNDS, pdl_edges.REPLAYS)
    if args.trigger != "lab":
        if args.backend != "cuda":
            return recorder.refuse("record_gpu_pdl_context.py",
                                   f"--trigger {args.trigger} needs --backend cuda "
                                   f"(the simulator has no trigger)")
        _patch_trigger(args.trigger)
    from lab.engine.runner import DecodeEngine
    model = recorder.load(args)
    eng = DecodeEngine(model, LabConfig(backend=args.backend, graph=False))
    eng.bind()
    progress = recorder.stopwatch()
    res = {"what": "PDL edge by edge: the unfused step's chain with every launch programmatic "
                   "but one kernel's", "source": eng.backend.describe(), "date": recorder.now(),
           "recorded_by": "scripts/record_gpu_pdl_context.py",
           "trigger": TRIGGERS[args.trigger],
           "method": {"steps_per_chain": pdl_edges.STEPS, "replays": replays, "rounds": rounds,
                      "order": "rotating per round", "advance": "left out",
                      "code": "lab/measure/pdl_edges.py"},
           "contexts": []}
    for c in CONTEXTS:
        res["contexts"].append(pdl_edges.measure(eng, c - 1, rounds=rounds, replays=replays))
        progress(f"context {c}: {res['contexts'][-1]['launches']} launches per chained step")
    name = "pdl_context" if args.trigger == "lab" else f"pdl_context_{args.trigger}"
    recorder.record(out, name, res, format_table(res))
    return 0


if __name__ == "__main__":
    sys.exit(recorder.run(main))
