"""Checklist step 6, test with three or more replays: a repeated-replay test that catches a
frozen pointer a single replay misses.

The student writes the test: `replays_match(engine, prompt_ids)` decodes after the prompt once
eagerly and once as graph replays, and byte-compares every step. The check runs it on real
engines: the clean one (it must pass) and each bug that freezes a host value at capture
(LAB_BUG_FROZEN_KV_ROW: a pointer; LAB_BUG_CTX_BY_VALUE: a loop bound; LAB_BUG_POS_OUTSIDE_GRAPH:
a host write), from a prompt that ends mid-plan and from one that ends a token before a plan
boundary (the second token is then a fresh capture, and the frozen value first goes stale at
replay 3). The test must fail every buggy engine.
"""
from __future__ import annotations

import numpy as np

from lab.engine.bugs import BUGS
from lab.engine.runner import DecodeEngine
from lab.teach.exercise import Exercise, Fail, watching
from lab.measure.replay_check import decode_after_prompt, replay_check
from .base import need, watched
from .crash import explained
from .fixtures import boundary_prompt, engine, prompt_ids

STATEMENT = """
One replay proves nothing: replay 1 runs the values captured for it, right by construction; a
frozen pointer or loop bound goes stale from replay 2 -- or later, when a plan change captures
afresh. Test several consecutive replays, byte-compared against the eager path.

Write replays_match(engine, prompt_ids) -> bool: True when the engine's graph replays decode
exactly what its eager steps decode after that prompt. Per arm: the prompt's steps eagerly
(engine.cfg = engine.cfg.replace(graph=False), then engine.reset(prompt_ids) -- or
engine.reset(prompt_ids, n), room for n new tokens -- and len(prompt_ids) - 1 engine.step()
calls, so that the first step after them decodes the first new token), then the arm's mode
(graph=False or True) for n decode
steps, keeping engine.logits() after EACH step (replay k is then generated token k: a frozen
value can show at one replay and be gone by the last) and engine.tokens() at the end. Compare
the two arms byte for byte (.tobytes(), or np.array_equal), step by step: no tolerance
(np.allclose, isclose), since one ulp is a difference. Choose n yourself: three or more replays
of one graph, after the prompt and after a plan change.

The check: your test passes the clean engine and fails an engine whose third launch of a graph
leaves one logit one ulp off (no token changes), LAB_BUG_FROZEN_KV_ROW, CTX_BY_VALUE and
POS_OUTSIDE_GRAPH, from a prompt ending mid-plan and from one ending a token before a plan
boundary. Calling lab.measure.replay_check (replay_check, decode_after_prompt) fails the check.
"""

STUB = '''
import numpy as np


def replays_match(engine, prompt_ids):
    """True when graph replays decode byte for byte what eager steps decode after the prompt."""
    # FILL ME IN: an eager arm, a graph arm, compared
    return True
'''


def _test_source(n: int, graph_arms=(False, True)) -> str:
    return f'''
import numpy as np


def run(engine, prompt_ids, graph):
    engine.cfg = engine.cfg.replace(graph=False)      # the prompt, eagerly in both arms
    engine.reset(prompt_ids)
    for _ in range(len(prompt_ids) - 1):
        engine.step()
    engine.cfg = engine.cfg.replace(graph=graph)      # then the arm's mode: replay k = token k
    out = []
    for _ in range({n}):                  # replays of one graph, and a plan change
        engine.step()
        out.append(engine.logits().tobytes())
    return out, engine.tokens().tobytes()


def replays_match(engine, prompt_ids):
    a = run(engine, prompt_ids, graph={graph_arms[0]})
    b = run(engine, prompt_ids, graph={graph_arms[1]})
    return a == b
'''


REFERENCE = _test_source(8)
# the token ids only: a difference in the logits that has not flipped a token yet passes
TOKENS_ONLY = _test_source(8).replace("        out.append(engine.logits().tobytes())\n", "")
# the last step's logits only: a replay that went wrong and came right again passes
LAST_LOGITS_ONLY = _test_source(8).replace(
    "        out.append(engine.logits().tobytes())\n", "").replace(
    "    return out, engine.tokens().tobytes()",
    "    return engine.logits().tobytes(), engine.tokens().tobytes()")
# within a tolerance: one ulp apart passes
TOLERANCE = _test_source(8).replace("out.append(engine.logits().tobytes())",
                                    "out.append(engine.logits().copy())").replace(
    "    return a == b", """    return a[1] == b[1] and all(np.allclose(x, y) for x, y in zip(a[0], b[0]))""")
ONE_REPLAY = _test_source(1)
TWO_REPLAYS = _test_source(2)
GRAPH_AGAINST_GRAPH = _test_source(8, (True, True))

_REFS = (("lab.measure.replay_check.replay_check", replay_check),
         ("lab.measure.replay_check.decode_after_prompt", decode_after_prompt))
_FROZEN = [name for name, b in BUGS.items() if b.kind == "frozen"]
_TOLERANCES = tuple((f"numpy.{f.__name__}", getattr(f, "_implementation", f))
                    for f in (np.allclose, np.isclose, np.testing.assert_allclose,
                              np.testing.assert_array_almost_equal)
                    if hasattr(getattr(f, "_implementation", f), "__code__"))
ULP_AT = 3        # the launch of a graph whose logits the one-ulp engine leaves off


class OneUlpReplay(DecodeEngine):
    """An engine whose graph, at its third launch (capture or replay) for a plan key since the
    request was reset, leaves its last logit one ulp off (as a reduction summed in another order
    would): the eager path and every other launch are byte for byte right, and no token id
    changes."""

    def reset(self, *args, **kw):
        self.__dict__["_launches_of"] = {}
        return super().reset(*args, **kw)

    def step(self):
        entry = super().step()
        if entry.outcome in ("capture", "replay", "update"):
            runs = self.__dict__.setdefault("_launches_of", {})
            runs[entry.plan_key] = runs.get(entry.plan_key, 0) + 1
            if runs[entry.plan_key] == ULP_AT:
                d = self.devices[0]
                x = d.backend.download(d.vocab_view)
                x.reshape(-1)[-1] = np.nextafter(x.reshape(-1)[-1], np.float32(np.inf),
                                                 dtype=x.dtype)
                d.backend.upload(d.vocab_view, x)
        return entry


def _reads(eng) -> list:
    """Wrap eng.logits and eng.tokens: every read noted as (what, position, graph mode)."""
    reads: list = []
    for what in ("logits", "tokens"):
        method = getattr(eng, what)

        def read(*args, _method=method, _what=what, **kw):
            reads.append((_what, eng.position, bool(eng.cfg.graph)))
            return _method(*args, **kw)
        setattr(eng, what, read)
    return reads


def _resets(eng) -> list:
    """Wrap eng.reset: the prompt ids of every call, as arrays."""
    seen: list = []
    method = eng.reset

    def reset(prompt_ids, *args, **kw):
        seen.append(np.array(prompt_ids, copy=True))
        return method(prompt_ids, *args, **kw)
    eng.reset = reset
    return seen


def _verdict(fn, eng, ids, label, tolerance: list | None = None):
    with watching(_TOLERANCES) as used:
        out = watched(_REFS, explained(fn, f"replays_match ({label})"), eng, ids,
                      what=f"replays_match ({label})")
    if tolerance is not None:
        tolerance.extend(used)
    if not isinstance(out, (bool,)) and type(out).__name__ != "bool_":
        raise Fail(f"replays_match returned {out!r} ({label}): return True or False")
    return bool(out)


_GRAPH = ("capture", "replay", "update")


def _marks(eng) -> list:
    """Wrap eng.reset: the ledger's length at every call (where each arm starts)."""
    marks: list = []
    method = eng.reset

    def reset(*args, **kw):
        marks.append(len(eng.ledger))
        return method(*args, **kw)
    eng.reset = reset
    return marks


def _prompt_problem(eng, ids, marks: list) -> str | None:
    """What is wrong with how the test ran the prompt, arm by arm (each arm from one reset to
    the next): its len(prompt_ids) - 1 steps eagerly, the first new token the first step in the
    arm's mode; None when every arm did so."""
    want = len(ids) - 1
    bounds = [*marks, len(eng.ledger)]
    for a, b in zip(bounds, bounds[1:]):
        arm = eng.ledger[a:b]
        in_prompt = [e for e in arm if e.position < want and e.outcome in _GRAPH]
        graph_arm = any(e.position >= want and e.outcome in _GRAPH for e in arm)
        if in_prompt and not graph_arm:
            return (f"your eager arm ran {len(in_prompt)} of the prompt's {want} steps as graphs "
                    f"instead of eagerly: "
                    f"a fresh engine is in graph mode, and without engine.cfg = "
                    f"engine.cfg.replace(graph=False) before the prompt its steps are captured "
                    f"and replayed; run the prompt eagerly in both arms")
        if not graph_arm:
            continue
        first = next(i for i, e in enumerate(arm) if e.outcome in _GRAPH)
        eager = sum(e.outcome == "eager" for e in arm[:first])
        if eager == want:
            continue
        if eager == 0:
            return (f"no step of the prompt ran eagerly before your graph arm's graphs (its "
                    f"first graph step decoded position {arm[first].position}): the prompt's "
                    f"{want} eager steps (len(prompt_ids) - 1) are missing, so replay k is not "
                    f"the k-th new token")
        k = abs(eager - want)
        more = "too many" if eager > want else "too few"
        return (f"your graph arm ran {eager} eager steps before its first graph step, the prompt "
                f"takes {want} (len(prompt_ids) - 1): {'one' if k == 1 else k} {more}, so its "
                f"first graph step decoded position {arm[first].position}, not {want}, the "
                f"first new token")
    return None


def _longest_graph_run(decode: list) -> int:
    """The most consecutive launches of one graph (capture or replay, one plan key) in a run."""
    best = k = 0
    for i, (outcome, key) in enumerate(decode):
        graph = outcome in ("capture", "replay", "update")
        k = (k + 1 if graph and i and decode[i - 1][0] in ("capture", "replay", "update")
             and decode[i - 1][1] == key else int(graph))
        best = max(best, k)
    return best


def _why_it_passed(eng, ids, reads: list, tolerance: list, needed: int,
                   one_ulp: bool = False) -> str:
    """What the test did that let a buggy engine pass: from its ledger and what it read."""
    decode = [(e.outcome, e.plan_key) for e in eng.ledger if e.position >= len(ids) - 1]
    outcomes = [o for o, _ in decode]
    graph = sum(o in ("capture", "replay", "update") for o in outcomes)
    if not graph:
        return ("no decode step of your test ran as a graph: compare an eager arm "
                "(graph=False) with a graph arm (graph=True)")
    if "eager" not in outcomes:
        return ("both of your arms ran graphs, which a graph bug gets wrong alike: compare "
                "against the eager path")
    run = _longest_graph_run(decode)
    if run < needed:
        return (f"your graph arm launched one graph at most {run} time(s) in a row: replay 1 is "
                f"the step that was captured, right by construction, and a plan change captures "
                f"afresh, so a frozen value first shows at replay 2 or 3; run three or more "
                f"consecutive replays of one graph")
    prompt_graphs = [e for e in eng.ledger if e.position < len(ids) - 1
                     and e.outcome in ("capture", "replay", "update")]
    if prompt_graphs:
        return (f"your test ran {len(prompt_graphs)} of the prompt's steps as graphs, so the "
                f"graph launches a frozen value spoils can fall in the prompt, whose logits you "
                f"do not keep: run the prompt eagerly in both arms (graph=False), then switch to "
                f"the arm's mode, so that replay k is decoded token k")
    if tolerance:
        return (f"you compared with {tolerance[0]}, a tolerance, and one ulp apart passes it: "
                f"compare byte for byte (.tobytes(), or np.array_equal)")
    logits_graph = sum(w == "logits" and g for w, _, g in reads)
    if not any(w == "logits" for w, _, _ in reads):
        return ("your test never read engine.logits(): compare the logits after every step, "
                "not only the token ids (a wrong value shows in the logits before it flips a "
                "token)")
    if logits_graph < graph:
        return (f"your graph arm ran {graph} graph step(s) and read the logits {logits_graph} "
                f"time(s): keep engine.logits() after EVERY step, since a replay can go wrong "
                f"and the last step still match")
    if one_ulp:
        return (f"your test ran {graph} graph step(s) and read the logits after each, yet one "
                f"logit (the vocabulary's last) one ulp off at the third graph launch, no token "
                f"id changed, passed it: a tolerance of your own, rounding or converting the "
                f"logits (float16, argmax), or comparing only some of them or some steps lets "
                f"that through; compare every byte of engine.logits() (.tobytes() or "
                f"np.array_equal), every step")
    return (f"your test ran {graph} graph step(s) and read the logits after each, and still "
            f"passed: compare the eager arm's bytes with the graph arm's, step by step, every "
            f"step (no tolerance, none skipped)")


def cases(sol, backend):
    (fn,) = need(sol, ("replays_match",))
    prompts = (("a prompt ending mid-plan", prompt_ids()),
               ("a prompt ending a token before a plan boundary", boundary_prompt()))
    for label, ids in prompts:
        clean = engine(backend)
        resets, marks = _resets(clean), _marks(clean)
        if not _verdict(fn, clean, ids, f"clean engine, {label}"):
            if _verdict(fn, engine(backend, bugs={_FROZEN[0]}), ids, f"{_FROZEN[0]}, {label}"):
                raise Fail(f"your test fails the clean engine ({label}) and passes one with "
                           f"{BUGS[_FROZEN[0]].env}=1: it is the wrong way round; return True "
                           f"when the two arms match byte for byte, False when they differ")
            raise Fail(f"your test fails the clean engine ({label}): a false alarm; reset the "
                       f"request before each arm and compare the same steps")
        if resets and not any(np.array_equal(r, ids) for r in resets):
            raise Fail(f"your test never reset the engine with the prompt it was given ({label}): "
                       f"decode after `prompt_ids` (engine.reset(prompt_ids)) in both arms; a "
                       f"prompt of your own misses the plan boundary the given one ends at")
        problem = _prompt_problem(clean, ids, marks)
        if problem:
            raise Fail(f"clean engine, {label}: {problem}")
    yield "the clean engine passes"
    fixtures = [("an engine whose third launch of a graph leaves one logit one ulp off", ids,
                 label, {"engine_class": OneUlpReplay}, ULP_AT, True)
                for label, ids in prompts[:1]]
    fixtures += [(f"{BUGS[bug].env}=1 ({BUGS[bug].what})", ids, label, {"bugs": {bug}},
                  3 if ids is prompts[1][1] else 2, False)
                 for label, ids in prompts for bug in _FROZEN]
    for what, ids, label, kw, needed, one_ulp in fixtures:
        eng = engine(backend, **kw)
        reads, tolerance = _reads(eng), []
        if _verdict(fn, eng, ids, f"{what}, {label}", tolerance):
            raise Fail(f"your test PASSES {what} from {label}: "
                       f"{_why_it_passed(eng, ids, reads, tolerance, needed, one_ulp)}")
        yield f"{what}, {label}: caught"


EXERCISE = Exercise(
    "replay_test", 6, "a repeated-replay test that a frozen pointer fails", "§4", STATEMENT, STUB,
    ("replays_match",), cases, REFERENCE,
    {"one replay": (ONE_REPLAY, "at most 1 time(s) in a row"),
     "two replays": (TWO_REPLAYS, "at most 2 time(s) in a row"),
     "graph against graph": (GRAPH_AGAINST_GRAPH, "compare against the eager path"),
     "token ids only": (TOKENS_ONLY, "never read engine.logits()"),
     "last logits only": (LAST_LOGITS_ONLY, "after EVERY step"),
     "tolerance": (TOLERANCE, "a tolerance, and one ulp apart passes it")},
    stub_says='no decode step of your test ran as a graph')
