"""Where the megakernel's time goes, on a GPU: a table per phase from step_persistent_stamped's
clock stamps, the kernel's span over grid sizes, and every variant of its body
(kernels/persistent.py's VARIANTS) timed against the fused graph arms with PDL, interleaved.

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
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

ARMS = {"fused+pdl graph": dict(fusion=True, pdl=True),
        "fused+split+pdl graph": dict(fusion=True, split_combine=True, pdl=True)}
PERSISTENT = dict(persistent=True)     # each variant's arm: its own step class (variant_step)


def _variants(text: str) -> tuple[str, ...]:
    from kernels import persistent
    names = tuple(persistent.VARIANTS) if text == "all" else tuple(v for v in text.split(",") if v)
    for n in names:
        if n not in persistent.VARIANTS:
            raise SystemExit(f"--variants: no {n!r}; use all or some of "
                             f"{','.join(persistent.VARIANTS)}")
    return names


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(",") if v)


def stamped_kernel(dtype):
    """step_persistent_stamped compiled for this device (launch bounds as the registered one's)."""
    from numba import cuda
    from kernels import REGISTRY, persistent
    sig = persistent.STAMPED_SIGS[0 if np.dtype(dtype) == np.float32 else 1]
    return cuda.jit(sig, **dict(REGISTRY["step_persistent"].jit_options))(
        persistent.step_persistent_stamped)


def stamped_runs(eng, kern, grid: int, position: int, launches: int) -> list[np.ndarray]:
    """`launches` stamped steps at `position` on the engine's buffers: the stamps of each."""
    from numba import cuda
    from kernels import persistent
    from lab.backend.base import Buffer
    (launch,) = eng.step_launches(eng.plan(position))
    args = [a.handle[1] if isinstance(a, Buffer) else a for a in launch.args]
    n_ph = persistent.phase_count(eng.model.cfg.n_layer)
    out = []
    for _ in range(launches):
        eng.seek(position)
        eng.backend.synchronize()
        stamps = cuda.to_device(np.zeros((grid, n_ph, persistent.STAMP_FIELDS), np.int64))
        kern[(grid,), launch.block](*args, stamps)
        cuda.synchronize()
        out.append(stamps.copy_to_host())
    persistent_error(eng)
    return out


def persistent_error(eng) -> None:
    from lab.engine.persistent import check_error_word
    check_error_word(eng.backend, eng.devices[0].persistent.counter)


def phase_rows(runs: list[np.ndarray], n_layer: int) -> list[dict]:
    """Per phase, the median over launches of: busy blocks, first start, last end (us from the
    kernel's first stamp, globaltimer), mean/max wait and mean work of the busy blocks (us,
    clock64 at each block's rate)."""
    from kernels import persistent
    names = [f"L{l} {p}" for l in range(n_layer) for p in persistent.PHASES] + ["LM head", "exit"]
    per = []
    for st in runs:
        st = st.astype(np.float64)
        t0 = st[:, 0, 3].min()
        # each block's clock rate: cycles per ns over its whole step
        span_c = st[:, -1, 2] - st[:, 0, 0]
        span_g = np.maximum(st[:, -1, 5] - st[:, 0, 3], 1.0)
        rate = np.where(span_c > 0, span_c / span_g, np.nan)            # [blocks] cycles / ns
        rows = []
        for ph in range(st.shape[1]):
            s = st[:, ph]
            busy = s[:, 6] > 0
            if not busy.any():
                rows.append(dict(busy=0, items=0, start=np.nan, end=np.nan, wait=np.nan,
                                 wait_max=np.nan, work=np.nan))
                continue
            b = s[busy]
            wait = (b[:, 1] - b[:, 0]) / rate[busy] / 1e3
            work = (b[:, 2] - b[:, 1]) / rate[busy] / 1e3
            rows.append(dict(busy=int(busy.sum()), items=int(b[:, 6].sum()),
                             start=(b[:, 3].min() - t0) / 1e3, end=(b[:, 5].max() - t0) / 1e3,
                             wait=float(np.nanmean(wait)), wait_max=float(np.nanmax(wait)),
                             work=float(np.nanmean(work))))
        per.append(rows)
    out = []
    for i, name in enumerate(names):
        med = {k: float(np.nanmedian([r[i][k] for r in per])) for k in per[0][i]}
        out.append({"phase": name, **med})
    return out


def kernel_span_us(runs: list[np.ndarray]) -> tuple[float, float]:
    """Median and min over launches of first block start -> last block end (globaltimer, us)."""
    spans = [(st[:, -1, 5].max() - st[:, 0, 3].min()) / 1e3 for st in runs]
    return float(np.median(spans)), float(np.min(spans))


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
                    help="all, or a comma list of kernels/persistent.py's VARIANTS to time")
    args = ap.parse_args(argv)

    from kernels import persistent
    from lab.config import LabConfig
    from lab.engine.runner import DecodeEngine
    from lab.measure.bench import BENCH_PROMPT, run_sweep
    from lab.model import DEFAULT_WEIGHTS, load_model

    model = load_model(DEFAULT_WEIGHTS)
    base = LabConfig(backend="cuda")
    eng = DecodeEngine(model, base.replace(persistent=True, graph=False))
    c = model.cfg
    ids = model.tokenizer.encode(BENCH_PROMPT)
    if not ids.size - 1 <= args.context < c.max_seq - 1:
        raise SystemExit(f"--context {args.context}: use {ids.size - 1} .. {c.max_seq - 2}")
    eng.generate(BENCH_PROMPT, args.context - ids.size + 1)           # a real prefix
    (launch,) = eng.step_launches(eng.plan(args.context))
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
    per_phase = {}
    for r in rows[:-2]:
        per_phase.setdefault(r["phase"].split(" ", 1)[1], []).append(r)
    print("\nper phase kind, mean over layers (us): end-to-end step of the chain "
          "(this phase's end - the previous phase's end), wait, work")
    ends = [r["end"] for r in rows]
    steps = np.diff([0.0] + ends)
    kinds = {}
    for r, dt in zip(rows, steps):
        k = r["phase"].split(" ", 1)[1] if r["phase"].startswith("L") else r["phase"]
        kinds.setdefault(k, []).append((dt, r["wait"], r["work"]))
    for k, v in kinds.items():
        a = np.array(v, dtype=np.float64)
        print(f"  {k:<12} step {np.nanmean(a[:, 0]):6.2f}  wait {np.nanmean(a[:, 1]):6.2f}  "
              f"work {np.nanmean(a[:, 2]):6.2f}")

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
        from lab.engine.persistent import variant_step
        from lab.measure.arms import Arm, default_backend, make_arm
        from lab.measure.bench import sweep_arms
        names = _variants(args.variants)
        pool: dict = {}
        arms = [make_arm(model, n, base.replace(**kw), i, pool=pool)
                for i, (n, kw) in enumerate(ARMS.items())]
        for i, name in enumerate(names, len(arms)):
            cfg = base.replace(**PERSISTENT)
            eng_v = DecodeEngine(model, cfg, backend=default_backend(cfg, i),
                                 step=variant_step(name))
            arms.append(Arm(f"persistent {name}", cfg, eng_v))
        sweep = sweep_arms(arms, args.contexts, args.reps, args.tokens, BENCH_PROMPT)
        print(f"\ngraph replay, interleaved ({sweep['source']}); meaningful: "
              f"{sweep['meaningful']} {sweep['reason'] or ''}")
        print(f"{'context':>7}  {'arm':<26} {'ms/token':>9} {'± sem us':>9} {'launches':>8}")
        for r in sweep["rows"]:
            print(f"{r['context']:>7}  {r['arm']:<26} {r['mean_ms']:>9.4f} "
                  f"{1000 * r['sem_ms']:>9.2f} {r['launches_per_token']:>8}")
        for a in arms[len(ARMS):]:
            persistent_error(a.engine)
        ms = {(r["context"], r["arm"]): r["mean_ms"] for r in sweep["rows"]}
        best = {c: min(ms[c, n] for n in ARMS) for c in args.contexts}
        print(f"\nvariants (default {persistent.DEFAULT_VARIANT}: step_persistent): ms/token "
              f"and ratio to the best fused graph arm at each context (target < 1)")
        print(f"{'variant':<16} {'preload':>7} {'exit':>6} " + " ".join(
            f"{'ms@' + str(c):>9} {'ratio@' + str(c):>9}" for c in args.contexts))
        for name in names:
            v = persistent.VARIANTS[name]
            print(f"{name:<16} {str(v['preload']):>7} {'epoch' if v['epochs'] else 'arrive':>6} "
                  + " ".join(f"{ms[c, 'persistent ' + name]:>9.4f} "
                             f"{ms[c, 'persistent ' + name] / best[c]:>9.3f}"
                             for c in args.contexts))
        print("best fused   " + " ".join(f"{c}: {best[c]:.4f} ms" for c in args.contexts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
