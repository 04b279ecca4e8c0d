"""The simulator's cost model: how long a launch takes on the host and on the device.

The constants come from measurements on the project's H200 (the files in data/gpu/, and the
launch-cost facts measured when the project started); each says where it came from. Every
figure the simulator produces is labelled "simulated".
The model is deliberately simple: a host pays a submit cost per eager launch (or one per graph
launch); a kernel occupies its stream for a fixed floor plus the bytes it touches over an
effective bandwidth; host submit costs carry jitter, eager far more than graph replays.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class CostModel:
    # H200 measurements in data/gpu/ (numba-cuda 0.30.4, CuPy 14.2, the real engine, 2026-11-29):
    # decode_eager_vs_graph.json: eager 3.77 ms/token for 37 launches = 102 us of host time per
    # numba launch (the eager runs in gpu_run.log span 3.0 to 5.9 ms/token: the host's speed
    # moves between runs); graph replay 0.123 ms/token for 37 nodes, (123 - 2.8) / 37 = 3.3 us
    # per node, kernel time included.
    eager_submit_us: float = 100.0  # numba dispatcher launch, arrays pre-wrapped (H200 host)
    graph_submit_us: float = 2.8    # host cost of one cudaGraphLaunch (measured, 1000-node graph)
    # PDL hides part of each dependent node's gap: pdl.json, 0.1284 -> 0.1109 ms/token for 37
    # nodes, i.e. 0.47 us of 3.3 saved per node (factor 0.86). (A 100-kernel chain of empty
    # kernels went 1.13 -> 0.84 us per kernel, factor 0.74: the gap shrinks more when there
    # is less work per node.)
    pdl_gap_factor: float = 0.86
    node_us: float = 3.3            # device cost per dependent node in a replayed graph
    eager_gap_us: float = 2.0       # device-side launch latency between eager kernels
    bandwidth_gbs: float = 3000.0   # effective HBM bandwidth for small decode kernels
    eager_jitter: float = 0.12      # relative sd of an eager submit (lognormal sigma)
    eager_spike_p: float = 0.004    # chance that one eager submit stalls (preemption, GC, ...)
    eager_spike_us: float = 60.0
    graph_jitter: float = 0.02      # relative sd of a graph submit / node
    # Slow host drift (clock boost, other processes): a host-speed factor, lognormal with sigma
    # host_drift, redrawn every host_drift_us of model time. It scales host submits only, so it
    # moves host-bound eager runs rep to rep and leaves device-bound graph replays alone: why
    # captured arms show far smaller standard errors. Magnitudes assumed, not yet measured.
    host_drift: float = 0.03
    host_drift_us: float = 20_000.0

    def kernel_us(self, nbytes: int) -> float:
        return nbytes / (self.bandwidth_gbs * 1e3)

    def eager_submit(self, rng: np.random.Generator) -> float:
        us = self.eager_submit_us * rng.lognormal(0.0, self.eager_jitter)
        if rng.random() < self.eager_spike_p:
            us += self.eager_spike_us * rng.exponential()
        return us

    def graph_submit(self, rng: np.random.Generator) -> float:
        return self.graph_submit_us * rng.lognormal(0.0, self.graph_jitter)

    def host_speed(self, rng: np.random.Generator) -> float:
        """A new host-speed factor (multiplies host submit costs until the next redraw)."""
        return float(rng.lognormal(0.0, self.host_drift)) if self.host_drift > 0 else 1.0

    def node(self, rng: np.random.Generator) -> float:
        return self.node_us * rng.lognormal(0.0, self.graph_jitter)
