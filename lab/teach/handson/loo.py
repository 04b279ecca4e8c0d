"""Checklist step 10, attribute leave-one-out: what each factor is worth in the presence of all
the others, and the all-off arm beside them.

The student writes `leave_one_out(run, factors, reps)`. `run(off)` runs one rep of the arm with
the factors in `off` switched off and the others on, on ONE shared engine (the factors are launch
toggles: LAB_GRAPH, LAB_SPLIT_COMBINE), and returns its ms/token; an arm's first run is an
untimed warm-up the check does itself. The check records every run and holds the student's
table to the numbers those runs returned.
"""
from __future__ import annotations

import math

from lab.measure import bench
from lab.measure.stats import loo_rows, paired_test
from .base import Exercise, Fail, need, variant, watched
from .fixtures import PROMPT, cfg, small_model

SPEC = """
A cumulative ladder credits whichever change came first with the benefit the changes share.
Leave-one-out measures each factor's marginal worth with all the others on: worth(F) =
ms/token(all on but F) - ms/token(all on), paired rep by rep. Publish the all-off arm too.

Write leave_one_out(run, factors, reps) -> {factor: worth_ms, ..., "all": worth_ms}. run(off)
(off: a frozenset of factor names) runs ONE rep of the arm with those factors off and returns
its ms/token. Arms: all on (frozenset()), each factor left out (frozenset({F})), all off
(frozenset(factors)). Run `reps` rounds over the arms, the order reversed every other round.
worth(F) = mean over reps of ms[-F][r] - ms[all on][r]; "all" = mean of ms[all off][r] -
ms[all on][r]. Positive: the factor saves time.

The check records every run and holds your table to it. Calling lab.measure.stats (loo_rows,
paired_test) or lab.measure.bench fails the check.
"""

STUB = '''
import numpy as np


def leave_one_out(run, factors, reps):
    """{factor: ms/token saved by it with the others on, ..., "all": all off - all on}."""
    table = {}
    # FILL ME IN
    return table
'''

REFERENCE = '''
import numpy as np


def leave_one_out(run, factors, reps):
    arms = [frozenset()] + [frozenset({f}) for f in factors] + [frozenset(factors)]
    ms = {off: [] for off in arms}
    for rep in range(reps):
        for off in (arms if rep % 2 == 0 else arms[::-1]):
            ms[off].append(run(off))
    on = np.asarray(ms[frozenset()])
    table = {f: float(np.mean(np.asarray(ms[frozenset({f})]) - on)) for f in factors}
    table["all"] = float(np.mean(np.asarray(ms[frozenset(factors)]) - on))
    return table
'''

# a cumulative ladder: each factor credited for what it adds to the ones switched on before it
LADDER = variant(REFERENCE, '''    arms = [frozenset()] + [frozenset({f}) for f in factors] + [frozenset(factors)]''',
                 '''    arms = [frozenset(factors[i:]) for i in range(len(factors) + 1)]''')
LADDER = variant(LADDER, '''    table = {f: float(np.mean(np.asarray(ms[frozenset({f})]) - on)) for f in factors}''',
                 '''    table = {f: float(np.mean(np.asarray(ms[frozenset(factors[i:])])
                              - np.asarray(ms[frozenset(factors[i + 1:])])))
             for i, f in enumerate(factors)}''')
# all on minus all on-but-F: the sign flipped
SIGN = variant(REFERENCE, "np.asarray(ms[frozenset({f})]) - on",
               "on - np.asarray(ms[frozenset({f})])")

FACTORS, REPS, TOKENS = ("GRAPH", "SPLIT_COMBINE"), 3, 16
_REFS = (("lab.measure.stats.loo_rows", loo_rows), ("lab.measure.stats.paired_test", paired_test),
         ("lab.measure.bench.run_loo", bench.run_loo))


def _runner(backend, calls: list):
    """run(off) on one engine shared by every arm; each arm warmed up once, untimed."""
    base = cfg(backend)
    pool: dict = {}
    arms: dict = {}
    run = bench.decode_run(PROMPT, TOKENS)

    def one(off):
        off = frozenset(off)
        if not off <= set(FACTORS):
            raise ValueError(f"unknown factor(s) {sorted(off - set(FACTORS))}; the factors are "
                             f"{FACTORS}")
        if off not in arms:
            c = base.with_toggles({f"LAB_{f}": "0" if f in off else "1" for f in FACTORS})
            arms[off] = bench.make_arm(small_model(), "-".join(sorted(off)) or "all-on", c,
                                       len(arms), pool=pool)
            run(arms[off].use())                               # warm-up: untimed
        ms, _ = run(arms[off].use())
        calls.append((off, ms))
        return ms
    return one


def cases(sol, backend):
    (fn,) = need(sol, ("leave_one_out",))
    calls: list = []
    got = watched(_REFS, fn, _runner(backend, calls), list(FACTORS), REPS, what="leave_one_out")
    if got is None:
        raise Fail("leave_one_out returned None: fill in the stub (# FILL ME IN)")
    ms: dict = {}
    for off, v in calls:
        ms.setdefault(off, []).append(v)
    need_arms = {"all-on": frozenset(), "all-off": frozenset(FACTORS),
                 **{f"-{f}": frozenset({f}) for f in FACTORS}}
    missing = [name for name, off in need_arms.items() if len(ms.get(off, [])) != REPS]
    if not calls:
        raise Fail(f"no arm ran: run all on, each factor left out ({', '.join(FACTORS)}) and all "
                   f"off, {REPS} interleaved reps each, then tabulate")
    if missing:
        hint = ("a cumulative ladder (factors switched on one after another) credits the first "
                "with the benefit they share: leave each factor out of ALL-ON"
                if any(m.startswith("-") for m in missing) else f"run each arm {REPS} times")
        raise Fail(f"arm(s) {', '.join(missing)} did not run {REPS} reps: {hint}")
    yield "every arm: all on, each factor left out, all off"
    if not isinstance(got, dict):
        raise Fail(f"leave_one_out returned {type(got).__name__}: a dict {{factor: worth_ms}}")
    named = {name: ms[off] for name, off in need_arms.items()}
    rows = {r["factor"]: r["worth_ms"] for r in loo_rows(named, FACTORS)}
    for key in (*FACTORS, "all"):
        if key not in got:
            raise Fail(f"no {key!r} in your table: give every factor and the all-off row 'all'")
        want = rows[key]
        if not math.isclose(float(got[key]), want, rel_tol=1e-9, abs_tol=1e-12):
            extra = (" -- the sign is flipped: worth = ms(all on but F) - ms(all on), positive "
                     "when F saves time" if math.isclose(float(got[key]), -want, rel_tol=1e-9)
                     else "")
            raise Fail(f"worth of {key}: {float(got[key]):.6g} ms/token, the runs give "
                       f"{want:.6g}{extra}")
    yield "the table, paired rep by rep"


EXERCISE = Exercise(
    "loo", 10, "the leave-one-out table", "§7", SPEC, STUB, ("leave_one_out",), cases,
    REFERENCE,
    {"cumulative ladder": (LADDER, "cumulative ladder"),
     "sign flipped": (SIGN, "the sign is flipped")},
    stub_says="no arm ran")
