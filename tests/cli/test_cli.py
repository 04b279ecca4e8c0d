"""The CLI: output on success; one-line errors and exit 2 on bad input, never a traceback."""
import json
import subprocess
import sys

import pytest

from lab.__main__ import main
from lab.backend import gpu_status


def test_generate_on_the_simulator(capsys):
    assert main(["generate", "--prompt", "ROMEO.\n", "--tokens", "20", "--backend", "sim",
                 "--ledger"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ROMEO.\n") and "ms/token" in out and "simulated" in out
    assert "capture" in out and "summary:" in out
    rows = [line for line in out.splitlines() if line.endswith(("capture", "replay"))]
    assert rows and all("splits=" in r and "pdl=0" in r and len(r) <= 100 for r in rows), rows[:2]


def test_demo_prints_text_and_the_launch_ladder(capsys):
    assert main(["demo", "--backend", "sim", "--tokens", "24"]) == 0
    out = capsys.readouterr().out
    assert "launch bill" in out and "simulated" in out
    rows = [line.split()[0] for line in out.splitlines()[-7:]]
    assert {"dispatcher", "prebound", "graph"} <= set(rows)
    assert "less time per token than pre-bound eager" in out
    assert "37" in out  # launches per token with the one-kernel combine


def test_demo_and_generate_with_two_ranks(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("LAB_RANKS", "2")
    assert main(["demo", "--backend", "sim", "--tokens", "12"]) == 0
    out = capsys.readouterr().out
    assert "launch bill with 2 ranks" in out and "launches per rank per token [41, 41]" in out
    assert "collectives per token 9: all_gather of 36 float32, all_reduce of 256 float32" in out
    assert main(["generate", "--prompt", "ROMEO.", "--tokens", "4", "--backend", "sim",
                 "--save-dot", str(tmp_path / "g.dot")]) == 0
    assert "all_reduce" in (tmp_path / "g.0.dot").read_text()
    assert main(["audit", "--backend", "sim"]) == 2
    assert "audit inspects one device's step" in capsys.readouterr().err


@pytest.mark.parametrize("argv, needle", [
    (["generate", "--prompt", "caf\u00e9", "--tokens", "3", "--backend", "sim"], "outside the model's vocabulary"),
    (["generate", "--prompt", "ROMEO:", "--tokens", "5000", "--backend", "sim"], "exceeds the model's max_seq"),
    (["generate", "--prompt", "ROMEO:", "--tokens", "3", "--backend", "sim", "--weights", "missing.npz"], "not found"),
])
def test_bad_input_is_one_line_and_exit_2(argv, needle, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("decode-lab: error:") and needle in err and "Traceback" not in err


def test_unknown_lab_value_from_the_environment(monkeypatch, capsys):
    monkeypatch.setenv("LAB_GRAPH", "maybe")
    assert main(["generate", "--prompt", "ROMEO:", "--tokens", "2", "--backend", "sim"]) == 2
    assert "LAB_GRAPH='maybe' is not allowed" in capsys.readouterr().err


@pytest.mark.skipif(gpu_status()[0], reason="this machine has a GPU")
def test_backend_cuda_without_a_gpu_is_a_clear_error():
    proc = subprocess.run([sys.executable, "-m", "lab", "generate", "--prompt", "ROMEO:",
                           "--tokens", "2", "--backend", "cuda"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "needs a GPU" in proc.stderr and "Traceback" not in proc.stderr


def test_audit_command_reports_clean_engine(capsys):
    assert main(["audit", "--backend", "sim"]) == 0
    out = capsys.readouterr().out
    assert "0 unhandled" in out and "lazy-init detector" in out and "(0 illegal)" in out
    assert "[BUG]" not in out and "nothing found" in out


@pytest.mark.parametrize("bug, needles", [
    ("CTX_BY_VALUE", ("attn_partial_len", "promote to device memory")),
    ("LAZY_TABLE", ("illegal", "rope_cos")),
    ("LATE_WAIT", ("PDL: rmsnorm_late_wait read before their pdl_wait()",)),
    ("STEP_KEY", ("graph key: its 'step' differs at every step",)),
    ("FLOAT_IDS", ("a kernel faulted", "LAB_LAUNCH_BLOCKING=1")),
])
def test_audit_command_flags_each_kind_of_bug_and_exits_1(monkeypatch, capsys, bug, needles):
    """Every kind of deliberate bug is found by one of the audit's checks, and then the command
    exits 1 (a CI job can gate on it)."""
    monkeypatch.setenv(f"LAB_BUG_{bug}", "1")
    assert main(["audit", "--backend", "sim"]) == 1
    out = capsys.readouterr().out
    assert "[BUG]" in out or "illegal" in out
    for needle in needles:
        assert needle in out, (needle, out[-1500:])


def test_save_dot_writes_each_graph(tmp_path, capsys):
    path = tmp_path / "step.dot"
    assert main(["generate", "--prompt", "ROMEO.\n", "--tokens", "30", "--backend", "sim",
                 "--save-dot", str(path)]) == 0
    dots = sorted(tmp_path.glob("step*.dot"))
    assert len(dots) == 2 and all(d.read_text().startswith("digraph") for d in dots)
    assert "37 nodes" in capsys.readouterr().out


def test_save_dot_without_a_graph_is_an_error(tmp_path, capsys):
    assert main(["generate", "--prompt", "ROMEO:", "--tokens", "3", "--backend", "sim", "--eager",
                 "--save-dot", str(tmp_path / "x.dot")]) == 2
    assert "no graph was captured" in capsys.readouterr().err


@pytest.mark.parametrize("extra, needle", [
    (["--tokens", "0"], "--tokens 0: give at least 1"),
    (["--tokens", "-3"], "--tokens -3: give at least 1"),
    (["--reps", "1"], "--reps 1: a standard error needs at least 2"),
    (["--json", "no/such/dir/out.json"], "--json no/such/dir/out.json: folder no/such/dir does not exist"),
    (["--plot", "out.xyz"], "--plot out.xyz: unknown file type .xyz"),
])
@pytest.mark.parametrize("cmd", [["ab", "--a", "LAB_GRAPH=0", "--b", "LAB_GRAPH=1"],
                                 ["loo", "--factors", "GRAPH"],
                                 ["sweep", "--contexts", "64", "--arms", "LAB_GRAPH=1"]],
                         ids=["ab", "loo", "sweep"])
def test_bench_bad_arguments_fail_before_any_work(cmd, extra, needle, capsys, monkeypatch):
    import lab.measure.bench as bench
    monkeypatch.setattr(bench, "make_arm", lambda *a, **k: pytest.fail("work started"))
    assert main(["bench", *cmd, "--backend", "sim", *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("decode-lab: error:") and needle in err and "Traceback" not in err


def test_bench_announces_every_file_it_writes(tmp_path, capsys):
    js, png = tmp_path / "r.json", tmp_path / "r.png"
    assert main(["bench", "loo", "--factors", "GRAPH", "--reps", "2", "--tokens", "2",
                 "--backend", "sim", "--json", str(js), "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert f"wrote {js}" in out and f"wrote {png}" in out
    assert json.loads(js.read_text())["factors"] == ["GRAPH"]


def test_reference_generate_has_the_engine_limits(model):
    from lab.errors import LabError
    from lab.reference import generate
    with pytest.raises(LabError, match="non-empty"):
        generate(model, [], 3)
    with pytest.raises(LabError, match="exceeds the model's max_seq"):
        generate(model, [1, 2], model.cfg.max_seq)
    with pytest.raises(LabError, match=">= 0"):
        generate(model, [1, 2], -1)


def test_generate_summary_separates_prompt_steps_from_tokens(capsys):
    assert main(["generate", "--prompt", "ROMEO.\n", "--tokens", "5", "--backend", "sim",
                 "--no-progress"]) == 0
    assert "[6 prompt steps + 5 tokens, " in capsys.readouterr().out   # 'ROMEO.\n' is 7 ids


def test_generate_zero_tokens_is_refused(capsys):
    assert main(["generate", "--prompt", "ROMEO.", "--tokens", "0", "--backend", "sim"]) == 2
    assert "--tokens 0: give at least 1 token" in capsys.readouterr().err


def test_audit_command_exits_1_for_every_deliberate_bug(monkeypatch, capsys):
    from lab.bugspec import BUGS
    for name, bug in BUGS.items():
        with monkeypatch.context() as m:
            m.setenv(bug.env, "1")
            assert main(["audit", "--backend", "sim"]) == 1, name
        capsys.readouterr()


# ---- rough edges: each a one-line message, checked before the work where it can be -----------
def test_generate_says_its_time_per_token_once(capsys):
    assert main(["generate", "--prompt", "ROMEO.", "--tokens", "2", "--backend", "sim"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.count("ms/token") == 1 and "ms per step" not in last, last


def test_save_dot_to_an_unwritable_path_fails_before_the_run(tmp_path, capsys, monkeypatch):
    """The path is checked before anything runs (the engine is never built), and /proc is
    refused even for root (os.access would say yes)."""
    import lab.__main__ as cli

    def no_engine(*a, **k):
        raise AssertionError("the engine was built before the --save-dot path was checked")
    monkeypatch.setattr(cli, "_engine", no_engine)
    for path, needle in ((tmp_path / "missing" / "g.dot", "does not exist"),
                         ("/proc/g.dot", "cannot create a file in folder /proc"),
                         (".", "is a folder, give a file name"),     # no name to number:
                         ("/", "is a folder, give a file name")):    # refused, not a crash
        assert main(["generate", "--prompt", "ROMEO.", "--tokens", "2", "--backend", "sim",
                     "--save-dot", str(path)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("decode-lab: error: --save-dot") and needle in err
        assert len(err.strip().splitlines()) == 1


def test_save_dot_counts_one_node_as_one_node(tmp_path, capsys, monkeypatch):
    import lab.__main__ as cli

    class OneNode:
        node_count = 1

        def dot(self):
            return "digraph {}"

    class Gen:
        prompt, text, steps, ms_per_token, source = "R", "O", 2, 0.1, "simulated"

    class Eng:
        cfg = type("C", (), {"graph": True, "ranks": 1})()
        graphs = {("splits", 1): OneNode()}
        ledger = []

        def generate(self, *a, **k):
            return Gen()
    monkeypatch.setattr(cli, "_engine", lambda *a, **k: Eng())
    assert main(["generate", "--prompt", "R", "--tokens", "1", "--save-dot",
                 str(tmp_path / "g.dot")]) == 0
    out = capsys.readouterr().out
    assert ": 1 node -> " in out and "1 nodes" not in out


def test_ctrl_c_is_one_line_and_exit_130(capsys, monkeypatch):
    import lab.__main__ as cli

    def interrupted(args):
        raise KeyboardInterrupt
    monkeypatch.setattr(cli, "cmd_demo", interrupted)
    assert main(["demo", "--backend", "sim"]) == 130
    err = capsys.readouterr().err
    assert err.strip() == "decode-lab: interrupted" and "Traceback" not in err


def test_device_loop_refused_without_graphs_is_one_warning_line(capsys, monkeypatch):
    """LAB_LOOP=device with LAB_GRAPH=0: the engine refuses the device loop on purpose and runs
    the host loop; the command line says so in one line, not Python's two-line UserWarning."""
    monkeypatch.setenv("LAB_LOOP", "device")
    monkeypatch.setenv("LAB_GRAPH", "0")
    assert main(["generate", "--prompt", "ROMEO.", "--tokens", "2", "--backend", "sim"]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    warning = "decode-lab: warning: LAB_LOOP=device refused"
    assert err and all(line.startswith(warning) for line in err), err
    assert "UserWarning" not in "\n".join(err)


def test_bad_model_description_is_one_line(tmp_path, capsys):
    import shutil
    from lab.model import DEFAULT_WEIGHTS
    shutil.copy(DEFAULT_WEIGHTS, tmp_path / "m.npz")
    info = json.loads(DEFAULT_WEIGHTS.with_suffix(".json").read_text())
    info["d_model"] = "256"
    (tmp_path / "m.json").write_text(json.dumps(info))
    for weights, needle in ((tmp_path / "m.npz", "d_model must be an integer, got '256'"),
                            (tmp_path, "is a folder; give the .npz file")):
        assert main(["generate", "--prompt", "ROMEO.", "--tokens", "2", "--backend", "sim",
                     "--weights", str(weights)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("decode-lab: error:") and needle in err and "Traceback" not in err


def test_json_to_proc_is_refused_before_the_run(capsys):
    assert main(["bench", "ab", "--a", "LAB_GRAPH=0", "--b", "LAB_GRAPH=1", "--backend", "sim",
                 "--json", "/proc/x.json"]) == 2
    err = capsys.readouterr().err
    assert "--json /proc/x.json: cannot create a file in folder /proc" in err


@pytest.mark.parametrize("uid, allowed", [("0", True), ("1000", False)])
def test_make_lab_allows_root_only_for_root(tmp_path, uid, allowed):
    """JupyterLab refuses root without --allow-root; the Makefile adds it for root only (`id`
    stubbed, so both cases run whoever runs the test; `make -n` runs nothing)."""
    import os
    import shutil
    from pathlib import Path
    if shutil.which("make") is None:
        pytest.skip("no make")
    stub = tmp_path / "id"
    stub.write_text(f"#!/bin/sh\necho {uid}\n")
    stub.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"}
    out = subprocess.run(["make", "-n", "lab"], cwd=Path(__file__).resolve().parents[2], env=env,
                         capture_output=True, text=True, check=True).stdout
    line = next(x for x in out.splitlines() if "jupyter lab" in x)
    assert ("--allow-root" in line) is allowed and line.endswith("notebooks/"), line
