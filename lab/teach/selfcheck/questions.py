"""The lecture's ten self-check questions: asked, attempted, and only then explained.

The questions are data in bank.py (sealed: grading.py); a question's options, their order for
each student and the grading of an attempt are grading.py's. This module keeps who is
answering, the record of attempts and the notebook's interface.

The contract, for the notebook and for `decode-lab selfcheck`:

- Who is answering is asked for once. `start(student)` (the notebook's cell, `--student NAME`)
  names the student and remembers the name in ~/.decode-lab/student (the home folder's, so a
  test with its own HOME has its own); `start()` then uses the remembered name. A fixed
  identity in DECODE_LAB_STUDENT (lab/config.py: CI, the tests, the notebook build) comes
  before the remembered one and is never stored. With none of these, the command line asks on a
  terminal (`prompt`), and anywhere else a LabError says how to give one. There is no shared
  default: neither the login nor a fixed name.
- An answer must be attempted before it is shown, by the same student. `ask(qid)` prints a
  question and how to answer it. `answer(qid, value)` checks an attempt, records it under the
  student's name in the attempts file, prints the verdict and then (explain=True) the answer and
  why. `reveal(qid)` prints the answer only when that student has an attempt at that question;
  before one it refuses and says so. None or a malformed value is not an attempt: nothing is
  recorded or revealed, and a malformed one is told what is wrong.
- The options come in an order of their own for each student: a permutation seeded by
  sha256(student, question id), so neither a letter nor a position carries the answer, and
  letters copied from someone else mean nothing. Attempts are graded and recorded by option
  identity (the option's index in the bank), never by letter. The bank is written so that the
  right option is not systematically the longest or the shortest (tests check it).
- A verdict says right or not right, and where to look (the question's hint and its lecture
  section). It never counts or names the wrong and the missing picks: "k wrong, m missing" gives
  a multi-pick key away one letter at a time. What each wrong pick misses comes with the answer,
  after the attempt. Every distinct attempt is kept, and a pass says on which attempt it came,
  so working through the subsets shows in the record.

This is self-assessment, not an exam: the record is a file on the student's own machine, and a
second name (or an edited file) with any attempt shows that question's answer. What it keeps is
the answer out of sight until an attempt of one's own.

The attempts file is a small JSON object {"format": ..., "attempts": {student: {qid: [attempt,
...]}}}, by default ~/.decode-lab/selfcheck.json (outside the repository and its data), written
atomically (lab/files.py) and only when an attempt is recorded. A file of the earlier format
({"student": name, "attempts": {qid: [...]}}) is read as that student's.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from lab.config import STUDENT_ENV, selfcheck_student, state_folder
from lab.errors import LabError
from lab.files import atomic_write_text, check_output
from .bank import QUESTIONS
from .grading import HOW_TO_ANSWER, Malformed, Question

FILE_FORMAT = "decode-lab selfcheck attempts, version 2"
OLD_FORMAT = "decode-lab selfcheck attempts, version 1"


# ================================================================ who is answering

def home_folder() -> Path:
    """The lab's state folder (~/.decode-lab, or DECODE_LAB_STATE: lab.config.state_folder):
    the remembered name and, by default, the attempts."""
    return state_folder()


def default_attempts() -> Path:
    return home_folder() / "selfcheck.json"


def student_file() -> Path:
    return home_folder() / "student"


def check_student(student, flag: str = "--student") -> str:
    """A usable student name or id (a LabError naming `flag`, where it came from, for anything
    else)."""
    if not isinstance(student, str) or not student.strip() or len(student) > 100 or (
            not student.isprintable()):
        raise LabError(f"{flag} {student!r}: give a name or id of 1 to 100 printable characters")
    return student.strip()


def remembered_student() -> str | None:
    """The name remembered in ~/.decode-lab/student, or None."""
    path = student_file()
    if not path.is_file():
        return None
    try:
        return check_student(path.read_text().strip())
    except (OSError, UnicodeDecodeError, LabError):
        raise LabError(f"{path}: not a usable name; remove it, or give one (--student NAME)") \
            from None


def remember_student(student: str) -> None:
    path = student_file()
    if remembered_student() == student:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, student + "\n")
    except OSError as exc:
        raise LabError(f"{path}: cannot be written ({exc})") from None


NO_STUDENT = ("who is answering? give your name or id once (notebook 08: STUDENT = \"NAME\" in "
              "its start cell; the command line: --student NAME); it is remembered in "
              "~/.decode-lab/student")


def resolve_student(student: str | None = None, prompt=None) -> str:
    """Who is answering: `student` (remembered for later runs), else DECODE_LAB_STUDENT, else the
    remembered name, else what `prompt` (a function of a question, e.g. `input`) returns
    (remembered), else a LabError saying how to give one."""
    if student is not None:
        student = check_student(student)
        remember_student(student)
        return student
    fixed = selfcheck_student()
    if fixed is not None:
        return check_student(fixed, STUDENT_ENV)
    remembered = remembered_student()
    if remembered is not None:
        return remembered
    if prompt is None:
        raise LabError(NO_STUDENT)
    try:
        given = prompt("your name or id for the self-check (asked once: it orders your options "
                       "and keeps your attempts): ")
    except EOFError:
        raise LabError(NO_STUDENT) from None
    student = check_student(given)
    remember_student(student)
    return student


# ================================================================ the record of attempts

def _kept(qid: str, attempt) -> bool:
    """Whether `attempt`, read from an attempts file, is one that record() writes for `qid`."""
    n = len(QUESTIONS[qid].options)
    number = attempt.get("number") if isinstance(attempt, dict) else None
    return (isinstance(attempt, dict) and set(attempt) <= {"picks", "right", "number"}
            and isinstance(attempt.get("right"), bool) and isinstance(attempt.get("picks"), list)
            and all(type(i) is int and 0 <= i < n for i in attempt["picks"])
            and (number is None or (type(number) in (int, float) and math.isfinite(number))))


def _attempts_of(data) -> bool:
    """Whether `data` is one student's {qid: [attempt, ...]}."""
    return isinstance(data, dict) and all(
        k in QUESTIONS and isinstance(v, list) and all(_kept(k, a) for a in v)
        for k, v in data.items())


class Attempts:
    """Who is answering (it seeds the options' order) and every distinct attempt so far, each
    student's apart, kept in a JSON file. The file is read when this is made and written, whole
    and atomically, each time an attempt is recorded; `path=None` is ~/.decode-lab/selfcheck.json
    (its folder made when needed). `student` and `prompt`: resolve_student's."""

    def __init__(self, path=None, student: str | None = None, prompt=None):
        self.default = path is None
        self.path = Path(default_attempts() if path is None else path)
        if not self.default:
            check_output(self.path, "--attempts")
        self.everyone: dict[str, dict[str, list[dict]]] = self._load()
        self.student = resolve_student(student, prompt)
        self.attempts: dict[str, list[dict]] = self.everyone.setdefault(self.student, {})

    def _load(self) -> dict:
        if not self.path.exists():
            return {}
        try:
            data = json.loads(self.path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise LabError(f"attempts file {self.path}: cannot be read ({exc}); move it away "
                           f"or give another (--attempts PATH)") from None
        if isinstance(data, dict) and data.get("format") == OLD_FORMAT and isinstance(
                data.get("student"), str) and _attempts_of(data.get("attempts")):
            return {data["student"]: data["attempts"]}
        if (isinstance(data, dict) and data.get("format") == FILE_FORMAT
                and isinstance(data.get("attempts"), dict)
                and all(isinstance(k, str) and _attempts_of(v)
                        for k, v in data["attempts"].items())):
            return data["attempts"]
        raise LabError(f"attempts file {self.path}: not a self-check attempts file; move it "
                       f"away or give another (--attempts PATH)")

    def count(self, qid: str) -> int:
        return len(self.attempts.get(qid, []))

    def attempted(self, qid: str) -> bool:
        return self.count(qid) > 0

    def last(self, qid: str):
        """The student's last attempt at `qid` as (number or None, picks), or None."""
        if not self.attempted(qid):
            return None
        a = self.attempts[qid][-1]
        return a.get("number"), frozenset(a["picks"])

    def record(self, qid: str, parsed, is_right: bool) -> int:
        """Keep an attempt (unless it repeats the last one) and write the file; return which
        attempt it is (1-based)."""
        number, picks = parsed
        entry = {"picks": sorted(picks), "right": is_right}
        if number is not None:
            entry["number"] = number
        kept = self.attempts.setdefault(qid, [])
        if not kept or kept[-1] != entry:
            kept.append(entry)
            self.save()
        return len(kept)

    def save(self) -> None:
        data = {"format": FILE_FORMAT,
                "attempts": {k: v for k, v in self.everyone.items() if v}}
        try:
            if self.default:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(self.path, json.dumps(data, indent=1) + "\n")
        except OSError as exc:
            raise LabError(f"attempts file {self.path}: cannot be written ({exc}); give another "
                           f"(--attempts PATH)") from None


_current: Attempts | None = None


def start(student: str | None = None, attempts=None) -> Attempts:
    """Answer as `student` (the seed of the options' order; remembered in ~/.decode-lab; None:
    as resolve_student says), keeping attempts in the file `attempts` (default
    ~/.decode-lab/selfcheck.json). The questions' functions use it from then on."""
    global _current
    _current = Attempts(attempts, student)
    return _current


def current() -> Attempts:
    """The record in use (start() with no arguments, on first need)."""
    return _current if _current is not None else start()


@dataclass(frozen=True)
class QuestionResult:
    question: str
    status: str          # "right", "wrong", "malformed" or "unanswered"
    message: str         # "" when right; else what is wrong (never the answer)
    attempt: int = 0     # which recorded attempt this was (0: not an attempt)

    @property
    def passed(self) -> bool:
        return self.status == "right"

    @property
    def attempted(self) -> bool:
        return self.status in ("right", "wrong")

    def __bool__(self) -> bool:
        return self.passed

    def line(self) -> str:
        if self.passed:
            return f"{self.question}: PASS" + (f" (attempt {self.attempt})" if self.attempt > 1
                                               else "")
        if self.status == "unanswered":
            return f"{self.question}: not answered -- {self.message}"
        return f"{self.question}: not yet -- {self.message}"

    def __str__(self) -> str:
        return self.line()


# ================================================================ the notebook's interface

def question(qid: str) -> Question:
    """The question `qid` ("q1" ... "q10"); a LabError names the known ids."""
    try:
        return QUESTIONS[qid]
    except (KeyError, TypeError):
        raise LabError(f"unknown question id {qid!r}; the ids are "
                       f"{', '.join(QUESTIONS)}") from None


def ask(qid: str, record: Attempts | None = None) -> None:
    """Print question `qid`, its options in the student's order and how to answer it (never
    the answer)."""
    print(question(qid).prompt((record or current()).student))


def check_answer(qid: str, value, record: Attempts | None = None) -> QuestionResult:
    """Check an attempt and record it (a right or wrong one; None is "not answered" and a
    malformed value is not an attempt), printing nothing."""
    q, record = question(qid), record or current()
    if value is None:
        return QuestionResult(qid, "unanswered", f"give {HOW_TO_ANSWER[q.form][0]}")
    try:
        parsed = q.parse(value, record.student)
    except Malformed as exc:
        return QuestionResult(qid, "malformed", str(exc))
    ok = q.is_right(parsed)
    n = record.record(qid, parsed, ok)
    return QuestionResult(qid, "right", "", n) if ok else QuestionResult(
        qid, "wrong", q.verdict(parsed), n)


def answer(qid: str, value, explain: bool = True, record: Attempts | None = None) -> QuestionResult:
    """Check and record an attempt and print the verdict; after a real attempt (right or
    wrong) and with `explain`, also print the answer and why."""
    record = record or current()
    res = check_answer(qid, value, record)
    print(res.line())
    if explain and res.attempted:
        q = question(qid)
        print(q.solution(record.student, record.last(qid)))
    return res


def reveal(qid: str, record: Attempts | None = None) -> bool:
    """Print the answer to `qid` and why, once an attempt at it is recorded; before one, say so
    and print nothing of the answer. Returns whether it was shown."""
    q, record = question(qid), record or current()
    if not record.attempted(qid):
        print(f"{qid}: no attempt recorded yet (in {record.path}): answer it first with "
              f"{q.how()}; its answer and why come after an attempt")
        return False
    print(q.solution(record.student, record.last(qid)))
    return True
