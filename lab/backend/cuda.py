"""The `cuda` backend: numba.cuda kernels launched on a CuPy stream, captured into CUDA graphs.

- Buffers are CuPy arrays, each wrapped ONCE with `cuda.as_cuda_array(x, sync=False)`: a raw
  CuPy array passed to a numba launch synchronises through the array interface, which is
  illegal during capture (cudaErrorStreamCaptureIsolation) and costs time everywhere.
- Kernels are compiled eagerly from their explicit signatures in `warm_up()`, and their modules
  loaded, so that no compilation or module load happens in a timed region or a capture.
- Capture uses GLOBAL mode: CuPy's default (relaxed) lets unsafe calls run once at capture time
  and silently drop out of the graph.
- Two launch mechanisms (LAB_LAUNCH): `dispatcher` calls numba's dispatcher, which types and
  flattens the arguments on every launch (~34 us on the H200); `prebound` does that once per
  Launch object (a clean engine reuses them), keeps the result in `launch.prepared` and launches
  through `cuda.core.launch` (~5 us). PDL launches always go through cuda.core, since numba's
  dispatcher cannot set programmatic stream serialisation. A launch with a raw CuPy argument
  (LAB_BUG_RAW_ARRAY) always takes the dispatcher rung: the bug IS numba's synchronising wrap.
- Node counts and node types come from cuda-bindings on the CuPy graph's handle.

The launch rungs are lab/backend/cuda_launch.py (`CudaLaunches`), the graphs and the device loop
lab/backend/cuda_graph.py, the ranks (one GPU each, NCCL) lab/backend/cuda_ranks.py.
"""
from __future__ import annotations

import gc
import time

import numpy as np

from lab.errors import CaptureError, DeviceFault
from .base import Backend, Buffer
from .cuda_graph import CudaDeviceLoop, CudaGraph, CudaGraphDef, _check, _cudart, _RawExec
from .cuda_launch import CudaLaunches


class CudaBackend(CudaLaunches, CudaDeviceLoop, Backend):
    name = "cuda"
    simulated = False

    def __init__(self):
        super().__init__()
        import cupy as cp
        from numba import config as nb_config, cuda
        # decode grids are small on purpose (a few blocks per kernel): numba's low-occupancy
        # warning would fire on nearly every launch and say nothing new
        nb_config.CUDA_LOW_OCCUPANCY_WARNINGS = False
        from cuda.core import LaunchConfig, launch as core_launch   # numba-cuda's own launcher
        self.cp, self.nbcuda = cp, cuda
        self._LaunchConfig, self._core_launch = LaunchConfig, core_launch
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.streams = {"main": self.stream, "side": cp.cuda.Stream(non_blocking=True)}
        self._nbstreams = {k: cuda.external_stream(v.ptr) for k, v in self.streams.items()}
        # events for fork/join, created up front (no creation inside a capture), used round-robin
        self._events = [cp.cuda.Event(disable_timing=True) for _ in range(64)]
        self._next_event = 0
        self._overloads: dict = {}
        self._core_streams = {k: self._core_stream(k) for k in self.streams}
        self._compiled: dict[str, object] = {}       # what THIS backend has warmed up
        self._coop: dict[tuple, tuple] = {}          # (kernel, threads) -> cooperative_limits
        self._offence: str | None = None
        # whether begin_capture opened a capture: asked on every launch, and a Python flag
        # costs nothing where a runtime query per launch does (is_capturing() still asks)
        self._capturing = False
        self._loop_kernels = None   # LAB_LOOP=device: the condition kernels, compiled on first use
        self._gc_was_on = True      # the collector's state when the open capture began

    def describe(self) -> str:
        import cupy as cp
        import numba
        try:
            from importlib.metadata import version
            nbc = version("numba-cuda")
        except Exception:
            nbc = "?"
        props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
        name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        drv = cp.cuda.runtime.driverGetVersion()
        rt = cp.cuda.runtime.runtimeGetVersion()
        return (f"measured on {name} (sm_{props['major']}{props['minor']}), numba {numba.__version__}, "
                f"numba-cuda {nbc}, CuPy {cp.__version__}, driver {drv // 1000}.{drv % 1000 // 10}, "
                f"runtime {rt // 1000}.{rt % 1000 // 10}")

    def compute_capability(self) -> tuple[int, int]:
        return self.nbcuda.get_current_device().compute_capability

    # ---- capture errors ------------------------------------------------------------------------
    def _capture_guard(self, what, fn, *args, **kwargs):
        """Run fn; during a capture, turn a CUDA error into CaptureError naming the offence.
        `what` is the offence's description, or a function making it (only on a failure)."""
        if not self._capturing:
            try:
                return fn(*args, **kwargs)
            except Exception as exc:   # a kernel's illegal address, reported by a later call
                if _is_fault(exc):
                    raise DeviceFault(f"{DeviceFault.ILLEGAL_ADDRESS} ({exc})") from exc
                raise
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            what = what() if callable(what) else what
            if self._offence is None:
                self._offence = f"{what}: {exc.__class__.__name__}: {exc}"
            raise CaptureError(f"{what} failed during capture: {exc}", self._offence) from exc

    # ---- memory ------------------------------------------------------------------------------
    def _wrap(self, arr, name, offset=0) -> Buffer:
        dev = self.nbcuda.as_cuda_array(arr, sync=False)
        return Buffer(name, int(arr.data.ptr), tuple(arr.shape), np.dtype(arr.dtype), offset,
                      handle=(arr, dev))

    def alloc(self, name, shape, dtype, init="zeros") -> Buffer:
        cp = self.cp

        def make():
            with self.stream:
                return cp.zeros(shape, dtype) if init == "zeros" else cp.empty(shape, dtype)
        if init not in ("zeros", "empty"):
            raise ValueError(f"init must be 'zeros' or 'empty', not {init!r}")
        self._op("allocation", name)
        arr = self._capture_guard(f"allocation of {name!r}", make)
        return self._wrap(arr, name)

    def upload(self, buf, host) -> None:
        host = np.ascontiguousarray(host, dtype=buf.dtype)
        if host.shape != buf.shape:
            raise ValueError(f"upload to {buf.label}: shape {host.shape} != {buf.shape}")
        arr = buf.handle[0]
        self._op("upload", buf.label)

        def copy():
            arr.set(host, stream=self.stream)
            self.stream.synchronize()
        self._capture_guard(f"synchronous host-to-device copy into {buf.label}", copy)

    def download(self, buf) -> np.ndarray:
        arr = buf.handle[0]
        self._op("download", buf.label)

        def copy():
            out = arr.get(stream=self.stream)
            self.stream.synchronize()
            return out
        return self._capture_guard(f"synchronous device-to-host copy from {buf.label}", copy)

    def row(self, buf, index) -> Buffer:
        arr = buf.handle[0][int(index)]
        return self._wrap(arr, buf.name, int(arr.data.ptr) - buf.ptr + buf.offset)

    def rows(self, buf, start, stop) -> Buffer:
        arr = buf.handle[0][int(start):int(stop)]
        return self._wrap(arr, buf.name, int(arr.data.ptr) - buf.ptr + buf.offset)

    def reshape(self, buf, shape) -> Buffer:
        n = int(np.prod(shape))
        arr = buf.handle[0].ravel()[:n].reshape(shape)
        return self._wrap(arr, buf.name, buf.offset)

    def view_as(self, buf, dtype) -> Buffer:
        if np.dtype(dtype).itemsize != np.dtype(buf.dtype).itemsize:
            raise ValueError(f"view of {buf.label} as {np.dtype(dtype)}: element sizes differ")
        return self._wrap(buf.handle[0].view(np.dtype(dtype)), buf.name, buf.offset)

    def pool_bytes(self) -> int:
        return int(self.cp.get_default_memory_pool().used_bytes())

    # ---- execution ---------------------------------------------------------------------------
    def record_wait(self, src: str, dst: str) -> None:
        ev = self._events[self._next_event]
        self._next_event = (self._next_event + 1) % len(self._events)

        def fork_join():
            ev.record(self.streams[src])
            self.streams[dst].wait_event(ev)
        self._capture_guard(f"event {src} -> {dst}", fork_join)

    def synchronize(self) -> None:
        """Wait for every stream the engine uses (main and side), as the simulator does."""
        if self.is_capturing():
            self._op("synchronize", "stream")
        for st in self.streams.values():
            self._capture_guard("stream synchronize", st.synchronize)

    def clock(self) -> float:
        self.synchronize()
        return time.perf_counter()

    # ---- capture ----------------------------------------------------------------------------
    def is_capturing(self, stream: str = "main") -> bool:
        """The runtime's capture status of the stream: ACTIVE, or INVALIDATED by an earlier
        error (still capturing: the capture must be ended before the stream is usable again)."""
        cudart = _cudart()
        status = _check(cudart.cudaStreamIsCapturing(self.streams[stream].ptr))
        return int(status) != int(cudart.cudaStreamCaptureStatus.cudaStreamCaptureStatusNone)

    def begin_capture(self, stream: str = "main") -> None:
        if self.is_capturing():
            raise CaptureError("a capture is already open")
        self._open_capture(lambda: self.stream.begin_capture(
            mode=self.cp.cuda.runtime.streamCaptureModeGlobal))

    def _open_capture(self, begin) -> None:
        """Open a global-mode capture with `begin()`, with what every capture here shares: no
        offence yet, launches counted from 0, and the collector held off. (Global mode forbids
        unsafe CUDA calls from ANY thread while the capture is open, and Python's garbage
        collector may free an old graph exec or unload a module -- both unsafe -- at any moment.
        No gc.collect() first: on the H200 a full collection made each capture cost 166 ms
        instead of ~0.4 ms.)"""
        self._offence, self._issued = None, 0
        self._gc_was_on = gc.isenabled()
        gc.disable()
        try:
            begin()
        except Exception:
            self._restore_gc()
            raise
        self._capturing = True

    def _restore_gc(self) -> None:
        """The collector as it was when the capture began (a timed region may hold it off)."""
        if self._gc_was_on:
            gc.enable()

    def abort_capture(self) -> None:
        """End the capture with the runtime call itself (not through a failing wrapper), then
        restore what begin_capture changed: the collector on, no capture open."""
        try:
            if self._capturing or self.is_capturing():
                cudart = _cudart()
                err, graph = cudart.cudaStreamEndCapture(self.stream.ptr)
                if int(err) == 0 and graph is not None and int(graph):
                    cudart.cudaGraphDestroy(graph)             # the half-captured graph
        except Exception:   # noqa: BLE001  (the error that led here is the one to report)
            pass
        finally:
            self._restore_gc()
            self._capturing = False
            self._offence = None

    # ---- the whole generation in one launch (LAB_LOOP=device) -------------------------------
    def instantiate(self, source: CudaGraphDef) -> CudaGraph:
        raw = _RawExec(source)
        raw.upload(self.stream)
        return CudaGraph(self, raw)

    def end_capture(self, stream: str = "main", instantiate: bool = True):
        offence, self._offence = self._offence, None
        try:
            if not instantiate:   # the cudaGraph_t alone, through the runtime (CuPy instantiates)
                graph = CudaGraphDef(_check(_cudart().cudaStreamEndCapture(self.stream.ptr)))
            else:
                graph = self.stream.end_capture()
        except Exception as exc:
            reason = offence or f"{exc.__class__.__name__}: {exc}"
            raise CaptureError(f"capture invalidated: {exc}; first offence: {reason}", reason) from exc
        finally:
            self._restore_gc()
            self._capturing = False   # ended, even when invalidated
        if offence is not None:  # an offence the driver let through still invalidates the capture
            raise CaptureError(f"capture had a failed operation: {offence}", offence)
        if not instantiate:
            return graph
        graph.upload(self.stream)
        return CudaGraph(self, graph)


def __getattr__(name):
    # the ranks live in lab/backend/cuda_ranks.py (it imports this module); still importable here
    if name in ("CudaRanks", "CudaRankBackend"):
        from . import cuda_ranks
        return getattr(cuda_ranks, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _is_fault(exc: Exception) -> bool:
    """A CUDA error for a kernel's illegal address, as CuPy, numba or cuda.core words it."""
    text = str(exc)
    return ("ILLEGAL_ADDRESS" in text or "IllegalAddress" in text
            or "illegal memory access" in text.lower())
