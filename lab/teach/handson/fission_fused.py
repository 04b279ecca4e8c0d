"""Checklist step 9, the lecture's §6 case: a one-kernel design that is right eagerly and wrong
under capture. The fused step's heads-tail attention (`attn_fused`, LAB_FUSION=1 with
LAB_ATTN_TAIL=heads) computes the split-K
partials, then its last blocks merge each head, project it through Wo and add the heads into the
residual: one launch, and a serial tail after the partials. The student splits it into its three
phases as launches of their own, keeping its bits, and the check shows the split LOSE eagerly
(two more host submits per layer on a host-bound step) and WIN captured (two more graph nodes,
less than the tail they remove).

The student writes `SplitAttention(FusedStep)` overriding `attend`. The check runs it in real
engines: the fused step's tokens and logits to the bit, eagerly and across 4 replays, then both
forms timed eagerly and captured (interleaved reps), and the split must pay only under capture.
"""
from __future__ import annotations

from lab.engine.step import FusedStep
from lab.teach.exercise import Exercise, Fail, Source
from lab.measure.replay_check import decode_after_prompt, replay_check
from .base import need, variant, watched
from .fission import (REPS, argument_fault, lab_grids, launch_names, layer_weights,
                      missing_or_extra, price)
from .fixtures import PROMPT, TOKENS, engine, prompt_ids, two_layer_model

# the fused step whose attention this exercise splits: LAB_FUSION=1 with the heads tail
HEADS = dict(fusion=True, attn_tail="heads")

STATEMENT = """
Lecture §6: a single kernel can be the right design eagerly and the wrong one captured. The
fused step's attention with LAB_ATTN_TAIL=heads (kernels.fused.attn_fused) does three things in
one launch: each block (h, s) writes its slice's softmax partials; the last block of each head
merges that head and projects it through its columns of Wo; the last head adds the heads, in
head order, into x. Its tail runs after the partials on a few blocks. Split it into three
launches that keep its bits:

Write SplitAttention(FusedStep) overriding attend(self, plan, layer, part_o, part_ml, scale) --
a generator of launches (lab.engine.step.launch(kernel, (grid, block), args, layer)):
  1. kernels.fused_split.attn_partial_wide on
     kernels.fused.attention_grid(n_head, plan.splits, head_dim), args
     (b.q, b.k_cache[layer], b.v_cache[layer], b.pos, part_o, part_ml, scale): attn_fused's
     partial phase, its summation order
  2. kernels.attention.attn_merge on attention.merge_grid(n_head, head_dim), args
     (part_o, part_ml, b.o): the merged attention output o [d_model]
  3. kernels.fused_split.attn_project_heads on kernels.fused.project_grid(d_model), args
     (self.dev.w[f"layers.{layer}.wo"], b.o, b.x, np.int32(head_dim)): each head's Wo columns
     dotted with its o, the heads summed in head order, added into x
(b = self.dev.buf; self.engine.model.cfg holds n_head, head_dim, d_model.)

The check (on a model of two layers): two more launches per layer; each layer's launches take
that layer's weights; tokens and logits identical to attn_fused's, eagerly and across 4 replays;
the lab's kernels at your grids and blocks, at every plan (attn_partial_wide's grid follows
plan.splits), on numba's CUDA simulator (a laptop runs them there): each element written by
exactly one thread, the bits of the lab's geometry; then the split's
price, eager and captured: it must lose eagerly and win captured. Calling
FusedStep.attention_split (the lab's own split) fails the check.
"""

STUB = '''
import numpy as np

from kernels import attention, fused, fused_split
from lab import FusedStep, launch


class SplitAttention(FusedStep):
    def attend(self, plan, layer, part_o, part_ml, scale):
        """attn_fused's three phases as three launches: partials, merge, heads' projection."""
        # FILL ME IN
        yield from super().attend(plan, layer, part_o, part_ml, scale)    # still one kernel
'''

REFERENCE = '''
import numpy as np

from kernels import attention, fused, fused_split
from lab import FusedStep, launch


class SplitAttention(FusedStep):
    def attend(self, plan, layer, part_o, part_ml, scale):
        c, b = self.engine.model.cfg, self.dev.buf
        yield launch(fused_split.attn_partial_wide,
                     fused.attention_grid(c.n_head, plan.splits, c.head_dim),
                     (b.q, b.k_cache[layer], b.v_cache[layer], b.pos, part_o, part_ml, scale),
                     layer)
        yield launch(attention.attn_merge, attention.merge_grid(c.n_head, c.head_dim),
                     (part_o, part_ml, b.o), layer)
        yield launch(fused_split.attn_project_heads, fused.project_grid(c.d_model),
                     (self.dev.w[f"layers.{layer}.wo"], b.o, b.x, np.int32(c.head_dim)), layer)
'''

# the projection as one matvec over all of D: right maths, another summation order
WHOLE_MATVEC = variant(REFERENCE, '''        yield launch(fused_split.attn_project_heads, fused.project_grid(c.d_model),
                     (self.dev.w[f"layers.{layer}.wo"], b.o, b.x, np.int32(c.head_dim)), layer)''',
                       '''        from kernels import matvec
        yield launch(matvec.matvec_residual, matvec.grid_for(c.d_model),
                     (self.dev.w[f"layers.{layer}.wo"], b.o, b.x), layer)''')
# the unfused step's partials (128-thread blocks): another summation order than attn_fused's
NARROW_PARTIALS = variant(REFERENCE, '''        yield launch(fused_split.attn_partial_wide,
                     fused.attention_grid(c.n_head, plan.splits, c.head_dim),
                     (b.q, b.k_cache[layer], b.v_cache[layer], b.pos, part_o, part_ml, scale),
                     layer)''', '''        yield launch(attention.attn_partial, attention.partial_grid(c.n_head, plan.splits, c.head_dim),
                     (b.q, b.k_cache[layer], b.v_cache[layer], b.pos, part_o, part_ml, scale),
                     layer)''')
# the projection issued before the merge: it reads the o of the step before
PROJECT_FIRST = variant(REFERENCE, '''        yield launch(attention.attn_merge, attention.merge_grid(c.n_head, c.head_dim),
                     (part_o, part_ml, b.o), layer)
        yield launch(fused_split.attn_project_heads, fused.project_grid(c.d_model),
                     (self.dev.w[f"layers.{layer}.wo"], b.o, b.x, np.int32(c.head_dim)), layer)''',
                        '''        yield launch(fused_split.attn_project_heads, fused.project_grid(c.d_model),
                     (self.dev.w[f"layers.{layer}.wo"], b.o, b.x, np.int32(c.head_dim)), layer)
        yield launch(attention.attn_merge, attention.merge_grid(c.n_head, c.head_dim),
                     (part_o, part_ml, b.o), layer)''')

# every layer projects through layer 0's Wo (the two-layer fixture decodes other tokens)
LAYER0_WO = variant(REFERENCE, 'self.dev.w[f"layers.{layer}.wo"]', 'self.dev.w["layers.0.wo"]')
# the heads' projection on one warp: one row of x instead of d_model
ONE_WARP = variant(REFERENCE, "fused.project_grid(c.d_model)", "((1,), (32,))")
# the merge on twice the blocks it has heads for
MERGE_TOO_WIDE = variant(REFERENCE, "attention.merge_grid(c.n_head, c.head_dim)",
                         "((2 * c.n_head,), (c.head_dim,))")

SPLIT = ["attn_partial_wide", "attn_merge", "attn_project_heads"]
_REFS = (("lab.engine.step.FusedStep.attention_split", FusedStep.attention_split),)


def _order(names: list[str], clean: list[str]) -> None:
    """Fail naming the mistake when a layer's launches are not the fused step's with attn_fused
    replaced by the three phases, in order."""
    if names == clean:
        raise Fail(f"a layer issues {len(names)} launches, the fused step {len(clean)}: the "
                   f"split is three ({', '.join(SPLIT)}) where attn_fused is one")
    if "attn_fused" in names:
        raise Fail(f"a layer's launches are {names}: attn_fused is still there; the split is "
                   f"three launches ({', '.join(SPLIT)}) in its place")
    if "attn_partial" in names:
        raise Fail("attn_partial is the unfused step's partial (128-thread blocks): it sums in "
                   "another order than attn_fused's partial phase; use "
                   "fused_split.attn_partial_wide on fused.attention_grid")
    if "attn_merge" in names and "matvec_residual" in names[names.index("attn_merge"):][1:2]:
        raise Fail("the projection is one matvec_residual over all of d_model: another summation "
                   "order than attn_fused's, which sums each head's dot in head order; use "
                   "fused_split.attn_project_heads")
    at = clean.index("attn_fused")
    words = missing_or_extra(names, clean[:at] + SPLIT + clean[at + 1:],
                             f"the split is {', '.join(SPLIT)} (the partials, their merge into "
                             f"o, the heads' projection added into x), where attn_fused was")
    if words:
        raise Fail(words)
    phases = [n for n in names if n in SPLIT]
    if phases != SPLIT:
        why = ("the projection runs BEFORE the merge: it reads the o of the step before"
               if phases.index("attn_project_heads") < phases.index("attn_merge") else
               f"the three phases in order are {', '.join(SPLIT)}")
        raise Fail(f"a layer's split launches are {phases}: {why}")


def cases(sol, backend):
    (cls,) = need(sol, ("SplitAttention",))
    if not (isinstance(cls, type) and issubclass(cls, FusedStep)):
        raise Fail(f"SplitAttention is a {type(cls).__name__}: make it a subclass of "
                   "lab.engine.step.FusedStep")
    model = two_layer_model()
    split = watched(_REFS, engine, backend, graph=False, **HEADS, step=cls, model=model,
                    what="building SplitAttention")
    names = watched(_REFS, launch_names, split, what="SplitAttention.attend")
    clean = launch_names(engine(backend, graph=False, **HEADS, model=model))
    _order(names, clean)
    yield f"two more launches per layer: {', '.join(SPLIT)}"
    ref = engine(backend, graph=False, **HEADS, model=model,
                 step=Source(REFERENCE, "fission_fused reference").namespace().SplitAttention)
    wrong = layer_weights(split.step_launches(split.plan(0)), ref.step_launches(ref.plan(0)))
    if wrong:
        raise Fail(wrong)
    yield "each layer's launches take their own layer's weights (a model of two layers)"
    yield lab_grids(engine(backend, graph=False, **HEADS, step=cls, model=model), ref,
                    set(SPLIT), _REFS, ", ".join(SPLIT))
    ids = prompt_ids()
    one = decode_after_prompt(engine(backend, **HEADS, model=model), ids, TOKENS, graph=False)[0]
    mine = engine(backend, **HEADS, step=cls, model=model)
    got = watched(_REFS, decode_after_prompt, mine, ids, TOKENS, False,
                  what="decoding with SplitAttention")[0]
    if list(got.tokens) != list(one.tokens) or got.logits.tobytes() != one.logits.tobytes():
        args = argument_fault(mine.step_launches(mine.plan(0)), ref.step_launches(ref.plan(0)),
                              set(SPLIT))
        if list(got.tokens) != list(one.tokens):
            raise Fail("the split decodes other tokens than attn_fused" +
                       (f": {args}" if args else ""))
        raise Fail(f"the split's logits differ from attn_fused's in their bits: " + (
            args or "keep its summation order (its partials, the merge, the heads summed in "
                    "head order)"))
    rep = watched(_REFS, replay_check, engine(backend, **HEADS, step=cls, model=model),
                  [PROMPT], replays=4, what="replay_check")
    if not rep.ok:
        raise Fail(f"replays of the split differ from its eager steps: {rep.summary()}")
    yield "attn_fused's tokens and logits to the bit; 4 replays byte-identical"
    cost = price(backend, cls, base=FusedStep, **HEADS)
    where = "simulated" if backend == "sim" else "measured on the GPU"
    line = (f"the split costs {cost['eager']:+.1f} us/token eagerly and "
            f"{cost['captured']:+.1f} captured ({where}, {REPS} interleaved reps)")
    if not (cost["eager"] > 0 > cost["captured"]):
        raise Fail(f"{line}: expected a loss eagerly and a win captured")
    print(f"fission_fused: {line}")    # a report: the sign flip, for the student to read
    yield "a loss eagerly, a win captured"


EXERCISE = Exercise(
    "fission_fused", 9, "split the fused attention: it pays only under capture", "§6", STATEMENT,
    STUB, ("SplitAttention",), cases, REFERENCE,
    {"whole matvec": (WHOLE_MATVEC, "one matvec_residual over all of d_model"),
     "narrow partials": (NARROW_PARTIALS, "the unfused step's partial"),
     "project first": (PROJECT_FIRST, "BEFORE the merge"),
     "layer 0's Wo": (LAYER0_WO, "layer 1's attn_project_heads takes layers.0.wo"),
     "one warp": (ONE_WARP, "unwritten"),
     "merge too wide": (MERGE_TOO_WIDE, "attn_merge at grid (4,) x block (16,) reads or writes "
                                        "out of bounds")},
    stub_says="the split is three", simulator=True)
