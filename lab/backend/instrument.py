"""The launch log: every launch the engine issues, with kernel, layer, grid, block and every
argument with its provenance (a buffer name + offset, or a value passed by value).

Eager launches and captured launches are recorded as they are issued; a graph replay is one
record of kind "replay" naming the graph and its node count. From the log: launches per layer,
launches per token, and the launch bill (per-launch budget = step time / launches).

Recording happens inside timed regions, so it only appends a tuple; argument names, provenance
labels and `LaunchRecord` objects are made when the log is read (`records`), once per entry.
`instrumentation_overhead_us()` measures what recording still costs per launch.
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass

import numpy as np

from .base import Buffer, Launch, RawArray


def provenance(value) -> str:
    """A buffer's label (allocation + offset), or "value x" for an argument passed by value."""
    if isinstance(value, (Buffer, RawArray)):
        return value.label
    return f"value {value.item() if isinstance(value, np.generic) else value!r}"


@dataclass(frozen=True)
class LaunchRecord:
    seq: int
    step: int | None
    kind: str                 # "eager", "capture" or "replay"
    kernel: str
    layer: int | None
    grid: tuple
    block: tuple
    stream: str
    args: tuple = ()          # ((name, provenance), ...)
    nodes: int = 0            # for replays: the graph's node count


@dataclass(frozen=True)
class _Replay:
    """What a replay entry holds until the log is read."""
    key: tuple
    nodes: int
    stream: str


class LaunchLog:
    """Raw entries (seq, step, kind, Launch or _Replay), appended while timed; records on read."""

    def __init__(self):
        self.step: int | None = None   # set by the engine before each step
        self._entries: list[tuple] = []
        self._records: list[LaunchRecord] = []   # materialised entries, a prefix of _entries
        self._args: dict[int, tuple] = {}       # id(launch) -> its ((name, provenance), ...)

    def record(self, launch: Launch, kind: str) -> None:
        self._entries.append((len(self._entries), self.step, kind, launch))

    def record_replay(self, key, nodes: int, stream: str = "main") -> None:
        self._entries.append((len(self._entries), self.step, "replay", _Replay(key, nodes, stream)))

    @property
    def records(self) -> list[LaunchRecord]:
        """Every entry as a LaunchRecord, oldest first (entries since the last read are made now)."""
        for entry in self._entries[len(self._records):]:
            self._records.append(self._materialise(*entry))
        return self._records

    def _materialise(self, seq: int, step, kind: str, item) -> LaunchRecord:
        if isinstance(item, _Replay):
            return LaunchRecord(seq, step, kind, f"graph{item.key}", None, (), (), item.stream,
                                (), item.nodes)
        return LaunchRecord(seq, step, kind, item.name, item.layer, tuple(item.grid),
                            tuple(item.block), item.stream, self._labels(item))

    def _labels(self, launch: Launch) -> tuple:
        # a clean engine logs the same Launch objects every step: label each one once (the
        # entries keep the launch alive, so its id is not reused while it is cached here)
        args = self._args.get(id(launch))
        if args is None:
            names = launch.kernel.arg_names
            args = self._args[id(launch)] = tuple((n, provenance(v)) for n, v in zip(names, launch.args))
        return args

    # ---- views -------------------------------------------------------------------------------
    def for_step(self, step: int, kinds=("eager", "capture")) -> list[LaunchRecord]:
        return [r for r in self.records if r.step == step and r.kind in kinds]

    def kernels_per_layer(self, step: int) -> Counter:
        """{layer: launches} for one step (None = outside the layer stack)."""
        return Counter(r.layer for r in self.for_step(step))

    def table(self, step: int) -> list[dict]:
        """One row per launch of `step`: what a notebook shows as a table."""
        return [{"#": i, "kernel": r.kernel, "layer": "-" if r.layer is None else r.layer,
                 "grid": r.grid, "block": r.block, "stream": r.stream, "kind": r.kind,
                 "args": ", ".join(f"{n}={p}" for n, p in r.args)}
                for i, r in enumerate(self.for_step(step))]


def instrumentation_overhead_us(n: int = 20000, launch: Launch | None = None) -> float:
    """Microseconds one `LaunchLog.record` call costs (the mean over `n` calls on a fresh log):
    what logging adds to every timed launch. `launch` defaults to an rmsnorm launch on host-only
    Buffers (nothing is allocated: recording never looks at memory)."""
    if launch is None:
        from kernels import rmsnorm
        x, w, h = (Buffer(name, 0, (8,), np.dtype(np.float32)) for name in ("x", "w", "h"))
        launch = Launch(rmsnorm.rmsnorm, rmsnorm.RMSNORM_GRID, rmsnorm.RMSNORM_BLOCK,
                        (x, w, h, np.float32(1e-5)), 0)
    for _ in range(2):   # the first pass warms caches and the allocator; the second is timed
        log = LaunchLog()
        log.step = 0
        record = log.record
        t0 = time.perf_counter()
        for _ in range(n):
            record(launch, "eager")
        seconds = time.perf_counter() - t0
    return 1e6 * seconds / n


@dataclass(frozen=True)
class LaunchBill:
    """Launches per token and what each may cost, for one mode (eager or graph)."""
    mode: str
    kernels_per_layer: int
    layers: int
    other_kernels: int
    launches_per_token: int
    ms_per_token: float
    source: str               # "simulated" or "measured on <GPU, versions>"

    @property
    def us_per_launch(self) -> float:
        return 1000.0 * self.ms_per_token / self.launches_per_token


def launch_bill(log: LaunchLog, step: int, mode: str, ms_per_token: float, source: str) -> LaunchBill:
    per_layer = log.kernels_per_layer(step)
    layers = sorted(k for k in per_layer if k is not None)
    counts = {per_layer[k] for k in layers}
    if len(counts) > 1:
        raise ValueError(f"layers issue different launch counts: {dict(per_layer)}")
    kpl = counts.pop() if counts else 0
    other = per_layer.get(None, 0)
    return LaunchBill(mode, kpl, len(layers), other, kpl * len(layers) + other, ms_per_token, source)
