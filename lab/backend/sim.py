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
  and invalidate the capture; the error is sticky and surfaces again at `end_capture`, naming the
  first offence. (A stream-ordered allocation would be capturable; the lab makes none.)
- Streams and events: `record_wait(src, dst)` orders dst after src's work; during a capture it
  pulls dst into the capture (fork) or joins it back; unjoined work fails `end_capture`.
- Time comes from `CostModel` (measured component costs, data/gpu/kernel_costs.json): the host
  pays per launch (per launch mechanism), per graph launch and per engine step; the device runs
  each kernel for its measured time once its dependencies and its host submit are done. The
  timing does not depend on the execution order. Every figure is labelled "simulated".
- `init="empty"` memory is filled from an unseeded generator: really unpredictable, like a GPU's.
- Ranks (LAB_RANKS=2, `SimRanks`): one SimBackend per rank, each with its own memory, streams
  and queues, driven by ONE host thread (one host clock). A collective (`Collective`: all-reduce,
  all-gather, reduce-scatter) is a node of its rank's queue, or of its rank's graph; it runs
  when every rank's collective of the same sequence number is ready -- NCCL matches them by
  order alone -- and then on all ranks at once. Collectives that do not match across ranks, or
  a rank left waiting for a collective another rank never issues, raise `CollectiveError`
  naming each rank's position, where NCCL would hang or corrupt memory. Each collective costs
  its recorded time (`CollectiveCosts`, data/gpu/ranks.json).
"""
from __future__ import annotations

import bisect
import heapq
from dataclasses import dataclass, field

import numpy as np

from kernels.loop import loop_continue_twin, loop_plan_twin

from contextlib import contextmanager

from ..errors import CaptureError, CollectiveError, LabError
from ..pdl_check import pre_wait_reads
from .base import Backend, Buffer, Collective, Graph, Launch, LoopGraph, RawArray
from .costmodel import CollectiveCosts, CostModel, launch_context

_BASE_ADDR = 0x7F00_0000_0000
_ALIGN = 512  # CuPy's pool rounds allocations to 512 bytes
ORDERS = ("adversarial", "random", "issue")


@dataclass
class TimelineEvent:
    kernel: str
    layer: int | None
    stream: str
    kind: str          # "eager" or "graph"
    host_start: float  # microseconds of model time
    host_end: float
    dev_start: float
    dev_end: float


@dataclass
class _Shared:
    """What the ranks of one process share: the host thread's clock, and work ids (unique
    across ranks, so one run can order every rank's queued work)."""
    host_us: float = 0.0
    ids: int = 0


@dataclass
class _Capture:
    stream: str                                   # the origin stream
    nodes: list = field(default_factory=list)     # launches, in issue order (a topological order)
    deps: list = field(default_factory=list)      # per node: indices of the nodes it waits for
    streams: set = field(default_factory=set)     # streams pulled into the capture
    last: dict = field(default_factory=dict)      # stream -> its newest node
    pending: dict = field(default_factory=dict)   # stream -> nodes its next node must wait for
    joined: set = field(default_factory=set)      # (stream, node) pairs joined back
    offence: str | None = None


@dataclass
class _Work:
    """One kernel on the device's queues, issued but not yet run."""
    id: int
    launch: Launch
    deps: tuple            # ids of the work it waits for
    kind: str              # "eager" | "graph"
    host0: float           # the host's submit window (model us)
    host1: float
    lead: float            # device delay after its dependencies (a graph's per-replay overhead)
    noise: float           # a factor on the device time (which comes from the context)
    pdl: bool              # launched programmatically: timed with the PDL node cost
    prev: "Launch | None" = None    # the kernel before it on its stream (a switch costs)
    early: "Launch | None" = None   # its programmatic predecessor (PDL), for the pre-wait rule
    early_id: int | None = None
    join: bool = False     # waits on another stream's work: pays the fork/join cost
    seq: int | None = None  # a collective: its rank's collective count before it (NCCL's match)


class SimGraph(Graph):
    def __init__(self, backend: "SimBackend", nodes: list[Launch], deps=None, pdl: bool = False,
                 executable: bool = True):
        self._backend = backend
        self.nodes = list(nodes)
        self.deps = [tuple(d) for d in deps] if deps is not None else [
            (i - 1,) if i else () for i in range(len(self.nodes))]
        self.pdl = pdl                     # captured with programmatic launches (PDL edges)
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
        if source.pdl != self.pdl:
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


class SimBackend(Backend):
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
        self._next = _BASE_ADDR
        self._captures: dict[str, _Capture] = {}
        self._timeline: list[TimelineEvent] = []
        self._compiled: set[str] = set()
        self._races: list[str] = []                   # PDL races seen (pre-wait reads)
        self._speed, self._speed_until = 1.0, 0.0     # host drift (CostModel.host_speed)
        # the device's queues: issued work not yet run, and what later work waits for
        self._work: dict[int, _Work] = {}
        self._end: dict[int, float] = {}              # device end time of work that has run
        self._stream_of: dict[int, str] = {}
        self._tail: dict[str, tuple] = {}             # stream -> ids its next work waits for
        self._waits: dict[str, set] = {}              # stream -> event ids its next work waits for
        self._last: dict[str, tuple] = {}             # stream -> (id, launch) of its newest kernel

    @property
    def host_us(self) -> float:
        """Model time of the host thread (one thread drives every rank of a group)."""
        return self._shared.host_us

    @host_us.setter
    def host_us(self, value: float) -> None:
        self._shared.host_us = value

    def describe(self) -> str:
        return f"simulated (CPU simulator; {self.cost.describe()})"

    @property
    def timeline(self) -> list[TimelineEvent]:
        """Every kernel that ran, with host and device times (runs what is still queued)."""
        self._run_queued()
        return self._timeline

    @property
    def races(self) -> list[str]:
        """PDL races seen so far (runs what is still queued)."""
        self._run_queued()
        return self._races

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
        return SimGraph(self, source.nodes, source.deps, pdl=source.pdl)

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
        return SimGraph(self, cap.nodes, cap.deps, pdl=self.pdl, executable=instantiate)

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
        """The NumPy view at a buffer's address: resolution by pointer, as a GPU would do."""
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
        if launch.name not in self._compiled:  # lazy compile + module load: legal in a capture
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
            _record_node(cap, launch)
            return
        host0 = self.host_us
        self.host_us += self.cost.host_launch(launch, self.mechanism, self._rng) * self._host_speed()
        st = launch.stream
        deps = self._eager_deps(st)
        last = self._last.get(st)
        self._enqueue(launch, deps, "eager", host0, self.host_us, 0.0, 1.0, self.pdl,
                      last[1] if last else None, last if self.pdl else None)

    def _eager_deps(self, stream: str) -> tuple:
        """What eager work issued on `stream` now waits for: the stream's tail and its events."""
        return tuple(sorted(set(self._tail.get(stream, ())) | self._waits.pop(stream, set())))

    def _enqueue(self, launch, deps, kind, host0, host1, lead, noise, pdl, prev, early,
                 origin: str = "main") -> int:
        i = self._shared.ids
        self._shared.ids += 1
        st = launch.stream
        seq = None
        if isinstance(launch, Collective):
            seq, self._coll_seq = self._coll_seq, self._coll_seq + 1
        if isinstance(prev, Collective):
            prev = None                     # a kernel after a collective: no switch cost known
        # a join: work on the origin stream waits for another stream's (the pair's one cost)
        join = st == origin and any(self._stream_of.get(d, st) != st for d in deps)
        self._work[i] = _Work(i, launch, deps, kind, host0, host1, lead, noise, pdl, prev,
                              early[1] if early else None, early[0] if early else None, join, seq)
        self._stream_of[i] = st
        self._tail[st] = (i,)
        self._last[st] = (i, launch)
        return i

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

    def _replay(self, graph: SimGraph, stream: str) -> None:
        if self._captures:
            self._offend("graph launch during capture")
        host0 = self.host_us
        self.host_us += self.cost.graph_submit(self._rng) * self._host_speed()
        self._enqueue_graph(graph, stream, host0, self.cost.graph_launch_us)

    def _enqueue_graph(self, graph: SimGraph, stream: str, host0: float, lead0: float) -> None:
        """Queue a graph's nodes with its edges, submitted by the host in [host0, host_us];
        `lead0`: the device's delay before the graph's first nodes."""
        before = tuple(sorted(set(self._tail.get(stream, ())) | self._waits.pop(stream, set())))
        ids: list[int] = []
        last_on: dict[str, tuple] = {}
        sinks = set()
        for node, deps in zip(graph.nodes, graph.deps):
            mapped = tuple(ids[d] for d in deps)
            same = [d for d in deps if graph.nodes[d].stream == node.stream]
            pdl = graph.pdl and bool(same) and not isinstance(node, Collective)
            early = (ids[same[-1]], graph.nodes[same[-1]]) if pdl else None
            lead = 0.0 if deps else lead0
            last = self._last.get(node.stream)
            prev = graph.nodes[same[-1]] if same else (last[1] if last else None)
            ids.append(self._enqueue(node, mapped if deps else before, "graph", host0,
                                     self.host_us, lead, self.cost.node_noise(self._rng), pdl,
                                     prev, early, stream))
            sinks.add(ids[-1])
            sinks.difference_update(mapped)
            last_on[node.stream] = ids[-1]
        for st in last_on:                   # work issued after the replay waits for all of it
            self._tail.pop(st, None)
        self._tail[stream] = tuple(sorted(sinks))

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

    def _run_loop(self, loop: "SimLoopGraph", stream: str) -> None:
        """One host submit; then the device alone decides: each iteration runs the body that
        plan_of[pos] names, then continues while pos < limit. Each iteration pays the measured
        cost of the loop's machinery (floors.loop.overhead_us: conditional nodes and their two
        condition kernels) before its body."""
        if self._captures:
            self._offend("graph launch during capture")
        host0 = self.host_us
        self.host_us += self.cost.graph_submit(self._rng) * self._host_speed()
        lead = self.cost.graph_launch_us
        while True:
            self._run_queued()       # the device's memory as the condition kernel reads it
            k = loop_plan_twin(self._resolve(loop.pos), self._resolve(loop.plan_of))
            if not 0 <= k < len(loop.bodies):
                raise LabError(f"device loop: plan_of[pos] = {k} names no body (SWITCH runs none)")
            self._enqueue_graph(loop.bodies[k], stream, host0, lead + self.cost.loop_iteration_us())
            lead = 0.0
            loop.runs[k] += 1
            self._run_queued()
            if not loop_continue_twin(self._resolve(loop.pos), self._resolve(loop.limit)):
                break

    # ---- execution: run, in an order the dependencies allow ----------------------------------
    def _run_queued(self) -> None:
        """Run every queued kernel: a topological order of their dependencies, chosen by
        `self.order`; under PDL, snapshot what a dependent reads before its wait. A rank of a
        group runs every rank's queued work together (collectives need all of them)."""
        if self.group is not None:
            self.group.run_queued()
            return
        if not self._work:
            return
        work, self._work = self._work, {}
        children, indeg, ready = _dependents({i: w.deps for i, w in work.items()})
        watch: dict[int, list[_Work]] = {}      # predecessor id -> PDL dependents reading early
        for w in work.values():
            if w.early_id in work and pre_wait_reads(w.launch.kernel):
                watch.setdefault(w.early_id, []).append(w)
        early_views: dict[int, dict] = {}
        while ready:
            i = _pick(ready, self.order, self._order_rng)
            for dep in watch.get(i, ()):        # it started as i started: i's inputs, not outputs
                if self.order == "adversarial" or (
                        self.order == "random" and self._order_rng.random() < 0.5):
                    early_views[dep.id] = self._snapshot(dep.launch)
            self._execute(work[i], early_views.pop(i, None))
            for c in children.get(i, ()):
                indeg[c] -= 1
                if indeg[c] == 0:
                    heapq.heappush(ready, c)
        self._forget_finished()

    def _forget_finished(self) -> None:
        """Drop the end times no later work can wait for."""
        keep = {d for t in self._tail.values() for d in t} | {
            d for ws in self._waits.values() for d in ws}
        self._end = {k: v for k, v in self._end.items() if k in keep}
        self._stream_of = {k: v for k, v in self._stream_of.items() if k in keep}

    def _snapshot(self, launch: Launch) -> dict:
        """Copies of what `launch` reads before its pdl_wait (arguments it does not write)."""
        out = {}
        for idx in pre_wait_reads(launch.kernel):
            a = launch.args[idx]
            a = a.buf if isinstance(a, RawArray) else a
            if isinstance(a, Buffer) and idx not in launch.kernel.writes:
                out[idx] = self._resolve(a).copy()
        return out

    def _execute(self, w: _Work, early_view: dict | None) -> None:
        launch = w.launch
        if w.early is not None:
            self._check_pdl(launch, w.early)
        arrays = []
        for idx, a in enumerate(launch.args):
            if isinstance(a, RawArray):
                a = a.buf
            if early_view and idx in early_view:
                arrays.append(early_view[idx])
            elif isinstance(a, Buffer):
                arrays.append(self._resolve(a))
            elif isinstance(a, np.ndarray):
                raise TypeError(f"{launch.name}: host array passed as a kernel argument")
            else:
                arrays.append(a)
        context = launch_context(launch, arrays)
        launch.kernel.twin(launch.grid, launch.block, *arrays)
        ready = max((self._end[d] for d in w.deps if d in self._end), default=0.0)
        if w.join:
            ready += self.cost.join_us
        if w.kind == "graph":
            dev0 = max(ready, w.host1) + w.lead
            dev1 = dev0 + self.cost.node_us(launch, context, w.pdl, w.prev) * w.noise
        else:
            dev0 = max(ready, w.host1)
            dev1 = dev0 + self.cost.eager_us(launch, context, w.prev)
        self._end[w.id] = dev1
        self._timeline.append(TimelineEvent(launch.name, launch.layer, launch.stream, w.kind,
                                            w.host0, w.host1, dev0, dev1))

    def _check_pdl(self, launch: Launch, prev: Launch) -> None:
        """Under PDL, a kernel's pre-wait part overlaps its predecessor: report a race if it
        touches there anything the predecessor writes."""
        early = pre_wait_reads(launch.kernel)
        if not early:
            return
        written = [prev.args[i] for i in prev.kernel.writes if isinstance(prev.args[i], Buffer)]
        for i in sorted(early):
            a = launch.args[i]
            if isinstance(a, Buffer) and any(_overlap(a, w) for w in written):
                self._races.append(f"PDL race: {launch.name} reads {a.label} before its pdl_wait, "
                                   f"while {prev.name} (its predecessor) writes it")

    def _host_speed(self) -> float:
        """The host-speed factor now: redrawn every cost.drift_us of model time."""
        if self.host_us >= self._speed_until:
            self._speed = self.cost.host_speed(self._rng)
            self._speed_until = self.host_us + self.cost.drift_us
        return self._speed

    def synchronize(self) -> None:
        if self._captures:
            self._op("synchronize", "device")
        self._offend("device synchronize during capture")
        self._run_queued()
        self.host_us = max([self.host_us, *self._end.values()])

    def clock(self) -> float:
        self.synchronize()
        return self.host_us * 1e-6


def _dependents(deps: dict[int, tuple]) -> tuple[dict, dict, list]:
    """The queued work's graph, from {id: ids it waits for}: (children of each id, how many
    queued ids each waits for, a heap of the ids that wait for none). Dependencies on work that
    already ran are met."""
    children: dict[int, list[int]] = {}
    indeg: dict[int, int] = {}
    for i, ds in deps.items():
        n = 0
        for d in ds:
            if d in deps:
                children.setdefault(d, []).append(i)
                n += 1
        indeg[i] = n
    ready = [i for i, n in indeg.items() if n == 0]
    heapq.heapify(ready)                    # issue order pops the smallest id; others pick
    return children, indeg, ready


def _pick(ready: list[int], order: str, rng: np.random.Generator) -> int:
    """Take the next work to run from the heap of ready ids, as `order` says: "issue" the
    oldest, "adversarial" the newest (consumers run first), "random" any."""
    if order == "issue":
        return heapq.heappop(ready)
    if order == "adversarial":
        i = max(ready)
    else:
        i = ready[int(rng.integers(len(ready)))]
    ready.remove(i)
    heapq.heapify(ready)
    return i


def _record_node(cap: _Capture, item) -> None:
    """Append a launch or a collective to an open capture, after its stream's newest node and
    the events its stream waits for (nothing once the capture is invalidated)."""
    if cap.offence is not None:
        return
    st = item.stream
    deps = set(cap.pending.pop(st, set()))
    if st in cap.last:
        deps.add(cap.last[st])
    cap.last[st] = len(cap.nodes)
    cap.nodes.append(item)
    cap.deps.append(tuple(sorted(deps)))


def _overlap(a: Buffer, b: Buffer) -> bool:
    return a.ptr < b.ptr + b.nbytes and b.ptr < a.ptr + a.nbytes


class SimRanks:
    """`ranks` simulated devices driven by one host thread, with NCCL's collectives among them
    (LAB_RANKS=2 on the simulator). `backends[r]` is rank r's device: its own memory, streams,
    queues and graphs; the host clock and work ids are shared. Collectives run in
    `run_queued`, which runs every rank's queued work together."""

    simulated = True
    name = "sim"

    def __init__(self, ranks: int, cost: CostModel | None = None, seed: int = 0,
                 order: str = "adversarial", coll_cost: CollectiveCosts | None = None):
        if ranks < 1:
            raise LabError(f"ranks must be at least 1, not {ranks}")
        self.ranks = ranks
        self._shared = _Shared()
        self.cost = cost or CostModel.load()
        self.coll_cost = coll_cost or CollectiveCosts.load()
        self.order = order
        self._order_rng = np.random.default_rng([seed, 2])
        self.backends = [SimBackend(self.cost, seed=seed + 1000 * r, order=order, group=self, rank=r)
                         for r in range(ranks)]

    def describe(self) -> str:
        return (f"simulated (CPU simulator, {self.ranks} simulated devices; {self.cost.describe()}; "
                f"collectives: {self.coll_cost.source})")

    @contextmanager
    def collectives(self):
        """The ranks' matching collectives are issued inside this (an NCCL group on a GPU)."""
        yield

    def end_captures(self) -> list:
        """End every rank's open capture (not instantiated): what CUDA needs on a GPU pair,
        where instantiating one rank's graph while another rank still captures fails. The last
        opened is ended first, as on a GPU."""
        ended = [b.end_capture(instantiate=False) for b in reversed(self.backends)]
        return ended[::-1]

    def clock(self) -> float:
        """Seconds of model time once every rank's issued work is done."""
        self.run_queued()
        for b in self.backends:
            if b._end:
                self._shared.host_us = max(self._shared.host_us, *b._end.values())
        return self._shared.host_us * 1e-6

    def close(self) -> None:
        """Nothing to free on the simulator (a GPU pair destroys graphs and communicators)."""

    # ---- running every rank's queued work ---------------------------------------------------
    def run_queued(self) -> None:
        """Run every rank's queued work in one topological order (self.order picks among what
        is ready). A collective waits, parked, until every rank's collective of the same
        sequence number is ready; then it runs on all ranks at once. Raises CollectiveError when
        the collectives do not match or some rank would wait for ever."""
        work: dict[int, tuple] = {}
        for b in self.backends:
            for i, w in b._work.items():
                work[i] = (b, w)
            b._work = {}
        if not work:
            return
        children, indeg, ready = _dependents({i: w.deps for i, (_, w) in work.items()})
        parked: dict[int, dict[int, int]] = {}     # sequence number -> {rank: work id}
        done: set[int] = set()

        def release(i):
            done.add(i)
            for c in children.get(i, ()):
                indeg[c] -= 1
                if indeg[c] == 0:
                    heapq.heappush(ready, c)

        while ready:
            i = _pick(ready, self.order, self._order_rng)
            b, w = work[i]
            if isinstance(w.launch, Collective):
                arrived = parked.setdefault(w.seq, {})
                arrived[b.rank] = i
                if len(arrived) == self.ranks:
                    del parked[w.seq]
                    ids = [arrived[r] for r in range(self.ranks)]
                    self._run_collective(w.seq, [work[j] for j in ids])
                    for j in ids:
                        release(j)
            else:
                b._execute(w, None)
                release(i)
        if parked or len(done) < len(work):
            raise CollectiveError(self._deadlock(parked, work, done))
        for b in self.backends:
            b._forget_finished()

    def _run_collective(self, seq: int, parts: list) -> None:
        """Collective number `seq` of every rank, all ready: check that they match, then run it
        with NCCL's semantics (sums in rank order) and charge its recorded time on every rank."""
        colls = [w.launch for _, w in parts]
        if len({c.signature() for c in colls}) > 1:
            what = "; ".join(f"rank {b.rank}: {w.launch.describe()}" for b, w in parts)
            raise CollectiveError(
                f"collective #{seq} does not match across ranks ({what}): NCCL matches "
                f"collectives by order alone, so on a GPU pair this hangs or corrupts memory. "
                f"Every rank must issue the same collectives in the same order")
        sends = [b._resolve(c.send).copy() for (b, _), c in zip(parts, colls)]
        op, n = colls[0].op, colls[0].count
        if op == "all_gather":
            out = [np.concatenate(sends)] * len(parts)
        else:
            total = sends[0].copy()
            for s in sends[1:]:
                total = total + s            # rank order; for two ranks a + b == b + a exactly
            out = ([total] * len(parts) if op == "all_reduce" else
                   [total[r * (n // self.ranks):(r + 1) * (n // self.ranks)] for r in range(len(parts))])
        for (b, _), c, o in zip(parts, colls, out):
            b._resolve(c.recv)[...] = o.reshape(c.recv.shape)
        start = 0.0
        for b, w in parts:
            ready = max((b._end[d] for d in w.deps if d in b._end), default=0.0)
            start = max(start, ready, w.host1)
        start += max(w.lead for _, w in parts)
        us = self.coll_cost.device_us(colls[0], graph=parts[0][1].kind == "graph")
        for (b, w), c in zip(parts, colls):
            b._end[w.id] = start + us
            b._timeline.append(TimelineEvent(c.op, c.layer, c.stream, w.kind, w.host0, w.host1,
                                             start, start + us))

    def _deadlock(self, parked: dict, work: dict, done: set) -> str:
        """Where each rank stands when its queued work cannot go on."""
        lines = []
        for b in self.backends:
            waiting = sorted(s for s, ranks in parked.items() if b.rank in ranks)
            if waiting:
                w = work[parked[waiting[0]][b.rank]][1]
                lines.append(f"rank {b.rank} waits in collective #{waiting[0]} "
                             f"({w.launch.describe()})")
            else:
                left = sum(1 for i, (bb, _) in work.items() if bb is b and i not in done)
                lines.append(f"rank {b.rank} issued {b._coll_seq} collectives in all and never "
                             f"reaches collective #{min(parked) if parked else '?'}"
                             + (f" ({left} of its queued items cannot run)" if left else
                                " (its queued work ran to the end)"))
        return ("deadlock: " + "; ".join(lines) + ". On a GPU pair NCCL would wait for ever "
                "(every rank must issue the same collectives in the same order)")
