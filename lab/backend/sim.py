"""The CPU simulator backend: CUDA's semantics for memory, streams, launches and graphs.

- Memory is an arena of segments at real integer addresses: a view's pointer is a number that a
  capture freezes, and a replay writes wherever that number points.
- Kernels run as their NumPy twins.
- A capture records each launch with its arguments BY VALUE (buffers by address, sizes, grids);
  nothing runs; memory stays live. A replay re-runs the records in order.
- Capture is GLOBAL mode: synchronize, synchronous copies and allocation while a capture is open
  fail at the call (as `cudaErrorStreamCaptureUnsupported`) and invalidate the capture; the error
  is sticky and surfaces again at `end_capture`, naming the first offence.
- Streams and events: `record_wait(src, dst)` orders dst after src's work; during a capture it
  pulls dst into the capture (fork) or joins it back; unjoined work fails `end_capture`. A graph
  node depends on the previous node of its stream and on the events it waited for, and replays
  run independent branches side by side on the timeline.
- PDL (`self.pdl`): a programmatic launch may start before its predecessor ends, which hides
  part of the launch gap; a kernel that touches, before its `pdl_wait`, memory its predecessor
  wrote is reported in `self.races` (what compute-sanitizer's racecheck would say on a GPU).
- Time comes from `CostModel`; every figure is labelled "simulated".
- `init="empty"` memory is filled from an unseeded generator: really unpredictable, like a GPU's.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import numpy as np

from ..errors import CaptureError
from .base import Backend, Buffer, Graph, Launch, RawArray
from ..pdl_check import pre_wait_reads
from .costmodel import CostModel

_BASE_ADDR = 0x7F00_0000_0000
_ALIGN = 512  # CuPy's pool rounds allocations to 512 bytes


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
class _Capture:
    stream: str                                   # the origin stream
    nodes: list = field(default_factory=list)     # launches, in issue order (a topological order)
    deps: list = field(default_factory=list)      # per node: indices of the nodes it waits for
    streams: set = field(default_factory=set)     # streams pulled into the capture
    last: dict = field(default_factory=dict)      # stream -> its newest node
    pending: dict = field(default_factory=dict)   # stream -> nodes its next node must wait for
    joined: set = field(default_factory=set)      # (stream, node) pairs joined back
    offence: str | None = None


class SimGraph(Graph):
    def __init__(self, backend: "SimBackend", nodes: list[Launch], deps=None):
        self._backend = backend
        self.nodes = list(nodes)
        self.deps = [tuple(d) for d in deps] if deps is not None else [
            (i - 1,) if i else () for i in range(len(self.nodes))]

    @property
    def node_count(self) -> int:
        return len(self.nodes)

    def node_types(self) -> dict[str, int]:
        return {"kernel": len(self.nodes)} if self.nodes else {}

    def launch(self, stream: str = "main") -> None:
        self._backend._replay(self, stream)

    def dot(self) -> str:
        lines = ["digraph decode_step {"]
        for i, n in enumerate(self.nodes):
            lines.append(f'  n{i} [label="{n.name}\\ngrid={n.grid} block={n.block}"];')
            lines += [f"  n{d} -> n{i};" for d in self.deps[i]]
        lines.append("}")
        return "\n".join(lines)


class SimBackend(Backend):
    name = "sim"
    simulated = True

    def __init__(self, cost: CostModel | None = None, seed: int = 0):
        super().__init__()
        self.cost = cost or CostModel()
        self._rng = np.random.default_rng(seed)       # jitter: reproducible per seed
        self._bases: list[int] = []
        self._segments: dict[int, np.ndarray] = {}
        self._next = _BASE_ADDR
        self._captures: dict[str, _Capture] = {}
        self.host_us = 0.0                            # model time of the host thread
        self._stream_ready: dict[str, float] = {}
        self.timeline: list[TimelineEvent] = []
        self.record_timeline = True
        self._compiled: set[str] = set()
        self.pdl = False                              # launches are programmatic (PDL)
        self.races: list[str] = []                    # PDL races seen (pre-wait reads)
        self._last_launch: dict[str, Launch] = {}     # per stream, for the PDL race check
        self._speed, self._speed_until = 1.0, 0.0     # host drift (CostModel.host_speed)

    def describe(self) -> str:
        return "simulated (CPU simulator, cost model calibrated from H200 measurements)"

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

    def begin_capture(self, stream: str = "main") -> None:
        if self._captures:
            raise CaptureError("a capture is already open")
        self._captures[stream] = _Capture(stream, streams={stream})
        self._issued = 0

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
        self._stream_ready[dst] = max(self._stream_ready.get(dst, 0.0),
                                      self._stream_ready.get(src, 0.0))

    def end_capture(self, stream: str = "main") -> SimGraph:
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
        return SimGraph(self, cap.nodes, cap.deps)

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
        host = np.asarray(host)
        if host.shape != buf.shape:
            raise ValueError(f"upload to {buf.label}: shape {host.shape} != {buf.shape}")
        self._resolve(buf)[...] = host.astype(buf.dtype, copy=False)

    def download(self, buf) -> np.ndarray:
        self._op("download", buf.label)
        self._offend(f"synchronous device-to-host copy from {buf.label}")
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

    # ---- execution ---------------------------------------------------------------------------
    def warm_up(self, kernels) -> None:
        # twins need no compilation; remember what a GPU would have compiled and loaded here
        self._compiled.update(spec.name for spec in kernels)

    def _run(self, launch: Launch) -> float:
        """Execute a launch's twin now; return the bytes it touched (for the cost model)."""
        arrays = []
        for a in launch.args:
            if isinstance(a, RawArray):
                a = a.buf
            if isinstance(a, Buffer):
                arrays.append(self._resolve(a))
            elif isinstance(a, np.ndarray):
                raise TypeError(f"{launch.name}: host array passed as a kernel argument")
            else:
                arrays.append(a)
        launch.kernel.twin(launch.grid, launch.block, *arrays)
        return _bytes_touched(launch, arrays)

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
        if cap is not None:
            self._issued += 1
            if cap.offence is None:
                st = launch.stream
                deps = set(cap.pending.pop(st, set()))
                if st in cap.last:
                    deps.add(cap.last[st])
                cap.last[st] = len(cap.nodes)
                cap.nodes.append(launch)
                cap.deps.append(tuple(sorted(deps)))
            return
        self._check_pdl(launch, self._last_launch.get(launch.stream))
        self._last_launch[launch.stream] = launch
        nbytes = self._run(launch)
        host0 = self.host_us
        self.host_us += self.cost.eager_submit(self._rng) * self._host_speed()
        ready = self._stream_ready.get(launch.stream, 0.0)
        gap = self.cost.eager_gap_us * (self.cost.pdl_gap_factor if self.pdl else 1.0)
        dev0 = max(self.host_us, ready + gap)
        dev1 = dev0 + self.cost.kernel_us(nbytes)
        self._stream_ready[launch.stream] = dev1
        self._event(launch, "eager", host0, self.host_us, dev0, dev1)

    def _check_pdl(self, launch: Launch, prev: Launch | None) -> None:
        """Under PDL, a kernel's pre-wait part overlaps its predecessor: report a race if it
        touches there anything the predecessor writes."""
        if not self.pdl or prev is None:
            return
        early = pre_wait_reads(launch.kernel)
        if not early:
            return
        written = [prev.args[i] for i in prev.kernel.writes if isinstance(prev.args[i], Buffer)]
        for i in sorted(early):
            a = launch.args[i]
            if isinstance(a, Buffer) and any(_overlap(a, w) for w in written):
                self.races.append(f"PDL race: {launch.name} reads {a.label} before its pdl_wait, "
                                  f"while {prev.name} (its predecessor) writes it")

    def _replay(self, graph: SimGraph, stream: str) -> None:
        if self._captures:
            self._offend("graph launch during capture")
        host0 = self.host_us
        self.host_us += self.cost.graph_submit(self._rng) * self._host_speed()
        start = max(self.host_us, self._stream_ready.get(stream, 0.0))
        factor = self.cost.pdl_gap_factor if self.pdl else 1.0
        ends: list[float] = []
        for i, node in enumerate(graph.nodes):
            deps = graph.deps[i]
            same = [d for d in deps if graph.nodes[d].stream == node.stream]
            self._check_pdl(node, graph.nodes[same[-1]] if same else None)
            nbytes = self._run(node)
            dev0 = max([start, *(ends[d] for d in deps)])
            ends.append(dev0 + self.cost.node(self._rng) * factor + self.cost.kernel_us(nbytes))
            self._event(node, "graph", host0, self.host_us, dev0, ends[-1])
        self._stream_ready[stream] = max(ends, default=start)

    def _host_speed(self) -> float:
        """The host-speed factor now: redrawn every cost.host_drift_us of model time."""
        if self.host_us >= self._speed_until:
            self._speed = self.cost.host_speed(self._rng)
            self._speed_until = self.host_us + self.cost.host_drift_us
        return self._speed

    def _event(self, launch, kind, h0, h1, d0, d1) -> None:
        if self.record_timeline:
            self.timeline.append(TimelineEvent(launch.name, launch.layer, launch.stream, kind,
                                               h0, h1, d0, d1))

    def synchronize(self) -> None:
        if self._captures:
            self._op("synchronize", "device")
        self._offend("device synchronize during capture")
        self.host_us = max([self.host_us, *self._stream_ready.values()])

    def clock(self) -> float:
        self.synchronize()
        return self.host_us * 1e-6


def _overlap(a: Buffer, b: Buffer) -> bool:
    return a.ptr < b.ptr + b.nbytes and b.ptr < a.ptr + a.nbytes


def _bytes_touched(launch: Launch, arrays) -> int:
    """Bytes a launch moves: whole buffers, except the KV cache, of which only the live rows
    (attention) or the one row written (append) count."""
    name = launch.name
    total = 0
    for a in arrays:
        if isinstance(a, np.ndarray):
            total += a.nbytes
    if name == "attn_partial":            # q, k_cache, v_cache, pos, ...
        k, pos = arrays[1], int(arrays[3][0])
        total -= 2 * k.nbytes
        total += 2 * (pos + 1) * k[0].nbytes
    elif name == "rope_kv_append":        # ..., k_cache, v_cache
        k = arrays[5]
        total -= 2 * k.nbytes
        total += 2 * k[0].nbytes
    return total
