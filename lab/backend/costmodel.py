"""The simulator's cost model: how long a launch takes on the host and on the device.

Every constant is calibrated from measurements on the project's H200 (see the FACTS recorded
with the project's GPU results) and every figure the simulator produces is labelled "simulated".
The model is deliberately simple: a host pays a submit cost per eager launch (or one per graph
launch); a kernel occupies its stream for a fixed floor plus the bytes it touches over an
effective bandwidth; host submit costs carry jitter, eager far more than graph replays.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class CostModel:
    eager_submit_us: float = 27.0   # numba dispatcher launch, arrays pre-wrapped (H200 host)
    graph_submit_us: float = 2.8    # host cost of one cudaGraphLaunch
    node_us: float = 0.91           # device cost per dependent node in a replayed graph
    eager_gap_us: float = 2.0       # device-side launch latency between eager kernels
    bandwidth_gbs: float = 3000.0   # effective HBM bandwidth for small decode kernels
    eager_jitter: float = 0.12      # relative sd of an eager submit (lognormal sigma)
    eager_spike_p: float = 0.004    # chance that one eager submit stalls (preemption, GC, ...)
    eager_spike_us: float = 60.0
    graph_jitter: float = 0.02      # relative sd of a graph submit / node

    def kernel_us(self, nbytes: int) -> float:
        return nbytes / (self.bandwidth_gbs * 1e3)

    def eager_submit(self, rng: np.random.Generator) -> float:
        us = self.eager_submit_us * rng.lognormal(0.0, self.eager_jitter)
        if rng.random() < self.eager_spike_p:
            us += self.eager_spike_us * rng.exponential()
        return us

    def graph_submit(self, rng: np.random.Generator) -> float:
        return self.graph_submit_us * rng.lognormal(0.0, self.graph_jitter)

    def node(self, rng: np.random.Generator) -> float:
        return self.node_us * rng.lognormal(0.0, self.graph_jitter)
