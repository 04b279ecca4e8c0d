"""Where the megakernel's time goes, on a GPU (scripts/megakernel_probe.py prints it; the
persistent experiment records it in persistent.json):

  stamped_kernel, stamped_runs   step_persistent_stamped (kernels/persistent.py: the default
                                 body with a clock stamp per block and phase) on an engine's
                                 own buffers, launched directly at one position
  phase_rows, phase_kinds        per phase (median over launches): blocks busy, items, first
                                 start and last end (globaltimer), the busy blocks' mean and
                                 max wait and mean work (clock64 at each block's rate); then
                                 per phase kind, the mean over layers
  kernel_span_us                 the kernel's span, first block's start to last block's end
  phase_kind                     a phase row's kind ("L2 qkv" -> "qkv")
  predicted_step_us              the graph step predicted from each phase's work, a counter
                                 hand-off per phase and one node's floor
                                 (lab/measure/conformance.py's megakernel row)
  variant_arms                   one bench Arm per body variant (kernels/persistent.py
                                 VARIANTS; lab/engine/persistent.py variant_step)
  sweep_with_variants            config arms and body variants interleaved (bench.sweep_arms)
  ratio_to_best                  each persistent arm's ms/token over the best multi-node arm's,
                                 per context of a sweep (persistent.json, megakernel_bound.json)
  fold_verdict                   what megakernel_bound.json's ratios say of folding the output
                                 projection into the attention's tail
  engine_at                      an eager persistent engine with a real prefix up to a context
"""
from __future__ import annotations

from collections import Counter

import numpy as np


def stamped_kernel(dtype, variant: str | None = None):
    """step_persistent_stamped compiled for this device (launch bounds as the registered one's),
    or the stamped form of body `variant` (kernels/persistent.py VARIANTS; None: the default)."""
    from numba import cuda
    from kernels import REGISTRY, persistent
    sig = persistent.STAMPED_SIGS[0 if np.dtype(dtype) == np.float32 else 1]
    return cuda.jit(sig, **dict(REGISTRY["step_persistent"].jit_options))(
        persistent.variant_kernel(variant or persistent.DEFAULT_VARIANT, stamped=True))


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


def phase_kind(phase: str) -> str:
    """A phase row's kind: the name without its layer ("L2 qkv" -> "qkv", "LM head" -> "head"),
    "exit" as it is."""
    return phase.split(" ", 1)[1] if phase.startswith("L") else phase


def phase_kinds(rows: list[dict]) -> dict[str, dict]:
    """Per phase kind (qkv, attention, ..., LM head, exit), the mean over layers of its step
    in the chain (its end minus the previous phase's end), wait and work (us)."""
    ends = [r["end"] for r in rows]
    steps = np.diff([0.0] + ends)
    kinds: dict[str, list] = {}
    for r, dt in zip(rows, steps):
        kinds.setdefault(phase_kind(r["phase"]), []).append((dt, r["wait"], r["work"]))
    out = {}
    for k, v in kinds.items():
        a = np.array(v, dtype=np.float64)
        out[k] = {"step": float(np.nanmean(a[:, 0])), "wait": float(np.nanmean(a[:, 1])),
                  "work": float(np.nanmean(a[:, 2]))}
    return out


def predicted_step_us(phases: dict, floor_us: float) -> dict:
    """The persistent graph step predicted from parts measured apart, as a chain: every phase a
    token runs costs its work (the stamped kernel's clocks: a block's time from its wait's
    return to its phase's end, phase_kinds' mean over layers of the blocks' medians) plus one
    counter hand-off, the phases run one after another; plus `floor_us`, what a graph replay
    costs beyond its one kernel. The hand-off: the shortest mean wait of any phase kind, over
    the phases that wait (all but the first; the down projection's on the H200: its producers are done by the time it polls, so its
    wait is the count's round trip). What the chain leaves out is what the work of a median
    block does not show: the slowest block of each phase (the step waits for it) and phases
    that overlap. `phases`: persistent.json's (its rows as phase_rows writes them).
    {"work_us", "handoff_us", "handoffs", "phases_us", "floor_us", "step_us",
     "kinds": {kind: (phases per token, work us)}}."""
    rows = phases["rows"]
    counts = Counter(phase_kind(r["phase"]) for r in rows)
    per_kind = phase_kinds(rows)
    kinds = {k: (counts[k], v["work"]) for k, v in per_kind.items()}
    work = float(sum(n * w for n, w in kinds.values()))
    waits: dict[str, list] = {}   # the first phase (layer 0's qkv) waits for nothing
    for r in rows[1:]:
        waits.setdefault(phase_kind(r["phase"]), []).append(r["wait"])
    handoff = float(min(np.nanmean(w) for w in waits.values()))
    n = len(rows)
    chain = work + n * handoff
    return {"work_us": work, "handoff_us": handoff, "handoffs": n, "phases_us": chain,
            "floor_us": float(floor_us), "step_us": chain + float(floor_us), "kinds": kinds}


def variant_arms(model, base, names, first: int) -> list:
    """A bench Arm per variant in `names` (LAB_PERSISTENT=1 on an engine of its own whose step
    is lab/engine/persistent.py's variant_step(name)), named "persistent NAME"; `first` numbers
    their backends after the other arms'."""
    from lab.engine.persistent import variant_step
    from lab.engine.runner import DecodeEngine
    from lab.measure.arms import Arm, default_backend
    arms = []
    for i, name in enumerate(names, first):
        cfg = base.replace(persistent=True)
        eng = DecodeEngine(model, cfg, backend=default_backend(cfg, i), step=variant_step(name))
        arms.append(Arm(f"persistent {name}", cfg, eng))
    return arms


def sweep_with_variants(model, base, arms: dict, variants, contexts, reps: int, tokens: int):
    """`arms` (name: toggles over `base`, on one engine where the toggles allow) and the
    persistent step with each body of `variants` (an engine each), interleaved at each context
    from the bench prompt (lab/measure/bench.py's sweep_arms). Returns (sweep, the Arms)."""
    from lab.measure.arms import make_arm
    from lab.measure.bench import BENCH_PROMPT, check_contexts, sweep_arms
    check_contexts(model, contexts, tokens, BENCH_PROMPT)
    pool: dict = {}
    bench = [make_arm(model, n, base.replace(**kw), i, pool=pool)
             for i, (n, kw) in enumerate(arms.items())]
    bench += variant_arms(model, base, variants, len(bench))
    return sweep_arms(bench, contexts, reps, tokens, BENCH_PROMPT), bench


def ratio_to_best(rows: list[dict], multi_node) -> dict:
    """{context: {"best_multi_node", "best_ms", and each arm named "persistent ...": its ms/token
    over the best arm's}} from a sweep's rows, contexts in increasing order; the best is the
    fastest of `multi_node` at that context."""
    out = {}
    for c in sorted({r["context"] for r in rows}):
        ms = {r["arm"]: r["mean_ms"] for r in rows if r["context"] == c}
        best = min(multi_node, key=lambda a: ms[a])
        out[str(c)] = {"best_multi_node": best, "best_ms": ms[best],
                       **{a: ms[a] / ms[best] for a in ms if a.startswith("persistent")}}
    return out


def fold_verdict(ratios: dict) -> str:
    """What megakernel_bound.json's `ratio_to_best_multi_node` says of a body that folds the
    output projection into the attention's tail (its time cannot be below the probe's): the
    contexts where no probe is ahead of the best multi-node arm (`gate_reachable` False)."""
    behind = [c for c, r in ratios.items() if not r["gate_reachable"]]
    if not behind:
        return ("ahead of it at every context, so a body that folded that phase into the "
                "attention's tail could meet the gate if its projection costs less than the "
                "margin")
    where = ("either context" if len(behind) == len(ratios)
             else "context " + " or ".join(behind))
    return (f"a body that folded that phase into the attention's tail, whose time cannot be "
            f"below this one's, cannot meet the gate at {where}")


def engine_at(model, base, context: int):
    """(engine, launch): a LAB_PERSISTENT=1 eager engine that decoded the bench prompt up to
    `context` (a real prefix in its cache), and its step's one launch there. `context` must lie
    in [prompt length - 1, max_seq - 1) (the caller checks)."""
    from lab.engine.runner import DecodeEngine
    from lab.measure.bench import BENCH_PROMPT
    eng = DecodeEngine(model, base.replace(persistent=True, graph=False))
    ids = model.tokenizer.encode(BENCH_PROMPT)
    eng.generate(BENCH_PROMPT, context - ids.size + 1)
    (launch,) = eng.step_launches(eng.plan(context))
    return eng, launch
