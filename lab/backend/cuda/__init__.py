"""The cuda backend: numba.cuda kernels on CuPy streams, CUDA graphs, NCCL between GPUs.
Importing it loads neither numba nor CuPy (a backend loads them when it is built).

  ranks.py     CudaRanks, CudaRankBackend, RankGraph: one GPU per rank, NCCL among them
  device.py    CudaBackend: memory, streams and events, capture, issue
  graph.py     CudaGraph, CudaGraphDef, RawExec, CudaLoopGraph, DeviceLoop (LAB_LOOP=device)
  launch.py    Launcher: compilation and the launch rungs (LAB_LAUNCH), cooperative checks
  capture.py   CaptureState (open capture, first offence, collector), cudart, check, is_fault
"""
from .device import CudaBackend
from .graph import CudaGraph, CudaGraphDef, CudaLoopGraph
from .launch import cooperative_limit, cooperative_refusal
from .ranks import CudaRankBackend, CudaRanks

__all__ = ["CudaBackend", "CudaGraph", "CudaGraphDef", "CudaLoopGraph", "CudaRankBackend",
           "CudaRanks", "cooperative_limit", "cooperative_refusal"]
