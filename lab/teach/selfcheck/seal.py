"""Seal a plain self-check bank: `python -m lab.teach.selfcheck.seal PLAIN.json [--out PATH]`.

A contributor's tool. The plain bank says which options are right and why the others are
wrong; it is kept out of the repository: `--unseal PLAIN.json` writes it back from the shipped
sealed bank (by hashing every option, as the program does after an attempt), to edit and seal
again. The sealed bank (default: sealed_bank.py beside this
file, which the program reads) keeps the key as grading.py describes: a digest per option, the
right options' among decoys, and the explanation and notes encrypted under a key derived from
the right options' text. Each run draws a new salt and new decoys; the options keep their order,
so recorded attempts (by option index) stay valid across a reseal that changes no option.

The plain bank, a JSON object:

  {"format": "decode-lab plain self-check bank, version 1",
   "questions": [
     {"id": "q1", "section": "4", "form": "choice" | "choices" | "number+choices",
      "text": "...", "hint": "...", "explanation": "...",
      "options": [{"text": "...", "right": true},
                  {"text": "...", "right": false, "why_not": "what this option misses"}, ...],
      "number": 756.25, "rel_tol": 0.02,                   (number+choices only)
      "number_notes": [[27.5, "what this wrong number is"], ...]}, ...]}

After sealing, the tool reads the sealed bank back and checks that it grades every question as
the plain bank says (the right set passes, the number within its tolerance, the payload opens).
"""
from __future__ import annotations

import argparse
import json
import math
import pprint
import secrets
import sys
from pathlib import Path

from lab.files import atomic_write_text
from .grading import (FORMS, LETTERS, SEALED_FORMAT, accepted_buckets, content_key,
                      number_digest, option_digest, questions_from, seal_text)

PLAIN_FORMAT = "decode-lab plain self-check bank, version 1"
SEALED_MODULE = Path(__file__).with_name("sealed_bank.py")

_HEADER = '''"""The lecture's ten self-check questions, sealed (grading.py beside this file says how).

Written by `python -m lab.teach.selfcheck.seal PLAIN.json` from a plain bank kept out of the
repository; do not edit by hand (a changed option text no longer matches its digest). The
options are in the plain bank's order: an attempt is recorded by an option's index here.
"""
'''


class PlainBankError(ValueError):
    """A plain bank that cannot be sealed (the message names the question and the problem)."""


def _check_question(q) -> None:
    qid = q.get("id") if isinstance(q, dict) else None
    where = f"question {qid!r}" if qid else "a question"
    if not isinstance(q, dict) or not isinstance(qid, str):
        raise PlainBankError(f"{where}: an object with an id")
    for name in ("section", "text", "hint", "explanation"):
        if not isinstance(q.get(name), str) or not q[name].strip():
            raise PlainBankError(f"{where}: {name!r} must be a non-empty string")
    if q.get("form") not in FORMS:
        raise PlainBankError(f"{where}: form {q.get('form')!r} is not one of {FORMS}")
    options = q.get("options")
    if not isinstance(options, list) or not 2 <= len(options) <= len(LETTERS):
        raise PlainBankError(f"{where}: takes 2 to {len(LETTERS)} options")
    for o in options:
        if (not isinstance(o, dict) or not isinstance(o.get("text"), str) or not o["text"].strip()
                or not isinstance(o.get("right"), bool)):
            raise PlainBankError(f'{where}: each option is {{"text": ..., "right": true|false}}')
        if not o["right"] and not (isinstance(o.get("why_not"), str) and o["why_not"].strip()):
            raise PlainBankError(f"{where}: the wrong option {o['text'][:40]!r}... needs its "
                                 f"why_not")
    if len({" ".join(o["text"].split()) for o in options}) != len(options):
        raise PlainBankError(f"{where}: two options have the same text")
    n_right = sum(o["right"] for o in options)
    if not n_right or (q["form"] == "choice" and n_right != 1):
        raise PlainBankError(f"{where}: a {q['form']} question takes "
                             f"{'exactly one' if q['form'] == 'choice' else 'at least one'} "
                             f"right option")
    has_number = q["form"] == "number+choices"
    if has_number != ("number" in q):
        raise PlainBankError(f"{where}: only a number+choices question has a number")
    if has_number:
        number, tol = q.get("number"), q.get("rel_tol")
        if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
                   and x > 0 for x in (number, tol)) or tol >= 0.5:
            raise PlainBankError(f"{where}: number and rel_tol must be positive numbers "
                                 f"(rel_tol under 0.5)")
        for item in q.get("number_notes", []):
            if (not isinstance(item, list) or len(item) != 2
                    or not isinstance(item[0], (int, float)) or not isinstance(item[1], str)
                    or math.isclose(item[0], number, rel_tol=tol)):
                raise PlainBankError(f"{where}: number_notes are [wrong number, note] pairs, "
                                     f"each outside the tolerance of the number")


def load_plain(path) -> dict:
    """The plain bank at `path`, checked (PlainBankError naming what is wrong)."""
    try:
        bank = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PlainBankError(f"{path}: cannot be read as JSON ({exc})") from None
    if not isinstance(bank, dict) or bank.get("format") != PLAIN_FORMAT:
        raise PlainBankError(f"{path}: not a plain self-check bank (format {PLAIN_FORMAT!r})")
    questions = bank.get("questions")
    if not isinstance(questions, list) or not questions:
        raise PlainBankError(f"{path}: 'questions' must be a non-empty list")
    for q in questions:
        _check_question(q)
    ids = [q["id"] for q in questions]
    if len(set(ids)) != len(ids):
        raise PlainBankError(f"{path}: question ids repeat: {ids}")
    return bank


def seal_bank(plain: dict, salt: str | None = None) -> dict:
    """The sealed bank of a checked plain bank (a fresh random salt unless one is given)."""
    salt = secrets.token_hex(16) if salt is None else salt
    sealed = []
    for q in plain["questions"]:
        texts = [o["text"] for o in q["options"]]
        right = [o["text"] for o in q["options"] if o["right"]]
        key = {option_digest(salt, q["id"], t) for t in right}
        while len(key) < len(texts):                       # decoys: the count is not the key's
            key.add(secrets.token_hex(16))
        payload = {"explanation": q["explanation"],
                   "notes": {str(i): o["why_not"] for i, o in enumerate(q["options"])
                             if not o["right"]}}
        entry = {"id": q["id"], "section": q["section"], "form": q["form"], "text": q["text"],
                 "options": texts, "hint": q["hint"], "key": sorted(key)}
        if "number" in q:
            payload["number"] = q["number"]
            payload["number_notes"] = q.get("number_notes", [])
            entry["rel_tol"] = q["rel_tol"]
            entry["accept"] = sorted(number_digest(salt, q["id"], b)
                                     for b in accepted_buckets(q["number"], q["rel_tol"]))
        sealed_text = seal_text(content_key(salt, q["id"], right),
                                json.dumps(payload, ensure_ascii=False))
        entry["sealed"] = [sealed_text[i:i + 68] for i in range(0, len(sealed_text), 68)]
        sealed.append(entry)
    return {"format": SEALED_FORMAT, "salt": salt, "questions": sealed}


def verify(plain: dict, sealed: dict) -> None:
    """Check that `sealed` grades as `plain` says; an AssertionError names the question."""
    questions = questions_from(sealed)
    for q in plain["questions"]:
        s = questions[q["id"]]
        want = frozenset(i for i, o in enumerate(q["options"]) if o["right"])
        assert s._key == want, f"{q['id']}: the sealed key is not the plain one"
        content = s._content
        assert content["explanation"] == q["explanation"], q["id"]
        if "number" in q:
            v, tol = q["number"], q["rel_tol"]
            assert s.number_right(v) and s.number_right(v * (1 + tol / 2)), q["id"]
            assert not s.number_right(v * (1 + 2 * tol)), q["id"]
            assert not s.number_right(v * (1 - 2 * tol)), q["id"]


def unseal_bank(sealed: dict) -> dict:
    """The plain bank back from a sealed one, by hashing every option (as the program does for a
    student with an attempt): a contributor edits that, then seals it again. The plain bank is
    never stored in the repository; this is how it is recovered."""
    plain = []
    for s in questions_from(sealed).values():
        content = s._content
        q = {"id": s.id, "section": s.section, "form": s.form, "text": s.text, "hint": s.hint,
             "explanation": content["explanation"],
             "options": [{"text": t, "right": True} if i in s._key else
                         {"text": t, "right": False, "why_not": content["notes"][str(i)]}
                         for i, t in enumerate(s.options)]}
        if "number" in content:
            q.update(number=content["number"], rel_tol=s.rel_tol,
                     number_notes=content.get("number_notes", []))
        plain.append(q)
    return {"format": PLAIN_FORMAT, "questions": plain}


def module_text(sealed: dict) -> str:
    """The sealed bank as a Python module (SEALED, a literal)."""
    return _HEADER + "\nSEALED = " + pprint.pformat(sealed, width=100, sort_dicts=False) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.teach.selfcheck.seal",
                                description="Seal a plain self-check bank (JSON, kept out of the "
                                "repository) into the bank the program reads.")
    p.add_argument("plain", help="the plain bank (JSON; see this module's docstring)")
    p.add_argument("--out", default=str(SEALED_MODULE),
                   help="the sealed module to write (default: %(default)s)")
    p.add_argument("--unseal", action="store_true",
                   help="instead: write the shipped sealed bank back out as the plain bank PLAIN "
                        "(to edit, then seal again); PLAIN must not exist yet")
    args = p.parse_args(argv)
    if args.unseal:
        from .sealed_bank import SEALED
        target = Path(args.plain)
        if target.exists():
            print(f"seal: error: {target} exists; unseal writes a new file", file=sys.stderr)
            return 2
        atomic_write_text(target, json.dumps(unseal_bank(SEALED), indent=1, ensure_ascii=False)
                          + "\n")
        print(f"unsealed {len(SEALED['questions'])} questions into {target} (keep it out of the "
              f"repository)")
        return 0
    try:
        plain = load_plain(args.plain)
    except PlainBankError as exc:
        print(f"seal: error: {exc}", file=sys.stderr)
        return 2
    sealed = seal_bank(plain)
    verify(plain, sealed)
    atomic_write_text(Path(args.out), module_text(sealed))
    print(f"sealed {len(sealed['questions'])} questions into {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
