"""What an exercise is, for the self-check (selfcheck/) and the hands-on exercises (handson/) alike.

  Exercise     the statement, the stub, what a solution defines, its check, the reference and
               the known wrong solutions
  Source       a solution as source text (the stub, the reference, a known wrong solution)
  CheckResult  a check's verdict: passed, the message naming the failing case, the cases run
  Fail         a failing case, raised inside a check (never leaves it)
  watching     notes which of the lab's own functions (a check's references) a solution calls
  run_cases    runs a check's cases to the first Fail and prints the one-line verdict
"""
from __future__ import annotations

import contextlib
import linecache
import sys
import types
from dataclasses import dataclass, field
from typing import Callable

__all__ = ["Exercise", "Source", "CheckResult", "Fail", "watching", "run_cases"]

DEFAULT_TIMEOUT_S = 120.0     # a check on the simulator takes seconds; an endless loop, for ever


@dataclass(frozen=True)
class CheckResult:
    exercise: str
    passed: bool
    message: str      # "" when passed; else the failing case, what came back, what was
                      # expected, a hint
    cases: int        # cases run (all when passed; up to and including the failing one if not)

    def __bool__(self) -> bool:
        return self.passed

    def line(self) -> str:
        if self.passed:
            return f"{self.exercise}: PASS ({self.cases} cases)"
        return f"{self.exercise}: not yet -- {self.message}"

    def __str__(self) -> str:
        return self.line()


class Fail(Exception):
    """A failing case inside a check: its message is the verdict's."""


@dataclass(frozen=True)
class Source:
    """A solution as source text (the stub, the reference, a known wrong solution)."""
    text: str
    label: str

    def namespace(self) -> types.SimpleNamespace:
        ns: dict = {"__name__": f"handson_{self.label}"}
        filename = f"<{self.label}>"
        # its lines where inspect finds a function's source (the kernel sent to the simulator)
        linecache.cache[filename] = (len(self.text), None, self.text.splitlines(True), filename)
        exec(compile(self.text, filename, "exec"), ns)
        return types.SimpleNamespace(**ns)


@dataclass(frozen=True)
class Exercise:
    """One exercise. `cases(solution, backend)` is a generator over the check's cases that raises
    Fail at the first wrong one; `solution` is a namespace holding `names`."""
    name: str
    step: int | None               # the checklist step it serves (hands-on: 1..10, 11 the case
                                   # studies); None for a self-check exercise
    title: str
    section: str                   # the lecture section the statement draws on
    statement: str                 # what to write: the contract the check holds you to
    stub: str                      # the source the student starts from (# FILL ME IN)
    names: tuple[str, ...]         # what a solution must define
    cases: Callable                # cases(solution, backend) -> generator; raises Fail
    reference: str | None = None   # the reference solution's source (None: not shipped, the
                                   # check compares with the lab's own code)
    wrong: dict = field(default_factory=dict)   # mistake -> (its source, words its verdict holds)
    stub_says: str = ""            # words the stub's verdict holds: what is missing
    timeout_s: float = DEFAULT_TIMEOUT_S
    simulator: bool = False        # its check runs kernels on numba's CUDA simulator

    def solutions(self) -> dict[str, Source]:
        """{"stub": ..., "reference": ..., each mistake: ...}: every solution the lab ships."""
        out = {"stub": Source(self.stub, f"{self.name} stub")}
        if self.reference is not None:
            out["reference"] = Source(self.reference, f"{self.name} reference")
        out.update({m: Source(src, f"{self.name} wrong: {m}")
                    for m, (src, _) in self.wrong.items()})
        return out

    def show(self, stub: bool = True) -> str:
        """The statement, and (stub=True) the stub to start from."""
        where = (f"checklist step {self.step}: " if self.step is not None else "self-check: ")
        text = (f"{self.name} -- {where}{self.title}\n(lecture {self.section})"
                f"\n\n{self.statement.strip()}\n")
        if stub:
            text += f"\n# ---- the stub: edit it, then {self.how_to_check()}\n{self.stub.strip()}\n"
        return text

    def how_to_check(self) -> str:
        if self.step is None:
            return "`decode-lab selfcheck --solutions FILE`"
        return f"`decode-lab exercise check {self.name} --solution FILE`"

    def run(self, solution, backend: str = "sim") -> CheckResult:
        """Run the check here, in this process, on a namespace holding `names`; print the
        verdict."""
        return run_cases(self.name, self.cases(solution, backend))


@contextlib.contextmanager
def watching(references):
    """Note, in the yielded list, the names of the `references` ((name, function) pairs) that run
    inside the block: matched by code object, so an alias or an indirect call counts too."""
    codes = {f.__code__: name for name, f in references}
    used: list[str] = []
    previous = sys.getprofile()

    def hook(frame, event, arg):
        if event == "call" and frame.f_code in codes and codes[frame.f_code] not in used:
            used.append(codes[frame.f_code])
        if callable(previous):
            previous(frame, event, arg)

    sys.setprofile(hook if codes else previous)
    try:
        yield used
    finally:
        sys.setprofile(previous)


def run_cases(exercise: str, cases) -> CheckResult:
    """Run `cases` (a generator of checks that raise Fail) and print the verdict."""
    n = 0
    try:
        for _ in cases:
            n += 1
        res = CheckResult(exercise, True, "", n)
    except Fail as fail:
        res = CheckResult(exercise, False, str(fail), n + 1)
    print(res.line())
    return res
