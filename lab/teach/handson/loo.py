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

import numpy as np

from lab.measure import bench
from lab.measure.stats import loo_rows, paired_test
from lab.teach.exercise import Exercise, Fail
from .base import need, variant, watched
from .crash import explained
from .fixtures import PROMPT, cfg, small_model
from .variance import alternation_problem

STATEMENT = """
A cumulative ladder credits whichever change came first with the benefit the changes share.
Leave-one-out measures each factor's marginal worth with all the others on: worth(F) =
ms/token(all on but F) - ms/token(all on), paired rep by rep. Publish the all-off arm too.

Write leave_one_out(run, factors, reps) -> {factor: worth_ms, ..., "all": worth_ms}. run(off)
(off: a frozenset of factor names) runs ONE rep of the arm with those factors off and returns
its ms/token. Arms: all on (frozenset()), each factor left out (frozenset({F})), all off
(frozenset(factors)). Run `reps` rounds over the arms, every arm once per round and each round
the one before it reversed, or rotated by one either way (lab.measure.stats.rotated, a deque's
rotate); any order of the arms may open the first round. So a drift in time lands on every arm
alike -- never one arm's reps back to back. worth(F) = mean over reps r of ms[-F][r] -
ms[all on][r], where [r] is the arm's r-th run (the mean, not the median); "all" = mean of
ms[all off][r] - ms[all on][r], measured (not the sum of the worths: factors interact).
Positive: the factor saves time. Use the `factors` and `reps` you are given.

The check: a run with fixed times drifting from call to call (three factors), then the engine's
arms (LAB_GRAPH, LAB_SPLIT_COMBINE); it records every run and holds your table to it. Calling
lab.measure.stats (loo_rows, paired_test) or lab.measure.bench fails the check.
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

# every arm's reps back to back: the drift between them is credited to the factors
BACK_TO_BACK = variant(REFERENCE, """    for rep in range(reps):
        for off in (arms if rep % 2 == 0 else arms[::-1]):
            ms[off].append(run(off))""", """    for off in arms:
        for rep in range(reps):
            ms[off].append(run(off))""")
# the median of the paired differences, not their mean
MEDIAN = variant(REFERENCE, "table = {f: float(np.mean(np.asarray(ms[frozenset({f})]) - on))",
                 "table = {f: float(np.median(np.asarray(ms[frozenset({f})]) - on))")
# "all" as the sum of the single worths: what interacts is lost
ALL_AS_SUM = variant(REFERENCE, '''    table["all"] = float(np.mean(np.asarray(ms[frozenset(factors)]) - on))''',
                     '''    table["all"] = float(sum(table.values()))''')

FACTORS, REPS, TOKENS = ("GRAPH", "SPLIT_COMBINE"), 3, 16
SYNTHETIC_FACTORS, SYNTHETIC_REPS = ("PDL", "FUSION", "OVERLAP"), 4
_REFS = (("lab.measure.stats.loo_rows", loo_rows), ("lab.measure.stats.paired_test", paired_test),
         ("lab.measure.bench.run_loo", bench.run_loo))


def _arm_name(off: frozenset, factors) -> str:
    if not off:
        return "all-on"
    if off == frozenset(factors):
        return "all-off"
    return "-" + "-".join(sorted(off))


def _checked(off, factors) -> frozenset:
    if isinstance(off, str):
        raise ValueError(f"run(off): off is a frozenset of factor names, e.g. frozenset({{{off!r}}}"
                         f"), not the string {off!r} (a frozenset of its letters)")
    try:
        off = frozenset(off)
    except TypeError:
        raise ValueError(f"run(off): off is a frozenset of factor names, got {off!r}") from None
    if not off <= set(factors):
        raise ValueError(f"unknown factor(s) {sorted(map(str, off - set(factors)))}; the factors "
                         f"are {tuple(factors)}: use the factors you are given")
    return off


def _runner(backend, calls: list):
    """run(off) on one engine shared by every arm; each arm warmed up once, untimed."""
    base = cfg(backend)
    pool: dict = {}
    arms: dict = {}
    run = bench.decode_run(PROMPT, TOKENS)

    def one(off):
        off = _checked(off, FACTORS)
        if off not in arms:
            c = base.with_toggles({f"LAB_{f}": "0" if f in off else "1" for f in FACTORS})
            arms[off] = bench.make_arm(small_model(), "-".join(sorted(off)) or "all-on", c,
                                       len(arms), pool=pool)
            run(arms[off].use())                               # warm-up: untimed
        ms, _ = run(arms[off].use())
        calls.append((off, ms))
        return ms
    return one


def _drifting(calls: list):
    """run(off) with fixed times: each arm's own level, plus a clock that drifts 0.004 ms/token
    per call (a run later in the session is slower) and a noise fixed per call, skewed so that the
    median of the differences is not their mean."""
    level = {frozenset(): 0.025, frozenset({"PDL"}): 0.031, frozenset({"FUSION"}): 0.040,
             frozenset({"OVERLAP"}): 0.026, frozenset(SYNTHETIC_FACTORS): 0.160}

    def one(off):
        off = _checked(off, SYNTHETIC_FACTORS)
        k = len(calls)
        ms = level.get(off, 0.05) + 0.004 * k + 0.001 * (k * k % 7) + 0.02 * (k % 11 == 7)
        calls.append((off, ms))
        return ms
    return one


def _mistake(got: float, key: str, d: dict, want: dict, on) -> str:
    """Which wrong worth `got` is (d: each key's paired differences over the reps, on: the
    all-on arm's times), or ""."""
    def close(x):
        return math.isclose(got, float(x), rel_tol=1e-7, abs_tol=1e-12)
    if close(np.mean(d[key] + 2 * on)):
        return ("that adds ms(all on) instead of subtracting it: worth = ms(all on but F) - "
                "ms(all on), rep by rep")
    if close(-want[key]):
        return ("the sign is flipped: worth = ms(all on but F) - ms(all on), positive when F "
                "saves time")
    if close(np.median(d[key])):
        return "that is the median of the paired differences: report their mean"
    if close(d[key][0]) or close(d[key][-1]):
        return "that is one rep's difference: average the paired differences over every rep"
    if close(np.mean(d[key][1:])) or close(np.mean(d[key][:-1])):
        return (f"that leaves out the {'first' if close(np.mean(d[key][1:])) else 'last'} rep: "
                f"average the paired differences over every rep")
    if close(np.mean((d[key] + on) / on)) or close(np.mean(on / (d[key] + on))):
        return ("that is a ratio of times: a worth is a difference in ms/token, ms(all on but "
                "F) - ms(all on)")
    if key == "all" and close(sum(want[k] for k in want if k != "all")):
        return ("that is the sum of the single worths: 'all' is measured, all off - all on, "
                "and differs from the sum where the factors interact")
    for other in want:
        if other != key and close(want[other]):
            return f"that is the worth of {other!r}: the factors are swapped"
    return ""


def _arms_needed(factors) -> dict:
    return {"all-on": frozenset(), "all-off": frozenset(factors),
            **{f"-{f}": frozenset({f}) for f in factors}}


def _judge(fn, run, factors, reps, calls, label):
    try:
        got = watched(_REFS, explained(fn, f"leave_one_out ({label})"), run, list(factors), reps,
                      what=f"leave_one_out ({label})")
    except Fail:
        # a crash after every arm ran, unequal counts (arrays that do not pair up): the counts
        # are the mistake, the crash followed from them
        ran = {off for off, _ in calls}
        if ran >= set(_arms_needed(factors).values()) and \
                len({sum(o == off for o, _ in calls) for off in ran}) > 1:
            _runs_checked(calls, factors, reps, label, " (and then your table stopped on an "
                                                       "exception)")
        raise
    if got is None:
        raise Fail("leave_one_out returned None: fill in the stub (# FILL ME IN)")
    ms, need_arms = _runs_checked(calls, factors, reps, label)
    _table_checked(got, ms, need_arms, factors, label)


def _runs_checked(calls, factors, reps, label, after: str = ""):
    """The arms' runs held to the statement: every arm `reps` times, no other, interleaved."""
    if not calls:
        raise Fail(f"no arm ran: run all on, each factor left out ({', '.join(factors)}) and all "
                   f"off, {reps} interleaved reps each, then tabulate")
    ms: dict = {}
    for off, v in calls:
        ms.setdefault(off, []).append(v)
    need_arms = _arms_needed(factors)
    missing = [name for name, off in need_arms.items() if len(ms.get(off, [])) != reps]
    if missing:
        alone = {frozenset(factors) - {f} for f in factors}
        hint = ("you switched each factor on alone, from all off (what it adds to nothing): "
                "leave-one-out takes each factor OUT of all on, off = frozenset({F})"
                if len(factors) > 2 and alone <= set(ms) else
                "a cumulative ladder (factors switched on one after another) credits the first "
                "with the benefit they share: leave each factor out of ALL-ON"
                if any(m.startswith("-") and not ms.get(need_arms[m]) for m in missing) else
                f"run each arm {reps} times, no other arm")
        ran = {_arm_name(off, factors): len(v) for off, v in ms.items()}
        counts = {len(ms.get(off, [])) for off in need_arms.values()}
        if len(counts) == 1 and 0 not in counts:
            k = counts.pop()
            hint = (f"every arm ran {k} reps, {'one ' if abs(k - reps) == 1 else ''}"
                    f"{'too many' if k > reps else 'too few'}: {hint}")
        else:
            few = [name for name, off in need_arms.items() if 0 < len(ms.get(off, [])) < reps]
            many = [name for name, off in need_arms.items() if len(ms.get(off, [])) > reps]
            said = ([f"too few for {', '.join(few)}"] if few else []) + (
                [f"too many for {', '.join(many)}"] if many else [])
            if said:
                hint = (f"{'; '.join(said)}, so the arms' reps do not pair up rep by rep; "
                        f"{hint}")
        raise Fail(f"{label}: arm(s) {', '.join(missing)} did not run {reps} reps (the runs: "
                   f"{ran}): {hint}{after}")
    extra = [off for off in ms if off not in need_arms.values()]
    if extra:
        raise Fail(f"{label}: you ran the arm {_arm_name(extra[0], factors)}, which leave-one-out "
                   f"does not use: run all on, each factor left out, all off")
    problem = alternation_problem([_arm_name(off, factors) for off, _ in calls],
                                  [_arm_name(off, factors) for off in need_arms.values()], reps)
    if problem:
        raise Fail(f"{label}: {problem}{after}")
    return ms, need_arms


def _table_checked(got, ms, need_arms, factors, label):
    """The solution's table held to the runs it made."""
    if not isinstance(got, dict):
        raise Fail(f"leave_one_out returned {type(got).__name__}: a dict {{factor: worth_ms}}")
    named = {name: ms[off] for name, off in need_arms.items()}
    want = {r["factor"]: r["worth_ms"] for r in loo_rows(named, factors) if r["factor"] != "interaction"}
    on = np.asarray(named["all-on"], np.float64)
    d = {f: np.asarray(named[f"-{f}"], np.float64) - on for f in factors}
    d["all"] = np.asarray(named["all-off"], np.float64) - on
    for key in (*factors, "all"):
        if key not in got:
            raise Fail(f"{label}: no {key!r} in your table: give every factor and the all-off row "
                       f"'all'")
        try:
            value = float(got[key])
        except (TypeError, ValueError):
            raise Fail(f"{label}: your table's {key!r} is {got[key]!r}: a number (ms/token)") \
                from None
        if not math.isclose(value, want[key], rel_tol=1e-9, abs_tol=1e-12):
            why = _mistake(value, key, d, want, on) or (
                "worth(F) is the mean over reps of ms(all on but F) - ms(all on), paired rep by "
                "rep")
            raise Fail(f"{label}: worth of {key}: {value:.6g} ms/token, the runs give "
                       f"{want[key]:.6g}: {why}")


def cases(sol, backend):
    (fn,) = need(sol, ("leave_one_out",))
    calls: list = []
    label = (f"fixed times drifting call by call, factors {', '.join(SYNTHETIC_FACTORS)}, "
             f"{SYNTHETIC_REPS} reps")
    _judge(fn, _drifting(calls), SYNTHETIC_FACTORS, SYNTHETIC_REPS, calls, label)
    yield label
    calls = []
    _judge(fn, _runner(backend, calls), FACTORS, REPS, calls,
           f"the engine, factors {', '.join(FACTORS)}, {REPS} reps")
    yield "the engine: every arm, interleaved, the table paired rep by rep"


EXERCISE = Exercise(
    "loo", 10, "the leave-one-out table", "§7", STATEMENT, STUB, ("leave_one_out",), cases,
    REFERENCE,
    {"cumulative ladder": (LADDER, "cumulative ladder"),
     "sign flipped": (SIGN, "the sign is flipped"),
     "back to back": (BACK_TO_BACK, "back to back"),
     "median": (MEDIAN, "median"),
     "all as the sum": (ALL_AS_SUM, "the sum of the single worths")},
    stub_says="no arm ran")
