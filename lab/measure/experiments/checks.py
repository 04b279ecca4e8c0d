"""The checks a recording runs beside its figures, each a command in a process of its own, its
output a file of the recording:

  gpu_tests     `pytest -m gpu tests` (the notebooks and the hands-on checks left out, and the
                two tests that run kernels.check on the device: the persistent experiment runs it
                on every op): gpu_tests.log
  demo          `decode-lab demo` on the recording's backend (the README quotes it): demo.log
  handson_gpu   `pytest -m gpu -k reference` on the hands-on exercises: each reference solution
                checked on the GPU in a child process of its own: handson_gpu.log
  sanitize_kernels  compute-sanitizer's memcheck, racecheck and synccheck on short decodes of
                the megakernel (LAB_PERSISTENT=1) and of drafting's verify step (LAB_DRAFT=4,
                with each drafter, LAB_DRAFTER), a process each (SANITIZE_PIECES):
                sanitize_kernels.log, each piece's whole output under sanitize_kernels/, and a table (sanitize_table) of every piece's exit
                status and error count
Each is stopped after its limit (exit 124 in the log), and a failure fails the experiment.
"""
from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from lab.errors import LabError
from lab.measure.experiment import REPO, experiment, run_child

NOT_IN_GPU_TESTS = ("test_notebooks.py", "test_handson.py")
# GPU tests a pass runs elsewhere: each runs kernels.check's op on the device, and the persistent
# experiment runs kernels.check on every op (persistent.json's kernel_checks). The megakernel's
# is the longest GPU test, so leaving both out here shortens the checks that run side by side.
IN_KERNEL_CHECKS = (("test_megakernel_protocol.py",
                     "test_gpu_kernel_bits_over_replays_and_grids_and_its_error_word"),
                    ("test_fusion.py", "test_gpu_fused_kernels_match_their_twins"))


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
            doc="the GPU-marked tests (pytest -m gpu), the notebooks, hands-on checks and "
                "kernels.check's (persistent runs it) aside")
def gpu_tests(ctx) -> None:
    ignore = [f"--ignore={test_file(n).relative_to(REPO)}" for n in NOT_IN_GPU_TESTS]
    ignore += [f"--deselect={test_file(f).relative_to(REPO)}::{t}" for f, t in IN_KERNEL_CHECKS]
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


# ---- the new kernels under compute-sanitizer ---------------------------------------------------
SANITIZE_PROMPT = "ROMEO. ROMEO. ROMEO."   # repeats: prompt lookup finds drafts to verify
SANITIZE_TOKENS = 8
SANITIZE_BACKEND = "cuda"    # "sim": a dry run of the experiment's logic (no sanitizer there)
# the toggles that launch the kernels under test, each set against the other (an inherited
# LAB_* would otherwise pick another step): the megakernel (kernels/persistent.py
# step_persistent), and drafting's verify step (kernels/verify.py's column kernels, matmat
# among them; kernels/verify_attention.py's verify_partial and verify_merge; kernels/draft.py's
# draft_lookup and accept), and the n-gram drafter (kernels/draft.py's draft_ngram)
SANITIZE_TOGGLES = {
    "LAB_PERSISTENT=1": {"LAB_PERSISTENT": "1", "LAB_DRAFT": "0", "LAB_DRAFTER": "lookup"},
    "LAB_DRAFT=4": {"LAB_DRAFT": "4", "LAB_PERSISTENT": "0", "LAB_DRAFTER": "lookup"},
    "LAB_DRAFT=4 LAB_DRAFTER=ngram": {"LAB_DRAFT": "4", "LAB_PERSISTENT": "0",
                                      "LAB_DRAFTER": "ngram"}}
# (tool, toggle, mode): every tool on the captured step (graph replays, generate's default);
# memcheck on the eager step too (the same kernels, launched one by one: a fault named at its
# launch). racecheck sees shared memory only; synccheck, barriers a block does not all reach
SANITIZE_PIECES = tuple([(tool, toggle, "graph") for tool in ("memcheck", "racecheck", "synccheck")
                         for toggle in SANITIZE_TOGGLES]
                        + [("memcheck", toggle, "eager") for toggle in SANITIZE_TOGGLES])
SANITIZE_LIMIT_S = 300       # per piece: numba's compile, then a few slow steps under the tool
SANITIZE_AT_ONCE = 4         # pieces side by side (the other checks run beside them)
SANITIZE_KEEP_LINES = 300    # a piece's output copied whole into the log up to this many lines


def sanitizer_errors(text: str) -> int | None:
    """The errors compute-sanitizer's summary lines in `text` report, summed over the lines;
    None when there is none (the run ended before its summary).
    A line is a summary when it holds "SUMMARY"; its count is the number before "error(s)"
    ("RACECHECK SUMMARY: 2 hazards displayed (1 errors, 1 warnings)": 1), else the first
    integer after "SUMMARY" ("ERROR SUMMARY: 3 errors": 3)."""
    total, found = 0, False
    for line in text.splitlines():
        if "SUMMARY" not in line:
            continue
        rest = line.split("SUMMARY", 1)[1]
        m = re.search(r"(\d+)\s+errors?\b", rest) or re.search(r"(\d+)", rest)
        if m is None:
            continue
        total += int(m.group(1))
        found = True
    return total if found else None


def sanitize_table(runs) -> tuple[str, list[str]]:
    """runs: [(tool, toggle, exit status, output text)] -> (a fixed-width table, one line per
    failed run naming its tool and toggle). A run fails when it exits non-zero (124: past its
    limit), has no summary line, or reports an error."""
    rows, failed = [("tool", "toggle", "exit", "errors")], []
    for tool, toggle, code, text in runs:
        errors = sanitizer_errors(text)
        rows.append((tool, toggle, str(code), "no summary" if errors is None else str(errors)))
        why = ([f"exit {code}"] if code else []) + (
            ["no summary line"] if errors is None else [f"{errors} errors"] if errors else [])
        if why:
            failed.append(f"{tool} {toggle}: {', '.join(why)}")
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    table = "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)
    return table, failed


def _sanitize_argv(sanitizer: str, tool: str, mode: str) -> list[str]:
    # --report-api-errors no: under the sanitizer, cuda-bindings' cuGetProcAddress look-ups
    # return codes it reports as API errors; the kernels' own faults are what is checked here
    return [sanitizer, "--tool", tool, "--report-api-errors", "no", sys.executable, "-m", "lab",
            "generate", "--prompt", SANITIZE_PROMPT, "--tokens", str(SANITIZE_TOKENS),
            "--backend", SANITIZE_BACKEND, "--no-progress",
            *(["--eager"] if mode == "eager" else [])]


@experiment("sanitize_kernels", files=("sanitize_kernels.log",), priority=6, backends=("cuda",),
            check=True, doc="the megakernel (LAB_PERSISTENT=1) and drafting's verify step "
                            "(LAB_DRAFT=4, each drafter) under compute-sanitizer memcheck, "
                            "racecheck and synccheck, a short decode each")
def sanitize_kernels(ctx) -> None:
    sanitizer = shutil.which("compute-sanitizer")
    if sanitizer is None:
        raise LabError("sanitize_kernels: compute-sanitizer is not on PATH (it ships with the "
                       "CUDA toolkit: put its bin folder on PATH)")
    logs = ctx.out / "sanitize_kernels"
    logs.mkdir(exist_ok=True)

    def piece(p):
        tool, toggle, mode = p
        argv = _sanitize_argv(sanitizer, tool, mode)
        path = logs / f"{tool}-{toggle.replace('=', '')}-{mode}.log"
        t0 = time.perf_counter()
        with open(path, "w") as f:
            code = run_child(argv, SANITIZE_LIMIT_S, log=f, **SANITIZE_TOGGLES[toggle])
        return argv, path, code, time.perf_counter() - t0

    ctx.progress(f"sanitize_kernels: {len(SANITIZE_PIECES)} pieces, {SANITIZE_AT_ONCE} at a "
                 f"time (each up to {SANITIZE_LIMIT_S} s)")
    with ThreadPoolExecutor(max_workers=SANITIZE_AT_ONCE) as pool:
        done = list(pool.map(piece, SANITIZE_PIECES))
    parts, runs = [], []
    for (tool, toggle, mode), (argv, path, code, secs) in zip(SANITIZE_PIECES, done):
        text = path.read_text(errors="replace")
        lines = text.splitlines()
        if len(lines) > SANITIZE_KEEP_LINES:
            cut = SANITIZE_KEEP_LINES // 2
            lines = (lines[:cut] + [f"[... {len(lines) - 2 * cut} lines: {path.name} holds "
                                    f"them all ...]"] + lines[-cut:])
        env = " ".join(f"{k}={v}" for k, v in SANITIZE_TOGGLES[toggle].items())
        parts.append(f"$ {env} {shlex.join(argv)}\n" + "\n".join(lines)
                     + f"\n== exit {code} ({secs:.0f} s)\n")
        runs.append((tool, f"{toggle} {mode}", code, text))
    table, failed = sanitize_table(runs)
    ctx.write_text("sanitize_kernels.log", "\n".join(parts) + "\n" + table + "\n")
    ctx.progress("sanitize_kernels:\n" + table)
    if failed:
        raise LabError("FAIL (sanitize_kernels.log): " + "; ".join(failed))
