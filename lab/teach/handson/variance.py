"""Checklist step 8, measure the variance, not just the mean: interleaved paired reps of an eager
and a graph arm, each reported with its standard error.

The student writes `measure(arms, reps)`. Each arm is a run on ONE shared engine (the arms differ
only in LAB_GRAPH, as lab/measure/bench.py arranges them), and each call of it is one rep returning
the run's ms/token (model time on the simulator). The check records every call -- which arm, in what
order, what it returned -- and holds the student's means and standard errors to those numbers.
"""
from __future__ import annotations

import math

from lab.measure import bench
from lab.measure.stats import mean_sem, paired_t
from .base import Exercise, Fail, need, variant, watched
from .fixtures import PROMPT, cfg, small_model

SPEC = """
Report the standard error of both arms, not only the means: capture removes host-side variance,
and a tighter arm makes smaller real differences measurable.

Write measure(arms, reps) -> {name: (mean_ms, sem_ms)}. `arms` maps a name ("eager", "graph") to
a function; each call runs one rep on the shared engine and returns its ms/token. Call each arm
once untimed first (its warm-up: it compiles and captures every plan it meets), then `reps`
rounds over the arms, the order reversed every other round (A B, B A, ...), so drift lands on
both arms alike. The standard error of the mean: the SAMPLE standard deviation (ddof=1) divided
by sqrt(reps).

The check records every call and holds your numbers to them. Calling lab.measure.stats (mean_sem,
paired_t) or lab.measure.bench fails the check.
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

REPS, TOKENS = 5, 24
_REFS = (("lab.measure.stats.mean_sem", mean_sem), ("lab.measure.stats.paired_t", paired_t),
         ("lab.measure.bench.interleave", bench.interleave))


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
    got = watched(_REFS, fn, _arms(backend, calls), REPS, what="measure")
    if got is None:
        raise Fail("measure returned None: fill in the stub (# FILL ME IN)")
    names = ["eager", "graph"]
    counts = {n: sum(c[0] == n for c in calls) for n in names}
    if any(counts[n] != REPS + 1 for n in names):
        hint = ("no untimed warm-up: an arm's first run compiles and captures; call each arm once "
                "before the timed reps" if all(counts[n] == REPS for n in names) else
                f"each arm runs once to warm up, then {REPS} timed reps, interleaved")
        raise Fail(f"the arms ran {counts} times for reps={REPS}: {hint}")
    timed = calls[len(names):]
    order = [c[0] for c in timed]
    want_order = [n for r in range(REPS) for n in (names if r % 2 == 0 else names[::-1])]
    if calls[0][0] == "graph":
        want_order = [n for r in range(REPS) for n in (names[::-1] if r % 2 == 0 else names)]
    if order != want_order:
        raise Fail(f"the timed runs came in the order {' '.join(order)}: interleave the arms, "
                   f"reversing the order every other rep (A B, B A, ...), not one arm's reps "
                   f"back to back -- drift would land on one arm")
    yield "interleaved, order alternated, warm-up untimed"
    if not isinstance(got, dict) or set(got) != set(names):
        raise Fail(f"measure returned {got!r}: a dict {{name: (mean, sem)}} for every arm")
    for n in names:
        v = [c[1] for c in timed if c[0] == n]
        mean, sem = mean_sem(v)
        try:
            g_mean, g_sem = (float(x) for x in got[n])
        except (TypeError, ValueError):
            raise Fail(f"measure()[{n!r}] = {got[n]!r}: a pair (mean, sem)") from None
        if not math.isclose(g_mean, mean, rel_tol=1e-9):
            raise Fail(f"{n}: mean {g_mean:.6g} ms, the timed reps average {mean:.6g}")
        if not math.isclose(g_sem, sem, rel_tol=1e-9):
            ddof0 = sem * math.sqrt((REPS - 1) / REPS)
            extra = (" -- that is the population sd (ddof=0): use the sample sd (ddof=1)"
                     if math.isclose(g_sem, ddof0, rel_tol=1e-6) else "")
            raise Fail(f"{n}: sem {g_sem:.6g} ms, the timed reps give {sem:.6g}{extra}")
    yield (f"means and standard errors of both arms (sem eager / graph = "
           f"{got['eager'][1] / got['graph'][1]:.1f})")


EXERCISE = Exercise(
    "variance", 8, "interleaved reps and the standard error of both arms", "§1", SPEC, STUB,
    ("measure",), cases, REFERENCE,
    {"back to back": (BACK_TO_BACK, "back to back"),
     "population sd": (POPULATION_SD, "population sd"),
     "no warm-up": (NO_WARM_UP, "no untimed warm-up")},
    stub_says="each arm runs once to warm up, then 5 timed reps")
