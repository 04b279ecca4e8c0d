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

from lab.engine.bugs import BUGS
from lab.teach.verify import decode_after_prompt, replay_check
from .base import Exercise, Fail, need, watched
from .fixtures import boundary_prompt, engine, prompt_ids

SPEC = """
One replay proves nothing: replay 1 runs the values captured for it, right by construction; a
frozen pointer or loop bound goes stale from replay 2 -- or later, when a plan change captures
afresh. Test several consecutive replays, byte-compared against the eager path.

Write replays_match(engine, prompt_ids) -> bool: True when the engine's graph replays decode
exactly what its eager steps decode after that prompt. Per arm: engine.reset(prompt_ids, n),
the prompt's steps eagerly (engine.cfg = engine.cfg.replace(graph=False), then
len(prompt_ids) - 1 engine.step() calls), then the arm's mode (graph=False or True) for n decode
steps, keeping engine.logits() after each (replay k is then generated token k) and
engine.tokens() at the end. Compare the two arms' bytes. Choose n yourself.

The check: your test passes the clean engine and fails LAB_BUG_FROZEN_KV_ROW, CTX_BY_VALUE and
POS_OUTSIDE_GRAPH, from a prompt ending mid-plan and from one ending a token before a plan
boundary. Calling lab.teach.verify (replay_check, decode_after_prompt) fails the check.
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


def run(engine, prompt_ids, n, graph):
    engine.cfg = engine.cfg.replace(graph=False)      # the prompt, eagerly in both arms
    engine.reset(prompt_ids, n)
    for _ in range(len(prompt_ids) - 1):
        engine.step()
    engine.cfg = engine.cfg.replace(graph=graph)      # then the arm's mode: replay k = token k
    out = []
    for _ in range(n):
        engine.step()
        out.append(engine.logits().tobytes())
    return out, engine.tokens().tobytes()


def replays_match(engine, prompt_ids):
    n = {n}
    a = run(engine, prompt_ids, n, graph={graph_arms[0]})
    b = run(engine, prompt_ids, n, graph={graph_arms[1]})
    return a == b
'''


REFERENCE = _test_source(8)
ONE_REPLAY = _test_source(1)
TWO_REPLAYS = _test_source(2)
GRAPH_AGAINST_GRAPH = _test_source(8, (True, True))

_REFS = (("lab.teach.verify.replay_check", replay_check),
         ("lab.teach.verify.decode_after_prompt", decode_after_prompt))
_FROZEN = [name for name, b in BUGS.items() if b.kind == "frozen"]


def _verdict(fn, eng, ids, label):
    out = watched(_REFS, fn, eng, ids, what=f"replays_match ({label})")
    if not isinstance(out, (bool,)) and type(out).__name__ != "bool_":
        raise Fail(f"replays_match returned {out!r} ({label}): return True or False")
    return bool(out)


def cases(sol, backend):
    (fn,) = need(sol, ("replays_match",))
    prompts = (("a prompt ending mid-plan", prompt_ids()),
               ("a prompt ending a token before a plan boundary", boundary_prompt()))
    for label, ids in prompts:
        if not _verdict(fn, engine(backend), ids, f"clean engine, {label}"):
            raise Fail(f"your test fails the clean engine ({label}): a false alarm; reset the "
                       f"request before each arm and compare the same steps")
    yield "the clean engine passes"
    for label, ids in prompts:
        for bug in _FROZEN:
            eng = engine(backend, bugs={bug})
            if _verdict(fn, eng, ids, f"{BUGS[bug].env}, {label}"):
                decode = [e.outcome for e in eng.ledger if e.position >= len(ids) - 1]
                graph = sum(o in ("capture", "replay") for o in decode)
                if not graph:
                    why = ("no decode step of your test ran as a graph: compare an eager arm "
                           "(graph=False) with a graph arm (graph=True)")
                elif "eager" not in decode:
                    why = ("both of your arms ran graphs, and both freeze the same value: compare "
                           "against the eager path")
                else:
                    why = (f"your graph arm decoded {graph} token(s): replay 1 is the step that "
                           f"was captured, right by construction, and a plan change captures "
                           f"afresh, so the frozen value first shows at replay 2 or 3; run three "
                           f"or more consecutive replays")
                raise Fail(f"your test PASSES {BUGS[bug].env}=1 from {label} "
                           f"({BUGS[bug].what}): {why}")
            yield f"{bug}, {label}: caught"


EXERCISE = Exercise(
    "replay_test", 6, "a repeated-replay test that a frozen pointer fails", "§4", SPEC, STUB,
    ("replays_match",), cases, REFERENCE,
    {"one replay": (ONE_REPLAY, "decoded 1 token(s)"),
     "two replays": (TWO_REPLAYS, "a token before a plan boundary"),
     "graph against graph": (GRAPH_AGAINST_GRAPH, "compare against the eager path")},
    stub_says='no decode step of your test ran as a graph')
