"""Paired, interleaved A/B measurement of decode speed.

Both arms live in one process (one engine each, same weights), run interleaved with the order
alternated per rep (A B, B A, A B, ...), each after an untimed warm-up that compiles and captures.
Reported per arm: mean ms/token and its standard error over reps; and the paired difference
B - A with its standard error and t statistic (paired over reps).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .config import LabConfig
from .engine import DecodeEngine

BENCH_PROMPT = "ROMEO:\n"


def mean_sem(values) -> tuple[float, float]:
    """Mean and standard error of the mean (sample sd / sqrt(n)); sem is nan for n < 2."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        raise ValueError("no values")
    if v.size < 2:
        return float(v.mean()), float("nan")
    return float(v.mean()), float(v.std(ddof=1) / math.sqrt(v.size))


def paired_t(a, b) -> tuple[float, float, float]:
    """Paired difference b - a: (mean, sem, t). t is inf when every difference is identical."""
    d = np.asarray(b, np.float64) - np.asarray(a, np.float64)
    mean, sem = mean_sem(d)
    if sem == 0:
        return mean, sem, (0.0 if mean == 0 else math.copysign(math.inf, mean))
    return mean, sem, mean / sem


@dataclass
class ArmResult:
    name: str
    toggles: dict
    ms_per_token: list[float] = field(default_factory=list)   # one value per rep
    launches_per_token: int = 0
    nodes_per_graph: int = 0

    def stats(self) -> tuple[float, float]:
        return mean_sem(self.ms_per_token)


def _launches_per_token(engine) -> int:
    return len(engine.step_launches(engine.plan(0)))


def run_ab(model, a: LabConfig, b: LabConfig, reps: int = 5, tokens: int = 128,
           prompt: str = BENCH_PROMPT, progress: bool = False, names=("A", "B")) -> dict:
    """Interleaved paired A/B: returns a JSON-ready dict (per-rep values included)."""
    if reps < 2:
        raise ValueError("reps must be >= 2 for a standard error")
    engines = [DecodeEngine(model, a), DecodeEngine(model, b)]
    arms = [ArmResult(n, c.toggles()) for n, c in zip(names, (a, b))]
    for eng, arm in zip(engines, arms):
        eng.generate(prompt, tokens)            # warm-up: compile, capture every plan met
        arm.launches_per_token = _launches_per_token(eng)
        arm.nodes_per_graph = max((g.node_count for g in eng.graphs.values()), default=0)
    order = range(reps)
    if progress:
        from tqdm.auto import tqdm
        order = tqdm(order, desc="A/B reps", unit="rep")
    for rep in order:
        for i in ((0, 1) if rep % 2 == 0 else (1, 0)):
            arms[i].ms_per_token.append(engines[i].generate(prompt, tokens).ms_per_token)
    d_mean, d_sem, t = paired_t(arms[0].ms_per_token, arms[1].ms_per_token)
    ma, sa = arms[0].stats()
    mb, sb = arms[1].stats()
    return {
        "source": engines[0].backend.describe(), "reps": reps, "tokens": tokens, "prompt": prompt,
        "order": "alternating per rep (A B, B A, ...), warm-up excluded",
        "arms": [{"name": r.name, "toggles": r.toggles, "ms_per_token": r.ms_per_token,
                  "mean_ms": m, "sem_ms": s, "launches_per_token": r.launches_per_token,
                  "nodes_per_graph": r.nodes_per_graph}
                 for r, m, s in ((arms[0], ma, sa), (arms[1], mb, sb))],
        "diff_b_minus_a_ms": d_mean, "diff_sem_ms": d_sem, "t": t,
        "speedup_a_over_b": ma / mb if mb else float("nan"),
    }


def format_ab(result: dict) -> str:
    lines = [f"{'arm':<6} {'toggles':<34} {'ms/token':>9} {'± sem':>9} {'launches/tok':>12} "
             f"{'nodes/graph':>11}"]
    for arm in result["arms"]:
        tg = " ".join(f"{k[4:]}={v}" for k, v in arm["toggles"].items() if k != "LAB_BACKEND")
        lines.append(f"{arm['name']:<6} {tg:<34} {arm['mean_ms']:>9.4f} {arm['sem_ms']:>9.4f} "
                     f"{arm['launches_per_token']:>12} {arm['nodes_per_graph']:>11}")
    lines.append(f"B - A = {result['diff_b_minus_a_ms']:+.4f} ms/token ± {result['diff_sem_ms']:.4f} "
                 f"(paired t = {result['t']:.1f}); A/B ratio {result['speedup_a_over_b']:.2f}x; "
                 f"{result['reps']} reps x {result['tokens']} tokens")
    lines.append(f"source: {result['source']}")
    return "\n".join(lines)
