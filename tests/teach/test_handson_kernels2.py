"""The kernel exercises' checks name the mistakes a student makes around the kernel: a kernel
right at its own launch but not at a wider one (`advance`: one writer however wide the launch),
launch() called with its arguments in each other's places, a lab helper given its values in
another order, a step's launch left out (named by its kernel), a buffer or value passed where
another goes, a grid that is the lab's at the first plan only, a grid whose dimensions are the
lab's in another order; and correct kernels written otherwise pass. The simulator's child runs
a block as large as the lab's kernels use (512 threads, under its memory limit).
"""
import types

import numpy as np
import pytest

from kernels import cudasim
from lab.teach import handson
from lab.teach.handson import base, fission

EXERCISES = handson.EXERCISES
ADVANCE, FISSION, FUSED = (EXERCISES[n].reference
                           for n in ("advance", "fission", "fission_fused"))
GUARD = ("    if cuda.threadIdx.x == 0 and cuda.blockIdx.x == 0:   # one writer, however wide "
         "the launch\n        pos[0] += 1\n")


def _check(name, text):
    return handson.check(name, handson.Source(text, f"{name} test"), echo=False)


def _advance(body, launch="((1,), (1,))"):
    return base.variant(base.variant(ADVANCE, GUARD, body), "((1,), (1,))", launch)


# ---- advance: right however wide the launch --------------------------------------------------
@pytest.mark.parametrize("text,words", [
    (_advance("    if cuda.threadIdx.x != 0:\n        return\n    pos[0] += 1\n", "((1,), (32,))"),
     "2 different blocks"),
    (_advance("    cuda.atomic.add(pos, 0, 1)\n"), "64 threads"),
], ids=["guard on the thread only", "an atomic add from every thread"])
def test_an_advance_kernel_right_only_at_its_own_launch_fails(text, words):
    """Right at the launch the student picked (one block; one thread), wrong at a wider one: the
    check runs the kernel on 2 blocks of 32 threads too, and says why."""
    res = _check("advance", text)
    assert not res.passed
    assert words in res.message and "however wide it is launched" in res.message, res.message


def test_an_advance_kernel_written_otherwise_passes():
    """An early return on cuda.grid(1), then an atomic add: one writer at any launch."""
    res = _check("advance", _advance(
        "    if cuda.grid(1) != 0:\n        return\n    cuda.atomic.add(pos, 0, 1)\n",
        "((1,), (64,))"))
    assert res.passed, res.message


def test_an_advance_that_returns_nothing_or_no_list_is_named():
    ret = "return [launch(advance_kernel, ((1,), (1,)), (self.dev.buf.pos,))]"
    res = _check("advance", ADVANCE.replace(ret, "launch(advance_kernel, ((1,), (1,)), "
                                                 "(self.dev.buf.pos,))"))
    assert not res.passed and "advance() returned None" in res.message, res.message
    res = _check("advance", ADVANCE.replace(ret, ret[:7] + ret[8:-1]))
    assert not res.passed and "returned a Launch, not a list" in res.message, res.message


# ---- launch() and the lab's helpers called wrong -----------------------------------------------
MERGE = "launch(attention.attn_merge, attention.merge_grid(c.n_head, c.head_dim),\n" \
        "                     (part_o, part_ml, b.o), layer)"


@pytest.mark.parametrize("swapped,words", [
    ("launch(attention.merge_grid(c.n_head, c.head_dim), attention.attn_merge,\n"
     "                     (part_o, part_ml, b.o), layer)", "its kernel and its (grid, block)"),
    ("launch(attention.attn_merge, (part_o, part_ml, b.o),\n"
     "                     attention.merge_grid(c.n_head, c.head_dim), layer)",
     "its (grid, block) and its args"),
    ("launch(attention.attn_merge, attention.merge_grid(c.n_head, c.head_dim),\n"
     "                     layer, (part_o, part_ml, b.o))", "its args and its layer"),
], ids=["kernel-geometry", "geometry-args", "args-layer"])
def test_launch_arguments_in_each_other_s_places_are_named(swapped, words):
    res = _check("fission", base.variant(FISSION, MERGE, swapped))
    assert not res.passed
    assert f"the arguments are in the wrong places -- {words} are swapped" in res.message, \
        res.message


def test_a_lab_helper_given_its_values_in_another_order_is_named():
    res = _check("fission_fused", base.variant(
        FUSED, "fused.attention_grid(c.n_head, plan.splits, c.head_dim)",
        "fused.attention_grid(c.n_head, c.head_dim, plan.splits)"))
    assert not res.passed
    assert "kernels.fused.attention_grid(n_head=2, splits=16, head_dim=1" in res.message
    assert "in its order (n_head, splits, head_dim" in res.message, res.message


def test_a_launch_fault_is_none_for_a_right_launch():
    from kernels import position
    assert base.launch_fault(position.advance, ((1,), (1,)), (object(),), None) is None
    assert "the grid and the block are each a tuple" in base.launch_fault(
        position.advance, (1, 1), (object(),), 0)


@pytest.mark.parametrize("name,gone,words", [
    ("fission", MERGE, "attn_merge is missing"),
    ("fission_fused", "launch(fused_split.attn_project_heads, fused.project_grid(c.d_model),\n"
     "                     (self.dev.w[f\"layers.{layer}.wo\"], b.o, b.x, np.int32(c.head_dim)), "
     "layer)", "attn_project_heads is missing"),
], ids=["fission", "fission_fused"])
def test_a_launch_left_out_is_named_by_its_kernel(name, gone, words):
    text = base.variant(EXERCISES[name].reference, "yield " + gone, "")
    res = _check(name, text)
    assert not res.passed and words in res.message, res.message


def test_a_buffer_passed_in_another_s_place_is_named():
    """attn_merge writing into x instead of o: other tokens, and the argument that is not the
    lab's, by its place and its parameter's name."""
    res = _check("fission", base.variant(FISSION, "(part_o, part_ml, b.o)",
                                         "(part_o, part_ml, b.x)"))
    assert not res.passed
    assert "attn_merge takes x as its argument 3 (o," in res.message, res.message


# ---- the grid: at every plan, in the lab's order ------------------------------------------------
def test_a_grid_that_is_the_lab_s_at_the_first_plan_only_fails():
    """A merge grid that grows with the plan's splits: the lab's at the first plan (1 split), too
    wide at the next: every plan's geometry is looked at."""
    res = _check("fission", base.variant(FISSION, "attention.merge_grid(c.n_head, c.head_dim)",
                                         "((c.n_head * plan.splits,), (c.head_dim,))"))
    assert not res.passed
    assert "a plan of 2 attention splits" in res.message
    assert "a grid must follow the plan" in res.message, res.message


def test_grid_dimensions_in_another_order_are_named():
    def x(grid, block):
        return types.SimpleNamespace(grid=grid, block=block)
    assert "swapped" in fission._which_dims(x((16,), (2,)), x((2,), (16,)))
    assert "another order" in fission._which_dims(x((1, 2), (512,)), x((2, 1), (512,)))
    assert "block of 64 threads" in fission._which_dims(x((16,), (64,)), x((8,), (128,)))
    assert fission._which_dims(x((9,), (128,)), x((8,), (128,))) == ""


def test_the_simulator_runs_a_block_of_512_threads():
    """attn_fused's blocks: each simulated thread is a Python thread, under the child's memory
    limit (a small stack each)."""
    sim = cudasim.Simulator(server=base._fork_server())
    src = "from numba import cuda\n\ndef k(a):\n    a[cuda.grid(1)] = cuda.threadIdx.x\n"
    try:
        (got,) = sim.run([cudasim.Launch("wide", "k", (1,), (512,), ["a"], (0,))],
                         {"a": np.zeros(512, np.int32)}, src, timeout_s=60)
    finally:
        sim.close()
    assert not got.error, got.error
    assert (got.arrays[0] == np.arange(512)).all() and (got.threads[0] == 1).all()
