"""The kernel exercises run the student's numba.cuda kernel itself, on a laptop: under numba's
CUDA simulator (kernels/cudasim.py, a child process with the flag set before numba is imported),
at the launch's grid and block, each element's writers counted. `advance` and `accept` hold the
student's kernel to the reference kernel and to its own twin; `fission` and `fission_fused`
run the lab's kernels at the grids the student picks. Each mistake class (an empty kernel, a
guard on a thread the launch lacks, a race inside a block, two blocks doing one element's work,
a grid that leaves work undone or reads past its data, another layer's weights) has a known
wrong solution in its exercise's `wrong` list, which tests/teach/test_handson.py runs; here: the
simulator's write counts themselves, correct kernels written otherwise than the references,
the progress shown while a check runs, and a solution that allocates without bound.
"""
import shutil
import textwrap

import numpy as np
import pytest

from kernels import cudasim
from lab.teach import handson
from lab.teach.handson import base

EXERCISES = handson.EXERCISES


def _check(name, text, **kw):
    return handson.check(name, handson.Source(text, f"{name} test"), echo=False, **kw)


# ---- the simulator's child and its write counts ------------------------------------------------
SOURCE = '''
from numba import cuda

LIMIT = 3


@cuda.jit(device=True)
def bump(a, i):
    a[i] = a[i] + 1


def one_writer(a):
    if cuda.grid(1) == 0:
        bump(a, 0)


def every_thread(a):
    a[0] += 1


def per_block(a):
    if cuda.threadIdx.x == 0:
        a[0] = cuda.blockIdx.x


def rows(a):
    i = cuda.grid(1)
    if i < LIMIT:
        a[i] = i


def past_the_end(a):
    a[cuda.grid(1)] = 1


def lacks(a):
    a[0] = cuda.activemask()
'''


def test_the_simulator_counts_each_element_s_writers_and_names_what_it_lacks():
    """One child, every launch on fresh copies: distinct threads (and blocks) per element, an
    exception with its thread, a part of CUDA the simulator lacks by name; kernels defined by a
    source text (a device function and a constant of it included) or by the registry."""
    sim = cudasim.Simulator(server=base._fork_server())   # a forked child where there can be
    seen = []
    sim.progress = lambda done, total, label: seen.append((done, total))
    a = np.zeros(4, np.int32)
    L = cudasim.Launch
    try:
        got = sim.run([L("one", "one_writer", (2,), (32,), ["a"], (0,)),
                       L("race", "every_thread", (1,), (8,), ["a"], (0,)),
                       L("blocks", "per_block", (3,), (4,), ["a"], (0,)),
                       L("rows", "rows", (1,), (8,), ["a"], (0,)),
                       L("past", "past_the_end", (1,), (8,), ["a"], (0,)),
                       L("lacks", "lacks", (1,), (1,), ["a"], (0,)),
                       L("advance", "registry:advance", (1,), (1,), ["a"], (0,))],
                      {"a": a}, SOURCE)
    finally:
        sim.close()
        shutil.rmtree(sim.scratch, ignore_errors=True)
    one, race, blocks, rows, past, lacks, adv = got
    assert one.arrays[0].tolist() == [1, 0, 0, 0] and one.threads[0].tolist() == [1, 0, 0, 0]
    assert race.threads[0][0] == 8 and race.blocks[0][0] == 1
    assert blocks.threads[0][0] == 3 and blocks.blocks[0][0] == 3
    assert rows.threads[0].tolist() == [1, 1, 1, 0] and rows.arrays[0].tolist() == [0, 1, 2, 0]
    assert "IndexError" in past.error and "tid=[4, 0, 0]" in past.error and not past.missing
    assert lacks.missing == "cuda.activemask"
    assert adv.arrays[0].tolist() == [1, 0, 0, 0] and adv.threads[0].tolist() == [1, 0, 0, 0]
    assert seen[-1] == (7, 7)
    assert a.tolist() == [0, 0, 0, 0]                      # the caller's arrays untouched


def test_a_launch_s_faults_are_named_in_words():
    """geometry_fault on results as the simulator returns them: each fault class in words."""
    def res(threads, blocks=None, arrays=None, **kw):
        t = np.array(threads, np.int32)
        return cudasim.Result("x", {0: np.array(arrays or [0] * t.size, np.int32)}, {0: t},
                              {0: np.array(blocks or [min(v, 1) for v in threads], np.int32)},
                              **kw)
    ref = res([1, 1, 0], arrays=[5, 6, 0])

    def fault(got, **kw):
        return base.geometry_fault("k", (1,), (32,), got, ref, ["out"], **kw)
    assert fault(res([1, 1, 0], arrays=[5, 6, 0])) is None
    assert "a race inside a block" in fault(res([3, 1, 0]))
    assert "in 2 different blocks" in fault(res([2, 1, 0], [2, 1, 0]))
    assert "k is empty: it writes nothing" in fault(res([0, 0, 0]), empty=True)
    assert "writes nothing: no thread of the launch reached a write" in fault(res([0, 0, 0]))
    assert "out[1] unwritten" in fault(res([1, 0, 0], arrays=[5, 0, 0]))
    assert "which the reference leaves alone" in fault(res([1, 1, 1], arrays=[5, 6, 9]))
    assert fault(res([1, 1, 1], arrays=[5, 6, 0])) is None        # the same value: harmless
    assert "a prompt" in fault(res([1, 1, 1], arrays=[5, 6, 0]),
                               protect={0: (np.array([0, 0, 1], bool), "a prompt position")})
    assert "does not have" in fault(res([0, 0, 0], missing="cuda.activemask"))
    assert "out of bounds" in fault(res([0, 0, 0], error="IndexError: index 9 is out of bounds"))


def test_a_notebook_kernel_reaches_the_simulator_with_what_it_uses(tmp_path):
    """kernel_source: the kernel without its decorator, the solution's device functions with
    theirs, its modules and constants; read through inspect, as from a file or a notebook."""
    path = tmp_path / "cell.py"
    path.write_text(SOURCE)
    ns = {}
    exec(compile(SOURCE, str(path), "exec"), ns)
    text, name = base.kernel_source(ns["one_writer"])
    assert name == "one_writer" and "def bump" in text and "@cuda.jit(device=True)" in text
    assert "import numba.cuda as cuda" in text and "def rows" not in text
    text, _ = base.kernel_source(ns["rows"])
    assert "LIMIT = 3" in text


# ---- the exercises: the mistake classes, and correct kernels written otherwise -----------------
CLASSES = {   # mistake class -> (exercise, known wrong solution) it is proven by
    "an empty kernel": [("advance", "empty kernel"), ("accept", "empty kernel")],
    "a guard on a thread the launch lacks": [("advance", "wrong thread"),
                                             ("accept", "wrong thread")],
    "a race inside a block": [("advance", "no guard"), ("accept", "every thread")],
    "two blocks doing one element": [("advance", "two blocks"), ("accept", "two blocks")],
    "the kernel's values, not the twin's": [("accept", "kernel off by one")],
    "a grid that leaves work undone": [("fission", "one warp"), ("fission_fused", "one warp")],
    "a grid wider than the work": [("fission", "merge too wide"),
                                   ("fission_fused", "merge too wide")],
    "another layer's weights": [("fission", "layer 0's Wo"), ("fission_fused", "layer 0's Wo")],
}


def test_every_mistake_class_has_a_known_wrong_solution():
    """tests/teach/test_handson.py runs each exercise's wrong solutions and holds each verdict to its
    words; these are the kernel classes among them."""
    for cls, where in CLASSES.items():
        for name, mistake in where:
            assert mistake in EXERCISES[name].wrong, (cls, name, mistake)


ADVANCE_GRID = EXERCISES["advance"].reference.replace(
    "if cuda.threadIdx.x == 0 and cuda.blockIdx.x == 0:   # one writer, however wide the launch",
    "if cuda.grid(1) == 0:").replace("((1,), (1,))", "((2,), (64,))")

ACCEPT_EARLY_RETURN = EXERCISES["accept"].reference.replace(
    "if cuda.threadIdx.x != 0 or cuda.blockIdx.x != 0:    # one thread does the work",
    "if cuda.grid(1) > 0:").replace("((1,), (1,))", "((1,), (32,))").replace(
    "    g = q - max(p + 1, n_p) + 1\n    if g > 0:\n        stats[0] += 1\n        stats[1] += g\n"
    "\n\nclass", "    g = q - max(p + 1, n_p) + 1\n    stats[0] += 1 if g > 0 else 0\n"
    "    stats[1] += max(g, 0)\n\n\nclass")

FISSION_WIDE = EXERCISES["fission"].reference.replace(
    "matvec.grid_for(c.d_model)", "((c.d_model // 4 + 2,), (128,))")


@pytest.mark.parametrize("name,text", [("advance", ADVANCE_GRID), ("accept", ACCEPT_EARLY_RETURN)],
                         ids=["advance-grid guard", "accept-early return"])
def test_correct_kernels_written_otherwise_pass(name, text, capsys):
    """A guard on cuda.grid(1) over a wider launch; an early return, and a stats update that
    writes an unchanged value: right, and they pass -- with the simulator's progress shown on
    stderr while it runs, and the one-line verdict last."""
    assert text != EXERCISES[name].reference
    res = handson.check(name, handson.Source(text, f"{name} otherwise"))
    out, err = capsys.readouterr()
    assert res.passed, res.message
    assert out.rstrip().splitlines()[-1] == res.line()
    assert f"{name} on numba's CUDA simulator" in err and "launches [00:" in err


def test_the_lab_s_kernel_on_more_blocks_than_rows_is_right(tmp_path, monkeypatch):
    """fission's grid check on a projection over more blocks than Wo has rows (the lab's
    kernel guards the extra warps off): run on the simulator beside the lab's grid, and right.
    (The step called in this process, not in a check's child: the rest of the check is the
    reference's.)"""
    from lab.teach.handson import fission
    from lab.teach.handson.fixtures import engine, two_layer_model
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(base, "_SIM", {"server": base._fork_server()})
    steps = [handson.Source(text, label).namespace().SplitCombine for text, label in (
        (FISSION_WIDE, "fission wide"), (EXERCISES["fission"].reference, "fission reference"))]
    wide, ref = (engine("sim", graph=False, step=s, model=two_layer_model()) for s in steps)
    try:
        case = fission.lab_grids(wide, ref, {"attn_merge", "matvec_residual"}, (), "the split")
    finally:
        if "sim" in base._SIM:
            base._SIM["sim"].close()
    assert "each element written once" in case


def test_a_kernel_using_what_the_simulator_lacks_gets_one_line():
    text = EXERCISES["advance"].reference.replace(
        "        pos[0] += 1\n\n\nclass", "        pos[0] += 1 + 0 * cuda.activemask()\n\n\nclass")
    res = _check("advance", text)
    assert not res.passed and "uses cuda.activemask, which numba's CUDA simulator does not " \
                               "have" in res.message
    assert "\n" not in res.line()


# ---- bad input: memory without bound -------------------------------------------------------------
BOMB = textwrap.dedent("""
    import numpy as np

    def pre_warm(engine):
        kept = []
        while True:
            kept.append(np.ones(8_000_000))
""")


def test_a_solution_that_allocates_without_bound_is_stopped(tmp_path, capsys):
    """The address-space limit in the check's process: a MemoryError, reported in one line
    (and a non-zero exit on the command line, as for an endless loop)."""
    from lab.__main__ import main
    path = tmp_path / "bomb.py"
    path.write_text(BOMB.replace("np.ones", "np.empty"))   # address space only: quick
    assert main(["exercise", "check", "prewarm", "--solution", str(path), "--backend", "sim"]) == 1
    line = capsys.readouterr().out.strip()
    assert "grew past 2 GiB of memory (the solution allocates without bound?)" in line
    assert "\n" not in line


def test_where_no_address_space_limit_holds_the_parent_stops_the_check(monkeypatch):
    """macOS does not enforce RLIMIT_AS: the parent watches the child's resident memory."""
    monkeypatch.setattr(cudasim, "limit_memory", lambda budget=0: False)   # the child inherits it
    monkeypatch.setattr(base, "MEMORY_BUDGET", 256 << 20)
    res = _check("prewarm", BOMB)
    assert not res.passed and "grew past 0.25 GiB of memory" in res.message


def test_numba_compiles_under_the_memory_limit():
    """The limit leaves room for numba's LLVM: a solution that compiles with numba.njit in the
    check's process passes."""
    text = EXERCISES["prewarm"].reference + textwrap.dedent("""
        import numba

        @numba.njit(cache=False)
        def _square(v):
            return v * v

        assert _square(7) == 49
    """)
    res = _check("prewarm", text)
    assert res.passed, res.message
