"""Checklist step 8, measure the variance, not just the mean: interleaved paired reps of an eager
and a graph arm, each reported with its standard error.

The student writes `measure(arms, reps)`. Each arm is a run on ONE shared engine (the arms differ
only in LAB_GRAPH, as lab/measure/bench.py arranges them), and each call of it is one rep returning
the run's ms/token (model time on the simulator). The check records every call -- which arm, in what
order, what it returned -- and holds the student's means and standard errors to those numbers.
"""
from __future__ import annotations

import math

import numpy as np

from lab.measure import bench
from lab.measure.stats import mean_sem, paired_t
from lab.teach.exercise import Exercise, Fail
from .base import need, short, variant, watched
from .crash import explained
from .fixtures import PROMPT, cfg, small_model

STATEMENT = """
Report the standard error of both arms, not only the means: capture removes host-side variance,
and a tighter arm makes smaller real differences measurable.

Write measure(arms, reps) -> {name: (mean_ms, sem_ms)}. `arms` maps a name ("eager", "graph") to
a function; each call runs one rep on the shared engine and returns its ms/token. Call each arm
once untimed first (its warm-up: it compiles and captures every plan it meets; warm-ups in
either order), then `reps` rounds over the arms, every arm once per round and each round the one
before it reversed (A B, B A, A B, ...; either arm may open the first round), so drift lands on
both arms alike. Per arm, over its `reps` timed runs only: the mean (the arithmetic mean, not the
median), and the standard error of the mean: the SAMPLE standard deviation (ddof=1) divided by
sqrt(reps) (np.std(v, ddof=1), statistics.stdev or scipy.stats.sem all give it).

The check: fixed times (skewed, with slow warm-ups) and then the engine's arms; it records every
call and holds your numbers to them. Calling lab.measure.stats (mean_sem, paired_t) or
lab.measure.bench fails the check.
"""

STUB = '''
import math

import numpy as np


def measure(arms, reps):
    """{name: (mean ms/token, standard error)} over `reps` interleaved reps per arm."""
    out = {}
    # FILL ME IN
    return out
'''

REFERENCE = '''
import math

import numpy as np


def measure(arms, reps):
    names = list(arms)
    for name in names:
        arms[name]()                                   # warm-up: captures, untimed
    ms = {name: [] for name in names}
    for rep in range(reps):
        for name in (names if rep % 2 == 0 else names[::-1]):
            ms[name].append(arms[name]())
    out = {}
    for name, v in ms.items():
        v = np.asarray(v, np.float64)
        out[name] = (float(v.mean()), float(v.std(ddof=1) / math.sqrt(v.size)))
    return out
'''

BACK_TO_BACK = variant(REFERENCE, '''    for rep in range(reps):
        for name in (names if rep % 2 == 0 else names[::-1]):
            ms[name].append(arms[name]())''', '''    for name in names:
        for rep in range(reps):
            ms[name].append(arms[name]())''')
POPULATION_SD = variant(REFERENCE, "v.std(ddof=1)", "v.std()")
NO_WARM_UP = variant(REFERENCE, '''    for name in names:
        arms[name]()                                   # warm-up: captures, untimed
''')
# the median of the reps, not their mean
MEDIAN = variant(REFERENCE, "float(v.mean())", "float(np.median(v))")
# the standard deviation reported as the standard error
SD_NOT_SEM = variant(REFERENCE, "float(v.std(ddof=1) / math.sqrt(v.size))", "float(v.std(ddof=1))")
# the warm-up run kept among the timed reps
WARM_UP_TIMED = variant(REFERENCE, '''    for name in names:
        arms[name]()                                   # warm-up: captures, untimed
    ms = {name: [] for name in names}''', '''    ms = {name: [arms[name]()] for name in names}''')
# interleaved, but the same order every round: drift lands on the arm that runs second
SAME_ORDER = variant(REFERENCE, "(names if rep % 2 == 0 else names[::-1])", "names")

REPS, TOKENS = 5, 24
SYNTHETIC_REPS = 4
_REFS = (("lab.measure.stats.mean_sem", mean_sem), ("lab.measure.stats.paired_t", paired_t),
         ("lab.measure.bench.interleave", bench.interleave))


def _runs(seq: list) -> tuple[str, int]:
    """The arm with the longest run of consecutive calls in `seq`, and that run's length."""
    best, arm, k = 0, "", 0
    for i, a in enumerate(seq):
        k = k + 1 if i and seq[i - 1] == a else 1
        if k > best:
            best, arm = k, a
    return arm, best


def alternation_problem(order: list, arms: list, reps: int) -> str | None:
    """Why the timed calls `order` (each call's arm, in call order) are not `reps` rounds over
    `arms` with the order reversed every other round; None when they are. Any order of the arms
    may open the first round (A B, B A, ... or B A, A B, ...; with more arms any permutation,
    then its reverse); a round may also be the one before it rotated by one, either way (A B C,
    B C A, ..., the lab's recorders' order, or A B C, C A B, ...): what matters is that every
    arm runs once per round and takes every place in turn, so a drift in time lands on every
    arm alike."""
    n = len(arms)
    cut = max(12, 2 * n)
    shown = " ".join(map(str, order[:cut])) + (" ..." if len(order) > cut else "")
    example = (" ".join(arms) + ", " + " ".join(arms[::-1]) + ", ...")
    if len(order) != reps * n:
        return (f"{len(order)} timed runs for {n} arms x {reps} reps: run {reps} rounds, every "
                f"arm once per round")
    rounds = [order[i:i + n] for i in range(0, len(order), n)]
    for k, r in enumerate(rounds):
        if sorted(map(str, r)) != sorted(map(str, arms)):
            arm, run = _runs(order)
            back = (f"{arm} ran {run} reps back to back" if run > 2 else
                    f"round {k + 1} ran {' '.join(map(str, r))}")
            return (f"the timed runs came in the order {shown}: {back}; run every arm once per "
                    f"round, the order reversed every other round ({example}), not one arm's "
                    f"reps back to back -- drift would land on one arm")
    for k in range(1, len(rounds)):
        prev = list(rounds[k - 1])
        # reversed (A B C, C B A, ...) or rotated by one, either way (A B C, B C A, ...: lab.
        # measure.stats.rotated, the lab's recorders' order; A B C, C A B, ...: a deque's
        # rotate(1)): each puts every arm at every place in turn
        if list(rounds[k]) not in (prev[::-1], prev[1:] + prev[:1], prev[-1:] + prev[:-1]):
            same = list(rounds[k]) == list(rounds[k - 1])
            how = "reversed" if n == 2 else "reversed or rotated by one"
            return (f"the timed runs came in the order {shown}: "
                    + ("the same order every round" if same else
                       f"round {k + 1} is not round {k} {how}")
                    + f"; reverse the order every other round ({example}), so that drift lands "
                      f"on every arm alike")
    return None


def _close(x: float, y: float) -> bool:
    return math.isclose(x, y, rel_tol=1e-7, abs_tol=1e-15)


def _rounded(got: float, value: float) -> int | None:
    """The decimals `value` was rounded to, when `got` is it rounded (and not simply it)."""
    for k in range(7):
        if got != value and _close(got, round(value, k)):
            return k
    return None


def _mean_mistake(got: float, v, w, other) -> str:
    """Which wrong mean `got` is (v: the arm's timed reps, w: with its warm-up, other: the other
    arm's timed reps), or ""."""
    sem = float(np.std(v, ddof=1)) / math.sqrt(len(v))
    k = _rounded(got, float(np.mean(v)))
    if k is not None:
        return f"that is the mean rounded to {k} decimals: return it as computed"
    for value, why in ((sem, "that is the standard error: the pair is (mean, sem), in that order"),
                       (np.mean([*v, *other]), "that is the mean of both arms' timed reps "
                                               "together: each arm's own mean"),
                       (np.median(v), "that is the median of the timed reps: report their mean"),
                       (np.mean(w), "that mean includes the untimed warm-up: leave it out"),
                       (np.mean(other), "that is the other arm's mean: the arms are swapped"),
                       (np.mean(v[1:]), "that leaves out the first timed rep"),
                       (np.mean(v[:-1]), "that leaves out the last timed rep")):
        if _close(got, float(value)):
            return why
    return ""


def _sem_mistake(got: float, v, w, other) -> str:
    """Which wrong standard error `got` is, or ""."""
    n = len(v)
    s1, s0 = float(np.std(v, ddof=1)), float(np.std(v))
    k = _rounded(got, s1 / math.sqrt(n))
    if k is not None:
        return f"that is the standard error rounded to {k} decimals: return it as computed"
    for value, why in ((float(np.mean(v)), "that is the mean: the pair is (mean, sem), in that "
                                           "order"),
                       (s1 / math.sqrt(n + 1), "divide the sample sd by sqrt(reps), the number "
                                               "of timed reps (the warm-up is not one)"),
                       (s0 / math.sqrt(n), "that is the population sd (ddof=0): use the sample "
                                          "sd (ddof=1)"),
                       (s1, "that is the standard deviation, not the standard error: divide "
                            "it by sqrt(reps)"),
                       (s0, "that is the population standard deviation, not the standard "
                            "error: the sample sd (ddof=1) over sqrt(reps)"),
                       (s1 / math.sqrt(n - 1), "divide the sample sd by sqrt(reps), not "
                                               "sqrt(reps - 1)"),
                       (s1 ** 2 / math.sqrt(n), "that is the variance over sqrt(reps): take "
                                                "the sd (its square root) first"),
                       (s1 ** 2, "that is the variance, not the standard error"),
                       (float(np.std(w, ddof=1)) / math.sqrt(len(w)),
                        "that includes the untimed warm-up: leave it out"),
                       (float(np.std(other, ddof=1)) / math.sqrt(n),
                        "that is the other arm's: the arms are swapped")):
        if _close(got, value):
            return why
    return ""


def _synthetic(calls: list) -> dict:
    """Two arms whose times are fixed per rep (skewed: the median is not the mean), with a slow
    first run (the warm-up compiles and captures); every call recorded in `calls`."""
    times = {"eager": [9.0, 0.16, 0.21, 0.15, 0.36, 0.18],
             "graph": [31.0, 0.0250, 0.0262, 0.0244, 0.0301, 0.0249]}

    def call(name):
        def one():
            k = sum(c[0] == name for c in calls)
            ms = times[name][min(k, len(times[name]) - 1)]
            calls.append((name, ms))
            return ms
        return one
    return {name: call(name) for name in times}


def _judge(fn, arms: dict, calls: list, reps: int, label: str):
    got = watched(_REFS, explained(fn, f"measure ({label})"), arms, reps,
                  what=f"measure ({label})")
    if got is None:
        raise Fail("measure returned None: fill in the stub (# FILL ME IN)")
    names = list(arms)
    counts = {n: sum(c[0] == n for c in calls) for n in names}
    if any(counts[n] != reps + 1 for n in names):
        hint = f"each arm runs once to warm up, then {reps} timed reps, interleaved"
        if all(counts[n] == 1 for n in names):
            hint = (f"no rep was timed: each arm ran its warm-up only; then run {reps} timed "
                    f"rounds, every arm once per round")
        elif all(counts[n] == reps for n in names):
            hint = ("no untimed warm-up: an arm's first run compiles and captures; call each arm "
                    "once before the timed reps")
            first = names[0]
            runs = [c[1] for c in calls if c[0] == first]
            try:
                mean = float(got[first][0])
            except Exception:      # noqa: BLE001 -- no usable result: the count says enough
                mean = math.nan
            if _close(mean, float(np.mean(runs[1:]))):
                hint = (f"your means leave each arm's first run out (a warm-up), so {reps - 1} "
                        f"rounds were timed, one round too few: run {reps} timed rounds after "
                        f"the warm-up")
        raise Fail(f"{label}: the arms ran {counts} times for reps={reps}: {hint}")
    if sorted(c[0] for c in calls[:len(names)]) != sorted(names):
        raise Fail(f"{label}: the first runs were {' '.join(c[0] for c in calls[:len(names)])}: "
                   f"warm up every arm once, untimed, before the timed rounds")
    timed = calls[len(names):]
    problem = alternation_problem([c[0] for c in timed], names, reps)
    if problem:
        raise Fail(f"{label}: {problem}")
    if not isinstance(got, dict) or set(got) != set(names):
        gone = [n for n in names if not isinstance(got, dict) or n not in got]
        what = (f"the arm(s) {', '.join(gone)} are missing from it" if gone else
                "it holds keys that are not arms")
        raise Fail(f"measure returned {short(got)}: {what}; return a dict {{name: (mean, sem)}} "
                   f"with every arm")
    for n in names:
        v = [c[1] for c in timed if c[0] == n]
        w = [c[1] for c in calls if c[0] == n]
        other = [c[1] for c in timed if c[0] != n]
        mean, sem = mean_sem(v)
        try:
            g_mean, g_sem = (float(x) for x in got[n])
        except (TypeError, ValueError):
            raise Fail(f"measure()[{n!r}] = {got[n]!r}: a pair (mean, sem)") from None
        if not math.isclose(g_mean, mean, rel_tol=1e-9):
            why = _mean_mistake(g_mean, v, w, other) or (
                "the mean of the ms/token values the timed calls returned (each call's return "
                "value, not a time of your own), the warm-up left out")
            raise Fail(f"{label}, {n}: mean {g_mean:.6g} ms, the timed reps average {mean:.6g}: "
                       f"{why}")
        if not math.isclose(g_sem, sem, rel_tol=1e-9):
            why = _sem_mistake(g_sem, v, w, other) or ("the standard error is the sample sd "
                                                       "(ddof=1) over sqrt(reps)")
            raise Fail(f"{label}, {n}: sem {g_sem:.6g} ms, the timed reps give {sem:.6g}: {why}")
    return got


def _arms(backend, calls: list) -> dict:
    """The two arms on one engine; every call is appended to `calls` as (name, ms)."""
    pool: dict = {}
    arms = {name: bench.make_arm(small_model(), name, cfg(backend, graph=graph), i, pool=pool)
            for i, (name, graph) in enumerate((("eager", False), ("graph", True)))}
    run = bench.decode_run(PROMPT, TOKENS)

    def call(name):
        def one():
            ms, _ = run(arms[name].use())
            calls.append((name, ms))
            return ms
        return one
    return {name: call(name) for name in arms}


def cases(sol, backend):
    (fn,) = need(sol, ("measure",))
    calls: list = []
    _judge(fn, _synthetic(calls), calls, SYNTHETIC_REPS,
           f"fixed times, {SYNTHETIC_REPS} reps (skewed; slow warm-ups)")
    yield (f"fixed times over {SYNTHETIC_REPS} reps: warm-up left out, interleaved, means and "
           f"sample standard errors")
    calls = []
    got = _judge(fn, _arms(backend, calls), calls, REPS, f"the engine, {REPS} reps")
    yield (f"the engine: means and standard errors of both arms (sem eager / graph = "
           f"{float(got['eager'][1]) / float(got['graph'][1]):.1f})")


EXERCISE = Exercise(
    "variance", 8, "interleaved reps and the standard error of both arms", "§1", STATEMENT, STUB,
    ("measure",), cases, REFERENCE,
    {"back to back": (BACK_TO_BACK, "back to back"),
     "population sd": (POPULATION_SD, "population sd"),
     "no warm-up": (NO_WARM_UP, "no untimed warm-up"),
     "median": (MEDIAN, "the median"),
     "sd not sem": (SD_NOT_SEM, "not the standard error"),
     "warm-up timed": (WARM_UP_TIMED, "includes the untimed warm-up"),
     "same order every round": (SAME_ORDER, "the same order every round")},
    stub_says="each arm runs once to warm up")
