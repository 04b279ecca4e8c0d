"""The CPU simulator backend: CUDA's semantics for memory, streams, launches and graphs.

  SimBackend   memory (memory.Arena), captures (graph.Captures), issue onto the queues
               (queue.Scheduler), graph replays and the device loop, the host's model clock

Kernels run as their NumPy twins, but not when they are issued: issued work waits with its
dependencies until something needs its results, then runs in an ORDER CHOSEN ADVERSARIALLY
among those its dependencies allow (`order`: by default the newest ready work first, so a
consumer whose dependency is missing runs before its producer, as a race would on a GPU;
"random" a seeded random order; "issue" issue order). Under PDL a kernel's reads before its
`pdl_wait` see its predecessor's inputs, and such a read of memory the predecessor writes is
reported in `races`. Capture is GLOBAL mode: a synchronize, a synchronous copy or an allocation
while a capture is open fails at the call and invalidates the capture (`end_capture` names the
first offence); the stream stays usable. Time comes from `CostModel` (measured costs): the host
pays per launch, per graph launch and per engine step; the device runs each kernel for its
measured time; the timing does not depend on the execution order.
"""
from __future__ import annotations

import numpy as np

from kernels.loop import loop_continue_twin, loop_plan_twin

from lab.errors import LabError
from ..base import Backend, Buffer, Collective, Launch, RawArray
from ..costmodel import CostModel
from . import memory
from .graph import Captures, SimGraph, SimLoopGraph
from .queue import Clock, Scheduler, TimelineEvent

ORDERS = ("adversarial", "random", "issue")


class SimBackend(Backend):
    name = "sim"
    simulated = True

    def __init__(self, cost: CostModel | None = None, seed: int = 0, order: str = "adversarial",
                 group=None, rank: int = 0):
        super().__init__()
        # a rank of a group (SimRanks: its `host` clock, `coll_cost`, `run_queued`), or a lone device
        self.group, self.rank = group, rank
        self.host = group.host if group is not None else Clock()
        if order not in ORDERS:
            raise LabError(f"order={order!r} is not allowed; use one of {', '.join(ORDERS)}")
        self.cost = cost or CostModel.load()
        self.order = order
        self._rng = np.random.default_rng(seed)       # costs: jitter and drift, per seed
        self.memory = memory.Arena()
        self.queue = Scheduler(self.cost, order, self.host, self.memory, self._rng,
                               np.random.default_rng([seed, 1]))   # execution order ("random")
        self.captures = Captures()
        self._compiled: set[str] = set()
        self._speed, self._speed_until = 1.0, 0.0     # host drift (CostModel.host_speed)

    @property
    def host_us(self) -> float:
        """Model time of the host thread (one thread drives every rank of a group)."""
        return self.host.host_us

    @host_us.setter
    def host_us(self, value: float) -> None:
        self.host.host_us = value

    @property
    def timeline(self) -> list[TimelineEvent]:
        """Every kernel that ran, with host and device times (runs what is still queued)."""
        self.run_queued()
        return self.queue.timeline

    @property
    def races(self) -> list[str]:
        """PDL races seen so far (runs what is still queued)."""
        self.run_queued()
        return self.queue.races

    def describe(self) -> str:
        return f"simulated (CPU simulator; {self.cost.describe()})"

    def _host_speed(self) -> float:
        """The host-speed factor now: redrawn every cost.drift_us of model time."""
        if self.host_us >= self._speed_until:
            self._speed = self.cost.host_speed(self._rng)
            self._speed_until = self.host_us + self.cost.drift_us
        return self._speed

    def _charge(self, us: float) -> None:
        """The host thread spends `us` of model time (scaled by its drift)."""
        self.host_us += us * self._host_speed()

    # ---- capture -----------------------------------------------------------------------------
    def is_capturing(self, stream: str = "main") -> bool:
        return self.captures.of(stream) is not None

    def abort_capture(self) -> None:
        self.captures.open.clear()
        self._issued = 0

    def begin_capture(self, stream: str = "main") -> None:
        self.captures.begin(stream)
        self._issued = 0

    def instantiate(self, source: SimGraph) -> SimGraph:
        self._charge(self.cost.instantiate_host_us(len(source.nodes)))
        return SimGraph(self, source.nodes, source.deps, pdl=source.pdl, node_pdl=source.node_pdl)

    def end_capture(self, stream: str = "main", instantiate: bool = True) -> SimGraph:
        cap = self.captures.end(stream)
        # the host's time to capture (and instantiate) the graph, as measured (floors.capture)
        self._charge(self.cost.capture_host_us(len(cap.nodes)))
        if instantiate:
            self._charge(self.cost.instantiate_host_us(len(cap.nodes)))
        return SimGraph(self, cap.nodes, cap.deps, pdl=self.pdl, executable=instantiate,
                        node_pdl=cap.programmatic)

    # ---- memory ------------------------------------------------------------------------------
    def alloc(self, name, shape, dtype, init="zeros") -> Buffer:
        self._op("allocation", name)
        self.captures.offend(f"allocation of {name!r} during capture")
        return self.memory.alloc(name, shape, dtype, init)

    def upload(self, buf, host) -> None:
        self._op("upload", buf.label)
        self.captures.offend(f"synchronous host-to-device copy into {buf.label}")
        self.run_queued()                   # a synchronous copy waits for the queued work
        host = np.asarray(host)
        if host.shape != buf.shape:
            raise ValueError(f"upload to {buf.label}: shape {host.shape} != {buf.shape}")
        self.memory.resolve(buf)[...] = host.astype(buf.dtype, copy=False)

    def download(self, buf) -> np.ndarray:
        self._op("download", buf.label)
        self.captures.offend(f"synchronous device-to-host copy from {buf.label}")
        self.run_queued()
        return self.memory.resolve(buf).copy()

    # views: pure functions of the buffer (a new pointer into the same bytes)
    row, rows = staticmethod(memory.row), staticmethod(memory.rows)
    reshape, view_as = staticmethod(memory.reshape), staticmethod(memory.view_as)

    def pool_bytes(self) -> int:
        return self.memory.pool_bytes()

    # ---- issue -------------------------------------------------------------------------------
    def warm_up(self, kernels) -> None:
        # twins need no compilation; remember what a GPU would have compiled and loaded here
        self._compiled.update(spec.name for spec in kernels)

    def host_step(self, mode: str) -> None:
        """The engine's own host work for one step (plan, ledger, issue loop): measured cost."""
        super().host_step(mode)
        self._charge(self.cost.engine_step(mode))

    def launch(self, launch: Launch) -> None:
        # lazy compile + module load: the H200's driver (13.0) allowed it in a capture; older
        # drivers may refuse a module load there, which is one more reason to warm up
        if launch.name not in self._compiled:
            self._op("compilation", launch.name)
            self._compiled.add(launch.name)
        raw = launch.prepared.get("sim_raw")
        if raw is None:                  # the raw arguments, found once per Launch (frozen)
            raw = launch.prepared["sim_raw"] = tuple(a for a in launch.args
                                                     if isinstance(a, RawArray))
        for a in raw:                    # numba synchronises the array's stream before launching
            self._op("array-interface sync", a.label)
            self.captures.offend(f"array-interface synchronisation of raw argument {a.buf.label} "
                                 f"for {launch.name} (cudaErrorStreamCaptureIsolation)")
        cap = self.captures.of(launch.stream)
        if cap is None and self.captures:
            self.captures.offend(f"launch of {launch.name} on stream {launch.stream!r}, which is not "
                         f"part of the open capture")
        if self.log is not None:
            self.log.record(launch, "capture" if cap else "eager")
        self._issued += 1
        if cap is not None:
            cap.record(launch, self.pdl)
            return
        host0 = self.host_us
        self._charge(self.cost.host_launch(launch, self.mechanism, self._rng))
        st = launch.stream
        deps = self.queue.eager_deps(st)
        last = self.queue.newest(st)
        self.queue.enqueue(launch, deps, "eager", host0, self.host_us, 0.0, 1.0, self.pdl,
                           last[1] if last else None, last if self.pdl else None)
        self._wait_if_blocking(launch.name)

    def record_wait(self, src: str, dst: str) -> None:
        """Record an event on `src` and make `dst` wait for it (fork or join)."""
        cap = self.captures.of(src)
        if cap is not None:
            cap.wait(src, dst)
            return
        if self.captures.of(dst) is not None:
            self.captures.offend(f"capturing stream {dst!r} waits on an event of stream {src!r} "
                         f"outside the capture (cudaErrorStreamCaptureIsolation)")
        self.queue.wait(src, dst)

    def collective(self, coll: Collective) -> None:
        """Issue one collective: into the open capture as a node, or onto the queue, where it
        waits for the matching collective of every other rank (SimRanks.run_queued)."""
        if self.group is None:
            super().collective(coll)
        cap = self.captures.of(coll.stream)
        if cap is None and self.captures:
            self.captures.offend(f"{coll.op} on stream {coll.stream!r}, which is not part of the open capture")
        if cap is not None:
            cap.record(coll)
            return
        host0 = self.host_us
        self._charge(self.group.coll_cost.host_us(coll))
        self.queue.enqueue(coll, self.queue.eager_deps(coll.stream), "eager", host0, self.host_us,
                           0.0, 1.0, False, None, None)

    # ---- graphs and the device loop ------------------------------------------------------------
    def replay(self, graph: SimGraph, stream: str) -> None:
        """Launch `graph`: one host submit, then its nodes queued with its edges."""
        if self.captures:
            self.captures.offend("graph launch during capture")
        host0 = self.host_us
        self._charge(self.cost.graph_submit(self._rng))
        self.queue.enqueue_graph(graph, stream, host0, self.host_us, self.cost.graph_launch_us)
        self._wait_if_blocking("a graph")

    def build_loop(self, bodies: int, issue_body, pos: Buffer, plan_of: Buffer,
                   limit: Buffer) -> SimLoopGraph:
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

    def run_loop(self, loop: SimLoopGraph, stream: str) -> None:
        """One host submit; then the device alone decides: each iteration runs the body that
        plan_of[pos] names, then continues while pos < limit. Each iteration pays the measured
        cost of the loop's machinery (floors.loop.overhead_us) before its body."""
        if self.captures:
            self.captures.offend("graph launch during capture")
        host0 = self.host_us
        self._charge(self.cost.graph_submit(self._rng))
        lead = self.cost.graph_launch_us
        while True:
            self.run_queued()        # the device's memory as the condition kernel reads it
            k = loop_plan_twin(self.memory.resolve(loop.pos), self.memory.resolve(loop.plan_of))
            if not 0 <= k < len(loop.bodies):
                raise LabError(f"device loop: plan_of[pos] = {k} names no body (SWITCH runs none)")
            self.queue.enqueue_graph(loop.bodies[k], stream, host0, self.host_us,
                                     lead + self.cost.loop_iteration_us())
            lead = 0.0
            loop.runs[k] += 1
            self.run_queued()
            if not loop_continue_twin(self.memory.resolve(loop.pos), self.memory.resolve(loop.limit)):
                break

    # ---- run what is queued --------------------------------------------------------------------
    def run_queued(self) -> None:
        """Run the queued work; a rank of a group runs every rank's together (collectives
        need all of them)."""
        if self.group is not None:
            self.group.run_queued()
        else:
            self.queue.run()

    def synchronize(self) -> None:
        if self.captures:
            self._op("synchronize", "device")
        self.captures.offend("device synchronize during capture")
        self.run_queued()
        self.host_us = max(self.host_us, self.queue.last_end(self.host_us))

    def clock(self) -> float:
        self.synchronize()
        return self.host_us * 1e-6
