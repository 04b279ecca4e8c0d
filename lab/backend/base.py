"""The backend interface: what the engine may do with a device, and nothing more.

Two implementations: `cuda` (numba.cuda kernels on CuPy streams, CUDA graphs) and `sim` (a CPU
simulator with the same semantics). The engine never knows which one it drives.

Vocabulary:
- `Buffer`: a device array -- a name, a real integer device address (`ptr`), shape, dtype, and
  the backend's own handle. A view (`backend.row(buf, i)`) is another Buffer whose `ptr` is the
  parent's plus an offset: exactly the number a capture would freeze.
- `Launch`: one kernel launch -- kernel spec, grid, block, arguments (Buffers or scalars), the
  layer it belongs to (for the launch bill) and the stream it goes to. A clean engine issues the
  same Launch objects step after step, so `prepared` is a slot a backend may fill once per launch
  (the cuda backend's pre-bound launch: kernel handle, flattened arguments, launch config).
- `Graph`: a captured sequence of launches; `launch(stream)` replays it.
"""
from __future__ import annotations

import functools
import sys
from abc import ABC, abstractmethod
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lab.errors import DeviceFault


@dataclass(frozen=True, eq=False)
class Buffer:
    name: str                  # allocation name, e.g. "k_cache.0"
    ptr: int                   # device address of element 0
    shape: tuple[int, ...]
    dtype: np.dtype
    offset: int = 0            # bytes from the start of the allocation (views)
    handle: Any = field(default=None, repr=False)   # backend object (numba device array ...)

    @functools.cached_property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize

    @property
    def label(self) -> str:
        """Provenance for the launch log: the allocation, plus the offset of a view."""
        return self.name if self.offset == 0 else f"{self.name}+{self.offset}B"


@dataclass(frozen=True)
class RawArray:
    """`buf` passed as its raw framework array (LAB_BUG_RAW_ARRAY): numba synchronises on it."""
    buf: Buffer

    @property
    def label(self) -> str:
        return f"{self.buf.label} (raw array)"


@dataclass(frozen=True)
class Launch:
    kernel: Any                # kernels.KernelSpec
    grid: tuple[int, ...]
    block: tuple[int, ...]
    args: tuple
    layer: int | None = None   # None for the per-token kernels outside the layer stack
    stream: str = "main"
    # the backend's per-launch preparation (Launch stays frozen: the dict is filled, never
    # replaced); outside equality and hashing, so two launches compare by what they launch
    prepared: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def name(self) -> str:
        return self.kernel.name


@dataclass(frozen=True)
class Op:
    """A host-side device operation, as the lazy-init detector sees it."""
    kind: str          # allocation | upload | download | synchronize | compilation | array-interface sync
    detail: str
    capturing: bool    # issued while a capture was open
    issued: int        # launches already issued in this step, or into the open capture
    site: str          # the callers outside lab/backend: "runner.py:190 in alloc_scratch <- ..."


_BACKEND_DIR = Path(__file__).resolve().parent
_LAB_DIR = _BACKEND_DIR.parent


_SITE_FILES: dict[str, str | None] = {}   # a code file -> its name where it is a caller site


def _site_file(filename: str) -> str | None:
    """The file's name when a frame in it is a caller site (in lab/ outside lab/backend, or in
    tests/ or notebooks/), else None; worked out once per file (every allocation, upload and
    download asks)."""
    if filename not in _SITE_FILES:
        path = Path(filename)
        keep = _BACKEND_DIR not in path.parents and (_LAB_DIR in path.parents
                                                     or path.parent.name in ("tests", "notebooks"))
        _SITE_FILES[filename] = path.name if keep else None
    return _SITE_FILES[filename]


def caller_site(depth: int = 2) -> str:
    """file:line in function of the `depth` innermost callers outside lab/backend (and outside
    numba/cupy), innermost first: "runner.py:190 in alloc_scratch <- bugs.py:140 in
    grow_scratch"."""
    sites = []
    f = sys._getframe(1)
    while f is not None and len(sites) < depth:
        name = _site_file(f.f_code.co_filename)
        if name is not None:
            sites.append(f"{name}:{f.f_lineno} in {f.f_code.co_name}")
        f = f.f_back
    return " <- ".join(sites) or "?"


COLLECTIVE_OPS = ("all_reduce", "all_gather", "reduce_scatter")


@dataclass(frozen=True, eq=False)
class Collective:
    """A step item that is not a kernel: one NCCL collective of this rank (LAB_RANKS=2).

    all_reduce     recv = the sum over ranks of send (send may be recv: in place)
    all_gather     recv [ranks * n] = every rank's send [n], in rank order
    reduce_scatter recv [n] = rank r's slice of the sum over ranks of send [ranks * n]

    NCCL matches collectives by ORDER alone: the k-th collective a rank issues meets the k-th of
    every other rank, whatever they are. Every rank must issue the same ops, on the same counts,
    in the same order; a rank that skips one leaves the others waiting for ever."""
    op: str
    send: Buffer
    recv: Buffer
    what: str = ""             # e.g. "attention out" (for logs and the bill)
    layer: int | None = None
    stream: str = "main"

    def __post_init__(self):
        if self.op not in COLLECTIVE_OPS:
            raise ValueError(f"collective op {self.op!r}: use one of {', '.join(COLLECTIVE_OPS)}")

    @property
    def name(self) -> str:
        return self.op

    @property
    def count(self) -> int:
        """Elements each rank sends."""
        return int(np.prod(self.send.shape, dtype=np.int64))

    def signature(self) -> tuple:
        """What must agree across ranks for the collective to be well formed."""
        return (self.op, self.count, np.dtype(self.send.dtype).str)

    def describe(self) -> str:
        return f"{self.op} of {self.count} {np.dtype(self.send.dtype).name} ({self.what or self.send.label})"


@dataclass(frozen=True)
class StreamWait:
    """A step item that is not a launch: stream `dst` waits for the work issued on `src`."""
    src: str
    dst: str


class Graph(ABC):
    """An instantiated, uploaded graph."""

    @property
    @abstractmethod
    def node_count(self) -> int: ...

    @abstractmethod
    def node_types(self) -> dict[str, int]: ...

    @abstractmethod
    def launch(self, stream: str = "main") -> None: ...

    def update(self, source: "Graph") -> str | None:
        """Give this executable graph the node parameters of `source` (a graph captured with
        `end_capture(instantiate=False)`) in place, as cudaGraphExecUpdate does: None when done,
        else why it was refused (nothing changed then; e.g. the topology differs)."""
        return f"{type(self).__name__} cannot be updated in place"

    def dot(self) -> str:
        """The graph as DOT text (for `--save-dot`)."""
        raise NotImplementedError


class LoopGraph(Graph):
    """The device loop (LAB_LOOP=device): ONE conditional node at the top -- a WHILE whose body
    runs a SWITCH over one body per plan."""

    @property
    def node_count(self) -> int:
        return 1

    def node_types(self) -> dict[str, int]:
        return {"conditional": 1}

    @abstractmethod
    def body_node_counts(self) -> list[int]:
        """Kernel nodes in each plan's body, in plan order."""

    def dot(self) -> str:
        lines = ["digraph device_loop {", '  w [label="WHILE pos < limit" shape=diamond];',
                 '  p [label="loop_plan: SWITCH value = plan_of[pos]" shape=box];',
                 '  s [label="SWITCH" shape=diamond];',
                 '  c [label="loop_continue: WHILE value = pos < limit" shape=box];',
                 "  w -> p; p -> s;"]
        for k, n in enumerate(self.body_node_counts()):
            lines += [f'  b{k} [label="body {k}: {n} kernel nodes" shape=box];', f"  s -> b{k};",
                      f"  b{k} -> c;"]
        lines += ["  c -> w [style=dashed];", "}"]
        return "\n".join(lines)


class Backend(ABC):
    name: str = "?"
    simulated: bool = True

    def __init__(self):
        self.log = None  # an instrument.LaunchLog, attached by the engine
        self.pdl = False                 # programmatic dependent launches (set by the engine)
        self.mechanism = "prebound"      # LAB_LAUNCH: "dispatcher" or "prebound" (set by the engine)
        self.blocking = False            # LAB_LAUNCH_BLOCKING: wait for each launch (the engine)
        self.ops: list[Op] = []          # host-side device operations, newest last
        self._issued = 0                 # launches issued in this step (or into the open capture)

    def _wait_if_blocking(self, what: str) -> None:
        """LAB_LAUNCH_BLOCKING=1: wait for the work just launched, so that a kernel's fault is
        reported by the launch that issued it (CUDA_LAUNCH_BLOCKING=1 does so on a GPU)."""
        if not self.blocking:
            return
        try:
            self.synchronize()
        except DeviceFault as exc:
            raise DeviceFault(f"{exc}; LAB_LAUNCH_BLOCKING=1: reported by the launch of {what}, "
                              f"which waited for it") from None

    def _op(self, kind: str, detail: str) -> None:
        self.ops.append(Op(kind, detail, self.is_capturing(), self._issued, caller_site()))

    def raw(self, buf: Buffer) -> RawArray:
        """The buffer as its raw framework array (a CuPy array on cuda): passing it to a numba
        launch makes numba synchronise through the array interface (LAB_BUG_RAW_ARRAY)."""
        return RawArray(buf)

    # ---- provenance ------------------------------------------------------------------------
    @abstractmethod
    def describe(self) -> str:
        """Where figures from this backend come from: GPU + versions, or 'simulated'."""

    # ---- memory ------------------------------------------------------------------------------
    @abstractmethod
    def alloc(self, name: str, shape, dtype, init: str = "zeros") -> Buffer:
        """Allocate device memory; init is 'zeros' or 'empty' (contents unpredictable)."""

    @abstractmethod
    def upload(self, buf: Buffer, host: np.ndarray) -> None:
        """Synchronous host-to-device copy (illegal during capture)."""

    @abstractmethod
    def download(self, buf: Buffer) -> np.ndarray:
        """Synchronous device-to-host copy (illegal during capture)."""

    @abstractmethod
    def row(self, buf: Buffer, index: int) -> Buffer:
        """A view of row `index` of a 2-D buffer: a new pointer into the same allocation."""

    @abstractmethod
    def rows(self, buf: Buffer, start: int, stop: int) -> Buffer:
        """A view of rows [start, stop) of a buffer: a pointer into the same allocation."""

    @abstractmethod
    def reshape(self, buf: Buffer, shape) -> Buffer:
        """A contiguous view of the first prod(shape) elements of `buf`, with that shape."""

    @abstractmethod
    def view_as(self, buf: Buffer, dtype) -> Buffer:
        """`buf`'s bytes read as `dtype` (of the same size): a reinterpretation, not a copy."""

    @abstractmethod
    def pool_bytes(self) -> int:
        """Device bytes currently held by this backend's allocator."""

    # ---- execution ---------------------------------------------------------------------------
    @abstractmethod
    def warm_up(self, kernels) -> None:
        """Compile and load every kernel before first use (never inside a capture)."""

    def cooperative_limits(self, kernel, threads: int):
        """(SMs, blocks of `threads` the device can co-schedule for `kernel`, why a cooperative
        launch is refused or "") for a cooperative kernel; None where there is no occupancy to
        ask (the simulator)."""
        return None

    @abstractmethod
    def launch(self, launch: Launch) -> None: ...

    def issue(self, item) -> None:
        """Issue one item of a step: a Launch is launched, a StreamWait recorded, a Collective
        issued, anything else with `.run()` (the engine's HostWork) runs on the host here."""
        if isinstance(item, Launch):
            self.launch(item)
        elif isinstance(item, StreamWait):
            self.record_wait(item.src, item.dst)
        elif isinstance(item, Collective):
            self.collective(item)
        else:
            item.run()

    @abstractmethod
    def record_wait(self, src: str, dst: str) -> None:
        """Record an event on stream `src` and make stream `dst` wait for it: a fork when dst
        is idle, a join when dst is the capture's origin. Inside a capture the two streams'
        work becomes parallel branches of the graph."""

    def collective(self, coll: Collective) -> None:
        """Issue one collective on this rank's stream (eager, or into the open capture). The
        engine issues every rank's matching collective together (one NCCL group)."""
        raise NotImplementedError(f"the {self.name} backend has no collectives: it is not a rank "
                                  f"of a group (LAB_RANKS=2 builds one)")

    def host_step(self, mode: str) -> None:
        """The engine is about to issue one step ("eager" or "graph"): launches are counted from
        here (`Op.issued`). The simulator also charges the engine's own measured host work."""
        self._issued = 0

    @abstractmethod
    def synchronize(self) -> None: ...

    @abstractmethod
    def clock(self) -> float:
        """Seconds, after all issued work completed (wall clock on a GPU, model time in sim)."""

    # ---- capture ----------------------------------------------------------------------------
    @abstractmethod
    def begin_capture(self, stream: str = "main") -> None: ...

    @abstractmethod
    def end_capture(self, stream: str = "main", instantiate: bool = True) -> Graph:
        """Finish the capture; raises CaptureError naming the first offence if it was invalidated.
        instantiate=False: the captured graph only, not launchable; the source of a
        `Graph.update` (a plan switch by update costs the capture, not an instantiation)."""

    @abstractmethod
    def is_capturing(self, stream: str = "main") -> bool: ...

    @abstractmethod
    def instantiate(self, source: Graph) -> Graph:
        """An executable graph (uploaded) from a graph captured with instantiate=False; the
        source stays usable, e.g. to update another executable graph from it later."""

    # ---- the whole generation in one launch (LAB_LOOP=device) -------------------------------
    def loop_support(self) -> str | None:
        """None when this device runs conditional graph nodes (WHILE and SWITCH), else why not."""
        return f"the {self.name} backend has no conditional graph nodes"

    def build_loop(self, bodies: int, issue_body, pos: Buffer, plan_of: Buffer, limit: Buffer) -> Graph:
        """One graph: WHILE (pos[0] < limit[0]) { SWITCH (plan_of[pos[0]]) { body 0 | ... } },
        body k captured from `issue_body(k)` (which issues one step's items). Launched once, it
        runs the decode steps until the limit with no host in the loop."""
        raise NotImplementedError(self.loop_support())

    def abort_capture(self) -> None:
        """End an open capture, whatever state it is in, raising nothing: the cleanup after an
        error inside a capture (the error itself is what gets reported)."""
        if self.is_capturing():
            try:
                self.end_capture()
            except Exception:   # noqa: BLE001
                pass


class OneDevice:
    """One backend as a group of one device: the interface SimRanks and CudaRanks give N devices
    (backends, collectives, clock, describe, close), so an engine drives any count the same way."""

    def __init__(self, backend: Backend):
        self.backends = [backend]
        self.ranks = 1
        self.simulated = backend.simulated
        self.name = backend.name

    @contextmanager
    def collectives(self):
        yield                        # one device: no collective ever meets another rank

    def clock(self) -> float:
        return self.backends[0].clock()

    def describe(self) -> str:
        return self.backends[0].describe()

    def close(self) -> None:
        """Nothing to free: the backend's memory goes with it."""
