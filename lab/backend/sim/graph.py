"""The simulator's graphs and captures. A graph is launched by the device it was captured on
(`device.replay(graph, stream)`, `device.run_loop(loop, stream)`): it holds its nodes, edges
and edge types, and nothing of the device's state.

  SimGraph       a captured step: nodes (launches, collectives) in issue order, edges, PDL edges
  SimLoopGraph   WHILE (pos < limit) { SWITCH (plan_of[pos]) { bodies } }
  Capture        an open capture: the nodes recorded so far, per-stream tails, forks and joins
  Captures       the captures open on one device: begin, end, the capture of a stream, offend
"""
from __future__ import annotations

from dataclasses import dataclass, field

from lab.errors import CaptureError, LabError
from ..base import Collective, Graph, Launch, LoopGraph


class SimGraph(Graph):
    def __init__(self, device, nodes: list[Launch], deps=None, pdl: bool = False,
                 executable: bool = True, node_pdl=None):
        self._device = device              # what launches it: device.replay(self, stream)
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
        self._device.replay(self, stream)

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

    def __init__(self, device, bodies: list[SimGraph], pos, plan_of, limit):
        self._device = device              # what launches it: device.run_loop(self, stream)
        self.bodies = bodies
        self.pos, self.plan_of, self.limit = pos, plan_of, limit
        self.runs = [0] * len(bodies)      # times each body ran, over every launch

    @property
    def iterations(self) -> int:
        return sum(self.runs)

    def body_node_counts(self) -> list[int]:
        return [b.node_count for b in self.bodies]

    def launch(self, stream: str = "main") -> None:
        self._device.run_loop(self, stream)


@dataclass
class Capture:
    stream: str                                   # the origin stream
    nodes: list = field(default_factory=list)     # launches, in issue order (a topological order)
    deps: list = field(default_factory=list)      # per node: indices of the nodes it waits for
    programmatic: list = field(default_factory=list)  # per node: launched with PDL (its edge in)
    streams: set = field(default_factory=set)     # streams pulled into the capture
    last: dict = field(default_factory=dict)      # stream -> its newest node
    pending: dict = field(default_factory=dict)   # stream -> nodes its next node must wait for
    joined: set = field(default_factory=set)      # (stream, node) pairs joined back
    offence: str | None = None

    def record(self, item, programmatic: bool = False) -> None:
        """Append a launch or a collective, after its stream's newest node and the events its
        stream waits for (nothing once the capture is invalidated); `programmatic`: launched
        with PDL."""
        if self.offence is not None:
            return
        st = item.stream
        deps = set(self.pending.pop(st, set()))
        if st in self.last:
            deps.add(self.last[st])
        self.last[st] = len(self.nodes)
        self.nodes.append(item)
        self.deps.append(tuple(sorted(deps)))
        self.programmatic.append(programmatic)

    def wait(self, src: str, dst: str) -> None:
        """An event of captured stream `src` waited for by `dst`: a fork (pulls dst in) or a
        join (src's newest work ordered into dst)."""
        if src in self.last:
            self.pending.setdefault(dst, set()).add(self.last[src])
            if dst in self.streams:
                self.joined.add((src, self.last[src]))
        self.streams.add(dst)

    def check_end(self) -> None:
        """Raise CaptureError when the capture cannot end: invalidated, or unjoined work."""
        if self.offence is not None:
            raise CaptureError(f"capture invalidated (cudaErrorStreamCaptureInvalidated); "
                               f"first offence: {self.offence}", self.offence)
        for st in sorted(self.streams - {self.stream}):
            if st in self.last and (st, self.last[st]) not in self.joined:
                raise CaptureError(f"stream {st!r} was not joined back into {self.stream!r} "
                                   f"before end_capture (cudaErrorStreamCaptureUnjoined)",
                                   f"unjoined work on stream {st!r}")


class Captures:
    """The captures open on one device (global mode: one at a time, by its origin stream)."""

    def __init__(self):
        self.open: dict[str, Capture] = {}

    def __bool__(self) -> bool:
        return bool(self.open)

    def begin(self, stream: str) -> None:
        if self.open:
            raise CaptureError("a capture is already open")
        self.open[stream] = Capture(stream, streams={stream})

    def of(self, stream: str) -> Capture | None:
        """The open capture that `stream` belongs to (its origin, or forked into it)."""
        for cap in self.open.values():
            if stream in cap.streams:
                return cap
        return None

    def offend(self, what: str) -> None:
        """An operation illegal during a global-mode capture: invalidate and fail at the call."""
        if not self.open:
            return
        for cap in self.open.values():
            if cap.offence is None:
                cap.offence = what
        raise CaptureError(f"operation not permitted when stream is capturing: {what}", what)

    def end(self, stream: str) -> Capture:
        """The capture of origin `stream`, closed; CaptureError if it cannot end."""
        cap = self.open.pop(stream, None)
        if cap is None:
            raise CaptureError(f"stream {stream!r} is not capturing")
        cap.check_end()
        return cap
