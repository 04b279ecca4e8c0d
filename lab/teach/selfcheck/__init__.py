"""Self-checks: five coding exercises in the GPU-Puzzles shape, and the lecture's ten questions.

Exercises: a spec (the stub's docstring), a stub to fill in (`# FILL ME IN`), and a checker that
runs your function against the project's own code on the simulator, prints a one-line verdict
and returns a `CheckResult` (passed, message). Calling that reference code from your function
fails the check.

  merge_partials        the split-K softmax merge         check_merge_partials  (attn_merge_twin)
  launches_per_token,   the launch bill: launches/token   check_launch_bill     (launch_bill over
  per_launch_budget_us  and the us each may cost                                sim engines' logs)
  paired_t              paired difference: mean, sem, t   check_paired_t        (stats.paired_t)
  verdict               what a capture would freeze       check_verdict         (audit.audit)
  replays_needed        replays that expose a frozen bug  check_replays_needed  (replay_check)

The references: lab.measure.stats, lab.teach.audit, lab.teach.verify, kernels.attention.

Questions (questions.py): `start(student, attempts)` says who answers (asked once and
remembered in ~/.decode-lab; the options' order is the student's own) and where attempts are
kept; `ask(qid)` prints one, `answer(qid, value)` records an attempt, says right or not right,
then shows the answer and why; `reveal(qid)` shows it again, and only after that student's
attempt. `QUESTIONS` holds q1 ... q10, their key sealed (grading.py; seal.py seals a plain bank
kept out of the repository). `run_selfcheck` (run.py) checks an answers JSON and a solutions
file: `decode-lab selfcheck`.

Notebook 08_self_check walks through them. No solutions ship here: the tests write their own.
"""
from .bank import QUESTIONS
from .checkers import (CheckResult, check_launch_bill, check_merge_partials, check_paired_t,
                       check_replays_needed, check_verdict)
from .exercises import (VERDICTS, launches_per_token, merge_partials, paired_t,
                        per_launch_budget_us, replays_needed, verdict)
from .grading import Question
from .questions import (Attempts, QuestionResult, answer, ask, check_answer, default_attempts,
                        reveal, start)
from .run import run_selfcheck, score

__all__ = ["CheckResult", "VERDICTS",
           "merge_partials", "check_merge_partials",
           "launches_per_token", "per_launch_budget_us", "check_launch_bill",
           "paired_t", "check_paired_t",
           "verdict", "check_verdict",
           "replays_needed", "check_replays_needed",
           "QUESTIONS", "Question", "QuestionResult", "Attempts", "default_attempts", "start",
           "ask", "answer", "check_answer", "reveal",
           "run_selfcheck", "score"]
