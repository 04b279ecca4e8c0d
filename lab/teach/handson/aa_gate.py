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
from lab.measure.stats import aa_verdict, mean_sem, paired_t, t_critical
from .base import Exercise, Fail, need, variant, watched
from .fixtures import PROMPT, cfg, small_model

SPEC = """
Before an A/B, run A against a second copy of A in the same harness. If A' - A differs beyond its
noise, or their outputs differ, the harness cannot tell A from B: re-run, then look -- never read
the A/B.

Write aa_gate(run_a, run_a2, reps, critical) -> bool: True when an A/B may be believed. Each call
of run_a() or run_a2() runs one rep and returns (ms_per_token, (token_ids, logits)). Run `reps`
rounds, the order reversed every other round (A A', A' A, ...). Fail the gate (False) when the
paired t of the differences d = ms(A') - ms(A) has |t| > critical (mean of d over its standard
error: sample sd, ddof=1, over sqrt(reps); all d equal and nonzero is |t| = inf, all zero t = 0),
or when any rep's token ids or logits differ byte for byte between A and A'. `critical` is the
|t| that identical arms exceed 1% of the time at these reps.

The check: a true copy, a copy reading an uninitialised cache after a seek, and a "copy" in
another launch configuration, against lab.measure.stats.aa_verdict (calling lab.measure.stats fails
the check).
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


def _fixed(times: list[float]):
    """A run that returns the given times in turn, and the same outputs every time."""
    out = (np.arange(4, dtype=np.int32), np.linspace(-1, 1, 8, dtype=np.float32))
    it = iter(times)
    return lambda: (next(it), out)


def _synthetic(reps: int, t: float) -> tuple[list[float], list[float]]:
    """Times of A and A' (ms/token) whose paired differences have exactly this t at `reps`."""
    e = np.array([(-1.0) ** k for k in range(reps)]) * 0.01
    sem = e.std(ddof=1) / math.sqrt(reps)
    a = [0.07] * reps
    return a, list(0.07 + t * sem + e)


def _critical_cases(fn):
    """Two A/As with outputs identical and times chosen so that only the critical value for the
    reps at hand decides: |t| = 4.5 at 4 reps (critical 5.84: pass) and 2.98 at 16 reps
    (critical 2.95: fail). A fixed |t| > 3 gets both wrong."""
    for reps, t in ((4, 4.5), (16, 2.98)):
        critical = t_critical(0.01, reps - 1)
        a, a2 = _synthetic(reps, t)
        label = f"{reps} reps whose |t| is {t} (the critical value at {reps} reps: {critical:.3g})"
        got = watched(_REFS, fn, _fixed(a), _fixed(a2), reps, critical, what=f"aa_gate ({label})")
        want = t <= critical
        if got is None:
            raise Fail("aa_gate returned None: fill in the stub (# FILL ME IN)")
        if bool(got) != want:
            raise Fail(f"{label}: you said {'pass' if got else 'fail'}, the gate says "
                       f"{'pass' if want else 'fail'}: judge |t| against `critical`, the t "
                       f"distribution's value for these reps, not a fixed 3")
        yield label


def cases(sol, backend):
    (fn,) = need(sol, ("aa_gate",))
    critical = t_critical(0.01, REPS - 1)
    for label, arms, run in _setups(backend):
        for arm in arms:
            run(arm.use())                                   # warm-up, untimed
        calls, order = {"A": [], "A'": []}, []
        got = watched(_REFS, fn, _recorded(arms[0], run, calls, order),
                      _recorded(arms[1], run, calls, order), REPS, critical,
                      what=f"aa_gate ({label})")
        if got is None:
            raise Fail("aa_gate returned None: fill in the stub (# FILL ME IN)")
        if not order:
            raise Fail(f"{label}: no rep ran: run A and its copy A', {REPS} interleaved reps "
                       f"each, and judge their paired difference and their outputs")
        if any(len(v) != REPS for v in calls.values()):
            raise Fail(f"{label}: the arms ran {({k: len(v) for k, v in calls.items()})} reps, "
                       f"expected {REPS} each")
        pairs = [tuple(order[i:i + 2]) for i in range(0, len(order), 2)]
        if any(set(p) != {"A", "A'"} or (k and p == pairs[k - 1]) for k, p in enumerate(pairs)):
            raise Fail(f"{label}: the reps ran in the order {' '.join(order)}: interleave A and "
                       f"A' as the A/B will run, the order reversed every other rep (A A', A' A, "
                       f"...), not one arm's reps back to back")
        ms = {k: [c[0] for c in v] for k, v in calls.items()}
        outs = {k: [c[1] for c in v] for k, v in calls.items()}
        want = aa_verdict(ms["A"], ms["A'"], outs["A"], outs["A'"])
        if bool(got) != want.ok:
            why = (f"the gate checks outputs too: {want.reason}" if not want.outputs_identical
                   and got else want.reason or
                   f"|t| = {abs(want.t):.2f} is within the critical {critical:.3g}")
            if want.outputs_identical and min(3, critical) < abs(want.t) < max(3, critical):
                why += (": judge |t| against `critical`, the t distribution's value for these "
                        "reps, not a fixed 3")
            raise Fail(f"{label}: you said {'pass' if got else 'fail'}, the gate says "
                       f"{'pass' if want.ok else 'fail'}: {why}")
        yield label
    yield from _critical_cases(fn)


EXERCISE = Exercise(
    "aa_gate", 7, "the A/A gate in front of every A/B", "§5", SPEC, STUB, ("aa_gate",), cases,
    REFERENCE, {"times only": (TIMES_ONLY, "the gate checks outputs too"),
                "back to back": (BACK_TO_BACK, "not one arm's reps back to back"),
                "fixed 3": (FIXED_3, "not a fixed 3")},
    stub_says="no rep ran")
