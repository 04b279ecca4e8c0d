"""The machinery of the hands-on exercises: what an exercise is, where a solution comes from,
and the child process each check runs in.

An `Exercise` is a spec (what to write, which lecture section), a stub (source text: what the
student starts from), a check (a generator of cases that runs the solution in a real engine and
raises `Fail` with a message at the first wrong case), the reference solution and the known
wrong solutions (one per common mistake, each with the words its verdict must contain).

A solution is a namespace: a module, a dict (a notebook's `globals()`), any object with the
names the exercise asks for, a path to a .py file, or "package.module:ATTRIBUTE". `check_in_child`
runs the check in a child process: the lab's state is untouched whatever the solution does (a
fresh engine per check, the child's memory thrown away), an endless loop meets a time limit, and
a write outside the child's scratch folder is refused and named. Each check ends in one line.

The result type, the "did it call the reference?" watch and the case runner are the self-check's
own (lab/teach/selfcheck/checkers.py): `CheckResult`, `_Fail`, `_watching`, `_run`.
"""
from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import io
import multiprocessing
import os
import shutil
import sys
import tempfile
import textwrap
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from lab.errors import LabError
from lab.teach.selfcheck.checkers import CheckResult, _Fail as Fail, _run, _watching

__all__ = ["Exercise", "Fail", "CheckResult", "Source", "kernel", "issue", "variant",
           "load_solution", "check_in_child", "watched", "need", "DEFAULT_TIMEOUT_S"]

DEFAULT_TIMEOUT_S = 120.0     # a check on the simulator takes seconds; an endless loop, for ever
_OUTPUT_KEPT = 4000           # characters of what the solution printed, sent back with the verdict


def kernel(*signatures: str, twin: Callable, reads: tuple[int, ...], writes: tuple[int, ...]):
    """kernels/_spec.py's `@kernel`, for a solution's own kernel: the same KernelSpec (numba
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
    from lab.backend import Launch, StreamWait
    be = engine.backend
    if isinstance(item, Launch):
        be.launch(item)
    elif isinstance(item, StreamWait):
        be.record_wait(item.src, item.dst)
    else:
        item.run()


@dataclass(frozen=True)
class Source:
    """A solution as source text (the stub, the reference, a known wrong solution)."""
    text: str
    label: str

    def namespace(self) -> types.SimpleNamespace:
        ns: dict = {"__name__": f"handson_{self.label}"}
        exec(compile(self.text, f"<{self.label}>", "exec"), ns)
        return types.SimpleNamespace(**ns)


@dataclass(frozen=True)
class Exercise:
    name: str
    step: int                      # the checklist step it serves (1..10; 11: the case studies)
    title: str
    section: str                   # the lecture section the spec draws on
    spec: str                      # what to write: the contract the check holds you to
    stub: str                      # the source the student starts from (# FILL ME IN)
    names: tuple[str, ...]         # what a solution must define
    cases: Callable                # cases(solution, backend) -> generator; raises Fail
    reference: str                 # the reference solution's source
    wrong: dict = field(default_factory=dict)   # mistake -> (its source, words its verdict holds)
    stub_says: str = ""            # words the stub's verdict holds: what is missing
    timeout_s: float = DEFAULT_TIMEOUT_S

    def solutions(self) -> dict[str, Source]:
        """{"stub": ..., "reference": ..., each mistake: ...}: every solution the lab ships."""
        out = {"stub": Source(self.stub, f"{self.name} stub"),
               "reference": Source(self.reference, f"{self.name} reference")}
        out.update({m: Source(src, f"{self.name} wrong: {m}")
                    for m, (src, _) in self.wrong.items()})
        return out

    def show(self, stub: bool = True) -> str:
        """The spec, and (stub=True) the stub to start from."""
        text = (f"{self.name} -- checklist step {self.step}: {self.title}\n(lecture {self.section})"
                f"\n\n{self.spec.strip()}\n")
        if stub:
            text += (f"\n# ---- the stub: edit it, then `decode-lab exercise check {self.name} "
                     f"--solution FILE`\n{self.stub.strip()}\n")
        return text


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
    with _watching(refs) as used:
        try:
            out = fn(*args, **kwargs)
        except Fail:
            raise
        except Exception as exc:       # the solution's bug, reported as a verdict
            failure = f"{what or getattr(fn, '__name__', 'the solution')} raised " \
                      f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
    if used:
        raise Fail(f"{what or 'the solution'} called {' and '.join(used)}, the lab's own code "
                   f"that this check compares against: write it yourself")
    if failure:
        raise Fail(failure)
    return out


# ---- the child process -------------------------------------------------------------------------
_WRITE_EVENTS = ("os.remove", "os.rename", "os.replace", "os.rmdir", "os.mkdir", "os.truncate",
                 "os.chmod", "os.chown", "os.link", "os.symlink", "os.utime", "shutil.rmtree",
                 "shutil.copyfile", "shutil.copytree", "shutil.move", "shutil.chown")
_PROCESS_EVENTS = ("subprocess.Popen", "os.system", "os.posix_spawn", "os.exec", "os.spawn",
                   "os.fork", "os.forkpty", "pty.spawn")
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def _guard(scratch: str, allowed: tuple[str, ...], refused: list) -> None:
    """An audit hook (for the rest of the child's life): a write outside the scratch folder, or a
    new process, is refused (PermissionError) and noted in `refused`."""
    roots = tuple(os.path.realpath(p) for p in (scratch, *allowed))

    def inside(path) -> bool:
        if isinstance(path, int):
            return True                                   # an open descriptor: already allowed
        try:
            real = os.path.realpath(os.fsdecode(path))
        except (TypeError, ValueError):
            return True
        return real == os.devnull or any(real == r or real.startswith(r + os.sep) for r in roots)

    def refuse(what: str):
        refused.append(what)
        raise PermissionError(f"decode-lab exercise: {what} is not allowed in a check")

    def hook(event, args):
        if event == "open":
            path, mode, flags = args
            writing = (any(c in mode for c in "wax+") if isinstance(mode, str)
                       else bool((flags or 0) & _WRITE_FLAGS))
            if writing and not inside(path):
                refuse(f"writing {os.fsdecode(path)} (outside its scratch folder)")
        elif event in _WRITE_EVENTS:
            paths = [a for a in args if isinstance(a, (str, bytes, os.PathLike))]
            bad = [p for p in paths if not inside(p)]
            if bad:
                refuse(f"{event}({os.fsdecode(bad[0])}) (outside its scratch folder)")
        elif event in _PROCESS_EVENTS:
            refuse(f"starting a process ({event})")

    sys.addaudithook(hook)


def _allowed_caches(backend: str) -> tuple[str, ...]:
    """Folders the GPU toolchain itself writes to (CuPy's kernel cache) while a check runs."""
    if backend != "cuda":
        return ()
    try:
        from cupy.cuda import compiler
        return (compiler.get_cache_dir(),)
    except Exception:          # no CuPy: nothing of it to allow
        return ()


def _child(conn, exercise: Exercise, solution, backend: str, scratch: str) -> None:
    out = io.StringIO()
    sys.stdout = sys.stderr = out                     # what the solution prints comes back
    sys.dont_write_bytecode = True                    # importing a solution file writes nothing
    os.chdir(scratch)
    refused: list[str] = []
    _guard(scratch, _allowed_caches(backend), refused)
    try:
        try:
            ns = load_solution(solution)
        except LabError as exc:
            res = CheckResult(exercise.name, False, str(exc), 0)
            print(res.line())
        else:
            res = _run(exercise.name, exercise.cases(ns, backend))   # prints its verdict
    except BaseException as exc:                      # the check itself broke: say so, one line
        res = CheckResult(exercise.name, False, f"the check stopped: {type(exc).__name__}: "
                          f"{' '.join(str(exc).split())[:300]}", 0)
    if refused:
        res = CheckResult(exercise.name, False, f"the solution tried {refused[0]}: a check may "
                          f"write only inside its scratch folder, and start no process", res.cases)
    printed = out.getvalue()
    printed = printed[:-len(res.line()) - 1] if printed.endswith(res.line() + "\n") else printed
    conn.send((res.passed, res.message, res.cases, printed[-_OUTPUT_KEPT:]))
    conn.close()
    os._exit(0)       # now: no wait for threads the solution left running, no exit handlers


def _context(backend: str):
    """fork where the parent holds no GPU context (the simulator; the child inherits the
    solution, even one defined in a notebook); spawn for the GPU (a forked CUDA context is
    unusable), which needs the solution as a file or module:ATTRIBUTE."""
    return multiprocessing.get_context("spawn" if backend == "cuda" else "fork")


def check_in_child(exercise: Exercise, solution, backend: str = "sim",
                   timeout_s: float | None = None, echo: bool = True,
                   width: int | None = None) -> CheckResult:
    """Run `exercise`'s check on `solution` in a child process with a time limit and a scratch
    folder of its own; the one-line verdict (printed when `echo`, wrapped at `width` columns
    when given: a notebook page) as a CheckResult."""
    if backend == "cuda" and not isinstance(solution, (str, Path, Source)):
        raise LabError("on the GPU a check runs in a fresh process: give the solution as a .py "
                       "file (or module:ATTRIBUTE)")
    limit = exercise.timeout_s if timeout_s is None else timeout_s
    scratch = tempfile.mkdtemp(prefix=f"handson-{exercise.name}-")
    ctx = _context(backend)
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(child, exercise, solution, backend, scratch),
                       daemon=True)
    try:
        proc.start()
        child.close()
        printed = ""
        if parent.poll(limit):
            try:
                passed, message, cases, printed = parent.recv()
                res = CheckResult(exercise.name, passed, message, cases)
            except EOFError:
                proc.join(5)
                res = CheckResult(exercise.name, False, f"the check's process ended without a "
                                  f"verdict (exit code {proc.exitcode}): did the solution exit "
                                  f"or crash the interpreter?", 0)
        else:
            proc.kill()
            res = CheckResult(exercise.name, False, f"the check did not finish within {limit:g} s "
                              f"(an endless loop in the solution?); its process was stopped", 0)
        proc.join(5)
        if proc.is_alive():                           # a verdict came, the process lingers
            proc.kill()
            proc.join()
    finally:
        parent.close()
        shutil.rmtree(scratch, ignore_errors=True)
    if echo:
        shown = [printed.rstrip(), res.line()] if printed.strip() else [res.line()]
        for text in shown:
            print(textwrap.fill(text, width, subsequent_indent="    ") if width else text)
    return res
