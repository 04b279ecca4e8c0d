"""One experiment, as the experiment modules (lab/measure/experiments/) declare it.

  Experiment, experiment   one recording: its files, priority, GPUs, backends, isolation, limit
  REGISTRY                 every experiment declared so far (lab/measure/registry.py's `load`
                           imports the listing, which fills it)
  versions, today, now     the software's versions and the date stamps a recording carries
  run_child                a command in a child process at the repo root, stopped at its limit
"""
from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from lab.config import child_env, python_path
from lab.errors import LabError

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Experiment:
    name: str                       # `decode-lab record NAME`
    files: tuple[str, ...]          # file names it writes under the output folder
    priority: int                   # lower runs first under --all (the most needed first)
    run: Callable[["Context"], None]
    gpus: int = 1                   # GPUs it needs; with fewer it is skipped with one line
    backends: tuple[str, ...] = ("cuda", "sim")   # backends it means something on
    isolated: bool = False          # runs in a child process of its own, stopped after limit_s
    limit_s: int = 600
    check: bool = False             # untimed (a pass/fail check): under one run, the checks go
                                    # first, side by side, before any timed experiment
    doc: str = ""                   # one line: what it records and which notebook shows it


REGISTRY: dict[str, Experiment] = {}


def experiment(name: str, files, priority: int, **kw):
    """Decorator: registers the function as the run of Experiment(name, files, priority, **kw)."""
    def register(run: Callable) -> Callable:
        if name in REGISTRY and REGISTRY[name].run is not run:
            raise LabError(f"experiment {name!r} registered twice")
        doc = kw.pop("doc", "") or " ".join((run.__doc__ or "").split("\n\n")[0].split())
        REGISTRY[name] = Experiment(name, tuple(files), priority, run, doc=doc, **kw)
        return run
    return register


def versions(backend) -> dict:
    """{"describe": backend.describe(), "numba", "numba_cuda", and on a GPU "cupy", "driver",
    "runtime"}: whichever of these this process can tell."""
    out = {"describe": backend.describe()}
    try:
        import numba
        out["numba"] = numba.__version__
        from importlib.metadata import version
        out["numba_cuda"] = version("numba-cuda")
    except Exception:
        pass
    if not backend.simulated:
        try:
            import cupy as cp
            out["cupy"] = cp.__version__
            drv, rt = cp.cuda.runtime.driverGetVersion(), cp.cuda.runtime.runtimeGetVersion()
            out["driver"] = f"{drv // 1000}.{drv % 1000 // 10}"
            out["runtime"] = f"{rt // 1000}.{rt % 1000 // 10}"
        except Exception:
            pass
    return out


def today() -> str:
    return dt.date.today().isoformat()


def now() -> str:
    return dt.datetime.now().isoformat(timespec="seconds")


def run_child(argv: list[str], limit_s: int, log=None, **env: str) -> int:
    """`argv` in a child process at the repository's root (on its path, `env` set), in a
    session of its own; its output streamed to this process's stdout, or written to the open
    file `log`; stopped after `limit_s`, its whole process group killed: status 124."""
    env = child_env(PYTHONUNBUFFERED="1", PYTHONPATH=python_path(str(REPO)), **env)
    sys.stdout.flush()
    sys.stderr.flush()
    if log is not None:
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            return proc.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            return 124
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace",
                            start_new_session=True)
    deadline, timed_out = time.monotonic() + limit_s, False
    import selectors
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        if sel.select(timeout=min(left, 1.0)):
            line = proc.stdout.readline()
            if not line:
                break
            sys.stdout.write(line)
            sys.stdout.flush()
    if timed_out:
        print(f"  stopped after {limit_s} s", flush=True)
        _kill_group(proc)
    proc.wait()
    proc.stdout.close()
    return 124 if timed_out else proc.returncode


def _kill_group(proc) -> None:
    try:
        os.killpg(proc.pid, 9)
    except OSError:
        pass
    proc.wait()
