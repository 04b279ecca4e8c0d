"""The CPU simulator backend: CUDA's semantics for memory, streams, launches and graphs.

- Memory is an arena of segments at real integer addresses: a view's pointer is a number that a
  capture freezes, and a replay writes wherever that number points.
- Kernels run as their NumPy twins, but not when they are issued: like a GPU's queues, issued
  work (eager launches, graph replays) waits, with its dependencies -- the previous work of its
  stream, the events it waited for, a graph's edges -- until something needs its results
  (synchronize, a copy, `clock()`, reading the timeline). Then it runs in an ORDER CHOSEN
  ADVERSARIALLY among those its dependencies allow (`order`): by default the most recently
  issued ready work first, so a consumer whose dependency is missing runs BEFORE its producer,
  as a race would let it on a GPU; `order="random"` draws a seeded random order instead,
  `order="issue"` runs in issue order (hazards then never show). Under PDL a kernel's reads
  before its `pdl_wait` see its predecessor's INPUTS (the predecessor has not run yet); such a
  read of memory the predecessor writes is also reported in `races` (what compute-sanitizer's
  racecheck would say on a GPU).
- A capture records each launch with its arguments BY VALUE (buffers by address, sizes, grids);
  nothing runs; memory stays live. A replay enqueues the records with the graph's edges.
- Capture is GLOBAL mode: synchronize, synchronous copies and a synchronous (pool-growing)
  allocation while a capture is open fail at the call (as `cudaErrorStreamCaptureUnsupported`)
  and invalidate the capture, which stays invalidated: `end_capture` fails too
  (`cudaErrorStreamCaptureInvalidated`), naming the first offence. That is not a "sticky" error
  (CUDA's sticky errors corrupt the context); the stream and context stay usable, so an eager
  re-issue works. (A stream-ordered allocation would be capturable; the lab makes none.)
- Streams and events: `record_wait(src, dst)` orders dst after src's work; during a capture it
  pulls dst into the capture (fork) or joins it back; unjoined work fails `end_capture`.
- Time comes from `CostModel` (measured component costs, data/gpu/kernel_costs.json): the host
  pays per launch (per launch mechanism), per graph launch and per engine step; the device runs
  each kernel for its measured time once its dependencies and its host submit are done. The
  timing does not depend on the execution order. Every figure is labelled "simulated".
- `init="empty"` memory is filled from an unseeded generator: really unpredictable, like a GPU's.
- Ranks (LAB_RANKS=2): `SimRanks` (lab/backend/sim_ranks.py) drives one SimBackend per rank
  with NCCL's collectives among them.

The device's queues and the order queued work runs in are
lab/backend/sim_queue.py (`DeviceQueues`, this backend's scheduler half).
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import numpy as np

from lab.errors import CaptureError, LabError
from .base import Backend, Buffer, Collective, Graph, Launch, LoopGraph, RawArray
from .costmodel import CostModel
from .sim_queue import DeviceQueues, TimelineEvent, _Shared  # noqa: F401 (TimelineEvent: re-export)

_BASE_ADDR = 0x7F00_0000_0000
_ALIGN = 512  # CuPy's pool rounds allocations to 512 bytes
ORDERS = ("adversarial", "random", "issue")


@dataclass
class _Capture:
    stream: str                                   # the origin stream
    nodes: list = field(default_factory=list)     # launches, in issue order (a topological order)
    deps: list = field(default_factory=list)      # per node: indices of the nodes it waits for
    programmatic: list = field(default_factory=list)  # per node: launched with PDL (its edge in)
    streams: set = field(default_factory=set)     # streams pulled into the capture
    last: dict = field(default_factory=dict)      # stream -> its newest node
    pending: dict = field(default_factory=dict)   # stream -> nodes its next node must wait for
    joined: set = field(default_factory=set)      # (stream, node) pairs joined back
    offence: str | None = None


class SimGraph(Graph):
    def __init__(self, backend: "SimBackend", nodes: list[Launch], deps=None, pdl: bool = False,
                 executable: bool = True, node_pdl=None):
        self._backend = backend
        self.nodes = list(nodes)
        self.deps = [tuple(d) for d in deps] if deps is not None else [
            (i - 1,) if i else () for i in range(len(self.nodes))]
        self.pdl = pdl                     # captured with programmatic launches (PDL edges)
        # per node, whether it was launched programmatically (None: every node as `pdl` says);
        # a capture records it launch by launch, as a CUDA capture records each launch's
        # attribute (lab/measure/pdl_edges.py leaves one kernel's launches plain)
        self.node_pdl = tuple(node_pdl) if node_pdl is not None else None
        self.executable = executable       # instantiated (launchable), or a captured definition

    @property
    def node_count(self) -> int:
        return len(self.nodes)

    def node_types(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for n in self.nodes:
            kind = "collective" if isinstance(n, Collective) else "kernel"
            out[kind] = out.get(kind, 0) + 1
        return out

    def launch(self, stream: str = "main") -> None:
        if not self.executable:
            raise LabError("a captured graph that was not instantiated cannot be launched")
        self._backend._replay(self, stream)

    def update(self, source: "SimGraph") -> str | None:
        """cudaGraphExecUpdate's rule: the same nodes, edges, edge types and streams; each
        kernel node's function, grid, block and arguments may change."""
        if len(source.nodes) != len(self.nodes):
            return (f"topology changed: {len(source.nodes)} nodes for {len(self.nodes)} "
                    f"(cudaGraphExecUpdateErrorTopologyChanged)")
        if source.deps != self.deps or [n.stream for n in source.nodes] != [n.stream for n in self.nodes]:
            return "topology changed: other edges (cudaGraphExecUpdateErrorTopologyChanged)"
        if source.pdl != self.pdl or source.node_pdl != self.node_pdl:
            return "edge types changed: programmatic vs default (cudaGraphExecUpdateErrorTopologyChanged)"
        self.nodes = list(source.nodes)
        return None

    def dot(self) -> str:
        lines = ["digraph decode_step {"]
        for i, n in enumerate(self.nodes):
            if isinstance(n, Collective):
                lines.append(f'  n{i} [label="{n.op}\\n{n.describe()}" shape=box style=bold];')
            else:
                lines.append(f'  n{i} [label="{n.name}\\ngrid={n.grid} block={n.block}"];')
            lines += [f"  n{d} -> n{i};" for d in self.deps[i]]
        lines.append("}")
        return "\n".join(lines)


class SimLoopGraph(LoopGraph):
    """A conditional graph: WHILE (pos < limit) { SWITCH (plan_of[pos]) { bodies } }."""

    def __init__(self, backend: "SimBackend", bodies: list[SimGraph], pos, plan_of, limit):
        self._backend = backend
        self.bodies = bodies
        self.pos, self.plan_of, self.limit = pos, plan_of, limit
        self.runs = [0] * len(bodies)      # times each body ran, over every launch

    @property
    def iterations(self) -> int:
        return sum(self.runs)

    def body_node_counts(self) -> list[int]:
        return [b.node_count for b in self.bodies]

    def launch(self, stream: str = "main") -> None:
        self._backend._run_loop(self, stream)


class _Views:
    """Views of a simulated buffer: a new pointer (and shape, or dtype) into the same bytes."""

    def row(self, buf, index) -> Buffer:
        index = int(index)
        if not 0 <= index < buf.shape[0]:
            raise IndexError(f"row {index} of {buf.label} with shape {buf.shape}")
        stride = int(np.prod(buf.shape[1:], dtype=np.int64)) * np.dtype(buf.dtype).itemsize
        return Buffer(buf.name, buf.ptr + index * stride, buf.shape[1:], buf.dtype,
                      buf.offset + index * stride)

    def rows(self, buf, start: int, stop: int) -> Buffer:
        if not 0 <= start < stop <= buf.shape[0]:
            raise IndexError(f"rows [{start}, {stop}) of {buf.label} with shape {buf.shape}")
        stride = int(np.prod(buf.shape[1:], dtype=np.int64)) * np.dtype(buf.dtype).itemsize
        return Buffer(buf.name, buf.ptr + start * stride, (stop - start, *buf.shape[1:]),
                      buf.dtype, buf.offset + start * stride)

    def reshape(self, buf, shape) -> Buffer:
        shape = tuple(int(s) for s in shape)
        if int(np.prod(shape)) * np.dtype(buf.dtype).itemsize > buf.nbytes:
            raise ValueError(f"view {shape} is larger than {buf.label} {buf.shape}")
        return Buffer(buf.name, buf.ptr, shape, buf.dtype, buf.offset)

    def view_as(self, buf, dtype) -> Buffer:
        dtype = np.dtype(dtype)
        if dtype.itemsize != np.dtype(buf.dtype).itemsize:
            raise ValueError(f"view of {buf.label} as {dtype}: element sizes differ")
        return Buffer(buf.name, buf.ptr, buf.shape, dtype, buf.offset)


class SimBackend(DeviceQueues, _Views, Backend):
    name = "sim"
    simulated = True

    def __init__(self, cost: CostModel | None = None, seed: int = 0, order: str = "adversarial",
                 group: "SimRanks | None" = None, rank: int = 0):
        super().__init__()
        self.group, self.rank = group, rank     # a rank of a SimRanks group, or a lone device
        self._shared = group._shared if group is not None else _Shared()
        self._coll_seq = 0                      # collectives this rank has enqueued
        if order not in ORDERS:
            raise LabError(f"order={order!r} is not allowed; use one of {', '.join(ORDERS)}")
        self.cost = cost or CostModel.load()
        self.order = order
        self._rng = np.random.default_rng(seed)       # costs: jitter and drift, per seed
        self._order_rng = np.random.default_rng([seed, 1])   # execution order (order="random")
        self._bases: list[int] = []
        self._segments: dict[int, np.ndarray] = {}
        self._views: dict[tuple, np.ndarray] = {}     # (ptr, shape, dtype) -> its NumPy view
        self._next = _BASE_ADDR
        self._captures: dict[str, _Capture] = {}
        self._timeline: list[TimelineEvent] = []
        self._compiled: set[str] = set()
        self._races: list[str] = []                   # PDL races seen (pre-wait reads)
        self._speed, self._speed_until = 1.0, 0.0     # host drift (CostModel.host_speed)
        self._init_queues()

    @property
    def host_us(self) -> float:
        """Model time of the host thread (one thread drives every rank of a group)."""
        return self._shared.host_us

    @host_us.setter
    def host_us(self, value: float) -> None:
        self._shared.host_us = value

    def describe(self) -> str:
        return f"simulated (CPU simulator; {self.cost.describe()})"

    # ---- capture state -----------------------------------------------------------------------
    def _offend(self, what: str) -> None:
        """An operation illegal during a global-mode capture: invalidate and fail at the call."""
        if not self._captures:
            return
        for cap in self._captures.values():
            if cap.offence is None:
                cap.offence = what
        raise CaptureError(f"operation not permitted when stream is capturing: {what}", what)

    def _capture_of(self, stream: str) -> _Capture | None:
        for cap in self._captures.values():
            if stream in cap.streams:
                return cap
        return None

    def is_capturing(self, stream: str = "main") -> bool:
        return self._capture_of(stream) is not None

    def abort_capture(self) -> None:
        self._captures.clear()
        self._issued = 0

    def begin_capture(self, stream: str = "main") -> None:
        if self._captures:
            raise CaptureError("a capture is already open")
        self._captures[stream] = _Capture(stream, streams={stream})
        self._issued = 0

    def instantiate(self, source: SimGraph) -> SimGraph:
        self.host_us += self.cost.instantiate_host_us(len(source.nodes)) * self._host_speed()
        return SimGraph(self, source.nodes, source.deps, pdl=source.pdl, node_pdl=source.node_pdl)

    def end_capture(self, stream: str = "main", instantiate: bool = True) -> SimGraph:
        cap = self._captures.pop(stream, None)
        if cap is None:
            raise CaptureError(f"stream {stream!r} is not capturing")
        if cap.offence is not None:
            raise CaptureError(f"capture invalidated (cudaErrorStreamCaptureInvalidated); "
                               f"first offence: {cap.offence}", cap.offence)
        for st in sorted(cap.streams - {stream}):
            if st in cap.last and (st, cap.last[st]) not in cap.joined:
                raise CaptureError(f"stream {st!r} was not joined back into {stream!r} before "
                                   f"end_capture (cudaErrorStreamCaptureUnjoined)",
                                   f"unjoined work on stream {st!r}")
        # the host's time to capture (and instantiate) the graph, as measured (floors.capture)
        self.host_us += self.cost.capture_host_us(len(cap.nodes)) * self._host_speed()
        if instantiate:
            self.host_us += self.cost.instantiate_host_us(len(cap.nodes)) * self._host_speed()
        return SimGraph(self, cap.nodes, cap.deps, pdl=self.pdl, executable=instantiate,
                        node_pdl=cap.programmatic)

    # ---- memory ------------------------------------------------------------------------------
    def alloc(self, name, shape, dtype, init="zeros") -> Buffer:
        self._op("allocation", name)
        self._offend(f"allocation of {name!r} during capture")
        shape = tuple(int(s) for s in (shape if isinstance(shape, (tuple, list)) else (shape,)))
        dtype = np.dtype(dtype)
        nbytes = max(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize, 1)
        size = -(-nbytes // _ALIGN) * _ALIGN
        if init == "zeros":
            seg = np.zeros(size, np.uint8)
        elif init == "empty":  # unseeded on purpose: uninitialised memory is not reproducible
            rng = np.random.default_rng()
            seg = rng.integers(0, 256, size, dtype=np.uint8)
            if dtype.kind == "f":  # a recycled pool block holds an earlier tensor: finite values
                seg.view(dtype)[:] = rng.standard_normal(size // dtype.itemsize)
        else:
            raise ValueError(f"init must be 'zeros' or 'empty', not {init!r}")
        base = self._next
        self._next += size + _ALIGN  # a gap, so an overrun does not land in the next buffer
        self._bases.append(base)
        self._segments[base] = seg
        return Buffer(name, base, shape, dtype)

    def _resolve(self, buf: Buffer) -> np.ndarray:
        """The NumPy view at a buffer's address: resolution by pointer, as a GPU would do (each
        view made once: allocations are never freed or moved, so a view stays valid)."""
        key = (buf.ptr, buf.shape, buf.dtype)
        view = self._views.get(key)
        if view is None:
            view = self._views[key] = self._resolve_new(buf)
        return view

    def _resolve_new(self, buf: Buffer) -> np.ndarray:
        i = bisect.bisect_right(self._bases, buf.ptr) - 1
        if i < 0:
            raise RuntimeError(f"address {buf.ptr:#x} is not device memory")
        base = self._bases[i]
        seg = self._segments[base]
        off = buf.ptr - base
        if off + buf.nbytes > seg.size:
            raise RuntimeError(f"{buf.label}: access of {buf.nbytes} B at {buf.ptr:#x} overruns "
                               f"its allocation of {seg.size} B (illegal address)")
        return np.ndarray(buf.shape, buf.dtype, buffer=seg, offset=off)

    def upload(self, buf, host) -> None:
        self._op("upload", buf.label)
        self._offend(f"synchronous host-to-device copy into {buf.label}")
        self._run_queued()                  # a synchronous copy waits for the queued work
        host = np.asarray(host)
        if host.shape != buf.shape:
            raise ValueError(f"upload to {buf.label}: shape {host.shape} != {buf.shape}")
        self._resolve(buf)[...] = host.astype(buf.dtype, copy=False)

    def download(self, buf) -> np.ndarray:
        self._op("download", buf.label)
        self._offend(f"synchronous device-to-host copy from {buf.label}")
        self._run_queued()
        return self._resolve(buf).copy()

    def pool_bytes(self) -> int:
        return int(sum(s.size for s in self._segments.values()))

    # ---- execution: issue -----------------------------------------------------------------
    def warm_up(self, kernels) -> None:
        # twins need no compilation; remember what a GPU would have compiled and loaded here
        self._compiled.update(spec.name for spec in kernels)

    def host_step(self, mode: str) -> None:
        """The engine's own host work for one step (plan, ledger, issue loop): measured cost."""
        super().host_step(mode)
        self.host_us += self.cost.engine_step(mode) * self._host_speed()

    def launch(self, launch: Launch) -> None:
        # lazy compile + module load: the H200's driver (13.0) allowed it in a capture; older
        # drivers may refuse a module load there, which is one more reason to warm up
        if launch.name not in self._compiled:
            self._op("compilation", launch.name)
            self._compiled.add(launch.name)
        for a in launch.args:
            if isinstance(a, RawArray):  # numba synchronises the array's stream before launching
                self._op("array-interface sync", a.label)
                self._offend(f"array-interface synchronisation of raw argument {a.buf.label} "
                             f"for {launch.name} (cudaErrorStreamCaptureIsolation)")
        cap = self._capture_of(launch.stream)
        if cap is None and self._captures:
            self._offend(f"launch of {launch.name} on stream {launch.stream!r}, which is not "
                         f"part of the open capture")
        if self.log is not None:
            self.log.record(launch, "capture" if cap else "eager")
        self._issued += 1
        if cap is not None:
            _record_node(cap, launch, self.pdl)
            return
        host0 = self.host_us
        self.host_us += self.cost.host_launch(launch, self.mechanism, self._rng) * self._host_speed()
        st = launch.stream
        deps = self._eager_deps(st)
        last = self._last.get(st)
        self._enqueue(launch, deps, "eager", host0, self.host_us, 0.0, 1.0, self.pdl,
                      last[1] if last else None, last if self.pdl else None)
        self._wait_if_blocking(launch.name)

    def record_wait(self, src: str, dst: str) -> None:
        """Record an event on `src` and make `dst` wait for it (fork or join)."""
        cap = self._capture_of(src)
        if cap is not None:
            if src in cap.last:
                cap.pending.setdefault(dst, set()).add(cap.last[src])
                if dst in cap.streams:      # a join: src's newest work is ordered into dst
                    cap.joined.add((src, cap.last[src]))
            cap.streams.add(dst)            # waiting on a captured event pulls dst in
            return
        if self._capture_of(dst) is not None:
            self._offend(f"capturing stream {dst!r} waits on an event of stream {src!r} "
                         f"outside the capture (cudaErrorStreamCaptureIsolation)")
        self._waits.setdefault(dst, set()).update(self._tail.get(src, ()))

    def collective(self, coll: Collective) -> None:
        """Issue one collective: into the open capture as a node, or onto the queue, where it
        waits for the matching collective of every other rank (SimRanks.run_queued)."""
        if self.group is None:
            super().collective(coll)
        cap = self._capture_of(coll.stream)
        if cap is None and self._captures:
            self._offend(f"{coll.op} on stream {coll.stream!r}, which is not part of the open capture")
        if cap is not None:
            _record_node(cap, coll)
            return
        host0 = self.host_us
        self.host_us += self.group.coll_cost.host_us(coll) * self._host_speed()
        self._enqueue(coll, self._eager_deps(coll.stream), "eager", host0, self.host_us, 0.0, 1.0,
                      False, None, None)

    def build_loop(self, bodies: int, issue_body, pos: Buffer, plan_of: Buffer,
                   limit: Buffer) -> "SimLoopGraph":
        """WHILE (pos < limit) { SWITCH (plan_of[pos]) { body 0 | body 1 | ... } }: each body
        captured from `issue_body(k)`; the conditions are set on the device by the twins of
        kernels/loop.py's kernels."""
        graphs = []
        for k in range(bodies):
            self.begin_capture()
            try:
                issue_body(k)
            except BaseException:
                self.abort_capture()
                raise
            graphs.append(self.end_capture())
        return SimLoopGraph(self, graphs, pos, plan_of, limit)

    def loop_support(self) -> str | None:
        return None          # the simulator models WHILE and SWITCH nodes (CUDA 12.8+)

def _record_node(cap: _Capture, item, programmatic: bool = False) -> None:
    """Append a launch or a collective to an open capture, after its stream's newest node and
    the events its stream waits for (nothing once the capture is invalidated); `programmatic`:
    launched with PDL."""
    if cap.offence is not None:
        return
    st = item.stream
    deps = set(cap.pending.pop(st, set()))
    if st in cap.last:
        deps.add(cap.last[st])
    cap.last[st] = len(cap.nodes)
    cap.nodes.append(item)
    cap.deps.append(tuple(sorted(deps)))
    cap.programmatic.append(programmatic)


def __getattr__(name):
    # SimRanks lives in lab/backend/sim_ranks.py (it imports this module); still importable here
    if name == "SimRanks":
        from .sim_ranks import SimRanks
        return SimRanks
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
