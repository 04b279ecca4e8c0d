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
])
def test_sanitize_loop_modes_run_on_the_simulator(mode, extra, needle):
    proc = _script("scripts/sanitize_loop.py", "--mode", mode, "--backend", "sim", *extra)
    assert proc.returncode == 0, proc.stderr
    assert f"sanitize_loop {mode}: ok" in proc.stdout and needle in proc.stdout


@pytest.mark.parametrize("argv,code,needle", [
    (("--mode", "kernel"), 2, "--mode kernel needs --kernel NAME"),
    (("--mode", "kernel", "--kernel", "no_such_kernel"), 1, "the step has no launch of"),
    (("--mode", "minimal", "--tokens", "0"), 2, "--tokens must be at least 1"),
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
