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

from lab.teach.audit import detect_lazy_init
from .base import Exercise, Fail, need, watched
from .fixtures import PROMPT, TOKENS, clean_tokens, engine, first_difference

SPEC = """
Lazy initialisation -- do it on first use, cache it for ever -- is invisible eagerly and illegal
inside a capture (a synchronous copy, an allocation that grows a pool). Pre-warm all of it.

Write pre_warm(engine): called once, after the engine is built and before its first step. The
engine's step (engine.pieces) uploads its RoPE tables on first use and grows its attention
scratch when a plan needs more splits than it has. Each such first-use job is yielded by the
step as a lab.engine.step.HostWork item (engine.pieces.items(plan) yields the step's items in order;
HostWork.run() does the job). Make every plan the engine will meet capturable: the plan at
position 0 and the one after each of lab.plan.plan_boundaries(engine.model.cfg.max_seq).

The check: a graph generation across every plan boundary with no fallback in the ledger, no
host operation issued inside a capture, and the clean engine's tokens.
"""

STUB = '''
from lab.engine.step import HostWork
from lab.plan import plan_boundaries


def pre_warm(engine):
    """Run every first-use initialisation of engine's step, outside any capture."""
    # FILL ME IN
    pass
'''

REFERENCE = '''
from lab.engine.step import HostWork
from lab.plan import plan_boundaries


def pre_warm(engine):
    for position in [0, *plan_boundaries(engine.model.cfg.max_seq)]:
        for item in engine.pieces.items(engine.plan(position)):   # lazily: a job runs as met
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

_REFS = (("lab.teach.audit.detect_lazy_init", detect_lazy_init),)
LAZY = {"lazy_table", "lazy_scratch"}


def cases(sol, backend):
    (pre_warm,) = need(sol, ("pre_warm",))
    eng = engine(backend, bugs=LAZY)
    watched(_REFS, pre_warm, eng, what="pre_warm")
    if eng.backend.is_capturing():
        raise Fail("pre_warm left a capture open")
    yield "pre_warm ran"
    n_ops = len(eng.backend.ops)
    gen = watched(_REFS, eng.generate, PROMPT, TOKENS, what="generating after pre_warm")
    fell = [e for e in eng.ledger if e.outcome == "fallback"]
    if fell:
        e = fell[0]
        missed = sorted({int(x.plan_key[1]) for x in fell})
        raise Fail(f"the capture at position {e.position} (splits {e.plan_key[1]}) fell back to "
                   f"eager: {e.reason}. Plans with splits {missed} were not pre-warmed: run "
                   f"every first-use job of every plan the engine will meet, before the first "
                   f"capture")
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


EXERCISE = Exercise(
    "prewarm", 4, "pre-warm the lazy table and scratch so every plan captures", "§3", SPEC, STUB,
    ("pre_warm",), cases, REFERENCE,
    {"one eager step": (ONE_EAGER_STEP, "Plans with splits [2, 4] were not pre-warmed"),
     "scratch only": (SCRATCH_ONLY, "host-to-device copy into rope_cos"),
     "flag only": (FLAG_ONLY, "never ran")},
    stub_says='were not pre-warmed')
