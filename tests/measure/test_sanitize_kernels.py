"""The sanitize_kernels check (lab/measure/experiments/checks.py): compute-sanitizer's summary
lines read into a table and a verdict, the experiment's place in the registry, and its run on
the simulator with a stand-in for the sanitizer. Device-free."""
from __future__ import annotations

import os
import stat

import pytest

from lab.errors import LabError
from lab.measure import registry
from lab.measure.experiments import checks

CLEAN = ("========= COMPUTE-SANITIZER\n"
         "ROMEO.\n\n[5 prompt steps + 8 tokens, ...]\n"
         "========= ERROR SUMMARY: 0 errors\n")
RACE_CLEAN = "========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)\n"


@pytest.mark.parametrize("text,errors", [
    (CLEAN, 0),
    ("========= ERROR SUMMARY: 3 errors\n", 3),
    ("========= ERROR SUMMARY: 1 error\n", 1),
    (RACE_CLEAN, 0),
    # hazards displayed counts the warnings too: the errors are the number before "errors"
    ("========= RACECHECK SUMMARY: 5 hazards displayed (2 errors, 3 warnings)\n", 2),
    ("========= RACECHECK SUMMARY: 4 hazards displayed (0 errors, 4 warnings)\n", 0),
    ("Traceback (most recent call last):\nRuntimeError: boom\n", None),
    ("", None),
])
def test_sanitizer_errors_reads_the_summary_line(text, errors):
    assert checks.sanitizer_errors(text) == errors


def test_a_clean_summary_passes_and_the_table_lists_every_run():
    table, failed = checks.sanitize_table([
        ("memcheck", "LAB_PERSISTENT=1 graph", 0, CLEAN),
        ("racecheck", "LAB_DRAFT=4 graph", 0, RACE_CLEAN)])
    assert failed == []
    rows = [r.split() for r in table.splitlines()]
    assert rows == [["tool", "toggle", "exit", "errors"],
                    ["memcheck", "LAB_PERSISTENT=1", "graph", "0", "0"],
                    ["racecheck", "LAB_DRAFT=4", "graph", "0", "0"]]


@pytest.mark.parametrize("code,text,why,cell", [
    (0, "========= ERROR SUMMARY: 2 errors\n", "2 errors", "2"),
    (0, "ROMEO.\n", "no summary line", "no summary"),
    (1, CLEAN, "exit 1", "0"),
    (124, "ROMEO.\n", "exit 124, no summary line", "no summary"),
])
def test_a_failed_run_is_named_by_its_tool_and_toggle(code, text, why, cell):
    table, failed = checks.sanitize_table([
        ("memcheck", "LAB_PERSISTENT=1 graph", 0, CLEAN),
        ("synccheck", "LAB_DRAFT=4 eager", code, text)])
    assert failed == [f"synccheck LAB_DRAFT=4 eager: {why}"]
    assert table.splitlines()[-1].split()[3:] == [str(code), *cell.split()]


def test_the_check_is_registered_for_the_gpu_and_refused_on_the_simulator(tmp_path, capsys):
    exp = registry.load()["sanitize_kernels"]
    assert exp.check and exp.backends == ("cuda",) and exp.files == ("sanitize_kernels.log",)
    assert registry.record(["sanitize_kernels"], "sim", tmp_path, quick=True) == 0
    (line,) = [ln for ln in capsys.readouterr().err.splitlines() if "] sanitize_kernels: " in ln]
    assert "skipped: means something on cuda only" in line
    assert not (tmp_path / "sanitize_kernels.log").exists()


def test_every_tool_runs_on_every_toggle():
    pieces = set(checks.SANITIZE_PIECES)
    for tool in ("memcheck", "racecheck", "synccheck"):
        for toggle in ("LAB_PERSISTENT=1", "LAB_DRAFT=4", "LAB_DRAFT=4 LAB_DRAFTER=ngram"):
            assert (tool, toggle, "graph") in pieces
    # each toggle set pins every toggle that picks the step, so an inherited one cannot
    for env in checks.SANITIZE_TOGGLES.values():
        assert set(env) == {"LAB_PERSISTENT", "LAB_DRAFT", "LAB_DRAFTER"}
        from lab.config import from_env
        from_env(env)                      # a combination LabConfig takes
    argv = checks._sanitize_argv("compute-sanitizer", "racecheck", "eager")
    assert argv[:5] == ["compute-sanitizer", "--tool", "racecheck", "--report-api-errors", "no"]
    assert argv[-1] == "--eager" and "generate" in argv


def test_without_compute_sanitizer_on_path_it_fails_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(LabError, match="compute-sanitizer is not on PATH") as exc:
        checks.sanitize_kernels(registry.Context("cuda", tmp_path))
    assert "\n" not in str(exc.value)


def _stand_in(folder, summary: str):
    """A `compute-sanitizer` that runs the command after its four options, prints the toggles
    the command saw, then `summary`; its exit status is the command's."""
    path = folder / "compute-sanitizer"
    path.write_text("#!/bin/sh\nshift 4\n\"$@\"\ncode=$?\n"
                    "echo \"toggles LAB_PERSISTENT=$LAB_PERSISTENT LAB_DRAFT=$LAB_DRAFT\"\n"
                    f"echo '{summary}'\nexit $code\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


@pytest.mark.parametrize("summary,ok", [("========= ERROR SUMMARY: 0 errors", True),
                                        ("========= ERROR SUMMARY: 1 errors", False)])
def test_the_check_runs_each_piece_in_a_process_with_its_toggle(tmp_path, monkeypatch,
                                                                summary, ok):
    """The experiment on the simulator (SANITIZE_BACKEND), a stand-in sanitizer on PATH: each
    piece's decode runs with its toggle set, the log ends with the table, and one error fails
    the experiment naming its tool and toggle."""
    bin_dir, out = tmp_path / "bin", tmp_path / "out"
    bin_dir.mkdir()
    out.mkdir()
    _stand_in(bin_dir, summary)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(checks, "SANITIZE_BACKEND", "sim")
    monkeypatch.setattr(checks, "SANITIZE_PIECES", (("memcheck", "LAB_PERSISTENT=1", "graph"),
                                                    ("synccheck", "LAB_DRAFT=4", "eager")))
    ctx = registry.Context("sim", out)
    if ok:
        checks.sanitize_kernels(ctx)
    else:
        with pytest.raises(LabError, match="memcheck LAB_PERSISTENT=1 graph: 1 errors; "
                                           "synccheck LAB_DRAFT=4 eager: 1 errors"):
            checks.sanitize_kernels(ctx)
    log = (out / "sanitize_kernels.log").read_text()
    assert "toggles LAB_PERSISTENT=1 LAB_DRAFT=0" in log
    assert "toggles LAB_PERSISTENT=0 LAB_DRAFT=4" in log and "[LAB_DRAFT=4: " in log
    assert "$ LAB_DRAFT=4 LAB_PERSISTENT=0 " in log and "--eager" in log
    rows = [r.split() for r in log.splitlines()[-3:]]
    assert rows[0] == ["tool", "toggle", "exit", "errors"]
    assert [r[-2:] for r in rows[1:]] == [["0", "0" if ok else "1"]] * 2
    assert sorted(p.name for p in (out / "sanitize_kernels").iterdir()) == [
        "memcheck-LAB_PERSISTENT1-graph.log", "synccheck-LAB_DRAFT4-eager.log"]
