"""The hands-on checks' machinery: where a solution comes from, the child process each check runs
in, and a solution's kernel on numba's CUDA simulator. The Exercise itself, its result, the
"did it call the reference?" watch and the case runner are lab/teach/exercise.py's.

  load_solution, need, watched    a solution as a namespace (a module, a notebook's globals(), a
                                  .py file, "module:ATTRIBUTE", a Source); its names; a call of it
  call_fault, launch_fault        what a call into the lab's code did wrong, in words
  kernel_source, simulate,        the solution's kernel as source for the simulator's child, run
  hold_kernel, geometry_fault     beside the reference kernel and held to its values and writes
  check_in_child                  one check in a child process: a time limit, a memory limit, a
                                  scratch folder; the lab's state untouched; one line of verdict
"""
from __future__ import annotations

import ast
import atexit
import importlib
import importlib.machinery
import importlib.util
import inspect
import io
import multiprocessing
import os
import shutil
import sys
import tempfile
import textwrap
import time
import types
from pathlib import Path
from typing import Callable

import numpy as np

from kernels import cudasim
from lab.errors import LabError
from lab.teach.exercise import (DEFAULT_TIMEOUT_S, CheckResult, Exercise, Fail, Source, run_cases,
                                watching)

__all__ = ["kernel", "issue", "variant", "load_solution", "check_in_child", "watched", "need",
           "GPU_TIMEOUT_S", "MEMORY_BUDGET", "kernel_source", "simulate", "hold_kernel",
           "geometry_fault", "SIM_NOTE", "call_fault", "launch_fault", "is_lab", "short"]

# On a GPU a check is a fresh process whose engines compile every kernel they launch before the
# first step, most of a check's time there: the limit is at least this, unless the student asks
# for another with --timeout
GPU_TIMEOUT_S = 420.0
MEMORY_BUDGET = 2 << 30       # bytes a check may allocate beyond what its process holds at start
_OUTPUT_KEPT = 4000           # characters of what the solution printed, sent back with the verdict
SIM_NOTE = ("numba's CUDA simulator runs the blocks of a launch one after another, so a race "
            "between blocks (one block reading what another writes) is not seen there")


def kernel(*signatures: str, twin: Callable, reads: tuple[int, ...], writes: tuple[int, ...]):
    """kernels/registry.py's `@kernel`, for a solution's own kernel: the same KernelSpec (numba
    source + NumPy twin), NOT entered in the lab's registry, so defining it twice (a notebook
    cell run again) is fine and the lab's kernel table stays as it was."""
    from kernels import KernelSpec

    def wrap(fn) -> KernelSpec:
        return KernelSpec(fn.__name__, fn, tuple(signatures), twin, tuple(reads), tuple(writes),
                          (fn.__doc__ or "").strip())
    return wrap


def variant(reference: str, old: str, new: str = "") -> str:
    """A known wrong solution written as its difference from the reference: `old` -> `new`."""
    if old not in reference:
        raise ValueError(f"not in the reference: {old!r}")
    return reference.replace(old, new)


def issue(engine, item) -> None:
    """Issue one item of a step on the engine's device, as the engine's issue loop does: a
    launch, a stream wait, or (a lazy step's) host work, which runs on the host right here."""
    engine.backend.issue(item)


# ---- where a solution comes from ---------------------------------------------------------------
def load_solution(solution):
    """The namespace of `solution`: an object as it is; a path to a .py file imported (any
    file name); "package.module:ATTRIBUTE" resolved. A file that fails to import is a LabError
    whose one line names the exception."""
    if isinstance(solution, Source):
        return solution.namespace()
    if isinstance(solution, dict):
        return types.SimpleNamespace(**solution)
    if isinstance(solution, (str, Path)) and str(solution).endswith(".py"):
        p = Path(solution)
        if not p.is_file():
            raise LabError(f"solution {solution}: no such file")
        loader = importlib.machinery.SourceFileLoader("handson_solution", str(p))
        spec = importlib.util.spec_from_loader(loader.name, loader)
        module = importlib.util.module_from_spec(spec)
        try:
            loader.exec_module(module)
        except (Exception, SystemExit) as exc:     # whatever the student's file raises
            raise LabError(f"solution {p.name} does not import: "
                           f"{' '.join(f'{type(exc).__name__}: {exc}'.split())}") from None
        return module
    if isinstance(solution, str) and ":" in solution:
        mod, _, attr = solution.partition(":")
        return getattr(importlib.import_module(mod), attr)
    if isinstance(solution, str):
        raise LabError(f"solution {solution!r}: give a .py file, a namespace, or module:ATTRIBUTE")
    return solution


def need(solution, names) -> list:
    """The named attributes of the solution, in order; a Fail naming the first one missing."""
    out = []
    for n in names:
        v = getattr(solution, n, None)
        if v is None:
            raise Fail(f"the solution defines no {n}: start from the stub "
                       f"(decode-lab exercise show ...)")
        out.append(v)
    return out


def watched(refs, fn, *args, what: str = "", **kwargs):
    """Run the solution's `fn` (or the engine driving it) while watching for `refs`, the lab's own
    code the check compares against ((name, function) pairs). An exception from the solution
    becomes a Fail naming it; so does a call of a reference."""
    failure = None
    with watching(refs) as used:
        try:
            out = fn(*args, **kwargs)
        except (Fail, MemoryError):    # a memory error is the check's to report (one line)
            raise
        except Exception as exc:       # the solution's bug, reported as a verdict
            who = what or getattr(fn, '__name__', 'the solution')
            wrong = call_fault(exc)
            failure = f"{who}: {wrong}" if wrong else \
                f"{who} raised {type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
    if used:
        raise Fail(f"{what or 'the solution'} called {' and '.join(used)}, the lab's own code "
                   f"that this check compares against: write it yourself")
    if failure:
        raise Fail(failure)
    return out


# ---- an exception the lab's code raised on the solution's call ----------------------------------
_LAB_DIRS = tuple(str(Path(__file__).resolve().parents[3] / d) + os.sep for d in ("lab", "kernels"))
_LAUNCH_FORM = "launch(kernel, (grid, block), args, layer)"


def is_lab(filename: str) -> bool:
    return os.path.abspath(filename).startswith(_LAB_DIRS)


def _is_solution(filename: str) -> bool:
    """A frame of the solution's own code: not the lab's, not Python's, not a package's."""
    if filename.startswith(("<frozen", "<string>")) or is_lab(filename):
        return False
    path = os.path.abspath(filename) if not filename.startswith("<") else filename
    prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    return not any(path.startswith(p + os.sep) for p in prefixes if p)


def _kind(v) -> str:
    """What a launch() argument is: a kernel, a (grid, block) pair, a tuple of arguments, a
    layer number (or None), something else."""
    def dims(d):
        return (isinstance(d, (tuple, list)) and 0 < len(d) <= 3
                and all(isinstance(i, (int, np.integer)) for i in d))
    if callable(getattr(v, "twin", None)) and hasattr(v, "name"):
        return "a kernel"
    if isinstance(v, (tuple, list)) and len(v) == 2 and all(dims(d) for d in v):
        return "a (grid, block) pair"
    if isinstance(v, (tuple, list)):
        return "a tuple of the kernel's arguments"
    if v is None or isinstance(v, (int, np.integer)):
        return "a layer number"
    return f"a {type(v).__name__}"


def launch_fault(kern, geometry, args, layer=None) -> str | None:
    """What is wrong with a call launch(kern, geometry, args, layer) (lab.engine.step.launch), in
    words: arguments in each other's places, a geometry that is not (grid, block); None when
    each argument is the kind its place takes."""
    want = ("a kernel", "a (grid, block) pair", "a tuple of the kernel's arguments",
            "a layer number")
    place = ("kernel", "(grid, block)", "args", "layer")
    got = tuple(_kind(v) for v in (kern, geometry, args, layer))
    wrong = [i for i in range(4) if got[i] != want[i]]
    if not wrong:
        return None
    if len(wrong) == 2 and got[wrong[0]] == want[wrong[1]] and got[wrong[1]] == want[wrong[0]]:
        i, j = wrong
        return (f"{_LAUNCH_FORM}: the arguments are in the wrong places -- its {place[i]} and "
                f"its {place[j]} are swapped (in the place of the {place[i]} it got "
                f"{got[i]})")
    i = wrong[0]
    if i == 1 and isinstance(geometry, (tuple, list)) and len(geometry) == 2:
        return (f"{_LAUNCH_FORM}: its (grid, block) argument is {geometry!r}: the grid and the "
                f"block are each a tuple of ints, e.g. ((n_blocks,), (threads,))")
    return (f"{_LAUNCH_FORM}: argument {i + 1} (the {place[i]}) is {got[i]}, where {want[i]} "
            f"goes: the arguments are in the wrong places")


def traceback_frames(exc: BaseException) -> list[tuple]:
    """(frame, last instruction, line) of each frame `exc` passed through, outermost first."""
    out, tb = [], exc.__traceback__
    while tb is not None:
        out.append((tb.tb_frame, tb.tb_lasti, tb.tb_lineno))
        tb = tb.tb_next
    return out


def solution_frames(frames: list[tuple]) -> list[int]:
    """The indices of the solution's own frames among `frames` (traceback_frames)."""
    return [i for i, (f, _, _) in enumerate(frames) if _is_solution(f.f_code.co_filename)]


def lab_call(callee) -> tuple[str, str, list[str]]:
    """A lab function's frame as the solution called it: its qualified name, the values it was
    given by name ("kern=..., grid=..."), and its parameters in order (no self)."""
    code, loc = callee.f_code, callee.f_locals
    params = [p for p in code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
              if p != "self"]
    shown = ", ".join(f"{p}={short(loc[p])}" for p in params if p in loc)
    return f"{callee.f_globals.get('__name__', '')}.{code.co_name}", shown, params


def call_fault(exc: BaseException) -> str | None:
    """When `exc` was raised inside the lab's code called directly by the solution's (a
    launch(), a grid helper), what the call did wrong, in words: the launch's arguments
    in the wrong places, or (a TypeError or ValueError) the lab function, the values it was
    given by name, and its parameters' order. None when the exception is the solution's own,
    or the lab's own error (a LabError says what happened in its own words)."""
    frames = traceback_frames(exc)
    mine = solution_frames(frames)
    if not mine or mine[-1] + 1 >= len(frames):
        return None
    caller, callee = frames[mine[-1]][0], frames[mine[-1] + 1][0]
    if not is_lab(callee.f_code.co_filename):
        return None
    code, loc = callee.f_code, callee.f_locals
    if code.co_name == "launch" and code.co_filename.endswith(os.path.join("engine", "step.py")):
        words = launch_fault(loc.get("kern"), loc.get("geometry"), loc.get("args"),
                             loc.get("layer"))
        if words:
            return words
    if not isinstance(exc, (TypeError, ValueError)) or isinstance(exc, LabError):
        return None          # not a refused argument: the lab's own words say what happened
    name, shown, params = lab_call(callee)
    return (f"{name}({shown}), called by your {caller.f_code.co_name}, "
            f"refused it ({type(exc).__name__}: {' '.join(str(exc).split())[:160]}): check the "
            f"values you pass it, in its order ({', '.join(params)})")


def short(v, n: int = 40) -> str:
    text = repr(v)
    return text if len(text) <= n else text[:n - 3] + "..."


# ---- the solution's kernel on numba's CUDA simulator -------------------------------------------
def _is_empty(fn) -> bool:
    """Is the function's body nothing but a docstring, pass or ...?"""
    try:
        node = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0]
    except (OSError, TypeError, SyntaxError, IndexError):
        return False
    return all(isinstance(st, ast.Pass) or (isinstance(st, ast.Expr) and isinstance(
        st.value, ast.Constant)) for st in node.body)


def kernel_source(kern) -> tuple[str, str]:
    """(source text, name): the solution's kernel `kern` (a KernelSpec or a function) as Python
    source the simulator's child can run -- its own definition (decorators left out: the child
    compiles it), the functions of the solution it calls (device functions keep their
    cuda.jit), and imports or values for every other global name it uses. Read through inspect:
    a .py file, a notebook cell and a Source alike."""
    fn = getattr(kern, "py_func", kern)
    home = getattr(fn, "__globals__", {})
    defs: list[str] = []
    header: list[str] = []
    seen: set[str] = set()

    def names_of(code) -> set[str]:
        out = set(code.co_names)
        for c in code.co_consts:
            if isinstance(c, types.CodeType):
                out |= names_of(c)
        return out

    def define(f, keep_decorators: bool) -> None:
        try:
            src = textwrap.dedent(inspect.getsource(f))
        except (OSError, TypeError):
            raise Fail(f"the source of {f.__name__} cannot be read (define it in a .py file or "
                       f"a notebook cell), so it cannot run on numba's CUDA simulator") from None
        node = ast.parse(src).body[0]
        if not keep_decorators:
            node.decorator_list = []
        defs.append(ast.unparse(node))
        for name in sorted(names_of(f.__code__)):
            use(name)

    def use(name: str) -> None:
        if name in seen or name not in home:
            return
        seen.add(name)
        obj = home[name]
        inner = getattr(obj, "py_func", obj)
        if isinstance(obj, types.ModuleType):
            header.append(f"import {obj.__name__} as {name}")
        elif getattr(inner, "__globals__", None) is home and callable(inner):
            define(inner, keep_decorators=True)        # the solution's own (device) function
        elif isinstance(obj, (bool, int, float, str, type(None))) or (
                isinstance(obj, tuple) and all(isinstance(v, (bool, int, float)) for v in obj)):
            header.append(f"{name} = {obj!r}")
        elif isinstance(obj, np.generic):
            header.append(f"import numpy\n{name} = numpy.{obj.dtype.name}({obj.item()!r})")
        else:
            mod, qual = getattr(inner, "__module__", None), getattr(inner, "__qualname__", None)
            if mod and qual and "<" not in qual and mod != home.get("__name__"):
                header.append(f"from {mod} import {qual} as {name}")
            else:
                try:
                    import numba
                    if getattr(numba, str(obj), None) is obj:      # numba.float32 and the like
                        header.append(f"from numba import {obj} as {name}")
                except Exception:   # noqa: BLE001 -- not a numba type: left for the child to miss
                    pass

    define(fn, keep_decorators=False)
    return "\n".join(header + [""] + defs[::-1]) + "\n", fn.__name__


_SIM: dict = {}               # the check's simulator child, and how to report its progress


_FORK: dict = {}              # the parent's fork server (Linux): a simulator child per check


def _simulator() -> cudasim.Simulator:
    if "sim" not in _SIM:
        _SIM["sim"] = cudasim.Simulator(scratch=os.getcwd(), progress=_SIM.get("progress"),
                                        memory=MEMORY_BUDGET, server=_SIM.get("server"))
    return _SIM["sim"]


def _fork_server() -> str | None:
    """The address of this process's simulator fork server, started on first use (None where
    there is none: each check's simulator is then a fresh interpreter)."""
    if not cudasim.can_fork_server():
        return None
    server = _FORK.get("server")
    if server is None or not server.alive():
        try:
            server = _FORK["server"] = cudasim.ForkServer()
        except (OSError, RuntimeError):
            return None
        atexit.register(server.close)
    return server.address


def simulate(launches: list, arrays: dict, source: str = "", what: str = "the kernel") -> list:
    """Run `launches` (kernels.cudasim.Launch) under numba's CUDA simulator, in the check's one
    child (started on the first call); a Fail naming an endless loop or a crash."""
    left = _SIM.get("deadline", time.monotonic() + DEFAULT_TIMEOUT_S) - time.monotonic()
    limit = max(5.0, left - 3.0)
    try:
        return _simulator().run(launches, arrays, source, timeout_s=limit)
    except cudasim.SimulatorTimeout:
        raise Fail(f"{what} did not finish within {limit:.0f} s on numba's CUDA simulator (an "
                   f"endless loop in the kernel, or a grid far larger than the work?)") from None
    except cudasim.SimulatorDied as exc:
        raise Fail(f"numba's CUDA simulator stopped while running {what} ({exc})") from None


def _where(a: np.ndarray, mask: np.ndarray, name: str, limit: int = 4) -> str:
    idx = [tuple(int(v) for v in i) for i in np.argwhere(mask)[:limit]]
    text = ", ".join(f"{name}[{', '.join(map(str, i))}]" for i in idx)
    more = int(mask.sum()) - len(idx)
    return text + (f" and {more} more" if more > 0 else "")


def geometry_fault(kname: str, grid, block, got, ref, arg_names, protect=None,
                   pure=(), empty: bool = False, phases=(1, 2)) -> str | None:
    """What is wrong with the writes of a launch of `kname` at (grid, block) -- `got`, a
    kernels.cudasim.Result -- against the reference's launch `ref` on the same inputs (None:
    nothing): a launch that raised, an element written by several threads, a kernel that writes
    nothing, elements the reference writes that are left unwritten, elements written that the
    reference leaves alone (changed, in a pure output, or in `protect`: {arg: (mask, why)}).
    Phase 1 is the first three, phase 2 the last two (a caller may name wrong values between)."""
    at = f"{kname} at grid {tuple(grid)} x block {tuple(block)}"
    if 1 in phases:
        fault = _launch_fault(kname, at, grid, block, got, ref, arg_names, empty)
        if fault or 2 not in phases:
            return fault
    return _element_fault(at, got, ref, arg_names, protect, pure)


def _launch_fault(kname, at, grid, block, got, ref, arg_names, empty) -> str | None:
    if got.missing:
        return (f"{kname} uses {got.missing}, which numba's CUDA simulator does not have: this "
                f"laptop check cannot run it; write the kernel without it, or check on a GPU "
                f"(--backend cuda)")
    if got.error:
        if "out of bounds" in got.error or "IndexError" in got.error:
            return (f"{at} reads or writes out of bounds ({got.error}): a grid with more "
                    f"threads or blocks than the work, whose extra threads are not guarded off")
        return f"{at} raised on numba's CUDA simulator: {got.error}"
    for j in sorted(got.threads):
        many = got.threads[j] > 1
        if many.any():
            i = tuple(int(v) for v in np.argwhere(many)[0])
            n, b = int(got.threads[j][i]), int(got.blocks[j][i])
            el = f"{arg_names[j]}[{', '.join(map(str, i))}]"
            if b > 1:
                return (f"{at}: {el} is written by {n} threads in {b} different blocks -- the "
                        f"work done {'twice' if b == 2 else f'{b} times'}, and a race between "
                        f"blocks on a GPU: exactly one thread of the whole grid must write each "
                        f"element; guard the write on the block too (e.g. `if cuda.grid(1) == "
                        f"0:`) or launch one block ({SIM_NOTE})")
            return (f"{at}: {el} is written by {n} threads of one block -- a race inside a "
                    f"block: exactly one thread must write each element; guard the write (e.g. "
                    f"`if cuda.threadIdx.x == 0:`)")
    ref_any = any(ref.threads[j].any() for j in ref.threads)
    if ref_any and not any(got.threads[j].any() for j in got.threads):
        if empty:
            return f"{kname} is empty: it writes nothing (fill in its body)"
        if not all(int(v) > 0 for v in (*tuple(grid), *tuple(block))):
            return (f"{at} writes nothing: a launch with a grid or block dimension of 0 has no "
                    f"threads (each dimension is at least 1)")
        return (f"{at} writes nothing: no thread of the launch reached a write -- is the "
                f"kernel's guard on a thread the launch has (e.g. cuda.threadIdx.x == 0 with "
                f"block {tuple(block)})?")
    return None


def _element_fault(at, got, ref, arg_names, protect, pure) -> str | None:
    for j in sorted(ref.threads):
        undone = (ref.threads[j] > 0) & (got.threads[j] == 0)
        if undone.any():
            return (f"{at} leaves {_where(got.arrays[j], undone, arg_names[j])} unwritten "
                    f"({int(undone.sum())} of the {int((ref.threads[j] > 0).sum())} elements "
                    f"the reference writes): a grid or guard that leaves work undone -- the "
                    f"launch has too few threads for the work, or the guard turns away threads "
                    f"that have work")
    for j in sorted(got.threads):
        extra = (got.threads[j] > 0) & (ref.threads[j] == 0)
        keep, why = (protect or {}).get(j, (None, ""))
        if keep is not None and (extra & keep).any():
            return f"{at} writes {_where(got.arrays[j], extra & keep, arg_names[j])}: {why}"
        if j not in pure:
            extra &= ~_same_bits(got.arrays[j], ref.arrays[j])
        if extra.any():
            return (f"{at} writes {_where(got.arrays[j], extra, arg_names[j])}, which the "
                    f"reference leaves alone: only the elements the work names may be written")
    return None


def _same_bits(a, b) -> np.ndarray:
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype.kind == "f":
        return (a == b) | (np.isnan(a) & np.isnan(b))
    return a == b


def hold_kernel(kern, grid, block, cases, reference, ref_grid, ref_block, arg_names,
                twin_refs=(), diagnose=None, protect=None, what: str | None = None,
                ref_index=None) -> int:
    """The solution's kernel `kern` (a KernelSpec with its twin) at (grid, block), on every case
    ((name, args): arrays and scalars, in the kernel's order; or (name, args, (grid, block,
    note)): that case at a geometry of its own, `note` added to its verdict -- a launch wider
    than the solution's, say) under numba's CUDA simulator --
    one child, one request, the reference kernel `reference` (a KernelSpec) at (ref_grid,
    ref_block) beside it -- and its twin in NumPy: a Fail naming the first mistake
    (`geometry_fault`; then values: `diagnose(case_name, args_after)` -> words or None, else
    the values against the reference's; then the kernel against its own twin). `protect`:
    case_name -> {arg: (mask of elements no kernel may write, why)}. `ref_index`: the
    arguments of yours the reference takes, in its order (None: all of them, in yours).
    Returns the cases run."""
    kname = what or getattr(kern, "name", getattr(kern, "__name__", "your kernel"))
    src, name = kernel_source(kern)
    ref_src, ref_name = kernel_source(reference)
    twin = getattr(kern, "twin", None)
    arrays, launches = {}, []
    cases = [tuple(c) if len(c) == 3 else (c[0], c[1], (grid, block, "")) for c in cases]
    for c, (cname, args, (cgrid, cblock, _)) in enumerate(cases):
        keys = []
        for j, a in enumerate(args):
            if isinstance(a, np.ndarray):
                arrays[f"c{c}.{j}"] = a
                keys.append(f"c{c}.{j}")
            else:
                keys.append((a.item() if isinstance(a, np.generic) else a,
                             np.asarray(a).dtype.name))
        watch = tuple(j for j, a in enumerate(args) if isinstance(a, np.ndarray))
        launches.append(cudasim.Launch(f"{cname}: yours", f"yours:{name}", tuple(cgrid),
                                       tuple(cblock), keys, watch))
        rk = [keys[j] for j in ref_index] if ref_index is not None else keys
        launches.append(cudasim.Launch(f"{cname}: reference", f"ref:{ref_name}",
                                       tuple(ref_grid), tuple(ref_block), rk,
                                       tuple(i for i, k in enumerate(rk) if isinstance(k, str))))
    results = simulate(launches, arrays, {"yours": src, "ref": ref_src}, what=f"{kname} (yours)")
    empty = _is_empty(getattr(kern, "py_func", kern))
    for c, (cname, args, (cgrid, cblock, note)) in enumerate(cases):
        got, ref = results[2 * c], _as_yours(results[2 * c + 1], args, ref_index)
        if ref.error:
            raise Fail(f"the check's reference kernel failed on the simulator ({ref.error})")
        keep = (protect or {}).get(cname)
        tail = f" ({note})" if note else ""
        fault = geometry_fault(kname, cgrid, cblock, got, ref, arg_names, keep, (), empty, (1,))
        if fault:
            raise Fail(f"case '{cname}': {fault}{tail}")
        after = [got.arrays.get(j, a) for j, a in enumerate(args)]
        differ = [j for j in got.arrays if not _same_bits(got.arrays[j], ref.arrays[j]).all()]
        if differ:
            words = diagnose(cname, after) if diagnose else None
            if words:
                raise Fail(f"your kernel {kname} on numba's CUDA simulator: {words}{tail}")
            j = differ[0]
            raise Fail(f"case '{cname}': your kernel {kname} leaves {arg_names[j]} = "
                       f"{got.arrays[j].ravel()[:8].tolist()}, the reference kernel "
                       f"{ref.arrays[j].ravel()[:8].tolist()}: wrong values{tail}")
        fault = geometry_fault(kname, cgrid, cblock, got, ref, arg_names, keep, (), empty, (2,))
        if fault:
            raise Fail(f"case '{cname}': {fault}{tail}")
        if callable(twin):
            mine = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
            watched(twin_refs, twin, tuple(cgrid), tuple(cblock), *mine,
                    what=f"your twin of {kname}")
            for j in got.arrays:
                if not _same_bits(mine[j], got.arrays[j]).all():
                    raise Fail(f"case '{cname}': your kernel {kname} (on numba's CUDA "
                               f"simulator) leaves {arg_names[j]} = "
                               f"{got.arrays[j].ravel()[:8].tolist()}, your twin "
                               f"{mine[j].ravel()[:8].tolist()}: the twin must do what the "
                               f"kernel does (the engine runs the twin on a laptop, a GPU "
                               f"runs the kernel){tail}")
    wider = sorted({(tuple(g), tuple(b)) for _, _, (g, b, _) in cases} - {(tuple(grid),
                                                                          tuple(block))})
    also = "".join(f" and grid {g} x block {b}" for g, b in wider)
    print(f"{kname} on numba's CUDA simulator at grid {tuple(grid)} x block {tuple(block)}"
          f"{also}: {len(cases)} cases, the reference kernel's values, one writer per element (the "
          f"simulator runs blocks one after another: a race between blocks, one reading what "
          f"another writes, does not show there)")
    return len(cases)


def _as_yours(ref, args, ref_index):
    """The reference's result with its arguments numbered as the solution's launch numbers
    them: an array the reference does not take, as it was, written by no thread."""
    if ref_index is None:
        return ref
    out = cudasim.Result(ref.label, error=ref.error, missing=ref.missing)
    for j, a in enumerate(args):
        if isinstance(a, np.ndarray):
            out.arrays[j] = a.copy()
            out.threads[j] = out.blocks[j] = np.zeros(a.shape, np.int32)
    for i, j in enumerate(ref_index):
        if i in ref.arrays:
            out.arrays[j] = ref.arrays[i]
        if i in ref.threads:
            out.threads[j], out.blocks[j] = ref.threads[i], ref.blocks[i]
    return out


# ---- the child process -------------------------------------------------------------------------
def _allowed_caches(backend: str) -> tuple[str, ...]:
    """Folders the GPU toolchain itself writes to (CuPy's kernel cache) while a check runs."""
    if backend != "cuda":
        return ()
    try:
        from cupy.cuda import compiler
        return (compiler.get_cache_dir(),)
    except Exception:          # no CuPy: nothing of it to allow
        return ()


def _memory_verdict(name: str) -> CheckResult:
    return CheckResult(name, False, f"the check's process grew past {MEMORY_BUDGET / 2**30:g} GiB "
                       f"of memory (the solution allocates without bound?); it was stopped", 0)


def _progressing(cases, send):
    """The check's cases, each reported to the parent as it completes."""
    for case in cases:
        send(("case", str(case)))
        yield case


def _child(conn, exercise: Exercise, solution, backend: str, scratch: str,
           limit: float = DEFAULT_TIMEOUT_S, server: str | None = None) -> None:
    out = io.StringIO()
    sys.stdout = sys.stderr = out                     # what the solution prints comes back
    sys.dont_write_bytecode = True                    # importing a solution file writes nothing
    os.chdir(scratch)
    if backend != "cuda":      # a GPU's driver maps far more address space than it uses
        cudasim.limit_memory(MEMORY_BUDGET)
    _SIM["deadline"] = time.monotonic() + limit
    _SIM["server"] = server

    def send(msg):
        try:
            conn.send(msg)
        except (OSError, ValueError):      # the parent stopped listening: nothing to tell
            pass
    _SIM["progress"] = lambda done, total, label: send(("sim", done, total, label))
    refused: list[str] = []
    cudasim.guard(scratch, _allowed_caches(backend), refused)
    memory = False
    try:
        try:
            ns = load_solution(solution)
        except LabError as exc:
            res = CheckResult(exercise.name, False, str(exc), 0)
            print(res.line())
        else:
            send(("started",))                        # the parent's memory watch starts here
            res = run_cases(exercise.name, _progressing(exercise.cases(ns, backend), send))
    except MemoryError:
        memory = True
    except BaseException as exc:                      # the check itself broke: say so, one line
        wrong = call_fault(exc) if isinstance(exc, Exception) else None
        res = CheckResult(exercise.name, False, wrong or f"the check stopped: "
                          f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}", 0)
    if memory:                                        # (the solution's memory is freed here)
        res = _memory_verdict(exercise.name)
    if refused:
        res = CheckResult(exercise.name, False, f"the solution tried {refused[0]}: a check may "
                          f"write only inside its scratch folder, and start no process", res.cases)
    printed = out.getvalue()
    printed = printed[:-len(res.line()) - 1] if printed.endswith(res.line() + "\n") else printed
    send(("verdict", res.passed, res.message, res.cases, printed[-_OUTPUT_KEPT:]))
    conn.close()
    if "sim" in _SIM:
        _SIM["sim"].close()      # the simulator's child stopped (and reaped) with the check
    os._exit(0)       # at once: no wait for threads the solution left running, no exit handlers


def _context(backend: str):
    """fork where the parent holds no GPU context (the simulator; the child inherits the
    solution, even one defined in a notebook); spawn for the GPU (a forked CUDA context is
    unusable), which needs the solution as a file or module:ATTRIBUTE."""
    return multiprocessing.get_context("spawn" if backend == "cuda" else "fork")


class _Progress:
    """What the parent shows while a check runs: a progress bar per batch of launches on numba's
    CUDA simulator, on stderr (a notebook's committed outputs leave progress-bar lines out)."""

    def __init__(self, name: str, show: bool):
        self.name, self.show, self.bar, self.case = name, show, None, ""

    def __call__(self, msg) -> None:
        if not self.show:
            return
        if msg[0] == "case":
            self.case = msg[1]
        elif msg[0] == "sim":
            _, done, total, label = msg
            if self.bar is None or self.bar.total != total or done < self.bar.n:
                self.close()
                from tqdm import tqdm

                class Bar(tqdm):
                    monitor_interval = 0          # no monitor thread (a later check forks)
                # every line of it holds "[elapsed<remaining": a notebook's output check
                # leaves such lines out (scripts/build_notebooks.py)
                self.bar = Bar(total=total, file=sys.stderr, leave=not sys.stderr.isatty(),
                               desc=f"{self.name} on numba's CUDA simulator",
                               bar_format="{desc} {n_fmt}/{total_fmt} launches "
                                          "[{elapsed}<{remaining}]")
            # at most about 90 columns: a notebook shows the finished bar's line
            self.bar.set_description_str(f"{self.name} on the CUDA simulator: "
                                         f"{label[:30]}", refresh=False)
            self.bar.update(done - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def check_in_child(exercise: Exercise, solution, backend: str = "sim",
                   timeout_s: float | None = None, echo: bool = True,
                   width: int | None = None) -> CheckResult:
    """Run `exercise`'s check on `solution` in a child process with a time limit, a memory limit
    and a scratch folder of its own; the one-line verdict (printed when `echo`, wrapped at
    `width` columns when given: a notebook page) as a CheckResult. While it runs, launches on
    numba's CUDA simulator show a progress bar (when `echo`)."""
    if backend == "cuda" and not isinstance(solution, (str, Path, Source)):
        raise LabError("on the GPU a check runs in a fresh process: give the solution as a .py "
                       "file (or module:ATTRIBUTE)")
    if isinstance(solution, (str, Path)) and str(solution).endswith(".py"):
        solution = os.path.abspath(solution)      # the child runs in its scratch folder
    limit = (timeout_s if timeout_s is not None else
             max(exercise.timeout_s, GPU_TIMEOUT_S) if backend == "cuda" else exercise.timeout_s)
    scratch = tempfile.mkdtemp(prefix=f"handson-{exercise.name}-")
    ctx = _context(backend)
    parent, child = ctx.Pipe(duplex=False)
    server = _fork_server() if exercise.simulator else None
    proc = ctx.Process(target=_child, daemon=True,
                       args=(child, exercise, solution, backend, scratch, limit, server))
    progress = _Progress(exercise.name, echo)
    try:
        proc.start()
        child.close()
        printed, res = "", None
        deadline, rss0, started = time.monotonic() + limit, None, False
        # what the check may grow by once the solution is loaded (a GPU's runtime and compiled
        # kernels come after that: room for them)
        budget = MEMORY_BUDGET + (2 << 30 if backend == "cuda" else 0)
        while res is None:
            if parent.poll(min(0.25, max(0.0, deadline - time.monotonic()))):
                try:
                    msg = parent.recv()
                except EOFError:
                    proc.join(5)
                    res = CheckResult(exercise.name, False, f"the check's process ended without "
                                      f"a verdict (exit code {proc.exitcode}): did the solution "
                                      f"exit or crash the interpreter?", 0)
                    break
                if msg[0] == "verdict":
                    _, passed, message, cases, printed = msg
                    res = CheckResult(exercise.name, passed, message, cases)
                elif msg[0] == "started":
                    started = True
                else:
                    progress(msg)
                continue
            rss = cudasim.rss_bytes(proc.pid) if started else None
            if rss is not None:
                rss0 = rss if rss0 is None else min(rss0, rss)
                if rss - rss0 > budget:              # where no address-space limit holds it
                    proc.kill()
                    res = _memory_verdict(exercise.name)
                    break
            if time.monotonic() >= deadline:
                proc.kill()
                res = CheckResult(exercise.name, False, f"the check did not finish within "
                                  f"{limit:g} s (an endless loop in the solution?); its process "
                                  f"was stopped", 0)
        proc.join(5)
        if proc.is_alive():                           # a verdict came, the process lingers
            proc.kill()
            proc.join()
    finally:
        progress.close()
        parent.close()
        shutil.rmtree(scratch, ignore_errors=True)
    if echo:
        shown = [printed.rstrip(), res.line()] if printed.strip() else [res.line()]
        for text in shown:
            print(textwrap.fill(text, width, subsequent_indent="    ") if width else text)
    return res
