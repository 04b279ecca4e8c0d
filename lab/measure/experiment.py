"""One experiment, as the experiment modules (lab/measure/experiments/) declare it.

  Experiment, experiment   one recording: its files, priority, GPUs, backends, isolation, limit
  REGISTRY                 every experiment declared so far (lab/measure/registry.py's `load`
                           imports the listing, which fills it)
  versions, today, now     the software's versions and the date stamps a recording carries
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

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
