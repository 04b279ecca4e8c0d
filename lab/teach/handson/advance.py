"""Checklist step 3, the state update: a device-side position advance that the graph replays.

The student writes the kernel (its numba source and its NumPy twin, as kernels/position.py does)
and the step piece that launches it (`advance`, the last piece of Step.head). The check runs
that step in the real engine: eager steps must leave the device position equal to the host's,
no host write of the position may happen during a step, nothing the host computes per step may
reach the launch, the kernel itself (not only its twin, which is what the engine runs on a
laptop) must advance pos with exactly one writer on numba's CUDA simulator, at the student's
launch and at a wider one (one writer however wide the launch), and graph replays must decode
the clean engine's tokens replay after replay.
"""
from __future__ import annotations

import numpy as np

import kernels
from kernels import position
from lab.backend import Buffer
from lab.engine.step import Step
from lab.errors import DeviceFault
from lab.teach.exercise import Exercise, Fail, Source
from lab.measure.replay_check import replay_check
from .base import hold_kernel, need, variant, watched
from .fixtures import PROMPT, TOKENS, boundary_prompt, clean_tokens, engine, first_difference

STATEMENT = """
A replayed graph reruns the same launches with the same arguments: replayed as it was captured,
it decodes the same token again. Something must change the position between replays. This lab
keeps the position in device memory and increments it with a kernel inside the captured step, so
one graph replays step after step with no host work at all; this exercise asks for that design.
(It is not the only valid one: another design updates device state, or a graph node's
parameters, between launches -- the host then does that work before every replay.)

Write three things:
  advance_twin(grid, block, pos)  the NumPy twin of your kernel: what the engine runs for one
                                  launch on the sim backend (it mutates `pos`, an int32 array
                                  of 1, in place)
  advance_kernel(pos)             the numba.cuda source of the same kernel (what a GPU runs,
                                  and this check on numba's CUDA simulator), declared with
                                  lab.teach.handson.kernel(...) and your twin
  AdvanceStep(Step)               the clean step with its `advance()` piece returning the
                                  launch(es) of your kernel: lab.engine.step.launch(kern,
                                  (grid, block), args). The position lives in self.dev.buf.pos.

The kernel must be right however wide it is launched: guard the write so that exactly one
thread of any launch writes pos[0].

The check: 5 eager steps leave pos[0] == 5; no upload of pos during a step; no argument the host
computes per step; your kernel itself on numba's CUDA simulator (a laptop runs it there), at your
launch's grid and block and again on 2 blocks of 32 threads: pos[0] one further, written by
exactly one thread of the launch, as your twin says; graph replays decode the clean engine's
tokens across plan boundaries, and a 4-replay byte comparison with the eager path passes.
Calling kernels.position (the lab's own kernel) or Step.advance fails the check.
"""

STUB = '''
import numpy as np
from numba import cuda

from lab import Step, launch
from lab.teach.handson import kernel


def advance_twin(grid, block, pos):
    """pos: int32[1] in device memory. The step's last kernel: one token further."""
    # FILL ME IN
    pass


@kernel("void(int32[::1])", twin=advance_twin, reads=(0,), writes=(0,))
def advance_kernel(pos):
    # FILL ME IN (numba.cuda: cuda.threadIdx.x, cuda.blockIdx.x)
    pass


class AdvanceStep(Step):
    def advance(self):
        """The launches that advance the device-resident position (self.dev.buf.pos)."""
        # FILL ME IN: return [launch(advance_kernel, ((1,), (1,)), (self.dev.buf.pos,))]
        return []
'''

REFERENCE = '''
from numba import cuda

from lab import Step, launch
from lab.teach.handson import kernel


def advance_twin(grid, block, pos):
    pos[0] += 1


@kernel("void(int32[::1])", twin=advance_twin, reads=(0,), writes=(0,))
def advance_kernel(pos):
    if cuda.threadIdx.x == 0 and cuda.blockIdx.x == 0:   # one writer, however wide the launch
        pos[0] += 1


class AdvanceStep(Step):
    def advance(self):
        return [launch(advance_kernel, ((1,), (1,)), (self.dev.buf.pos,))]
'''

# the host writes the position before each step, no kernel advances it (LAB_BUG_POS_OUTSIDE_GRAPH)
HOST_WRITE = '''
import numpy as np
from lab import Step


class AdvanceStep(Step):
    rebuilt_each_step = True

    def prelude(self, plan):
        self.dev.backend.upload(self.dev.buf.pos, np.array([plan.position], np.int32))

    def advance(self):
        return []
'''

# the new position computed on the host and passed by value: a replay writes the captured one
BY_VALUE = '''
import numpy as np
from numba import cuda

from lab import Step, launch
from lab.teach.handson import kernel


def set_twin(grid, block, pos, value):
    pos[0] = value


@kernel("void(int32[::1], int32)", twin=set_twin, reads=(), writes=(0,))
def set_position(pos, value):
    if cuda.threadIdx.x == 0 and cuda.blockIdx.x == 0:
        pos[0] = value


class AdvanceStep(Step):
    rebuilt_each_step = True

    def advance(self):
        return [launch(set_position, ((1,), (1,)),
                       (self.dev.buf.pos, np.int32(self.engine.position + 1)))]
'''

# every thread of a 32-thread launch adds 1 (the twin models what the GPU would do)
EVERY_THREAD = '''
from numba import cuda

from lab import Step, launch
from lab.teach.handson import kernel


def advance_twin(grid, block, pos):
    for _ in range(grid[0] * block[0]):       # every thread of the launch
        pos[0] += 1


@kernel("void(int32[::1])", twin=advance_twin, reads=(0,), writes=(0,))
def advance_kernel(pos):
    cuda.atomic.add(pos, 0, 1)


class AdvanceStep(Step):
    def advance(self):
        return [launch(advance_kernel, ((1,), (32,)), (self.dev.buf.pos,))]
'''

# the kernel body left empty: the twin advances pos, so the engine on a laptop (which runs the
# twin) decodes right; the GPU would run the kernel, which writes nothing
_BODY = REFERENCE[REFERENCE.index("    if cuda.threadIdx.x == 0 and cuda.blockIdx.x == 0:"):
                  REFERENCE.index("        pos[0] += 1\n") + len("        pos[0] += 1\n")]
EMPTY_KERNEL = variant(REFERENCE, _BODY, "    pass\n")
# guarded on the thread only, launched on two blocks: thread 0 of EACH block adds 1
TWO_BLOCKS = variant(variant(REFERENCE, "if cuda.threadIdx.x == 0 and cuda.blockIdx.x == 0:",
                             "if cuda.threadIdx.x == 0:"),
                     "launch(advance_kernel, ((1,), (1,))", "launch(advance_kernel, ((2,), (1,))")
# no guard at all on a 32-thread block: 32 threads add 1 to one element
NO_GUARD = variant(variant(REFERENCE, _BODY, "    pos[0] += 1\n"),
                   "launch(advance_kernel, ((1,), (1,))", "launch(advance_kernel, ((1,), (32,))")
# the guard names a thread the launch does not have (block of 1 thread: only thread 0)
WRONG_THREAD = variant(REFERENCE, "cuda.threadIdx.x == 0 and", "cuda.threadIdx.x == 1 and")

_REFS = (("kernels.position.advance_twin", position.advance_twin),
         ("lab.engine.step.Step.advance", Step.advance))


def _step_class(sol):
    (cls,) = need(sol, ("AdvanceStep",))
    if not (isinstance(cls, type) and issubclass(cls, Step)):
        raise Fail(f"AdvanceStep is a {type(cls).__name__}: make it a subclass of "
                   "lab.engine.step.Step")
    return cls


def _warmed(eng):
    """The solution's kernels compiled before any step (a GPU compiles outside captures)."""
    eng.backend.warm_up({x.kernel for x in eng.step_launches(eng.plan(0))})
    return eng


def _per_step_values(eng) -> list[str]:
    """The advance launches' by-value arguments that differ between two positions of one plan."""
    out = []
    for pos in (10, 11):
        eng.track_position(pos, 0)
        out.append([a for x in eng.step_launches(eng.plan(pos))[-3:] for a in x.args
                    if not isinstance(a, Buffer)])
    eng.track_position(0, 0)
    return [f"{a!r}, then {b!r}" for a, b in zip(*out) if str(a) != str(b)]


_KERNEL_CASES = (0, 31, 100)     # pos[0] before the launch (31: the last step of a plan)
WIDE = ((2,), (32,))             # a launch wider than the reference's: still exactly one writer
_WIDE_NOTE = ("a launch wider than the reference's: the kernel must be right however wide it is "
              "launched; guard the write so that exactly one thread of any launch writes it")


def _advance_items(eng, cls) -> list:
    """What AdvanceStep.advance() returns, as a list; a Fail naming a return that is not one."""
    items = watched(_REFS, lambda: cls(eng).advance(), what="AdvanceStep.advance")
    if items is None:
        raise Fail("AdvanceStep.advance() returned None: return the list of its launches, "
                   "[launch(advance_kernel, (grid, block), (self.dev.buf.pos,))]")
    if not hasattr(items, "__iter__"):
        raise Fail(f"AdvanceStep.advance() returned a {type(items).__name__}, not a list of "
                   f"launches: return [launch(advance_kernel, (grid, block), "
                   f"(self.dev.buf.pos,))]")
    return watched(_REFS, list, items, what="AdvanceStep.advance")


def _on_pos(items) -> list:
    """The launches among `items` that take the position buffer."""
    return [x for x in items if any(getattr(a, "name", "") == "pos"
                                    for a in getattr(x, "args", ()))]


def _moved_wrong(k: int, dev: int, items, backend: str) -> str:
    """Why the device position after eager step k is `dev`, in words."""
    moved = dev - (k - 1)
    runs = (" (on the sim backend the engine runs your kernel's NumPy twin, not the kernel)"
            if backend == "sim" else "")
    if moved == 0:
        why = ("nothing advances pos[0] inside the step: launch a kernel that adds 1 to it in "
               "advance()")
    elif moved > 1 and len(_on_pos(items)) > 1:
        why = (f"pos moved by {moved} in one step: advance() launches {len(_on_pos(items))} "
               f"kernels on pos, each adding 1: one launch, one thread of it adds 1")
    elif moved > 1:
        why = f"pos moved by {moved} in one step: exactly one thread of the launch may add 1"
    else:
        why = (f"pos moved by {moved} in one step (backwards, or set to a value of its own): "
               f"the step adds exactly 1 to the position it reads")
    return f"after {k} eager step(s) the device position is {dev}, expected {k}: {why}{runs}"


def _kernel_case(eng, cls) -> str:
    """The student's advance launch(es), their own kernel at their own grid and block, on
    numba's CUDA simulator beside the lab's reference kernel: one further, one writer."""
    items = _advance_items(eng, cls)
    ref = Source(REFERENCE, "advance reference").namespace().advance_kernel
    checked = 0
    for x in items:
        kern = getattr(x, "kernel", None)
        if not callable(getattr(kern, "twin", None)) or kern.name in kernels.REGISTRY:
            continue
        names = [getattr(a, "name", f"argument {j}") for j, a in enumerate(x.args)]
        if "pos" not in names:
            continue
        at = names.index("pos")

        def args(p):
            return [np.array([p], np.int32) if j == at else
                    eng.backend.download(a) if isinstance(a, Buffer) else a
                    for j, a in enumerate(x.args)]

        def diagnose(cname, after, at=at):
            p = int(cname.split()[1])
            got = int(after[at][0])
            how = ("did not move: nothing was added" if got == p else
                   f"moved by {got - p}: one too many" if got == p + 2 else
                   f"moved by {got - p}: too many (several writers adding 1?)" if got > p else
                   f"moved by {got - p}: backwards, or set to a value of its own")
            return (f"case '{cname}': pos[0] went from {p} to {got}, the reference kernel's to "
                    f"{p + 1}; it {how}: the kernel must add exactly 1 to the position it reads")
        cases = [(f"pos {p}", args(p)) for p in _KERNEL_CASES]
        cases.append((f"pos 7 on {WIDE[0][0]} blocks of {WIDE[1][0]} threads", args(7),
                      (*WIDE, _WIDE_NOTE)))
        checked += hold_kernel(kern, x.grid, x.block, cases, ref, (1,), (1,), names, _REFS,
                               diagnose, ref_index=[at])
    if not checked:
        raise Fail("advance() launches no kernel of yours on pos: launch advance_kernel, "
                   "declared with lab.teach.handson.kernel(...)")
    return (f"your kernel on numba's CUDA simulator at its launch's geometry and on "
            f"{WIDE[0][0]} blocks of {WIDE[1][0]} threads: {checked} cases, one writer, the "
            f"reference's and the twin's values")


def cases(sol, backend):
    cls = _step_class(sol)
    items = _advance_items(engine(backend, graph=False), cls)   # before an engine runs them
    eng = watched(_REFS, lambda: _warmed(engine(backend, graph=False, step=cls)),
                  what="building the engine with AdvanceStep")
    eng.reset(eng.encode(PROMPT))
    n_ops = len(eng.backend.ops)

    def step(k):
        try:
            eng.step()
            return eng.device_position()
        except DeviceFault as exc:
            raise Fail(f"eager step {k} faulted: a launch of it reads or writes out of bounds, "
                       f"an illegal address on a GPU ({exc}) -- pos holds one element, pos[0]"
                       + ("; on the sim backend the engine runs your kernel's NumPy twin: look "
                          "at its indexing" if backend == "sim" else "")) from None
    for k in range(1, 6):
        dev = watched(_REFS, step, k, what="an eager step of AdvanceStep")
        writes = [o for o in eng.backend.ops[n_ops:]
                  if o.kind == "upload" and o.detail.startswith("pos")]
        if writes:
            raise Fail(f"the host writes the position during the step (an upload into pos in "
                       f"eager step {k}): a graph replay never re-runs a host write; advance "
                       f"pos with a kernel inside the step")
        if dev != k:
            raise Fail(_moved_wrong(k, dev, items, backend))
    yield "5 eager steps advance pos[0] to 5"
    varying = _per_step_values(eng)
    if varying:
        raise Fail(f"the advance launch takes a value the host computes per step ({varying[0]}): "
                   f"a graph replays the value it captured; read pos on the device and add 1 there")
    yield "no per-step host value reaches the advance launch"
    yield _kernel_case(eng, cls)
    geng = _warmed(engine(backend, step=cls))
    gen = watched(_REFS, geng.generate, PROMPT, TOKENS, what="generating with graphs")
    i = first_difference(gen.tokens, clean_tokens(backend))
    if i is not None:
        raise Fail(f"graph replays decode other tokens than the clean engine from position {i}")
    if geng.ledger_summary().get("replay", 0) == 0:
        raise Fail(f"no step was a graph replay (ledger {geng.ledger_summary()})")
    yield f"{TOKENS} tokens as graph replays, the clean engine's"
    rep = watched(_REFS, replay_check, _warmed(engine(backend, step=cls)),
                  [eng.encode(PROMPT), boundary_prompt()], replays=4, what="replay_check")
    if not rep.ok:
        raise Fail(f"replays differ from the eager path: {rep.summary().splitlines()[-1].strip()}")
    yield "4 replays byte-identical to eager, two prompts"


EXERCISE = Exercise(
    "advance", 3, "a device-side position advance that the graph replays", "§2", STATEMENT, STUB,
    ("AdvanceStep",), cases, REFERENCE,
    {"host write": (HOST_WRITE, "host writes the position"),
     "by value": (BY_VALUE, "value the host computes per step"),
     "every thread": (EVERY_THREAD, "exactly one thread"),
     "empty kernel": (EMPTY_KERNEL, "advance_kernel is empty: it writes nothing"),
     "two blocks": (TWO_BLOCKS, "written by 2 threads in 2 different blocks"),
     "no guard": (NO_GUARD, "a race inside a block"),
     "wrong thread": (WRONG_THREAD, "writes nothing: no thread of the launch reached a write")},
    stub_says='nothing advances pos[0]', simulator=True)
