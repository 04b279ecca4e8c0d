"""The checks a recording runs beside its figures, each a command in a process of its own, its
output a file of the recording:

  gpu_tests     `pytest -m gpu tests` (the notebooks and the hands-on checks left out):
                gpu_tests.log
  demo          `decode-lab demo` on the recording's backend (the README quotes it): demo.log
  handson_gpu   `pytest -m gpu -k reference` on the hands-on exercises: each reference solution
                checked on the GPU in a child process of its own: handson_gpu.log
Each is stopped after its limit (exit 124 in the log), and a failure fails the experiment.
"""
from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

from lab.errors import LabError
from lab.measure.experiment import REPO, experiment, run_child

NOT_IN_GPU_TESTS = ("test_notebooks.py", "test_handson.py")


def test_file(name: str) -> Path:
    """tests/**/name (the one test file of that name)."""
    found = sorted((REPO / "tests").rglob(name))
    if len(found) != 1:
        raise LabError(f"tests/**/{name}: found {len(found)} files, expected one")
    return found[0]


def logged(ctx, argv: list[str], limit_s: int, log: str) -> int:
    """`argv` in a child process at the repository's root, its output to ctx.out/log (its last
    lines to the run's log too); stopped after `limit_s` (status 124). The status."""
    path = ctx.out / log
    t0 = time.perf_counter()
    with open(path, "w") as f:
        f.write(f"$ {' '.join(argv)}\n")
        f.flush()
        code = run_child(argv, limit_s, log=f)
        f.write(f"== exit {code} ({time.perf_counter() - t0:.0f} s)\n")
    tail = path.read_text(errors="replace").splitlines()[-3:]
    ctx.progress(f"{log}: exit {code}; " + " | ".join(tail))
    return code


def _pytest(*args: str) -> list[str]:
    """pytest over `args`, on half the host's cores where pytest-xdist is there: the GPU tests
    and the hands-on checks spend most of their time compiling, on the CPU, and nothing here
    is timed (they run side by side, before the measurements, never beside them)."""
    workers = []
    if importlib.util.find_spec("xdist") is not None and (os.cpu_count() or 1) >= 4:
        workers = ["-n", str(min(8, (os.cpu_count() or 1) // 2))]
    return [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *workers, *args]


@experiment("gpu_tests", files=("gpu_tests.log",), priority=1, backends=("cuda",), check=True,
            doc="the GPU-marked tests (pytest -m gpu), the notebooks and hands-on checks aside")
def gpu_tests(ctx) -> None:
    ignore = [f"--ignore={test_file(n).relative_to(REPO)}" for n in NOT_IN_GPU_TESTS]
    if logged(ctx, _pytest("-m", "gpu", "tests", *ignore), 420, "gpu_tests.log"):
        raise LabError("FAIL (gpu_tests.log)")


@experiment("demo", files=("demo.log",), priority=5,
            doc="decode-lab demo on the recording's backend (the README's first run)")
def demo(ctx) -> None:
    if logged(ctx, [sys.executable, "-m", "lab", "demo", "--backend", ctx.backend], 240,
              "demo.log"):
        raise LabError("FAIL (demo.log)")


@experiment("handson_gpu", files=("handson_gpu.log",), priority=4, backends=("cuda",),
            check=True,
            doc="each hands-on exercise's reference solution checked on the GPU, a process each")
def handson_gpu(ctx) -> None:
    path = test_file("test_handson.py").relative_to(REPO)
    if logged(ctx, _pytest("-m", "gpu", str(path), "-k", "reference"), 1500, "handson_gpu.log"):
        raise LabError("FAIL (handson_gpu.log)")
