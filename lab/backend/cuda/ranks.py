"""The cuda backend's ranks (LAB_RANKS=2): one GPU each, NCCL among them.

  CudaRanks        one CudaRankBackend per GPU of this host, NCCL communicators, one thread
  CudaRankBackend  a CudaBackend whose every call runs with its device current
  RankGraph        a rank's graph, released before its communicator goes
"""
from __future__ import annotations

import gc
import time

import numpy as np

from lab.config import nccl_env
from lab.errors import CaptureError
from .device import CudaBackend
from .graph import CudaGraph, RawExec


class RankGraph(CudaGraph):
    """A rank's executable graph (launched by its device, with the device current)."""

    def launch(self, stream: str = "main") -> None:
        if self.graph is None:
            raise RuntimeError("this rank graph was released")
        super().launch(stream)

    def release(self) -> None:
        """Destroy the graph now (before its communicator is destroyed: NCCL waits for the
        graphs that captured its collectives, and a communicator destroyed first can hang)."""
        if self.graph is not None:
            self.device.release_graph(self.graph)
            self.graph = None


class CudaRankBackend(CudaBackend):
    """The cuda backend of one rank: device `rank` of a CudaRanks group. Every call runs with
    that device current (CuPy's device and numba's context): a kernel handle, a stream and a
    graph belong to one device's context, and a launch from another device's fails."""

    def __init__(self, group: "CudaRanks", rank: int):
        self.group, self.rank = group, rank
        import cupy as cp
        from numba import cuda
        self._cp_device, self._nb_gpu = cp.cuda.Device(rank), cuda.gpus[rank]
        with self.on_device():
            super().__init__()

    def on_device(self):
        """A context with this rank's device current (CuPy's device and numba's context)."""
        from contextlib import ExitStack
        stack = ExitStack()
        stack.enter_context(self._cp_device)
        stack.enter_context(self._nb_gpu)
        return stack

    def warm_up(self, kernels) -> None:
        """Compile once per process (the dispatchers are shared), and load every overload's
        module into THIS device's context now, not at a first launch inside a capture."""
        with self.on_device():
            for spec in kernels:
                disp = self.launcher.compiled(spec.name) or self.launcher.compile(spec)
                for overload in disp.overloads.values():
                    overload._codelibrary.get_cufunc()

    def collective(self, coll) -> None:
        """One NCCL call on this rank's stream (the engine wraps the ranks' calls in a group)."""
        from cupy.cuda import nccl
        comm, n = self.group.comms[self.rank], coll.count
        st = self.streams[coll.stream].ptr
        dt = {np.dtype(np.float32): nccl.NCCL_FLOAT32, np.dtype(np.int32): nccl.NCCL_INT32}[
            np.dtype(coll.send.dtype)]
        if coll.op == "all_reduce":
            call = lambda: comm.allReduce(coll.send.ptr, coll.recv.ptr, n, dt, nccl.NCCL_SUM, st)
        elif coll.op == "all_gather":
            call = lambda: comm.allGather(coll.send.ptr, coll.recv.ptr, n, dt, st)
        else:
            call = lambda: comm.reduceScatter(coll.send.ptr, coll.recv.ptr, n // self.group.ranks,
                                              dt, nccl.NCCL_SUM, st)
        with self.on_device():
            self.capture.guard(f"{coll.op} ({coll.what})", call)

    def instantiate(self, source) -> CudaGraph:
        with self.on_device():
            raw = RawExec(source)
            raw.upload(self.stream)
            return RankGraph(self, raw)

    def release_graph(self, graph) -> None:
        """Destroy executable graph `graph` once this rank's work is done."""
        with self.on_device():
            self.synchronize()
            graph.destroy()


def _on_device_method(name):
    base = getattr(CudaBackend, name)

    def method(self, *args, **kwargs):
        with self.on_device():
            return base(self, *args, **kwargs)
    method.__name__, method.__doc__ = name, base.__doc__
    return method


for _name in ("describe", "compute_capability", "alloc", "upload", "download", "row", "rows",
              "reshape", "launch", "launch_graph", "record_wait", "synchronize", "clock", "is_capturing",
              "begin_capture", "end_capture", "abort_capture"):
    setattr(CudaRankBackend, _name, _on_device_method(_name))


class CudaRanks:
    """`ranks` GPUs of one host, one CudaRankBackend each, with NCCL communicators among them,
    driven by one thread. What the project's H200 pair showed (recorded in the lab's GPU
    facts): a collective captured in GLOBAL mode on every device's stream at once replays
    right; CuPy's end_capture instantiates at once, which fails while another device still
    captures, so every capture is ended (cudaStreamEndCapture) before any is instantiated
    (`end_captures`); and a process that exits with graphs and communicators alive can hang,
    so `close()` destroys them (also at exit)."""

    simulated = False
    name = "cuda"

    def __init__(self, ranks: int):
        import atexit

        nccl_env()                       # set before NCCL starts (lab/config.py says which)
        from cupy.cuda import nccl
        self.ranks = ranks
        self.backends = [CudaRankBackend(self, r) for r in range(ranks)]
        self.comms = nccl.NcclCommunicator.initAll(list(range(ranks)))
        self._closed = False
        atexit.register(self.close)

    def describe(self) -> str:
        return f"{self.backends[0].describe()}, {self.ranks} GPUs, NCCL {self.nccl_version()}"

    @staticmethod
    def nccl_version() -> str:
        from cupy.cuda import nccl
        v = nccl.get_version()
        return f"{v // 10000}.{v // 100 % 100}.{v % 100}"

    def collectives(self):
        """One NCCL group around every rank's matching collective (one thread drives all GPUs:
        without a group, the first rank's call could wait for the others')."""
        from contextlib import contextmanager

        from cupy.cuda import nccl

        @contextmanager
        def group():
            nccl.groupStart()
            try:
                yield
            finally:
                try:
                    nccl.groupEnd()           # where NCCL launches (or captures) the group
                except Exception as exc:
                    capturing = [b for b in self.backends if b.capture.active]
                    if not capturing:
                        raise
                    why = f"NCCL group during capture: {exc.__class__.__name__}: {exc}"
                    for b in capturing:
                        b.capture.offend(why)
                    raise CaptureError(why, why) from exc
        return group()

    def end_captures(self) -> list:
        """End every rank's capture (cudaStreamEndCapture), the last opened first (each restores
        the garbage collector to the state it found), before any is instantiated."""
        ended = [b.end_capture(instantiate=False) for b in reversed(self.backends)]
        return ended[::-1]

    def clock(self) -> float:
        for b in self.backends:
            b.synchronize()
        return time.perf_counter()

    def close(self) -> None:
        """Destroy the communicators once every rank's work is done (the engine drops its graphs
        first)."""
        if self._closed:
            return
        self._closed = True
        try:
            for b in self.backends:
                b.synchronize()
            gc.collect()                 # executable graphs still referenced nowhere go first
            for c in self.comms:
                c.destroy()
        except Exception:   # noqa: BLE001  (at exit: nothing left to report to)
            pass
