"""Where the megakernel's time goes, on a GPU: a table per phase from step_persistent_stamped's
clock stamps, the kernel's span over grid sizes, and every variant of its body
(kernels/persistent.py's VARIANTS; with --variants, PROBES too: bodies that leave work out, a
bound on what a restructured body could gain) timed against the fused graph arms with PDL,
interleaved.

    python3 scripts/megakernel_probe.py [--variants all] [--context 64] [--launches 30]
                                        [--grids 33,66,132] [--contexts 64,900] [--reps 5]
                                        [--tokens 64]

  1. the phase table: the persistent engine decodes the bench prompt up to --context, then
     step_persistent_stamped (kernels/persistent.py: the kernel's body with a stamp per block
     and phase) runs --launches times at that position on the engine's own buffers. Per layer
     and phase (median over the launches): the blocks with items, when the first busy block
     started and the last ended (globaltimer, us from the kernel's first stamp), the mean and
     max wait of the busy blocks (start -> their wait returned) and their mean work (wait
     returned -> end), from clock64 converted by each block's measured clock rate
  2. the kernel's span (first block's start -> last block's end, globaltimer) at each grid in
     --grids that the device co-schedules: what the step costs on the device, no launch in it
  3. graph replay ms/token at --contexts for the fused step with PDL (grid tail; its split
     form) and LAB_PERSISTENT=1 with each variant in --variants (lab/engine/persistent.py's
     variant_step: an engine of its own each; the default is step_persistent), interleaved
     (lab/measure/bench.py's sweep_arms); then one table: each variant's ms/token and its
     ratio to the best fused arm at each context
Everything printed is measured on this GPU (the header names it). Needs the cuda backend.
"""
from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from lab.measure.megakernel import (engine_at, kernel_span_us, persistent_error,  # noqa: E402
                                    phase_kinds, phase_rows, ratio_to_best, stamped_kernel,
                                    stamped_runs, sweep_with_variants)

ARMS = {"fused+pdl graph": dict(fusion=True, pdl=True),
        "fused+split+pdl graph": dict(fusion=True, split_combine=True, pdl=True)}


def _bodies() -> dict:
    """Every body the probe can time: VARIANTS (the step's bits) and PROBES (work left out:
    timing only, a bound on what a restructured body could gain)."""
    from kernels import persistent
    return {**persistent.VARIANTS, **persistent.PROBES}


def _variants(text: str) -> tuple[str, ...]:
    from kernels import persistent
    names = tuple(persistent.VARIANTS) if text == "all" else tuple(v for v in text.split(",") if v)
    for n in names:
        if n not in _bodies():
            raise SystemExit(f"--variants: no {n!r}; use all or some of "
                             f"{','.join(_bodies())}")
    return names


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(",") if v)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="scripts/megakernel_probe.py", description=__doc__.split("\n")[0])
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--launches", type=int, default=30)
    ap.add_argument("--grids", type=_ints, default=(33, 66, 132))
    ap.add_argument("--contexts", type=_ints, default=(64, 900))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--no-sweep", action="store_true", help="the stamps only")
    ap.add_argument("--variants", default="all",
                    help="all (VARIANTS), or a comma list of kernels/persistent.py's VARIANTS "
                         "and PROBES (work left out: timing only) to time")
    ap.add_argument("--stamp-variants", default="",
                    help="a comma list of other VARIANTS whose stamped form gets a phase-kind "
                         "table too, after the default's")
    args = ap.parse_args(argv)

    from kernels import persistent
    from lab.config import LabConfig
    from lab.measure.bench import BENCH_PROMPT
    from lab.measure.registry import revision
    from lab.model import DEFAULT_WEIGHTS, load_model

    model = load_model(DEFAULT_WEIGHTS)
    base = LabConfig(backend="cuda")
    c = model.cfg
    ids = model.tokenizer.encode(BENCH_PROMPT)
    if not ids.size - 1 <= args.context < c.max_seq - 1:
        raise SystemExit(f"--context {args.context}: use {ids.size - 1} .. {c.max_seq - 2}")
    eng, launch = engine_at(model, base, args.context)                # a real prefix
    rev = revision()
    print(f"scripts/megakernel_probe.py {' '.join(argv if argv is not None else sys.argv[1:])}; "
          f"commit {rev['commit']}{' (dirty)' if rev['dirty'] else ''}; "
          f"{datetime.date.today().isoformat()}")
    print(eng.describe())
    print(f"step_persistent: grid {launch.grid}, block {launch.block}, "
          f"{persistent.waits_per_token(c.n_layer)} counter waits per token (variant "
          f"{persistent.DEFAULT_VARIANT}), splits "
          f"{eng.plan(args.context).splits} at context {args.context}")
    kern = stamped_kernel(base.kv_dtype)

    # ---- 1. the phase table at the engine's grid
    runs = stamped_runs(eng, kern, launch.grid[0], args.context, args.launches)
    rows = phase_rows(runs, c.n_layer)
    print(f"\nper phase, median of {args.launches} launches at context {args.context} "
          f"(us; start/end: globaltimer from the kernel's first stamp; wait/work: clock64)")
    print(f"{'phase':<14} {'blocks':>6} {'items':>6} {'start':>8} {'end':>8} {'wait':>7} "
          f"{'wait max':>8} {'work':>7}")
    for r in rows:
        print(f"{r['phase']:<14} {r['busy']:>6.0f} {r['items']:>6.0f} {r['start']:>8.2f} "
              f"{r['end']:>8.2f} {r['wait']:>7.2f} {r['wait_max']:>8.2f} {r['work']:>7.2f}")
    print("\nper phase kind, mean over layers (us): end-to-end step of the chain "
          "(this phase's end - the previous phase's end), wait, work")
    for k, v in phase_kinds(rows).items():
        print(f"  {k:<12} step {v['step']:6.2f}  wait {v['wait']:6.2f}  work {v['work']:6.2f}")
    for name in _variants(args.stamp_variants) if args.stamp_variants else ():
        vrows = phase_rows(stamped_runs(eng, stamped_kernel(base.kv_dtype, name),
                                        launch.grid[0], args.context, args.launches), c.n_layer)
        span = max(r["end"] for r in vrows)
        print(f"\nvariant {name}, stamped the same way: per phase kind, mean over layers (us); "
              f"its exit ends at {span:.2f}")
        for k, v in phase_kinds(vrows).items():
            print(f"  {k:<12} step {v['step']:6.2f}  wait {v['wait']:6.2f}  "
                  f"work {v['work']:6.2f}")

    # ---- 2. the kernel's span over grid sizes
    sms, co, why = eng.backend.cooperative_limits(launch.kernel, launch.block[0])
    print(f"\nkernel span (first block start -> last block end, globaltimer), {args.launches} "
          f"launches each; the device co-schedules {co} blocks of {launch.block[0]} threads "
          f"({sms} SMs)")
    for g in sorted(set(args.grids) | {launch.grid[0]}):
        if g > co:
            print(f"  grid {g:>4}: not co-resident, skipped")
            continue
        med, best = kernel_span_us(stamped_runs(eng, kern, g, args.context, args.launches))
        print(f"  grid {g:>4}: median {med:7.2f} us, min {best:7.2f} us")

    # ---- 3. graph replay, interleaved: every variant against the fused graph arms with PDL
    if not args.no_sweep:
        names = _variants(args.variants)
        sweep, arms = sweep_with_variants(model, base, ARMS, names, args.contexts, args.reps,
                                          args.tokens)
        print(f"\ngraph replay, interleaved ({sweep['source']}); meaningful: "
              f"{sweep['meaningful']} {sweep['reason'] or ''}")
        print(f"{'context':>7}  {'arm':<26} {'ms/token':>9} {'± sem us':>9} {'launches':>8}")
        for r in sweep["rows"]:
            print(f"{r['context']:>7}  {r['arm']:<26} {r['mean_ms']:>9.4f} "
                  f"{1000 * r['sem_ms']:>9.2f} {r['launches_per_token']:>8}")
        for a in arms[len(ARMS):]:
            persistent_error(a.engine)
        ms = {(r["context"], r["arm"]): r["mean_ms"] for r in sweep["rows"]}
        ratios = ratio_to_best(sweep["rows"], ARMS)
        print(f"\nvariants (default {persistent.DEFAULT_VARIANT}: step_persistent): ms/token "
              f"and ratio to the best fused graph arm at each context (target < 1)")
        print(f"{'variant':<16} {'choices':<34} " + " ".join(
            f"{'ms@' + str(c):>9} {'ratio@' + str(c):>9}" for c in args.contexts))
        for name in names:
            v = _bodies()[name]
            on = ",".join(k for k, x in v.items() if x and k != "epochs") or "plain"
            print(f"{name:<16} {on + (' epoch' if v['epochs'] else ' arrive'):<34} "
                  + " ".join(f"{ms[c, 'persistent ' + name]:>9.4f} "
                             f"{ratios[str(c)]['persistent ' + name]:>9.3f}"
                             for c in args.contexts))
        print("best fused   " + " ".join(f"{c}: {ratios[str(c)]['best_ms']:.4f} ms"
                                         for c in args.contexts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
