"""The launch log: every launch the engine issues, with kernel, layer, grid, block and every
argument with its provenance (a buffer name + offset, or a value passed by value).

Eager launches and captured launches are recorded as they are issued; a graph replay is one
record of kind "replay" naming the graph and its node count. From the log: launches per layer,
launches per token, and the launch bill (per-launch budget = step time / launches).
"""
from __future__ import annotations

import inspect
from collections import Counter
from dataclasses import dataclass, field

from .backend.base import Buffer, Launch, RawArray


def arg_names(kernel) -> list[str]:
    return list(inspect.signature(kernel.py_func).parameters)


def provenance(value) -> str:
    if isinstance(value, (Buffer, RawArray)):
        return value.label
    return f"value {value!r}"


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


@dataclass
class LaunchLog:
    records: list[LaunchRecord] = field(default_factory=list)
    step: int | None = None   # set by the engine before each step

    def record(self, launch: Launch, kind: str) -> None:
        names = arg_names(launch.kernel)
        args = tuple((n, provenance(v)) for n, v in zip(names, launch.args))
        self.records.append(LaunchRecord(len(self.records), self.step, kind, launch.name,
                                         launch.layer, tuple(launch.grid), tuple(launch.block),
                                         launch.stream, args))

    def record_replay(self, key, nodes: int, stream: str = "main") -> None:
        self.records.append(LaunchRecord(len(self.records), self.step, "replay", f"graph{key}",
                                         None, (), (), stream, (), nodes))

    def clear(self) -> None:
        self.records.clear()

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
