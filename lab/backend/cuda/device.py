"""The `cuda` backend: numba.cuda kernels launched on CuPy streams, captured into CUDA graphs.

  CudaBackend   memory (CuPy arrays), streams and events, capture, issue; composes a Launcher
                (launch.py), the capture state (capture.py) and the device loop (graph.py)

- Buffers are CuPy arrays, each wrapped ONCE with `cuda.as_cuda_array(x, sync=False)`: a raw
  CuPy array passed to a numba launch synchronises through the array interface, which is
  illegal during capture (cudaErrorStreamCaptureIsolation) and costs time everywhere.
- Kernels are compiled from their explicit signatures in `warm_up()`, modules loaded, so no
  compilation or module load happens in a timed region or a capture.
- Capture uses GLOBAL mode: CuPy's default (relaxed) lets unsafe calls run once at capture time
  and silently drop out of the graph.
"""
from __future__ import annotations

import time

import numpy as np

from lab.errors import CaptureError
from ..base import Backend, Buffer, Launch, RawArray
from .capture import CaptureState, check, cudart
from .graph import CudaGraph, CudaGraphDef, DeviceLoop, RawExec
from .launch import Launcher


class CudaBackend(Backend):
    name = "cuda"
    simulated = False

    def __init__(self):
        super().__init__()
        import cupy as cp
        from numba import config as nb_config, cuda
        # decode grids are small on purpose (a few blocks per kernel): numba's low-occupancy
        # warning would fire on nearly every launch and say nothing new
        nb_config.CUDA_LOW_OCCUPANCY_WARNINGS = False
        self.cp, self.nbcuda = cp, cuda
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.streams = {"main": self.stream, "side": cp.cuda.Stream(non_blocking=True)}
        # events for fork/join, created up front (no creation inside a capture), used round-robin
        self._events = [cp.cuda.Event(disable_timing=True) for _ in range(64)]
        self._next_event = 0
        self.capture = CaptureState()
        self.launcher = Launcher(cuda, cp, self.streams, self.capture)
        self.loop = DeviceLoop(self)

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
        arr = self.capture.guard(f"allocation of {name!r}", make)
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
        self.capture.guard(f"synchronous host-to-device copy into {buf.label}", copy)

    def download(self, buf) -> np.ndarray:
        arr = buf.handle[0]
        self._op("download", buf.label)

        def copy():
            out = arr.get(stream=self.stream)
            self.stream.synchronize()
            return out
        return self.capture.guard(f"synchronous device-to-host copy from {buf.label}", copy)

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
    def warm_up(self, kernels) -> None:
        for spec in kernels:
            if self.launcher.compiled(spec.name) is None:
                self.launcher.compile(spec)

    def cooperative_limits(self, kernel, threads: int):
        return self.launcher.cooperative_limits(kernel, threads)

    def launch(self, launch: Launch) -> None:
        disp = self.launcher.compiled(launch.name)
        if disp is None:  # lazy compile + module load: slow anywhere; in a capture allowed by
            # newer drivers only (the H200's 13.0 allowed it; older ones may refuse)
            self._op("compilation", launch.name)
            disp = self.launcher.compile(launch.kernel)
        self.launcher.check_cooperative(launch)
        if self.log is not None:
            self.log.record(launch, "capture" if self.capture.active else "eager")
        for a in launch.args:
            if isinstance(a, RawArray):   # numba synchronises through the array's interface
                self._op("array-interface sync", a.label)
        self.launcher.launch(launch, disp, self.mechanism, self.pdl)
        self._issued += 1
        if not self.capture.active:
            self._wait_if_blocking(launch.name)

    def launch_graph(self, graph, stream: str) -> None:
        """Launch an executable graph (CuPy's, or a RawExec) of this device on `stream`."""
        self.capture.guard("graph launch", graph.launch, self.streams[stream])
        self._wait_if_blocking("a graph")

    def record_wait(self, src: str, dst: str) -> None:
        ev = self._events[self._next_event]
        self._next_event = (self._next_event + 1) % len(self._events)

        def fork_join():
            ev.record(self.streams[src])
            self.streams[dst].wait_event(ev)
        self.capture.guard(f"event {src} -> {dst}", fork_join)

    def synchronize(self) -> None:
        """Wait for every stream the engine uses (main and side), as the simulator does."""
        if self.is_capturing():
            self._op("synchronize", "stream")
        for st in self.streams.values():
            self.capture.guard("stream synchronize", st.synchronize)

    def clock(self) -> float:
        self.synchronize()
        return time.perf_counter()

    # ---- capture ----------------------------------------------------------------------------
    def is_capturing(self, stream: str = "main") -> bool:
        """The runtime's capture status of the stream: ACTIVE, or INVALIDATED by an earlier
        error (still capturing: the capture must be ended before the stream is usable again)."""
        api = cudart()
        status = check(api.cudaStreamIsCapturing(self.streams[stream].ptr))
        return int(status) != int(api.cudaStreamCaptureStatus.cudaStreamCaptureStatusNone)

    def begin_capture(self, stream: str = "main") -> None:
        if self.is_capturing():
            raise CaptureError("a capture is already open")
        self.open_capture(lambda: self.stream.begin_capture(
            mode=self.cp.cuda.runtime.streamCaptureModeGlobal))

    def open_capture(self, begin) -> None:
        """Open a global-mode capture with `begin()`: launches counted from 0 (`Op.issued`),
        no offence yet, the collector held off (CaptureState.open)."""
        self._issued = 0
        self.capture.open(begin)

    def abort_capture(self) -> None:
        """End the capture with the runtime call itself (not through a failing wrapper), then
        restore what begin_capture changed: the collector on, no capture open."""
        try:
            if self.capture.active or self.is_capturing():
                api = cudart()
                err, graph = api.cudaStreamEndCapture(self.stream.ptr)
                if int(err) == 0 and graph is not None and int(graph):
                    api.cudaGraphDestroy(graph)             # the half-captured graph
        except Exception:   # noqa: BLE001  (the error that led here is the one to report)
            pass
        finally:
            self.capture.close()
            self.capture.take_offence()

    def instantiate(self, source: CudaGraphDef) -> CudaGraph:
        raw = RawExec(source)
        raw.upload(self.stream)
        return CudaGraph(self, raw)

    def end_capture(self, stream: str = "main", instantiate: bool = True):
        offence = self.capture.take_offence()
        try:
            if not instantiate:   # the cudaGraph_t alone, through the runtime (CuPy instantiates)
                graph = CudaGraphDef(check(cudart().cudaStreamEndCapture(self.stream.ptr)))
            else:
                graph = self.stream.end_capture()
        except Exception as exc:
            reason = offence or f"{exc.__class__.__name__}: {exc}"
            raise CaptureError(f"capture invalidated: {exc}; first offence: {reason}", reason) from exc
        finally:
            self.capture.close()     # ended, even when invalidated
        if offence is not None:  # an offence the driver let through still invalidates the capture
            raise CaptureError(f"capture had a failed operation: {offence}", offence)
        if not instantiate:
            return graph
        graph.upload(self.stream)
        return CudaGraph(self, graph)

    # ---- the whole generation in one launch (LAB_LOOP=device) -------------------------------
    def loop_support(self) -> str | None:
        return self.loop.support()

    def build_loop(self, bodies: int, issue_body, pos, plan_of, limit):
        return self.loop.build(bodies, issue_body, pos, plan_of, limit)
