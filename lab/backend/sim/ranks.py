"""Simulated ranks (LAB_RANKS=2 on the simulator).

  SimRanks   one SimBackend per rank (own memory, streams, queues), one host thread and clock;
             collectives matched by order as NCCL does, timed from data/gpu/ranks.json
"""
from __future__ import annotations

import heapq
from contextlib import contextmanager

import numpy as np

from lab.errors import CollectiveError, LabError
from ..base import Collective
from ..costmodel import CollectiveCosts, CostModel
from .device import SimBackend
from .queue import Clock, dependents, pick


class SimRanks:
    """`ranks` simulated devices driven by one host thread, with NCCL's collectives among them
    (LAB_RANKS=2 on the simulator). `backends[r]` is rank r's device: its own memory, streams,
    queues and graphs; the host clock and work ids are shared. Collectives run in
    `run_queued`, which runs every rank's queued work together: a collective runs when every
    rank's collective of the same sequence number is ready, and a mismatch, or a rank left
    waiting, raises CollectiveError naming each rank's position (where NCCL would hang)."""

    simulated = True
    name = "sim"

    def __init__(self, ranks: int, cost: CostModel | None = None, seed: int = 0,
                 order: str = "adversarial", coll_cost: CollectiveCosts | None = None):
        if ranks < 1:
            raise LabError(f"ranks must be at least 1, not {ranks}")
        self.ranks = ranks
        self.host = Clock()              # the host thread's clock and work ids, shared
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
            self.host.host_us = max(self.host.host_us, b.queue.last_end(self.host.host_us))
        return self.host.host_us * 1e-6

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
            for i, w in b.queue.take().items():
                work[i] = (b, w)
        if not work:
            return
        children, indeg, ready = dependents({i: w.deps for i, (_, w) in work.items()})
        parked: dict[int, dict[int, int]] = {}     # sequence number -> {rank: work id}
        done: set[int] = set()

        def release(i):
            done.add(i)
            for c in children.get(i, ()):
                indeg[c] -= 1
                if indeg[c] == 0:
                    heapq.heappush(ready, c)

        while ready:
            i = pick(ready, self.order, self._order_rng)
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
                b.queue.execute(w, None)
                release(i)
        if parked or len(done) < len(work):
            raise CollectiveError(self._deadlock(parked, work, done))
        for b in self.backends:
            b.queue.forget_finished()

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
        sends = [b.memory.resolve(c.send).copy() for (b, _), c in zip(parts, colls)]
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
            b.memory.resolve(c.recv)[...] = o.reshape(c.recv.shape)
        start = 0.0
        for b, w in parts:
            ready = b.queue.ready_at(w)
            start = max(start, ready, w.host1)
        start += max(w.lead for _, w in parts)
        us = self.coll_cost.device_us(colls[0], graph=parts[0][1].kind == "graph")
        for (b, w), c in zip(parts, colls):
            b.queue.finish(w, c.op, start, start + us)

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
                lines.append(f"rank {b.rank} issued {b.queue.coll_seq} collectives in all and never "
                             f"reaches collective #{min(parked) if parked else '?'}"
                             + (f" ({left} of its queued items cannot run)" if left else
                                " (its queued work ran to the end)"))
        return ("deadlock: " + "; ".join(lines) + ". On a GPU pair NCCL would wait for ever "
                "(every rank must issue the same collectives in the same order)")
