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

import math
from collections import Counter

import numpy as np

from lab.engine.runner import DecodeEngine
from lab.engine.step import Step
from lab.measure import bench
from lab.teach.exercise import Exercise, Fail, Source
from lab.measure.replay_check import replay_check
from .base import need, variant, watched
from .fixtures import PROMPT, TOKENS, cfg, engine, small_model, two_layer_model

STATEMENT = """
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

The check (on a model of two layers): one more launch per layer; each layer's launches take
that layer's weights; tokens and logits identical to the one-kernel combine's, eagerly and across
4 replays; the lab's kernels at your grids and blocks, at every plan (a grid may follow
plan.splits), on numba's CUDA simulator (a laptop runs them there): each element written by
exactly one thread, the bits of the lab's geometry; then the extra launch's price, eager and
captured. Calling Step.merge_then_project (the lab's own split) fails the check.
"""

STUB = '''
from kernels import attention, matvec
from lab import Step, launch


class SplitCombine(Step):
    def combine(self, plan, layer, part_o, part_ml):
        """Merge the partials into o, then x += Wo o: two launches."""
        # FILL ME IN
        yield from super().combine(plan, layer, part_o, part_ml)     # still one kernel
'''

REFERENCE = '''
from kernels import attention, matvec
from lab import Step, launch


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

# every layer projects through layer 0's Wo (the two-layer fixture decodes other tokens)
LAYER0_WO = variant(REFERENCE, 'self.dev.w[f"layers.{layer}.wo"]', 'self.dev.w["layers.0.wo"]')
# the merge on twice the blocks it has heads for: the extra blocks merge heads that do not exist
MERGE_TOO_WIDE = variant(REFERENCE, "attention.merge_grid(c.n_head, c.head_dim)",
                         "((2 * c.n_head,), (c.head_dim,))")
# the projection on one warp: one row of Wo o instead of d_model
ONE_WARP = variant(REFERENCE, "matvec.grid_for(c.d_model)", "((1,), (32,))")

REPS, BENCH_TOKENS = 3, 24
_REFS = (("lab.engine.step.Step.merge_then_project", Step.merge_then_project),)


def layer_weights(launches, reference_launches) -> str | None:
    """A launch of layer L that takes another layer's weights (an argument named layers.K.*,
    K != L), the reference's launch beside it: what is wrong, in words (None: nothing)."""
    for x in launches:
        if x.layer is None:
            continue
        for a in x.args:
            name = getattr(a, "name", "")
            if name.startswith("layers.") and name.split(".")[1] != str(x.layer):
                want = next((getattr(b, "name", "") for y in reference_launches
                             if y.layer == x.layer and y.name == x.name for b in y.args
                             if getattr(b, "name", "").startswith("layers.")), "")
                return (f"layer {x.layer}'s {x.name} takes {name}" +
                        (f" where the lab's takes {want}" if want else "") +
                        f": each layer uses its own layer's weights "
                        f"(self.dev.w[f\"layers.{{layer}}.wo\"])")
    return None


def argument_fault(launches, reference_launches, kernel_names) -> str | None:
    """The first launch of `kernel_names` (any layer) whose arguments are not the lab's: a
    buffer, a view or a value in another's place, in words (None: the lab's arguments)."""
    def shown(a) -> str:
        label = getattr(a, "label", None)
        return label if label is not None else repr(a.item() if hasattr(a, "item") else a)

    mine = [x for x in launches if x.name in kernel_names]
    theirs = [y for y in reference_launches if y.name in kernel_names]
    for x, y in zip(mine, theirs):
        if x.name != y.name or x.layer != y.layer:
            continue
        params = getattr(y.kernel, "arg_names", ())
        for j, (a, b) in enumerate(zip(x.args, y.args)):
            if shown(a) != shown(b) or np.asarray(a).dtype != np.asarray(b).dtype:
                what = f"{params[j]}, " if j < len(params) else ""
                return (f"layer {x.layer}'s {x.name} takes {shown(a)} as its argument {j + 1} "
                        f"({what}in the kernel's order {', '.join(params)}) where the lab's "
                        f"takes {shown(b)}: pass the buffers and values the statement names, "
                        f"each in its place")
        if len(x.args) != len(y.args):
            return (f"layer {x.layer}'s {x.name} takes {len(x.args)} arguments, the lab's "
                    f"{len(y.args)}: pass the ones the statement names")
    return None


def lab_grids(split, ref, kernel_names, refs, where: str, warm_tokens: int = 3) -> str:
    """The lab's kernels `kernel_names` of the student's layer 0 (engine `split`; `ref`: the
    same model with the reference's step), each launched at the student's grid and block on
    numba's CUDA simulator (tiny shapes: the fixture model) beside the same kernel at the
    reference's grid and block, on the reference engine's buffers after a few decoded tokens
    (pure outputs filled with a sentinel): each element the reference writes written by exactly
    one thread, the reference's bits. Every plan of the model is looked at (a grid may follow
    the plan's splits); a geometry is run at the first plan where it differs from the lab's.
    A launch at the reference's own geometry is the reference's: it is not run again (and when
    all are, nothing runs). Returns the case's name; a Fail names the first mistake."""
    from lab.plan import plan_boundaries

    def differing(plan):
        mine = [x for x in watched(refs, split.step_launches, plan, what="your step")
                if x.layer == 0 and x.name in kernel_names]
        theirs = [x for x in ref.step_launches(plan) if x.layer == 0 and x.name in kernel_names]
        return [(x, y) for x, y in zip(mine, theirs) if x.name == y.name and (
            _dims(x.grid), _dims(x.block)) != (_dims(y.grid), _dims(y.block))]

    starts = [0, *plan_boundaries(split.model.cfg.max_seq)]
    seen, ran, first = set(), 0, split.plan(0)
    for start in starts:
        pairs = [(x, y) for x, y in differing(split.plan(start))
                 if (x.name, _dims(x.grid), _dims(x.block)) not in seen]
        if not pairs:
            continue
        # the reference engine decoded into this plan: its buffers are the kernels' inputs
        ref.reset(ref.encode(PROMPT))
        while ref.position < start or ref.position < warm_tokens:
            ref.step()
        plan = ref.plan(ref.position)
        pairs = [(x, y) for x, y in differing(plan)
                 if (x.name, _dims(x.grid), _dims(x.block)) not in seen]
        _simulate_pairs(ref, pairs, plan, first)
        seen |= {(x.name, _dims(x.grid), _dims(x.block)) for x, _ in pairs}
        ran += len(pairs)
    if not ran:
        return f"{where}: your grids and blocks are the lab's"
    return (f"{where}: the lab's kernels at your grids on numba's CUDA simulator, each element "
            f"written once, the lab's bits")


def _simulate_pairs(eng, pairs, plan, first) -> None:
    """Each (yours, the lab's) launch pair of one kernel run on the simulator at both
    geometries, on the lab's arguments (engine `eng`'s buffers), at `plan`: a Fail naming the
    first difference (`first`: the first plan of a decode)."""
    import kernels
    from kernels import cudasim
    from .base import geometry_fault, simulate
    arrays, launches = {}, []
    for i, (x, y) in enumerate(pairs):
        registered = kernels.REGISTRY[x.name]
        pure = set(registered.writes) - set(registered.reads)
        keys = []
        for j, a in enumerate(y.args):
            if hasattr(a, "shape") and hasattr(a, "name"):
                value = eng.backend.download(a)
                arrays[f"{i}.{j}"] = cudasim.sentinel_like(value) if j in pure else value
                keys.append(f"{i}.{j}")
            else:
                keys.append((a.item() if hasattr(a, "item") else a, np.asarray(a).dtype.name))
        watch = tuple(j for j in registered.writes)
        for who, z in (("yours", x), ("the lab's", y)):
            launches.append(cudasim.Launch(f"{x.name} at {who} grid", f"registry:{x.name}",
                                           z.grid, z.block, keys, watch))
    results = simulate(launches, arrays, what="the lab's kernels at your grids")
    for i, (x, y) in enumerate(pairs):
        got, ref = results[2 * i], results[2 * i + 1]
        registered = kernels.REGISTRY[x.name]
        names = [getattr(a, "name", f"argument {j}") for j, a in enumerate(y.args)]
        pure = tuple(set(registered.writes) - set(registered.reads))
        fault = geometry_fault(f"the lab's {x.name}", x.grid, x.block, got, ref, names, None,
                               pure)
        if not fault:
            differ = [names[j] for j in got.arrays if j in ref.arrays and
                      got.arrays[j].tobytes() != ref.arrays[j].tobytes()]
            if differ:
                fault = (f"the lab's {x.name} at grid {tuple(x.grid)} x block {tuple(x.block)} "
                         f"leaves other bits in {', '.join(differ)} than at the lab's geometry: "
                         f"the grid and block decide which thread does which part of the work")
        if fault:
            later = ("" if plan.key == first.key else
                     f"; at the plans before this one your {x.name} had the lab's geometry: a "
                     f"grid must follow the plan (plan.splits) at every plan, not only the first")
            raise Fail(f"on numba's CUDA simulator (a plan of {plan.splits} attention "
                       f"split{'' if plan.splits == 1 else 's'}), "
                       f"{fault} (the lab launches {x.name} at grid {tuple(y.grid)} x block "
                       f"{tuple(y.block)}{_which_dims(x, y) or later})")


def _which_dims(x, y) -> str:
    """Words for a geometry whose dimensions are the lab's in another order."""
    g, b, rg, rb = (_dims(v) for v in (x.grid, x.block, y.grid, y.block))
    if (g, b) == (rb, rg):
        return "; yours has the grid and the block swapped"
    if b == rb and sorted(g) == sorted(rg):
        return (f"; your grid has the lab's sizes in another order: its dimensions x, y, z "
                f"each index one part of the work (blockIdx.x, .y, .z), the order matters")
    if g == rg and sorted(b) == sorted(rb):
        return "; your block has the lab's sizes in another order: the order matters"
    if b != rb:
        return (f"; your block of {math.prod(b)} threads is not the lab's {math.prod(rb)}: the "
                f"lab's kernel splits each block's work among the threads it was written for")
    return ""


def _why(split, ref, kernel_names) -> str:
    """': ' and the first argument of the split not the lab's, or '' (none)."""
    plan = ref.plan(0)
    words = argument_fault(split.step_launches(plan), ref.step_launches(plan), kernel_names)
    return f": {words}" if words else ""


def _dims(d) -> tuple:
    d = tuple(int(v) for v in d)
    return d + (1,) * (3 - len(d))


def missing_or_extra(names, expected, one: str) -> str | None:
    """What a layer's launches `names` lack or add against `expected`, in words (None: the same
    kernels, whatever their order); `one`: what the split is, for the message."""
    lack = list((Counter(expected) - Counter(names)).elements())
    more = list((Counter(names) - Counter(expected)).elements())
    if lack:
        return (f"a layer's launches are {names}: {' and '.join(lack)} "
                f"{'is' if len(lack) == 1 else 'are'} missing{_also(more)} -- {one}")
    if more:
        return (f"a layer's launches are {names}: {' and '.join(more)} one time too many -- "
                f"{one}")
    return None


def _also(more) -> str:
    return f" ({' and '.join(more)} in {'its' if len(more) == 1 else 'their'} place)" if more \
        else ""


def _sequence(names: list[str], clean: list[str]) -> None:
    """Fail naming the mistake when a layer's launches are not the clean step's with
    attn_combine replaced by attn_merge then matvec_residual."""
    if names == clean:
        raise Fail(f"a layer issues {len(names)} launches, the one-kernel combine {len(clean)}: "
                   f"the split is one more (attn_merge, then the Wo projection)")
    if "attn_combine" in names:
        raise Fail(f"a layer's launches are {names}: attn_combine is still there; replace it by "
                   f"attn_merge + the projection")
    at = clean.index("attn_combine")
    expected = clean[:at] + ["attn_merge", "matvec_residual"] + clean[at + 1:]
    lack, more = Counter(expected) - Counter(names), Counter(names) - Counter(expected)
    if lack["matvec_residual"] and more["matvec"]:
        raise Fail(f"a layer's launches are {names}: after attn_merge comes matvec: the "
                   f"projection must ADD into x, the residual (matvec_residual), as attn_combine "
                   f"does")
    words = missing_or_extra(names, expected, "the split is attn_merge (the partials merged "
                             "into o), then matvec_residual (x += Wo o), where attn_combine was")
    if words:
        raise Fail(words)
    if names != expected:
        merge = names.index("attn_merge")
        why = ("the projection runs BEFORE the merge: it reads the o of the step before"
               if names[merge - 1] == "matvec_residual" else
               f"attn_merge then matvec_residual, in attn_combine's place")
        raise Fail(f"the split's order is {names}: {why}")


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
    model = two_layer_model()
    split = watched(_REFS, engine, backend, graph=False, step=cls, model=model,
                    what="building SplitCombine")
    names = watched(_REFS, launch_names, split, what="SplitCombine.combine")
    clean = launch_names(engine(backend, graph=False, model=model))
    _sequence(names, clean)
    yield "one more launch per layer: attn_merge, then matvec_residual"
    ref = engine(backend, graph=False, model=model,
                 step=Source(REFERENCE, "fission reference").namespace().SplitCombine)
    wrong = layer_weights(split.step_launches(split.plan(0)), ref.step_launches(ref.plan(0)))
    if wrong:
        raise Fail(wrong)
    yield "each layer's launches take their own layer's weights (a model of two layers)"
    yield lab_grids(engine(backend, graph=False, step=cls, model=model), ref,
                    {"attn_merge", "matvec_residual"}, _REFS, "attn_merge and matvec_residual")
    one = engine(backend, graph=False, model=model).generate(PROMPT, TOKENS)
    gen = watched(_REFS, split.generate, PROMPT, TOKENS, what="generating with SplitCombine")
    if list(gen.tokens) != list(one.tokens):
        raise Fail("the split decodes other tokens than the one-kernel combine" + _why(
            split, ref, {"attn_merge", "matvec_residual"}))
    rep = watched(_REFS, replay_check, engine(backend, step=cls, model=model), [PROMPT],
                  replays=4, what="replay_check")
    if not rep.ok:
        raise Fail(f"replays of the split differ from its eager steps: {rep.summary()}")
    yield "the one-kernel combine's tokens; 4 replays byte-identical"
    cost = price(backend, cls)
    print(f"fission re-measured ({backend}, {REPS} interleaved reps): the split's extra launch "
          f"costs {cost['eager']:+.1f} us/token eagerly, {cost['captured']:+.1f} us/token "
          f"captured")     # a report: what the launch costs here, for the student to read


EXERCISE = Exercise(
    "fission", 9, "split the combine; re-measure the split under capture", "§6", STATEMENT, STUB,
    ("SplitCombine",), cases, REFERENCE,
    {"no residual": (NO_RESIDUAL, "must ADD into x"),
     "project first": (PROJECT_FIRST, "BEFORE the merge"),
     "layer 0's Wo": (LAYER0_WO, "layer 1's matvec_residual takes layers.0.wo"),
     "merge too wide": (MERGE_TOO_WIDE, "attn_merge at grid (4,) x block (16,) reads or writes "
                                        "out of bounds"),
     "one warp": (ONE_WARP, "unwritten")},
    stub_says="the split is one more", simulator=True)
