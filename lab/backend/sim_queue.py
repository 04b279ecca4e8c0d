"""The simulated device's queues: issued work waits here, with its dependencies, until something
needs its results, and then runs in an order the dependencies allow (`order`: adversarial,
random or issue; lab/backend/sim.py says why). Timing comes from the cost model and does not
depend on the order.

`DeviceQueues` is the scheduler half of `SimBackend` (which owns memory, captures and issue):
enqueue eager work and graph replays, run what is queued (`_run_queued`), keep the timeline and
the PDL races. It expects from its subclass: `cost`, `order`, `pdl`, `_rng`, `_order_rng`,
`_shared` (the host clock and work ids, shared by the ranks of a group), `_resolve` and, for a
rank, `group` (whose `run_queued` runs every rank's work together).
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from kernels.loop import loop_continue_twin, loop_plan_twin

from lab.errors import DeviceFault, LabError
from lab.pdl_check import pre_wait_reads
from .base import Buffer, Collective, Launch, RawArray
from .costmodel import launch_context

if TYPE_CHECKING:
    from .sim import SimGraph, SimLoopGraph


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



class DeviceQueues:
    """The device's queues and the scheduler that runs them (a mixin of SimBackend)."""

    def _init_queues(self) -> None:
        # the device's queues: issued work not yet run, and what later work waits for
        self._work: dict[int, _Work] = {}
        self._end: dict[int, float] = {}              # device end time of work that has run
        self._stream_of: dict[int, str] = {}
        self._tail: dict[str, tuple] = {}             # stream -> ids its next work waits for
        self._waits: dict[str, set] = {}              # stream -> event ids its next work waits for
        self._last: dict[str, tuple] = {}             # stream -> (id, launch) of its newest kernel
        self._fault: DeviceFault | None = None        # set by a kernel's illegal address: sticky

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

    # ---- execution: enqueue ----------------------------------------------------------------
    def _eager_deps(self, stream: str) -> tuple:
        """What eager work issued on `stream` now waits for: the stream's tail and its events."""
        return tuple(sorted(set(self._tail.get(stream, ())) | self._waits.pop(stream, set())))

    def _enqueue(self, launch, deps, kind, host0, host1, lead, noise, pdl, prev, early,
                 origin: str = "main") -> int:
        self._raise_fault()                 # a launch after a fault fails too, as on a GPU
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

    def _replay(self, graph: SimGraph, stream: str) -> None:
        if self._captures:
            self._offend("graph launch during capture")
        host0 = self.host_us
        self.host_us += self.cost.graph_submit(self._rng) * self._host_speed()
        self._enqueue_graph(graph, stream, host0, self.cost.graph_launch_us)
        self._wait_if_blocking("a graph")

    def _enqueue_graph(self, graph: SimGraph, stream: str, host0: float, lead0: float) -> None:
        """Queue a graph's nodes with its edges, submitted by the host in [host0, host_us];
        `lead0`: the device's delay before the graph's first nodes."""
        before = tuple(sorted(set(self._tail.get(stream, ())) | self._waits.pop(stream, set())))
        ids: list[int] = []
        last_on: dict[str, tuple] = {}
        sinks = set()
        node_pdl = getattr(graph, "node_pdl", None) or (graph.pdl,) * len(graph.nodes)
        for node, deps, programmatic in zip(graph.nodes, graph.deps, node_pdl):
            mapped = tuple(ids[d] for d in deps)
            same = [d for d in deps if graph.nodes[d].stream == node.stream]
            pdl = programmatic and bool(same) and not isinstance(node, Collective)
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
        self._raise_fault()
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
        try:
            launch.kernel.twin(launch.grid, launch.block, *arrays)
        except IndexError:   # an index outside its array: an illegal address on a GPU
            self._fault = DeviceFault(DeviceFault.ILLEGAL_ADDRESS)
            raise self._fault from None
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

    def _raise_fault(self) -> None:
        if self._fault is not None:
            raise DeviceFault(f"{self._fault} (a sticky error: every call on this device fails "
                              f"since; build a new backend)")

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


def _overlap(a: Buffer, b: Buffer) -> bool:
    return a.ptr < b.ptr + b.nbytes and b.ptr < a.ptr + a.nbytes
