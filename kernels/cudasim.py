"""numba's CUDA simulator, made to run this lab's kernels, and a child process that runs them.

numba's simulator (NUMBA_ENABLE_CUDASIM=1, which must be set before numba is imported) runs every
CUDA thread as a Python thread. Three patches make it run kernels/ as a GPU would; they go
together (`install()`), or numba's shared-memory race comes back and rejects correct kernels:

  lock_shared_allocations  a block's shared array created once, under a lock
  pooled_blocks            blocks run on a pool of reused threads, syncthreads a barrier
  install_warp_shuffles    lane-exact shfl_*_sync (the simulator has none); only with
                           shuffles=True, and before kernels/reduce.py is imported (it picks
                           its reduction path at import)

`count_writes` counts, per element of the arrays it watches, how many distinct simulated threads
(and blocks) assigned to it during a launch: the geometry of a kernel held to its work.

`Simulator` is the parent's handle on a child process (`python -m kernels.cudasim`, a fresh
interpreter with the flag set: Linux and macOS alike) that receives kernels AS SOURCE TEXT (or by
their name in kernels.REGISTRY), arrays in an .npz, the grid and block of each launch and which
arguments to watch, and sends back every array after its launch with its write counts. One child
serves every launch of a check; it exits when its parent's end of the pipe closes. Blocks run one
after another there, so a race BETWEEN blocks never shows in the values (the write counts see it).

Nothing here imports lab/; nothing is imported from kernels/ at module level (the harnesses load
this file before the kernels package when they install the shuffles).
"""
from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
INT_SENTINEL = -0x5EEDBEEF        # what an int output holds before a launch writes it
MEMORY_BUDGET = 2 << 30           # bytes the child may allocate beyond what it holds at start
THREAD_STACK = 512 << 10          # bytes of stack for each simulated thread (a block: 1024 at most)


# ---- the three patches ---------------------------------------------------------------------------
def install_warp_shuffles() -> None:
    """Lane-exact shfl_{xor,down,up,}_sync for numba's CUDA simulator (it has none).

    The simulator runs each CUDA thread as a Python thread. A shuffle here is what it is on a
    GPU: every lane of the warp deposits its value, waits for the other 31 (a barrier of the
    warp only, not the block) and reads its source lane's value (its own when the source is
    outside the warp, as CUDA does for down/up). The slots alternate between two sets, one per
    shuffle in turn (each lane counts its own shuffles), so one barrier per shuffle is enough: a
    lane writes a set again two shuffles later, after the barrier of the shuffle in between,
    which every lane reaches only once it has read that set. Only full masks of full warps, the
    only ones kernels/ use; a warp whose lanes do not all reach the same shuffle breaks the
    barrier (an error, not a hang).
    """
    from numba.cuda.simulator import kernelapi

    cls = kernelapi.FakeCUDAModule
    if getattr(cls, "_lab_shuffles", False):
        return
    lock = threading.Lock()
    warps: dict = {}

    def exchange(mod, mask, value, src_of):
        if mask != 0xFFFFFFFF:
            raise RuntimeError(f"shuffle mask {mask:#x}: only full masks are emulated")
        t = threading.current_thread()
        nthreads = mod.blockDim.x * mod.blockDim.y * mod.blockDim.z
        w, lane = divmod(t.thread_id, 32)
        if nthreads - 32 * w < 32:
            raise RuntimeError("a full-mask shuffle in a partial warp")
        key = (id(mod), t.blockIdx.x, t.blockIdx.y, t.blockIdx.z, w)
        with lock:
            if key not in warps:
                warps[key] = (([None] * 32, [None] * 32), [0] * 32,
                              threading.Barrier(32, timeout=300))
            sets, turns, barrier = warps[key]
        slots = sets[turns[lane] & 1]
        turns[lane] += 1
        slots[lane] = value
        barrier.wait()
        src = src_of(lane)
        return slots[src] if 0 <= src < 32 else value

    cls.shfl_sync = lambda self, mask, v, src: exchange(self, mask, v, lambda l: src)
    cls.shfl_xor_sync = lambda self, mask, v, m: exchange(self, mask, v, lambda l: l ^ m)
    cls.shfl_down_sync = lambda self, mask, v, d: exchange(self, mask, v, lambda l: l + d)
    cls.shfl_up_sync = lambda self, mask, v, d: exchange(self, mask, v, lambda l: l - d)
    cls._lab_shuffles = True


def lock_shared_allocations() -> None:
    """Close a race in numba's CUDA simulator: a block's shared array is created by whichever
    thread first asks for it (a dict lookup, then an insert), so two threads can both miss and
    each keep an array of its own, which then is not shared (seen here: one thread's rmsnorm
    reading another block total). The same lookup-or-create, keyed the same way (the caller's
    file and line), under a lock."""
    from numba.core import types
    from numba.cuda.simulator import kernelapi
    from numba.np import numpy_support

    original = kernelapi.FakeCUDAShared.array
    if getattr(original, "_lab_locked", False):
        return
    lock = threading.Lock()

    def array(self, shape, dtype, alignment=None):
        if shape == 0 or alignment is not None:  # dynamic shared memory / an error: as before
            return original(self, shape, dtype, alignment)
        if isinstance(dtype, types.Type):
            dtype = numpy_support.as_dtype(dtype)
        caller = sys._getframe(1)
        key = (caller.f_code.co_filename, caller.f_lineno)
        with lock:
            res = self._allocations.get(key)
            if res is None:
                res = self._allocations[key] = np.empty(shape, dtype)
        return res

    array._lab_locked = True
    kernelapi.FakeCUDAShared.array = array


def pooled_blocks() -> None:
    """Run simulated blocks on a pool of reused Python threads, without numba's polling loop.

    numba's simulator starts a new Python thread for every CUDA thread of every block (creating
    and joining one costs about 0.2 ms on a 2-core CI machine: most of a kernel test's time went
    to the kernel, not to Python), then spins over them, holding the GIL between switches, to see
    whether all are blocked in syncthreads. Here a pool of threads, grown to the largest block
    seen, runs every block: each thread takes its CUDA thread's indices for the block, runs the
    kernel, and reports done; syncthreads is a barrier of the block (`threading.Barrier`: waiters
    sleep, no one spins). A thread's exception breaks the barrier, so its blockmates stop at
    their next syncthreads instead of waiting for ever, and it is re-raised as numba does. The
    semantics are numba's: blocks run one after another, every thread of a block reaches each
    syncthreads, and `threading.current_thread()` answers threadIdx, blockIdx and the lane."""
    from numba.cuda.simulator import kernel as simkernel

    if simkernel.BlockManager.run.__name__ == "run_block":
        return

    class PoolThread(threading.Thread):
        syncthreads_count = simkernel.BlockThread.syncthreads_count
        syncthreads_and = simkernel.BlockThread.syncthreads_and
        syncthreads_or = simkernel.BlockThread.syncthreads_or

        def __init__(self):
            super().__init__(daemon=True)
            self.go = threading.Semaphore(0)
            self.job = None

        def syncthreads(self):
            if self.abort:
                raise RuntimeError("abort flag set on syncthreads call")
            try:
                self._manager._barrier.wait()
            except threading.BrokenBarrierError:
                self.abort = True
                raise RuntimeError("a thread of this block raised: abort") from None

        def run(self):
            while True:
                self.go.acquire()
                manager, args = self.job
                try:
                    manager._f(*args)
                except Exception as e:  # noqa: BLE001 -- kept for the manager, as numba does
                    try:
                        again = type(e)(f"tid={list(self.threadIdx)} "
                                        f"ctaid={list(self.blockIdx)}: {e}")
                    except Exception:   # noqa: BLE001 -- an exception type with other arguments
                        again = RuntimeError(f"tid={list(self.threadIdx)} "
                                             f"ctaid={list(self.blockIdx)}: "
                                             f"{type(e).__name__}: {e}")
                    self.exception = (again, sys.exc_info()[2])
                    manager._barrier.abort()
                self.job = None
                manager._done.release()

    pool: list[PoolThread] = []

    def run_block(self, grid_point, *args):
        points = list(np.ndindex(*self._block_dim))
        while len(pool) < len(points):
            pool.append(PoolThread())
            pool[-1].start()
        self._barrier = threading.Barrier(len(points))
        self._done = threading.Semaphore(0)
        workers = pool[:len(points)]
        dim = simkernel.Dim3(*self._block_dim)
        for t, point in zip(workers, points):
            t._manager, t.abort, t.exception = self, False, None
            t.blockIdx, t.threadIdx = simkernel.Dim3(*grid_point), simkernel.Dim3(*point)
            i = t.threadIdx      # numba's own numbering (BlockThread.thread_id): x fastest
            t.thread_id = i.x + dim.x * (i.y + dim.y * i.z)
            t.job = (self, args)
        for t in workers:
            t.go.release()
        for _ in workers:
            self._done.acquire()
        first = next((t for t in workers if t.exception and not t.abort), None) or next(
            (t for t in workers if t.exception), None)
        if first is not None:
            raise first.exception[0].with_traceback(first.exception[1])

    simkernel.BlockManager.run = run_block


def install(shuffles: bool = False) -> None:
    """The patches this lab runs numba's simulator with (idempotent). Needs the simulator."""
    from numba import config
    if not config.ENABLE_CUDASIM:
        raise RuntimeError("kernels.cudasim.install needs NUMBA_ENABLE_CUDASIM=1 set before "
                           "numba is imported")
    lock_shared_allocations()
    pooled_blocks()
    if shuffles:
        install_warp_shuffles()


# ---- write counts ------------------------------------------------------------------------------
class _Watched:
    """One array whose element assignments inside a simulated kernel are counted."""

    def __init__(self, base: np.ndarray):
        self.base = base
        self.lo = base.__array_interface__["data"][0]
        self.hi = self.lo + base.nbytes
        self.flat_ids = np.arange(base.size, dtype=np.int64)
        self.threads: dict[int, set] = {}
        self._views: dict = {}

    def ids(self, a: np.ndarray):
        """The flat element indices of `a`, a view into base's memory (None: elsewhere)."""
        ptr = a.__array_interface__["data"][0]
        if not self.lo <= ptr < self.hi or a.dtype.itemsize != self.base.dtype.itemsize:
            return None
        key = (ptr, a.shape, a.strides)
        ids = self._views.get(key)
        if ids is None:
            size = a.dtype.itemsize
            ids = np.lib.stride_tricks.as_strided(
                self.flat_ids[(ptr - self.lo) // size:], a.shape,
                tuple(s // size * 8 for s in a.strides), writeable=False)
            self._views[key] = ids
        return ids

    def counts(self) -> tuple[np.ndarray, np.ndarray]:
        """(distinct threads, distinct blocks) that wrote each element, in base's shape."""
        threads = np.zeros(self.base.size, np.int32)
        blocks = np.zeros(self.base.size, np.int32)
        for e, who in self.threads.items():
            threads[e] = len(who)
            blocks[e] = len({w[0] for w in who})
        return threads.reshape(self.base.shape), blocks.reshape(self.base.shape)


_watching: list[_Watched] = []
_watch_lock = threading.Lock()


def _install_write_counts() -> None:
    """Route every element assignment through a kernel's array argument past `_watching`."""
    from numba.cuda.simulator.cudadrv import devicearray

    cls = devicearray.FakeCUDAArray
    if getattr(cls.__setitem__, "_lab_counted", False):
        return
    original = cls.__setitem__

    def setitem(self, idx, val):
        if _watching:
            t = threading.current_thread()
            block = getattr(t, "blockIdx", None)
            if block is not None:
                who = (tuple(block), tuple(t.threadIdx))
                for w in _watching:
                    ids = w.ids(self._ary)
                    if ids is not None:
                        hit = np.asarray(ids[idx]).ravel()
                        with _watch_lock:
                            for e in hit.tolist():
                                w.threads.setdefault(e, set()).add(who)
        return original(self, idx, val)

    setitem._lab_counted = True
    cls.__setitem__ = setitem


class count_writes:
    """`with count_writes(dev_arrays) as watched:` -- during the block, every element assignment
    through a simulated kernel's argument that lies in one of `dev_arrays` (device arrays of the
    simulator, `cuda.to_device(...)`) is noted with its thread; `watched[i].counts()` after."""

    def __init__(self, dev_arrays):
        _install_write_counts()
        self.watched = [_Watched(d._ary) for d in dev_arrays]

    def __enter__(self):
        _watching.extend(self.watched)
        return self.watched

    def __exit__(self, *exc):
        for w in self.watched:
            _watching.remove(w)
        return False


def sentinel_like(a: np.ndarray) -> np.ndarray:
    """An array of a's shape and dtype holding what no kernel writes by chance: NaN for floats,
    INT_SENTINEL for ints."""
    a = np.asarray(a)
    if a.dtype.kind == "f":
        return np.full(a.shape, np.nan, a.dtype)
    return np.full(a.shape, INT_SENTINEL, a.dtype)


# ---- the guard a child that runs someone's code runs under ------------------------------------
_WRITE_EVENTS = ("os.remove", "os.rename", "os.replace", "os.rmdir", "os.mkdir", "os.truncate",
                 "os.chmod", "os.chown", "os.link", "os.symlink", "os.utime", "shutil.rmtree",
                 "shutil.copyfile", "shutil.copytree", "shutil.move", "shutil.chown")
_PROCESS_EVENTS = ("subprocess.Popen", "os.system", "os.posix_spawn", "os.exec", "os.spawn",
                   "os.fork", "os.forkpty", "pty.spawn")
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_spawning = threading.local()     # the guarding process's own children: `spawning()`


class spawning:
    """`with spawning():` -- this thread may start a process although `guard` is installed: the
    check's own simulator child, started by the lab's code, not by the solution."""

    def __enter__(self):
        _spawning.on = True

    def __exit__(self, *exc):
        _spawning.on = False
        return False


def guard(scratch: str, allowed: tuple[str, ...] = (), refused: list | None = None) -> None:
    """An audit hook (for the rest of the process's life): a write outside the scratch folder
    (and `allowed`), or a new process, is refused (PermissionError) and noted in `refused`."""
    roots = tuple(os.path.realpath(p) for p in (scratch, *allowed))
    refused = [] if refused is None else refused

    def inside(path) -> bool:
        if isinstance(path, int):
            return True                                   # an open descriptor: already allowed
        try:
            real = os.path.realpath(os.fsdecode(path))
        except (TypeError, ValueError):
            return True
        return real == os.devnull or any(real == r or real.startswith(r + os.sep) for r in roots)

    def refuse(what: str):
        refused.append(what)
        raise PermissionError(f"decode-lab exercise: {what} is not allowed in a check")

    def hook(event, args):
        if event == "open":
            path, mode, flags = args
            writing = (any(c in mode for c in "wax+") if isinstance(mode, str)
                       else bool((flags or 0) & _WRITE_FLAGS))
            if writing and not inside(path) and not getattr(_spawning, "on", False):
                refuse(f"writing {os.fsdecode(path)} (outside its scratch folder)")
        elif event in _WRITE_EVENTS:
            paths = [a for a in args if isinstance(a, (str, bytes, os.PathLike))]
            bad = [p for p in paths if not inside(p)]
            if bad and not getattr(_spawning, "on", False):
                refuse(f"{event}({os.fsdecode(bad[0])}) (outside its scratch folder)")
        elif event in _PROCESS_EVENTS and not getattr(_spawning, "on", False):
            refuse(f"starting a process ({event})")

    sys.addaudithook(hook)


def limit_memory(budget: int = MEMORY_BUDGET) -> bool:
    """Cap this process's address space at what it maps now plus `budget` bytes (Linux, where
    RLIMIT_AS is enforced): an allocation past it raises MemoryError instead of exhausting the
    machine. False where it cannot be set (macOS: the parent's watch on the child's memory is
    the limit there)."""
    try:
        import resource
        with open("/proc/self/statm") as f:
            mapped = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        want = mapped + budget
        if hard != resource.RLIM_INFINITY:
            want = min(want, hard)
        resource.setrlimit(resource.RLIMIT_AS, (want, hard))
        return True
    except (ImportError, OSError, ValueError):
        return False


def rss_bytes(pid: int) -> int | None:
    """The resident memory of process `pid` (None: not known here)."""
    try:
        import psutil
        return int(psutil.Process(pid).memory_info().rss)
    except ImportError:
        pass
    except Exception:   # noqa: BLE001 -- gone, or not ours to read
        return None
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


# ---- the parent's handle on a child --------------------------------------------------------------
@dataclass
class Launch:
    """One launch for the child: `kernel` is "NAME" (defined by the request's source),
    "KEY:NAME" (defined by its source KEY, when the request's sources are a dict: two
    solutions' kernels side by side, each in its own namespace) or "registry:NAME"
    (kernels.REGISTRY); `args` are array keys of the request's arrays (str) or scalars
    ((value, dtype name)); `watch`: the argument indices whose writes are counted."""
    label: str
    kernel: str
    grid: tuple
    block: tuple
    args: list
    watch: tuple = ()


@dataclass
class Result:
    """What one launch left: `arrays[j]` for every array argument j, `threads[j]`/`blocks[j]`
    (distinct writers per element) for every watched one; `error` when the launch raised,
    `missing` when it used a part of CUDA numba's simulator does not have (its name)."""
    label: str
    arrays: dict = field(default_factory=dict)
    threads: dict = field(default_factory=dict)
    blocks: dict = field(default_factory=dict)
    error: str = ""
    missing: str = ""
    printed: str = ""
    seconds: float = 0.0


class SimulatorTimeout(Exception):
    pass


class SimulatorDied(Exception):
    pass


class Simulator:
    """A child process with numba's CUDA simulator (the patches installed), started on the first
    `run` and reused by every later one. `progress(done, total, label)` is called as launches
    finish; `scratch`: the folder its files go through (and the only one the child may write)."""

    def __init__(self, scratch: str | None = None, progress=None, memory: int = MEMORY_BUDGET,
                 server: str | None = None):
        self.scratch = scratch or tempfile.mkdtemp(prefix="cudasim.")
        self.progress = progress
        self.memory = memory
        self.server = server       # a ForkServer's socket: a forked child instead of a new one
        self.proc = None
        self.lines: queue.Queue = queue.Queue()
        self.n = 0

    def _start(self):
        if self.server:
            self.proc = _Forked(self.server, self.scratch, self.memory, self.lines)
            return
        with spawning():
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "kernels.cudasim", self.scratch, str(self.memory)],
                cwd=self.scratch, env=child_env(), stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        proc, lines = self.proc, self.lines

        def read():
            for line in proc.stdout:
                lines.put(line.rstrip("\n"))
            lines.put(None)
        threading.Thread(target=read, daemon=True).start()

    def run(self, launches: list[Launch], arrays: dict[str, np.ndarray],
            source: str | dict = "", timeout_s: float = 60.0) -> list[Result]:
        """Every launch on fresh copies of its arrays; their results, in order. `source`: the
        Python text that defines the kernels launched by name (a dict: one text per key)."""
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        self.n += 1
        tag = f"r{self.n}"
        with spawning():
            np.savez(os.path.join(self.scratch, f"{tag}.in.npz"), **arrays)
        sources = source if isinstance(source, dict) else {"": source}
        request = {"tag": tag, "sources": sources, "launches": [
            {"label": x.label, "kernel": x.kernel, "grid": list(x.grid), "block": list(x.block),
             "args": [a if isinstance(a, str) else [_plain(a[0]), a[1]] for a in x.args],
             "watch": list(x.watch)} for x in launches]}
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise SimulatorDied(self._tail([])) from None
        deadline, seen = time.monotonic() + timeout_s, []
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.close()
                raise SimulatorTimeout(f"{timeout_s:g} s") from None
            if line is None:
                raise SimulatorDied(self._tail(seen))
            if line.startswith("@progress "):
                _, done, total, label = line.split(" ", 3)
                if self.progress:
                    self.progress(int(done), int(total), label)
            elif line == f"@done {tag}":
                break
            else:
                seen.append(line)
        return self._results(tag, launches)

    def _tail(self, seen) -> str:
        if self.proc is not None:
            try:
                self.proc.wait(2)
            except subprocess.TimeoutExpired:
                pass
        rest = []
        while True:
            try:
                line = self.lines.get_nowait()
            except queue.Empty:
                break
            if line is not None:
                rest.append(line)
        lines = [ln for ln in seen + rest if ln.strip()]
        code = self.proc.returncode if self.proc is not None else None
        return f"exit code {code}: {lines[-1] if lines else '(no output)'}"

    def _results(self, tag, launches) -> list[Result]:
        with open(os.path.join(self.scratch, f"{tag}.out.json")) as f:
            meta = json.load(f)
        out = []
        with np.load(os.path.join(self.scratch, f"{tag}.out.npz"), allow_pickle=False) as z:
            for i, (x, m) in enumerate(zip(launches, meta)):
                r = Result(x.label, error=m["error"], missing=m["missing"], printed=m["printed"],
                           seconds=m["seconds"])
                for j, a in enumerate(x.args):
                    if isinstance(a, str) and f"{i}.{j}" in z.files:
                        r.arrays[j] = z[f"{i}.{j}"]
                    if f"{i}.{j}.threads" in z.files:
                        r.threads[j] = z[f"{i}.{j}.threads"]
                        r.blocks[j] = z[f"{i}.{j}.blocks"]
                out.append(r)
        for suffix in ("in.npz", "out.npz", "out.json"):
            try:
                with spawning():
                    os.remove(os.path.join(self.scratch, f"{tag}.{suffix}"))
            except OSError:
                pass
        return out

    def close(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None
        self.lines = queue.Queue()


def _plain(v):
    return v.item() if isinstance(v, np.generic) else v


def child_env() -> dict:
    """The environment of a child that runs kernels on numba's simulator: the flag set before
    numba loads, the repository on the path."""
    return dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PYTHONDONTWRITEBYTECODE="1",
                PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", ""))
                                           if p))


class _Forked:
    """A child forked by a ForkServer, seen as a Popen: stdin, poll, kill, wait, returncode."""

    def __init__(self, address: str, scratch: str, memory: int, lines: queue.Queue):
        import socket
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(address)
        self.stdin = self.sock.makefile("w")
        self.stdin.write(json.dumps({"scratch": scratch, "memory": memory}) + "\n")
        self.stdin.flush()
        self.returncode = None
        self.pid = None
        incoming = self.sock.makefile("r")

        def read():
            try:
                for line in incoming:
                    line = line.rstrip("\n")
                    if self.pid is None and line.startswith("@ready "):
                        self.pid = int(line.split()[1])
                    lines.put(line)
            except OSError:
                pass
            self.returncode = -1
            lines.put(None)
        threading.Thread(target=read, daemon=True).start()

    def poll(self):
        return self.returncode

    def kill(self):
        import signal
        if self.pid is not None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            self.sock.close()
        except OSError:
            pass
        self.returncode = -9

    def wait(self, timeout=None):
        return self.returncode


class ForkServer:
    """The parent's fork server (Linux): one interpreter with numba imported and patched, which
    forks a fresh simulator child for every check that connects (`address`). Started once per
    process that runs checks; it exits with that process."""

    def __init__(self):
        self.folder = tempfile.mkdtemp(prefix="cudasim-fork.")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kernels.cudasim", "--fork-server", self.folder],
            cwd=self.folder, env=child_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True)
        line = self.proc.stdout.readline().split()
        if line[:1] != ["@ready"]:
            self.proc.kill()
            raise RuntimeError("the simulator's fork server did not start")
        self.address = line[1]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        import shutil
        shutil.rmtree(self.folder, ignore_errors=True)


def can_fork_server() -> bool:
    """Where a fork server is used: Linux (a fork of an interpreter that imported numba is
    safe there); elsewhere every check starts a fresh interpreter. LAB_CUDASIM_FORK=0 turns it
    off."""
    return sys.platform.startswith("linux") and os.environ.get("LAB_CUDASIM_FORK", "1") != "0"


# ---- the child ----------------------------------------------------------------------------------
def _missing_part(exc: BaseException) -> str:
    """The name of the part of CUDA the simulator lacks that `exc` reports ("" if none)."""
    text = str(exc)
    for marker in ("'FakeCUDAModule' object has no attribute '", "FakeCUDAAtomic' object has "
                   "no attribute '", "'FakeCUDAFp16' object has no attribute '"):
        if marker in text:
            return "cuda." + text.split(marker, 1)[1].split("'", 1)[0]
    if isinstance(exc, NotImplementedError):
        return (text.split(":")[-1].strip() or "an intrinsic")[:80]
    return ""


def _serve(scratch: str, memory: int, incoming=None, protocol=None) -> None:
    """Answer requests (one JSON line each on `incoming`, stdin by default; the replies on
    `protocol`, stdout by default) until `incoming` closes."""
    import io

    from numba import cuda
    install()
    _install_write_counts()
    incoming = sys.stdin if incoming is None else incoming
    protocol = sys.stdout if protocol is None else protocol
    sys.dont_write_bytecode = True
    os.chdir(scratch)
    guard(scratch)
    # a simulated CUDA thread is a Python thread: with the default stack (8 MiB of address
    # space each) a block of 512 threads alone is past the memory limit; the simulator's frames
    # need far less
    threading.stack_size(THREAD_STACK)
    limit_memory(memory)
    requests: queue.Queue = queue.Queue()

    def read():
        for line in incoming:
            requests.put(line)
        os._exit(0)              # the parent is gone (or done): so is this child, at once
    threading.Thread(target=read, daemon=True).start()

    def say(text):
        protocol.write(text + "\n")
        protocol.flush()

    say(f"@ready {os.getpid()}")
    while True:
        req = json.loads(requests.get())
        tag = req["tag"]
        with np.load(os.path.join(scratch, f"{tag}.in.npz"), allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        spaces: dict = {}
        setup_error = ""
        for key, text in req["sources"].items():
            spaces[key] = {"__name__": f"cudasim_source_{key}"}
            try:
                exec(compile(text, f"<kernel source {key}>", "exec"), spaces[key])
            except Exception as exc:    # noqa: BLE001 -- reported with every launch
                setup_error = (f"the kernel's source does not run on the simulator: "
                               f"{type(exc).__name__}: {exc}")
        meta, out = [], {}
        launches = req["launches"]
        for i, x in enumerate(launches):
            printed = io.StringIO()
            sys.stdout = printed
            m = {"error": setup_error, "missing": "", "printed": "", "seconds": 0.0}
            t0 = time.perf_counter()
            try:
                if setup_error:
                    raise RuntimeError(setup_error)
                key, _, name = x["kernel"].rpartition(":")
                if key == "registry":
                    from kernels import REGISTRY     # imported here: a source's kernels need none
                    fn = REGISTRY[name].py_func
                else:
                    fn = spaces[key][name]
                fn = getattr(fn, "py_func", fn)
                host = [arrays[a].copy() if isinstance(a, str) else np.dtype(a[1]).type(a[0])
                        for a in x["args"]]
                dev = [cuda.to_device(h) if isinstance(h, np.ndarray) else h for h in host]
                watch = [dev[j] for j in x["watch"]]
                with count_writes(watch) as watched:
                    try:
                        cuda.jit(fn)[tuple(x["grid"]), tuple(x["block"])](*dev)
                    finally:
                        for j, w in zip(x["watch"], watched):
                            out[f"{i}.{j}.threads"], out[f"{i}.{j}.blocks"] = w.counts()
                        for j, d in enumerate(dev):
                            if isinstance(host[j], np.ndarray):
                                out[f"{i}.{j}"] = d.copy_to_host()
            except MemoryError:
                m["error"] = (f"MemoryError: the launch allocated more than "
                              f"{memory / 2**30:g} GiB")
            except Exception as exc:    # noqa: BLE001 -- the kernel's own error, reported
                if not m["error"]:
                    m["missing"] = _missing_part(exc)
                    m["error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:400]}"
                    if os.environ.get("LAB_CUDASIM_TRACE"):
                        m["error"] += "\n" + traceback.format_exc()
            finally:
                sys.stdout = protocol
            m["printed"] = printed.getvalue()[-2000:]
            m["seconds"] = time.perf_counter() - t0
            meta.append(m)
            say(f"@progress {i + 1} {len(launches)} {x['label']}")
        with spawning():
            np.savez(os.path.join(scratch, f"{tag}.out.npz"), **out)
            with open(os.path.join(scratch, f"{tag}.out.json"), "w") as f:
                json.dump(meta, f)
        say(f"@done {tag}")


def _fork_server(folder: str) -> None:
    """`python -m kernels.cudasim --fork-server FOLDER`: numba imported and patched ONCE; every
    connection to FOLDER/socket is served by a child forked from here -- a fresh simulator for
    each check (its own state, guard and memory limit) at the cost of a fork instead of an
    interpreter's start. No thread runs here (a fork copies only the forking one); it exits when
    its stdin closes (its parent is gone)."""
    import select
    import signal
    import socket

    # Ctrl-C, or a notebook kernel's interrupt at shutdown, reaches its whole process group: the
    # server is not the one to stop (its parent's stdin closing ends it), so it ignores SIGINT
    # rather than print a KeyboardInterrupt traceback on the way out
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from numba import cuda  # noqa: F401 -- imported (and patched) before any fork
    install()
    _install_write_counts()
    import kernels  # noqa: F401 -- the registry, for "registry:NAME" launches
    path = os.path.join(folder, "socket")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(8)
    sys.stdout.write(f"@ready {path}\n")
    sys.stdout.flush()
    stdin = sys.stdin.fileno()
    while True:
        ready, _, _ = select.select([server, stdin], [], [], 1.0)
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:              # the children that ended, reaped
                pass
        except ChildProcessError:
            pass
        if stdin in ready and not os.read(stdin, 4096):
            os._exit(0)
        if server in ready:
            conn, _ = server.accept()
            if os.fork() == 0:
                server.close()
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                os.setsid()                                  # its own group: killed alone
                incoming, protocol = conn.makefile("r"), conn.makefile("w")
                hello = json.loads(incoming.readline())
                _serve(hello["scratch"], hello["memory"], incoming, protocol)
            conn.close()


if __name__ == "__main__":
    from numba import config
    if not config.ENABLE_CUDASIM:
        sys.exit("python -m kernels.cudasim needs NUMBA_ENABLE_CUDASIM=1 set before numba is "
                 "imported")
    if sys.argv[1] == "--fork-server":
        _fork_server(sys.argv[2])
    else:
        _serve(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else MEMORY_BUDGET)
