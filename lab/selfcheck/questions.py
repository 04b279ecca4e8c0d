"""The lecture's ten self-check questions: asked, attempted, and only then explained.

Forms: "choice" (one letter), "choices" (every right letter and no other) and "number+choices"
(q4: a factor, and the consequences among the options). The right answers follow the lecture's
corrected edition; each question has an explanation in this project's words and a note for each
tempting wrong option.

The contract, for the notebook and for `decode-lab selfcheck`:

- An answer must be attempted before it is shown. `ask(qid)` prints a question and how to
  answer it. `answer(qid, value)` checks an attempt, records it in the attempts file, prints the
  verdict and then (explain=True) the answer and why. `reveal(qid)` prints the answer only for a
  question with a recorded attempt; before one it refuses and says so. None or a malformed value
  is not an attempt: nothing is recorded or revealed, and a malformed one is told what is wrong.
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

The attempts file is a small JSON object {"student": ..., "attempts": {qid: [attempt, ...]}},
by default DEFAULT_ATTEMPTS (in the home folder: outside the repository and its data), written
atomically (lab/files.py) and only when an attempt is recorded. `start(student, attempts)`
chooses the student and the file; without a name the student is the one stored in the file,
else the login name.

  q1  choices         right first token, wrong later: the causes                (lecture section 4)
  q2  choice          must the position advance inside the graph?                (section 2)
  q3  choice          a loop bound vs a grid size: what to do with each          (section 2)
  q4  number+choices  standard error 0.55 -> 0.02 ms: variance, consequences     (section 1)
  q5  choice          why the error names the wrong kernel                       (section 3)
  q6  choice          two runs of one build differ at 128k: the likely cause     (section 5)
  q7  choices         what else gains value once the step is captured            (section 6)
  q8  choices         which reductions reorder bit-identically                   (section 8)
  q9  choice          more KV precision, worse parity with the reference         (section 9)
  q10 choice          the comparator fails one file against itself               (section 9)
"""
from __future__ import annotations

import getpass
import hashlib
import json
import math
import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import LabError
from ..files import atomic_write_text, check_output

FORMS = ("choice", "choices", "number+choices")
LETTERS = "abcdefgh"

# q4: the lecture's standard errors of the mean per-token time, eager and captured (ms).
SEM_EAGER_MS = 0.55
SEM_GRAPH_MS = 0.02
SEM_RATIO = SEM_EAGER_MS / SEM_GRAPH_MS

DEFAULT_ATTEMPTS = Path.home() / ".decode-lab" / "selfcheck.json"
FILE_FORMAT = "decode-lab selfcheck attempts, version 1"

_HOW = {"choice": ("one letter", '"<letter>"'),
        "choices": ("every letter that applies, and no other", '["<letter>", "<letter>", ...]'),
        "number+choices": ("the number and every letter that applies",
                           '{"number": <number>, "choices": ["<letter>", ...]}')}


class Malformed(ValueError):
    """An answer of the wrong type or with an unknown option (not counted as an attempt)."""


@dataclass(frozen=True)
class Option:
    text: str
    right: bool = False
    why_not: str = field(default="", repr=False)     # a wrong option: what it misses


def right(text: str) -> Option:
    return Option(text, True)


def wrong(text: str, why_not: str) -> Option:
    return Option(text, False, why_not)


@dataclass(frozen=True)
class Question:
    id: str
    section: str
    text: str
    form: str                                            # one of FORMS
    options: tuple[Option, ...]                          # in the bank's order (their identity)
    hint: str = ""                                       # where to look, after a wrong attempt
    explanation: str = field(default="", repr=False)
    number: float | None = field(default=None, repr=False)    # number+choices: the number
    rel_tol: float = field(default=0.0, repr=False)            # ... within this relative error
    number_notes: dict = field(default_factory=dict, repr=False)   # a known wrong number -> why

    def __post_init__(self):
        if self.form not in FORMS:
            raise ValueError(f"{self.id}: form {self.form!r} is not one of {FORMS}")
        n_right = sum(o.right for o in self.options)
        if not 2 <= len(self.options) <= len(LETTERS) or not n_right or (
                self.form == "choice" and n_right != 1):
            raise ValueError(f"{self.id}: a {self.form} question takes 2 to {len(LETTERS)} "
                             f"options, {'exactly one' if self.form == 'choice' else 'some'} right")
        if (self.form == "number+choices") != (self.number is not None):
            raise ValueError(f"{self.id}: only a number+choices question has a number")
        if any(not o.right and not o.why_not for o in self.options):
            raise ValueError(f"{self.id}: every wrong option needs its why_not")

    @property
    def key(self) -> frozenset:
        """The right options' identities (indices in the bank's order)."""
        return frozenset(i for i, o in enumerate(self.options) if o.right)

    def order(self, student: str) -> tuple[int, ...]:
        """The options' order for `student`: display letter k shows option order[k]."""
        digest = hashlib.sha256(f"{student}\n{self.id}".encode()).digest()
        rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
        return tuple(int(i) for i in rng.permutation(len(self.options)))

    def letter(self, index: int, student: str) -> str:
        return LETTERS[self.order(student).index(index)]

    def how(self, in_json: bool = False) -> str:
        """How to write an answer, in the notebook or in an answers JSON (no example that could
        be the answer)."""
        label, example = _HOW[self.form]
        if in_json:
            return f'{label}: "{self.id}": {example}'
        return f'{label}: answer("{self.id}", {example})'

    def prompt(self, student: str, in_json: bool = False) -> str:
        """The question, its options in `student`'s order, and how to answer it."""
        lines = [_wrap(f"{self.id} (lecture section {self.section}): {self.text}")]
        lines += [_wrap(self.options[i].text, f"  {k}) ")
                  for k, i in zip(LETTERS, self.order(student))]
        lines.append(_wrap(f"answer with {self.how(in_json)}", "  "))
        return "\n".join(lines)

    # ---- parsing and grading: by option identity ------------------------------------------------
    def parse(self, value, student: str) -> tuple[float | None, frozenset]:
        """The attempt as (number or None, the picked options' identities); raise Malformed
        naming what is wrong with it."""
        if self.form == "number+choices":
            if not isinstance(value, dict) or set(value) != {"number", "choices"}:
                raise Malformed(f'takes {{"number": ..., "choices": [...]}}, got '
                                f"{type(value).__name__} {value!r}")
            return _number(value["number"]), self._picks(value["choices"], student)
        if self.form == "choice":
            if not isinstance(value, str):
                raise Malformed(f"takes one letter (a string), got "
                                f"{type(value).__name__} {value!r}")
            return None, frozenset([self._index(value, student)])
        return None, self._picks(value, student)

    def _picks(self, value, student: str) -> frozenset:
        if isinstance(value, str):
            items = [v for v in re.split(r"[\s,]+", value) if v]
        elif isinstance(value, (list, tuple, set, frozenset)):
            items = list(value)
        else:
            raise Malformed(f"takes a list of letters, got {type(value).__name__} {value!r}")
        if not items:
            raise Malformed("pick at least one letter")
        for v in items:
            if not isinstance(v, str):
                raise Malformed(f"takes letters (strings), got {type(v).__name__} {v!r}")
        return frozenset(self._index(v, student) for v in items)

    def _index(self, value: str, student: str) -> int:
        letters = LETTERS[:len(self.options)]
        letter = value.strip().lower()
        if len(letter) != 1 or letter not in letters:
            raise Malformed(f"{value!r} is not one of the letters {', '.join(letters)}")
        return self.order(student)[letters.index(letter)]

    def number_right(self, number: float | None) -> bool:
        return number is None or math.isclose(number, self.number, rel_tol=self.rel_tol)

    def is_right(self, parsed) -> bool:
        number, picks = parsed
        return self.number_right(number) and picks == self.key

    def verdict(self, parsed) -> str:
        """Why an attempt is not right, without naming or counting its wrong or missing picks."""
        number, picks = parsed
        where = f"Hint: {self.hint} (lecture section {self.section})"
        if self.form != "number+choices":
            return f"not right. {where}"
        parts = []
        if not self.number_right(number):
            note = self._number_note(number)
            parts.append(f"the number {number:g} is not within {self.rel_tol:.0%} of the answer"
                         + (f" ({note})" if note else ""))
        parts.append(f"the picked consequences are {'' if picks == self.key else 'not '}right")
        return "; ".join(parts) + f". {where}"

    def _number_note(self, number: float) -> str:
        return next((why for v, why in self.number_notes.items()
                     if math.isclose(number, v, rel_tol=self.rel_tol)), "")

    def solution(self, student: str, parsed=None) -> str:
        """The answer and why, in `student`'s letters; with an attempt, also what its wrong picks
        miss."""
        lines = [f"{self.id} answer:"]
        if self.number is not None:
            lines.append(f"  {self.number:.6g} (accepted within {self.rel_tol:.0%})")
        shown = [(self.letter(i, student), self.options[i]) for i in self.key]
        lines += [_wrap(o.text, f"  {k}) ") for k, o in sorted(shown)]
        lines.append(_wrap(self.explanation, "why: "))
        if parsed is not None and not self.is_right(parsed):
            number, picks = parsed
            if number is not None and self._number_note(number):
                lines.append(_wrap(self._number_note(number), f"your {number:g}: "))
            for k, i in sorted((self.letter(i, student), i) for i in picks - self.key):
                lines.append(_wrap(self.options[i].why_not, f"your {k}): "))
        return "\n".join(lines)


def _number(value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise Malformed(f"takes a number, got {type(value).__name__} {value!r}")
    if not math.isfinite(float(value)):
        raise Malformed(f"takes a finite number, got {value!r}")
    return float(value)


def _wrap(text: str, first: str = "") -> str:
    """`text` in lines of at most 100 characters, after `first`, continued under its text."""
    return textwrap.fill(text, 100, initial_indent=first, subsequent_indent=" " * len(first))


# ================================================================ the record of attempts

def _login() -> str:
    try:
        return getpass.getuser() or "student"
    except (KeyError, OSError):      # no login name (some containers): one shared default
        return "student"


def check_student(student) -> str:
    """A usable student name or id (a LabError for anything else)."""
    if not isinstance(student, str) or not student.strip() or len(student) > 100 or (
            not student.isprintable()):
        raise LabError(f"student {student!r}: give a name or id of 1 to 100 printable characters")
    return student.strip()


def _kept(qid: str, attempt) -> bool:
    """Whether `attempt`, read from an attempts file, is one that record() writes for `qid`."""
    n = len(QUESTIONS[qid].options)
    number = attempt.get("number") if isinstance(attempt, dict) else None
    return (isinstance(attempt, dict) and set(attempt) <= {"picks", "right", "number"}
            and isinstance(attempt.get("right"), bool) and isinstance(attempt.get("picks"), list)
            and all(type(i) is int and 0 <= i < n for i in attempt["picks"])
            and (number is None or (type(number) in (int, float) and math.isfinite(number))))


class Attempts:
    """Who is answering (it seeds the options' order) and every distinct attempt so far, kept in
    a JSON file. The file is read when this is made and written, whole and atomically, each time
    an attempt is recorded; `path=None` is DEFAULT_ATTEMPTS (its folder made when needed)."""

    def __init__(self, path=None, student: str | None = None):
        self.default = path is None
        self.path = Path(DEFAULT_ATTEMPTS if path is None else path)
        if not self.default:
            check_output(self.path, "--attempts")
        stored = self._load()
        self.attempts: dict[str, list[dict]] = stored.get("attempts", {})
        self.student = check_student(student if student is not None else
                                     stored.get("student") or _login())

    def _load(self) -> dict:
        if not self.path.exists():
            return {}
        try:
            data = json.loads(self.path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise LabError(f"attempts file {self.path}: cannot be read ({exc}); move it away "
                           f"or give another (--attempts PATH)") from None
        ok = (isinstance(data, dict) and data.get("format") == FILE_FORMAT
              and isinstance(data.get("student"), str) and isinstance(data.get("attempts"), dict)
              and all(k in QUESTIONS and isinstance(v, list) and all(_kept(k, a) for a in v)
                      for k, v in data["attempts"].items()))
        if not ok:
            raise LabError(f"attempts file {self.path}: not a self-check attempts file; move it "
                           f"away or give another (--attempts PATH)")
        return data

    def count(self, qid: str) -> int:
        return len(self.attempts.get(qid, []))

    def attempted(self, qid: str) -> bool:
        return self.count(qid) > 0

    def last(self, qid: str):
        """The last attempt at `qid` as (number or None, picks), or None."""
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
        data = {"format": FILE_FORMAT, "student": self.student, "attempts": self.attempts}
        try:
            if self.default:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(self.path, json.dumps(data, indent=1) + "\n")
        except OSError as exc:
            raise LabError(f"attempts file {self.path}: cannot be written ({exc}); give another "
                           f"(--attempts PATH)") from None


_current: Attempts | None = None


def start(student: str | None = None, attempts=None) -> Attempts:
    """Answer as `student` (the seed of the options' order), keeping attempts in the file
    `attempts` (default DEFAULT_ATTEMPTS). The questions' functions use it from now on."""
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


# ================================================================ the bank

QUESTIONS: dict[str, Question] = {q.id: q for q in (
    Question(
        "q1", "4",
        "A captured decode step gives a right first token, then fluent but wrong tokens after it "
        "(in this lab's demo the replays differ from the eager steps from replay 2 on). Which of "
        "these can cause exactly that? Pick every one that can.",
        "choices",
        (right("the KV-cache row address, computed from the position on the host and frozen "
               "into the graph at capture"),
         wrong("capturing ran the recorded kernels once, so the first replay did the step a "
               "second time",
               "a capture records the launches without running any kernel"),
         right("the position advanced by host code that runs at capture but never before a "
               "replay"),
         right("the input token id handed to the embedding kernel as a by-value argument"),
         wrong("float32 rounding: a replay adds its partial sums in another order than the "
               "eager launches do",
               "a replay runs the same kernels with the same arguments in the same order as the "
               "eager step: with deterministic kernels and the same state the bytes match"),
         right("a dependency between two pieces of work in the step that the graph does not "
               "hold")),
        hint="which per-token values can a capture freeze, and does a capture run anything?",
        explanation=(
            "The class is state that stops changing: a per-token value frozen into the graph "
            "when it was captured (or a dependency the graph lost). The first replay re-runs the "
            "captured step, for which the frozen value is still right; later replays reuse it "
            "and go wrong, from replay 2 in this lab (later, when a plan change re-captures in "
            "between). Look first at whatever must differ per token: pointers that depend on the "
            "position (KV-cache rows), the position update, the input-token update, any "
            "recurrent state. Capturing only records launches; it executes none of them.")),
    Question(
        "q2", "2",
        "This engine advances the decode position with a kernel inside the captured step. Is "
        "that the only correct design, and where can the position live?",
        "choice",
        (wrong("Yes: a replay cannot see anything the host does between two launches, so the "
               "advance must be a captured kernel, on a position that lives in device memory.",
               "a replay reads device memory when it runs, and an executable graph's node "
               "parameters can be updated between launches: either lets the host advance it"),
         right("No: each launch must see the current position, whether a captured kernel advances "
               "a device buffer or the host writes it or updates a node parameter."),
         wrong("No: the position can stay a by-value argument of a plain captured graph; the "
               "host increments its own variable before each launch and the replay reads it.",
               "a by-value argument is copied into the graph at capture: a host variable changed "
               "later reaches a replay only through an update of the node's parameters"),
         wrong("Yes: while a graph of the step exists the host may not write the device memory "
               "it reads, so no update from the host between launches is allowed.",
               "the host may write device memory between graph launches, in stream order; the "
               "next replay reads what was written")),
        hint="when does a replay read device memory, and what can change between two launches "
             "of one executable graph? (notebook 11 updates a live graph)",
        explanation=(
            "It need not be inside. What must hold is that each launch sees the current "
            "position, not one baked in at capture. This engine keeps it in a device buffer and "
            "advances it with a kernel that belongs to the graph, so N replays decode N tokens "
            "with no host work between them. Another design is as safe: the host writes the "
            "device position between launches, or updates the kernel node's by-value parameter "
            "in the executable graph (notebook 11 updates a live graph's nodes). What breaks is "
            "host code that ran only at capture.")),
    Question(
        "q3", "2",
        "Inside attention the context length is only a loop bound; the number of splits sets the "
        "attention grid. What do you do with each before capturing?",
        "choice",
        (wrong("splits: the kernel reads it from device memory like any other input; context "
               "length: capture one graph per context length, since it changes every loop.",
               "a plain kernel node keeps the grid it was captured with, and a graph per context "
               "length means a capture for every token"),
         wrong("neither: a kernel cannot read its own loop bound from device memory at run time, "
               "so both become capture keys, and every new value means a new graph.",
               "a kernel can load its loop bound from memory while it runs; what a replay keeps "
               "is the recorded launch, grid included"),
         right("context length: the kernel reads it from device memory while it runs; splits: a "
               "host decision, one graph per plan, re-captured or updated as it moves."),
         wrong("both go to device memory: a plain captured kernel node reads its grid from a "
               "device buffer at every replay, so nothing ever needs capturing again.",
               "a captured kernel node keeps its recorded grid; changing it takes an explicit "
               "update (from the host, or from the device for a device-updatable node) or a "
               "conditional node that picks among prebuilt bodies")),
        hint="which of the two does the kernel read while it runs, and which belongs to the "
             "recorded launch?",
        explanation=(
            "A loop bound is read by the kernel while it runs, so it can come from device memory "
            "at replay time: this engine's attention computes the context length from the "
            "device position. A grid belongs to the recorded launch: a replay uses it as "
            "captured unless something changes the node on purpose: the host (an executable "
            "graph update, or setting a kernel node's parameters), the device (a "
            "device-updatable kernel node), or a conditional SWITCH node that runs one of "
            "several prebuilt bodies chosen by a device value (notebook 11 shows the host update "
            "and the SWITCH). This engine keeps splits a host decision made by decode_plan, part "
            "of the capture key, and re-captures when the key moves (a cache of graphs per key "
            "would also do). The launcher and the stale-graph check call the same decode_plan, "
            "so they cannot disagree.")),
    Question(
        "q4", "1",
        f"Graph capture cut the standard error of the mean per-token time from {SEM_EAGER_MS} ms "
        f"(eager) to {SEM_GRAPH_MS} ms (captured), with the same number of reps in each arm. By "
        "what factor did the estimated variance of the per-rep times fall? And which of these "
        "are consequences for how you run your benchmarks from now on? Pick every one.",
        "number+choices",
        (right("Keep both arms in paired, interleaved reps within one session: the eager arm "
               "still drifts between sessions, so an old eager number is no baseline."),
         right("Measure the tail (p99) on its own, over many requests: a handful of per-rep "
               "means and their standard errors says nothing about it."),
         right("With the captured arms this tight, smaller real differences between them "
               "become resolvable with the same number of reps."),
         wrong("Now that the noise is gone, one rep per arm is enough: drop the repetitions, "
               "and with them the standard error, from every report.",
               "the standard error is still what says whether a difference is real; a small "
               "one is measured, not assumed"),
         wrong("The tail is compressed as much as the standard error, so p99 can be read off "
               "the five reps' standard error, with no separate measurement at all.",
               "five paired means and their standard errors say nothing about p99: measure the "
               "tail over enough requests"),
         wrong("Compare each new captured build with the eager figures recorded last month: "
               "with the host out of the loop, drift between sessions is gone for good.",
               "the eager arm moved ~15% between sessions in the lecture's report: compare arms "
               "measured together, interleaved")),
        number=SEM_RATIO ** 2,
        rel_tol=0.02,
        number_notes={SEM_RATIO: "that is the ratio of the standard errors; a variance goes "
                                 "with the square of a spread",
                      math.sqrt(SEM_RATIO): "that is the square root of the standard errors' "
                                            "ratio; a variance goes with the square of a spread"},
        hint="with equal reps a standard error scales with the standard deviation; then ask what "
             "paired reps protect against, and what a few means cannot show",
        explanation=(
            "With equal sample counts the standard error scales with the standard deviation, so "
            f"it fell {SEM_RATIO:.3g}x and the estimated variance by its square, about "
            f"{SEM_RATIO ** 2:.0f}x. Consequences: keep measuring in paired, interleaved reps "
            "(the eager arm still drifts between sessions, so never compare against an old "
            "eager run); the tighter captured arms resolve smaller wins with the same reps; and "
            "a few means say nothing about the tail: measure p99 on its own, over many "
            "requests.")),
    Question(
        "q5", "3",
        "A table upload made lazily on first use breaks the capture at the first MoE layer, yet "
        "the error message names the MoE dispatch kernel. Why?",
        "choice",
        (wrong("The dispatch kernel reads the table before the asynchronous upload has "
               "finished, and that race makes the dispatch itself fail.",
               "a race gives wrong numbers, not a capture error; and during a capture nothing "
               "runs yet, the step is only being recorded"),
         wrong("Capture recorded the upload as a copy node; instantiation accepted it, and the "
               "node failed later, when a replay reached the dispatch.",
               "the synchronous copy is refused during the capture itself and invalidates it: "
               "no graph is made"),
         wrong("The illegal upload left a sticky error that corrupts the CUDA context, so every "
               "later call fails and the first one checked takes the blame.",
               "sticky errors are those that corrupt the context (a kernel's illegal address, "
               "say) and need a new process; an illegal call in a capture fails at once with "
               "cudaErrorStreamCaptureUnsupported and invalidates the capture, and the context "
               "stays usable"),
         right("The synchronous upload is illegal in a capture: it fails at once and invalidates "
               "it; unchecked, that shows at the next check, after the dispatch."),
         wrong("The dispatch kernel is the real fault; that the lazy upload ran just before "
               "it is a coincidence of timing, nothing more.",
               "an error shows at the call that is checked next, so the name it carries says "
               "where it was noticed, not where it began")),
        hint="where was the error noticed, and where did it begin?",
        explanation=(
            "An error is reported where it is noticed, which can be later than where it began. "
            "A synchronous copy while the stream captures is refused at once "
            "(cudaErrorStreamCaptureUnsupported) and invalidates the capture; code that ignores "
            "that call's status learns of it at the next check: after the dispatch launch, which "
            "fails into the invalidated capture, or at end_capture. An asynchronous fault inside "
            "a kernel does the same, surfacing at a later synchronising call. So the kernel "
            "named in a message is not evidence: check the capture status, every initialisation "
            "call that can run inside a capture, each launch's error and its completion. Then do "
            "first-use work (tables, scratch, handles) at start-up, before any capture.")),
    Question(
        "q6", "5",
        "You byte-compare two runs of the same build at context 128k and they differ. The "
        "benchmark reaches 128k by seeking: it sets the position without writing the KV rows "
        "before it. What is the likely cause?",
        "choice",
        (wrong("Graph capture is broken at long context: one of the two runs replayed a graph "
               "that was captured for a much shorter context.",
               "the same build against itself differs too: the comparison, not the capture, is "
               "what cannot be trusted"),
         wrong("A seek invalidates the captured graph, so one run replays a stale graph while "
               "the other one re-captures at the new position.",
               "a seek writes the device position; the graph is chosen by the plan key, which "
               "a seek does not break"),
         right("Attention reads KV rows nobody wrote, and unset memory differs between runs: "
               "run the setup against itself (A/A), check initialisation."),
         wrong("float32 rounding is not reproducible at long context: past some length byte "
               "compares stop working, so compare with a tolerance instead.",
               "kernels with a fixed reduction order give the same bytes on the same inputs, at "
               "any context; a tolerance would hide the real cause")),
        hint="what do the cache rows before 128k hold after a seek, and what would an A/A say?",
        explanation=(
            "Before concluding anything, make sure the comparison can tell a difference at all: "
            "the same inputs (hash them), state reset between runs, every buffer initialised, "
            "deterministic kernels, no races, and the configuration run against itself. A seek "
            "skips the prefix, so attention reads cache rows that were never written. "
            "Uninitialised, they hold leftovers that differ from run to run: the A/A fails too, "
            "and the test is what is broken. Zero-initialised, both runs read the same zeros and "
            "an A/A can pass, but neither stands for a real 128k prefix.")),
    Question(
        "q7", "6",
        "A one-kernel design was right while every kernel was launched from the host; after the "
        "decode step was captured, splitting it into two kernels won. Which of these other "
        "optimisation classes gain value the same way once the step is captured? Pick every "
        "one that does.",
        "choices",
        (wrong("fusing two kernels into one only to save the launch between them",
               "part of what fusion bought was the launch that capture already removed: it is "
               "worth less, not more"),
         right("specialised kernel variants instead of one kernel full of branches"),
         wrong("cutting the bytes a kernel reads from memory, by packing its weights more "
               "tightly",
               "a kernel's memory traffic costs the same in a graph node as in an eager launch"),
         right("an extra small kernel that gives one phase a better grid, such as a separate "
               "merge"),
         wrong("replacing numba's per-call dispatcher with launches bound once, to shave the "
               "host cost of each eager launch",
               "it cuts the host cost of eager launches, which a captured step no longer pays")),
        hint="what did an extra kernel cost when launched from the host, and what does it cost "
             "as a node of a captured graph?",
        explanation=(
            "Eagerly, every launch costs a host submit, so a second kernel had to pay for itself "
            "and the single kernel won. A captured step is submitted once; an extra node costs "
            "only its device-side overhead, so a split that gives each half a grid that fills "
            "the GPU can now win. The same shift favours specialised variants over one branchy "
            "kernel and small extra phases with better grids. Nodes are still not free: count "
            "their overhead and the traffic between the halves.")),
    Question(
        "q8", "8",
        "Which of these reductions can you reorder and still claim a bit-identical result? "
        "(Finite inputs; for the maximum, a fixed rule for ties, NaN and signed zero.) Pick "
        "every one.",
        "choices",
        (wrong("a sum of float32 values",
               "float addition rounds at each step and is not associative"),
         right("the largest magnitude |x|"),
         wrong("a product of float32 values",
               "float multiplication rounds at each step and is not associative"),
         right("a bitwise OR of integers")),
        hint="which of these operations round their result, and which are exact in any order?",
        explanation=(
            "Floating-point addition and multiplication round after every operation, so another "
            "grouping can change the last bits: reorder them only with a tolerance, and say so. "
            "Bitwise OR (and AND, XOR) of fixed-width integers is associative and commutative: "
            "every order gives the same bits. The maximum of finite non-negative magnitudes is "
            "the same value in any order, once NaN, signed zero and ties (which index wins, for "
            "an argmax) have a fixed rule; without that rule, do not claim identical bytes.")),
    Question(
        "q9", "9",
        "Your engine keeps its KV cache in float32; the implementation you are scored against "
        "keeps it in float16. Your parity metric against it gets worse the more precision you "
        "keep. What do you conclude, and do?",
        "choice",
        (right("Parity with one rounding implementation and error against the exact result are "
               "two measurements: rule out other differences, report both."),
         wrong("Switch the cache to float16: matching the reference's storage type is sure to "
               "bring the logits closer, whatever else differs between them.",
               "the lecture's own table shows the float16 candidate farther from the reference: "
               "rounding, kernel changes and mismatched weights all move it"),
         wrong("More precision can only bring you closer to any reference, so a parity metric "
               "that worsens as precision grows is broken: stop reporting it.",
               "a reference that rounds is not the exact result; being closer to the "
               "mathematics can move you away from it"),
         wrong("KL divergence is a metric, so subtracting each arm's divergence from the "
               "reference gives the distance between the two arms.",
               "KL divergence is not a metric: offsets against a third run do not cancel")),
        hint="is the implementation you are scored against the exact result?",
        explanation=(
            "Precision and agreement with one particular implementation are two different goals. "
            "An implementation that rounds its cache to float16 is not the exact result, so a "
            "float32 cache can sit closer to the mathematics and farther from it. But storage "
            "precision alone does not predict the combined effect: in the lecture's own table "
            "the float16 change moved the build farther from the reference. Make both sides use "
            "identical weights and inputs, isolate the one change, and report both numbers: the "
            "distance to the reference implementation and the error against a float64 oracle "
            "(lab/reference.py here).")),
    Question(
        "q10", "9",
        "A logit-comparison tool prints FAIL for your build against the reference's saved "
        "logits, for main against them, and for that saved file compared with itself (the same "
        "file given as both inputs; nothing is re-run). What do you conclude?",
        "choice",
        (wrong("Its threshold is meant for two runs of one implementation, so FAILs across "
               "implementations are expected: ignore all three verdicts.",
               "a tolerance explains FAILs between implementations, not a FAIL of one file "
               "against itself"),
         right("The tool is suspect: a file against itself must give zero divergence. Check its "
               "threshold, parsing, normalisation, determinism."),
         wrong("All three are wrong, the reference included: even its own logits fail, so its "
               "saved file must be corrupt as well.",
               "the same bytes on both sides fail: the tool, not the builds, is shown broken"),
         wrong("The reference is not deterministic: its logits differ from run to run, and the "
               "tool, with its strict bar, works as intended.",
               "one saved file was given twice and nothing was re-run: determinism cannot "
               "enter")),
        hint="what must any comparison say about one file compared with itself?",
        explanation=(
            "A file compared with itself must give a divergence of exactly zero and pass any "
            "threshold. If the tool still says FAIL, the tool is broken: inspect its threshold, "
            "how it parses and normalises the logits, and whether it is deterministic, before "
            "trusting any verdict it gives on the builds. A tolerance meant for another question "
            "can explain FAILs between implementations, never a FAIL of something against "
            "itself. It is the A/A control, applied to the measuring tool.")),
)}


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
        return QuestionResult(qid, "unanswered", f"give {_HOW[q.form][0]}")
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
