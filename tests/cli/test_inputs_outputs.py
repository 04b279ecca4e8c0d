"""Inputs are never outputs: every command refuses, before any work and in one line naming both,
an output path that is one of its inputs, a file the lab reads (everything under data/) or
another output of the same run, however the path is spelled (a symlink, a hard link,
`data/../data/x`); an empty path is refused, never read as the default. `record` writes a
fresh folder beside --out and renames it at the end, refusing a non-empty --out unless
--replace. Device-free: every refusal comes before a model is run."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from lab.__main__ import main
from lab.measure import registry

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "data"
AB = ["bench", "ab", "--a", "GRAPH=0", "--b", "GRAPH=1", "--backend", "sim"]
COMPARE = ["compare", "--a", "reference", "--b", "sim", "--tokens", "2"]


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def lab_data():
    """sha256 of every file under data/: a refused command leaves each one as it was."""
    before = {p: _digest(p) for p in DATA.rglob("*") if p.is_file()}
    yield before
    assert {p: _digest(p) for p in DATA.rglob("*") if p.is_file()} == before


def _refused(capsys, argv, *needles) -> str:
    """main(argv) exits 2 with one line holding every needle; the line."""
    assert main([str(a) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("decode-lab: error: ") and err.count("\n") == 1, err
    for needle in needles:
        assert str(needle) in err, (needle, err)
    return err


@pytest.mark.parametrize("argv, needles", [
    (["generate", "--prompt", "R", "--tokens", "2", "--backend", "sim", "--save-dot",
      "data/tiny_model.npz"], ["--save-dot data/tiny_model.npz", "--weights"]),
    ([*AB, "--json", "data/tiny_model.npz"], ["--json data/tiny_model.npz", "--weights"]),
    ([*COMPARE, "--json", "data/tiny_model.json"], ["--json", "description of --weights"]),
    ([*AB, "--json", "data/gpu/kernel_costs.json"], ["--json", "data/gpu/kernel_costs.json",
                                                     "a file the lab reads"]),
    (["spec", "--json", "data/gpu/spec_costs.json"], ["--json", "data/gpu/spec_costs.json"]),
    ([*AB, "--plot", "data/gpu/bench_ab.png"], ["--plot", "a file the lab reads"]),
    (["record", "instances", "--backend", "sim", "--out", "data/gpu", "--replace"],
     ["--out data/gpu", "a file the lab reads"]),
    (["record", "instances", "--backend", "sim", "--out", "data"], ["--out data", "--weights"]),
])
def test_an_output_that_is_an_input_or_a_lab_file_is_refused(argv, needles, capsys, lab_data):
    _refused(capsys, argv, *needles)


def test_two_outputs_of_one_run_that_name_one_file(tmp_path, capsys, lab_data):
    out = tmp_path / "result.png"
    _refused(capsys, [*AB, "--json", out, "--plot", out], "--json", "--plot", "name one file")
    _refused(capsys, [*AB, "--json", out, "--plot", f"{tmp_path}/../{tmp_path.name}/result.png"],
             "name one file")
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")          # neither file exists yet
    _refused(capsys, [*AB, "--json", tmp_path / "real" / "r.png", "--plot",
                      tmp_path / "link" / "r.png"], "--json", "--plot", "name one file")
    assert not out.exists()


def test_a_symlink_a_hard_link_and_dotdot_are_caught(tmp_path, capsys, lab_data):
    link = tmp_path / "innocent.json"
    link.symlink_to(DATA / "gpu" / "kernel_costs.json")
    _refused(capsys, [*AB, "--json", link], f"--json {link}", "data/gpu/kernel_costs.json")
    folder = tmp_path / "d"
    folder.symlink_to(DATA)
    _refused(capsys, [*COMPARE, "--json", folder / "tiny_model.json"], "--weights")
    _refused(capsys, [*AB, "--json", DATA / ".." / "data" / "gpu" / "kernel_costs.json"],
             "a file the lab reads")
    _refused(capsys, [*AB, "--json", "data/../data/tiny_model.npz"], "--weights")
    # a hard link: another name of the weights' description (a copy of the weights in tmp)
    for suffix in (".npz", ".json"):
        shutil.copy(DATA / f"tiny_model{suffix}", tmp_path / f"w{suffix}")
    os.link(tmp_path / "w.json", tmp_path / "report.json")
    _refused(capsys, [*AB, "--weights", tmp_path / "w.npz", "--json", tmp_path / "report.json"],
             f"--json {tmp_path / 'report.json'}", "the description of --weights")
    os.link(tmp_path / "w.npz", tmp_path / "graph.dot")
    _refused(capsys, ["generate", "--prompt", "R", "--tokens", "2", "--backend", "sim",
                      "--weights", tmp_path / "w.npz", "--save-dot", tmp_path / "graph.dot"],
             "--save-dot", "--weights")
    assert json.loads((tmp_path / "report.json").read_text())["max_seq"]      # untouched


def test_selfcheck_attempts_is_not_the_answers_file(tmp_path, capsys):
    answers = tmp_path / "answers.json"
    answers.write_text("{}")
    _refused(capsys, ["selfcheck", "--answers", answers, "--attempts", answers, "--student", "s"],
             "--attempts", "--answers")
    assert answers.read_text() == "{}"


@pytest.mark.parametrize("argv, flag", [
    (["generate", "--prompt", "R", "--tokens", "2", "--backend", "sim", "--weights", ""],
     "--weights"),
    (["generate", "--prompt", "R", "--tokens", "2", "--backend", "sim", "--save-dot", ""],
     "--save-dot"),
    ([*AB, "--json", ""], "--json"),
    ([*COMPARE, "--weights-b", ""], "--weights-b"),
    (["spec", "--weights", ""], "--weights"),
    (["conformance", "--data", ""], "--data"),
    (["record", "instances", "--backend", "sim", "--out", ""], "--out"),
    (["selfcheck", "--solutions", ""], "--solutions"),
    (["exercise", "check", "merge", "--solution", ""], "--solution"),
])
def test_an_empty_path_is_refused_not_taken_for_the_default(argv, flag, capsys):
    _refused(capsys, argv, f"{flag} ''", "empty path")


# ---- record: a fresh folder, renamed at the end --------------------------------------------
@pytest.fixture
def fake_experiment(monkeypatch):
    """`alpha`, an experiment that writes alpha.json (or runs `behaviour(ctx)` instead)."""
    monkeypatch.setattr(registry, "revision", lambda: {"commit": "c1", "dirty": False})
    seen = {}

    def run(ctx):
        seen["out"] = ctx.out
        if "behaviour" in seen:
            seen["behaviour"](ctx)
        ctx.write_json("alpha.json", {"new": True})
    monkeypatch.setitem(registry.REGISTRY, "alpha", registry.Experiment(
        "alpha", ("alpha.json",), 901, run))
    return seen


def _record(out, *extra):
    return main(["record", "alpha", "--backend", "sim", "--quick", "--out", str(out), *extra])


def test_record_refuses_a_non_empty_out_unless_replace(tmp_path, capsys, fake_experiment):
    out = tmp_path / "rec"
    out.mkdir()
    (out / "old.json").write_text("kept")
    _refused(capsys, ["record", "alpha", "--backend", "sim", "--out", out], f"--out {out}",
             "--replace")
    _refused(capsys, ["record", "alpha", "--backend", "sim", "--out", out, "--replace",
                      "--resume"], "--replace", "--resume")
    assert sorted(p.name for p in out.iterdir()) == ["old.json"] and "out" not in fake_experiment

    fake_experiment["behaviour"] = lambda ctx: (
        fake_experiment.setdefault("during", sorted(p.name for p in out.iterdir())))
    assert _record(out, "--replace") == 0
    assert fake_experiment["out"].resolve() != out.resolve()      # written beside, not into
    assert fake_experiment["during"] == ["old.json"]              # OUT untouched while it ran
    assert not (out / "old.json").exists() and json.loads((out / "alpha.json").read_text())["new"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rec"]  # nothing left beside it


def test_a_record_run_cut_short_leaves_out_as_it_was(tmp_path, capsys, fake_experiment):
    out = tmp_path / "rec"
    out.mkdir()
    (out / "old.json").write_text("kept")

    def interrupted(ctx):
        raise KeyboardInterrupt
    fake_experiment["behaviour"] = interrupted
    assert _record(out, "--replace") == 130
    assert sorted(p.name for p in out.iterdir()) == ["old.json"]
    assert (out / "old.json").read_text() == "kept"
    assert "left as it was" in capsys.readouterr().err


def test_record_into_a_new_folder_and_resume_into_it(tmp_path, capsys, fake_experiment):
    out = tmp_path / "new" / "rec"
    assert _record(out) == 0 and (out / "alpha.json").is_file()
    assert sorted(p.name for p in out.parent.iterdir()) == ["rec"]
    assert _record(out, "--resume") == 0                          # --resume continues into OUT
    assert "kept: done earlier" in capsys.readouterr().out
    assert "resume: alpha kept" in (out / registry.LOG_FILE).read_text()
