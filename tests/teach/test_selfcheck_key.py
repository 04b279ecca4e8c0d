"""The self-check keeps its key (lab/teach/selfcheck: grading.py seals it, seal.py writes it).

No text in the repository says which options are right, or holds an explanation or a note:
the tests learn the key as the program does, by attempting under a throwaway name and reading
what it reveals then (`revealed`), and check that (1) it is the lecture's answers (a fingerprint
per question: a hash of the right options' text, which a reader can only match by hashing each
candidate set), (2) no tracked file quotes a right option outside the question's own listing,
nor any explanation or note, and (3) the seal is sound: a plain bank sealed by the contributor's
tool grades as it says, hides which options are right and how many, and refuses a tampered
payload. Who is answering: asked once, remembered in ~/.decode-lab (HOME here is a tmp folder),
a fixed identity from DECODE_LAB_STUDENT first, no shared default.
"""
import contextlib
import hashlib
import io
import json
import os
import re
import subprocess
import tempfile
from unittest import mock
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from lab.config import STATE_ENV, STUDENT_ENV
from lab.errors import LabError
from lab.teach.selfcheck import QUESTIONS, Attempts, check_answer, reveal, start
from lab.teach.selfcheck import grading, questions as qmod, seal

ROOT = Path(__file__).resolve().parents[2]
KEY_READER = "key reader"      # a throwaway name: what a student's second identity could do
SEALED_BANK = "lab/teach/selfcheck/sealed_bank.py"

# the lecture's answers (its "Answers" to the ten self-check questions), as fingerprints:
# sha256 over the question id, the right options' text (sorted) and q4's number
LECTURE_KEY = {
    "q1": "327f7e1d967298855d54",
    "q2": "05f5d4f2ac5f8cae3f88",
    "q3": "2fa556e7cd0b6dafe679",
    "q4": "ea2bcb3d5b8824ecd6e8",
    "q5": "3afa84b2ed43fefd9951",
    "q6": "4c7f5565e9d5b2da4696",
    "q7": "edd2d25e54c48a334069",
    "q8": "10f46194530143ea80e9",
    "q9": "35cf34bf04493b7940d9",
    "q10": "0d046fcf943f7382562b",
}


def fingerprint(qid, texts, number=None) -> str:
    parts = ["decode-lab lecture key", qid, *sorted(" ".join(t.split()) for t in texts)]
    if number is not None:
        parts.append(f"{number:.6g}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]


def words(text) -> str:
    return " ".join(text.split())


@dataclass(frozen=True)
class Revealed:
    indices: frozenset      # the right options' identities (indices in the bank)
    texts: tuple            # their text, one space between words
    number: float | None    # q4's number
    why: str                # the explanation, one space between words


def _valid_attempt(qid):
    form = QUESTIONS[qid].form
    return {"choice": "a", "choices": ["a"]}.get(form, {"number": 1.0, "choices": ["a"]})


_REVEALED: dict = {}
_FOLDER = []


def revealed(qid) -> Revealed:
    """The key of `qid` as a student could read it: attempt anything under KEY_READER (its
    attempts and home folder in a folder of its own), then parse what reveal() prints."""
    if qid not in _REVEALED:
        if not _FOLDER:
            _FOLDER.append(tempfile.TemporaryDirectory(prefix="selfcheck-key-reader-"))
        folder = Path(_FOLDER[0].name)
        out = io.StringIO()
        with mock.patch.dict(os.environ, {"HOME": str(folder), STATE_ENV: str(folder / "state")}), \
                contextlib.redirect_stdout(out):
            record = Attempts(folder / "key-reader.json", KEY_READER)
            assert check_answer(qid, _valid_attempt(qid), record).attempted
            assert reveal(qid, record)
        head, why = out.getvalue().split("\nwhy: ")
        why = why.split("\nyour ")[0]
        number = re.search(r"\n  (\S+) \(accepted within", head)
        parts = re.split(r"\n  ([a-h])\) ", head)[1:]
        order = QUESTIONS[qid].order(KEY_READER)
        letters = [ord(k) - ord("a") for k in parts[::2]]
        _REVEALED[qid] = Revealed(frozenset(order[k] for k in letters),
                                  tuple(words(t) for t in parts[1::2]),
                                  float(number.group(1)) if number else None, words(why))
    return _REVEALED[qid]


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    """A home folder of the test's own, no fixed identity, no current record."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv(STATE_ENV, raising=False)     # the state folder is then ~/.decode-lab
    monkeypatch.delenv(STUDENT_ENV, raising=False)
    monkeypatch.setattr(qmod, "_current", None)
    return tmp_path / "home"


def test_the_sealed_bank_grades_the_lectures_answers():
    for qid, q in QUESTIONS.items():
        key = revealed(qid)
        assert set(key.texts) == {words(q.options[i]) for i in key.indices}, qid
        assert fingerprint(qid, key.texts, key.number) == LECTURE_KEY[qid], qid
        assert (key.number is not None) == (q.form == "number+choices")
        assert key.indices == q._key            # what reveal() shows is what grading uses


def test_the_key_is_found_only_by_hashing_the_options():
    """No option is marked: each question lists one digest per option (the right ones among
    decoys, sorted), so the count of right options is not there either; the explanation and
    the notes are not in the sealed text."""
    source = (ROOT / SEALED_BANK).read_text()
    assert not re.search(r"\b(right|wrong|why_not|explanation|number_notes)\b['\"]?\s*:", source)
    for q in QUESTIONS.values():
        assert len(q.key) == len(q.options) and list(q.key) == sorted(q.key)
        assert len(q.accept) in (0, *range(20, 60))


def _tracked_files():
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: no list of tracked files")
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [ROOT / p for p in out.splitlines() if (ROOT / p).is_file()]


def _readable(path: Path) -> str:
    """What a file says in text: a notebook's sources and text outputs (no images)."""
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        return ""
    if path.suffix != ".ipynb":
        return text
    parts = []
    for cell in json.loads(text)["cells"]:
        parts.append("".join(cell["source"]))
        for o in cell.get("outputs", []):
            parts.append("".join(o.get("text", "")))
            parts.append("".join(o.get("data", {}).get("text/plain", "")))
    return "\n".join(parts)


def _words(text) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def _grams(text, n) -> set:
    w = _words(text)
    return {" ".join(w[i:i + n]) for i in range(len(w) - n + 1)}


N = 8        # a quote of a right option: 8 consecutive words (all of a shorter one)
N_PROSE = 12  # of an explanation or a note (the lab's teaching may state one fact in 8 words)


def _needles(text, public: set, n: int = N) -> set:
    """The runs of n words of `text` (all of it if shorter) that no public text has."""
    return {g for g in _grams(text, min(n, len(_words(text)))) if g not in public}


@dataclass
class Secrets:
    said: dict          # run of words -> (question id, what it is: "right option 2", "explanation")
    listing: dict       # question id -> a run of words of each of its options


_SECRETS: list = []


def secrets_of_the_bank() -> Secrets:
    """Every right option, explanation and note, as the runs of words (N of an option, N_PROSE of
    the prose; all of a shorter text) that the questions' public text (question, hint, the other
    options) does not also hold; and each question's listing of its options."""
    if _SECRETS:
        return _SECRETS[0]
    said, listing = {}, {}
    for qid, q in QUESTIONS.items():
        key = revealed(qid)
        content = q._content                 # opened, as after KEY_READER's attempt
        public = [q.text, q.hint, *(t for i, t in enumerate(q.options) if i not in key.indices)]
        shown = set().union(*(_grams(t, n) for t in public for n in range(1, N_PROSE + 1)))
        for i in sorted(key.indices):
            said.update({g: (qid, f"right option {i}") for g in _needles(q.options[i], shown)})
        everything = shown | set().union(*(_grams(t, n) for t in q.options
                                           for n in range(1, N_PROSE + 1)))
        for what, text in [("explanation", content["explanation"]),
                           *((f"note on option {i}", t) for i, t in content["notes"].items()),
                           *((f"note on {v}", t) for v, t in content.get("number_notes", []))]:
            said.update({g: (qid, what) for g in _needles(text, everything, N_PROSE)})
        listing[qid] = {" ".join(_words(t)[:N]) for t in q.options}
    _SECRETS.append(Secrets(said, listing))
    return _SECRETS[0]


def _starts(wanted: set) -> dict:
    """{first word: the lengths of the runs in `wanted` that start with it}."""
    starts: dict = {}
    for g in wanted:
        w = g.split()
        starts.setdefault(w[0], set()).add(len(w))
    return starts


def _runs_found(words: list[str], wanted: set, starts: dict) -> set:
    """The runs of words in `wanted` that occur in `words`."""
    found = set()
    for i, w in enumerate(words):
        for n in starts.get(w, ()):
            g = " ".join(words[i:i + n])
            if g in wanted:
                found.add(g)
    return found


def leaks(paths, secrets: Secrets) -> list[str]:
    """Where a file quotes a secret. A right option in a file that lists all of its question's
    options (a prompt, the sealed bank) is the question, not its key."""
    wanted = set(secrets.said).union(*secrets.listing.values())
    starts = _starts(wanted)
    found = []
    for path in paths:
        name = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name
        runs = _runs_found(_words(_readable(path)), wanted, starts)
        listed = {qid for qid, grams in secrets.listing.items() if grams <= runs}
        for g in runs & secrets.said.keys():
            qid, what = secrets.said[g]
            if not (qid in listed and what.startswith("right option")):
                found.append(f"{name}: {qid}'s {what} ('{g}')")
    return sorted(found)


def test_no_tracked_file_holds_the_key_an_explanation_or_a_note():
    """Every tracked (or new, not ignored) file: none quotes a right option (8 words of it, all
    of a shorter one) outside a listing of its question's options, nor an explanation or a note
    (12 words of it), where the questions' public text does not hold those words too."""
    secrets = secrets_of_the_bank()
    kinds = {what.split(" ")[0] for _, what in secrets.said.values()}
    assert len(secrets.said) > 500 and kinds == {"right", "explanation", "note"}
    found = leaks(_tracked_files(), secrets)
    assert not found, "the self-check's key in plain text:\n" + "\n".join(found[:20])


def test_the_leak_check_sees_a_planted_key(tmp_path):
    """The check above finds a right option quoted in a file, and a run of an explanation's
    words; a question's listing of its options, or a wrong option alone, is no leak."""
    secrets = secrets_of_the_bank()
    key, q2 = revealed("q8"), revealed("q2")
    wrong = next(t for i, t in enumerate(QUESTIONS["q8"].options) if i not in key.indices)
    plant = tmp_path / "planted.md"
    plant.write_text(f"# the key\n{key.texts[0]}\n")
    assert any("q8's right option" in f for f in leaks([plant], secrets))
    plant.write_text(f"notes:\n  {' '.join(q2.why.split()[3:16])}\n")
    assert any("q2's explanation" in f for f in leaks([plant], secrets))
    plant.write_text(QUESTIONS["q8"].prompt("someone") + f"\n{wrong}\n")
    assert leaks([plant], secrets) == []
    plant.write_text(QUESTIONS["q8"].prompt("someone").replace(wrong, "(gone)"))
    assert any("q8's right option" in f for f in leaks([plant], secrets))


def test_the_explanations_repeat_no_withdrawn_claim():
    """tests/repo/test_lecture_claims.py cannot read the sealed texts: scanned here once opened."""
    from tests.repo.test_lecture_claims import FIRST_EDITION, PROJECT, normalise  # another floor
    for qid, q in QUESTIONS.items():
        revealed(qid)
        content = q._content
        said = normalise("\n".join([content["explanation"], *content["notes"].values(),
                                    *(t for _, t in content.get("number_notes", [])),
                                    *(q.options[i] for i in q._key)]))
        found = [p for p, _ in FIRST_EDITION + PROJECT if p in said]
        assert not found, (qid, found)


def test_q5_reconciles_the_lectures_sticky_with_cudas():
    """The lab keeps CUDA's sense of "sticky" (a capture error is not: the context stays
    usable) and says beside it how the lecture's §3 uses the word (an error that surfaces at a
    later call): in the question, the note on the sticky option and the explanation."""
    q5 = QUESTIONS["q5"]
    key = revealed("q5")
    assert all("sticky" not in t for t in key.texts)
    lecture = "CUDA errors are sticky, so the failure was attributed to whatever ran next"
    assert lecture in q5.text and "surfaces at a later call" in q5.text
    sticky = next(i for i, t in enumerate(q5.options) if "sticky" in t)
    note = q5._content["notes"][str(sticky)]
    assert "context stays usable" in note and "lecture's §3" in note and "later call" in note
    assert "not sticky" in key.why and "lecture's §3" in key.why


# ---------------------------------------------------------------- the seal itself

PLAIN = {"format": seal.PLAIN_FORMAT, "questions": [
    {"id": "t1", "section": "1", "form": "choices", "text": "Which are prime?",
     "hint": "divisors", "explanation": "Two and three have no divisor but 1 and themselves.",
     "options": [{"text": "two", "right": True}, {"text": "four", "right": False,
                                                  "why_not": "four is 2 x 2"},
                 {"text": "three", "right": True}, {"text": "nine", "right": False,
                                                    "why_not": "nine is 3 x 3"}]},
    {"id": "t2", "section": "2", "form": "number+choices", "text": "Ten squared, and its sign?",
     "hint": "multiply", "explanation": "Ten times ten is a hundred, positive.",
     "options": [{"text": "positive", "right": True},
                 {"text": "negative", "right": False, "why_not": "a square is not negative"}],
     "number": 100.0, "rel_tol": 0.02, "number_notes": [[10.0, "that is ten itself"]]},
    {"id": "t3", "section": "3", "form": "choice", "text": "The colour of the sky?",
     "hint": "look up", "explanation": "Blue, by Rayleigh scattering.",
     "options": [{"text": "green", "right": False, "why_not": "that is grass"},
                 {"text": "blue", "right": True}]},
]}


def _sealed(tmp_path, plain=PLAIN):
    path = tmp_path / "plain.json"
    path.write_text(json.dumps(plain))
    out = tmp_path / "sealed.py"
    assert seal.main([str(path), "--out", str(out)]) == 0
    namespace = {}
    exec(out.read_text(), namespace)
    return out.read_text(), grading.questions_from(namespace["SEALED"]), namespace["SEALED"]


def _leaves(x):
    if isinstance(x, dict):
        return [leaf for v in x.values() for leaf in _leaves(v)]
    if isinstance(x, (list, tuple)):
        return [leaf for v in x for leaf in _leaves(v)]
    return [x]


def test_seal_writes_a_bank_that_grades_as_the_plain_one_says(tmp_path, capsys):
    text, qs, data = _sealed(tmp_path)
    assert "sealed 3 questions" in capsys.readouterr().out
    for q in PLAIN["questions"]:
        for o in q["options"]:
            assert o["text"] in text
        for secret in (q["explanation"], *(o.get("why_not", "") for o in q["options"] if
                                          not o["right"])):
            assert secret not in text
    # no flag and no number but the tolerance: strings (texts, digests, sealed chunks) only
    assert [x for x in _leaves(data) if not isinstance(x, str)] == [0.02]
    t1, t2, t3 = qs["t1"], qs["t2"], qs["t3"]
    assert t1._key == {0, 2} and t2._key == {0} and t3._key == {1}
    assert len(t1.key) == 4 and len(t2.key) == 2         # decoys: as many digests as options
    assert t2.number_right(100) and t2.number_right(101.5) and t2.number_right(98.5)
    assert not any(t2.number_right(x) for x in (103, 97, 10, -100, 0))
    assert t2._content["number_notes"] == [[10.0, "that is ten itself"]]
    assert "that is ten itself" in t2.verdict((10.0, frozenset({0})))
    assert t1._content["notes"] == {"1": "four is 2 x 2", "3": "nine is 3 x 3"}
    assert t1.is_right((None, frozenset({0, 2}))) and not t1.is_right((None, frozenset({0})))
    shown = t1.solution("s", (None, frozenset({1})))                 # an attempt picking "four"
    assert "Two and three have no divisor" in shown and "four is 2 x 2" in shown
    assert "nine is 3 x 3" not in shown


def test_unseal_gives_back_the_plain_bank_that_seals_to_it(tmp_path):
    """The plain bank is never stored: `--unseal` recovers it from a sealed one (here the test's
    own bank, then the shipped one), and sealing what it wrote grades the same."""
    assert seal.unseal_bank(seal.seal_bank(PLAIN)) == PLAIN
    out = tmp_path / "plain.json"
    assert seal.main([str(out), "--unseal"]) == 0
    plain = seal.load_plain(out)
    seal.verify(plain, seal.seal_bank(plain))
    assert seal.main([str(out), "--unseal"]) == 2        # never over an existing file


def test_each_seal_draws_a_new_salt_and_keeps_the_option_order(tmp_path):
    (a, qa, _), (b, qb, _) = _sealed(tmp_path), _sealed(tmp_path)
    assert a != b and qa["t1"].salt != qb["t1"].salt
    assert qa["t1"].options == qb["t1"].options and qa["t1"]._key == qb["t1"]._key


def test_a_tampered_bank_is_refused(tmp_path):
    _, qs, _ = _sealed(tmp_path)
    t1 = qs["t1"]
    edited = replace(t1, options=("two", "four", "three!", "nine"))   # a right option reworded
    assert edited._key == {0}                          # it no longer hashes to its digest ...
    with pytest.raises(grading.DamagedBank, match="reseal the bank"):
        edited._content                                # ... and the payload's key is another
    raw = bytearray(__import__("base64").b64decode(t1.sealed))
    raw[3] ^= 1                                        # one bit of the payload flipped
    flipped = replace(t1, sealed=__import__("base64").b64encode(bytes(raw)).decode())
    with pytest.raises(grading.DamagedBank):
        flipped._content
    assert t1._content["explanation"].startswith("Two and three")


@pytest.mark.parametrize("change, words", [
    (lambda q: q["options"][1].pop("why_not"), "needs its why_not"),
    (lambda q: q.update(form="choice"), "exactly one right option"),
    (lambda q: [o.update(right=False, why_not="no") for o in q["options"]],
     "at least one right option"),
    (lambda q: q.update(number=3.0), "only a number+choices question has a number"),
    (lambda q: q["options"].append(dict(q["options"][0])), "two options have the same text"),
    (lambda q: q.update(explanation=""), "'explanation' must be a non-empty string"),
])
def test_seal_refuses_a_plain_bank_it_cannot_seal(tmp_path, capsys, change, words):
    plain = json.loads(json.dumps(PLAIN))
    change(plain["questions"][0])
    path = tmp_path / "plain.json"
    path.write_text(json.dumps(plain))
    assert seal.main([str(path), "--out", str(tmp_path / "x.py")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("seal: error: question 't1': ") and words in err
    assert not (tmp_path / "x.py").exists()


# ---------------------------------------------------------------- who is answering

def test_the_name_is_asked_once_and_remembered(home, tmp_path):
    with pytest.raises(LabError, match="who is answering.*--student NAME.*~/.decode-lab"):
        start()                                                # no name anywhere: no default
    asked = []
    record = Attempts(tmp_path / "a.json", prompt=lambda q: asked.append(q) or " ada ")
    assert record.student == "ada" and len(asked) == 1 and "asked once" in asked[0]
    assert (home / ".decode-lab" / "student").read_text() == "ada\n"
    assert Attempts(tmp_path / "a.json", prompt=lambda q: pytest.fail("asked twice")).student \
        == "ada"
    assert start().student == "ada"
    assert start("bea").student == "bea" and start().student == "bea"   # a given name sticks
    (home / ".decode-lab" / "student").unlink()
    with pytest.raises(LabError, match="who is answering"):
        Attempts(tmp_path / "b.json", prompt=lambda q: (_ for _ in ()).throw(EOFError()))
    with pytest.raises(LabError, match="give a name or id"):
        Attempts(tmp_path / "b.json", prompt=lambda q: "  ")


def test_a_fixed_identity_comes_first_and_is_not_remembered(home, monkeypatch):
    monkeypatch.setenv(STUDENT_ENV, "ci")
    assert start().student == "ci" and not (home / ".decode-lab" / "student").exists()
    assert start("dee").student == "dee"                     # a name given still wins
    assert start().student == "ci"
    monkeypatch.setenv(STUDENT_ENV, "tab\there")
    with pytest.raises(LabError, match=f"{STUDENT_ENV} .*: give a name or id"):
        start()


def test_the_home_folder_follows_home(home, tmp_path, monkeypatch):
    record = start("ada")
    assert record.path == home / ".decode-lab" / "selfcheck.json"
    check_answer("q3", "a")
    assert record.path.is_file()
    monkeypatch.setenv("HOME", str(tmp_path / "elsewhere"))
    assert qmod.default_attempts() == tmp_path / "elsewhere" / ".decode-lab" / "selfcheck.json"
    with pytest.raises(LabError, match="who is answering"):
        start()
    monkeypatch.setenv(STATE_ENV, str(tmp_path / "state"))    # the lab's state folder, moved
    assert qmod.default_attempts() == tmp_path / "state" / "selfcheck.json"
    assert qmod.student_file() == tmp_path / "state" / "student"


def test_the_cli_asks_on_a_terminal_and_refuses_elsewhere(home, tmp_path, capsys, monkeypatch):
    from lab.__main__ import main
    from lab.teach.selfcheck import run
    monkeypatch.setattr(run, "terminal_prompt", lambda: None)
    assert main(["selfcheck", "--attempts", str(tmp_path / "a.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("decode-lab: error: who is answering?") and err.count("\n") == 1
    monkeypatch.setattr(run, "terminal_prompt", lambda: lambda q: "eve")
    assert main(["selfcheck", "--attempts", str(tmp_path / "a.json")]) == 0
    assert "order of student 'eve'" in capsys.readouterr().out
    monkeypatch.setattr(run, "terminal_prompt", lambda: None)
    assert main(["selfcheck", "--attempts", str(tmp_path / "a.json")]) == 0   # remembered


def test_an_attempt_reveals_only_to_its_own_name(tmp_path, capsys):
    """ada's attempt at q2 shows ada the answer; bea, in the same file, still has none."""
    ada = Attempts(tmp_path / "a.json", "ada")
    check_answer("q2", "a", ada)
    bea = Attempts(tmp_path / "a.json", "bea")
    assert not bea.attempted("q2") and reveal("q2", bea) is False
    assert "no attempt recorded yet" in capsys.readouterr().out
    assert reveal("q2", Attempts(tmp_path / "a.json", "ada")) is True
    data = json.loads((tmp_path / "a.json").read_text())
    assert data["format"] == qmod.FILE_FORMAT and set(data["attempts"]) == {"ada"}


def test_an_attempts_file_of_the_earlier_format_is_read_as_its_students(tmp_path):
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"format": qmod.OLD_FORMAT, "student": "ada",
                                "attempts": {"q2": [{"picks": [0], "right": False}]}}))
    assert Attempts(path, "ada").attempted("q2") and not Attempts(path, "bea").attempted("q2")
