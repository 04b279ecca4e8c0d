"""The machinery of a measurement: arms, the replay gate, one timed run, interleaved reps.

An arm is a `LabConfig` of one build with its engine (`make_arm`); arms that differ only in
launch toggles share one engine (`pool_key`). `interleave` runs reps with the arms' order
alternated per rep after an untimed warm-up, `per_token_pass` clocks each step on its own, and
the replay gate (`replay_fraction`, `arm_mode`, `key_gate`, `replay_gate`) reads each arm's own
ledger entries so that an arm configured for graphs that did not replay its plans' graphs is
never called meaningful. The experiments built on them (A/A, A/B, ladder, sweep, leave-one-out)
are in lab/measure/bench.py, whose rules this module follows.

The replay gate counts, for each arm, the ledger entries of its OWN runs: arms share one engine,
so each arm keeps the slice of the ledger its warm-up wrote and the slices its timed runs wrote,
never the engine's whole ledger. Two checks, because a replay share alone is fooled when the
warm-up visits the positions the timed reps visit (a graph per position is then captured before
timing starts, and every timed step replays one):
  - the replay share of its timed steps (MIN_REPLAY_FRACTION), and
  - its graph keys: one graph key per plan over the warm-up and the timed runs together, and no
    capture in a timed run for a plan the arm had already run. A graph per plan is the design
    (a plan change recaptures or updates, so a clean arm crossing plan boundaries passes); a
    key part that changes under one plan (a position, a step count, a clock) is case study
    004's "captured every step", whatever the replay share says.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Callable

from lab.config import LabConfig
from lab.engine.runner import DecodeEngine
from lab.errors import LabError
from lab.ledger import (GRAPH_MODE, GRAPH_RAN, key_changes, key_text, keys_met, recaptures,
                        values_text)
from lab.plan import decode_plan
from .stats import collector_off, mean_sem


BENCH_PROMPT = "ROMEO.\n"
PER_TOKEN_SAMPLES = 1000   # p99 then rests on the 10 slowest tokens of each arm
# A graph arm whose timed steps were under 99% replays measured (mostly) something else: eager
# fallbacks or captures. One capture per plan key is paid in the untimed warm-up, so a healthy
# graph arm's timed steps are all replays.
MIN_REPLAY_FRACTION = 0.99
# Ledger outcomes of a step in graph mode, and those that ran a graph without capturing one: a
# replay, a replay of the live graph updated to the step's plan (LAB_PLAN_SWITCH=update), or a
# step of the device loop (LAB_LOOP=device). A capture or an eager fallback is not a replay.
GRAPH_OUTCOMES = GRAPH_MODE
REPLAY_OUTCOMES = tuple(o for o in GRAPH_RAN if o != "capture")


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


def key_gate(warm: list, timed: list) -> list[str]:
    """What in an arm's graph keys makes its timing meaningless ([] when nothing does), from its
    own ledger entries: `warm` (its warm-up's) and `timed` (its timed runs', in order). Each plan
    that met more than one graph key over both, with the key parts that changed; each plan that
    a timed run captured a graph for after the arm had already run it."""
    met, changes, again = keys_met(warm + timed), key_changes(warm + timed), recaptures(warm, timed)
    out = []
    for plan in (p for p in met if p in changes or p in again):
        text = (f"plan ({key_text(plan)}) met {met[plan]} graph key{'s' if met[plan] > 1 else ''} "
                f"over its warm-up and timed runs (a plan has one)")
        if plan in again:
            n = again[plan]
            text += (f", and its timed runs captured {n} graph{'s' if n > 1 else ''} for it after "
                     f"it had run it: a key that did not come back")
        if changes.get(plan):
            text += "; the key parts that changed: " + "; ".join(
                f"{label!r} took {values_text(vals)}" for label, vals in changes[plan].items())
        out.append(text)
    return out


def replay_gate(arms: list[dict]) -> str:
    """Why these arm summaries cannot be compared ("" when they can): each one whose mode is
    "fallback", with its replay share, its ledger and its fallback reasons; each one whose graph
    keys failed `key_gate` (its summary's "key_faults"), naming the plan and the key parts."""
    out = []
    for a in arms:
        if a.get("mode") == "fallback":
            f, ledger = a["replay_fraction"], a["ledger"]
            why = "; ".join(f"{r} ({n} steps)" for r, n in a["fallback_reasons"].items()) or "none"
            out.append(f"arm {a['name']} is not a graph arm: {_pct(f)} of its "
                       f"{sum(ledger.get(k, 0) for k in GRAPH_OUTCOMES)} timed graph-mode steps "
                       f"were replays (need {MIN_REPLAY_FRACTION:.0%}; ledger {ledger}); fallback "
                       f"reasons: {why}")
        if a.get("key_faults"):
            out.append(f"arm {a['name']} keyed its graphs on more than its plans: "
                       + "; ".join(a["key_faults"]))
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
    warm_entries: list = field(default_factory=list)   # the ledger entries of its warm-up runs
    timed_entries: list = field(default_factory=list)  # ... and of its timed runs, in order

    def clear(self) -> None:
        self.ms, self.runs, self.outcomes, self.fallbacks = [], [], {}, {}
        self.warm_entries, self.timed_entries = [], []

    def use(self) -> DecodeEngine:
        """The arm's engine, switched to the arm's toggles (arms may share one engine)."""
        self.engine.cfg = self.cfg
        return self.engine

    def _run(self, run: Callable):
        """`run` on the arm's engine: its result, and the ledger entries its steps wrote (only
        its own: the engine may be shared, and its ledger holds every arm's steps)."""
        eng = self.use()
        first = len(eng.ledger)
        out = run(eng)
        return out, list(eng.ledger[first:])

    def warm(self, run: Callable) -> None:
        """One untimed run (the warm-up: compiles, and captures every plan the run meets); its
        ledger entries are kept for the replay gate's key check."""
        _, entries = self._run(run)
        self.warm_entries += entries

    def timed(self, run: Callable) -> None:
        """One timed run on the arm's engine: its ms/token, its outputs, and the ledger entries
        of its steps (what each step was: replay, capture, eager or fallback, and why)."""
        (ms, out), entries = self._run(run)
        self.ms.append(ms)
        self.runs.append(out)
        self.timed_entries += entries
        for e in entries:
            self.outcomes[e.outcome] = self.outcomes.get(e.outcome, 0) + 1
            if e.outcome == "fallback":
                self.fallbacks[e.reason] = self.fallbacks.get(e.reason, 0) + 1

    def summary(self) -> dict:
        m, s = mean_sem(self.ms)
        eng = self.use()
        fraction = replay_fraction(self.outcomes)
        entries = self.warm_entries + self.timed_entries
        return {"name": self.name, "toggles": self.cfg.toggles(), "ms_per_token": list(self.ms),
                "mean_ms": m, "sem_ms": s, "tok_per_s": 1000.0 / m if m else float("nan"),
                "launches_per_token": len(eng.step_launches(eng.plan(eng.position))),
                "nodes_per_graph": self._nodes_per_graph(eng),
                "ledger": dict(self.outcomes), "replay_fraction": fraction,
                "mode": arm_mode(self.cfg.graph, fraction),
                "fallback_reasons": dict(self.fallbacks),
                "graph_keys": sum(keys_met(entries).values()),
                "plans": len({e.plan for e in entries if e.outcome in GRAPH_RAN}),
                "key_faults": key_gate(self.warm_entries, self.timed_entries)}

    def _nodes_per_graph(self, eng) -> int:
        """Nodes of the graph of the arm's first timed graph step (0: none ran a graph), or, for
        an arm that kept no entries, of position 0's plan's."""
        if not self.cfg.graph:
            return 0
        key = next((e.plan_key for e in self.timed_entries if e.outcome in ("capture", "replay",
                                                                               "update")),
                   eng.plan(0).key)
        graph = eng.graphs.get(key)
        if isinstance(graph, list):            # ranks: one graph per rank, the same nodes each
            graph = graph[0]
        return graph.node_count if graph is not None else 0


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


def parse_arm(text: str, base: LabConfig, who: str | None = None) -> LabConfig:
    """`LAB_GRAPH=0` or `LAB_GRAPH=0,LAB_SPLIT_COMBINE=1` (the LAB_ prefix may be left out), each
    toggle once. `who` opens a refusal (default: the arm's text; "": nothing, for a caller that
    names the text itself)."""
    label = f"arm {text!r}: " if who is None else f"{who}: " if who else ""
    assignments = {}
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        if "=" not in item:
            raise LabError(f"{label}expected LAB_NAME=VALUE[,LAB_NAME=VALUE ...]")
        k, v = (s.strip() for s in item.split("=", 1))
        k = k.upper()
        k = k if k.startswith("LAB_") else f"LAB_{k}"
        if k in assignments:
            raise LabError(f"{label}{k} is given twice; give each toggle once")
        assignments[k] = v
    try:
        return base.with_toggles(assignments)
    except LabError as exc:          # an unknown toggle or value: say which arm gave it
        raise LabError(f"{label}{exc}") from None


def default_backend(cfg: LabConfig, index: int):
    """A backend per arm. Simulated arms get their own seed (independent noise, so an A/A shows
    real scatter); GPU arms share the process's compiled kernels (see backend/cuda/launch.py)."""
    from lab.backend import make_backend
    be = make_backend(cfg)
    if be.name == "sim":
        from lab.backend.sim import SimBackend
        return SimBackend(be.cost, seed=1000 + index)
    return be


def pool_key(cfg: LabConfig, kv_init: str = "zeros") -> tuple:
    """The key under which arms share one engine in a pool (make_arm): what decides the
    allocations -- backend, KV dtype, deliberate bugs, KV initialisation, the persistent step's
    stacked buffers. Arms with equal keys differ by launch toggles only. Pre-fill a pool with
    `{pool_key(cfg): engine}` to time an engine you built (a seeded SimBackend, say)."""
    return (cfg.backend, cfg.kv_dtype, cfg.bugs, kv_init) + (("persistent",) if cfg.persistent else ())


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
    device the garbage collector is held off while they run (stats.collector_off): a full
    collection of a large heap would land in whichever rep it happens to hit. The simulator's
    clock is simulated, so a collection costs it nothing: it runs them as they are."""
    if engine.backend.simulated:
        return 1000.0 * engine.decode(steps) / steps
    with collector_off():
        return 1000.0 * engine.decode(steps) / steps


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
            arm.warm(run)
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
    drafting = [a.name for a in arms if a.cfg.draft]
    if drafting:
        raise LabError(f"per-token timing times one step per position; a verify step "
                       f"(LAB_DRAFT>0: {', '.join(drafting)}) covers several: use --per-token 0")
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


# ---- the A/B pairs the recordings time and conformance predicts (one definition for both) -------
@dataclass(frozen=True)
class Pair:
    """One recorded A/B: its file, where in the file (`path`, dotted; "" the top level), the
    arms' names, A's toggles over the base configuration and B's over A's, and the lesson's
    label in conformance's table. `host_paced`: eager, so the host's speed sets its figure."""
    file: str
    path: str
    names: tuple
    a: dict
    b: dict
    lesson: str

    @property
    def host_paced(self) -> bool:
        return self.a.get("graph", True) is False

    def configs(self, base: LabConfig) -> tuple[LabConfig, LabConfig]:
        a = base.replace(**self.a)
        return a, a.replace(**self.b)


OVERLAP = Pair("overlap.json", "", ("graph", "graph+overlap"), {"graph": True}, {"overlap": True},
               "overlap: graph+overlap - graph")
# fission: the unfused step's combine split; the fused step's heads tail (lecture §6's case);
# its grid tail, each eagerly and captured (fission.json's top level, "fused", "fused_grid")
FISSION = tuple(
    Pair("fission.json", f"{key}.{mode}".lstrip("."), names,
         {**kw, "graph": mode == "graph"}, {"split_combine": True}, f"{label} ({mode}): {what}")
    for key, names, kw, label, what in (
        ("", ("combine", "split"), {}, "fission", "split - combine"),
        ("fused", ("fused", "split"), {"fusion": True, "attn_tail": "heads"}, "fused fission",
         "split - fused"),
        ("fused_grid", ("fused", "split"), {"fusion": True, "attn_tail": "grid"},
         "fused grid fission", "split - fused"))
    for mode in ("eager", "graph"))
DEVICE_LOOP = Pair("device_loop.json", "plain", ("host loop", "device loop"), {},
                   {"loop": "device"}, "device loop: device - host loop")
