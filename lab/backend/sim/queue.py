"""The simulated device's queues and scheduler: issued work waits with its dependencies until
something needs its results, then runs in an order the dependencies allow (`order`).

  TimelineEvent      one kernel that ran: host submit window, device start and end (model us)
  Clock              what the ranks of one process share: the host thread's clock, work ids
  Work               one item on the queues, issued but not yet run
  Scheduler          enqueue eager work and graph replays; run what is queued; timeline, races
  dependents, pick   the queued work's graph and the order rule (SimRanks runs them too)
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from lab.errors import DeviceFault
from lab.pdl_check import pre_wait_reads
from ..base import Buffer, Collective, Launch, RawArray
from ..costmodel import launch_context


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
class Clock:
    """What the ranks of one process share: the host thread's clock, and work ids (unique
    across ranks, so one run can order every rank's queued work)."""
    host_us: float = 0.0
    ids: int = 0


@dataclass
class Work:
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
    prev: Launch | None = None    # the kernel before it on its stream (a switch costs)
    early: Launch | None = None   # its programmatic predecessor (PDL), for the pre-wait rule
    early_id: int | None = None
    join: bool = False     # waits on another stream's work: pays the fork/join cost
    seq: int | None = None  # a collective: its rank's collective count before it (NCCL's match)


class Scheduler:
    """One simulated device's queues and the scheduler that runs them. Built from what it reads:
    the cost model, the order rule and its generator, the generator of the per-node noise,
    the host clock shared by a group's ranks, and the device memory (`resolve(buf)`)."""

    def __init__(self, cost, order: str, clock: Clock, memory, rng: np.random.Generator,
                 order_rng: np.random.Generator):
        self.cost, self.order, self.clock, self.memory = cost, order, clock, memory
        self.rng, self.order_rng = rng, order_rng
        self.timeline: list[TimelineEvent] = []      # every kernel that ran
        self.races: list[str] = []                   # PDL races seen (pre-wait reads)
        self.coll_seq = 0                            # collectives this device has enqueued
        self._work: dict[int, Work] = {}              # issued work not yet run
        self._end: dict[int, float] = {}              # device end time of work that has run
        self._stream_of: dict[int, str] = {}
        self._tail: dict[str, tuple] = {}             # stream -> ids its next work waits for
        self._waits: dict[str, set] = {}              # stream -> event ids its next work waits for
        self._last: dict[str, tuple] = {}             # stream -> (id, launch) of its newest kernel
        self._fault: DeviceFault | None = None        # set by a kernel's illegal address: sticky

    # ---- enqueue -----------------------------------------------------------------------------
    def eager_deps(self, stream: str) -> tuple:
        """What eager work issued on `stream` now waits for: the stream's tail and its events."""
        return tuple(sorted(set(self._tail.get(stream, ())) | self._waits.pop(stream, set())))

    def newest(self, stream: str) -> tuple | None:
        """(id, item) of the newest work enqueued on `stream`, or None."""
        return self._last.get(stream)

    def wait(self, src: str, dst: str) -> None:
        """Stream `dst`'s next work waits for the work issued on `src` so far (an event)."""
        self._waits.setdefault(dst, set()).update(self._tail.get(src, ()))

    def enqueue(self, launch, deps, kind, host0, host1, lead, noise, pdl, prev, early,
                origin: str = "main") -> int:
        """Queue one launch or collective after the work ids `deps`; its id."""
        self.raise_fault()                  # a launch after a fault fails too, as on a GPU
        i = self.clock.ids
        self.clock.ids += 1
        st = launch.stream
        seq = None
        if isinstance(launch, Collective):
            seq, self.coll_seq = self.coll_seq, self.coll_seq + 1
        if isinstance(prev, Collective):
            prev = None                     # a kernel after a collective: no switch cost known
        # a join: work on the origin stream waits for another stream's (the pair's one cost)
        join = False
        if st == origin:
            stream_of = self._stream_of
            for d in deps:
                if stream_of.get(d, st) != st:
                    join = True
                    break
        self._work[i] = Work(i, launch, deps, kind, host0, host1, lead, noise, pdl, prev,
                             early[1] if early else None, early[0] if early else None, join, seq)
        self._stream_of[i] = st
        self._tail[st] = (i,)
        self._last[st] = (i, launch)
        return i

    def enqueue_graph(self, graph, stream: str, host0: float, host1: float, lead0: float) -> None:
        """Queue a graph's nodes (`nodes`, `deps`, `pdl`, `node_pdl`) with its edges, submitted
        by the host in [host0, host1]; `lead0`: the device's delay before its first nodes."""
        before = self.eager_deps(stream)
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
            ids.append(self.enqueue(node, mapped if deps else before, "graph", host0, host1, lead,
                                    self.cost.node_noise(self.rng), pdl, prev, early, stream))
            sinks.add(ids[-1])
            sinks.difference_update(mapped)
            last_on[node.stream] = ids[-1]
        for st in last_on:                   # work issued after the replay waits for all of it
            self._tail.pop(st, None)
        self._tail[stream] = tuple(sorted(sinks))

    # ---- run, in an order the dependencies allow -----------------------------------------------
    def take(self) -> dict[int, Work]:
        """The queued work, removed from the queues (to be run by the caller)."""
        work, self._work = self._work, {}
        return work

    def run(self) -> None:
        """Run every queued kernel: a topological order of their dependencies, chosen by
        `order`; under PDL, snapshot what a dependent reads before its wait."""
        self.raise_fault()
        work = self.take()
        if not work:
            return
        children, indeg, ready = dependents({i: w.deps for i, w in work.items()})
        watch: dict[int, list[Work]] = {}       # predecessor id -> PDL dependents reading early
        for w in work.values():
            if w.early_id in work and pre_wait_reads(w.launch.kernel):
                watch.setdefault(w.early_id, []).append(w)
        early_views: dict[int, dict] = {}
        while ready:
            i = pick(ready, self.order, self.order_rng)
            for dep in watch.get(i, ()):        # it started as i started: i's inputs, not outputs
                if self.order == "adversarial" or (
                        self.order == "random" and self.order_rng.random() < 0.5):
                    early_views[dep.id] = self._snapshot(dep.launch)
            self.execute(work[i], early_views.pop(i, None))
            for c in children.get(i, ()):
                indeg[c] -= 1
                if indeg[c] == 0:
                    heapq.heappush(ready, c)
        self.forget_finished()

    def forget_finished(self) -> None:
        """Drop the end times no later work can wait for."""
        keep = {d for t in self._tail.values() for d in t} | {
            d for ws in self._waits.values() for d in ws}
        self._end = {k: v for k, v in self._end.items() if k in keep}
        self._stream_of = {k: v for k, v in self._stream_of.items() if k in keep}

    def ready_at(self, w: Work) -> float:
        """When `w`'s dependencies that ran on this device ended (0: none)."""
        end, latest = self._end, None
        for d in w.deps:
            t = end.get(d)
            if t is not None and (latest is None or t > latest):
                latest = t
        return 0.0 if latest is None else latest

    def last_end(self, default: float) -> float:
        """The latest device end time of the work kept, or `default` when there is none."""
        return max(self._end.values(), default=default)

    def finish(self, w: Work, name: str, dev0: float, dev1: float) -> None:
        """Record that `w` ran on the device over [dev0, dev1]."""
        item = w.launch
        self._end[w.id] = dev1
        self.timeline.append(TimelineEvent(name, item.layer, item.stream, w.kind, w.host0,
                                           w.host1, dev0, dev1))

    def _snapshot(self, launch: Launch) -> dict:
        """Copies of what `launch` reads before its pdl_wait (arguments it does not write)."""
        out = {}
        for idx in pre_wait_reads(launch.kernel):
            a = launch.args[idx]
            a = a.buf if isinstance(a, RawArray) else a
            if isinstance(a, Buffer) and idx not in launch.kernel.writes:
                out[idx] = self.memory.resolve(a).copy()
        return out

    def execute(self, w: Work, early_view: dict | None) -> None:
        """Run one kernel's twin on the device memory and time it from the cost model."""
        launch = w.launch
        if w.early is not None:
            self._check_pdl(launch, w.early)
        arrays = self._arrays(launch)
        if early_view:
            arrays = [early_view.get(idx, a) for idx, a in enumerate(arrays)]
        context = launch_context(launch, arrays)
        try:
            launch.kernel.twin(launch.grid, launch.block, *arrays)
        except IndexError:   # an index outside its array: an illegal address on a GPU
            self._fault = DeviceFault(DeviceFault.ILLEGAL_ADDRESS)
            raise self._fault from None
        ready = self.ready_at(w)
        if w.join:
            ready += self.cost.join_us
        if w.kind == "graph":
            dev0 = max(ready, w.host1) + w.lead
            dev1 = dev0 + self.cost.node_us(launch, context, w.pdl, w.prev) * w.noise
        else:
            dev0 = max(ready, w.host1)
            dev1 = dev0 + self.cost.eager_us(launch, context, w.prev)
        self.finish(w, launch.name, dev0, dev1)

    def _arrays(self, launch: Launch) -> list:
        """The twin's arguments of `launch`: each buffer's view in this device's memory, the
        other arguments as given. Kept in the launch's `prepared` slot with the memory they
        resolve in: the same Launch objects run every step, and a view stays valid."""
        kept = launch.prepared.get("sim_arrays")
        if kept is not None and kept[0] is self.memory:
            return kept[1]
        arrays = []
        for a in launch.args:
            if isinstance(a, RawArray):
                a = a.buf
            if isinstance(a, Buffer):
                arrays.append(self.memory.resolve(a))
            elif isinstance(a, np.ndarray):
                raise TypeError(f"{launch.name}: host array passed as a kernel argument")
            else:
                arrays.append(a)
        launch.prepared["sim_arrays"] = (self.memory, arrays)
        return arrays

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
                self.races.append(f"PDL race: {launch.name} reads {a.label} before its pdl_wait, "
                                  f"while {prev.name} (its predecessor) writes it")

    def raise_fault(self) -> None:
        """After a kernel's illegal address every call on this device fails (a sticky error)."""
        if self._fault is not None:
            raise DeviceFault(f"{self._fault} (a sticky error: every call on this device fails "
                              f"since; build a new backend)")


def dependents(deps: dict[int, tuple]) -> tuple[dict, dict, list]:
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


def pick(ready: list[int], order: str, rng: np.random.Generator) -> int:
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
