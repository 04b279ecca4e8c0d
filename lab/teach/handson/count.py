"""Checklist step 1, count your launches: kernels per token from the engine's launch log, and
whether the per-launch budget says capture is worth doing.

The check hands the student's `launches_per_token(engine)` real engines -- the one-op-per-kernel
step, its split combine, its overlap, the fused step, the four-layer model -- each already in
graph mode with its graphs captured (so a step counted as it runs is a replay), and compares the
count with what an eager step of a fresh engine of the same configuration logs.
"""
from __future__ import annotations

from lab.backend.instrument import LaunchBill, launch_bill
from lab.model import load_model
from .base import Exercise, Fail, need, variant, watched
from .fixtures import PROMPT, engine

SPEC = """
Count the launch bill before deciding to capture: kernels per layer x layers + the launches
outside the layer stack, per token; the step time divided by it is each launch's budget.

Write two functions:
  launches_per_token(engine) -> int   the kernel launches ONE decoded token issues on this
                                      engine. The engine comes reset with a prompt, in graph
                                      mode, its graphs already captured: a replayed step logs one
                                      graph launch, not its kernels. engine.log.for_step(step)
                                      lists the launches logged for a step (entry = engine.step()
                                      returns its ledger entry, entry.step), and engine.cfg =
                                      engine.cfg.replace(graph=False) makes the next step eager.
  capture_pays(ms_per_token, launches) -> bool   True when each launch's budget,
                                      ms_per_token / launches, is under 10 microseconds.

The check: five engines (the split combine, the overlap, the fused step, the four-layer model)
against what their eager steps log; capture_pays on the lecture's figures and on the lab's.
Calling lab.backend.instrument.launch_bill or LaunchBill.us_per_launch fails the check.
"""

STUB = '''
def launches_per_token(engine):
    """Kernel launches one decoded token issues on `engine`."""
    # FILL ME IN
    return None


def capture_pays(ms_per_token, launches):
    """True when ms_per_token / launches is under 10 microseconds."""
    # FILL ME IN
    return None
'''

REFERENCE = '''
def launches_per_token(engine):
    engine.cfg = engine.cfg.replace(graph=False)     # a replay would log one graph launch
    entry = engine.step()
    return len(engine.log.for_step(entry.step))


def capture_pays(ms_per_token, launches):
    return 1000.0 * ms_per_token / launches < 10.0
'''


# counts the step as it runs: a graph replay
REPLAYED = variant(REFERENCE, "    engine.cfg = engine.cfg.replace(graph=False)     # a replay "
                   "would log one graph launch\n")
# counts the layers' launches only
LAYERS_ONLY = variant(REFERENCE, "return len(engine.log.for_step(entry.step))",
                       "return sum(r.layer is not None for r in engine.log.for_step(entry.step))")
# the budget in milliseconds, compared with 10 as if microseconds
MILLISECONDS = variant(REFERENCE, "return 1000.0 * ms_per_token / launches < 10.0",
                        "return ms_per_token / launches < 10.0")

_REFS = (("lab.backend.instrument.launch_bill", launch_bill),
         ("lab.backend.instrument.LaunchBill.us_per_launch", LaunchBill.us_per_launch.fget))
_CONFIGS = (("the one-op-per-kernel step", {}), ("split combine", {"split_combine": True}),
            ("overlap (q | k, v on two streams)", {"overlap": True}),
            ("the fused step", {"fusion": True}), ("the four-layer model", {"model": "tiny"}))
# (ms/token, launches, what): the lecture's two figures, and two small cases either side of 10 us
_BUDGETS = ((47.0, 2790, "the lecture's 47 ms over 2790 launches"),
            (38.3, 4257, "the lecture's captured step: 38.3 ms over 4257 nodes"),
            (0.2, 13, "0.2 ms over 13 launches"), (0.05, 13, "0.05 ms over 13 launches"))


def _engine(backend, kw):
    kw = dict(kw)
    model = load_model() if kw.pop("model", None) else None
    eng = engine(backend, model=model, **kw)
    eng.generate(PROMPT, 3)                           # graphs captured: the next step replays
    return eng


def _eager_count(backend, kw) -> tuple[int, int, int]:
    """(launches, of them in layers, outside) of one eager step of a fresh engine."""
    eng = _engine(backend, kw)
    eng.cfg = eng.cfg.replace(graph=False)
    recs = eng.log.for_step(eng.step().step)
    inside = sum(r.layer is not None for r in recs)
    return len(recs), inside, len(recs) - inside


def cases(sol, backend):
    count, pays = need(sol, ("launches_per_token", "capture_pays"))
    for label, kw in _CONFIGS:
        want, inside, outside = _eager_count(backend, kw)
        eng = _engine(backend, kw)
        ran = len(eng.ledger)
        got = watched(_REFS, count, eng, what=f"launches_per_token ({label})")
        replayed = any(e.outcome in ("replay", "capture", "update") for e in eng.ledger[ran:])
        eager = any(e.outcome == "eager" for e in eng.ledger[ran:])
        if got is None:
            raise Fail("launches_per_token returned None: count the kernel launches one eager "
                       "step logs (engine.log.for_step), and return that number")
        if got != want:
            hint = ("the step you counted was a graph replay, which logs one graph launch and "
                    "not its kernels: count an eager step" if replayed and not eager else
                    "no launch is logged for the step you counted: count the step that just ran "
                    "(entry = engine.step(); engine.log.for_step(entry.step))" if got == 0 else
                    f"that is the layers' {inside}: the {outside} launches outside the layer "
                    f"stack (embedding, final norm, head, sampling, position) count too"
                    if got == inside else
                    f"that is {got / want:g} steps' launches: count those of ONE step"
                    if isinstance(got, (int, float)) and got > want and got % want == 0 else
                    "count every launch one eager step logs, once")
            raise Fail(f"launches_per_token ({label}) = {got!r}, an eager step logs {want}: {hint}")
        yield label
    for ms, n, label in _BUDGETS:
        got = watched(_REFS, pays, ms, n, what=f"capture_pays ({label})")
        want = 1000.0 * ms / n < 10.0
        if got is None:
            raise Fail("capture_pays returned None: compare each launch's budget, in "
                       "microseconds, with 10")
        if not isinstance(got, bool) and type(got).__name__ != "bool_":
            raise Fail(f"capture_pays ({label}) returned {got!r}: return True or False")
        if bool(got) != want:
            raise Fail(f"capture_pays({ms}, {n}) = {got} ({label}): the budget is "
                       f"{1000.0 * ms / n:.3g} us per launch, {'under' if want else 'over'} 10 us "
                       f"-- 1 ms is 1000 us")
        yield label


EXERCISE = Exercise(
    "launch_count", 1, "count one token's launches; does capture pay?", "§Overview", SPEC, STUB,
    ("launches_per_token", "capture_pays"), cases, REFERENCE,
    {"counted a replay": (REPLAYED, "graph replay"),
     "layers only": (LAYERS_ONLY, "outside the layer stack"),
     "milliseconds": (MILLISECONDS, "1 ms is 1000 us")},
    stub_says="count the kernel launches one eager step logs")
