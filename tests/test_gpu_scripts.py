"""The GPU-pass scripts of PDL at long context, the device loop under a sanitizer and the
persistent step's check, run on the simulator (their dry runs): the same code paths as on the
H200 but the CUDA calls, and their refusals of bad input, each in one line."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _script(*argv, timeout=300):
    return subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("mode,extra,needle", [
    ("minimal", (), "pos 8 after one launch of a 8-iteration loop"),
    ("shared", (), "pos 8 after one launch"),
    ("kernel", ("--kernel", "attn_combine"), "attn_combine and advance as the loop's body"),
    ("kernels", ("--kernels", "rmsnorm,embed"), "rmsnorm + embed and advance as the loop's body"),
    ("prefix", ("--count", "2", "--warm"),
     "the step's first 2 launches and advance as the loop's body (run once eagerly first)"),
])
def test_sanitize_loop_modes_run_on_the_simulator(mode, extra, needle):
    proc = _script("scripts/sanitize_loop.py", "--mode", mode, "--backend", "sim", *extra)
    assert proc.returncode == 0, proc.stderr
    assert f"sanitize_loop {mode}: ok" in proc.stdout and needle in proc.stdout


@pytest.mark.parametrize("argv,code,needle", [
    (("--mode", "kernel"), 2, "--mode kernel needs --kernel NAME"),
    (("--mode", "kernel", "--kernel", "no_such_kernel"), 1, "the step has no launch of"),
    (("--mode", "kernels"), 2, "--mode kernels needs --kernels A,B,..."),
    (("--mode", "kernels", "--kernels", "embed,no_such_kernel"), 1,
     "the step has no launch of ['no_such_kernel']"),
    (("--mode", "minimal", "--tokens", "0"), 2, "--tokens must be at least 1"),
    (("--mode", "loop", "--warm"), 2, "--warm applies to the modes one-body, kernel, kernels"),
])
def test_sanitize_loop_refuses_bad_input_in_one_line(argv, code, needle):
    proc = _script("scripts/sanitize_loop.py", "--backend", "sim", *argv)
    assert proc.returncode == code
    assert needle in proc.stdout + proc.stderr


def test_the_pdl_context_recorder_refuses_a_trigger_on_the_simulator(tmp_path):
    """Where a kernel triggers is compiled into it: the simulator has no trigger to move."""
    proc = _script("scripts/record_gpu_pdl_context.py", "--out", str(tmp_path), "--backend",
                   "sim", "--trigger", "early")
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "needs --backend cuda" in proc.stderr
    assert not any(tmp_path.iterdir())


def test_check_gpu_persistent_dry_run_on_the_simulator(tmp_path):
    """Bits (fused vs persistent, eager vs graph, 5 prompts) and the interleaved sweep, as on
    the H200, at a few tokens and reps."""
    out = tmp_path / "persistent.json"
    proc = _script("scripts/check_gpu_persistent.py", str(out), "--backend", "sim",
                   "--reps", "2", "--tokens", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    res = json.loads(out.read_text())
    assert res["bits"]["ok"] and not res["bits"]["mismatches"]
    arms = {r["arm"] for r in res["sweep"]["rows"]}
    assert arms == {"graph", "graph+pdl", "fused graph", "persistent graph"}
    assert res["barriers_per_token"] == 16 and "simulated" in res["source"]


def test_check_gpu_persistent_refuses_bad_input(tmp_path):
    proc = _script("scripts/check_gpu_persistent.py", str(tmp_path / "x.json"), "--backend",
                   "sim", "--reps", "1")
    assert proc.returncode == 2 and "--reps must be >= 2" in proc.stderr


def test_the_compare_recorder_judges_each_arm_against_the_oracle(tmp_path):
    """Its dry run on the simulator: one file, an arm per label, each with a verdict per prompt."""
    proc = _script("scripts/record_gpu_compare.py", "--out", str(tmp_path), "--backend", "sim",
                   "--tokens", "2", "--prompts", "ROMEO.\\n", "--arms", "graph,persistent")
    assert proc.returncode == 0, proc.stderr
    res = json.loads((tmp_path / "compare.json").read_text())
    assert list(res["arms"]) == ["graph", "persistent"] and res["verdict"]["ok"]
    assert res["source"].startswith("simulated (") and "measured on measured on" not in res["source"]
    for arm in res["arms"].values():
        (row,) = arm["prompts"]
        assert row["prompt"] == "ROMEO.\n" and row["summary"]["steps"] == 2
        assert row["greedy"]["identical"] and row["ok"]


@pytest.mark.parametrize("argv,needle", [
    (("--arms", "graph,nope"), "unknown arm(s) ['nope']"),
    (("--tokens", "0"), "--tokens must be at least 1"),
    (("--prompts", ";"), "give 'standard' or prompts separated by ';'"),
])
def test_the_compare_recorder_refuses_bad_input_in_one_line(tmp_path, argv, needle):
    proc = _script("scripts/record_gpu_compare.py", "--out", str(tmp_path), "--backend", "sim",
                   *argv)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert needle in proc.stderr and not (tmp_path / "compare.json").exists()


def test_the_relay_floor_chains_relays_that_read_what_the_node_before_wrote():
    """record_gpu_costs.relay_floor on the simulator (wall-clock figures, a dry run): chains of
    [relay(a, b), relay(b, a)] at each length, with and without PDL (it checks that each relay
    read the one before's output, and raises if not)."""
    from lab.backend import make_backend
    from lab.config import LabConfig
    from scripts import record_gpu_costs as rgc
    be = make_backend(LabConfig(backend="sim"))
    fits = rgc.relay_floor(be, lambda msg: None, lengths=(1, 2))
    assert set(fits) == {"relay", "relay_pdl"}
    for fit in fits.values():
        assert set(fit["replay_us"]) == {"1", "2"} and fit["per_node_us"] == fit["per_node_us"]


def test_the_relay_floor_refuses_relays_that_do_not_chain(monkeypatch):
    from lab.backend import make_backend
    from lab.config import LabConfig
    from scripts import record_gpu_costs as rgc
    from dataclasses import replace
    monkeypatch.setitem(rgc.REGISTRY, "relay", replace(rgc.REGISTRY["relay"],
                                                       twin=lambda grid, block, src, dst: None))
    be = make_backend(LabConfig(backend="sim"))
    with pytest.raises(RuntimeError, match="not a chain of relays"):
        rgc.relay_floor(be, lambda msg: None, lengths=(1, 2))


def test_the_tails_recorder_times_each_attention_form_per_context(tmp_path):
    """Its dry run on the simulator: every arm at every context, all replayed, with its launch
    count (the fused step 18 per token, its grid split 22, the unfused step 37)."""
    proc = _script("scripts/record_gpu_tails.py", "--out", str(tmp_path), "--backend", "sim",
                   "--reps", "2", "--tokens", "2", "--contexts", "64,200")
    assert proc.returncode == 0, proc.stderr
    res = json.loads((tmp_path / "fused_tails.json").read_text())
    assert res["contexts"] == [64, 200] and res["meaningful"] and res["source"].startswith("simulated")
    launches = {(r["arm"], r["context"]): r["launches_per_token"] for r in res["rows"]}
    assert len(launches) == 2 * 6 and all(r["replay_fraction"] == 1.0 for r in res["rows"])
    assert launches[("graph", 64)] == 37 and launches[("fused grid graph+pdl", 200)] == 18
    assert launches[("fused grid split graph+pdl", 64)] == 22


def test_the_tails_recorder_refuses_bad_contexts_in_one_line(tmp_path):
    proc = _script("scripts/record_gpu_tails.py", "--out", str(tmp_path), "--backend", "sim",
                   "--contexts", "64,lots")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "give comma-separated integers" in proc.stderr
