"""Measurement you can trust: paired interleaved A/B behind an A/A gate, context sweeps and
leave-one-out, each with its noise shown. The statistics live in `lab/stats.py`.

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
- The replay gate: each arm reports, from its engine's ledger, the share of its timed steps that
  were graph replays. An arm configured for graphs whose share is under MIN_REPLAY_FRACTION is
  not labelled "graph" (its `mode` is "fallback"), and no result that contains it is meaningful:
  its `reason` names the arm, its share and the ledger's fallback reasons.
- Every result carries `source` (backend.describe(): measured on which GPU, or simulated).

Results are plain dicts; `lab/report.py` turns them into tables, plots and files, and the
command line (`decode-lab bench`) lives with the other commands in `lab/__main__.py`.
"""
from __future__ import annotations

import datetime as dt
import gc
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .config import TOGGLES, LabConfig
from .engine import DecodeEngine
from .errors import LabError
from .plan import SPLIT_CHOICES, decode_plan
from .stats import (AA_ALPHA, AA_T_THRESHOLD, aa_verdict, loo_rows, mean_sem,  # noqa: F401
                    outputs_differ, paired_t, paired_test, percentiles, welch)

BENCH_PROMPT = "ROMEO.\n"
PER_TOKEN_SAMPLES = 1000   # p99 then rests on the 10 slowest tokens of each arm
# A graph arm whose timed steps were under 99% replays measured (mostly) something else: eager
# fallbacks or captures. One capture per plan key is paid in the untimed warm-up, so a healthy
# graph arm's timed steps are all replays.
MIN_REPLAY_FRACTION = 0.99
# Ledger outcomes of a step in graph mode, and those that ran a graph without capturing one: a
# replay, a replay of the live graph updated to the step's plan (LAB_PLAN_SWITCH=update), or a
# step of the device loop (LAB_LOOP=device). A capture or an eager fallback is not a replay.
GRAPH_OUTCOMES = ("capture", "replay", "update", "device", "fallback")
REPLAY_OUTCOMES = ("replay", "update", "device")


# ---- the replay gate ---------------------------------------------------------------------------
def replay_fraction(outcomes: dict) -> float | None:
    """Replays (REPLAY_OUTCOMES) over graph-mode steps (GRAPH_OUTCOMES) in a count of ledger
    outcomes; None when no step ran in graph mode (an eager arm)."""
    graph = sum(outcomes.get(k, 0) for k in GRAPH_OUTCOMES)
    return sum(outcomes.get(k, 0) for k in REPLAY_OUTCOMES) / graph if graph else None


def arm_mode(graph: bool, fraction: float | None) -> str:
    """"eager", "graph", or "fallback": configured for graphs, under MIN_REPLAY_FRACTION replays."""
    if not graph:
        return "eager"
    return "graph" if fraction is not None and fraction >= MIN_REPLAY_FRACTION else "fallback"


def replay_gate(arms: list[dict]) -> str:
    """Why these arm summaries cannot be compared: each one whose mode is "fallback", with its
    replay share, its ledger and its fallback reasons ("" when there is none)."""
    out = []
    for a in arms:
        if a.get("mode") != "fallback":
            continue
        f, ledger = a["replay_fraction"], a["ledger"]
        why = "; ".join(f"{r} ({n} steps)" for r, n in a["fallback_reasons"].items()) or "none"
        out.append(f"arm {a['name']} is not a graph arm: {_pct(f)} of its "
                   f"{sum(ledger.get(k, 0) for k in GRAPH_OUTCOMES)} timed graph-mode steps were "
                   f"replays (need {MIN_REPLAY_FRACTION:.0%}; ledger {ledger}); fallback reasons: "
                   f"{why}")
    return "; ".join(out)


def _pct(fraction: float | None) -> str:
    return "no" if fraction is None else f"{100 * fraction:.1f}%"


# ---- arms --------------------------------------------------------------------------------------
@dataclass
class Arm:
    name: str
    cfg: LabConfig
    engine: DecodeEngine
    ms: list[float] = field(default_factory=list)      # ms/token, one per rep
    runs: list[tuple] = field(default_factory=list)    # (token ids, final logits), one per rep
    outcomes: dict = field(default_factory=dict)       # ledger outcome -> timed steps
    fallbacks: dict = field(default_factory=dict)      # fallback reason -> timed steps

    def clear(self) -> None:
        self.ms, self.runs, self.outcomes, self.fallbacks = [], [], {}, {}

    def use(self) -> DecodeEngine:
        """The arm's engine, switched to the arm's toggles (arms may share one engine)."""
        self.engine.cfg = self.cfg
        return self.engine

    def timed(self, run: Callable) -> None:
        """One timed run on the arm's engine: its ms/token, its outputs, and the ledger entries
        of its steps (what each step was: replay, capture, eager or fallback, and why)."""
        eng = self.use()
        first = len(eng.ledger)
        ms, out = run(eng)
        self.ms.append(ms)
        self.runs.append(out)
        for e in eng.ledger[first:]:
            self.outcomes[e.outcome] = self.outcomes.get(e.outcome, 0) + 1
            if e.outcome == "fallback":
                self.fallbacks[e.reason] = self.fallbacks.get(e.reason, 0) + 1

    def summary(self) -> dict:
        m, s = mean_sem(self.ms)
        eng = self.use()
        graph = eng.graphs.get(eng.plan(0).key) if self.cfg.graph else None
        fraction = replay_fraction(self.outcomes)
        return {"name": self.name, "toggles": self.cfg.toggles(), "ms_per_token": list(self.ms),
                "mean_ms": m, "sem_ms": s, "tok_per_s": 1000.0 / m if m else float("nan"),
                "launches_per_token": len(eng.step_launches(eng.plan(eng.position))),
                "nodes_per_graph": graph.node_count if graph is not None else 0,
                "ledger": dict(self.outcomes), "replay_fraction": fraction,
                "mode": arm_mode(self.cfg.graph, fraction),
                "fallback_reasons": dict(self.fallbacks)}


class SplitPolicyEngine(DecodeEngine):
    """A DecodeEngine whose attention split count can be pinned: `splits` (one of
    SPLIT_CHOICES) for every position, or None (the default) for decode_plan's policy. For
    experiments on the policy: each split count is its own plan key, so its own graph, and the
    scratch is already viewed for every split count, so switching `splits` allocates nothing."""
    splits: int | None = None

    def plan(self, position: int | None = None):
        return decode_plan(self.position if position is None else position, self.model.cfg,
                           self.cfg, splits=self.splits)


@dataclass
class SplitArm(Arm):
    """An arm that is a split policy on a shared SplitPolicyEngine (None: decode_plan's)."""
    splits: int | None = None

    def use(self) -> DecodeEngine:
        eng = super().use()
        eng.splits = self.splits
        return eng


def parse_arm(text: str, base: LabConfig) -> LabConfig:
    """`LAB_GRAPH=0` or `LAB_GRAPH=0,LAB_SPLIT_COMBINE=1` (the LAB_ prefix may be left out)."""
    assignments = {}
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        if "=" not in item:
            raise LabError(f"arm {text!r}: expected LAB_NAME=VALUE[,LAB_NAME=VALUE ...]")
        k, v = (s.strip() for s in item.split("=", 1))
        k = k.upper()
        assignments[k if k.startswith("LAB_") else f"LAB_{k}"] = v
    return base.with_toggles(assignments)


def default_backend(cfg: LabConfig, index: int):
    """A backend per arm. Simulated arms get their own seed (independent noise, so an A/A shows
    real scatter); GPU arms share the process's compiled kernels (see backend/cuda.py)."""
    from .backend import make_backend
    be = make_backend(cfg)
    if be.name == "sim":
        from .backend.sim import SimBackend
        return SimBackend(be.cost, seed=1000 + index)
    return be


def pool_key(cfg: LabConfig, kv_init: str = "zeros") -> tuple:
    """The key under which arms share one engine in a pool (make_arm): what decides the
    allocations -- backend, KV dtype, deliberate bugs, KV initialisation. Arms with equal keys
    differ by launch toggles only. Pre-fill a pool with `{pool_key(cfg): engine}` to time an
    engine you built (a seeded SimBackend, say)."""
    return (cfg.backend, cfg.kv_dtype, cfg.bugs, kv_init)


def make_arm(model, name: str, cfg: LabConfig, index: int, kv_init: str = "zeros",
             backend_factory: Callable | None = None, pool: dict | None = None) -> Arm:
    """An arm with its engine. With a `pool` (a dict), arms whose allocations agree (same
    backend, KV dtype, bugs) SHARE one engine -- the same buffers at the same addresses -- and
    differ only by launch toggles. That matters: on the H200 two identical graph engines
    differed by a steady 0.4-1.8 us/token from buffer placement alone, which separate engines
    would report as an A/B effect. Without a pool (or with a backend_factory, which gives each
    arm its own backend) every arm gets its own engine."""
    key = pool_key(cfg, kv_init)
    if pool is not None and backend_factory is None and key in pool:
        return Arm(name, cfg, pool[key])
    be = (backend_factory or default_backend)(cfg, index)
    eng = DecodeEngine(model, cfg, backend=be, kv_init=kv_init)
    if pool is not None and backend_factory is None:
        pool[key] = eng
    return Arm(name, cfg, eng)


# ---- one timed run -----------------------------------------------------------------------------
def _timed_steps(engine: DecodeEngine, steps: int) -> float:
    """ms per step of `steps` decode steps (the engine's own loop: host or device). On a real
    device the garbage collector is held off while they run, as timeit does: a full collection
    of a large heap takes tens of milliseconds and would land in whichever rep it happens to
    hit. The simulator's clock is simulated, so a collection costs it nothing: it skips both."""
    if engine.backend.simulated:
        return 1000.0 * engine.decode(steps) / steps
    gc.collect()
    gc.disable()
    try:
        return 1000.0 * engine.decode(steps) / steps
    finally:
        gc.enable()


def decode_run(prompt: str, tokens: int) -> Callable:
    """A run: reset with the prompt, decode prompt + `tokens` steps; (ms/token, (ids, logits))."""
    def run(engine):
        ids = engine.encode(prompt)
        engine.reset(ids, tokens)
        ms = _timed_steps(engine, ids.size - 1 + tokens)
        return ms, (engine.tokens(ids.size + tokens), engine.logits())
    return run


def context_run(prompt: str, context: int, tokens: int) -> Callable:
    """A run at context length `context`: reset, seek(context), time `tokens` steps."""
    def run(engine):
        engine.reset(engine.encode(prompt), 0)
        engine.seek(context)
        ms = _timed_steps(engine, tokens)
        return ms, (engine.tokens(context + tokens + 1), engine.logits())
    return run


def _bar(total: int, desc: str, progress):
    if progress is False:
        return None
    from tqdm.auto import tqdm
    return tqdm(total=total, desc=desc, unit="run", disable=None if progress is None else False,
                leave=True)


def interleave(arms: list[Arm], reps: int, run: Callable, progress=False, desc: str = "reps",
               warm_up: bool = True, before_rep: Callable | None = None) -> list[str]:
    """Warm up each arm (one untimed run), then `reps` rounds over the arms, the order reversed
    every other round (A B, B A, ...). Appends to each arm's ms/runs; returns the run order.
    `before_rep(rep)`, if given, runs before each round (a recorder's interleaved probe)."""
    if reps < 2:
        raise LabError(f"reps must be >= 2 for a standard error, got {reps}")
    if warm_up:
        for arm in arms:
            run(arm.use())
    bar = _bar(reps * len(arms), desc, progress)
    order = []
    for rep in range(reps):
        if before_rep is not None:
            before_rep(rep)
        for arm in (arms if rep % 2 == 0 else arms[::-1]):
            arm.timed(run)
            order.append(arm.name)
            if bar is not None:
                bar.update()
    if bar is not None:
        bar.close()
    return order


def per_token_pass(arms: list[Arm], prompt: str, samples: int, tokens: int,
                   progress=False) -> dict[str, list[float]]:
    """Per-step ms (clock() around each step) for each arm, `samples` steps each, in requests of
    at most `tokens` decoded tokens, the arm order alternating per request."""
    out = {a.name: [] for a in arms}
    if samples <= 0:
        return out
    bar = _bar(samples * len(arms), "per-token", progress)
    k = 0
    while min(len(v) for v in out.values()) < samples:
        for arm in (arms if k % 2 == 0 else arms[::-1]):
            eng, times = arm.use(), out[arm.name]
            ids = eng.encode(prompt)
            n = min(tokens, eng.model.cfg.max_seq - ids.size)
            eng.reset(ids, n)
            t = eng.backend.clock()
            for _ in range(ids.size - 1 + n):
                eng.step()
                t1 = eng.backend.clock()
                times.append(1000.0 * (t1 - t))
                t = t1
            if bar is not None:
                bar.update(ids.size - 1 + n)
        k += 1
    if bar is not None:
        bar.close()
    return {name: v[:samples] for name, v in out.items()}


def _meta(source: str, what: str, **kw) -> dict:
    return {"what": what, "source": source, "date": dt.datetime.now().isoformat(timespec="seconds"),
            **kw}


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
    timed steps were under MIN_REPLAY_FRACTION replays); without an A/A and with both arms
    through the replay gate it is None."""
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
LADDER = (("dispatcher", dict(graph=False, launch="dispatcher"),
           "eager, numba's dispatcher: types and flattens every argument at every launch"),
          ("prebound", dict(graph=False, launch="prebound"),
           "eager, pre-bound: kernel handle and flattened arguments prepared once per plan"),
          ("graph", dict(graph=True), "one graph launch per token: the host submits once"),
          ("graph+pdl", dict(graph=True, pdl=True),
           "graph with programmatic edges: each node's launch overlaps its predecessor's tail"))


def run_ladder(model, base: LabConfig | None = None, reps: int = 5, tokens: int = 64,
               prompt: str = BENCH_PROMPT, progress=False, kv_init: str = "zeros",
               backend_factory: Callable | None = None, before_rep: Callable | None = None,
               pool: dict | None = None) -> dict:
    """The launch-mechanism ladder: each rung's ms/token and us per launch, interleaved and
    paired on ONE engine (the rungs differ only in launch toggles), outputs byte-compared;
    `meaningful` is False (with `reason`) when a graph rung fails the replay gate.
    `before_rep(rep)` runs before each round (the cost recorder measures host costs there)."""
    base = base or LabConfig()
    pool = {} if pool is None else pool
    arms = [make_arm(model, name, base.replace(**kw), i, kv_init, backend_factory, pool)
            for i, (name, kw, _) in enumerate(LADDER)]
    order = interleave(arms, reps, decode_run(prompt, tokens), progress, "ladder reps",
                       before_rep=before_rep)
    rows = []
    for arm, (_, _, what) in zip(arms, LADDER):
        sm = arm.summary()
        rows.append({**sm, "what": what,
                     "us_per_launch": 1000.0 * sm["mean_ms"] / sm["launches_per_token"]})
    same = all(not outputs_differ(arms[0].runs, a.runs) for a in arms[1:])
    why = replay_gate(rows)
    return {**_meta(arms[0].engine.backend.describe(), "launch-mechanism ladder", reps=reps,
                    tokens=tokens, prompt=prompt, kv_init=kv_init),
            "arms": rows, "run_order": order, "outputs_identical": same,
            "meaningful": not why, "reason": why,
            "graph_over_prebound": rows[1]["mean_ms"] / rows[2]["mean_ms"],
            "graph_over_dispatcher": rows[0]["mean_ms"] / rows[2]["mean_ms"]}


# ---- context sweep -----------------------------------------------------------------------------
def parse_contexts(text) -> list[int]:
    try:
        vals = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise LabError(f"contexts must be comma-separated integers, got {text!r}") from None
    if not vals:
        raise LabError("give at least one context length")
    return vals


def check_contexts(model, contexts, tokens: int, prompt: str) -> None:
    """A LabError unless each context is past the prompt and leaves room for `tokens` steps."""
    max_seq = model.cfg.max_seq
    n_prompt = len(model.tokenizer.encode(prompt))
    for c in contexts:
        if c < n_prompt - 1:
            raise LabError(f"context {c} is inside the {n_prompt}-token prompt; use >= {n_prompt - 1}")
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
                                              "replay_fraction", "mode", "fallback_reasons")}})
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
    run(plain.use())                                   # warm-up
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


# ---- the A/A gate's false-alarm rate, drawn straight from the simulator's noise ---------------
class _LognormalArgs:
    """Stands in for a SimBackend's random generator to read what one cost-model draw asks for:
    `args` = (mean, sigma) of its lognormal (sigma 0: no draw); the factor it returns is 1, so
    the call returns the cost the noise spreads. The shortcut below then draws those very
    lognormals for many A/As at once: the cost model stays the one place the noise is defined."""

    def __init__(self):
        self.args = (0.0, 0.0)

    def read(self, draw: Callable) -> tuple[float, tuple[float, float]]:
        self.args = (0.0, 0.0)
        return draw(self), self.args

    def lognormal(self, mean: float, sigma: float) -> float:
        self.args = (float(mean), float(sigma))
        return 1.0


def _eager_costs(model, cfg: LabConfig, cost, prompt: str, tokens: int) -> list:
    """Per step of one decode_run(prompt, tokens) on SimBackend: (engine host us, [(host us,
    its lognormal, device us)] per launch), every figure from the cost model's own functions
    (host_launch, eager_us, engine_step) for the step's launches at that position."""
    from .backend.costmodel import launch_context
    from .backend.sim import SimBackend

    eng = DecodeEngine(model, cfg, backend=SimBackend(cost, seed=0))
    rng = _LognormalArgs()
    n = eng.encode(prompt).size - 1 + tokens
    steps = []
    for pos in range(n):
        prev, launches = None, []
        for ln in eng.step_launches(eng.plan(pos)):
            host, jitter = rng.read(lambda r: cost.host_launch(ln, eng.backend.mechanism, r))
            args = [np.array([pos]) if name == "pos" else a
                    for name, a in zip(ln.kernel.arg_names, ln.args)]
            launches.append((host, jitter, cost.eager_us(ln, launch_context(ln, args), prev)))
            prev = ln
        steps.append((cost.engine_step("eager"), launches))
    return steps


def aa_noise_times(model, reps: int, tokens: int = 24, draws: int = 2000, seed=0,
                   cfg: LabConfig | None = None, cost=None,
                   prompt: str = BENCH_PROMPT) -> tuple[np.ndarray, np.ndarray]:
    """ms/token of A and of A' ([draws, reps] each) for `draws` independent eager A/As as
    `run_aa` times them on a SimBackend -- one shared engine, a warm-up run per arm, then
    `reps` rounds A A', A' A, ... of decode_run(prompt, tokens) -- drawn straight from the
    simulator's noise model instead of running the engine: per launch the host pays
    `CostModel.host_launch` (its mean-1 lognormal jitter) times the host speed, per step
    `CostModel.engine_step`; the host speed is `CostModel.host_speed`'s lognormal, redrawn once
    `drift_us` of model time has passed (as SimBackend's `_host_speed` does); the device runs
    each kernel for `CostModel.eager_us` once the host has submitted it and the kernel before it
    is done; a run's time is clock() to clock(), each of which waits for the device.
    Thousands of A/As take seconds, where the engine would run every kernel's NumPy twin for
    each; tests/test_bench.py checks that both give the same false-alarm rates."""
    from .backend.costmodel import CostModel

    cfg = (cfg or LabConfig(graph=False)).replace(backend="sim")
    if cfg.graph or cfg.overlap or cfg.ranks != 1 or cfg.loop != "host" or cfg.pdl or cfg.bugs:
        raise LabError("aa_noise_times draws the clean eager one-stream step's noise: give a "
                       "config with LAB_GRAPH=0, LAB_OVERLAP=0, LAB_PDL=0, LAB_RANKS=1, "
                       "LAB_LOOP=host and no LAB_BUG_*")
    if reps < 2 or draws < 1:
        raise LabError(f"reps must be >= 2 and draws >= 1, got reps={reps}, draws={draws}")
    cost = cost or CostModel.load()
    steps = _eager_costs(model, cfg, cost, prompt, tokens)
    speed_mean, speed_sigma = _LognormalArgs().read(cost.host_speed)[1]
    rng = np.random.default_rng(seed)
    host, dev = np.zeros(draws), np.zeros(draws)
    speed, until = np.ones(draws), np.zeros(draws)

    def host_speed():          # redrawn where drift_us of model time has passed
        due = host >= until
        if due.any():
            speed[due] = rng.lognormal(speed_mean, speed_sigma, int(due.sum()))
            until[due] = host[due] + cost.drift_us
        return speed

    def run() -> np.ndarray:   # one decode run: ms per step
        nonlocal host, dev
        t0 = host = np.maximum(host, dev)
        for step_us, launches in steps:
            host = host + step_us * host_speed()
            for us, (mean, sigma), dev_us in launches:
                jitter = rng.lognormal(mean, sigma, draws)
                host = host + us * jitter * host_speed()
                dev = np.maximum(dev, host) + dev_us
        host = np.maximum(host, dev)
        return (host - t0) / 1000.0 / len(steps)

    run(), run()               # the warm-up run of each arm
    a, a2 = np.empty((draws, reps)), np.empty((draws, reps))
    for r in range(reps):      # A A', A' A, ... (interleave's order)
        if r % 2 == 0:
            a[:, r], a2[:, r] = run(), run()
        else:
            a2[:, r] = run()
            a[:, r] = run()
    return a, a2


def aa_false_alarm_table(model=None, reps=(2, 3, 5, 8), tokens: int = 24, draws: int = 4000,
                         seed: int = 0, alpha: float = AA_ALPHA, cfg: LabConfig | None = None,
                         cost=None) -> list[dict]:
    """How often the A/A gate fails identical arms, per rep count, under the simulator's noise
    model (the H200's recorded spreads in data/gpu/kernel_costs.json): `draws` eager A/As of
    `tokens` tokens per rep drawn by aa_noise_times (default model: the shipped one; its
    launches decide the costs, its widths nothing), each judged by stats.aa_verdict. One row
    per rep count: {"reps", "tokens", "draws", "alarms", "rate", "sem" (binomial standard
    error of the rate), "nominal" (the gate's alpha), "gate"}.

    To print it: `for r in rows: print(f"{r['reps']:>4} {r['rate']:.2%} ± {r['sem']:.2%}
    (nominal {r['nominal']:.0%})")`; to plot it: `ax.errorbar([r["reps"] for r in rows],
    [r["rate"] for r in rows], yerr=[r["sem"] for r in rows], fmt="o")` against
    `ax.axhline(alpha)`. Each rep count has its own draws (seeded by `seed` and the count)."""
    if model is None:
        from .model import DEFAULT_WEIGHTS, load_model
        model = load_model(DEFAULT_WEIGHTS)
    rows = []
    for r in reps:
        a, a2 = aa_noise_times(model, r, tokens, draws, seed=(seed, r), cfg=cfg, cost=cost)
        verdicts = [aa_verdict(x, y, alpha=alpha) for x, y in zip(a, a2)]
        alarms = sum(not v.ok for v in verdicts)
        rate = alarms / draws
        rows.append({"reps": r, "tokens": tokens, "draws": draws, "alarms": alarms, "rate": rate,
                     "sem": float(np.sqrt(rate * (1 - rate) / draws)), "nominal": alpha,
                     "gate": verdicts[0].method})
    return rows
