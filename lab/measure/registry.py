"""The registry of experiments: every recording, named, ordered, stamped and run in one process.

  load                     the experiments (lab.measure.experiment's REGISTRY, filled by importing
                           lab.measure.experiments: the listing)
  revision                 the commit and dirtiness of the tree
  host_probe               pre-bound back-to-back launches of an empty kernel: host us per launch
  Context                  what an experiment gets: backend, output folder, model, engines, writers
  record                   run experiments: the checks side by side, then the timed ones in
                           priority order; one log, a summary, an archive
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tarfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from lab.errors import LabError
from lab.files import atomic_write_text
from lab.measure.experiment import (REGISTRY, REPO, Experiment, experiment, now,  # noqa: F401
                                   run_child, today, versions)

PROBE_FILE = "host_probe.json"
LOG_FILE = "record.log"
DONE_FILE = "record_done.json"   # the experiments a recording finished: what --resume keeps
PROBE_LAUNCHES, PROBE_ROUNDS = 2000, 7


def load() -> dict[str, Experiment]:
    """REGISTRY, filled: every experiment module of lab.measure.experiments imported."""
    import lab.measure.experiments  # noqa: F401
    return REGISTRY


def ordered(experiments) -> list[Experiment]:
    """The run's order: the checks first (side by side), then by priority."""
    return sorted(experiments, key=lambda e: (not e.check, e.priority, e.name))


# ---- the stamp ---------------------------------------------------------------------------------
def revision(root: Path = REPO) -> dict:
    """{"commit", "dirty"}: from a REVISION file at the root when there is one (`<commit>` or
    `<commit> dirty`, written where the tree is copied for a run elsewhere: a copy may carry a
    stale .git); else from git where `root` is a checkout; else "unknown" (dirty None)."""
    rev = root / "REVISION"
    if rev.is_file():
        words = rev.read_text().split()
        if words:
            return {"commit": words[0], "dirty": len(words) > 1 and words[1] == "dirty"}
    if (root / ".git").exists():
        try:
            run = lambda *a: subprocess.run(("git", "-C", str(root)) + a, capture_output=True,  # noqa: E731
                                            text=True, timeout=30, check=True).stdout.strip()
            return {"commit": run("rev-parse", "HEAD"),
                    "dirty": bool(run("status", "--porcelain", "--untracked-files=no"))}
        except (OSError, subprocess.SubprocessError):
            pass
    return {"commit": "unknown", "dirty": None}


def host_probe(backend, launches: int = PROBE_LAUNCHES, rounds: int = PROBE_ROUNDS) -> dict:
    """The host's pace: `launches` back-to-back pre-bound eager launches of the empty probe
    kernel, host us per launch, the median over `rounds` (the device synchronised between rounds,
    outside the timing). On the simulator its clock times them: the cost model's figure."""
    import numpy as np
    from kernels import REGISTRY as KERNELS, probe
    from lab.backend import Launch

    backend.mechanism, backend.pdl = "prebound", False
    flag = backend.alloc("host_probe_flag", (1,), np.int32)
    launch = Launch(KERNELS["empty"], probe.EMPTY_GRID, probe.EMPTY_BLOCK, (flag,))
    clock = backend.clock if backend.simulated else time.perf_counter
    backend.launch(launch)                      # the first launch binds (and compiles)
    backend.synchronize()
    per = []
    for _ in range(rounds):
        t0 = clock()
        for _ in range(launches):
            backend.launch(launch)
        per.append(1e6 * (clock() - t0) / launches)
        backend.synchronize()
    return {"us_per_launch": statistics.median(per), "rounds_us": per, "launches": launches,
            "kernel": "empty", "mechanism": "prebound",
            "clock": "simulated" if backend.simulated else "host"}


def probe_us(payload) -> float | None:
    """The host probe's us per launch in a recording's stamp (or a host_probe.json); None if none."""
    if not isinstance(payload, dict):
        return None
    prov = payload.get("provenance", payload)
    probe = prov.get("host_probe") if isinstance(prov, dict) else None
    us = probe.get("us_per_launch") if isinstance(probe, dict) else None
    return float(us) if isinstance(us, (int, float)) and us > 0 else None


def _jsonable(o):
    from lab.measure.report import jsonable
    return jsonable(o)


# ---- the context -------------------------------------------------------------------------------
class Context:
    """What an experiment gets: the backend's name, the output folder, the model (loaded once),
    `quick`, the engine pool, and the writers that stamp every file."""

    def __init__(self, backend: str, out: Path, weights: Path | None = None, quick: bool = False,
                 log=None, stamp: dict | None = None):
        from lab.model import DEFAULT_WEIGHTS
        self.backend, self.out, self.quick = backend, Path(out), quick
        self.weights = Path(weights or DEFAULT_WEIGHTS)
        self._model, self._log, self._t0 = None, log, time.perf_counter()
        self.pool: dict = {}               # pool_key -> engine (lab/measure/arms.py make_arm)
        self.stamp = dict(stamp or {})

    @property
    def model(self):
        if self._model is None:
            from lab.model import load_model
            self._model = load_model(self.weights)
        return self._model

    def progress(self, msg: str) -> None:
        """One line on stderr (and the log), stamped with the seconds since the run began."""
        print(f"[{time.perf_counter() - self._t0:7.1f}s] {msg}", file=sys.stderr, flush=True)

    def write_text(self, name: str, text: str) -> Path:
        return atomic_write_text(self.out / name, text)

    def write_json(self, name: str, payload: dict) -> Path:
        """out/name, written whole; payload["provenance"] = the run's stamp unless it has one."""
        if "provenance" not in payload:
            payload = {**payload, "provenance": self.stamp}
        return self.write_text(name, json.dumps(payload, indent=2, default=_jsonable) + "\n")

    def engine(self, cfg, kv_init: str = "zeros"):
        """An engine from the pool: configs that allocate alike (arms.pool_key) share one."""
        from lab.measure.arms import make_arm
        return make_arm(self.model, "", cfg, 0, kv_init=kv_init, pool=self.pool).use()

    def child(self, argv: list[str], limit_s: int) -> int:
        """`argv` in a child process (the repo root its folder and on its path), its output in
        this run's output; stopped after `limit_s` (status 124)."""
        return run_child(argv, limit_s)


# ---- the run -----------------------------------------------------------------------------------
class _Tee:
    """A stream that writes to the console's stream and to the run's log."""

    def __init__(self, stream, log):
        self.stream, self.log = stream, log

    def write(self, text):
        self.log.write(text)
        self.log.flush()
        return self.stream.write(text)

    def flush(self):
        self.stream.flush()
        self.log.flush()

    def __getattr__(self, name):
        return getattr(self.stream, name)


def gpu_count(backend: str) -> int:
    """GPUs this host has for `backend` (the simulator: as many as asked)."""
    if backend == "sim":
        return 1 << 10
    try:
        import cupy
        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:
        return 0


def choose(names, all_: bool) -> list[Experiment]:
    """The experiments named (or all), in priority order; an unknown name is a LabError naming
    the choices."""
    reg = load()
    if all_:
        return ordered(reg.values())
    unknown = [n for n in names if n not in reg]
    if unknown:
        raise LabError(f"unknown experiment {', '.join(unknown)}; choose from "
                       f"{', '.join(e.name for e in ordered(reg.values()))}")
    return ordered({reg[n] for n in names})


def out_dir(path) -> Path:
    """The output folder, created, with a file written and removed in it now (a folder that
    cannot be written is one line at once, not a traceback after minutes of measuring)."""
    import tempfile
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


def check_fresh_out(path, replace: bool = False, resume: bool = False) -> None:
    """`decode-lab record`'s rule for --out, before any work: an existing non-empty folder is
    refused unless `replace` (replaced whole when the run ends) or `resume` (continued into)."""
    if replace and resume:
        raise LabError("record: --replace starts a fresh --out and --resume continues one: "
                       "give one of them")
    p = Path(path)
    if p.is_dir() and not replace and not resume and any(p.iterdir()):
        raise LabError(f"--out {path}: the folder exists and is not empty; give --replace to "
                       f"replace it when the run ends, or --resume to continue a pass into it")


def _fresh_dir(final: Path) -> Path:
    """A new empty folder beside `final` (the run's files go there until it ends)."""
    import tempfile
    if final.exists() and not final.is_dir():
        raise LabError(f"--out {final}: is a file, give a folder")
    out_dir(final.parent if str(final.parent) else Path("."))
    return Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".partial",
                                 dir=final.parent if str(final.parent) else ".")).resolve()


def _put_in_place(work: Path, final: Path) -> None:
    """Rename the finished folder `work` to `final`; an existing `final` is moved aside first
    and removed only once `work` holds its name."""
    import shutil
    old = None
    if final.exists():
        old = final.with_name(f".{final.name}.{work.name.split('.')[-2]}.old")
        final.rename(old)
    work.rename(final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def make_stamp(be, probe: dict | None) -> dict:
    """A recording's provenance: the commit and dirtiness, the date, the versions (with backend
    `be`'s description) and the run's host probe."""
    return {**revision(), "date": now(), "versions": versions(be), "host_probe": probe}


def record(names, backend: str, out, all_: bool = False, quick: bool = False,
           archive=None, weights=None, resume: bool = False, replace: bool = False) -> int:
    """Run the chosen experiments into `out`: the host probe first (host_probe.json); then the
    checks (Experiment.check: untimed) side by side; then the others in priority order, nothing
    beside them. In-process experiments run in this process, isolated ones each in a child
    with its limit; one log (out/record.log); a summary table; `archive` packs `out`. The exit
    status: 0 when every experiment that ran wrote its files, else 1. `resume`: keep what an
    earlier run into `out` finished for the same commit, backend and settings (DONE_FILE), and
    run the rest: a pass cut short (a lease that ended) goes on where it stopped; it writes into
    `out` as it goes. Without `resume` the run writes into a fresh folder beside `out`, renamed
    to `out` only when the run ends (a run cut short leaves `out` as it was); a non-empty `out`
    is refused unless `replace` (check_fresh_out, before any work)."""
    chosen = choose(names, all_)
    check_fresh_out(out, replace=replace, resume=resume)
    if backend not in ("cuda", "sim"):
        raise LabError(f"--backend {backend}: choose cuda or sim")
    if archive is not None and not str(archive).endswith(".tar.gz"):
        raise LabError(f"--archive {archive}: give a FILE.tar.gz")
    final = Path(out)
    out = out_dir(final) if resume else _fresh_dir(final)
    with open(out / LOG_FILE, "a") as log:
        stdout, stderr = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = _Tee(stdout, log), _Tee(stderr, log)
        try:
            if not resume:
                print(f"record: writing into {out}, renamed to {final} when the run ends",
                      file=sys.stderr, flush=True)
            rows = _record(chosen, backend, out, all_, quick, weights, resume)
        except BaseException:
            if not resume:
                print(f"record: stopped; {final} is left as it was, the unfinished run's files "
                      f"are in {out}", file=stderr)
            raise
        finally:
            sys.stdout, sys.stderr = stdout, stderr
    if not resume:
        _put_in_place(out, final)
        out = final
    if archive is not None:
        pack(out, archive)
        print(f"archive: {archive}")
    return 0 if all(r[3] == "ok" or r[3].startswith(("skipped", "kept")) for r in rows) else 1


def _done(out: Path, stamp: dict, backend: str, quick: bool, resume: bool) -> dict:
    """The experiments this recording has finished (DONE_FILE): with `resume`, those an earlier run
    into `out` finished for the same commit (a clean tree), backend and settings; else none."""
    mine = {"commit": stamp["commit"], "backend": backend, "quick": quick, "done": []}
    try:
        earlier = json.loads((out / DONE_FILE).read_text()) if resume else None
    except (OSError, ValueError):
        earlier = None
    same = (isinstance(earlier, dict) and stamp["dirty"] is False and stamp["commit"] != "unknown"
            and all(earlier.get(k) == mine[k] for k in ("commit", "backend", "quick")))
    return {**mine, "done": list(earlier.get("done", []))} if same else mine


def _record(chosen, backend, out, all_, quick, weights, resume=False) -> list:
    start = time.time()
    ctx = Context(backend, out, weights=weights, quick=quick)
    ctx.progress(f"record {', '.join(e.name for e in chosen)} on {backend} into {out}")
    from lab.backend import make_backend
    from lab.config import LabConfig
    be = make_backend(LabConfig(backend=backend))
    probe = host_probe(be, launches=200 if quick else PROBE_LAUNCHES)
    ctx.stamp = make_stamp(be, probe)
    ctx.write_json(PROBE_FILE, {"what": "host probe: pre-bound eager launches of an empty "
                                "kernel, host us per launch", **probe})
    ctx.progress(f"host probe: {probe['us_per_launch']:.3f} us per pre-bound launch "
                 f"({probe['clock']} clock); commit {ctx.stamp['commit']}"
                 f"{' (dirty)' if ctx.stamp['dirty'] else ''}")
    gpus = gpu_count(backend)
    state = _done(out, ctx.stamp, backend, quick, resume)
    if resume:
        ctx.progress(f"resume: {', '.join(state['done']) or 'nothing'} kept from an earlier run "
                     f"of this commit")
    lock = threading.Lock()

    def attempt(exp):
        t0 = time.time()
        if exp.name in state["done"] and all((out / f).is_file() for f in exp.files):
            return exp.name, len(exp.files), 0.0, "kept: done earlier in this pass"
        status = _run_one(exp, ctx, backend, gpus, all_)
        missing = [f for f in exp.files if status == "ok" and not _written(out / f, t0)]
        if missing:
            status = f"failed: did not write {', '.join(missing)}"
        if status == "ok":
            with lock:
                state["done"].append(exp.name)
                atomic_write_text(out / DONE_FILE, json.dumps(state, indent=1) + "\n")
        ctx.progress(f"{exp.name}: {status} ({time.time() - t0:.0f} s)")
        return (exp.name, len(exp.files) - len(missing) if status == "ok" else 0,
                time.time() - t0, status)

    checks = [e for e in chosen if e.check]
    if len(checks) > 1:
        ctx.progress(f"checks side by side (untimed): {', '.join(e.name for e in checks)}")
    with ThreadPoolExecutor(max_workers=max(1, len(checks))) as pool:
        rows = list(pool.map(attempt, checks))
    rows += [attempt(e) for e in chosen if not e.check]
    print("\n" + summary(rows, time.time() - start), flush=True)
    return rows


def _written(path: Path, since: float) -> bool:
    return path.is_file() and path.stat().st_mtime >= since - 1


def _run_one(exp: Experiment, ctx: Context, backend: str, gpus: int, all_: bool) -> str:
    if backend not in exp.backends:
        return f"skipped: means something on {', '.join(exp.backends)} only"
    if exp.gpus > gpus:
        why = f"needs {exp.gpus} GPUs, this host has {gpus}"
        return f"skipped: {why}" if all_ else f"failed: {why}"
    ctx.progress(f"== {exp.name} (priority {exp.priority}{', isolated' if exp.isolated else ''})")
    if exp.isolated:
        code = run_child([sys.executable, "-c", "import sys; from lab.measure.registry import "
                          "child_main; sys.exit(child_main(sys.argv[1:]))", exp.name, backend,
                          str(ctx.out), str(ctx.weights), "quick" if ctx.quick else "full"],
                         exp.limit_s)
        return "ok" if code == 0 else ("failed: timed out" if code == 124 else f"failed: exit {code}")
    try:
        exp.run(ctx)
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # one experiment's failure is logged, and the rest go on
        import traceback
        traceback.print_exc()
        return f"failed: {type(exc).__name__}: {' '.join(str(exc).split())[:120]}"
    return "ok"


def child_main(argv: list[str]) -> int:
    """An isolated experiment's process: NAME BACKEND OUT WEIGHTS quick|full; the stamp's host
    probe is the run's (host_probe.json in OUT)."""
    name, backend, out, weights, quick = argv
    exp = load()[name]
    probe_file = Path(out) / PROBE_FILE
    probe = json.loads(probe_file.read_text()) if probe_file.is_file() else None
    ctx = Context(backend, Path(out), weights=Path(weights), quick=quick == "quick")
    from lab.backend import make_backend
    from lab.config import LabConfig
    ctx.stamp = make_stamp(make_backend(LabConfig(backend=backend)),
                           {k: v for k, v in (probe or {}).items()
                            if k not in ("what", "provenance")} or None)
    try:
        exp.run(ctx)
    except LabError as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return 2
    return 0


def summary(rows, wall: float | None = None) -> str:
    """The run's table: experiment, files written, seconds, status; then the count, the failures
    and the seconds: the experiments' sum, and with `wall` the run's wall time beside it (the
    sum is the larger where checks ran side by side)."""
    w = max([len("experiment")] + [len(r[0]) for r in rows])
    lines = [f"{'experiment':<{w}} {'files':>5} {'seconds':>8}  status"]
    lines += [f"{n:<{w}} {f:>5} {s:>8.0f}  {st}" for n, f, s, st in rows]
    failed = sum(not (st == "ok" or st.startswith(("skipped", "kept"))) for *_, st in rows)
    total = sum(r[2] for r in rows)
    seconds = (f"{total:.0f} s" if wall is None else
               f"{wall:.0f} s of wall time ({total:.0f} s summed over the experiments)")
    lines.append(f"{len(rows)} experiments, {failed} failed, {seconds}")
    return "\n".join(lines)


def pack(out: Path, archive) -> Path:
    """`out`'s files (recordings, host probe, log) in one .tar.gz, under out's folder name."""
    archive = Path(archive)
    archive.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "w:gz") as tar:
        for path in sorted(Path(out).rglob("*")):
            if path.is_file() and path.resolve() != archive.resolve():
                tar.add(path, arcname=str(Path(Path(out).name) / path.relative_to(out)))
    return archive


def docs_table(experiments) -> str:
    """The Markdown table of docs/recording.md: each experiment in priority order, its files,
    GPUs, backends and what it records."""
    lines = ["| priority | experiment | files | GPUs | backends | what |", "|---|---|---|---|---|---|"]
    for e in ordered(experiments):
        tag = " (check)" if e.check else " (isolated)" if e.isolated else ""
        lines.append(f"| {e.priority} | `{e.name}`{tag} | "
                     f"{', '.join(e.files)} | {e.gpus} | {', '.join(e.backends)} | {e.doc} |")
    return "\n".join(lines)
