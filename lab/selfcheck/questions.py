"""The lecture's ten self-check questions, with structured answers and an automatic check.

Each `Question` has a form: "choice" (one letter), "choices" (every right letter, no wrong one)
or "number" (within a relative tolerance). The right answers follow the lecture's corrected
edition; each comes with an explanation in this project's words, and a note for each tempting
wrong pick. They live only here: `ask(qid)` prints a question and how to answer it, never its
answer; `answer(qid, value)` checks an attempt, prints the verdict, then reveals the answer and
why; `reveal(qid)` reveals it without an attempt. An unanswered (None) or malformed value is
not an attempt: nothing is revealed, and a malformed one says what is wrong with it.

  q1 choices   right first token, wrong from the third: the causes       (lecture section 4)
  q2 choice    must the position increment be inside the graph?          (section 2)
  q3 choice    a loop bound vs a grid size: what to do with each         (section 2)
  q4 number    standard error 0.55 -> 0.02 ms: the variance ratio        (section 1)
  q5 choice    why the error names the wrong kernel                      (section 3)
  q6 choice    two runs of one build differ at 128k: the likely cause    (section 5)
  q7 choices   what else gains value once the step is captured           (section 6)
  q8 choices   which reductions reorder bit-identically                  (section 8)
  q9 choice    more KV precision, worse parity with the reference        (section 9)
  q10 choice   the comparator fails even the reference against itself    (section 9)
"""
from __future__ import annotations

import math
import re
import textwrap
from dataclasses import dataclass, field

import numpy as np

from ..errors import LabError

FORMS = ("choice", "choices", "number")

# q4: the lecture's standard errors of the mean per-token time, eager and captured (ms).
SEM_EAGER_MS = 0.55
SEM_GRAPH_MS = 0.02
SEM_RATIO = SEM_EAGER_MS / SEM_GRAPH_MS


_HOW = {"choice": ("one letter", '"<letter>"'),
        "choices": ("every letter that applies, and no other", '["<letter>", "<letter>", ...]'),
        "number": ("a number", "<number>")}


class Malformed(ValueError):
    """An answer of the wrong type or with an unknown option (not counted as an attempt)."""


@dataclass(frozen=True)
class Question:
    id: str
    section: str
    text: str
    form: str                                          # one of FORMS
    options: tuple[str, ...] = ()                      # the choice forms' options: a), b), ...
    answer: object = field(default=None, repr=False)   # a letter, a frozenset of letters, a float
    rel_tol: float = field(default=0.0, repr=False)    # "number": accepted relative error
    explanation: str = field(default="", repr=False)
    why_not: dict = field(default_factory=dict, repr=False)   # wrong letter (or number) -> why

    def __post_init__(self):
        if self.form not in FORMS:
            raise ValueError(f"{self.id}: form {self.form!r} is not one of {FORMS}")
        if (self.form == "number") != (not self.options) or len(self.options) > 8:
            raise ValueError(f"{self.id}: a {self.form} question takes "
                             f"{'no options' if self.form == 'number' else '1 to 8 options'}")

    @property
    def letters(self) -> tuple[str, ...]:
        return tuple("abcdefgh"[:len(self.options)])

    def option(self, letter: str) -> str:
        return self.options[self.letters.index(letter)]

    def how(self, in_json: bool = False) -> str:
        """How to write an answer, in the notebook or in an answers JSON (no example that could
        be the answer)."""
        label, example = _HOW[self.form]
        if in_json:
            return f'{label}: "{self.id}": {example}'
        return f'{label}: answer("{self.id}", {example})'

    def prompt(self, in_json: bool = False) -> str:
        """The question, its options and how to answer it."""
        lines = [_wrap(f"{self.id} (lecture section {self.section}): {self.text}")]
        lines += [_wrap(text, f"  {k}) ") for k, text in zip(self.letters, self.options)]
        lines.append(f"  answer with {self.how(in_json)}")
        return "\n".join(lines)

    def parse(self, value):
        """The attempt in normal form (a letter, a frozenset of letters or a float); raise
        Malformed naming what is wrong with it."""
        if self.form == "number":
            number = isinstance(value, (int, float, np.integer, np.floating))
            if isinstance(value, bool) or not number:
                raise Malformed(f"takes a number, got {type(value).__name__} {value!r}")
            if not math.isfinite(float(value)):
                raise Malformed(f"takes a finite number, got {value!r}")
            return float(value)
        if self.form == "choice":
            if not isinstance(value, str):
                raise Malformed(f"takes one letter (a string), got "
                                f"{type(value).__name__} {value!r}")
            return self._letter(value)
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
        return frozenset(self._letter(v) for v in items)

    def _letter(self, value: str) -> str:
        letter = value.strip().lower()
        if letter not in self.letters:
            raise Malformed(f"{value!r} is not one of the letters {', '.join(self.letters)}")
        return letter

    def is_right(self, parsed) -> bool:
        if self.form == "number":
            return math.isclose(parsed, self.answer, rel_tol=self.rel_tol)
        return parsed == self.answer

    def note(self, pick) -> str:
        """Why a wrong pick is wrong (a letter, or a number near a known wrong value), or ""."""
        if self.form == "number":
            return next((why for v, why in self.why_not.items()
                         if math.isclose(pick, v, rel_tol=self.rel_tol)), "")
        return self.why_not.get(pick, "")

    def verdict(self, parsed) -> str:
        """Why an attempt is wrong, without giving the answer away."""
        if self.form == "number":
            hint = self.note(parsed)
            return f"{parsed:g} is not within {self.rel_tol:.0%} of the answer" + (
                f". Hint: {hint}" if hint else "")
        if self.form == "choice":
            return f"you picked {parsed}"
        wrong, missing = len(parsed - self.answer), len(self.answer - parsed)
        return (f"of your picks {', '.join(sorted(parsed))}: {wrong} wrong, {missing} right "
                f"one(s) missing")

    def solution(self, parsed=None) -> str:
        """The answer and why; with an attempt, also why its wrong picks are wrong."""
        lines = [f"{self.id} answer:"]
        if self.form == "number":
            lines.append(f"  {self.answer:.6g} (accepted within {self.rel_tol:.0%})")
        else:
            right = [self.answer] if self.form == "choice" else sorted(self.answer)
            lines += [_wrap(self.option(k), f"  {k}) ") for k in right]
        lines.append(_wrap(self.explanation, "why: "))
        if parsed is not None and not self.is_right(parsed):
            picks = [parsed] if self.form != "choices" else sorted(parsed - self.answer)
            for p in picks:
                if self.note(p):
                    label = f"{p:g}" if self.form == "number" else p
                    lines.append(_wrap(self.note(p), f"your {label}: "))
        return "\n".join(lines)


def _wrap(text: str, first: str = "") -> str:
    """`text` in lines of at most 100 characters, after `first`, continued under its text."""
    return textwrap.fill(text, 100, initial_indent=first, subsequent_indent=" " * len(first))


@dataclass(frozen=True)
class QuestionResult:
    question: str
    status: str          # "right", "wrong", "malformed" or "unanswered"
    message: str         # "" when right; else what is wrong (never the answer)

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
            return f"{self.question}: PASS"
        if self.status == "unanswered":
            return f"{self.question}: not answered -- {self.message}"
        return f"{self.question}: not yet -- {self.message}"

    def __str__(self) -> str:
        return self.line()


# ================================================================ the bank

QUESTIONS: dict[str, Question] = {q.id: q for q in (
    Question(
        "q1", "4",
        "A captured decode step gives the right first token, then fluent but wrong text from the "
        "third token on. Which of these can cause exactly that? Pick every one that can.",
        "choices",
        ("the KV-cache row address, computed from the position on the host and frozen "
         "into the graph at capture",
         "capturing ran the recorded kernels once, so the first replay did the step twice",
         "the position advanced by host code that runs at capture but never before a replay",
         "the input token id passed to the embedding kernel as a by-value argument",
         "float32 rounding: a replay sums in another order than the eager launches do",
         "a dependency between two pieces of work in the step that the graph does not hold"),
        answer=frozenset("acdf"),
        explanation=(
            "The class is state that stops changing: a per-token value frozen into the graph "
            "when it was captured (or a dependency the graph lost). The first replay re-runs the "
            "captured step, for which the frozen value is still right; later replays reuse it "
            "and go wrong. Look first at whatever must differ per token: pointers that depend on "
            "the position (KV-cache rows), the position update, the input-token update, any "
            "recurrent state. Capturing only records launches; it executes none of them."),
        why_not={"b": "a capture records the launches without running any kernel",
                 "e": "a replay runs the same kernels with the same arguments in the same order "
                      "as the eager step: with deterministic kernels the bytes match"}),
    Question(
        "q2", "2",
        "This engine advances the decode position with a kernel inside the captured step. Is "
        "that the only correct design, and where must the position live?",
        "choice",
        ("Yes: a graph cannot see anything the host changes between launches, so the "
         "increment must be a captured kernel.",
         "No: replays must read the current position from device memory when they run; "
         "this engine advances it there with a captured kernel, and a design that writes "
         "the device-resident position between launches is correct too.",
         "No: the position can stay a by-value kernel argument, as long as the host "
         "increments it before each launch.",
         "Yes: the host may not write device memory while a graph of the step exists."),
        answer="b",
        explanation=(
            "It need not be inside. Every sound design has replays read the position from "
            "device memory at run time instead of a value baked in at capture. This engine keeps "
            "it in a device buffer and advances it with a kernel that belongs to the graph, so N "
            "replays decode N tokens with no host work between them. Writing the device "
            "position (or updating the node's parameters) between launches is also correct; "
            "what breaks is host code that ran only at capture."),
        why_not={"a": "a replay reads device memory when it runs: a host write to a buffer "
                      "between launches is what the next replay sees",
                 "c": "a by-value argument is copied into the graph at capture; changing the "
                      "host variable later changes nothing a replay reads",
                 "d": "the host may write device memory between graph launches"}),
    Question(
        "q3", "2",
        "Inside attention the context length is only a loop bound; the number of splits sets the "
        "attention grid. What do you do with each before capturing?",
        "choice",
        ("splits: the kernel reads it from device memory; context length: one graph per "
         "context length",
         "neither can be promoted: a kernel cannot read its own loop bound from device "
         "memory, so both become capture keys",
         "context length: the kernel reads it from device memory when it runs (position "
         "+ 1); splits: a host decision made by one plan function, with one graph per "
         "plan, re-captured (or picked from a cache, or updated) when the plan changes",
         "both go to device memory: a replay reads each node's grid size from device "
         "memory when it launches"),
        answer="c",
        explanation=(
            "A loop bound is read by the kernel while it runs, so it can come from device memory "
            "at replay time: this engine's attention computes the context length from the "
            "device position. A grid size is part of the launch that the graph recorded; "
            "nothing a kernel reads can change it. So the splits stay a host decision and "
            "become part of the capture key: this engine re-captures when decode_plan moves to "
            "a new key (a cache of graphs per key, or a documented graph or node update, would "
            "also do). The launcher and the stale-graph check call the same decode_plan, so "
            "they cannot disagree."),
        why_not={"a": "the grid is fixed in the recorded launch, and a graph per context length "
                      "would mean a capture for every token",
                 "b": "a kernel can load its loop bound from memory at run time; only launch "
                      "dimensions are frozen",
                 "d": "launch dimensions are recorded in the graph's nodes; device memory does "
                      "not change them"}),
    Question(
        "q4", "1",
        f"Graph capture cut the standard error of the mean per-token time from {SEM_EAGER_MS} ms "
        f"(eager) to {SEM_GRAPH_MS} ms (captured), with the same number of reps in each arm. By "
        "what factor did the estimated variance of the per-rep times fall? (The lecture also "
        "asks for two consequences for your benchmark suite: they are in the explanation.)",
        "number",
        answer=SEM_RATIO ** 2,
        rel_tol=0.02,
        explanation=(
            "With equal sample counts the standard error scales with the standard deviation, so "
            f"it fell {SEM_RATIO:.3g}x and the variance by its square. "
            "Consequences: keep measuring in paired, interleaved reps (the eager arm still "
            "drifts between sessions, so never compare against an old eager run); the tighter "
            "captured arms resolve smaller wins with the same reps; and a few means say nothing "
            "about the tail: measure p99 on its own, over many tokens."),
        why_not={SEM_RATIO: "that is the ratio of the standard errors; a variance goes with "
                            "the square of a spread",
                 math.sqrt(SEM_RATIO): "that is the square root of the standard errors' ratio; a "
                                       "variance goes with the square of a spread"}),
    Question(
        "q5", "3",
        "A table upload made lazily on first use breaks the capture at the first MoE layer, yet "
        "the error message names the MoE dispatch kernel. Why?",
        "choice",
        ("The MoE dispatch kernel reads the table before the upload has finished: a race.",
         "Capture recorded the upload as a graph node, and that node failed on replay.",
         "The dispatch kernel is the real fault; the lazy upload is a coincidence.",
         "The upload is a synchronous copy, which is not allowed while the stream is "
         "capturing; the failure is sticky and asynchronous, so a later call (the next "
         "launch, or the end of the capture) reports it."),
        answer="d",
        explanation=(
            "CUDA often reports an error at a later call than the one that caused it, and a "
            "capture invalidated by an illegal operation (a synchronous copy, an ordinary "
            "allocation) stays invalid: the next launch or end_capture is where it shows. So the "
            "kernel named in the message is not evidence: check the capture status, every "
            "initialisation path that can run inside a capture, launch errors and completion. "
            "Then do first-use work (tables, scratch, handles) at start-up, before any capture."),
        why_not={"a": "a race gives wrong numbers, not a capture error; and nothing ran yet, the "
                      "step was only being recorded",
                 "b": "the illegal copy invalidates the capture itself: no graph is made",
                 "c": "the error surfaces at whatever call comes next, so the name it carries "
                      "says where it showed, not where it was caused"}),
    Question(
        "q6", "5",
        "You byte-compare two runs of the same build at context 128k and they differ. The "
        "benchmark reaches 128k by seeking: it sets the position without writing the KV rows "
        "before it. What is the likely cause?",
        "choice",
        ("Graph capture is broken at long context.",
         "A seek invalidates the captured graph, so one run replays a stale graph.",
         "Attention reads KV rows nobody wrote; in an uninitialised cache they hold "
         "whatever the memory held before, which differs between runs. Compare the "
         "configuration with itself (A/A) and check initialisation before believing any "
         "A/B.",
         "float32 rounding is not reproducible at long context, so byte compares cannot "
         "work there."),
        answer="c",
        explanation=(
            "Before concluding anything, make sure the comparison can tell a difference at all: "
            "the same inputs (hash them), state reset between runs, every buffer initialised, "
            "deterministic kernels, no races, and the configuration run against itself. A seek "
            "skips the prefix, so attention reads cache rows that were never written. "
            "Uninitialised, they hold leftovers that differ from run to run: the A/A fails too, "
            "and the test is what is broken. Zero-initialised, both runs read the same zeros and "
            "an A/A can pass, but neither stands for a real 128k prefix: good for timing, not "
            "for correctness."),
        why_not={"a": "the same build against itself differs too: the comparison, not the "
                      "capture, is what cannot be trusted",
                 "b": "a seek writes the device position; the graph is chosen by the plan key",
                 "d": "kernels with a fixed reduction order give the same bytes on the same "
                      "inputs, at any context"}),
    Question(
        "q7", "6",
        "A one-kernel design was right while every kernel was launched from the host; after the "
        "decode step was captured, splitting it into two kernels won. Which of these other "
        "optimisation classes gain value the same way once the step is captured? Pick every "
        "one that does.",
        "choices",
        ("fusing two kernels only to save a launch",
         "specialised kernel variants in place of one kernel full of branches",
         "cutting the bytes a kernel reads from memory",
         "an extra small kernel that gives one phase a better grid (a separate merge, say)",
         "replacing numba's dispatcher with pre-bound launches"),
        answer=frozenset("bd"),
        explanation=(
            "Eagerly, every launch costs a host submit, so a second kernel had to pay for itself "
            "and the single kernel won. A captured step is submitted once; an extra node costs "
            "only its device-side overhead, so a split that gives each half a grid that fills "
            "the GPU can now win. The same shift favours specialised variants over one branchy "
            "kernel and small extra phases with better grids. Nodes are still not free: count "
            "their overhead and the traffic between the halves."),
        why_not={"a": "part of what fusion bought was the launch that capture already removed: "
                      "it is worth less, not more",
                 "c": "a kernel's memory traffic costs the same in a graph node as in an eager "
                      "launch",
                 "e": "it cuts the host cost of eager launches, which a captured step no longer "
                      "pays"}),
    Question(
        "q8", "8",
        "Which of these reductions can you reorder and still claim a bit-identical result? "
        "(Finite inputs; for the maximum, a fixed rule for ties, NaN and signed zero.) Pick "
        "every one.",
        "choices",
        ("a sum of float32 values",
         "a maximum over magnitudes |x|",
         "a product of float32 values",
         "a bitwise OR of integers"),
        answer=frozenset("bd"),
        explanation=(
            "Floating-point addition and multiplication round after every operation, so another "
            "grouping can change the last bits: reorder them only with a tolerance, and say so. "
            "Bitwise OR (and AND, XOR) of fixed-width integers is associative and commutative: "
            "every order gives the same bits. The maximum of finite non-negative magnitudes is "
            "the same value in any order, once NaN, signed zero and ties (which index wins, for "
            "an argmax) have a fixed rule; without that rule, do not claim identical bytes."),
        why_not={"a": "float addition rounds at each step and is not associative",
                 "c": "float multiplication rounds at each step and is not associative"}),
    Question(
        "q9", "9",
        "Your engine keeps its KV cache in float32; the implementation you are scored against "
        "keeps it in float16. Your parity metric against it gets worse the more precision you "
        "keep. What do you conclude, and do?",
        "choice",
        ("Agreement with one rounding implementation and error against the exact result "
         "are different measurements, and storage precision alone does not predict the "
         "outcome: rule out other differences (identical weights and inputs), measure "
         "both, report both.",
         "Switch the cache to float16: matching the reference's storage type is sure to "
         "improve parity.",
         "More precision can only bring you closer to any reference, so the parity metric "
         "is broken: ignore it.",
         "KL divergence is a metric, so subtract the two arms' offsets against the "
         "reference to get their difference."),
        answer="a",
        explanation=(
            "Precision and agreement with one particular implementation are two different goals. "
            "An implementation that rounds its cache to float16 is not the exact result, so a "
            "float32 cache can sit closer to the mathematics and farther from it. But storage "
            "precision alone does not predict the combined effect: in the lecture's own table "
            "the float16 change moved the build farther from the reference. Make both sides use "
            "identical weights and inputs, isolate the one change, and report both numbers: the "
            "distance to the reference implementation and the error against a float64 oracle "
            "(lab/reference.py here)."),
        why_not={"b": "the lecture's own table shows the float16 candidate farther from the "
                      "reference: rounding, kernel changes and mismatched weights all move it",
                 "c": "a reference that rounds is not the exact result; being closer to the "
                      "mathematics can move you away from it",
                 "d": "KL divergence is not a metric: offsets against a third run do not cancel"}),
    Question(
        "q10", "9",
        "A logit-comparison tool prints FAIL for your build, for main, and for the reference "
        "compared with its own saved logits. What do you conclude?",
        "choice",
        ("Its threshold is meant for two runs of one implementation, so FAILs across "
         "implementations are expected: ignore them all.",
         "The tool itself is suspect: the reference against the very same saved logits "
         "must give zero divergence, so check its threshold, parsing, normalisation and "
         "determinism before reading any of its verdicts.",
         "All three builds are wrong.",
         "The reference is not deterministic, so the tool works as intended."),
        answer="b",
        explanation=(
            "Saved logits compared with themselves must give a divergence of exactly zero and "
            "pass any threshold. If the tool still says FAIL, the tool is broken: inspect its "
            "threshold, how it parses and normalises the logits, and whether it is "
            "deterministic, before trusting any verdict it gives on the builds. A tolerance "
            "meant for another question can explain FAILs between implementations, never a "
            "FAIL of something against itself. It is the A/A control, applied to the "
            "measuring tool."),
        why_not={"a": "a tolerance explains FAILs between implementations, not a FAIL of the "
                      "same saved logits against themselves",
                 "c": "the comparison of the reference with itself fails too: the tool, not "
                      "the builds, is what is shown broken",
                 "d": "the saved logits are the same bytes on both sides; nothing was re-run"}),
)}


# ================================================================ the notebook's interface

def question(qid: str) -> Question:
    """The question `qid` ("q1" ... "q10"); a LabError names the known ids."""
    try:
        return QUESTIONS[qid]
    except (KeyError, TypeError):
        raise LabError(f"unknown question id {qid!r}; the ids are "
                       f"{', '.join(QUESTIONS)}") from None


def ask(qid: str) -> None:
    """Print question `qid`, its options and how to answer it (never the answer)."""
    print(question(qid).prompt())


def check_answer(qid: str, value) -> QuestionResult:
    """Check an attempt without printing anything. None is "not answered"."""
    q = question(qid)
    if value is None:
        return QuestionResult(qid, "unanswered", f"give {_HOW[q.form][0]}")
    try:
        parsed = q.parse(value)
    except Malformed as exc:
        return QuestionResult(qid, "malformed", str(exc))
    if q.is_right(parsed):
        return QuestionResult(qid, "right", "")
    return QuestionResult(qid, "wrong", q.verdict(parsed))


def answer(qid: str, value, explain: bool = True) -> QuestionResult:
    """Check an attempt and print the verdict; after a real attempt (right or wrong, not None
    and not malformed) and with `explain`, also print the answer and why."""
    res = check_answer(qid, value)
    print(res.line())
    if explain and res.attempted:
        q = question(qid)
        print(q.solution(q.parse(value)))
    return res


def reveal(qid: str) -> None:
    """Print the answer to `qid` and why, without an attempt."""
    print(question(qid).solution())
