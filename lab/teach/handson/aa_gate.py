"""Checklist step 7 (the benchmark's side): the A/A gate in front of every A/B -- A against a
second copy of A, interleaved like the A/B; their paired difference must stay within its noise
and their outputs must agree byte for byte, or no A/B run in that setup means anything.

The student writes `aa_gate(run_a, run_a2, reps, critical)`. Each call of a run is one rep on a
real engine returning (ms/token, (token ids, logits)). The check records every call and holds the
student's verdict to lab.measure.stats.aa_verdict on those very numbers, on three setups: a true
copy (the same engine), a copy reading an uninitialised cache after a seek (its bytes differ), and a
"copy" that is not one (another launch configuration: its time differs); then two A/As whose
times are chosen so that only the critical value for the reps at hand decides (a fixed |t| > 3
gets both wrong).
"""
from __future__ import annotations

import math

import numpy as np

from lab.measure import bench
from lab.measure.stats import aa_verdict, mean_sem, outputs_differ, paired_t, t_critical
from lab.teach.exercise import Exercise, Fail
from .base import need, variant, watched
from .crash import explained
from .fixtures import PROMPT, cfg, small_model
from .variance import alternation_problem

STATEMENT = """
Before an A/B, run A against a second copy of A in the same harness. If A' - A differs beyond its
noise, or their outputs differ, the harness cannot tell A from B: re-run, then look -- never read
the A/B.

Write aa_gate(run_a, run_a2, reps, critical) -> bool: True when an A/B may be believed. Each call
of run_a() or run_a2() runs one rep and returns (ms_per_token, (token_ids, logits)). Run `reps`
rounds, one rep of each arm per round, each round the one before it reversed (A A', A' A, ...;
either arm may open the first round). Fail the gate (False) when
  - the PAIRED t of the differences d[r] = ms(A')[r] - ms(A)[r], rep by rep, has |t| > critical:
    t = mean(d) / (sd(d) / sqrt(reps)), with the SAMPLE sd (ddof=1); all d equal and nonzero is
    |t| = inf, all d zero is t = 0. The test is two-sided (A' slower or faster both fail it) and
    paired: not an unpaired (Welch or pooled) comparison of the two arms' means. `critical` is the
    |t| that identical arms exceed 1% of the time at these reps: use it, not a fixed number;
    scipy.stats.ttest_rel(a2, a).statistic is the same t where the sd is not 0.
  - or any rep's token ids or logits differ between A and A', byte for byte (.tobytes(), or
    np.array_equal: no tolerance, one ulp is a difference), at every rep, not only the first.
You may return False as soon as outputs differ; otherwise run all `reps` rounds.

The check: A/As with fixed times and outputs (where ddof, sidedness, pairing, the mean, the
critical value and a difference at a later rep decide), then a true copy, a copy reading an
uninitialised cache after a seek, and a "copy" in another launch configuration, against
lab.measure.stats.aa_verdict (calling lab.measure.stats fails the check).
"""

STUB = '''
import math

import numpy as np


def aa_gate(run_a, run_a2, reps, critical):
    """True when A and its copy A' agree within their noise and byte for byte."""
    # FILL ME IN
    return True
'''

REFERENCE = '''
import math

import numpy as np


def aa_gate(run_a, run_a2, reps, critical):
    ms = {"A": [], "A'": []}
    out = {"A": [], "A'": []}
    runs = {"A": run_a, "A'": run_a2}
    for rep in range(reps):
        for name in (("A", "A'") if rep % 2 == 0 else ("A'", "A")):
            t, result = runs[name]()
            ms[name].append(t)
            out[name].append(result)
    for (ta, la), (tb, lb) in zip(out["A"], out["A'"]):
        same = (np.asarray(ta).tobytes() == np.asarray(tb).tobytes()
                and np.asarray(la).tobytes() == np.asarray(lb).tobytes())
        if not same:
            return False
    d = np.asarray(ms["A'"]) - np.asarray(ms["A"])
    sem = d.std(ddof=1) / math.sqrt(d.size)
    mean = d.mean()
    t = (0.0 if mean == 0 else math.copysign(math.inf, mean)) if sem == 0 else mean / sem
    return abs(t) <= critical
'''

# the times only: outputs never compared
TIMES_ONLY = variant(REFERENCE, """        if not same:
            return False
""")

# all of A's reps, then all of the copy's: drift between them reads as a difference
BACK_TO_BACK = variant(REFERENCE, """    for rep in range(reps):
        for name in (("A", "A'") if rep % 2 == 0 else ("A'", "A")):""", """    for name in ("A", "A'"):
        for rep in range(reps):""")

# the textbook's |t| > 3 at every rep count: too strict at few reps, too lax at many
FIXED_3 = variant(REFERENCE, """    return abs(t) <= critical
""", """    return abs(t) <= 3
""")

# one-sided: A' slower beyond the noise fails the gate, A' faster passes it
ONE_SIDED = variant(REFERENCE, "    return abs(t) <= critical\n", "    return t <= critical\n")
# the population sd (ddof=0): the standard error too small, |t| too large
POPULATION_SD = variant(REFERENCE, "d.std(ddof=1)", "d.std()")
# the outputs of the first rep only
FIRST_REP_ONLY = variant(REFERENCE, 'zip(out["A"], out["A\'"])', 'zip(out["A"][:1], out["A\'"][:1])')
# the outputs within a tolerance: one ulp apart counts as the same
TOLERANCE = variant(REFERENCE, "np.asarray(la).tobytes() == np.asarray(lb).tobytes()",
                    "np.allclose(la, lb)")
# an unpaired comparison of the two means (Welch): the drift both arms share is noise to it
UNPAIRED = variant(REFERENCE, '''    d = np.asarray(ms["A'"]) - np.asarray(ms["A"])
    sem = d.std(ddof=1) / math.sqrt(d.size)
    mean = d.mean()''', '''    a, a2 = np.asarray(ms["A"]), np.asarray(ms["A'"])
    sem = math.sqrt(a.var(ddof=1) / a.size + a2.var(ddof=1) / a2.size)
    mean = a2.mean() - a.mean()''')

REPS, TOKENS, CONTEXT = 4, 16, 100
_REFS = (("lab.measure.stats.aa_verdict", aa_verdict), ("lab.measure.stats.paired_t", paired_t),
         ("lab.measure.stats.mean_sem", mean_sem))


def _setups(backend):
    """(label, [arm A, arm A'], the run): arms warmed up, untimed."""
    model, run = small_model(), bench.decode_run(PROMPT, TOKENS)
    pool: dict = {}
    same = [bench.make_arm(model, n, cfg(backend, graph=False), i, pool=pool)
            for i, n in enumerate(("A", "A'"))]
    yield "a true copy of A (one engine, eager)", same, run
    empty = [bench.make_arm(model, n, cfg(backend), i, kv_init="empty")
             for i, n in enumerate(("A", "A'"))]
    yield ("a copy reading an uninitialised cache after a seek", empty,
           bench.context_run(PROMPT, CONTEXT, TOKENS))
    pool = {}
    split = cfg(backend, graph=False, split_combine=True)
    other = [bench.make_arm(model, "A", cfg(backend, graph=False), 0, pool=pool),
             bench.make_arm(model, "A'", split, 1, pool=pool)]
    yield "a 'copy' that is not one (A' splits its combine)", other, run


def _recorded(arm, run, calls, order):
    def one():
        ms, out = run(arm.use())
        calls[arm.name].append((ms, out))
        order.append(arm.name)
        return ms, out
    return one


# ---- A/As with fixed times and outputs: each decided by one thing a wrong gate gets wrong ------
_IDS = np.arange(3, 11, dtype=np.int32)
_LOGITS = np.linspace(-2.0, 2.0, 8, dtype=np.float32)


def _out(ids_at: int | None = None, ulp_at: int | None = None, logit_shift: float = 0.0):
    """(token ids, logits): the same every call, or with the token id at `ids_at` changed, or
    the logit at `ulp_at` one ulp up (a difference no tolerance sees), or every logit shifted."""
    ids, logits = _IDS.copy(), _LOGITS + np.float32(logit_shift)
    if ids_at is not None:
        ids[ids_at] += 1
    if ulp_at is not None:
        logits[ulp_at] = np.nextafter(logits[ulp_at], np.float32(np.inf), dtype=np.float32)
    return ids, logits


def _times(reps: int, t: float, drift: float = 0.0) -> tuple[list[float], list[float]]:
    """Times of A and A' (ms/token) whose paired differences have exactly this t at `reps`
    (even): d = t * sem + e, e alternating +-0.004; `drift` a slope both arms share, rep to rep."""
    e = np.array([(-1.0) ** k for k in range(reps)]) * 0.004
    sem = e.std(ddof=1) / math.sqrt(reps)
    a = 0.07 + drift * np.arange(reps) + 0.001 * (np.arange(reps) % 3)
    return list(a), list(a + t * sem + e)


def _skewed() -> tuple[list[float], list[float]]:
    """8 reps whose differences are 0 three times and 0.01 five times: the paired |t| (3.42) is
    within the critical value at 8 reps (3.50); a t of their median (5.46) is not."""
    a = [0.0703125 + 0.0009765625 * (k % 3) for k in range(8)]
    return a, [x + (0.0 if k < 3 else 0.009765625) for k, x in enumerate(a)]


def _fixture(label, reps, t=None, times=None, a2_outs=None, hint="", critical=None):
    a, a2 = times if times is not None else _times(reps, t)
    same = [_out() for _ in range(reps)]
    return {"label": label, "a": a, "a2": a2, "oa": same, "oa2": a2_outs or same,
            "critical": t_critical(0.01, reps - 1) if critical is None else critical,
            "hint": hint}


# 2 reps whose differences are 3/64 and 1/64 ms: mean 1/32, sem 1/64 (sd sqrt(2)/64 over
# sqrt(2)), t = 2 exactly however it is computed (by hand, numpy, statistics, scipy)
_TIE = ([0.5, 0.5], [0.546875, 0.515625])


def _differs_at(reps: int, k: int, **change) -> list:
    return [_out(**change) if r == k else _out() for r in range(reps)]


_TWO_SIDED = ("the gate is two-sided: A' slower OR faster beyond its noise fails it; judge |t| "
              "(or the t of A' - A and of A - A' alike)")
_EVERY_REP = "compare the outputs of EVERY rep, not only the first (or the last)"
_FIXTURES = [
    _fixture("4 reps, |t| just under the critical value with the sample sd", 4,
             t=0.93 * t_critical(0.01, 3),
             hint="the standard error uses the SAMPLE sd (ddof=1): the population sd (ddof=0) "
                  "makes |t| too large"),
    _fixture("4 reps, |t| just over the critical value", 4, t=1.08 * t_critical(0.01, 3),
             hint="the standard error is the sample sd over sqrt(reps), not sqrt(reps - 1)"),
    _fixture("6 reps, A' faster than A well beyond its noise", 6, t=-1.6 * t_critical(0.01, 5),
             hint=_TWO_SIDED),
    _fixture("6 reps, A' slower than A well beyond its noise", 6, t=1.6 * t_critical(0.01, 5),
             hint=_TWO_SIDED),
    _fixture("6 reps drifting 5% a rep, A' always a little slower", 6,
             times=_times(6, 1.6 * t_critical(0.01, 5), drift=0.0035),
             hint="pair the reps: the t of d = A' - A rep by rep, in which the drift both arms "
                  "share cancels, not an unpaired (Welch or pooled) comparison of two means"),
    _fixture("4 reps whose |t| is 4.5 (the critical value at 4 reps: 5.84)", 4, t=4.5,
             hint="judge |t| against `critical`, the t distribution's value for these reps, not a "
                  "fixed threshold such as 3"),
    _fixture("16 reps whose |t| is 2.98 (the critical value at 16 reps: 2.95)", 16, t=2.98,
             hint="judge |t| against `critical`, the t distribution's value for these reps, not a "
                  "fixed threshold such as 3"),
    _fixture("2 reps whose |t| is exactly the critical value given (2.0): a tie passes", 2,
             times=_TIE, critical=2.0,
             hint="a |t| exactly at the threshold passes: the gate fails only when |t| > "
                  "critical, so pass on |t| <= critical (not <)"),
    _fixture("4 reps, every difference 0", 4, times=([0.0703125] * 4, [0.0703125] * 4),
             hint="every difference is 0, so the sem is 0 and t = 0 (the statement's convention; "
                  "0/0 in NumPy or scipy gives nan): the gate passes"),
    _fixture("4 reps, every difference 0, a critical value of 0.5 given", 4,
             times=([0.0703125] * 4, [0.0703125] * 4), critical=0.5,
             hint="every difference is 0, so the sem is 0 and t = 0 (the statement's convention), "
                  "within any critical value: the gate passes"),
    _fixture("4 reps, every difference the same 0.0078125 ms", 4,
             times=([0.0703125] * 4, [0.078125] * 4),
             hint="every difference is the same nonzero value: the sem is 0 and |t| = inf (the "
                  "statement's convention): the gate fails"),
    _fixture("8 reps, A' as fast as A in three and 0.01 ms slower in five (the median of d is "
             "not its mean)", 8, times=_skewed(),
             hint="t is the MEAN of the differences over their standard error, not the median"),
    _fixture("4 reps, the first token id differs at rep 2 only", 4, t=0.5,
             a2_outs=_differs_at(4, 1, ids_at=0),
             hint="compare the token ids of every rep, byte for byte"),
    _fixture("4 reps, token ids differ at rep 3 only", 4, t=0.5,
             a2_outs=_differs_at(4, 2, ids_at=5), hint=_EVERY_REP),
    _fixture("4 reps, one logit one ulp apart at rep 2 only", 4, t=0.5,
             a2_outs=_differs_at(4, 1, ulp_at=6),
             hint="compare the logits byte for byte: one ulp apart is a difference, which a "
                  "tolerance (np.allclose, isclose) calls the same"),
    _fixture("4 reps, the logits a quarter apart at rep 4 only, the token ids the same", 4,
             t=0.5, a2_outs=_differs_at(4, 3, logit_shift=0.25),
             hint="compare the logits too, byte for byte"),
    _fixture("4 reps, the last token id differs at rep 1 only", 4, t=-0.5,
             a2_outs=_differs_at(4, 0, ids_at=7),
             hint="compare every token id of every rep, byte for byte"),
]

_FLAWS = {   # a wrong gate, modelled, and what its verdict says
    "population sd": "the standard error uses the SAMPLE sd (ddof=1): with the population sd "
                     "(ddof=0) |t| comes out too large",
    "sd, not sem": "the standard error is the sd over sqrt(reps): with the sd alone |t| comes out "
                   "too small",
    "sqrt(reps - 1)": "the standard error divides the sample sd by sqrt(reps), not sqrt(reps - 1)",
    "one-sided": _TWO_SIDED,
    "one-sided, the other side": _TWO_SIDED,
    "unpaired": "pair the reps: the t of d = A' - A rep by rep, in which the drift both arms "
                "share cancels, not an unpaired (Welch or pooled) comparison of two means",
    "fixed 3": "judge |t| against `critical`, the t distribution's value for these reps, not a "
               "fixed 3",
    "a tie fails": "a |t| exactly at the threshold passes: the gate fails only when |t| > "
                   "critical, so pass on |t| <= critical (not <)",
    "nan at sem 0": "when every difference is 0 the sem is 0 and t = 0 (the statement's "
                    "convention), not the nan that 0/0 gives: handle that case yourself",
    "t = 0 at sem 0": "when every difference is the same nonzero value the sem is 0 and |t| = inf "
                      "(the statement's convention), not 0",
    "no outputs": "the gate checks outputs too: A and A' must decode the same bytes",
    "first rep only": _EVERY_REP,
    "last rep only": _EVERY_REP,
    "first id only": "compare every token id, byte for byte, not only the first",
    "median": "t is the MEAN of the differences over their standard error, not the median",
    "ids only": "compare the logits too, byte for byte",
    "logits only": "compare the token ids too, byte for byte",
    "tolerance": "compare the logits byte for byte: one ulp apart is a difference, which a "
                 "tolerance (np.allclose, isclose) calls the same",
}


def _same(x, y, flaw=None) -> bool:
    if flaw == "tolerance":
        return np.allclose(x, y)
    return np.asarray(x).tobytes() == np.asarray(y).tobytes()


def gate_model(fx: dict, flaw: str | None = None) -> bool:
    """The gate's verdict on a fixture; with `flaw`, the verdict of a gate with that mistake."""
    a, a2 = np.asarray(fx["a"], np.float64), np.asarray(fx["a2"], np.float64)
    n, critical = a.size, fx["critical"]
    pairs = list(zip(fx["oa"], fx["oa2"]))
    pairs = {"first rep only": pairs[:1], "last rep only": pairs[-1:],
             "no outputs": []}.get(flaw, pairs)
    for (ia, la), (ib, lb) in pairs:
        if flaw == "first id only":
            ia, ib = np.asarray(ia).reshape(-1)[:1], np.asarray(ib).reshape(-1)[:1]
        if (flaw != "logits only" and not _same(ia, ib)) or \
                (flaw != "ids only" and not _same(la, lb, flaw)):
            return False
    if flaw == "unpaired":
        mean = a2.mean() - a.mean()
        sem = math.sqrt(a.var(ddof=1) / n + a2.var(ddof=1) / n)
    else:
        d = a2 - a
        mean = float(np.median(d)) if flaw == "median" else d.mean()
        sem = {"population sd": d.std() / math.sqrt(n), "sd, not sem": d.std(ddof=1),
               "sqrt(reps - 1)": d.std(ddof=1) / math.sqrt(n - 1)}.get(
                   flaw, d.std(ddof=1) / math.sqrt(n))
    if sem == 0:
        t = {"nan at sem 0": math.nan, "t = 0 at sem 0": 0.0}.get(
            flaw, 0.0 if mean == 0 else math.copysign(math.inf, mean))
    else:
        t = mean / sem
    if flaw == "one-sided":
        return t <= critical
    if flaw == "one-sided, the other side":
        return t >= -critical
    if flaw == "a tie fails":
        return abs(t) < critical
    return abs(t) <= (3.0 if flaw == "fixed 3" else critical)


def _replay(values: list):
    """A run returning the given (ms, output) pairs in turn (the last one again, past the end),
    the arrays copies: a solution that changes what it was given changes no fixture."""
    it = iter(range(10 ** 6))

    def run():
        ms, (ids, logits) = values[min(next(it), len(values) - 1)]
        return ms, (np.array(ids, copy=True), np.array(logits, copy=True))
    return run


def _ask(fn, fx: dict) -> bool:
    """The solution's verdict on a fixture, with its calls held to the statement."""
    reps, order = len(fx["a"]), []

    def arm(name, times, outs):
        run = _replay(list(zip(times, outs)))

        def one():
            order.append(name)
            return run()
        return one
    try:
        got = watched(_REFS, explained(fn, f"aa_gate ({fx['label']})"),
                      arm("A", fx["a"], fx["oa"]), arm("A'", fx["a2"], fx["oa2"]), reps,
                      fx["critical"], what=f"aa_gate ({fx['label']})")
    except Fail as exc:
        _order_before_a_crash(order, reps, fx["label"], exc)
        raise
    _held_to_the_order(got, order, reps, fx["label"],
                       lambda k: not (_same(fx["oa"][k][0], fx["oa2"][k][0])
                                      and _same(fx["oa"][k][1], fx["oa2"][k][1])))
    return bool(got)


PRIME = "A'"


def _order_before_a_crash(order: list, reps: int, label: str, exc: Fail) -> None:
    """A gate that stopped on an exception after running its reps: when the reps it ran were
    not `reps` alternating rounds, that is its mistake (the exception only followed from it)."""
    if len(order) != 2 * reps:
        return
    problem = alternation_problem(order, ["A", "A'"], reps)
    if problem:
        raise Fail(f"{label}: {problem} (and your gate then stopped on an exception)") \
            from None


def _held_to_the_order(got, order, reps, label, outputs_differ_at) -> None:
    """The calls: `reps` alternating rounds -- or fewer, when the gate returned False at a round
    whose outputs already differed."""
    if got is None:
        raise Fail("aa_gate returned None: fill in the stub (# FILL ME IN)")
    if not order:
        raise Fail(f"{label}: no rep ran: run A and its copy A', {reps} interleaved reps each, "
                   f"and judge their paired difference and their outputs")
    done = min(order.count("A"), order.count("A'"))
    early = (not got and len(order) < 2 * reps and len(order) % 2 == 0 and done
             and any(outputs_differ_at(k) for k in range(done)))
    problem = alternation_problem(order, ["A", "A'"], len(order) // 2 if early else reps)
    if problem and not early and len(order) != 2 * reps:
        problem = (f"the arms ran {order.count('A')} and {order.count(PRIME)} reps, "
                   f"expected {reps} each")
    if problem:
        raise Fail(f"{label}: {problem}")


def _paired_t(a, a2) -> float:
    """The statement's t of d = A' - A (0 when every d is 0, +-inf when every d is the same)."""
    d = np.asarray(a2, np.float64) - np.asarray(a, np.float64)
    sem = d.std(ddof=1) / math.sqrt(d.size)
    mean = d.mean()
    return (0.0 if mean == 0 else math.copysign(math.inf, mean)) if sem == 0 else mean / sem


def _wrong_ts(a, a2) -> list[tuple[float, str]]:
    """(|t|, what is wrong) of each wrong way to compute the gate's t from these times."""
    a, a2 = np.asarray(a, np.float64), np.asarray(a2, np.float64)
    n, d = a.size, a2 - a
    sd1, sd0, mean = d.std(ddof=1), d.std(), d.mean()
    out = [(mean / (sd0 / math.sqrt(n)), _FLAWS["population sd"]),
           (mean / sd1, _FLAWS["sd, not sem"]),
           (mean / (sd1 / math.sqrt(n - 1)), _FLAWS["sqrt(reps - 1)"]),
           (float(np.median(d)) / (sd1 / math.sqrt(n)), _FLAWS["median"]),
           (d.sum() / (n - 1) / (sd1 / math.sqrt(n)),
            "the mean of the differences is their sum over reps, not over reps - 1"),
           (mean / (sd1 ** 2 / math.sqrt(n)),
            "the standard error is the sample sd (the square root of the variance) over "
            "sqrt(reps)"),
           ((a2.mean() - a.mean()) / math.sqrt(a.var(ddof=1) / n + a2.var(ddof=1) / n),
            _FLAWS["unpaired"])]
    ds = np.sort(a2) - np.sort(a)
    if ds.std(ddof=1) > 0:
        out.append((ds.mean() / (ds.std(ddof=1) / math.sqrt(n)),
                    "pair the reps as they ran (the r-th rep of A with the r-th of A'), not each "
                    "arm sorted"))
    return [(abs(t), why) for t, why in out if math.isfinite(t)]


def _threshold(fn, fx: dict):
    """The |t| at which the solution's verdict on `fx` flips as `critical` moves (bisected);
    "ignores" when it says the same at a tiny and at a huge critical; "inverted" when it passes
    at the tiny one and fails at the huge one."""
    def ask(c):
        return _ask(fn, {**fx, "critical": c})
    lo, hi = 1e-6, 1e6
    at_lo, at_hi = ask(lo), ask(hi)
    if at_lo == at_hi:
        return "ignores"
    if at_lo and not at_hi:
        return "inverted"
    for _ in range(60):
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if ask(mid) else (mid, hi)
    return math.sqrt(lo * hi)


def _diagnosis(fn, fx: dict) -> str:
    """What the solution's t is, found by moving `critical` on a fixture whose outputs agree
    and whose t is finite and nonzero; "" when that says nothing."""
    same = all(_same(x[0], y[0]) and _same(x[1], y[1]) for x, y in zip(fx["oa"], fx["oa2"]))
    t = _paired_t(fx["a"], fx["a2"])
    if not same or not math.isfinite(t) or t == 0:
        return ""
    mirror = {**fx, "a": fx["a2"], "a2": fx["a"], "oa": fx["oa2"], "oa2": fx["oa"]}
    found, other = _threshold(fn, fx), _threshold(fn, mirror)
    if (found == "ignores") != (other == "ignores"):
        return _TWO_SIDED + " (your verdict moves with `critical` on one side only)"
    if found == "ignores":
        return ("your verdict here does not change with `critical` (the same at 1e-6 and at "
                "1e6): judge |t| against the critical value you are given, not a threshold of "
                "your own (a fixed 3, a value computed in your code)")
    if found == "inverted":
        return ("your gate passes when |t| is over `critical` and fails when it is under: the "
                "wrong way round; pass only when |t| <= critical")
    if math.isclose(found, abs(t), rel_tol=1e-4):
        return ""
    for wrong, why in _wrong_ts(fx["a"], fx["a2"]):
        if math.isclose(found, wrong, rel_tol=1e-4):
            return f"{why} (your |t| here is {found:.4g}, the paired t {abs(t):.4g})"
    return (f"your gate's |t| here is {found:.4g}, the paired t of these times {abs(t):.4g}: t = "
            f"mean(d) / (sd(d, ddof=1) / sqrt(reps)), d = A' - A rep by rep")


def _synthetic_cases(fn):
    answers = [_ask(fn, fx) for fx in _FIXTURES]
    wrong = [i for i, fx in enumerate(_FIXTURES) if answers[i] != gate_model(fx)]
    if wrong:
        i = wrong[0]
        fx = _FIXTURES[i]

        def agree(flaw):
            return sum(gate_model(f, flaw) == answers[j] for j, f in enumerate(_FIXTURES))
        fits = [f for f in _FLAWS if gate_model(fx, f) == answers[i]]
        best = max(fits, key=agree, default=None)
        why = _diagnosis(fn, fx) or (_FLAWS[best] if best and agree(best) == len(_FIXTURES)
                                     else fx["hint"])
        want = gate_model(fx)
        raise Fail(f"{fx['label']}: you said {'pass' if answers[i] else 'fail'}, the gate says "
                   f"{'pass' if want else 'fail'}: {why}")
    for fx in _FIXTURES:
        yield fx["label"]


def cases(sol, backend):
    (fn,) = need(sol, ("aa_gate",))
    yield from _synthetic_cases(fn)
    critical = t_critical(0.01, REPS - 1)
    for label, arms, run in _setups(backend):
        for arm in arms:
            run(arm.use())                                   # warm-up, untimed
        calls, order = {"A": [], "A'": []}, []
        try:
            got = watched(_REFS, explained(fn, f"aa_gate ({label})"),
                          _recorded(arms[0], run, calls, order),
                          _recorded(arms[1], run, calls, order), REPS, critical,
                          what=f"aa_gate ({label})")
        except Fail as exc:
            _order_before_a_crash(order, REPS, label, exc)
            raise
        _held_to_the_order(got, order, REPS, label, lambda k: bool(outputs_differ(
            [calls["A"][k][1]], [calls["A'"][k][1]])))
        n = min(len(calls["A"]), len(calls["A'"]))
        ms = {k: [c[0] for c in v[:n]] for k, v in calls.items()}
        outs = {k: [c[1] for c in v[:n]] for k, v in calls.items()}
        if n < 2:      # returned False at the first round, its outputs differing: nothing to time
            yield label
            continue
        want = aa_verdict(ms["A"], ms["A'"], outs["A"], outs["A'"])
        if bool(got) != want.ok:
            why = (f"the gate checks outputs too: {want.reason}" if not want.outputs_identical
                   and got else want.reason or
                   f"|t| = {abs(want.t):.2f} is within the critical {critical:.3g}")
            raise Fail(f"{label}: you said {'pass' if got else 'fail'}, the gate says "
                       f"{'pass' if want.ok else 'fail'}: {why}")
        yield label


EXERCISE = Exercise(
    "aa_gate", 7, "the A/A gate in front of every A/B", "§5", STATEMENT, STUB, ("aa_gate",), cases,
    REFERENCE, {"times only": (TIMES_ONLY, "the gate checks outputs too"),
                "back to back": (BACK_TO_BACK, "not one arm's reps back to back"),
                "fixed 3": (FIXED_3, "does not change with `critical`"),
                "one-sided": (ONE_SIDED, "two-sided"),
                "population sd": (POPULATION_SD, "SAMPLE sd (ddof=1)"),
                "first rep only": (FIRST_REP_ONLY, "EVERY rep"),
                "tolerance": (TOLERANCE, "byte for byte"),
                "unpaired": (UNPAIRED, "pair the reps")},
    stub_says="no rep ran")
