"""Checklist step 7, run the A/A control: before believing a mismatch between A and B, compare A
against itself; when that mismatches too, the comparison -- not B -- is what is broken.

The student writes the verdict of a byte comparison, `ab_verdict(run_a, run_b)`. Each call of a
run builds a fresh engine (a separate run, as two processes would be), jumps to a long context
with `seek` (which advances the position without writing the skipped KV rows, as the lecture's
benchmark did) and decodes a few tokens; it returns (token ids, logits). The check gives three
fixtures: a zero-initialised cache with A eager and B graph (the same: "same"); an uninitialised
cache (the skipped rows hold whatever memory held: A against A already differs, "broken"); and a
zero-initialised cache with B a frozen-pointer bug ("different").
"""
from __future__ import annotations

import numpy as np

from lab.measure.stats import aa_verdict, outputs_differ
from lab.teach.exercise import Exercise, Fail
from .base import need, variant, watched
from .crash import explained
from .fixtures import PROMPT, engine

STATEMENT = """
A comparison that fails is either a real difference or a comparison with no discriminating
power. Run the configuration against itself first (A/A), then A against B. If A/A mismatches,
investigate input/state initialisation, nondeterminism, races and the harness -- not B.

Write ab_verdict(run_a, run_b) -> "same", "different" or "broken". Each call run_a() or run_b()
is one independent run (a fresh engine) returning (token_ids, logits), numpy arrays; compare both,
every element, byte for byte (a.tobytes() == b.tobytes(), or np.array_equal): no tolerance
(np.allclose, isclose), since one ulp is a difference -- a reordered sum moves the last bit, and
that is what a byte comparison exists to see. "broken": two runs of A differ, so the comparison
cannot tell A from B; else "same" or "different" as A and B compare.

The check: three engines (zero-initialised cache, graph vs eager; an uninitialised cache read
after a seek; a frozen KV-row pointer in B), then runs made from the first engine's output: B's
last logit 1.0 higher, B one ulp from A in it, B with one token id changed, two runs of A one
ulp apart. Calling lab.measure.stats.aa_verdict or outputs_differ fails the check.
"""

STUB = '''
import numpy as np


def ab_verdict(run_a, run_b):
    """"same", "different", or "broken" (A against itself already differs)."""
    # FILL ME IN
    return "same"
'''

REFERENCE = '''
import numpy as np


def run_bytes(run):
    """One independent run: its token ids and its logits, as bytes."""
    return tuple(np.asarray(x).tobytes() for x in run())


def ab_verdict(run_a, run_b):
    a1, a2 = run_bytes(run_a), run_bytes(run_a)      # A/A first: two independent runs of A
    if a1 != a2:
        return "broken"
    return "same" if run_bytes(run_b) == a1 else "different"
'''

# A against B at once, no control
_CONTROL = ("    a1, a2 = run_bytes(run_a), run_bytes(run_a)"
            "      # A/A first: two independent runs of A\n")
NO_CONTROL = variant(REFERENCE, _CONTROL + """    if a1 != a2:
        return "broken"
""", "    a1 = run_bytes(run_a)\n")

# the token ids compared, not the logits (two tokens: a frozen pointer changes the second
# step's logits, not yet a token id)
TOKENS_ONLY = variant(REFERENCE, "for x in run())", "for x in run()[:1])")
# the logits compared, not the token ids
LOGITS_ONLY = variant(REFERENCE, "for x in run())", "for x in run()[1:])")
# within a tolerance: one ulp apart is "the same"
TOLERANCE = '''
import numpy as np


def same(x, y):
    return all(np.allclose(a, b) for a, b in zip(x, y))


def ab_verdict(run_a, run_b):
    a1, a2 = run_a(), run_a()
    if not same(a1, a2):
        return "broken"
    return "same" if same(a1, run_b()) else "different"
'''

CONTEXT, TOKENS = 100, 2


def _run(backend, kv_init, graph, bugs=frozenset(), calls=None):
    def run():
        eng = engine(backend, kv_init=kv_init, graph=graph, bugs=bugs)
        eng.reset(eng.encode(PROMPT), 0)
        eng.seek(CONTEXT)
        eng.decode(TOKENS)
        out = (eng.tokens(CONTEXT + TOKENS + 1), eng.logits())
        if calls is not None:
            calls.append(out)
        return out
    return run


_FIXTURES = (("a zero-initialised cache, A eager, B graph", "zeros", frozenset()),
             ("an uninitialised cache read after a seek, A eager, B graph", "empty", frozenset()),
             ("a zero-initialised cache, B with a frozen KV-row pointer", "zeros",
              frozenset({"frozen_kv_row"})))
_REFS = (("lab.measure.stats.aa_verdict", aa_verdict),
         ("lab.measure.stats.outputs_differ", outputs_differ))


def _truth(backend, kv_init, bugs) -> str:
    """What this fixture is: two fresh runs of A, then A against B, byte-compared."""
    a1, a2 = _run(backend, kv_init, False)(), _run(backend, kv_init, False)()
    if outputs_differ([a1], [a2]):
        return "broken"
    return "different" if outputs_differ([a1], [_run(backend, kv_init, True, bugs)()]) else "same"


def _b_checked_first(fn, a_calls) -> bool:
    """Does the solution say "different" where two runs of A differ in a token id (which any
    comparison of the ids sees) and B differs from both? Then it judged B before the A/A."""
    a = tuple(np.array(x, copy=True) for x in a_calls[0])
    try:
        got = fn(_copies(a, _one_id(a)), _copies(_one_ulp(a, 1.0)))
    except Exception:          # noqa: BLE001 -- a probe only; the verdict stands without it
        return False
    return got == "different"


def _ids_only_differ_in_logits(calls) -> bool:
    """True when the first two runs recorded have the same token ids and different logits."""
    if len(calls) < 2:
        return False
    (ids1, logits1), (ids2, logits2) = calls[0], calls[1]
    return ids1.tobytes() == ids2.tobytes() and logits1.tobytes() != logits2.tobytes()


def _one_ulp(out, shift: float = 0.0):
    """The output with its last logit one ulp up (a difference below any tolerance), or, with
    `shift`, that much higher."""
    ids, logits = (np.array(x, copy=True) for x in out)
    last = logits.reshape(-1)[-1]
    logits.reshape(-1)[-1] = (last + logits.dtype.type(shift) if shift else
                              np.nextafter(last, np.float32(np.inf), dtype=logits.dtype))
    return ids, logits


def _one_id(out):
    """The output with its last token id changed and the same logits."""
    ids, logits = (np.array(x, copy=True) for x in out)
    ids.reshape(-1)[-1] = (ids.reshape(-1)[-1] + 1) % 64
    return ids, logits


def _copies(*outs, calls=None):
    """A run returning copies of `outs` in turn (the last again past the end)."""
    it = iter(range(10 ** 6))

    def run():
        out = tuple(np.array(x, copy=True) for x in outs[min(next(it), len(outs) - 1)])
        if calls is not None:
            calls.append(out)
        return out
    return run


def _made_up(backend):
    """(label, run_a, run_b, want, hint) built from one real run of A (zero-initialised)."""
    a = _run(backend, "zeros", False)()
    yield ("B with its last logit 1.0 higher", (a,), (_one_ulp(a, 1.0),), "different",
           "compare every element of the logits (and of the token ids), not only the first ones")
    yield ("B one ulp from A in its last logit (a reordered sum)", (a,), (_one_ulp(a),),
           "different", "one ulp apart is a difference, which a tolerance (np.allclose, isclose) "
                        "calls the same: compare byte for byte")
    yield ("B with its last token id changed, the logits the same", (a,), (_one_id(a),),
           "different", "compare the token ids too, every one of them, byte for byte")
    yield ("two runs of A one ulp apart in the last logit, B the same as the first",
           (a, _one_ulp(a)), (a,), "broken",
           "the A/A control compares byte for byte too: one ulp apart is a difference, which a "
           "tolerance (np.allclose, isclose) calls the same")


def cases(sol, backend):
    (fn,) = need(sol, ("ab_verdict",))
    yield from _real_cases(fn, backend)
    for label, outs_a, outs_b, want, hint in _made_up(backend):
        a_calls: list = []
        got = watched(_REFS, explained(fn, f"ab_verdict ({label})"),
                      _copies(*outs_a, calls=a_calls), _copies(*outs_b),
                      what=f"ab_verdict ({label})")
        if got == want:
            yield label
            continue
        if want == "broken" and len(a_calls) < 2:
            hint = (f"you ran A {len(a_calls)} time(s): the A/A control runs A twice, as two "
                    f"independent runs, and compares them")
        raise Fail(f"{label}: you said {got!r}, it is {want!r}: {hint}")


def _real_cases(fn, backend):
    for label, kv_init, bugs in _FIXTURES:
        want = _truth(backend, kv_init, bugs)
        a_calls: list = []
        run_a = _run(backend, kv_init, False, calls=a_calls)
        got = watched(_REFS, explained(fn, f"ab_verdict ({label})"), run_a,
                      _run(backend, kv_init, True, bugs),
                      what=f"ab_verdict ({label})")
        if got is None:
            raise Fail("ab_verdict returned None: fill in the stub (# FILL ME IN)")
        if got == want:
            yield label
            continue
        if want == "broken" and len(a_calls) < 2:
            why = (f"you ran A {len(a_calls)} time(s): the A/A control runs A twice, as two "
                   f"independent runs, and compares them" if a_calls else "you never ran A")
        elif want == "broken" and got == "different" and _b_checked_first(fn, a_calls):
            why = ("check A against itself FIRST: when its two runs differ the verdict is "
                   "'broken', whatever B does (you said 'different' even where two runs of A "
                   "differ in a token id)")
        elif want == "broken" and _ids_only_differ_in_logits(a_calls):
            # the seek's skipped rows moved the logits but no id: a verdict on ids alone says
            # A matches itself (whether they do depends on what memory held: name the mistake)
            why = ("compare the logits too, byte for byte: your two runs of A have the same "
                   "token ids and different logits")
        elif want == "broken":
            why = ("two runs of A differed and still you trusted the comparison: check A "
                   "against itself FIRST; when its two runs differ the verdict is 'broken', "
                   "whatever B does")
        elif got == "broken":
            why = ("the two runs of A match byte for byte here, and you called them different: "
                   "compare the token ids with the token ids and the logits with the logits "
                   "(each pair of arrays, .tobytes() or np.array_equal)")
        elif want == "same":
            why = ("A and B match byte for byte here: 'same' when B's token ids and logits "
                   "equal A's, 'different' when they do not (is your verdict the wrong way "
                   "round?)")
        else:
            why = ("compare the logits too, byte for byte: a frozen value shows in them before "
                   "it changes a token id")
        aa = ("differs here: the KV rows the seek skipped hold whatever memory held"
              if want == "broken" else "matches here")
        raise Fail(f"{label}: you said {got!r}, it is {want!r} (A against itself {aa}): {why}")


EXERCISE = Exercise(
    "aa_control", 7, "the A/A control before believing a mismatch", "§5", STATEMENT, STUB,
    ("ab_verdict",), cases, REFERENCE,
    {"no control": (NO_CONTROL, "you ran A 1 time(s)"),
     "token ids only": (TOKENS_ONLY, "compare the logits too"),
     "logits only": (LOGITS_ONLY, "compare the token ids too"),
     "tolerance": (TOLERANCE, "which a tolerance (np.allclose, isclose) calls the same")},
    stub_says="you never ran A")
