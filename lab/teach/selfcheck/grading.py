"""A self-check question, sealed, and its grading: by option identity, never by letter.

Forms: "choice" (one letter), "choices" (every right letter and no other) and "number+choices"
(q4: a factor, and the consequences among the options). A `Question` shows its options in an
order of each student's own (a permutation seeded by sha256(student, question id)), parses an
attempt into the picked options' identities (their indices in the bank), grades it by them, and
words the verdict without naming or counting the wrong or missing picks. `solution` is the
answer and why, and what each wrong pick of an attempt misses: shown only after an attempt
(lab/teach/selfcheck/questions.py keeps that rule).

The key is sealed (the bank is written by `python -m lab.teach.selfcheck.seal`, seal.py): no
option carries a right or wrong mark. A question lists one digest per option, sha256(salt,
question id, option text), those of its right options among random decoys, so neither which
options are right nor how many can be read without hashing each option. The explanation, the
right number of q4 and the note on each wrong option or known wrong number are one payload,
encrypted with a key derived from the right options' text (a sha256 keystream, authenticated by
an HMAC tag): opening it means hashing the options first. q4's number is held to its tolerance
without writing it down: the bank lists the digests of every logarithmic bucket (0.1% wide)
whose middle lies within the tolerance, and an answer is right when its bucket's digest is among
them; the accepted band thus matches the tolerance to within one bucket at either edge.

This keeps the key out of the repository's text, not out of reach: the program hashes the
options to grade an attempt, and anyone can do the same. A local self-check is for
self-assessment.
"""
from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import json
import math
import re
import textwrap
from dataclasses import dataclass, field

import numpy as np

FORMS = ("choice", "choices", "number+choices")
LETTERS = "abcdefgh"
SEALED_FORMAT = "decode-lab sealed self-check bank, version 1"
NUMBER_STEP = 0.001      # q4's buckets: ln(x) / ln(1 + NUMBER_STEP), floored

HOW_TO_ANSWER = {   # form -> (what an answer gives, its JSON shape)
    "choice": ("one letter", '"<letter>"'),
    "choices": ("every letter that applies, and no other", '["<letter>", "<letter>", ...]'),
    "number+choices": ("the number and every letter that applies",
                       '{"number": <number>, "choices": ["<letter>", ...]}')}


class Malformed(ValueError):
    """An answer of the wrong type or with an unknown option (not counted as an attempt)."""


class DamagedBank(RuntimeError):
    """A sealed payload that does not open with the key its options give (a bank edited by hand,
    or sealed from another text)."""


# ================================================================ the seal's primitives

def norm(text: str) -> str:
    """A text as it is hashed: its words, one space apart."""
    return " ".join(text.split())


def digest(*parts: str) -> str:
    """128 bits of sha256 over the parts, in hex (what the bank lists)."""
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:32]


def option_digest(salt: str, qid: str, text: str) -> str:
    return digest("option", salt, qid, norm(text))


def content_key(salt: str, qid: str, right_texts) -> bytes:
    """The payload's key: from the right options' text, in the bank's order."""
    return hashlib.sha256("\x1f".join(["content", salt, qid, *map(norm, right_texts)])
                          .encode()).digest()


def number_bucket(x: float) -> str:
    """The logarithmic bucket of a number (every x <= 0 shares one)."""
    if not x > 0:
        return "not positive"
    return str(math.floor(math.log(x) / math.log1p(NUMBER_STEP)))


def number_digest(salt: str, qid: str, bucket: str) -> str:
    return digest("number", salt, qid, bucket)


def accepted_buckets(value: float, rel_tol: float) -> list[str]:
    """The buckets whose geometric middle is within `rel_tol` of `value` (value > 0)."""
    step = math.log1p(NUMBER_STEP)
    lo = math.floor(math.log(value * (1 - 2 * rel_tol)) / step)
    hi = math.ceil(math.log(value * (1 + 2 * rel_tol)) / step)
    return [str(b) for b in range(lo, hi + 1)
            if math.isclose(math.exp((b + 0.5) * step), value, rel_tol=rel_tol)]


def _stream(key: bytes, n: int) -> bytes:
    blocks = (hashlib.sha256(key + b"stream" + i.to_bytes(8, "big")).digest()
              for i in range((n + 31) // 32))
    return b"".join(blocks)[:n]


def seal_text(key: bytes, text: str) -> str:
    """`text` encrypted under `key` (a sha256 keystream) with a 16-byte HMAC tag, in base64."""
    data = text.encode()
    ct = bytes(a ^ b for a, b in zip(data, _stream(key, len(data))))
    tag = hmac.new(key, b"tag" + ct, hashlib.sha256).digest()[:16]
    return base64.b64encode(ct + tag).decode()


def open_text(key: bytes, sealed: str) -> str | None:
    """The text sealed under `key`, or None when the tag says it was sealed under another."""
    raw = base64.b64decode(sealed)
    ct, tag = raw[:-16], raw[-16:]
    if not hmac.compare_digest(tag, hmac.new(key, b"tag" + ct, hashlib.sha256).digest()[:16]):
        return None
    return bytes(a ^ b for a, b in zip(ct, _stream(key, len(ct)))).decode()


# ================================================================ a question


@dataclass(frozen=True)
class Question:
    id: str
    section: str
    text: str
    form: str                                            # one of FORMS
    options: tuple[str, ...]                             # in the bank's order (their identity)
    hint: str = ""                                       # where to look, after a wrong attempt
    salt: str = field(default="", repr=False)
    key: tuple[str, ...] = field(default=(), repr=False)     # a digest per option: right + decoys
    sealed: str = field(default="", repr=False)              # the payload (explanation, notes)
    rel_tol: float = field(default=0.0, repr=False)          # number+choices: the tolerance ...
    accept: tuple[str, ...] = field(default=(), repr=False)  # ... and the accepted buckets

    def __post_init__(self):
        if self.form not in FORMS:
            raise ValueError(f"{self.id}: form {self.form!r} is not one of {FORMS}")
        if not 2 <= len(self.options) <= len(LETTERS):
            raise ValueError(f"{self.id}: a question takes 2 to {len(LETTERS)} options")
        if len(self.key) != len(self.options) or len(set(self.key)) != len(self.key):
            raise ValueError(f"{self.id}: the key lists one distinct digest per option")
        if (self.form == "number+choices") != bool(self.accept):
            raise ValueError(f"{self.id}: only a number+choices question has a number")

    @classmethod
    def from_sealed(cls, salt: str, entry: dict) -> "Question":
        return cls(entry["id"], entry["section"], entry["text"], entry["form"],
                   tuple(entry["options"]), entry.get("hint", ""), salt, tuple(entry["key"]),
                   "".join(entry["sealed"]), entry.get("rel_tol", 0.0),
                   tuple(entry.get("accept", ())))

    # ---- the key: found by hashing the options --------------------------------------------------
    @functools.cached_property
    def _key(self) -> frozenset:
        """The right options' identities (indices in the bank's order)."""
        listed = set(self.key)
        return frozenset(i for i, t in enumerate(self.options)
                         if option_digest(self.salt, self.id, t) in listed)

    @functools.cached_property
    def _content(self) -> dict:
        """The opened payload: {"explanation", "notes": {index: why not}, "number",
        "number_notes": [[value, note], ...]}."""
        key = content_key(self.salt, self.id, [self.options[i] for i in sorted(self._key)])
        text = open_text(key, self.sealed)
        if text is None:
            raise DamagedBank(f"{self.id}: the sealed payload does not open with its options' "
                              f"key; reseal the bank (python -m lab.teach.selfcheck.seal)")
        return json.loads(text)

    def order(self, student: str) -> tuple[int, ...]:
        """The options' order for `student`: display letter k shows option order[k]."""
        seed = hashlib.sha256(f"{student}\n{self.id}".encode()).digest()
        rng = np.random.default_rng(int.from_bytes(seed[:8], "little"))
        return tuple(int(i) for i in rng.permutation(len(self.options)))

    def letter(self, index: int, student: str) -> str:
        return LETTERS[self.order(student).index(index)]

    def how(self, in_json: bool = False) -> str:
        """How to write an answer, in the notebook or in an answers JSON (no example that could
        be the answer)."""
        label, example = HOW_TO_ANSWER[self.form]
        if in_json:
            return f'{label}: "{self.id}": {example}'
        return f'{label}: answer("{self.id}", {example})'

    def prompt(self, student: str, in_json: bool = False) -> str:
        """The question, its options in `student`'s order, and how to answer it."""
        lines = [_wrap(f"{self.id} (lecture section {self.section}): {self.text}")]
        lines += [_wrap(self.options[i], f"  {k}) ") for k, i in zip(LETTERS, self.order(student))]
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
        """Whether a number is within the tolerance (by its bucket's digest; None: no number)."""
        return number is None or number_digest(self.salt, self.id,
                                               number_bucket(number)) in self.accept

    def is_right(self, parsed) -> bool:
        number, picks = parsed
        return self.number_right(number) and picks == self._key

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
        parts.append(f"the picked consequences are {'' if picks == self._key else 'not '}right")
        return "; ".join(parts) + f". {where}"

    def _number_note(self, number: float) -> str:
        """What a known wrong number is (from the payload: called after an attempt only)."""
        return next((why for v, why in self._content.get("number_notes", ())
                     if math.isclose(number, v, rel_tol=self.rel_tol)), "")

    def solution(self, student: str, parsed) -> str:
        """The answer and why, in `student`'s letters, after the attempt `parsed` (number or
        None, picks); also what the attempt's wrong picks miss."""
        content = self._content
        lines = [f"{self.id} answer:"]
        if "number" in content:
            lines.append(f"  {content['number']:.6g} (accepted within {self.rel_tol:.0%})")
        shown = sorted((self.letter(i, student), self.options[i]) for i in self._key)
        lines += [_wrap(text, f"  {k}) ") for k, text in shown]
        lines.append(_wrap(content["explanation"], "why: "))
        if not self.is_right(parsed):
            number, picks = parsed
            if number is not None and self._number_note(number):
                lines.append(_wrap(self._number_note(number), f"your {number:g}: "))
            for k, i in sorted((self.letter(i, student), i) for i in picks - self._key):
                lines.append(_wrap(content["notes"][str(i)], f"your {k}): "))
        return "\n".join(lines)


def questions_from(sealed: dict) -> dict[str, Question]:
    """The questions of a sealed bank (seal.py writes one), by id."""
    if not isinstance(sealed, dict) or sealed.get("format") != SEALED_FORMAT:
        raise ValueError(f"not a sealed self-check bank (format {SEALED_FORMAT!r})")
    return {q.id: q for q in (Question.from_sealed(sealed["salt"], e)
                              for e in sealed["questions"])}


def _number(value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise Malformed(f"takes a number, got {type(value).__name__} {value!r}")
    if not math.isfinite(float(value)):
        raise Malformed(f"takes a finite number, got {value!r}")
    return float(value)


def _wrap(text: str, first: str = "") -> str:
    """`text` in lines of at most 100 characters, after `first`, continued under its text."""
    return textwrap.fill(text, 100, initial_indent=first, subsequent_indent=" " * len(first))
