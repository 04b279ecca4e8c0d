"""Every self-check at once, from files: `decode-lab selfcheck`.

  answers    a JSON object {question id: answer}: a letter ("<letter>") for a choice, a list of
             letters (["<letter>", ...]) for choices, {"number": ..., "choices": [...]} for q4,
             or null for not answered. The letters are the student's own: each student sees
             the options in an order of their own (questions.py)
  solutions  a Python file defining the exercises' functions (merge_partials,
             launches_per_token, per_launch_budget_us, paired_t, verdict, replays_needed)
  attempts   the attempts file (default ~/.decode-lab/selfcheck.json), and student, the name
             that seeds the options' order: given once (--student NAME, or asked on a
             terminal) and remembered in ~/.decode-lab/student (questions.resolve_student)

`run_selfcheck(answers, solutions)` prints one verdict line per question and exercise and the
score "score: N/15", and returns the exit status: 0 when all fifteen pass, 1 otherwise (0 with
neither file: it prints the questions). Every right or wrong answer is a recorded attempt of
the student's; `explain` prints the answer and why of the questions that student has attempted
in this run, and of no other question (a self-assessment: another name's attempts show the
answers to that name, questions.py). An unreadable file, a
JSON that is not an object of known question ids, an unusable attempts file, or a solutions
file that fails to import, or no student at all (none given, remembered or fixed, and no
terminal to ask on) is a LabError; a malformed answer, or a function missing from the solutions
file, is a failing line that names the cause.
"""
from __future__ import annotations

import dataclasses
import importlib.machinery
import importlib.util
import json
import sys
from pathlib import Path

from lab.errors import LabError
from lab.teach.exercise import CheckResult, Exercise, Fail
from .bank import QUESTIONS
from .checkers import EXERCISES
from .questions import Attempts, answer

TOTAL = len(QUESTIONS) + len(EXERCISES)


def score(results, total: int | None = None) -> str:
    """"score: N/M": N of the CheckResults and QuestionResults passed, out of `total` (default:
    how many results were given)."""
    results = list(results)
    return f"score: {sum(r.passed for r in results)}/{len(results) if total is None else total}"


def _existing(path, flag: str) -> Path:
    p = Path(path)
    if not p.is_file():
        raise LabError(f"{flag} {path}: no such file")
    return p


def load_answers(path) -> dict:
    """{question id: answer} from a JSON file; a LabError for anything that is not one."""
    p = _existing(path, "--answers")
    try:
        data = json.loads(p.read_text())
    except json.JSONDecodeError as exc:
        raise LabError(f"--answers {path}: not valid JSON: {exc.msg} (line {exc.lineno}, "
                       f"column {exc.colno})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise LabError(f"--answers {path}: cannot be read: {exc}") from None
    if not isinstance(data, dict):
        raise LabError(f"--answers {path}: expected a JSON object {{\"q1\": ..., ...}}, got a "
                       f"{type(data).__name__}")
    unknown = [k for k in data if k not in QUESTIONS]
    if unknown:
        raise LabError(f"--answers {path}: unknown question id(s) {', '.join(map(repr, unknown))}; "
                       f"the ids are {', '.join(QUESTIONS)}")
    return data


def load_solutions(path):
    """Import a solutions file as a module; a LabError (one line) if it cannot be imported."""
    p = _existing(path, "--solutions")
    loader = importlib.machinery.SourceFileLoader("selfcheck_solutions", str(p))   # any file name
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    try:
        loader.exec_module(module)
    except (Exception, SystemExit) as exc:   # whatever the learner's file raises
        why = " ".join(f"{type(exc).__name__}: {exc}".split())
        raise LabError(f"--solutions {path}: failed to import: {why}") from None
    return module


def _functions(module, names, source: str):
    """The named functions of the solutions module, or a reason why one is unusable."""
    fns = []
    for name in names:
        fn = getattr(module, name, None)
        if fn is None:
            return None, f"{source} defines no {name}"
        if not callable(fn):
            return None, f"{name} in {source} is a {type(fn).__name__}, not a function"
        fns.append(fn)
    return fns, ""


def check_exercises(module, source: str) -> list[CheckResult]:
    """Run every exercise's checker on the solutions module (printing each verdict)."""
    results = []
    for exercise in EXERCISES.values():
        fns, why = _functions(module, exercise.names, source)
        if fns is None:
            res = CheckResult(exercise.name, False, why, 0)
            print(res.line())
        else:
            res = exercise.run(module)
        results.append(res)
    return results


class _SolutionsFile:
    """A solutions file as a check's solution: each check's child process imports it itself
    (load_solutions), so the file's code never runs in the process that judges it."""

    def __init__(self, path: Path, shown: str):
        self.path, self.shown = path, shown

    def module(self):
        return load_solutions(self.path)


def _importing(name: str = "import") -> Exercise:
    """A check whose one case is importing the solutions file (its LabError, the verdict)."""
    def cases(file: _SolutionsFile, backend: str = "sim"):
        try:
            file.module()
        except LabError as exc:
            raise Fail(str(exc).replace(str(file.path), file.shown, 1)) from None
        yield "import"
    return Exercise(name, None, "import the solutions file", "", "", "", (), cases)


def _from_file(exercise: Exercise, source: str) -> Exercise:
    """`exercise` checked on a _SolutionsFile: imported in the check's child, its functions
    named as check_exercises names them."""
    def cases(file: _SolutionsFile, backend: str = "sim"):
        module = file.module()
        fns, why = _functions(module, exercise.names, source)
        if fns is None:
            raise Fail(why)
        yield from exercise.cases(module, backend)
    return dataclasses.replace(exercise, cases=cases)


def solutions_file(path, timeout_s: float | None = None) -> _SolutionsFile:
    """The solutions file at `path`, imported once in a child process (as check_solutions runs
    each check) to see that it imports: one that does not (or does not return from its import
    within the time limit, or ends the process) is a LabError."""
    from lab.teach.handson.base import check_in_child

    file = _SolutionsFile(_existing(path, "--solutions").resolve(), str(path))
    first = check_in_child(_importing(), file, "sim", timeout_s, echo=False)
    if not first.passed:
        why = first.message
        raise LabError(why if why.startswith("--solutions ") else f"--solutions {path}: {why}")
    return file


def check_solutions(file: _SolutionsFile, timeout_s: float | None = None) -> list[CheckResult]:
    """Every exercise's check on a solutions file, each in a child process of its own as
    `decode-lab exercise check` runs one (lab/teach/handson/base.py check_in_child): the
    exercise's time limit (or `timeout_s`), a memory limit, a scratch folder. A solution that
    loops is stopped, and one that ends the process (os._exit) gives no verdict: each is a
    failing line, never a pass."""
    from lab.teach.handson.base import check_in_child

    return [check_in_child(_from_file(e, Path(file.shown).name), file, "sim", timeout_s)
            for e in EXERCISES.values()]


def usage(record: Attempts) -> str:
    """The ten questions, in the student's order, and how to answer them from the command
    line."""
    template = json.dumps({qid: None for qid in QUESTIONS})
    lines = ["The lecture's ten self-check questions (notebook 08_self_check asks them too), "
             f"with the options in the order of student {record.student!r} (remembered in "
             "~/.decode-lab/student; --student NAME changes it; answer with these letters):",
             ""]
    for q in QUESTIONS.values():
        lines += [q.prompt(record.student, in_json=True), ""]
    lines += ["The five exercises: fill in the stubs of lab/teach/selfcheck/exercises.py in a "
              "file of your own, defining "
              + ", ".join(n for e in EXERCISES.values() for n in e.names)
              + ".", "",
              "Answer in a JSON file (null: not answered), e.g. starting from", f"  {template}",
              "then run", "  decode-lab selfcheck --answers answers.json --solutions "
              "my_solutions.py [--explain]",
              f"Each answer is an attempt, kept in {record.path}; --explain shows the answer "
              "and why of each question you answered, after your attempt."]
    return "\n".join(lines)


def terminal_prompt():
    """`input` when both ends are a terminal (someone to ask who is answering), else None."""
    return input if sys.stdin.isatty() and sys.stdout.isatty() else None


def run_selfcheck(answers_path=None, solutions_path=None, explain: bool = False,
                  attempts_path=None, student: str | None = None, prompt="terminal",
                  timeout_s: float | None = None) -> int:
    """Check the answers file and the solutions file; print the verdicts and the score.
    Returns 0 when all TOTAL pass, 1 otherwise; with neither file, print usage() and return 0.
    `prompt` asks for the student's name when none is given or remembered ("terminal": `input`
    on a terminal, nothing elsewhere). The solutions run in child processes, each exercise with
    its time limit (`timeout_s`, or the exercise's): check_solutions_file."""
    record = Attempts(attempts_path, student,
                      terminal_prompt() if prompt == "terminal" else prompt)
    if answers_path is None and solutions_path is None:
        print(usage(record))
        return 0
    answers = load_answers(answers_path) if answers_path is not None else None
    file = solutions_file(solutions_path, timeout_s) if solutions_path is not None else None
    results = []
    print(f"questions ({answers_path or 'no --answers'}; student {record.student!r}):")
    for qid in QUESTIONS:
        results.append(answer(qid, (answers or {}).get(qid), explain=explain, record=record))
    print(f"exercises ({solutions_path or 'no --solutions'}):")
    if solutions_path is None:
        print(f"  not checked: give --solutions FILE defining the functions "
              f"(0 of {len(EXERCISES)})")
    else:
        results += check_solutions(file, timeout_s)
    print(score(results, TOTAL))
    return 0 if sum(r.passed for r in results) == TOTAL else 1
