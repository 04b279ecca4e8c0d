"""A self-check question and its grading: by option identity, never by letter.

Forms: "choice" (one letter), "choices" (every right letter and no other) and "number+choices"
(q4: a factor, and the consequences among the options). A `Question` shows its options in an
order of each student's own (a permutation seeded by sha256(student, question id)), parses an
attempt into the picked options' identities (their indices in the bank), grades it by them, and
words the verdict without naming or counting the wrong or missing picks. `solution` is the
answer and why, and what each wrong pick of an attempt misses: shown only after an attempt
(lab/teach/selfcheck/questions.py keeps that rule).
"""
from __future__ import annotations

import hashlib
import math
import re
import textwrap
from dataclasses import dataclass, field

import numpy as np

FORMS = ("choice", "choices", "number+choices")
LETTERS = "abcdefgh"

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
