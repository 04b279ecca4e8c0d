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
from lab.teach.exercise import Exercise, Fail
from .base import need, variant, watched
from .crash import explained
from .fixtures import PROMPT, engine

STATEMENT = """
Count the launch bill before deciding to capture: kernels per layer x layers + the launches
outside the layer stack, per token; the step time divided by it is each launch's budget.

Write two functions:
  launches_per_token(engine) -> int   the kernel launches ONE decoded token issues on this
                                      engine. The engine comes reset with a prompt, in graph
                                      mode, its graphs already captured: a replayed step logs one
                                      graph launch, not its kernels (engine.log.for_step lists
                                      none for it). engine.log.for_step(step) lists the kernel
                                      launches logged for a step (entry = engine.step() returns
                                      its ledger entry, entry.step), and engine.cfg =
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
            (0.2, 13, "0.2 ms over 13 launches"), (0.05, 13, "0.05 ms over 13 launches"),
            (0.5, 50, "0.5 ms over 50 launches: exactly 10 us, which is not under 10"),
            (0.49975, 50, "0.49975 ms over 50 launches: 9.995 us, just under 10"),
            (0.50025, 50, "0.50025 ms over 50 launches: 10.005 us, just over 10"),
            (0.1, 1000, "0.1 ms over 1000 launches"))
# wrong readings of the budget rule, each told apart from the right one by the cases above
_BUDGET_MISTAKES = (
    (lambda ms, n: ms / n < 10.0, "the budget came out in milliseconds and was compared with 10 "
                                  "as if microseconds: 1 ms is 1000 us"),
    (lambda ms, n: 1000.0 * ms / n > 10.0, "capture pays when each launch's budget is UNDER "
                                           "10 us (the launch overhead is then a large share of "
                                           "it), not over"),
    (lambda ms, n: 1000.0 * ms / n >= 10.0, "capture pays when each launch's budget is UNDER "
                                            "10 us, not at or over it"),
    (lambda ms, n: 1000.0 * ms / n <= 10.0, "a budget of exactly 10 us is not under 10 us: "
                                            "compare with <, not <="),
    (lambda ms, n: n / (1000.0 * ms) < 10.0, "the budget is ms_per_token / launches (time per "
                                             "launch, in us), not launches per microsecond"))


def _engine(backend, kw):
    kw = dict(kw)
    model = load_model() if kw.pop("model", None) else None
    eng = engine(backend, model=model, **kw)
    eng.generate(PROMPT, 3)                           # graphs captured: the next step replays
    return eng


def _eager_records(backend, kw) -> list:
    """The launch records of one eager step of a fresh engine."""
    eng = _engine(backend, kw)
    eng.cfg = eng.cfg.replace(graph=False)
    return eng.log.for_step(eng.step().step)


def _eager_count(backend, kw) -> tuple[int, int, int]:
    """(launches, of them in layers, outside) of one eager step of a fresh engine."""
    recs = _eager_records(backend, kw)
    inside = sum(r.layer is not None for r in recs)
    return len(recs), inside, len(recs) - inside


def _count_hint(got, want, inside, outside, recs, replayed, eager, ran_step, before) -> str:
    """Why `got` is not the `want` launches one eager step logs: what the count was, as far as
    the number and what the solution ran tell."""
    if replayed and not eager:
        return ("the step you counted was a graph replay, which logs one graph launch and not "
                "its kernels: count an eager step (engine.cfg = engine.cfg.replace(graph=False) "
                "first; without it the engine, in graph mode, replays)")
    if got == 0 and not ran_step:
        return ("you ran no step, and the step the engine ran last was a graph replay, whose "
                "kernels the launch log does not list: make the next step eager (engine.cfg = "
                "engine.cfg.replace(graph=False)), run it and count its launches")
    if got == 0:
        return ("no launch is logged for the step you counted: count the step that just ran "
                "(entry = engine.step(); engine.log.for_step(entry.step))")
    if got == inside:
        return (f"that is the layers' {inside}: the {outside} launches outside the layer stack "
                f"(embedding, final norm, head, sampling, position) count too")
    if got == len({r.kernel for r in recs}) and got != want:
        return ("that is the number of distinct kernels: every launch counts, a kernel launched "
                "in every layer once per layer")
    if isinstance(got, (int, float)) and got > want and got % want == 0:
        return f"that is {got / want:g} steps' launches: count those of ONE step"
    if got in before:
        return (f"{got} is what {before[got]} logs: count this engine's own step, not a number "
                f"carried over")
    if got in (want - 1, want + 1):
        return (f"that is one {'fewer' if got < want else 'more'} than the step logs: count "
                f"every launch it logs (the sampling and position launches too), each once")
    return "count every launch one eager step logs, once"


def _cut(answers: list) -> tuple[float, float] | None:
    """(the largest budget answered True, the smallest answered False), when the answers are
    those of a threshold on the budget (True below it, False above) that is not 10 us."""
    us = [1000.0 * ms / n for ms, n, _ in _BUDGETS]
    yes = [u for u, a in zip(us, answers) if a]
    no = [u for u, a in zip(us, answers) if not a]
    if not yes or not no or max(yes) >= min(no) or max(yes) < 10.0 <= min(no):
        return None
    return max(yes), min(no)


def _pays_hint(answers: list) -> str:
    """The mistake whose model gives every answer the solution gave, or the rule itself."""
    for model, why in _BUDGET_MISTAKES:
        if all(bool(model(ms, n)) == got for (ms, n, _), got in zip(_BUDGETS, answers)):
            return why
    cut = _cut(answers)
    if cut is not None:
        low, high = cut
        return (f"your answers put the threshold between {low:.4g} and {high:.4g} us, not at 10 "
                f"us: capture pays when 1000 * ms_per_token / launches is under 10 exactly "
                f"(1 ms is 1000 us)")
    return ("capture pays when ms_per_token / launches, in microseconds, is under 10 (1 ms is "
            "1000 us)")


def cases(sol, backend):
    count, pays = need(sol, ("launches_per_token", "capture_pays"))
    before: dict = {}
    for label, kw in _CONFIGS:
        want, inside, outside = _eager_count(backend, kw)
        eng = _engine(backend, kw)
        ran = len(eng.ledger)
        got = watched(_REFS, explained(count, f"launches_per_token ({label})"), eng,
                      what=f"launches_per_token ({label})")
        ran_step = len(eng.ledger) > ran
        replayed = any(e.outcome in ("replay", "capture", "update") for e in eng.ledger[ran:])
        eager = any(e.outcome == "eager" for e in eng.ledger[ran:])
        if got is None:
            raise Fail("launches_per_token returned None: count the kernel launches one eager "
                       "step logs (engine.log.for_step), and return that number")
        if got != want:
            recs = _eager_records(backend, kw)
            hint = _count_hint(got, want, inside, outside, recs, replayed, eager, ran_step, before)
            raise Fail(f"launches_per_token ({label}) = {got!r}, an eager step logs {want}: {hint}")
        before.setdefault(want, label)
        yield label
    answers = []
    for ms, n, label in _BUDGETS:
        got = watched(_REFS, explained(pays, f"capture_pays ({label})"), ms, n,
                      what=f"capture_pays ({label})")
        if got is None:
            raise Fail("capture_pays returned None: compare each launch's budget, in "
                       "microseconds, with 10")
        if not isinstance(got, bool) and type(got).__name__ != "bool_":
            raise Fail(f"capture_pays ({label}) returned {got!r}: return True or False")
        answers.append(bool(got))
    for (ms, n, label), got in zip(_BUDGETS, answers):
        want = 1000.0 * ms / n < 10.0
        if got != want:
            raise Fail(f"capture_pays({ms}, {n}) = {got} ({label}): the budget is "
                       f"{1000.0 * ms / n:.5g} us per launch, "
                       f"{'under' if want else 'not under'} 10 us: {_pays_hint(answers)}")
        yield label

EXERCISE = Exercise(
    "launch_count", 1, "count one token's launches; does capture pay?", "§Overview", STATEMENT,
    STUB, ("launches_per_token", "capture_pays"), cases, REFERENCE,
    {"counted a replay": (REPLAYED, "graph replay"),
     "layers only": (LAYERS_ONLY, "outside the layer stack"),
     "milliseconds": (MILLISECONDS, "1 ms is 1000 us")},
    stub_says="count the kernel launches one eager step logs")
