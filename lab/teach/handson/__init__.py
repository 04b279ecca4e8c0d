"""Hands-on exercises: one or more per step of the lecture's checklist ("make your decode step
graph-resident"), each an Exercise (lab/teach/exercise.py): a statement, a stub the student
edits, a check that runs the student's code in the real engine (the simulator, or the GPU:
`backend="cuda"`), the reference solution and the known wrong solutions, one per common mistake.
Step 11 goes beyond the checklist's ten: the lecture's case studies 003/004, speculative decoding
with one graph for the whole generation.

  step  exercise      what the student writes                         module
   1    launch_count  count one token's launches; does capture pay?    count.py
   2    audit         classify each host value that reaches a launch   audit_values.py
   3    advance       the device-side position advance kernel          advance.py
   4    prewarm       pre-warm the lazy table and scratch              prewarm.py
   5    fallback      end a failed capture, restore, re-issue eagerly  fallback.py
   6    replay_test   the repeated-replay byte comparison              replay_test.py
   7    aa_control    the A/A control before believing a mismatch      aa_control.py
   7    aa_gate       the A/A gate in front of every A/B (timing)      aa_gate.py
   8    variance      interleaved reps, the sem of both arms           variance.py
   9    fission       split the combine; re-measure it under capture   fission.py
   9    fission_fused split the fused attention: pays only captured    fission_fused.py
  10    loo           the leave-one-out table                          loo.py
  11    accept        speculative decoding's acceptance, replayed      accept.py
                      (beyond the ten steps: case studies 003/004)

A crash in the student's own code is named by its line and what went wrong there (crash.py).

`check(name, solution)` runs one check in a child process (lab/teach/handson/base.py): the verdict
is one line; the lab's state is untouched whatever the solution does. `decode-lab exercise
list|show|check` is the command line; notebook 13_hands_on walks through steps 1-10, notebook
14_speculative_decoding through step 11.
"""
from __future__ import annotations

from lab.errors import LabError
from lab.teach.exercise import CheckResult, Exercise, Source
from . import (aa_control, aa_gate, accept, advance, audit_values, count, fallback, fission,
               fission_fused, loo, prewarm, replay_test, variance)
from .base import check_in_child, issue, kernel

EXERCISES: dict[str, Exercise] = {e.name: e for e in sorted(
    (m.EXERCISE for m in (count, audit_values, advance, prewarm, fallback, replay_test,
                          aa_control, aa_gate, variance, fission, fission_fused, loo, accept)),
    key=lambda e: e.step)}

__all__ = ["EXERCISES", "Exercise", "CheckResult", "Source", "kernel", "issue", "exercise", "show",
           "check", "listing"]


def exercise(name: str) -> Exercise:
    if name not in EXERCISES:
        raise LabError(f"no exercise {name!r}; the exercises are {', '.join(EXERCISES)}")
    return EXERCISES[name]


def listing() -> str:
    """One line per exercise: the checklist step it serves, its name, what it asks."""
    rows = [f"step {e.step:>2}  {e.name:<13} {e.title} (lecture {e.section})"
            for e in EXERCISES.values()]
    return "\n".join(rows)


def show(name: str, stub: bool = True) -> None:
    """Print the exercise's statement and (stub=True) its stub."""
    print(exercise(name).show(stub))


def check(name: str, solution, backend: str = "sim", timeout_s: float | None = None,
          echo: bool = True, width: int | None = None) -> CheckResult:
    """Check `solution` (a .py file, a namespace such as a notebook's globals(), or a Source)
    against exercise `name` in a child process; prints (wrapped at `width` columns when given)
    and returns the one-line verdict."""
    return check_in_child(exercise(name), solution, backend, timeout_s, echo, width)
