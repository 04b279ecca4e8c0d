"""The lecture's ten questions (lab/selfcheck/questions.py) and `decode-lab selfcheck`.

Each question passes exactly its right answer, a wrong or malformed answer says why without
giving the answer away, nothing is revealed before an attempt (in the notebook either), and the
CLI scores an answers file and a solutions file and refuses bad ones. The answer key is written
here, independently of the module's."""
import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest

from lab.__main__ import main
from lab.errors import LabError
from lab.selfcheck import QUESTIONS, answer, ask, check_answer, reveal

RIGHT = {"q1": ["a", "c", "d", "f"], "q2": "b", "q3": "c", "q4": 756.25, "q5": "d", "q6": "c",
         "q7": ["b", "d"], "q8": ["b", "d"], "q9": "a", "q10": "b"}
# two wrong answers each (the exhaustive tests below try every other letter and letter set)
WRONG = {"q1": [["a", "c"], ["a", "b", "c", "d", "e", "f"]], "q2": ["a", "c"], "q3": ["a", "d"],
         "q4": [27.5, 0], "q5": ["a", "c"], "q6": ["a", "d"], "q7": [["a", "b", "d"], ["c"]],
         "q8": [["a", "b", "c", "d"], ["d"]], "q9": ["b", "c"], "q10": ["a", "d"]}
NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "08_self_check"


def test_the_key_covers_every_question():
    assert list(QUESTIONS) == [f"q{i}" for i in range(1, 11)] == list(RIGHT) == list(WRONG)


@pytest.mark.parametrize("qid", RIGHT)
def test_only_the_right_answer_passes(qid):
    q = QUESTIONS[qid]
    assert check_answer(qid, RIGHT[qid]).passed
    for wrong in WRONG[qid]:
        res = check_answer(qid, wrong)
        assert res.status == "wrong" and not res and res.line().startswith(f"{qid}: not yet -- ")
    if q.form == "choice":
        assert [x for x in q.letters if check_answer(qid, x).passed] == [RIGHT[qid]]
    elif q.form == "choices":
        subsets = [list(s) for n in range(1, len(q.letters) + 1)
                   for s in itertools.combinations(q.letters, n)]
        assert [s for s in subsets if check_answer(qid, s).passed] == [RIGHT[qid]]
    else:
        for factor, ok in ((0.985, True), (1.015, True), (0.97, False), (1.03, False), (-1, False)):
            assert check_answer(qid, RIGHT[qid] * factor).passed is ok, factor


def test_answers_in_other_spellings():
    for value in ("B", " b ", np.str_("b")):
        assert check_answer("q2", value).passed
    for value in (["D", "b"], "b, d", "d b", ("b", "d"), {"b", "d"}, ["b", "d", "b"]):
        assert check_answer("q8", value).passed, value
    for value in (756, np.float32(756.25), np.int64(750)):
        assert check_answer("q4", value).passed, value


def test_wrong_answers_say_why_without_the_answer():
    assert check_answer("q2", "a").message == "you picked a"
    assert check_answer("q7", ["a", "b"]).message == ("of your picks a, b: 1 wrong, 1 right "
                                                      "one(s) missing")
    msg = check_answer("q4", 27.5).message
    assert "not within 2%" in msg and "ratio of the standard errors" in msg and "756" not in msg
    assert "square root" in check_answer("q4", math.sqrt(27.5)).message


@pytest.mark.parametrize("qid, value, words", [
    ("q2", ["b"], "takes one letter (a string), got list"),
    ("q2", "z", "'z' is not one of the letters a, b, c, d"),
    ("q2", 2, "takes one letter"),
    ("q1", [], "pick at least one letter"),
    ("q1", "", "pick at least one letter"),
    ("q1", ["a", 3], "takes letters (strings), got int 3"),
    ("q1", "a, z", "'z' is not one of the letters a, b, c, d, e, f"),
    ("q1", {"a": 1}, "takes a list of letters, got dict"),
    ("q4", "756", "takes a number, got str '756'"),
    ("q4", True, "takes a number, got bool"),
    ("q4", float("nan"), "takes a finite number"),
    ("q4", [756], "takes a number, got list"),
])
def test_malformed_answers_are_named_and_reveal_nothing(qid, value, words, capsys):
    res = answer(qid, value)
    assert res.status == "malformed" and not res.attempted and words in res.message
    out = capsys.readouterr().out
    assert out == f"{qid}: not yet -- {res.message}\n"


def test_unknown_question_ids_are_an_error():
    for qid in ("q11", "Q1", 1, None):
        with pytest.raises(LabError, match="unknown question id .* the ids are q1, q2"):
            check_answer(qid, "a")


@pytest.mark.parametrize("qid", RIGHT)
def test_revealed_only_after_an_attempt(qid, capsys):
    q = QUESTIONS[qid]
    secret = q.explanation[:60]
    ask(qid)
    answer(qid, None)
    answer(qid, WRONG[qid][0], explain=False)
    before = capsys.readouterr().out
    assert qid in before and "not answered" in before and secret not in before
    for shown in (repr(q), q.prompt(), q.prompt(in_json=True)):
        assert secret not in shown
    answer(qid, WRONG[qid][0])
    after_wrong = capsys.readouterr().out
    assert secret in after_wrong and f"{qid} answer:" in after_wrong and "your " in after_wrong
    answer(qid, RIGHT[qid])
    assert secret in capsys.readouterr().out
    reveal(qid)
    assert secret in capsys.readouterr().out


def test_every_wrong_option_has_a_note():
    for q in QUESTIONS.values():
        if q.form != "number":
            right = {q.answer} if q.form == "choice" else set(q.answer)
            assert set(q.why_not) == set(q.letters) - right, q.id


def test_the_notebook_asks_all_ten_and_shows_no_answer():
    import jupytext
    source = NOTEBOOK.with_suffix(".py").read_text()
    outputs = "".join(o.get("text", "") for c in jupytext.read(NOTEBOOK.with_suffix(".ipynb")).cells
                      if c.cell_type == "code" for o in c.get("outputs", []))
    for qid, q in QUESTIONS.items():
        assert f'ask("{qid}")' in source and f'answer("{qid}", None)' in source
        assert q.prompt() in outputs and f"{qid}: not answered" in outputs
        for text in (q.explanation[:60], *q.why_not.values()):
            assert text not in source and text not in outputs
    assert "score: 0/15" in outputs


# ---------------------------------------------------------------- decode-lab selfcheck

SOLUTIONS = """
from test_selfcheck import budget_ok as per_launch_budget_us
from test_selfcheck import launches_ok as launches_per_token
from test_selfcheck import merge_ok as merge_partials
from test_selfcheck import paired_t_ok as paired_t
from test_selfcheck import verdict_ok as verdict


def replays_needed():
    return 2
"""


def _file(tmp_path, name, content):
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return str(path)


def test_cli_without_arguments_prints_the_questions(capsys):
    assert main(["selfcheck"]) == 0
    out = capsys.readouterr().out
    for qid, q in QUESTIONS.items():
        assert q.prompt(in_json=True) in out and q.explanation[:60] not in out
    assert json.dumps({qid: None for qid in QUESTIONS}) in out
    assert "--answers answers.json --solutions my_solutions.py" in out


def test_cli_scores_all_fifteen(tmp_path, capsys):
    argv = ["selfcheck", "--answers", _file(tmp_path, "a.json", RIGHT),
            "--solutions", _file(tmp_path, "s.py", SOLUTIONS)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.count(": PASS") == 15 and out.rstrip().endswith("score: 15/15")
    assert QUESTIONS["q1"].explanation[:60] not in out
    assert main(argv + ["--explain"]) == 0
    assert QUESTIONS["q1"].explanation[:60] in capsys.readouterr().out


def test_cli_partial_answers_without_solutions(tmp_path, capsys):
    answers = {"q1": RIGHT["q1"], "q2": "a", "q4": "lots", "q5": None, "q8": RIGHT["q8"]}
    assert main(["selfcheck", "--answers", _file(tmp_path, "a.json", answers), "--explain"]) == 1
    out = capsys.readouterr().out
    assert "q1: PASS" in out and "q2: not yet -- you picked a" in out
    assert "q4: not yet -- takes a number, got str 'lots'" in out
    assert "q5: not answered" in out and "q10: not answered" in out
    assert "not checked: give --solutions" in out and out.rstrip().endswith("score: 2/15")
    assert QUESTIONS["q2"].explanation[:60] in out                      # attempted: explained
    for qid in ("q4", "q5", "q10"):                                     # not attempted: not
        assert QUESTIONS[qid].explanation[:60] not in out


def test_cli_solutions_that_miss_or_misuse_functions(tmp_path, capsys):
    text = SOLUTIONS.replace("from test_selfcheck import paired_t_ok as paired_t\n", "") + (
        "\nverdict = 'fine'\n\ndef merge_partials(part_o, part_ml):\n"
        "    from kernels.attention import attn_merge_twin\n"
        "    o = part_o[:, 0].reshape(-1).copy()\n"
        "    attn_merge_twin(None, None, part_o, part_ml, o)\n"
        "    return o\n")
    assert main(["selfcheck", "--solutions", _file(tmp_path, "mine.py", text)]) == 1
    out = capsys.readouterr().out
    assert "paired_t: not yet -- mine.py defines no paired_t" in out
    assert "verdict: not yet -- verdict in mine.py is a str, not a function" in out
    assert ("merge_partials: not yet -- case 'one slice per head, context 5': merge_partials "
            "called kernels.attention.attn_merge_twin") in out
    assert "launch_bill: PASS" in out and "replays_needed: PASS" in out
    assert out.rstrip().endswith("score: 2/15")


@pytest.mark.parametrize("kind, content, needle", [
    ("answers", {"q1": ["a"], "q11": "b"}, "unknown question id(s) 'q11'; the ids are q1, q2"),
    ("answers", ["a", "b"], "expected a JSON object"),
    ("answers", '{"q1": ["a"],}', "not valid JSON"),
    ("answers", None, "no such file"),
    ("solutions", "def paired_t(a, b)\n    return a\n", "failed to import: SyntaxError"),
    ("solutions", "import no_such_module_here\n", "failed to import: ModuleNotFoundError"),
    ("solutions", "raise SystemExit(3)\n", "failed to import: SystemExit: 3"),
    ("solutions", None, "no such file"),
])
def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, capsys, kind, content, needle):
    path = str(tmp_path / "missing") if content is None else _file(tmp_path, f"{kind}.x", content)
    assert main(["selfcheck", f"--{kind}", path]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"decode-lab: error: --{kind} ") and needle in err
    assert err.count("\n") == 1 and "Traceback" not in err
