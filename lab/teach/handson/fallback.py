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

import numpy as np

from lab.engine.runner import DecodeEngine
from lab.backend import Launch
from lab.engine.step import HostWork, Step
from lab.errors import CaptureError
from lab.ledger import CaptureFailure
from lab.teach.exercise import Exercise, Fail
from .base import need, variant
from .crash import explained
from .fixtures import PROMPT, TOKENS, clean_tokens, engine, first_difference

STATEMENT = """
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
  reason        the CaptureError's .reason (it names the offending operation). A capture
                that failed at a call is ended with backend.end_capture(), which raises again
                with the reason of the capture's FIRST offence (an earlier one the lazy code
                swallowed comes first): report that one
  shown_at      where the error showed: "end_capture" when backend.end_capture() raised it;
                else the item being issued when it was raised: "launch N (its kernel's name)"
                for a lab.backend.Launch, "host work before launch N (item.what)" for a
                lab.engine.step.HostWork; "begin_capture" (or None) when it was raised before
                the first item was issued (by the step's own code, as it builds its items)
  launch_index  N: how many launches had been issued into the capture before it showed (count
                the Launch items issued); None when it showed at end_capture

The check: a clean engine captures and replays; engines with a lazy table, a lazy scratch, a
raw array argument (it fails at a launch), a lazy table and scratch met in one capture after
a seek (a host job before the one that fails), and a step that uploads its tables lazily as it
builds its items (before its first item; the lazy flag a new key) decode the clean engine's
tokens with no error, no capture left open, no graph kept for a failed plan, a ledger reason
that names the offending operation, and the shown_at and launch_index the engine's own capture
reports for each failed plan; then a step whose host work raises a RuntimeError inside a
capture: that error goes through.
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
            "raw_array": "synchronisation", "tables_on_build": "host-to-device copy"}
SEEK, SEEK_TOKENS = 40, 30
# (label, bugs, seek or None): each decoded in graph mode; every capture of a plan whose step
# meets the bug fails. The last: the table's upload (swallowed, a host job) comes before the
# scratch's allocation (raised at the call) in one capture.
_BUGGY = (("LAB_BUG_LAZY_TABLE", ("lazy_table",), None),
          ("LAB_BUG_LAZY_SCRATCH", ("lazy_scratch",), None),
          ("LAB_BUG_RAW_ARRAY", ("raw_array",), None),
          (f"LAB_BUG_LAZY_TABLE and LAB_BUG_LAZY_SCRATCH from position {SEEK} after a seek",
           ("lazy_table", "lazy_scratch"), SEEK),
          ("a step that uploads its RoPE tables as it builds its items (before the first)",
           ("tables_on_build",), None))


def _engine_class(fn):
    solution = explained(fn, "capture")

    def capture(self, plan, instantiate=True):
        pieces, be = self.pieces, self.backend
        seen: list = []
        began = self.__dict__.setdefault("student_began", [0])
        items, begin = pieces.items, be.begin_capture

        def recorded(p):
            for item in items(p):
                seen.append(item)
                yield item

        def counted(*args, **kw):
            began[0] += 1
            return begin(*args, **kw)
        pieces.items, be.begin_capture = recorded, counted
        try:
            out = solution(self, plan)
        finally:
            del pieces.items, be.begin_capture
        if not (isinstance(out, tuple) and len(out) == 2):
            raise Fail(f"capture returned {type(out).__name__}: return (graph, None) or "
                       f"(None, CaptureFailure(...))")
        graph, failure = out
        if graph is None and not isinstance(failure, CaptureFailure):
            raise Fail(f"capture returned (None, {failure!r}): a failure is a CaptureFailure")
        if graph is None:
            self.__dict__.setdefault("student_failures", []).append((plan.key, failure, seen))
        elif not getattr(graph, "nodes", True):
            self.__dict__["student_empty"] = True
        if graph is not None and instantiate:
            self.graph_cache.put(self.graph_key(plan), graph)     # as DecodeEngine.capture files it
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


class TablesOnBuild(Step):
    """A step that uploads its RoPE tables on first use as it BUILDS its items, before yielding
    the first (lazy code in the step's own body), its flag a key it adds to engine.pieces.lazy:
    inside a capture the upload fails before any item is issued ("begin_capture"), and a
    restore that keeps keys added inside the capture keeps the flag."""
    tables_at_start_up = False
    rebuilt_each_step = True

    def items(self, plan):
        if not self.lazy.get("tables_uploaded"):
            self.lazy["tables_uploaded"] = True          # marked first, as such code usually is
            be, b, (cos, sin) = self.dev.backend, self.dev.buf, self.engine.devices.rope_host
            be.upload(b.cos, cos)
            be.upload(b.sin, sin)
        yield from super().items(plan)


def _engine_for(backend, bugs, **kw):
    """An engine with the deliberate bugs `bugs` (or the step above for "tables_on_build")."""
    if "tables_on_build" in bugs:
        eng = engine(backend, step=TablesOnBuild, **kw)
        # the engine's warm-up builds the step's items to find its kernels, which ran the lazy
        # upload (its flag restored after): the tables go back to never uploaded
        be, b = eng.backend, eng.pieces.dev.buf
        for table in (b.cos, b.sin):
            be.upload(table, np.zeros(table.shape, table.dtype))
        return eng
    return engine(backend, bugs=set(bugs), **kw)


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


_SIGNATURE = "CaptureFailure(reason, shown_at, launch_index), in that order"


def _counts(seen: list, ref) -> tuple[int, int]:
    """(launches, host jobs) issued before the item that failed, from the items the solution
    took from engine.pieces.items (the failing one last) and the engine's own report."""
    if ref.shown_at in ("begin_capture", "end_capture"):
        return ref.launch_index or 0, 0
    before = seen[:-1]
    return (sum(isinstance(x, Launch) for x in before),
            sum(isinstance(x, HostWork) for x in before))


# a launch_index counted wrong: (what it is, its value from (launches, host jobs) before the
# failing item, the verdict's words)
_INDEX_MODELS = (
    ("stays 0", lambda n, h: 0,
     "your launch_index did not move from 0: count the launches as you issue them (+1 for each "
     "Launch item issued)"),
    ("sign", lambda n, h: -n,
     "your launch_index counts down (its sign is flipped): add 1 for each Launch issued"),
    ("every item", lambda n, h: n + h,
     "launch_index counts the Launch items issued, not every item: host work before the failure "
     "is not a launch"),
    ("the failing launch", lambda n, h: n + 1,
     "launch_index counts the launches issued BEFORE the failing item, from 0: yours is one more "
     "(the launch that raised, or a count started at 1, is not one of them)"),
    ("one fewer", lambda n, h: n - 1,
     "launch_index counts the launches issued before the failing item, from 0: yours is one "
     "fewer"),
)


def _index_hint(history: list) -> str | None:
    """The model of a wrong launch_index that every failure seen so far fits, or None."""
    for _, model, why in _INDEX_MODELS:
        if all(got == model(n, h) for got, n, h in history) and \
                any(got != n for got, n, _ in history):
            return why
    return None


def _where_it_showed(backend, label, bugs, seek, got: list, history: list) -> None:
    """Each failed plan's reason, shown_at and launch_index held to what the engine's own
    capture reports for the same plan; `history`: (launch_index, launches before, host jobs
    before) of every failure at an item so far, for naming a count that is wrong."""
    lab = _engine_for(backend, bugs)
    _decode(lab, seek)
    for plan_key, failure, seen in got:
        ref = next((f for k, f in lab.capture_failures.items()
                    if tuple(k[:len(plan_key)]) == tuple(plan_key)), None)
        if ref is None:
            continue
        at_end = ref.shown_at == "end_capture"
        shown = failure.shown_at
        says = (f"{label}: your CaptureFailure says shown_at={str(shown)[:80]!r}, "
                f"launch_index={failure.launch_index!r}; the error showed at "
                f"{ref.shown_at!r}, launch_index={ref.launch_index!r}")
        if (not isinstance(shown, str) and isinstance(failure.launch_index, str)) or (
                isinstance(failure.reason, str) and failure.reason == ref.shown_at
                and ref.reason in str(shown)):
            raise Fail(f"{says}: the values are in each other's places (swapped): {_SIGNATURE}")
        n, h = _counts(seen, ref)
        if not at_end and isinstance(failure.launch_index, int):
            history.append((failure.launch_index, n, h))
        shown = str(shown)
        host = ref.shown_at.startswith("host work")
        if ref.shown_at == "begin_capture":     # before any item: anything that names none
            wrong = (failure.launch_index not in (0, None)
                     or shown.startswith(("launch", "host work", "end_capture")))
        else:
            wrong = failure.launch_index != ref.launch_index
        if wrong or (ref.shown_at != "begin_capture" and (
                at_end != (shown == "end_capture"))) or (
                not at_end and ref.shown_at != "begin_capture" and (
                    f"launch {ref.launch_index}" not in shown
                    or host != shown.startswith("host work"))):
            if at_end and shown.startswith(("launch", "host work")):
                why = (f"it was raised by backend.end_capture() (the lazy code swallowed it at "
                       f"the call): shown_at is 'end_capture' and launch_index None there; you "
                       f"kept the last item issued")
            elif at_end:
                why = (f"it was raised by backend.end_capture() (the lazy code swallowed it at "
                       f"the call): shown_at is 'end_capture' and launch_index None there, "
                       f"{shown!r} instead of 'end_capture'")
            elif shown == "begin_capture":
                why = (f"your shown_at is still 'begin_capture', its value before the first item: "
                       f"it did not move as the items were issued; set it to each item before "
                       f"issuing it ({ref.shown_at!r} here)")
            elif ref.shown_at == "begin_capture":
                why = (f"it was raised before the first item was issued (by the step's own code, "
                       f"as it built its items): shown_at is 'begin_capture' (instead of "
                       f"{shown!r}: no item was being issued) and launch_index 0 there")
            elif failure.launch_index != ref.launch_index and _index_hint(history):
                why = f"{_index_hint(history)}, so it is {ref.launch_index}"
            elif not at_end and host != shown.startswith("host work"):
                why = (f"the item being issued was {'a HostWork' if host else 'a Launch'}: say "
                       f"{ref.shown_at!r} instead")
            else:
                why = ("shown_at is 'end_capture' or the item being issued ('launch N (kernel)', "
                       "'host work before launch N (...)'), launch_index the launches issued "
                       f"before it (None at end_capture): {ref.shown_at!r} instead of {shown!r}")
            raise Fail(f"{says}: {why}")
        if failure.reason != ref.reason:
            raise Fail(f"{label}: your CaptureFailure's reason is {str(failure.reason)[:80]!r}; "
                       f"the capture's first offence was {ref.reason!r}, which yours misses: a "
                       f"capture that failed at a call had already been invalidated by an "
                       f"earlier offence the lazy code swallowed; report the reason "
                       f"backend.end_capture() raises with when you end it (the first offence)")


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
        fell = [e for e in clean.ledger if e.outcome == "fallback"]
        why = f" (the first: {fell[0].reason!r})" if fell else ""
        if fell and not clean.__dict__.get("student_began", [0])[0]:
            why += (": your capture never began one -- backend.begin_capture(), before issuing "
                    "the step's items, is missing")
        raise Fail(f"a clean engine's captures must succeed and be replayed; its ledger: "
                   f"{led}{why}")
    if first_difference(gen, clean_tokens(backend)) is not None:
        empty = (": your captured graphs hold no launch -- nothing was issued into the capture; "
                 "issue every item of engine.pieces.items(plan) between begin_capture and "
                 "end_capture" if clean.__dict__.get("student_empty") else "")
        raise Fail(f"a clean engine's replays decode other tokens than its eager steps{empty}")
    yield "a clean engine captures and replays"
    history: list = []
    for label, bugs, seek in _BUGGY:
        eng = _engine_for(backend, bugs, engine_class=cls)
        tokens = _generate(eng, label, seek)
        if eng.backend.is_capturing():
            raise Fail(f"{label}: a capture is still open after the generation")
        fell = [e for e in eng.ledger if e.outcome == "fallback"]
        if not fell:
            raise Fail(f"{label}: no fallback in the ledger ({eng.ledger_summary()})")
        offences = [_OFFENCE[b] for b in bugs]
        mine = eng.__dict__.get("student_failures", [])
        if not any(o in str(fell[0].reason) for o in offences):
            if mine and any(o in str(mine[0][1].shown_at) for o in offences):
                raise Fail(f"{label}: the ledger's reason {fell[0].reason!r} is your shown_at, "
                           f"and your shown_at holds the reason: the values are in each other's "
                           f"places (swapped): {_SIGNATURE}")
            raise Fail(f"{label}: the ledger's reason {fell[0].reason!r} does not name the "
                       f"offending operation (a {' or a '.join(offences)}): report the "
                       f"CaptureError's reason")
        kept = [e.plan_key for e in fell if e.plan_key in eng.graphs]
        if kept:
            raise Fail(f"{label}: a graph is kept for the failed plan {kept[0]}")
        _where_it_showed(backend, label, bugs, seek, mine, history)
        i = first_difference(tokens, _clean(backend, seek))
        if i is not None:
            raise Fail(f"{label}: after the fallback the tokens differ from the clean engine's "
                       f"from position {i}: the lazy host state set inside the failed capture "
                       f"(engine.pieces.lazy) was kept, so the eager re-issue skipped work that "
                       f"never ran; restore it to exactly what it held before the capture (a key "
                       f"added inside it goes too)")
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
    "fallback", 5, "end a failed capture, discard it, restore, re-issue eagerly", "§3", STATEMENT,
    STUB, ("capture",), cases, REFERENCE,
    {"capture left open": (LEFT_OPEN, "left open"),
     "lazy state kept": (NO_RESTORE, "restore it"),
     "where it showed unsaid": (WHERE_UNSAID, "raised by backend.end_capture()")},
    stub_says='raised CaptureError out of the step')
