"""Measurement you can trust: paired interleaved A/B behind an A/A gate, context sweeps and
leave-one-out, each with its noise shown. The statistics live in `lab/measure/stats.py`.

Rules every function here follows:
- Arms are `LabConfig`s of ONE build (same weights, one process), run interleaved with the
  order alternated per rep (A B, B A, ...), after an untimed warm-up run per arm that compiles
  and captures every plan it meets. Arms that differ only in launch toggles (GRAPH, PDL,
  OVERLAP, SPLIT_COMBINE) share ONE engine, switched before each run: identical engine
  instances differ by their buffers' placement alone (data/gpu/engine_instances.json), and two
  engines would report that as an A/B effect.
- ms/token of a run = backend.clock() around its steps (model time on the simulator; wall time
  after a synchronize on a GPU). Standard errors are over reps; differences are paired by rep.
- `run_ab` first runs A against a second copy of A -- on the shared engine, interleaved like the
  A/B (the A/A gate: paired |t| within the t distribution's critical value for the reps at
  hand, at a nominal false-alarm rate of AA_ALPHA, and byte-identical token ids + final
  logits); if A/A fails, the A/B is marked not meaningful. `aa_false_alarm_table` measures
  how often identical arms fail it under the simulator's noise model.
- Per-token p50/p99 come from a separate pass with a clock() around EACH step (on a GPU that
  synchronizes per token, so it would distort the throughput pass).
- `run_sweep` reaches long contexts with `DecodeEngine.seek` (timing only: the skipped KV rows
  are never written, so outputs there are not comparable); `run_split_sweep` does the same for
  attention split policies (a pinned split count against `decode_plan`'s policy).
- The replay gate, counted from each arm's OWN ledger entries (the slices its warm-up and its
  timed runs wrote on the shared engine): an arm configured for graphs whose timed steps were
  under MIN_REPLAY_FRACTION replays is not labelled "graph" (its `mode` is "fallback"); an arm
  one of whose plans met more than one graph key over its warm-up and timed runs, or whose
  timed runs captured a graph for a plan it had already run, keyed its graphs on more than its
  plans (a graph per position, step or clock tick, captured in the warm-up and replayed in the
  timed reps: a replay share of 100% that no real decode would see). No result that contains
  either is meaningful: its `reason` names the arm, its share and fallback reasons, or the plan
  and the key parts that changed. A clean arm crossing plan boundaries passes: a graph per plan
  is the design.
- Every result carries `source` (backend.describe(): measured on which GPU, or simulated).

The machinery (arms, the replay gate, timed runs, interleaving) is lab/measure/arms.py; the A/A
gate's false-alarm rate under the simulator's noise is lab/measure/aa_noise.py. Results are
plain dicts; `lab/measure/report.py` turns them into tables, plots and files, and the
command line (`decode-lab bench`) lives with the other commands in `lab/__main__.py`.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from lab.config import TOGGLES, LabConfig  # noqa: F401 (TOGGLES: bench's vocabulary)
from lab.errors import LabError
from lab.plan import SPLIT_CHOICES
# the machinery (lab/measure/arms.py) and the statistics, under bench's name as well: callers
# write bench.make_arm, bench.interleave, bench.AA_ALPHA
from .aa_noise import aa_false_alarm_table, aa_noise_times  # noqa: F401
from .arms import (BENCH_PROMPT, GRAPH_OUTCOMES, MIN_REPLAY_FRACTION,  # noqa: F401
                   PER_TOKEN_SAMPLES, REPLAY_OUTCOMES, Arm, SplitArm, SplitPolicyEngine, _meta,
                   arm_mode, context_run, decode_run, default_backend, interleave, key_gate,
                   make_arm, parse_arm, per_token_pass, pool_key, replay_fraction, replay_gate)
from .stats import (AA_ALPHA, AA_T_THRESHOLD, aa_verdict, loo_rows, outputs_differ,  # noqa: F401
                    paired_test, percentiles, welch)


# ---- A/B behind an A/A gate ---------------------------------------------------------------------
def run_aa(model, a: LabConfig, reps: int = 5, tokens: int = 128, prompt: str = BENCH_PROMPT,
           progress=False, aa_threshold: float | None = None, kv_init: str = "zeros",
           backend_factory: Callable | None = None, pool: dict | None = None,
           name: str = "A", aa_alpha: float = AA_ALPHA) -> tuple[dict, Arm]:
    """A against a second copy of A, interleaved like an A/B (sharing one engine when the pool
    allows): the A/A gate's verdict as a dict (stats.aa_verdict: the t critical value for
    `aa_alpha` at these reps, or the fixed |t| `aa_threshold`), and arm A (cleared, ready for
    the A/B)."""
    pool = {} if pool is None else pool
    arm_a = make_arm(model, name, a, 0, kv_init, backend_factory, pool)
    arm_a2 = make_arm(model, name + "'", a, 1, kv_init, backend_factory, pool)
    order = interleave([arm_a, arm_a2], reps, decode_run(prompt, tokens), progress, "A/A reps")
    verdict = aa_verdict(arm_a.ms, arm_a2.ms, arm_a.runs, arm_a2.runs, aa_threshold, aa_alpha)
    out = {**verdict.to_dict(), "arms": [arm_a.summary(), arm_a2.summary()], "run_order": order}
    arm_a.clear()
    return out, arm_a


def run_ab(model, a: LabConfig, b: LabConfig, reps: int = 5, tokens: int = 128,
           prompt: str = BENCH_PROMPT, progress=False, names=("A", "B"), aa: bool = True,
           aa_threshold: float | None = None, per_token: int = PER_TOKEN_SAMPLES,
           kv_init: str = "zeros", backend_factory: Callable | None = None,
           pool: dict | None = None, aa_alpha: float = AA_ALPHA) -> dict:
    """A/A (A vs a second copy of A), then the interleaved paired A/B, then per-token p50/p99.
    Arms share one engine when only launch toggles differ (see make_arm); the A/A then runs A
    twice on it, interleaved like the A/B. Returns a JSON-ready dict; `meaningful` is False
    (with `reason`) when the A/A gate fails or an arm fails the replay gate (a graph arm whose
    timed steps were under MIN_REPLAY_FRACTION replays, or whose graph keys held more than its
    plans: `key_gate`); without an A/A and with both arms through the replay gate it is None."""
    run = decode_run(prompt, tokens)
    pool = {} if pool is None else pool
    out = {}
    if aa:
        out["aa"], arm_a = run_aa(model, a, reps, tokens, prompt, progress, aa_threshold, kv_init,
                                  backend_factory, pool, names[0], aa_alpha)
    else:
        arm_a = make_arm(model, names[0], a, 0, kv_init, backend_factory, pool)
    arm_b = make_arm(model, names[1], b, 2, kv_init, backend_factory, pool)
    order_ab = interleave([arm_a, arm_b], reps, run, progress, "A/B reps", warm_up=True)
    test = paired_test(arm_a.ms, arm_b.ms)
    sa, sb = arm_a.summary(), arm_b.summary()
    pt = per_token_pass([arm_a, arm_b], prompt, per_token, tokens, progress)
    for s in (sa, sb):
        s["per_token"] = percentiles(pt[s["name"]]) if pt[s["name"]] else None
    ok = out["aa"]["ok"] if aa else None
    reasons = [f"A/A gate failed: {out['aa']['reason']}"] if aa and not ok else []
    fell_back = replay_gate([sa, sb])
    if fell_back:
        reasons.append(fell_back)
    out.update(_meta(arm_a.engine.backend.describe(), "paired interleaved A/B behind an A/A gate",
                     reps=reps, tokens=tokens, prompt=prompt, kv_init=kv_init,
                     order="alternating per rep (A B, B A, ...), warm-up excluded"))
    out.update({
        "arms": [sa, sb], "run_order": order_ab,
        "diff_b_minus_a_ms": test["diff"], "diff_sem_ms": test["sem"], "t": test["t"],
        "p": test["p"], "t_method": test["method"],
        "speedup_a_over_b": sa["mean_ms"] / sb["mean_ms"] if sb["mean_ms"] else float("nan"),
        "sem_ratio_a_over_b": sa["sem_ms"] / sb["sem_ms"] if sb["sem_ms"] else float("inf"),
        "outputs_identical_ab": not outputs_differ(arm_a.runs, arm_b.runs),
        "per_token_samples": per_token,
        "meaningful": False if reasons else ok, "reason": "; ".join(reasons),
    })
    if aa and not ok and out["aa"]["diff_ms"]:
        # context, not a verdict: how the A/B effect compares with the offset A/A already shows
        out["ab_over_aa"] = abs(test["diff"] / out["aa"]["diff_ms"])
        out["reason"] += (f"; for scale, |B - A| is {out['ab_over_aa']:.1f}x the A/A offset")
    return out


# ---- the launch-mechanism ladder ---------------------------------------------------------------
# (name, toggles over the base, what the rung removes). The persistent rung is another step, not
# another launch of the same step: its toggles set the step's other variants off (it refuses
# them), it runs on an engine of its own (its stacked buffers: `pool_key`), and its bits are the
# fused step's with the grid tail (LAB_FUSION=1 LAB_ATTN_TAIL=grid), so its outputs are
# compared with the other rungs' token ids only.
LADDER = (("dispatcher", dict(graph=False, launch="dispatcher"),
           "eager, numba's dispatcher: types and flattens every argument at every launch"),
          ("prebound", dict(graph=False, launch="prebound"),
           "eager, pre-bound: kernel handle and flattened arguments prepared once per plan"),
          ("graph", dict(graph=True), "one graph launch per token: the host submits once"),
          ("graph+pdl", dict(graph=True, pdl=True),
           "graph with programmatic edges: each node's launch overlaps its predecessor's tail"),
          ("persistent", dict(graph=True, pdl=False, fusion=False, split_combine=False,
                              overlap=False, persistent=True),
           "the whole step in one cooperative kernel (LAB_PERSISTENT=1), one graph node: no "
           "node boundary inside a token, counter waits instead (5 per layer, no grid barrier)"))


def fused_bits(cfg: LabConfig) -> str | bool:
    """Which arithmetic a config's step runs: False for the unfused step's; for the fused
    step's, its attention tail ("grid" or "heads": LAB_ATTN_TAIL; LAB_PERSISTENT=1 runs the
    fused step's math with the grid tail). Launch toggles keep the bits."""
    if cfg.persistent:
        return "grid"
    return cfg.attn_tail if cfg.fusion else False


def ladder_rungs(base: LabConfig, rungs=None) -> tuple[list, dict]:
    """The LADDER rungs to run over `base` (those named in `rungs`, in LADDER's order; all by
    default): [(name, config, what)], and {name: why} for each rung `base` cannot run (the
    persistent rung under a toggle or bug it refuses: LAB_RANKS=2, LAB_DRAFT, ...)."""
    names = [n for n, _, _ in LADDER]
    if rungs is not None:
        unknown = sorted(set(rungs) - set(names))
        if unknown:
            raise LabError(f"unknown ladder rung(s) {unknown}; known: {', '.join(names)}")
    out, skipped = [], {}
    for name, kw, what in LADDER:
        if rungs is not None and name not in rungs:
            continue
        try:
            out.append((name, base.replace(**kw), what))
        except LabError as exc:
            if name != "persistent":    # the launch rungs run wherever the base does
                raise
            skipped[name] = str(exc)
    return out, skipped


def _stand_ins(arm: Arm) -> list[str] | None:
    """On the simulator, the kernels of the arm's step that the cost file has no row for (the
    cost model prices them with a stand-in, not a prediction); None on a GPU."""
    cost = getattr(arm.engine.backend, "cost", None)
    if not arm.engine.backend.simulated or cost is None:
        return None
    from lab.backend.costmodel import cost_key
    eng = arm.use()
    return sorted({x.name for x in eng.step_launches(eng.plan(eng.position))
                   if cost_key(x) not in cost.kernels})


def run_ladder(model, base: LabConfig | None = None, reps: int = 5, tokens: int = 64,
               prompt: str = BENCH_PROMPT, progress=False, kv_init: str = "zeros",
               backend_factory: Callable | None = None, before_rep: Callable | None = None,
               pool: dict | None = None, rungs=None) -> dict:
    """The launch-mechanism ladder: each rung's ms/token and us per launch, interleaved and
    paired (the launch rungs on ONE engine: they differ only in launch toggles; the persistent
    rung on its own), outputs byte-compared (each rung against the first rung of its arithmetic,
    `fused_bits`; token ids across all); `meaningful` is False (with `reason`) when a graph rung
    fails the replay gate. `rungs`: the names to run (default all of LADDER); a rung `base`
    cannot run is left out and named in `skipped`. `before_rep(rep)` runs before each round (the
    cost recorder measures host costs there). On the simulator each row names in `stand_in` the
    kernels the cost file has no recorded cost for."""
    base = base or LabConfig()
    pool = {} if pool is None else pool
    chosen, skipped = ladder_rungs(base, rungs)
    arms, kept = [], []
    for i, (name, cfg, what) in enumerate(chosen):
        try:
            arms.append(make_arm(model, name, cfg, i, kv_init, backend_factory, pool))
        except LabError as exc:     # the device refuses the persistent step (co-residency)
            if name != "persistent":
                raise
            skipped[name] = str(exc)
            continue
        kept.append((name, cfg, what))
    chosen = kept
    order = interleave(arms, reps, decode_run(prompt, tokens), progress, "ladder reps",
                       before_rep=before_rep)
    rows = []
    for arm, (_, _, what) in zip(arms, chosen):
        sm = arm.summary()
        row = {**sm, "what": what,
               "us_per_launch": 1000.0 * sm["mean_ms"] / sm["launches_per_token"]}
        stand_in = _stand_ins(arm)
        if stand_in is not None:
            row["stand_in"] = stand_in
        rows.append(row)
    first = {}
    for a in arms:
        first.setdefault(fused_bits(a.cfg), a)
    same = all(not outputs_differ(first[fused_bits(a.cfg)].runs, a.runs) for a in arms)
    same_ids = all(np.asarray(ta).tobytes() == np.asarray(tb).tobytes()
                   for a in arms[1:] for (ta, _), (tb, _) in zip(arms[0].runs, a.runs))
    why = replay_gate(rows)
    ms = {r["name"]: r["mean_ms"] for r in rows}
    out = {**_meta(arms[0].engine.backend.describe(), "launch-mechanism ladder", reps=reps,
                   tokens=tokens, prompt=prompt, kv_init=kv_init),
           "arms": rows, "run_order": order, "outputs_identical": same,
           "token_ids_identical": same_ids,
           "outputs_compared": "byte for byte, each rung against the first rung of the same "
                               "arithmetic (the persistent rung runs the fused step's); token "
                               "ids across all rungs",
           "meaningful": not why, "reason": why}
    if skipped:
        out["skipped"] = skipped
    if "graph" in ms:
        for other in ("prebound", "dispatcher"):
            if other in ms:
                out[f"graph_over_{other}"] = ms[other] / ms["graph"]
    return out


# ---- context sweep -----------------------------------------------------------------------------
def parse_contexts(text, flag: str = "--contexts") -> list[int]:
    """'64,256,1000' -> [64, 256, 1000]; a refusal names `flag`, the argument it came from."""
    try:
        vals = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise LabError(f"{flag}: contexts must be comma-separated integers, got {text!r}") from None
    if not vals:
        raise LabError(f"{flag} {text!r}: give at least one context length")
    return vals


def check_contexts(model, contexts, tokens: int, prompt: str) -> None:
    """A LabError unless each context is past the prompt and leaves room for `tokens` steps."""
    max_seq = model.cfg.max_seq
    n_prompt = len(model.tokenizer.encode(prompt))
    for c in contexts:
        if c < n_prompt - 1:
            raise LabError(f"context {c} is inside the {n_prompt}-token prompt; "
                           f"use >= {n_prompt - 1}")
        if c + tokens >= max_seq:
            raise LabError(f"context {c} + {tokens} tokens = {c + tokens} passes max_seq {max_seq}"
                           f" (one position is the next token); the largest context for "
                           f"{tokens} tokens is {max_seq - 1 - tokens}")


def sweep_arms(arms: list[Arm], contexts, reps: int, tokens: int, prompt: str, progress=False,
               what: str = "decode speed per context length (seek: timing only)",
               **meta) -> dict:
    """The arms interleaved at each context in turn (seek: timing only); one row per context
    per arm, with its split count and replay share; `meaningful` is False (with `reason`) when
    a graph arm fails the replay gate at some context."""
    rows = []
    for c in contexts:
        for arm in arms:
            arm.clear()
        interleave(arms, reps, context_run(prompt, c, tokens), progress, f"context {c}")
        for arm in arms:
            s = arm.summary()
            rows.append({"context": c, "arm": arm.name, "splits": arm.use().plan(c).splits,
                         **{k: s[k] for k in ("toggles", "mean_ms", "sem_ms", "tok_per_s",
                                              "ms_per_token", "launches_per_token", "ledger",
                                              "replay_fraction", "mode", "fallback_reasons",
                                              "graph_keys", "plans", "key_faults")}})
    why = replay_gate([{**r, "name": f"{r['arm']} at context {r['context']}"} for r in rows])
    return {**_meta(arms[0].engine.backend.describe(), what, reps=reps, tokens=tokens, **meta),
            "contexts": list(contexts), "arms": [a.name for a in arms], "rows": rows,
            "meaningful": not why, "reason": why}


def run_sweep(model, arms: dict[str, LabConfig], contexts, reps: int = 3, tokens: int = 16,
              prompt: str = BENCH_PROMPT, progress=False, kv_init: str = "zeros",
              backend_factory: Callable | None = None) -> dict:
    """ms/token and tok/s per context per arm. Context c = tokens already in the cache: the
    timed steps run at positions c .. c + tokens - 1, reached with seek (timing only)."""
    check_contexts(model, contexts, tokens, prompt)
    pool: dict = {}
    bench = [make_arm(model, n, cfg, i, kv_init, backend_factory, pool)
             for i, (n, cfg) in enumerate(arms.items())]
    return sweep_arms(bench, contexts, reps, tokens, prompt, progress, kv_init=kv_init)


def run_split_sweep(model, policies: dict, contexts, cfg: LabConfig | None = None,
                    reps: int = 3, tokens: int = 8, prompt: str = BENCH_PROMPT, progress=False,
                    kv_init: str = "zeros", backend=None) -> dict:
    """The attention split-count trade-off: ms/token per context for each policy in `policies`
    (name -> a pinned split count from SPLIT_CHOICES, or None for decode_plan's policy),
    interleaved on ONE SplitPolicyEngine (`cfg`, by default graph replay: the device's time,
    not the host's launches). The result has run_sweep's shape; its arms are the policies."""
    for name, splits in policies.items():
        if splits is not None and splits not in SPLIT_CHOICES:
            raise LabError(f"policy {name!r}: splits={splits!r}; use None (decode_plan's policy) "
                           f"or one of {', '.join(map(str, SPLIT_CHOICES))}")
    check_contexts(model, contexts, tokens, prompt)
    cfg = cfg or LabConfig()
    eng = SplitPolicyEngine(model, cfg, backend=backend or default_backend(cfg, 0), kv_init=kv_init)
    arms = [SplitArm(name, cfg, eng, splits=splits) for name, splits in policies.items()]
    what = "attention split policy per context length (seek: timing only)"
    return {**sweep_arms(arms, contexts, reps, tokens, prompt, progress, what, kv_init=kv_init),
            "policies": dict(policies)}


# ---- leave-one-out -----------------------------------------------------------------------------
def known_factors() -> list[str]:
    """Boolean LAB_* toggles (without the prefix): the factors leave-one-out can switch."""
    return [var[4:] for var, _, allowed, _, _ in TOGGLES if sorted(allowed) == ["0", "1"]]


def parse_factors(factors) -> list[str]:
    items = factors.split(",") if isinstance(factors, str) else list(factors)
    names = [f.strip().upper().removeprefix("LAB_") for f in items if f.strip()]
    known = known_factors()
    for f in names:
        if f not in known:
            raise LabError(f"unknown factor {f}; known: {', '.join(known)}")
    if not names or len(set(names)) != len(names):
        raise LabError(f"give distinct factors, e.g. {','.join(known)}")
    return names


def loo_configs(base: LabConfig, factors) -> dict[str, LabConfig]:
    """all-on, all-off, and -F (F off, the others on) for each factor F."""
    def cfg(off):
        return base.with_toggles({f"LAB_{f}": "0" if f in off else "1" for f in factors})
    return {"all-on": cfg(()), "all-off": cfg(factors), **{f"-{f}": cfg((f,)) for f in factors}}


def run_loo(model, factors, base: LabConfig | None = None, reps: int = 5, tokens: int = 64,
            prompt: str = BENCH_PROMPT, progress=False, kv_init: str = "zeros",
            backend_factory: Callable | None = None) -> dict:
    """Leave-one-out: the arms of `loo_configs`, interleaved (sharing one engine when they differ
    only in launch toggles); then the all-off arm checked against a plain baseline (a fresh
    engine, same config, its reps run back to back). `meaningful` is False (with `reason`) when
    an arm or the baseline fails the replay gate."""
    factors = parse_factors(factors)
    cfgs = loo_configs(base or LabConfig(), factors)
    run = decode_run(prompt, tokens)
    pool: dict = {}
    arms = [make_arm(model, n, c, i, kv_init, backend_factory, pool)
            for i, (n, c) in enumerate(cfgs.items())]
    order = interleave(arms, reps, run, progress, "leave-one-out reps")
    ms = {a.name: a.ms for a in arms}
    # the baseline: a fresh engine (its own buffers), on the same device and host as the arms
    plain = make_arm(model, "baseline", cfgs["all-off"], len(arms), kv_init,
                     backend_factory or (lambda cfg, index: arms[0].engine.backend))
    plain.warm(run)
    for _ in range(reps):
        plain.timed(run)
    off = next(a for a in arms if a.name == "all-off")
    gap = welch(off.ms, plain.ms)
    why = outputs_differ(off.runs, plain.runs)
    flags = []
    if not abs(gap["z"]) <= AA_T_THRESHOLD:
        flags.append(f"baseline - all-off = {gap['diff']:+.4f} ± {gap['sem']:.4f} ms/token "
                     f"(|z| = {abs(gap['z']):.1f} > {AA_T_THRESHOLD:g}): interleaving changes the "
                     f"all-off arm")
    if why:
        flags.append(f"outputs differ from the baseline: {why}")
    summaries, baseline = [a.summary() for a in arms], plain.summary()
    fell_back = replay_gate(summaries + [baseline])
    return {**_meta(arms[0].engine.backend.describe(), "leave-one-out", reps=reps, tokens=tokens,
                    prompt=prompt, kv_init=kv_init),
            "factors": factors, "arms": summaries, "run_order": order,
            "rows": loo_rows(ms, factors),
            "baseline": {**baseline, "gap_ms": gap["diff"], "gap_sem_ms": gap["sem"],
                         "z": gap["z"], "ok": not flags, "reason": "; ".join(flags)},
            "meaningful": not fell_back, "reason": fell_back}
