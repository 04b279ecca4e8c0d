"""The test suite itself, as a student runs it: Ctrl-C on `make test` (pytest-xdist's workers, a
notebook's kernel, the CUDA simulator's subprocesses) stops the run and leaves no process
behind and no file in data/ changed."""
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _processes_with(tag: str) -> list[str]:
    """Command lines of the live processes whose environment holds `tag` (inherited by every
    descendant, a notebook kernel in a session of its own included)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and tag.encode() in (proc / "environ").read_bytes():
                found.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()[:120])
        except OSError:
            continue
    return found


def _data_files() -> dict:
    return {p: p.stat().st_mtime_ns for p in (ROOT / "data").rglob("*") if p.is_file()}


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc")
def test_ctrl_c_stops_the_run_and_leaves_nothing_behind():
    tag = f"DECODE_LAB_SUITE_PROBE={uuid.uuid4().hex}"
    name, value = tag.split("=")
    before = _data_files()
    # a notebook (its kernel) and a kernel family under the CUDA simulator (its subprocesses),
    # on two workers, interrupted as a terminal's Ctrl-C does: SIGINT to the process group
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider",
         "tests/repo/test_notebooks.py::test_notebook_executes[05_measurement]",
         "tests/kernels/test_kernels.py::test_kernels_under_cudasim[attention]"],
        cwd=ROOT, env={**os.environ, name: value}, start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(_processes_with(tag)) < 5:   # workers, kernel, sims
        time.sleep(0.5)
    assert len(_processes_with(tag)) >= 5, "the run did not start its workers, kernel and subprocesses"
    os.killpg(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert "KeyboardInterrupt" in out, out[-2000:]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _processes_with(tag):
        time.sleep(0.5)
    assert not _processes_with(tag), f"left running after Ctrl-C: {_processes_with(tag)}"
    assert _data_files() == before, "files in data/ changed"
