"""CLI arguments checked before the run, each refusal one line (exit 2) in the user's words: a
time limit that is not a finite number > 0, `spec --curve`'s contexts, reps and tokens, a toggle
given twice in one arm, a draft length or rank count that bench or compare cannot run (naming
the command that can); `compare` of an arm against itself is an A/A control, not a plain PASS;
`selfcheck --solutions` runs the file in child processes, stopped at the time limit, and a file
that ends the process is never "all pass". Device-free."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from lab.__main__ import SPEC_CURVE_TOKENS, build_parser, main

ROOT = Path(__file__).resolve().parents[2]


def _refused(capsys, argv, *needles, absent=()) -> str:
    assert main([str(a) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("decode-lab: error: ") and err.count("\n") == 1, err
    for needle in needles:
        assert needle in err, (needle, err)
    for word in absent:
        assert word not in err, (word, err)
    return err


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf"])
def test_a_time_limit_is_finite_and_positive(value, capsys):
    _refused(capsys, ["exercise", "check", "merge", "--solution", "x.py", "--timeout", value],
             f"--timeout {value}", "finite number > 0")
    _refused(capsys, ["selfcheck", "--solutions", "x.py", "--timeout", value], "--timeout")


@pytest.mark.parametrize("extra, needles", [
    (["--contexts", "abc"], ["--contexts 'abc'", "whole numbers"]),
    (["--contexts", "1e3"], ["--contexts '1e3'", "whole numbers"]),
    (["--contexts", ","], ["--contexts ','", "at least one"]),
    (["--reps", "0"], ["--reps 0", "at least 2"]),
    (["--reps", "1"], ["--reps 1", "at least 2"]),
    (["--tokens", "200"], ["--tokens 200", "at context 900 at most --tokens 124 fit"]),
])
def test_spec_curve_arguments(extra, needles, capsys):
    _refused(capsys, ["spec", "--curve", "--backend", "sim", *extra], *needles)


def test_spec_curve_default_tokens_fit_its_default_contexts():
    from lab.__main__ import SPEC_CURVE_CONTEXTS
    args = build_parser().parse_args(["spec", "--curve"])
    max_seq = json.loads((ROOT / "data" / "tiny_model.json").read_text())["max_seq"]
    contexts = [int(c) for c in SPEC_CURVE_CONTEXTS.split(",")]
    assert args.tokens is None and args.contexts is None
    assert max(contexts) + SPEC_CURVE_TOKENS <= max_seq


@pytest.mark.parametrize("argv", [
    ["bench", "ab", "--a", "GRAPH=0,GRAPH=1", "--b", "GRAPH=1"],
    ["bench", "sweep", "--contexts", "64", "--arms", "GRAPH=1", "graph=0,LAB_GRAPH=1"],
    ["compare", "--a", "GRAPH=0,LAB_GRAPH=1", "--b", "reference"],
])
def test_one_toggle_twice_in_one_arm(argv, capsys):
    _refused(capsys, [*argv, "--backend", "sim"], "LAB_GRAPH is given twice")


@pytest.mark.parametrize("argv, command", [
    (["bench", "ab", "--a", "DRAFT=4", "--b", "DRAFT=0"], "`decode-lab spec --curve`"),
    (["bench", "sweep", "--contexts", "64", "--arms", "GRAPH=1", "LAB_DRAFT=2"],
     "`decode-lab spec --curve`"),
    (["bench", "ab", "--a", "RANKS=2", "--b", "GRAPH=1"], "`LAB_RANKS=2 decode-lab demo`"),
    (["compare", "--a", "DRAFT=4", "--b", "reference"], "`decode-lab spec --draft 4`"),
])
def test_a_draft_length_or_ranks_name_the_command_that_can(argv, command, capsys):
    _refused(capsys, [*argv, "--backend", "sim"], command,
             absent=("DecodeEngine", "group=", "pass "))


@pytest.mark.parametrize("arm, words", [
    ("LAB_DRAFTER=ngram", ("LAB_DRAFTER=ngram where the environment has LAB_DRAFTER=lookup",
                           "`LAB_DRAFTER=ngram decode-lab spec --curve`")),
    ("LAB_DRAFT_SPLITS=4", ("LAB_DRAFT_SPLITS=4 where the environment has LAB_DRAFT_SPLITS=16",
                            "`decode-lab record spec`")),
])
def test_a_drafting_arm_that_allocates_otherwise_names_its_toggle(arm, words, monkeypatch,
                                                                   capsys):
    """Under LAB_DRAFT=4 every bench arm drafts on one engine: an arm with another drafter or
    split count is refused in one line naming the arm, the toggle and what compares them, not by
    the engine's own refusal."""
    monkeypatch.setenv("LAB_DRAFT", "4")
    _refused(capsys, ["bench", "ab", "--a", "GRAPH=1", "--b", arm, "--backend", "sim"],
             f"--b {arm!r}", *words, absent=("DecodeEngine",))


def test_ranks_from_the_environment_are_refused_by_bench(monkeypatch, capsys):
    monkeypatch.setenv("LAB_RANKS", "2")
    _refused(capsys, ["bench", "ab", "--a", "GRAPH=0", "--b", "GRAPH=1", "--backend", "sim"],
             "the environment", "decode-lab demo")


def test_compare_of_an_arm_against_itself_is_an_a_a_control(tmp_path, capsys):
    out = tmp_path / "aa.json"
    assert main(["compare", "--a", "reference", "--b", "reference", "--tokens", "2",
                 "--json", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    verdict = [line for line in lines if line.startswith("verdict:")]
    assert len(verdict) == 1 and verdict[0].startswith("verdict: A/A control PASS: an A/A control")
    assert "verdict: PASS" not in lines
    assert "A/A control" in json.loads(out.read_text())["verdict"]["control"]


def _solutions(tmp_path, text: str) -> str:
    path = tmp_path / "mine.py"
    path.write_text(text)
    return str(path)


def test_selfcheck_solutions_that_loop_are_stopped(tmp_path, capsys):
    path = _solutions(tmp_path, "def paired_t(a, b):\n    while True:\n        pass\n")
    assert main(["selfcheck", "--solutions", path, "--timeout", "1", "--student", "s",
                 "--attempts", str(tmp_path / "att.json")]) == 1
    out = capsys.readouterr().out
    assert "paired_t: not yet -- the check did not finish within 1 s" in out
    path = _solutions(tmp_path, "while True:\n    pass\n")          # at import
    _refused(capsys, ["selfcheck", "--solutions", path, "--timeout", "1", "--student", "s",
                      "--attempts", tmp_path / "att.json"], "--solutions", "did not finish")


def test_selfcheck_solutions_that_exit_are_not_all_pass(tmp_path, capsys):
    path = _solutions(tmp_path, "import os\nos._exit(0)\n")
    _refused(capsys, ["selfcheck", "--solutions", path, "--student", "s",
                      "--attempts", tmp_path / "att.json"], "--solutions", "without a verdict")
    names = ("merge_partials", "launches_per_token", "per_launch_budget_us", "paired_t",
             "verdict", "replays_needed")
    path = _solutions(tmp_path, "import os\n" + "".join(
        f"def {n}(*a, **k):\n    os._exit(0)\n" for n in names))
    assert main(["selfcheck", "--solutions", path, "--student", "s",
                 "--attempts", str(tmp_path / "att.json")]) == 1
    out = capsys.readouterr().out
    assert out.count("ended without a verdict") == 5 and "score: 0/15" in out


def test_demo_refuses_the_device_loop_naming_what_shows_it(capsys, monkeypatch):
    """demo bills the host loop one token at a time: with LAB_LOOP=device it refused the loop,
    ran it anyway and billed every plan's body as one token's launches; now one line naming
    the commands that show the device loop."""
    monkeypatch.setenv("LAB_LOOP", "device")
    _refused(capsys, ["demo", "--backend", "sim", "--tokens", "2"], "LAB_LOOP=device",
             "bench ab --a LAB_LOOP=host --b LAB_LOOP=device")


@pytest.mark.parametrize("argv, needle", [
    (["spec", "--curve", "--prompts", "standard"], "--prompts 'standard': the curve decodes"),
    (["spec", "--contexts", "64"], "--contexts: the curve's; add --curve"),
    (["spec", "--reps", "4", "--contexts", "64"], "--contexts and --reps: the curve's"),
])
def test_spec_refuses_a_flag_it_would_ignore(argv, needle, capsys):
    """--prompts means the same-tokens check, --contexts and --reps the curve: each given where
    it would be ignored is one line, not a silent default."""
    _refused(capsys, argv + ["--backend", "sim"], needle)


def test_draft_splits_needs_a_draft_as_the_tail_needs_fusion(capsys, monkeypatch):
    """LAB_DRAFT_SPLITS without LAB_DRAFT has no effect in any arm: refused in one line, by the
    rule LAB_ATTN_TAIL=heads without LAB_FUSION=1 meets; with `spec --draft K` (the command's own
    LAB_DRAFT) it sets the drafting arm's split count."""
    monkeypatch.setenv("LAB_DRAFT_SPLITS", "4")
    _refused(capsys, ["demo", "--backend", "sim", "--tokens", "2"], "LAB_DRAFT_SPLITS=4",
             "needs LAB_DRAFT=2, 4 or 8", "as LAB_ATTN_TAIL=heads needs LAB_FUSION=1")
    monkeypatch.setenv("LAB_ATTN_TAIL", "heads")
    monkeypatch.delenv("LAB_DRAFT_SPLITS")
    _refused(capsys, ["demo", "--backend", "sim", "--tokens", "2"], "LAB_ATTN_TAIL=heads")
    monkeypatch.delenv("LAB_ATTN_TAIL")
    monkeypatch.setenv("LAB_DRAFT_SPLITS", "4")
    from lab.measure import spec
    made = []
    real = spec.DecodeEngine
    monkeypatch.setattr(spec, "DecodeEngine",
                        lambda model, cfg: made.append(cfg) or real(model, cfg))
    assert main(["spec", "--draft", "4", "--backend", "sim", "--tokens", "4",
                 "--prompts", "ROMEO."]) == 0
    assert sorted((c.draft, c.draft_splits) for c in made) == [(0, 16), (4, 4)]
