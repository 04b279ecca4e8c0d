"""The CPU simulator backend: CUDA's semantics for memory, streams, launches and graphs.

  ranks.py    SimRanks: one simulated device per rank, NCCL's collectives among them
  device.py   SimBackend: memory, captures, issue, replays, the device loop, the host clock
  graph.py    SimGraph, SimLoopGraph, Capture (an open capture's nodes and edges)
  queue.py    Scheduler: queued work, the order it runs in, the timeline and PDL races
  memory.py   Arena: segments at real addresses; row / rows / reshape / view_as views
"""
from .device import ORDERS, SimBackend
from .graph import SimGraph, SimLoopGraph
from .queue import TimelineEvent
from .ranks import SimRanks

__all__ = ["ORDERS", "SimBackend", "SimGraph", "SimLoopGraph", "SimRanks", "TimelineEvent"]
