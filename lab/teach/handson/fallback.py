"""Checklist step 5, capture and make failure graceful: the fallback that ends a failed capture,
discards it, restores the host state lazy code changed, and lets the step be re-issued eagerly.

The student writes `capture(engine, plan)`, the engine's capture of one plan's step. The check
plugs it into a real engine (a DecodeEngine whose `capture` is the student's: the engine's graph
cache calls it on a plan-key miss, and on a failure re-issues the step eagerly and files the
reason in the ledger) and runs it on a clean step (captures must succeed and be replayed) and on
the two lazy-initialisation bugs: LAB_BUG_LAZY_TABLE (its failed upload is swallowed, so the
capture fails at end_capture, after the lazy code marked the table uploaded) and
LAB_BUG_LAZY_SCRATCH (the allocation fails at the call, with the capture still open).
"""
from __future__ import annotations

from lab.engine.runner import DecodeEngine
from lab.errors import CaptureError
from lab.ledger import CaptureFailure
from .base import Exercise, Fail, need, variant
from .fixtures import PROMPT, TOKENS, clean_tokens, engine, first_difference

SPEC = """
A failure to capture should cost performance, never correctness or availability: end the failed
capture, discard it, restore any host state changed while it was open, and re-issue eagerly.

Write capture(engine, plan) -> (graph, None), or (None, CaptureFailure(reason, shown_at,
launch_index)) when the capture fails. Issue the step into the capture with
  for item in engine.pieces.items(plan): issue(engine, item)      (lab.teach.handson.issue)
An illegal operation raises lab.errors.CaptureError (its .reason names it) at the call, or, when
the lazy code swallows it, at backend.end_capture(), which then reports the capture invalidated.
engine.pieces.lazy is the host state lazy code keeps ("the table is uploaded", "the scratch holds
N splits"): set while the capture was open, it describes work that never ran. The engine does
the rest: it re-issues the step eagerly and files your reason in its ledger ("fallback").
A CaptureFailure says what failed and where it showed, as the engine's own capture reports it:
  reason        the CaptureError's .reason (it names the offending operation)
  shown_at      where the error showed: "end_capture" when backend.end_capture() raised it;
                else the item being issued when it was raised: "launch N (its kernel's name)"
                for a lab.backend.Launch, "host work before launch N (item.what)" for a
                lab.engine.step.HostWork
  launch_index  N: how many launches had been issued into the capture before it showed (count
                the Launch items issued); None when it showed at end_capture

The check: a clean engine captures and replays; engines with a lazy table and with a lazy
scratch decode the clean engine's tokens with no error, no capture left open, no graph kept for
a failed plan, a ledger reason that names the offending operation, and the shown_at and
launch_index the engine's own capture reports for each failed plan.
"""

STUB = '''
from lab.errors import CaptureError
from lab.ledger import CaptureFailure
from lab.teach.handson import issue


def capture(engine, plan):
    """The step for `plan` captured: (graph, None), or (None, CaptureFailure(...))."""
    be = engine.backend
    be.begin_capture()
    for item in engine.pieces.items(plan):
        issue(engine, item)
    # FILL ME IN: a failed capture (CaptureError) must not escape
    return be.end_capture(), None
'''

REFERENCE = '''
from lab.backend import Launch
from lab.errors import CaptureError
from lab.ledger import CaptureFailure
from lab.teach.handson import issue


def capture(engine, plan):
    be, lazy = engine.backend, engine.pieces.lazy
    saved = dict(lazy)
    launches, shown = 0, "begin_capture"
    be.begin_capture()
    try:
        for item in engine.pieces.items(plan):
            shown = (f"launch {launches} ({item.name})" if isinstance(item, Launch) else
                     f"host work before launch {launches} ({item.what})")
            issue(engine, item)
            launches += isinstance(item, Launch)
        shown, launches = "end_capture", None
        return be.end_capture(), None
    except CaptureError as exc:
        reason = exc.reason
        if be.is_capturing():                 # failed at the call: end it (it is invalidated)
            try:
                be.end_capture()
            except CaptureError as invalidated:
                reason = invalidated.reason
        lazy.clear()
        lazy.update(saved)                    # the lazy work recorded inside never ran
        return None, CaptureFailure(reason, shown, launches)
'''

# caught, but the capture is left open: the eager re-issue runs into it
LEFT_OPEN = variant(REFERENCE, """        if be.is_capturing():                 # failed at the call: end it (it is invalidated)
            try:
                be.end_capture()
            except CaptureError as invalidated:
                reason = invalidated.reason
""")
# where the failure showed never said: a fixed text, no launch index
WHERE_UNSAID = variant(REFERENCE, "return None, CaptureFailure(reason, shown, launches)",
                       'return None, CaptureFailure(reason, "during the capture", None)')
# ended and discarded, but the lazy host state is kept: "uploaded" though it never ran
NO_RESTORE = variant(REFERENCE, """        lazy.clear()
        lazy.update(saved)                    # the lazy work recorded inside never ran
""")

_OFFENCE = {"lazy_table": "host-to-device copy", "lazy_scratch": "allocation"}


def _engine_class(fn):
    def capture(self, plan, instantiate=True):
        out = fn(self, plan)
        if not (isinstance(out, tuple) and len(out) == 2):
            raise Fail(f"capture returned {type(out).__name__}: return (graph, None) or "
                       f"(None, CaptureFailure(...))")
        graph, failure = out
        if graph is None and not isinstance(failure, CaptureFailure):
            raise Fail(f"capture returned (None, {failure!r}): a failure is a CaptureFailure")
        if graph is None:
            self.__dict__.setdefault("student_failures", []).append((plan.key, failure))
        if graph is not None and instantiate:
            self._graphs[self.graph_key(plan)] = graph     # as DecodeEngine.capture files it
        return graph, failure
    return type("StudentCaptureEngine", (DecodeEngine,), {"capture": capture})


def _generate(eng, what):
    try:
        return eng.generate(PROMPT, TOKENS)
    except Fail:
        raise
    except Exception as exc:
        if eng.backend.is_capturing():
            raise Fail(f"{what}: the failed capture was left open, and the eager re-issue ran "
                       f"into it ({type(exc).__name__}: {exc}); end the capture "
                       f"(backend.end_capture()) before returning the failure") from None
        if isinstance(exc, CaptureError):
            raise Fail(f"{what}: a failed capture raised CaptureError out of the step "
                       f"({exc.reason}): catch it, end the capture, and return (None, "
                       f"CaptureFailure(...)) so the engine re-issues the step eagerly") from None
        raise Fail(f"{what}: the step raised {type(exc).__name__}: {exc}") from None


def _where_it_showed(backend, bug, got: list) -> None:
    """Each failed plan's shown_at and launch_index held to what the engine's own capture
    reports for the same plan."""
    lab = engine(backend, bugs={bug})
    lab.generate(PROMPT, TOKENS)
    for plan_key, failure in got:
        ref = next((f for k, f in lab.capture_failures.items()
                    if tuple(k[:len(plan_key)]) == tuple(plan_key)), None)
        if ref is None:
            continue
        at_end = ref.shown_at == "end_capture"
        if failure.launch_index != ref.launch_index or (
                at_end != (str(failure.shown_at) == "end_capture")) or (
                not at_end and f"launch {ref.launch_index}" not in str(failure.shown_at)):
            raise Fail(f"LAB_BUG_{bug.upper()}: your CaptureFailure says shown_at="
                       f"{failure.shown_at!r}, launch_index={failure.launch_index!r}; the "
                       f"error showed at {ref.shown_at!r}: shown_at is 'end_capture' or the item "
                       f"being issued ('launch N (kernel)', 'host work before launch N (...)'), "
                       f"launch_index the launches issued before it (None at end_capture)")


def cases(sol, backend):
    (fn,) = need(sol, ("capture",))
    cls = _engine_class(fn)
    clean = engine(backend, engine_class=cls)
    gen = _generate(clean, "a clean engine")
    led = clean.ledger_summary()
    if led.get("fallback") or not led.get("replay"):
        raise Fail(f"a clean engine's captures must succeed and be replayed; its ledger: {led}")
    if first_difference(gen.tokens, clean_tokens(backend)) is not None:
        raise Fail("a clean engine's replays decode other tokens than its eager steps")
    yield "a clean engine captures and replays"
    for bug in ("lazy_table", "lazy_scratch"):
        eng = engine(backend, engine_class=cls, bugs={bug})
        gen = _generate(eng, f"LAB_BUG_{bug.upper()}")
        if eng.backend.is_capturing():
            raise Fail(f"LAB_BUG_{bug.upper()}: a capture is still open after the generation")
        fell = [e for e in eng.ledger if e.outcome == "fallback"]
        if not fell:
            raise Fail(f"LAB_BUG_{bug.upper()}: no fallback in the ledger ({eng.ledger_summary()})")
        if _OFFENCE[bug] not in fell[0].reason:
            raise Fail(f"LAB_BUG_{bug.upper()}: the ledger's reason {fell[0].reason!r} does not "
                       f"name the offending operation (a {_OFFENCE[bug]}): report the "
                       f"CaptureError's reason")
        kept = [e.plan_key for e in fell if e.plan_key in eng.graphs]
        if kept:
            raise Fail(f"LAB_BUG_{bug.upper()}: a graph is kept for the failed plan {kept[0]}")
        _where_it_showed(backend, bug, eng.__dict__.get("student_failures", []))
        i = first_difference(gen.tokens, clean_tokens(backend))
        if i is not None:
            raise Fail(f"LAB_BUG_{bug.upper()}: after the fallback the tokens differ from the "
                       f"clean engine's from position {i}: the lazy host state set inside the "
                       f"failed capture (engine.pieces.lazy) was kept, so the eager re-issue "
                       f"skipped work that never ran; restore it")
        yield f"LAB_BUG_{bug.upper()}: fallback, right tokens"


EXERCISE = Exercise(
    "fallback", 5, "end a failed capture, discard it, restore, re-issue eagerly", "§3", SPEC,
    STUB, ("capture",), cases, REFERENCE,
    {"capture left open": (LEFT_OPEN, "left open"),
     "lazy state kept": (NO_RESTORE, "restore it"),
     "where it showed unsaid": (WHERE_UNSAID, "launch_index the launches issued before it")},
    stub_says='raised CaptureError out of the step')
