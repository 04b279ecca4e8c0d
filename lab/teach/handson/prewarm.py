"""Checklist step 4, lazy initialisation: the pre-warm that makes a lazy table capturable.

The engine under test runs a step with two lazy initialisations (LAB_BUG_LAZY_TABLE: the RoPE
tables uploaded on first use; LAB_BUG_LAZY_SCRATCH: the attention scratch grown through a
synchronous allocator when a plan needs more). Inside a capture both are illegal, so every plan
whose capture meets one falls back to eager. The student's `pre_warm(engine)` runs once, after
the engine is built and before the first step; the check then decodes across every plan boundary
and holds the ledger (no fallback), the backend's record of host operations (nothing issued while
a capture was open) and the tokens (the clean engine's) to it.
"""
from __future__ import annotations

import dataclasses
import functools

import numpy as np

from lab.model import random_model
from lab.measure.audit import detect_lazy_init
from lab.teach.exercise import Exercise, Fail
from .base import need, variant, watched
from .crash import explained
from .fixtures import SMALL, PROMPT, TOKENS, clean_tokens, engine, first_difference

STATEMENT = """
Lazy initialisation -- do it on first use, cache it for ever -- is invisible eagerly and illegal
inside a capture (a synchronous copy, an allocation that grows a pool). Pre-warm all of it.

Write pre_warm(engine): called once, after the engine is built and before its first step. The
engine's step (engine.pieces) uploads its RoPE tables on first use and grows its attention
scratch when a plan needs more splits than it has. Each such first-use job is yielded by the
step as a lab.engine.step.HostWork item (engine.pieces.items(plan) yields the step's items in order;
HostWork.run() does the job). Make every plan the engine will meet capturable: the plan at
position 0 and the one after each of lab.plan.plan_boundaries(engine.model.cfg.max_seq). Run
the jobs outside any capture, and leave engine.cfg as you found it (in graph mode).

The check: a graph generation across every plan boundary with every step a graph, no fallback
in the ledger, no host operation issued inside a capture, and the clean engine's tokens; then
the same on a model of 256 positions (one more plan boundary, at 128), decoding across it after
a seek: take the boundaries from the engine you are given, not from the first model.
"""

STUB = '''
from lab import HostWork
from lab.plan import plan_boundaries


def pre_warm(engine):
    """Run every first-use initialisation of engine's step, outside any capture."""
    # FILL ME IN
    pass
'''

REFERENCE = '''
from lab import HostWork
from lab.plan import plan_boundaries


def pre_warm(engine):
    first = engine.plan()                    # the plan a fresh engine starts in (position 0)
    later = [engine.plan(p) for p in plan_boundaries(engine.model.cfg.max_seq)]
    for plan in [first, *later]:
        for item in engine.pieces.items(plan):         # lazily: a job runs as it is met
            if isinstance(item, HostWork):
                item.run()
'''

# warming up = decoding one eager token: it meets the first plan's lazy work only
ONE_EAGER_STEP = '''
def pre_warm(engine):
    cfg = engine.cfg
    engine.cfg = cfg.replace(graph=False)
    engine.reset(engine.encode("R"))
    engine.step()
    engine.cfg = cfg
'''

# the table marked as uploaded, never uploaded (the scratch pre-warmed right)
FLAG_ONLY = '''
from lab.plan import MAX_SPLITS


def pre_warm(engine):
    engine.pieces.lazy["rope_uploaded"] = True
    engine.pieces.grow_scratch(MAX_SPLITS)
'''

# the scratch for the largest plan, but not the table
SCRATCH_ONLY = '''
from lab.plan import MAX_SPLITS


def pre_warm(engine):
    engine.pieces.grow_scratch(MAX_SPLITS)
'''

# the boundaries of the first model written in: a model with more positions has more plans
HARD_CODED = variant(REFERENCE, "plan_boundaries(engine.model.cfg.max_seq)]", "(32, 64)]")

_REFS = (("lab.measure.audit.detect_lazy_init", detect_lazy_init),)
LAZY = {"lazy_table", "lazy_scratch"}


LONG_SEQ, SEEK, LONG_TOKENS = 256, 124, 8


@functools.lru_cache(maxsize=1)
def long_model():
    """The small model with 256 positions: plan boundaries at 32, 64 and 128."""
    return random_model(dataclasses.replace(SMALL, max_seq=LONG_SEQ), seed=3)


def _clear_cache(eng) -> None:
    """Zeros in every KV row: the rows a seek skips hold what the clean engine's do, whatever
    steps pre_warm ran (a request's own steps write every row it reads; a seek writes none)."""
    for be, b in zip(eng.backends, eng.bufs):
        for buf in (*b.k_cache, *b.v_cache):
            be.upload(buf, np.zeros(buf.shape, buf.dtype))


def _seek_and_decode(eng) -> tuple:
    _clear_cache(eng)
    eng.reset(eng.encode(PROMPT), SEEK + LONG_TOKENS)
    eng.seek(SEEK)
    eng.decode(LONG_TOKENS)
    return tuple(int(t) for t in eng.tokens(SEEK + LONG_TOKENS + 1))


def _fallbacks(eng, what: str) -> None:
    fell = [e for e in eng.ledger if e.outcome == "fallback"]
    if fell:
        e = fell[0]
        missed = sorted({int(x.plan_key[1]) for x in fell})
        raise Fail(f"{what}the capture at position {e.position} (splits {e.plan_key[1]}) fell back "
                   f"to eager: {e.reason}. Plans with splits {missed} were not pre-warmed: run "
                   f"every first-use job of every plan the engine will meet "
                   f"(plan_boundaries(engine.model.cfg.max_seq)), before the first capture")


def _warm(pre_warm, eng, what: str) -> None:
    """Run the solution's pre_warm on `eng`, held to leaving it as it found it: in graph mode,
    its configuration unchanged, no capture open, nothing run inside a capture."""
    cfg, n_ops = eng.cfg, len(eng.backend.ops)
    try:
        watched(_REFS, explained(pre_warm, what), eng, what=what)
    except Fail as exc:
        if eng.backend.is_capturing() and "CaptureError" in str(exc):
            raise Fail(f"{exc}: pre_warm ran first-use work inside a capture it opened; "
                       f"pre-warming runs every first-use job OUTSIDE any capture (a capture is "
                       f"where it is illegal)") from None
        raise
    if eng.backend.is_capturing():
        raise Fail("pre_warm left a capture open")
    inside = [o for o in eng.backend.ops[n_ops:] if o.capturing]
    if inside:
        raise Fail(f"pre_warm ran the {inside[0].kind} of {inside[0].detail} inside a capture: "
                   f"pre-warming runs every first-use job OUTSIDE any capture (a capture is "
                   f"where it is illegal)")
    if eng.cfg != cfg:
        changed = [f"{f.name}: {getattr(cfg, f.name)!r} -> {getattr(eng.cfg, f.name)!r}"
                   for f in dataclasses.fields(cfg)
                   if getattr(cfg, f.name) != getattr(eng.cfg, f.name)]
        off = "" if eng.cfg.graph else " -- out of graph mode, nothing would be captured"
        raise Fail(f"pre_warm changed engine.cfg ({'; '.join(changed)}){off}: put the "
                   f"configuration back as it was (the engine must still capture every plan)")


def _all_captured(entries, what: str) -> None:
    """Every step of the generation (its ledger `entries`) ran as a graph, none eagerly."""
    eager = [e for e in entries if e.outcome == "eager"]
    if eager:
        raise Fail(f"{what}the step at position {eager[0].position} ran eagerly: pre_warm must "
                   f"leave the engine in graph mode, every plan captured")


def _long_case(pre_warm, backend):
    eng = engine(backend, model=long_model(), bugs=LAZY)
    _warm(pre_warm, eng, "pre_warm (256 positions)")
    n = len(eng.ledger)
    got = watched(_REFS, _seek_and_decode, eng, what="decoding after pre_warm (256 positions)")
    _fallbacks(eng, f"a model of {LONG_SEQ} positions (take the plan boundaries from the engine "
                    f"you are given), decoding from {SEEK} across 128: ")
    _all_captured(eng.ledger[n:], f"a model of {LONG_SEQ} positions: ")
    want = _seek_and_decode(engine(backend, model=long_model(), graph=False))
    i = first_difference(got, want)
    if i is not None:
        raise Fail(f"a model of {LONG_SEQ} positions: the tokens differ from the clean engine's "
                   f"from position {i}: a first-use job marked done never ran")


def cases(sol, backend):
    (pre_warm,) = need(sol, ("pre_warm",))
    eng = engine(backend, bugs=LAZY)
    _warm(pre_warm, eng, "pre_warm")
    yield "pre_warm ran"
    n_ops, n_steps = len(eng.backend.ops), len(eng.ledger)
    gen = watched(_REFS, eng.generate, PROMPT, TOKENS, what="generating after pre_warm")
    _fallbacks(eng, "")
    _all_captured(eng.ledger[n_steps:], "")
    inside = [o for o in eng.backend.ops[n_ops:]
              if o.capturing and o.kind in ("upload", "allocation")]
    if inside:
        raise Fail(f"{inside[0].kind} of {inside[0].detail} ran inside a capture")
    yield "every plan captured, no fallback"
    i = first_difference(gen.tokens, clean_tokens(backend))
    if i is not None:
        raise Fail(f"the tokens differ from the clean engine's from position {i}: every capture "
                   f"succeeded, but a first-use job marked done never ran (were the tables "
                   f"uploaded?)")
    yield "the clean engine's tokens"
    _long_case(pre_warm, backend)
    yield f"a model of {LONG_SEQ} positions: every plan captured, the clean engine's tokens"


EXERCISE = Exercise(
    "prewarm", 4, "pre-warm the lazy table and scratch so every plan captures", "§3", STATEMENT,
    STUB, ("pre_warm",), cases, REFERENCE,
    {"one eager step": (ONE_EAGER_STEP, "Plans with splits [2, 4] were not pre-warmed"),
     "scratch only": (SCRATCH_ONLY, "host-to-device copy into rope_cos"),
     "flag only": (FLAG_ONLY, "never ran"),
     "boundaries hard-coded": (HARD_CODED, "a model of 256 positions")},
    stub_says='were not pre-warmed')
