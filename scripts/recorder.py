"""What every GPU recorder (scripts/record_gpu*.py) shares, so that each one holds only its
measurement.

  arguments    the shared flags (--out, --backend, --weights, --reps, --tokens), per recorder's
               own defaults, on a parser the recorder extends
  out_dir      the output folder, created and test-written BEFORE the run (a bad --out is one
               line at once, not a traceback after minutes of measuring)
  load         the model named by --weights (the default weights when the recorder has no flag)
  write_text   a result file written whole or not at all (lab/files.atomic_write_text), with the
               mode a plain write gives it
  write_json   write_text of the result as JSON
  record       write_json, the plot beside it if asked, and the table printed
  today, now   the `date` stamps the recordings carry (a day, or a time to the second)
  versions     the software stamp: backend.describe() and numba / CuPy / driver versions
  pool_key     the key under which arms share one engine (lab/measure/bench.py's make_arm pool)
  rotated      the rotating arm order of an interleaved rep
  stopwatch    a progress printer stamped with the seconds since it was made
  refuse, run  one line on stderr and an exit status, for bad input and Ctrl-C

Importing this loads no numba, CuPy or torch (the peer's torch worker imports it too).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from lab.errors import LabError
from lab.files import atomic_write_text
from lab.measure.report import jsonable
from lab.measure.stats import rotated  # noqa: F401 (the recorders' `recorder.rotated`)
from lab.model import DEFAULT_WEIGHTS, load_model

REPO = Path(__file__).resolve().parent.parent
BACKENDS = ("cuda", "sim", "auto")


def arguments(doc: str, *, backends: tuple | None = None, weights: bool = False,
              reps: int | None = None, tokens: int | None = None,
              out_help: str = "folder for the JSON (created)", out_required: bool = True,
              helps: dict | None = None) -> argparse.ArgumentParser:
    """A parser with the shared flags the recorder asks for: --out always; --backend (default
    cuda, among `backends`) when given; --weights; --reps and --tokens with the recorder's
    defaults when given; `helps` replaces a flag's help text. The description is the first
    paragraph of the recorder's docstring."""
    helps = {"--out": out_help, "--backend": "sim: a dry run on the simulator, not a GPU recording",
             "--weights": "the model's .npz (its .json beside it)",
             "--reps": "repetitions of the measurement", "--tokens": "generated tokens per run",
             **(helps or {})}
    ap = argparse.ArgumentParser(description=" ".join(doc.strip().split("\n\n")[0].split()))
    ap.add_argument("--out", required=out_required, help=helps["--out"])
    if backends is not None:
        ap.add_argument("--backend", default="cuda", choices=backends, help=helps["--backend"])
    if weights:
        ap.add_argument("--weights", default=str(DEFAULT_WEIGHTS), help=helps["--weights"])
    if reps is not None:
        ap.add_argument("--reps", type=int, default=reps, help=helps["--reps"])
    if tokens is not None:
        ap.add_argument("--tokens", type=int, default=tokens, help=helps["--tokens"])
    return ap


def out_dir(path) -> Path:
    """The output folder, created, with a file written and removed in it now: a folder that
    cannot be written (even as root, where os.access says yes) raises a one-line LabError."""
    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=p):
            pass
    except FileExistsError:
        raise LabError(f"--out {path}: is a file, give a folder") from None
    except OSError as exc:
        raise LabError(f"--out {path}: cannot write there ({exc.strerror or exc})") from None
    return p


def load(args):
    """The model of --weights, or the default weights for a recorder without that flag."""
    return load_model(getattr(args, "weights", None) or DEFAULT_WEIGHTS)


def write_text(path, text: str) -> Path:
    """`text` to `path` whole or not at all (a failure mid-write leaves the old file, or none,
    and no temporary file), with the mode a plain write gives: the old file's, else 0666 less
    the umask (lab.files.atomic_write_text keeps it)."""
    return atomic_write_text(path, text)


def write_json(path, result: dict, indent: int = 2) -> Path:
    """`result` as indented JSON (NumPy scalars and arrays as numbers and lists), by write_text."""
    return write_text(path, json.dumps(result, indent=indent, default=jsonable) + "\n")


def record(out: Path, name: str, result: dict, table: str, plot: bool = False) -> Path:
    """out/name.json (and out/name.png, the result's plot, with `plot`), then the table printed
    under `== name ==`."""
    path = write_json(out / f"{name}.json", result)
    if plot:
        from lab.measure.report import save
        save(result, plot_path=out / f"{name}.png")
    print(f"\n== {name} ==\n{table}", flush=True)
    return path


def today() -> str:
    return dt.date.today().isoformat()


def now() -> str:
    return dt.datetime.now().isoformat(timespec="seconds")


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
    if backend.name != "sim":
        try:
            import cupy as cp
            out["cupy"] = cp.__version__
            drv, rt = cp.cuda.runtime.driverGetVersion(), cp.cuda.runtime.runtimeGetVersion()
            out["driver"] = f"{drv // 1000}.{drv % 1000 // 10}"
            out["runtime"] = f"{rt // 1000}.{rt % 1000 // 10}"
        except Exception:
            pass
    return out


def pool_key(cfg, kv_init: str = "zeros") -> tuple:
    """lab/measure/bench.py's pool_key: arms whose configs give the same key allocate alike, so
    make_arm lets them share one engine and they differ by launch toggles only. Imported when
    called: importing this module loads no numba."""
    from lab.measure.bench import pool_key as bench_pool_key
    return bench_pool_key(cfg, kv_init)


def engine_pool(engine, cfg, kv_init: str = "zeros") -> dict:
    """A make_arm pool that already holds `engine` for configs like `cfg`."""
    return {pool_key(cfg, kv_init): engine}


def stopwatch(width: int = 6) -> Callable[[str], None]:
    """A progress printer: each message after `[  12.3s]`, the seconds since this call."""
    t0 = time.perf_counter()

    def progress(msg: str) -> None:
        print(f"[{time.perf_counter() - t0:{width}.1f}s] {msg}", flush=True)
    return progress


def refuse(prog: str, msg, code: int = 2) -> int:
    """One line on stderr, `prog: msg` (newlines in an exception's text folded); the status."""
    print(f"{prog}: {' '.join(str(msg).split())}", file=sys.stderr, flush=True)
    return code


def run(main: Callable[[], int]) -> int:
    """A recorder's entry: main's status; a LabError (bad input, unusable setup) is one line
    and status 2, Ctrl-C one line and status 130, never a traceback."""
    prog = Path(sys.argv[0]).stem
    try:
        return main()
    except LabError as exc:
        return refuse(prog, exc)
    except KeyboardInterrupt:
        return refuse(prog, "interrupted", 130)
