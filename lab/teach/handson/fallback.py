"""Checklist step 5, capture and make failure graceful: the fallback that ends a failed capture,
discards it, restores the host state lazy code changed, and lets the step be re-issued eagerly.

The student writes `capture(engine, plan)`, the engine's capture of one plan's step. The check
plugs it into a real engine (a DecodeEngine whose `capture` is the student's: the engine's graph
cache calls it on a plan-key miss, and on a failure re-issues the step eagerly and files the
reason in the ledger) and runs it on a clean step (captures must succeed and be replayed) and on
the two lazy-initialisation bugs: LAB_BUG_LAZY_TABLE (its failed upload is swallowed, so the
capture fails at end_capture, after the lazy code marked the table uploaded),
LAB_BUG_LAZY_SCRATCH (the allocation fails at the call, with the capture still open),
LAB_BUG_RAW_ARRAY (it fails at a launch) and the two lazy bugs met in one capture after a seek
(host work issued before the item that fails: launch_index counts launches, not items); then a
step whose host work raises a RuntimeError inside the capture, which must go through.
"""
from __future__ import annotations

import functools

from lab.engine.runner import DecodeEngine
from lab.engine.step import HostWork, Step
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
Only a CaptureError is a failed capture: any other exception raised while issuing (a bug in the
step, not in the capture) must go through, not be reported as a fallback.
A CaptureFailure says what failed and where it showed, as the engine's own capture reports it:
  reason        the CaptureError's .reason (it names the offending operation)
  shown_at      where the error showed: "end_capture" when backend.end_capture() raised it;
                else the item being issued when it was raised: "launch N (its kernel's name)"
                for a lab.backend.Launch, "host work before launch N (item.what)" for a
                lab.engine.step.HostWork
  launch_index  N: how many launches had been issued into the capture before it showed (count
                the Launch items issued); None when it showed at end_capture

The check: a clean engine captures and replays; engines with a lazy table, a lazy scratch, a
raw array argument (it fails at a launch), and a lazy table and scratch met in one capture after
a seek (a host job before the one that fails) decode the clean engine's tokens with no error, no
capture left open, no graph kept for a failed plan, a ledger reason that names the offending
operation, and the shown_at and launch_index the engine's own capture reports for each failed
plan; then a step whose host work raises a RuntimeError inside a capture: that error goes
through.
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

_OFFENCE = {"lazy_table": "host-to-device copy", "lazy_scratch": "allocation",
            "raw_array": "synchronisation"}
SEEK, SEEK_TOKENS = 40, 30
# (label, bugs, seek or None): each decoded in graph mode; every capture of a plan whose step
# meets the bug fails. The last: the table's upload (swallowed, a host job) comes before the
# scratch's allocation (raised at the call) in one capture.
_BUGGY = (("LAB_BUG_LAZY_TABLE", ("lazy_table",), None),
          ("LAB_BUG_LAZY_SCRATCH", ("lazy_scratch",), None),
          ("LAB_BUG_RAW_ARRAY", ("raw_array",), None),
          (f"LAB_BUG_LAZY_TABLE and LAB_BUG_LAZY_SCRATCH from position {SEEK} after a seek",
           ("lazy_table", "lazy_scratch"), SEEK))


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


def _decode(eng, seek=None) -> tuple:
    """The engine's token ids: a generation from the prompt, or after a seek to `seek`."""
    if seek is None:
        return tuple(int(t) for t in eng.generate(PROMPT, TOKENS).tokens)
    eng.reset(eng.encode(PROMPT), seek + SEEK_TOKENS)
    eng.seek(seek)
    eng.decode(SEEK_TOKENS)
    return tuple(int(t) for t in eng.tokens(seek + SEEK_TOKENS + 1))


class BrokenInCapture(Step):
    """A step whose host work, before its first launch, raises a RuntimeError while a capture is
    open (a bug in the step, not an illegal operation): no capture may swallow it."""
    rebuilt_each_step = True

    def items(self, plan):
        be = self.dev.backend

        def job():
            if be.is_capturing():
                raise RuntimeError("a bug in the step's host work (not a capture failure)")
        yield HostWork("check the step's state", job)
        yield from super().items(plan)


def _generate(eng, what, seek=None):
    try:
        return _decode(eng, seek)
    except Fail:
        raise
    except Exception as exc:
        if eng.backend.is_capturing():
            raise Fail(f"{what}: the failed capture was left open, and the eager re-issue ran "
                       f"into it ({type(exc).__name__}: {exc}); end the capture "
                       f"(backend.end_capture()) before returning the failure") from None
        lazy = getattr(getattr(eng, "pieces", None), "lazy", None)
        if isinstance(exc, KeyError) and isinstance(lazy, dict) and exc.args and \
                exc.args[0] not in lazy:
            raise Fail(f"{what}: engine.pieces.lazy lost its entry {exc.args[0]!r} (the step "
                       f"raised KeyError): restore it to what it held before the capture, from a "
                       f"copy taken before begin_capture (dict(lazy), not the dict itself)") \
                from None
        if isinstance(exc, CaptureError):
            raise Fail(f"{what}: a failed capture raised CaptureError out of the step "
                       f"({exc.reason}): catch it, end the capture, and return (None, "
                       f"CaptureFailure(...)) so the engine re-issues the step eagerly") from None
        raise Fail(f"{what}: the step raised {type(exc).__name__}: {exc}") from None


def _where_it_showed(backend, label, bugs, seek, got: list) -> None:
    """Each failed plan's shown_at and launch_index held to what the engine's own capture
    reports for the same plan."""
    lab = engine(backend, bugs=set(bugs))
    _decode(lab, seek)
    for plan_key, failure in got:
        ref = next((f for k, f in lab.capture_failures.items()
                    if tuple(k[:len(plan_key)]) == tuple(plan_key)), None)
        if ref is None:
            continue
        at_end = ref.shown_at == "end_capture"
        shown = str(failure.shown_at)
        host = ref.shown_at.startswith("host work")
        if failure.launch_index != ref.launch_index or (
                at_end != (shown == "end_capture")) or (
                not at_end and f"launch {ref.launch_index}" not in shown) or (
                not at_end and host != shown.startswith("host work")):
            if at_end:
                why = ("it was raised by backend.end_capture() (the lazy code swallowed it at the "
                       "call): shown_at is 'end_capture' and launch_index None there")
            elif (not at_end and isinstance(failure.launch_index, int)
                    and failure.launch_index == ref.launch_index + 1 and not host):
                why = (f"launch_index counts the launches issued BEFORE the failing one: the "
                       f"launch that raised is not one of them, so it is {ref.launch_index}")
            elif not at_end and isinstance(failure.launch_index, int) and \
                    failure.launch_index > ref.launch_index:
                why = (f"launch_index counts the Launch items issued, not every item: host work "
                       f"before the failure is not a launch, so it is {ref.launch_index}")
            elif not at_end and host != shown.startswith("host work"):
                why = (f"the item being issued was {'a HostWork' if host else 'a Launch'}: say "
                       f"{ref.shown_at!r}")
            else:
                why = ("shown_at is 'end_capture' or the item being issued ('launch N (kernel)', "
                       "'host work before launch N (...)'), launch_index the launches issued "
                       "before it (None at end_capture)")
            raise Fail(f"{label}: your CaptureFailure says shown_at={shown[:80]!r}, "
                       f"launch_index={failure.launch_index!r}; the error showed at "
                       f"{ref.shown_at!r}, launch_index={ref.launch_index!r}: {why}")


@functools.lru_cache(maxsize=4)
def _clean(backend, seek) -> tuple:
    return (tuple(clean_tokens(backend)) if seek is None else
            _decode(engine(backend, graph=False), seek))


def cases(sol, backend):
    (fn,) = need(sol, ("capture",))
    cls = _engine_class(fn)
    clean = engine(backend, engine_class=cls)
    gen = _generate(clean, "a clean engine")
    led = clean.ledger_summary()
    if led.get("fallback") or not led.get("replay"):
        raise Fail(f"a clean engine's captures must succeed and be replayed; its ledger: {led}")
    if first_difference(gen, clean_tokens(backend)) is not None:
        raise Fail("a clean engine's replays decode other tokens than its eager steps")
    yield "a clean engine captures and replays"
    for label, bugs, seek in _BUGGY:
        eng = engine(backend, engine_class=cls, bugs=set(bugs))
        tokens = _generate(eng, label, seek)
        if eng.backend.is_capturing():
            raise Fail(f"{label}: a capture is still open after the generation")
        fell = [e for e in eng.ledger if e.outcome == "fallback"]
        if not fell:
            raise Fail(f"{label}: no fallback in the ledger ({eng.ledger_summary()})")
        offences = [_OFFENCE[b] for b in bugs]
        if not any(o in fell[0].reason for o in offences):
            raise Fail(f"{label}: the ledger's reason {fell[0].reason!r} does not name the "
                       f"offending operation (a {' or a '.join(offences)}): report the "
                       f"CaptureError's reason")
        kept = [e.plan_key for e in fell if e.plan_key in eng.graphs]
        if kept:
            raise Fail(f"{label}: a graph is kept for the failed plan {kept[0]}")
        _where_it_showed(backend, label, bugs, seek, eng.__dict__.get("student_failures", []))
        i = first_difference(tokens, _clean(backend, seek))
        if i is not None:
            raise Fail(f"{label}: after the fallback the tokens differ from the clean engine's "
                       f"from position {i}: the lazy host state set inside the failed capture "
                       f"(engine.pieces.lazy) was kept, so the eager re-issue skipped work that "
                       f"never ran; restore it")
        yield f"{label}: fallback, right tokens"
    eng = engine(backend, engine_class=cls, step=BrokenInCapture)
    try:
        eng.generate(PROMPT, 2)
    except RuntimeError as exc:
        if "a bug in the step" not in str(exc):
            raise
    else:
        fell = [e for e in eng.ledger if e.outcome == "fallback"]
        raise Fail(f"a step whose host work raised a RuntimeError inside the capture (a bug in "
                   f"the step, not a capture failure) "
                   f"{'was reported as a failed capture' if fell else 'did not stop the step'}: "
                   f"catch only lab.errors.CaptureError, and let any other error through")
    yield "an error that is not a CaptureError goes through"

EXERCISE = Exercise(
    "fallback", 5, "end a failed capture, discard it, restore, re-issue eagerly", "§3", SPEC,
    STUB, ("capture",), cases, REFERENCE,
    {"capture left open": (LEFT_OPEN, "left open"),
     "lazy state kept": (NO_RESTORE, "restore it"),
     "where it showed unsaid": (WHERE_UNSAID, "raised by backend.end_capture()")},
    stub_says='raised CaptureError out of the step')
