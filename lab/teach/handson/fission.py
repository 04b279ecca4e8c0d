"""Checklist step 9, revisit the optimisations rejected because "it adds a launch": split the
attention combine into two kernels and re-measure the split under capture.

The student writes the fission as a step variant, `SplitCombine(Step)` overriding `combine`: the
merge of the split-K partials into the attention output, then the output projection adding into
the residual -- in that order, with the same summation order as the one-kernel combine, so the
split is bit-identical to it. The check runs it in real engines: one more launch per layer, the
one-kernel engine's tokens and logits to the bit, eagerly and replayed; then it times both forms
eagerly and under capture (interleaved reps) and shows what the extra launch costs in each.
"""
from __future__ import annotations

from lab.engine.runner import DecodeEngine
from lab.engine.step import Step
from lab.measure import bench
from lab.teach.verify import replay_check
from .base import Exercise, Fail, need, variant, watched
from .fixtures import PROMPT, TOKENS, cfg, engine, small_model

SPEC = """
Graph capture changes which optimisations pay: a kernel split rejected because its extra launch
cost host time costs only a graph node once the step is captured. Splitting need not move bits:
keep the accumulation order across the seam.

Write SplitCombine(Step) overriding combine(self, plan, layer, part_o, part_ml) -- a generator of
launches (lab.engine.step.launch(kernel, (grid, block), args, layer)) -- as two kernels where the
clean step has one (kernels.attention.attn_combine):
  1. kernels.attention.attn_merge on attention.merge_grid(n_head, head_dim), args
     (part_o, part_ml, self.dev.buf.o): the merged attention output o [d_model]
  2. x += Wo o: kernels.matvec.matvec_residual on matvec.grid_for(d_model), args
     (self.dev.w[f"layers.{layer}.wo"], self.dev.buf.o, self.dev.buf.x)
(self.engine.model.cfg holds n_head, head_dim, d_model.)

The check: one more launch per layer; tokens and logits identical to the one-kernel combine's,
eagerly and across 4 replays; then the extra launch's price, eager and captured. Calling
Step.merge_then_project (the lab's own split) fails the check.
"""

STUB = '''
from kernels import attention, matvec
from lab.engine.step import Step, launch


class SplitCombine(Step):
    def combine(self, plan, layer, part_o, part_ml):
        """Merge the partials into o, then x += Wo o: two launches."""
        # FILL ME IN
        yield from super().combine(plan, layer, part_o, part_ml)     # still one kernel
'''

REFERENCE = '''
from kernels import attention, matvec
from lab.engine.step import Step, launch


class SplitCombine(Step):
    def combine(self, plan, layer, part_o, part_ml):
        c, b = self.engine.model.cfg, self.dev.buf
        yield launch(attention.attn_merge, attention.merge_grid(c.n_head, c.head_dim),
                     (part_o, part_ml, b.o), layer)
        yield launch(matvec.matvec_residual, matvec.grid_for(c.d_model),
                     (self.dev.w[f"layers.{layer}.wo"], b.o, b.x), layer)
'''

# the projection overwrites x instead of adding into it
NO_RESIDUAL = variant(REFERENCE, "launch(matvec.matvec_residual,", "launch(matvec.matvec,")
# the projection issued before the merge: it reads last step's o
PROJECT_FIRST = variant(REFERENCE, '''        yield launch(attention.attn_merge, attention.merge_grid(c.n_head, c.head_dim),
                     (part_o, part_ml, b.o), layer)
        yield launch(matvec.matvec_residual, matvec.grid_for(c.d_model),
                     (self.dev.w[f"layers.{layer}.wo"], b.o, b.x), layer)''', '''        yield launch(matvec.matvec_residual, matvec.grid_for(c.d_model),
                     (self.dev.w[f"layers.{layer}.wo"], b.o, b.x), layer)
        yield launch(attention.attn_merge, attention.merge_grid(c.n_head, c.head_dim),
                     (part_o, part_ml, b.o), layer)''')

REPS, BENCH_TOKENS = 3, 24
_REFS = (("lab.engine.step.Step.merge_then_project", Step.merge_then_project),)


def launch_names(eng, layer=0) -> list[str]:
    """The kernel names of one layer of the engine's first plan's step."""
    return [x.name for x in eng.step_launches(eng.plan(0)) if x.layer == layer]


def price(backend, cls, base=Step, **toggles) -> dict:
    """us/token step class `cls` adds over `base`, eagerly and captured (interleaved reps on
    four engines of the small model; `toggles`: LabConfig fields both sides share)."""
    arms = []
    for i, (graph, step) in enumerate(((False, base), (False, cls), (True, base), (True, cls))):
        c = cfg(backend, graph=graph, **toggles)
        be = bench.default_backend(c, i)
        arms.append(bench.Arm(f"{step.__name__}, graph={graph}", c,
                              DecodeEngine(small_model(), c, backend=be, step=step)))
    bench.interleave(arms, REPS, bench.decode_run(PROMPT, BENCH_TOKENS))
    mean = [sum(a.ms) / len(a.ms) for a in arms]
    return {"eager": 1000 * (mean[1] - mean[0]), "captured": 1000 * (mean[3] - mean[2])}


def cases(sol, backend):
    (cls,) = need(sol, ("SplitCombine",))
    if not (isinstance(cls, type) and issubclass(cls, Step)):
        raise Fail(f"SplitCombine is a {type(cls).__name__}: make it a subclass of "
                   "lab.engine.step.Step")
    split = watched(_REFS, engine, backend, graph=False, step=cls, what="building SplitCombine")
    names, clean = launch_names(split), launch_names(engine(backend, graph=False))
    if len(names) != len(clean) + 1:
        raise Fail(f"a layer issues {len(names)} launches, the one-kernel combine {len(clean)}: "
                   f"the split is one more (attn_merge, then the Wo projection)")
    if "attn_combine" in names or "attn_merge" not in names:
        raise Fail(f"a layer's launches are {names}: replace attn_combine by attn_merge + the "
                   f"projection")
    merge = names.index("attn_merge")
    if names[merge + 1] != "matvec_residual":
        why = ("the projection runs BEFORE the merge: it reads the o of the step before"
               if names[merge - 1] == "matvec_residual" else
               f"after attn_merge comes {names[merge + 1]}: the projection must ADD into x, "
               f"the residual (matvec_residual), as attn_combine does")
        raise Fail(f"the split's order is {names}: {why}")
    yield "one more launch per layer: attn_merge, then matvec_residual"
    one = engine(backend, graph=False).generate(PROMPT, TOKENS)
    gen = watched(_REFS, split.generate, PROMPT, TOKENS, what="generating with SplitCombine")
    if list(gen.tokens) != list(one.tokens):
        raise Fail("the split decodes other tokens than the one-kernel combine")
    rep = watched(_REFS, replay_check, engine(backend, step=cls), [PROMPT], replays=4,
                  what="replay_check")
    if not rep.ok:
        raise Fail(f"replays of the split differ from its eager steps: {rep.summary()}")
    yield "the one-kernel combine's tokens; 4 replays byte-identical"
    cost = price(backend, cls)
    print(f"fission re-measured ({backend}, {REPS} interleaved reps): the split's extra launch "
          f"costs {cost['eager']:+.1f} us/token eagerly, {cost['captured']:+.1f} us/token "
          f"captured")     # a report: what the launch costs here, for the student to read


EXERCISE = Exercise(
    "fission", 9, "split the combine; re-measure the split under capture", "§6", SPEC, STUB,
    ("SplitCombine",), cases, REFERENCE,
    {"no residual": (NO_RESIDUAL, "must ADD into x"),
     "project first": (PROJECT_FIRST, "BEFORE the merge")},
    stub_says="the split is one more")
