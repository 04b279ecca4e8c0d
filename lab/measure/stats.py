"""The statistics of a benchmark, as pure functions of numbers (no engine, no device).

  mean_sem        mean and standard error of the mean
  paired_t        paired difference b - a over reps: mean, sem, t (NumPy only)
  paired_test     the same with a p-value (scipy.stats.ttest_rel when scipy is installed)
  percentiles     p50 / p99 of per-token times, with the sample count that makes p99 meaningful
  welch           unpaired difference of two means with its standard error (baseline checks)
  t_p, t_critical the t distribution's two-sided p-value and critical value (NumPy-free, exact)
  AAVerdict       the A/A gate: is A already different from A beyond its noise?
  loo_rows        leave-one-out arithmetic: what each factor is worth in presence of the others
  rotated         the rotating arm order of an interleaved rep
  collector_off   Python's garbage collector held off for a timed window (no collection first)
"""
from __future__ import annotations

import contextlib
import functools
import gc
import math
from dataclasses import asdict, dataclass

import numpy as np

# The A/A gate's nominal false-alarm rate: identical arms fail it this often. Its critical value
# is the t distribution's for the reps at hand (a fixed |t| > 3 fails 20% of correct A/As at 2
# reps, 2% at 8). Why 1% and not 5%, by measurement (bench.aa_false_alarm_table, the simulator
# with the H200's recorded noise): the host's slow drift, redrawn every ~20 ms, spans adjacent
# reps, and the interleave's A A', A' A order then puts the same level into both reps'
# differences with the same sign, so they are positively correlated and the t-test's sem is too
# small. With an H200 host's recorded noise (its reps spread 15%), at 5% nominal that
# measured 6.8-13.7% with 24-token reps; at 1%, 1.1-1.5% at 2, 3, 5 and 8 reps of 128 tokens
# (`bench ab`'s default, held within a point by tests/measure/test_bench.py), and with 24-token reps
# 1.1-1.5% up to 5 reps and 3.2% at 8, where more reps share one drift level. No
# per-rep test can undo that correlation at 2-8 reps (a sign-flip test assumes it away too, and
# has only 2^reps patterns: its smallest p-value at 5 reps is 6.25%). A failed gate means
# "re-run, then look", never "B is faster".
AA_ALPHA = 0.01
# The leave-one-out baseline check's |z| flag (an unpaired comparison; not the A/A gate).
AA_T_THRESHOLD = 3.0


def mean_sem(values) -> tuple[float, float]:
    """Mean and standard error of the mean (sample sd / sqrt(n)); sem is nan for n < 2.
    Two arms' sems with equal n compare their spreads: the ratio of their variances is the
    square of the sems' ratio, a different statistic. A small sem says the MEAN is known well;
    it says nothing about the tail (p99 needs its own, much larger sample: `percentiles`)."""
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


def paired_test(a, b) -> dict:
    """Paired difference b - a with t and a two-sided p-value (scipy's ttest_rel when scipy is
    importable; else NumPy's paired_t and p = None). Keys: diff, sem, t, p, df, method."""
    if len(a) != len(b):
        raise ValueError(f"paired samples need equal lengths, got {len(a)} and {len(b)}")
    diff, sem, t = paired_t(a, b)
    out = {"diff": diff, "sem": sem, "t": t, "p": None, "df": len(a) - 1, "method": "paired_t"}
    if sem > 0:
        try:
            from scipy import stats  # lazily: scipy is a dev extra
        except ImportError:
            return out
        res = stats.ttest_rel(np.asarray(b, np.float64), np.asarray(a, np.float64))
        out.update(t=float(res.statistic), p=float(res.pvalue), method="scipy.stats.ttest_rel")
    return out


def t_p(t: float, df: int) -> float:
    """Two-sided p-value P(|T| >= |t|) of Student's t with integer `df` >= 1, in closed form
    (Abramowitz & Stegun 26.7.3-4): the gate needs no scipy, which is a dev extra."""
    if df < 1 or int(df) != df:
        raise ValueError(f"df must be a positive integer, got {df}")
    if math.isnan(t):
        return float("nan")
    if math.isinf(t):
        return 0.0
    theta = math.atan(abs(t) / math.sqrt(df))
    s, c2 = math.sin(theta), math.cos(theta) ** 2
    if df % 2:                               # odd: (2/pi)(theta + sin cos (1 + 2/3 cos^2 + ...))
        term, total = math.cos(theta), 0.0
        if df > 1:
            total = term
            for k in range(3, df - 1, 2):
                term *= c2 * (k - 1) / k
                total += term
        inside = 2 / math.pi * (theta + s * total)
    else:                                    # even: sin (1 + 1/2 cos^2 + 1.3/2.4 cos^4 + ...)
        term = total = 1.0
        for k in range(2, df - 1, 2):
            term *= c2 * (k - 1) / k
            total += term
        inside = s * total
    return min(max(1.0 - inside, 0.0), 1.0)


@functools.lru_cache(maxsize=None)
def t_critical(alpha: float, df: int) -> float:
    """The |t| that Student's t with `df` exceeds with probability `alpha` (two-sided)."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    lo, hi = 0.0, 1.0
    while t_p(hi, df) > alpha:
        hi *= 2
    for _ in range(200):                     # bisection: t_p falls as |t| grows
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if t_p(mid, df) > alpha else (lo, mid)
    return hi


def welch(a, b) -> dict:
    """Unpaired difference mean(b) - mean(a) with sem = sqrt(sem_a^2 + sem_b^2) and z = diff/sem."""
    ma, sa = mean_sem(a)
    mb, sb = mean_sem(b)
    diff, sem = mb - ma, math.hypot(sa, sb)
    z = diff / sem if sem > 0 else (0.0 if diff == 0 else math.copysign(math.inf, diff))
    return {"diff": diff, "sem": sem, "z": z}


def percentiles(samples, qs=(50, 99)) -> dict:
    """{"n": count, "p50": ..., "p99": ...}. p99 over n samples rests on the n/100 largest:
    with n = 1000 that is 10 samples, enough to be more than one outlier."""
    v = np.asarray(samples, np.float64)
    if v.size == 0:
        raise ValueError("no samples")
    return {"n": int(v.size), **{f"p{q:g}": float(np.percentile(v, q)) for q in qs}}


@dataclass
class AAVerdict:
    ok: bool
    t: float
    diff_ms: float
    sem_ms: float
    threshold: float     # the |t| above which the gate fails
    outputs_identical: bool
    reason: str          # "" when ok
    alpha: float = float("nan")   # nominal false-alarm rate: P(|T_df| > threshold)
    df: int = 0          # reps - 1
    p: float = float("nan")       # two-sided p-value of t (nan when t is)
    method: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def outputs_differ(runs_a, runs_b) -> str:
    """Byte-compare two lists of (token ids, final logits) runs; "" when identical, else why.
    Non-finite logits count as a failure: two NaN runs agreeing proves nothing."""
    if len(runs_a) != len(runs_b):
        return f"{len(runs_a)} runs against {len(runs_b)}"
    for i, ((ta, la), (tb, lb)) in enumerate(zip(runs_a, runs_b)):
        if np.asarray(ta).tobytes() != np.asarray(tb).tobytes():
            return f"token ids differ in run {i + 1}"
        if np.asarray(la).tobytes() != np.asarray(lb).tobytes():
            return f"final logits differ in run {i + 1}"
        if not (np.isfinite(la).all() and np.isfinite(lb).all()):
            return f"final logits hold NaN or inf in run {i + 1}"
    return ""


def aa_verdict(ms_a, ms_a2, runs_a=(), runs_a2=(), threshold: float | None = None,
               alpha: float = AA_ALPHA) -> AAVerdict:
    """The A/A gate: A and its copy A' must not differ beyond their noise and must produce
    byte-identical outputs; otherwise an A/B is not meaningful. "Beyond their noise": paired
    |t| above the t distribution's two-sided critical value for `alpha` at reps - 1 degrees of
    freedom, so identical arms fail with probability `alpha` at any rep count (exact for
    independent normal differences; measured on the simulator's noise: AA_ALPHA's comment).
    `threshold`, if given, is a fixed |t| instead; `alpha` then reports its nominal rate."""
    diff, sem, t = paired_t(ms_a, ms_a2)
    df = len(ms_a) - 1
    if df < 1:
        raise ValueError(f"the A/A gate needs at least 2 reps, got {len(ms_a)}")
    if threshold is None:
        threshold, method = t_critical(alpha, df), f"paired t, two-sided {alpha:g} critical value"
    else:
        alpha, method = t_p(threshold, df), "paired t, fixed threshold"
    why = outputs_differ(list(runs_a), list(runs_a2))
    reasons = []
    if why:
        reasons.append(f"outputs differ: {why}")
    if not abs(t) <= threshold:   # also catches nan
        reasons.append(f"A/A paired |t| = {abs(t):.1f} > {threshold:.3g} (identical arms exceed "
                       f"it {alpha:.1%} of the time at {df + 1} reps; A' - A = "
                       f"{diff * 1000:+.2f} ± {sem * 1000:.2f} us/token)")
    return AAVerdict(not reasons, t, diff, sem, threshold, not why, "; ".join(reasons), alpha, df,
                     t_p(t, df), method)


def loo_rows(ms: dict, factors) -> list[dict]:
    """Leave-one-out arithmetic on per-rep ms/token of the arms "all-on", "all-off" and "-F" for
    each factor F: what F is worth in the presence of the others = (-F) - (all-on), paired over
    reps. A last row "all" gives all-off - all-on, and "interaction" that total minus the sum of
    the single worths (0 when the factors add)."""
    on = ms["all-on"]
    rows = []
    for f in factors:
        r = paired_test(on, ms[f"-{f}"])
        rows.append({"factor": f, "worth_ms": r["diff"], "sem_ms": r["sem"], "t": r["t"]})
    total = paired_test(on, ms["all-off"])
    rows.append({"factor": "all", "worth_ms": total["diff"], "sem_ms": total["sem"],
                 "t": total["t"]})
    singles = sum(np.asarray(ms[f"-{f}"], np.float64) - np.asarray(on, np.float64) for f in factors)
    inter = np.asarray(ms["all-off"], np.float64) - np.asarray(on, np.float64) - singles
    m, s = mean_sem(inter)
    rows.append({"factor": "interaction", "worth_ms": m, "sem_ms": s,
                 "t": (m / s if s and s > 0 else float("nan"))})
    return rows


def rotated(items, rep: int) -> list:
    """`items` rotated left by `rep` (each item goes first in turn, one rep after another): the
    rotating arm order of an interleaved rep."""
    items = list(items)
    k = rep % len(items) if items else 0
    return items[k:] + items[:k]


@contextlib.contextmanager
def collector_off():
    """Python's garbage collector held off while the block runs, then as it was before: no
    automatic collection lands inside a timed window, as timeit does. No collection first: a
    full one walks every object the process holds, and a recording process that has compiled
    every kernel holds many (compiling four of the megakernel's bodies for sm_90 adds about
    470,000 objects, and a full collection of the 570,000 then took 0.2 s on a 2-core x86
    host), so a collection before every timed run would make a recording's A/Bs and sweeps
    spend most of their time collecting. Garbage made meanwhile is collected after the window,
    untimed."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()
