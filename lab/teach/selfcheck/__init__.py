"""Self-checks: five coding exercises in the GPU-Puzzles shape, and the lecture's ten questions.

  exercises.py    the five exercises' statements and stubs (`# FILL ME IN`)
  checkers.py     their checks against the lab's own code on the simulator (check_merge_partials,
                  check_launch_bill, check_paired_t, check_verdict, check_replays_needed), and
                  EXERCISES: each an Exercise (lab/teach/exercise.py)
  questions.py    the lecture's ten questions: start, ask, answer, reveal (attempts remembered
                  in ~/.decode-lab)
  bank.py         QUESTIONS q1 ... q10, read from the sealed bank (grading.py, seal.py)
  run.py          run_selfcheck: an answers JSON and a solutions file (`decode-lab selfcheck`)

A check prints a one-line verdict and returns a CheckResult (passed, message); calling the code
it compares against fails it. Notebook 08_self_check walks through them. No solutions ship
here: the tests write their own.
"""
from lab.teach.exercise import CheckResult
from .bank import QUESTIONS
from .checkers import (EXERCISES, check_launch_bill, check_merge_partials, check_paired_t,
                       check_replays_needed, check_verdict)
from .exercises import (VERDICTS, launches_per_token, merge_partials, paired_t,
                        per_launch_budget_us, replays_needed, verdict)
from .grading import Question
from .questions import (Attempts, QuestionResult, answer, ask, check_answer, default_attempts,
                        reveal, start)
from .run import run_selfcheck, score

__all__ = ["CheckResult", "EXERCISES", "VERDICTS",
           "merge_partials", "check_merge_partials",
           "launches_per_token", "per_launch_budget_us", "check_launch_bill",
           "paired_t", "check_paired_t",
           "verdict", "check_verdict",
           "replays_needed", "check_replays_needed",
           "QUESTIONS", "Question", "QuestionResult", "Attempts", "default_attempts", "start",
           "ask", "answer", "check_answer", "reveal",
           "run_selfcheck", "score"]
