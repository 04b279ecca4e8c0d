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
"""
from __future__ import annotations

import gc
import time
from typing import NamedTuple

import numpy as np

from ..errors import CaptureError
from .base import Backend, Buffer, Graph, Launch, LoopGraph, RawArray


def _cudart():
    from cuda.bindings import runtime as cudart
    return cudart


def _check(result):
    """Unpack a cuda-bindings (err, *values) tuple, raising on an error code."""
    err, *values = result
    if int(err) != 0:
        raise RuntimeError(f"CUDA runtime error {err!r}")
    return values[0] if len(values) == 1 else values


def _graph_handle(graph):
    cudart = _cudart()
    return cudart.cudaGraph_t(init_value=int(graph.graph))


class CudaGraph(Graph):
    def __init__(self, backend: "CudaBackend", graph):
        self._backend = backend
        self.graph = graph                 # cupy.cuda.graph.Graph (instantiated)
        self._node_types = None

    def _nodes(self):
        cudart = _cudart()
        h = _graph_handle(self.graph)
        _, n = _check(cudart.cudaGraphGetNodes(h, 0))
        nodes, _ = _check(cudart.cudaGraphGetNodes(h, n))
        return nodes

    @property
    def node_count(self) -> int:
        return sum(self.node_types().values())

    def node_types(self) -> dict[str, int]:
        if self._node_types is None:
            cudart = _cudart()
            out: dict[str, int] = {}
            for node in self._nodes():
                t = _check(cudart.cudaGraphNodeGetType(node))
                name = getattr(t, "name", str(t)).replace("cudaGraphNodeType", "").lower()
                out[name] = out.get(name, 0) + 1
            self._node_types = out
        return dict(self._node_types)

    def edge_types(self) -> dict[str, int]:
        """Edges of the graph by type (default / programmatic), through cuda-bindings."""
        cudart = _cudart()
        h = _graph_handle(self.graph)
        get = cudart.cudaGraphGetEdges
        try:
            res = get(h, 0)
        except TypeError:   # a cuda-bindings where the edge-data form is the _v2 call
            get = cudart.cudaGraphGetEdges_v2
            res = get(h, 0)
        n = _check(res)[-1]
        full = _check(get(h, n))
        if len(full) == 4:
            _, _, edge_data, _ = full
            out: dict[str, int] = {}
            for e in edge_data:
                kind = "programmatic" if int(getattr(e, "type", 0)) != 0 else "default"
                out[kind] = out.get(kind, 0) + 1
            return out
        return {"default": int(n)}

    def launch(self, stream: str = "main") -> None:
        self.graph.launch(self._backend.streams[stream])

    def update(self, source: "CudaGraphDef") -> str | None:
        """cudaGraphExecUpdate: this executable graph takes `source`'s node parameters (the
        same topology required); None when done, else the runtime's result code."""
        cudart = _cudart()
        exec_ = cudart.cudaGraphExec_t(init_value=int(self.graph.graphExec))
        err, info = cudart.cudaGraphExecUpdate(exec_, source.handle)
        if int(err) == 0:
            return None
        result = getattr(info, "result", None)
        return f"{getattr(result, 'name', result)} ({getattr(err, 'name', err)})"

    def dot(self) -> str:
        import os
        import tempfile
        cudart = _cudart()
        fd, path = tempfile.mkstemp(suffix=".dot")
        os.close(fd)
        try:
            _check((cudart.cudaGraphDebugDotPrint(_graph_handle(self.graph), path.encode(), 0)[0], None))
            with open(path) as f:
                return f.read()
        finally:
            os.unlink(path)


class CudaGraphDef(Graph):
    """A captured graph that was not instantiated: the source of a `CudaGraph.update`."""

    def __init__(self, handle):
        self.handle = handle               # cudaGraph_t (cuda-bindings), destroyed with this

    def destroy(self) -> None:
        """cudaGraphDestroy now, once (also what __del__ does)."""
        if self.handle is not None:
            handle, self.handle = self.handle, None
            _cudart().cudaGraphDestroy(handle)

    def __del__(self):
        try:
            self.destroy()
        except Exception:   # noqa: BLE001  (interpreter shutdown)
            pass

    @property
    def node_count(self) -> int:
        return int(_check(_cudart().cudaGraphGetNodes(self.handle, 0))[1])

    def node_types(self) -> dict[str, int]:
        return {"kernel": self.node_count}

    def launch(self, stream: str = "main") -> None:
        raise RuntimeError("a captured graph that was not instantiated cannot be launched")


class _RawExec:
    """An executable graph instantiated from a CudaGraphDef through cuda-bindings, with the
    attributes CudaGraph uses of CuPy's Graph (graph, graphExec, launch, upload)."""

    def __init__(self, source: CudaGraphDef):
        cudart = _cudart()
        self._source = source                    # keeps the cudaGraph_t alive
        self.graph = int(source.handle)
        self._exec = _check(cudart.cudaGraphInstantiate(source.handle, 0))
        self.graphExec = int(self._exec)

    def launch(self, stream) -> None:
        _check(_cudart().cudaGraphLaunch(self._exec, stream.ptr))

    def upload(self, stream) -> None:
        _check(_cudart().cudaGraphUpload(self._exec, stream.ptr))

    def destroy(self) -> None:
        """Destroy the executable graph and its source now, once (a graph holding NCCL
        collectives keeps its communicator's resources until both are gone)."""
        if self._exec is not None:
            exec_, self._exec = self._exec, None
            _cudart().cudaGraphExecDestroy(exec_)
        self._source.destroy()

    def __del__(self):
        try:
            if self._exec is not None:
                _cudart().cudaGraphExecDestroy(self._exec)
        except Exception:   # noqa: BLE001  (interpreter shutdown)
            pass


def _graph_nodes(graph) -> list:
    cudart = _cudart()
    n = _check(cudart.cudaGraphGetNodes(graph, 0))[1]
    return list(_check(cudart.cudaGraphGetNodes(graph, n))[0]) if n else []


def _add_conditional(graph, deps: list, handle, kind, size: int):
    """Add a conditional node (WHILE or SWITCH) after `deps`: (node, its body graphs)."""
    cudart = _cudart()
    params = cudart.cudaGraphNodeParams()
    params.type = cudart.cudaGraphNodeType.cudaGraphNodeTypeConditional
    params.conditional.handle = handle
    params.conditional.type = kind
    params.conditional.size = size
    node = _check(cudart.cudaGraphAddNode(graph, deps or None, None, len(deps), params))
    return node, [params.conditional.phGraph_out[i] for i in range(size)]


class CudaLoopGraph(LoopGraph):
    """The device loop: one WHILE node whose body picks a plan's step with a SWITCH node."""

    def __init__(self, backend: "CudaBackend", raw: "_RawExec", body_counts: list[int]):
        self._backend, self._raw, self._counts = backend, raw, body_counts

    def body_node_counts(self) -> list[int]:
        return list(self._counts)

    def launch(self, stream: str = "main") -> None:
        self._raw.launch(self._backend.streams[stream])


class _Bound(NamedTuple):
    """One launch through cuda.core, prepared: everything but the launch call itself."""
    stream: object       # cuda.core Stream wrapping our CuPy stream
    config: object       # cuda.core LaunchConfig (grid, block, programmatic serialisation)
    kernel: object       # the loaded cuda.core Kernel of the numba overload
    args: tuple          # the arguments flattened by numba (pointers, shapes, strides, scalars)


# Compiled kernels are per process, not per backend: numba dispatchers are bound to the CUDA
# context every backend here shares, and compiling ~20 kernels costs seconds per engine.
_PROCESS_KERNELS: dict[str, object] = {}


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
            return fn(*args, **kwargs)
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

    def pool_bytes(self) -> int:
        return int(self.cp.get_default_memory_pool().used_bytes())

    # ---- execution ---------------------------------------------------------------------------
    def _compile(self, spec):
        disp = _PROCESS_KERNELS.get(spec.name)
        if disp is None:
            disp = self.nbcuda.jit(list(spec.signatures))(spec.py_func)
            for overload in disp.overloads.values():
                overload._codelibrary.get_cufunc()  # load the module now, not at first launch
            _PROCESS_KERNELS[spec.name] = disp
        self._compiled[spec.name] = disp
        return disp

    def warm_up(self, kernels) -> None:
        for spec in kernels:
            if spec.name not in self._compiled:
                self._compile(spec)

    def _arg(self, a):
        if isinstance(a, Buffer):
            return a.handle[1]
        if isinstance(a, RawArray):  # the CuPy array itself: numba syncs through its interface
            self._op("array-interface sync", a.label)
            return a.buf.handle[0]
        return a

    def launch(self, launch: Launch) -> None:
        disp = self._compiled.get(launch.name)
        if disp is None:  # lazy compile + module load: legal during a capture, slow anywhere
            self._op("compilation", launch.name)
            disp = self._compile(launch.kernel)
        if self.log is not None:
            self.log.record(launch, "capture" if self._capturing else "eager")
        bound = self._prebound(launch, disp) if self.mechanism == "prebound" else None
        if bound is not None:
            self._capture_guard(lambda: f"launch of {launch.name}", self._core_launch,
                                bound.stream, bound.config, bound.kernel, *bound.args)
        else:
            self._launch_dispatcher(launch, disp)
        self._issued += 1

    def _launch_dispatcher(self, launch: Launch, disp) -> None:
        """The dispatcher rung: numba types and flattens the arguments at every launch."""
        args = [self._arg(a) for a in launch.args]
        raw = [a.label for a in launch.args if isinstance(a, RawArray)]
        what = f"launch of {launch.name}" + (
            f" with raw argument {raw[0]}: array-interface synchronisation" if raw else "")
        if self.pdl:
            self._capture_guard(what, self._launch_pdl, launch, disp, args)
        else:
            nbstream = self._nbstreams[launch.stream]
            self._capture_guard(what, disp[launch.grid, launch.block, nbstream], *args)

    def _launch_pdl(self, launch: Launch, disp, args) -> None:
        """Launch through cuda.core with programmatic stream serialisation: the kernel may
        start before its predecessor on the stream finishes; it waits in its pdl_wait()."""
        # a raw CuPy array gets what numba's dispatcher gives it: a synchronising wrap
        args = [self.nbcuda.as_cuda_array(a) if isinstance(a, self.cp.ndarray) else a for a in args]
        bound = self._bind(launch, disp, args)
        self._core_launch(bound.stream, bound.config, bound.kernel, *bound.args)

    def _prebound(self, launch: Launch, disp) -> _Bound | None:
        """The launch prepared once for this PDL setting and stream, kept in `launch.prepared`;
        None for a launch with a raw argument (it takes the dispatcher rung)."""
        key = (self.pdl, launch.stream)
        bound = launch.prepared.get(key)
        if bound is None:
            if any(isinstance(a, RawArray) for a in launch.args):
                return None
            # guarded: a failure while preparing inside a capture must end it as a CaptureError
            bound = launch.prepared[key] = self._capture_guard(
                lambda: f"preparing the launch of {launch.name}", self._bind, launch, disp,
                [self._arg(a) for a in launch.args])
        return bound

    def _bind(self, launch: Launch, disp, args) -> _Bound:
        """What a cuda.core launch of `launch` with these (numba-ready) arguments needs: the
        overload numba's dispatcher would pick, the arguments flattened by numba's own code, the
        launch config and the loaded kernel. No CUDA call: legal inside a capture."""
        from numba import typeof
        nbstream = self._nbstreams[launch.stream]
        key = (launch.name, tuple(typeof(a) for a in args))
        overload = self._overloads.get(key)
        if overload is None:
            overload = self._overloads[key] = disp.overloads[key[1]]
        # numba's own argument flattening; `retr` collects write-backs of host arrays numba
        # would copy, and device arrays and scalars (all a step passes) add none
        kernelargs, retr = [], []
        for ty, val in zip(overload.argument_types, args):
            overload._prepare_args(ty, val, nbstream, retr, kernelargs)
        config = self._LaunchConfig(grid=launch.grid, block=launch.block,
                                    programmatic_stream_serialization=self.pdl)
        return _Bound(self._core_streams[launch.stream], config,
                      overload._codelibrary.get_cufunc().kernel, tuple(kernelargs))

    def _core_stream(self, name: str):
        """A cuda.core Stream wrapping our CuPy stream `name`, made at start-up (never inside a
        capture; cuda.core deprecates being handed foreign stream objects at launch)."""
        try:
            from cuda.core import Device
            return Device().create_stream(self.streams[name])
        except Exception:  # an older cuda.core: hand it the numba stream as before
            return self._nbstreams[name]

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
    def loop_support(self) -> str | None:
        """Conditional WHILE nodes need CUDA 12.3+, SWITCH nodes 12.8+ (runtime and driver);
        the condition kernels must compile (NVRTC). Checked, and compiled, outside any capture."""
        cudart = _cudart()
        rt, drv = _check(cudart.cudaRuntimeGetVersion()), _check(cudart.cudaDriverGetVersion())
        if min(rt, drv) < 12080:
            return (f"conditional SWITCH nodes need CUDA 12.8 or newer; runtime {rt // 1000}."
                    f"{rt % 1000 // 10}, driver {drv // 1000}.{drv % 1000 // 10}")
        try:
            self._loop_module()
        except Exception as exc:   # noqa: BLE001  (NVRTC or a missing header: say which)
            return f"the condition kernels (kernels/loop.py) did not compile: {exc}"
        return None

    def _loop_module(self) -> dict:
        if self._loop_kernels is None:
            import os

            from kernels import loop
            # cuda_device_runtime_api.h needs crt/host_defines.h, which the pip CUDA headers
            # CuPy may point at lack: the toolkit's include folder first, where there is one
            dirs = ["/usr/local/cuda/include",
                    os.path.join(self.cp.cuda.get_cuda_path() or "", "include")]
            mod = self.cp.RawModule(code=loop.SOURCE,
                                    options=tuple(f"-I{d}" for d in dirs if os.path.isdir(d)))
            self._loop_kernels = {name: mod.get_function(name) for name in loop.NAMES}
        return self._loop_kernels

    def build_loop(self, bodies: int, issue_body, pos, plan_of, limit) -> "CudaLoopGraph":
        """WHILE (pos < limit) { loop_plan -> SWITCH (plan_of[pos]) { bodies } -> loop_continue },
        built with cuda-bindings; every body and condition kernel captured into its graph
        (cudaStreamBeginCaptureToGraph, global mode) on the main stream."""
        why = self.loop_support()
        if why is not None:
            raise CaptureError(why)
        try:
            return self._build_loop(bodies, issue_body, pos, plan_of, limit)
        except CaptureError:
            raise
        except Exception as exc:   # a refused runtime call: the device loop cannot be built here
            raise CaptureError(f"{type(exc).__name__}: {exc}") from exc

    def _build_loop(self, bodies, issue_body, pos, plan_of, limit) -> "CudaLoopGraph":
        cudart, k = _cudart(), self._loop_module()
        cond = cudart.cudaGraphConditionalNodeType
        graph = CudaGraphDef(_check(cudart.cudaGraphCreate(0)))
        h_while = _check(cudart.cudaGraphConditionalHandleCreate(
            graph.handle, 1, cudart.cudaGraphConditionalHandleFlags.cudaGraphCondAssignDefault))
        _, (body,) = _add_conditional(graph.handle, [], h_while, cond.cudaGraphCondTypeWhile, 1)
        h_switch = _check(cudart.cudaGraphConditionalHandleCreate(body, 0, 0))
        setter = self._capture_into(body, [], lambda: k["loop_plan"](
            (1,), (1,), (pos.handle[0], plan_of.handle[0], np.uint64(int(h_switch)))))
        switch, graphs = _add_conditional(body, setter, h_switch, cond.cudaGraphCondTypeSwitch, bodies)
        counts = [len(self._capture_into(g, [], lambda i=i: issue_body(i))) for i, g in enumerate(graphs)]
        self._capture_into(body, [switch], lambda: k["loop_continue"](
            (1,), (1,), (pos.handle[0], limit.handle[0], np.uint64(int(h_while)))))
        raw = _RawExec(graph)
        raw.upload(self.stream)
        return CudaLoopGraph(self, raw, counts)

    def _capture_into(self, graph, deps: list, issue) -> list:
        """Capture what `issue()` launches on the main stream INTO `graph`, after `deps`; the
        nodes it added. Same rules as begin_capture/end_capture (global mode, no collector)."""
        cudart = _cudart()
        before = {int(n) for n in _graph_nodes(graph)}
        self._open_capture(lambda: _check(cudart.cudaStreamBeginCaptureToGraph(
            self.stream.ptr, graph, deps or None, None, len(deps),
            cudart.cudaStreamCaptureMode.cudaStreamCaptureModeGlobal)))
        try:
            with self.stream:
                issue()
        except BaseException:
            # end the capture; the graph it went into belongs to its conditional node (keep it)
            cudart.cudaStreamEndCapture(self.stream.ptr)
            self._restore_gc()
            self._capturing, self._offence = False, None
            raise
        try:
            _check(cudart.cudaStreamEndCapture(self.stream.ptr))
        except Exception as exc:
            raise CaptureError(f"capture into a loop body failed: {exc}; first offence: "
                               f"{self._offence or '-'}", self._offence or str(exc)) from exc
        finally:
            self._restore_gc()
            self._capturing = False
        if self._offence is not None:
            offence, self._offence = self._offence, None
            raise CaptureError(f"capture had a failed operation: {offence}", offence)
        return [n for n in _graph_nodes(graph) if int(n) not in before]

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
        if offence is not None:  # an error the driver did not make sticky is still a failed capture
            raise CaptureError(f"capture had a failed operation: {offence}", offence)
        if not instantiate:
            return graph
        graph.upload(self.stream)
        return CudaGraph(self, graph)



# ---- ranks: one GPU each, NCCL among them (LAB_RANKS=2) -------------------------------------------
class _RankGraph(CudaGraph):
    """A rank's executable graph: launched with its device current."""

    def launch(self, stream: str = "main") -> None:
        if self.graph is None:
            raise RuntimeError("this rank graph was released")
        with self._backend._on_device():
            self.graph.launch(self._backend.streams[stream])

    def release(self) -> None:
        """Destroy the graph now (before its communicator is destroyed: NCCL waits for the
        graphs that captured its collectives, and a communicator destroyed first can hang)."""
        if self.graph is not None:
            with self._backend._on_device():
                self._backend.synchronize()
                self.graph.destroy()
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
        with self._on_device():
            super().__init__()

    def _on_device(self):
        from contextlib import ExitStack
        stack = ExitStack()
        stack.enter_context(self._cp_device)
        stack.enter_context(self._nb_gpu)
        return stack

    def warm_up(self, kernels) -> None:
        """Compile once per process (the dispatchers are shared), and load every overload's
        module into THIS device's context now, not at a first launch inside a capture."""
        with self._on_device():
            for spec in kernels:
                disp = self._compiled.get(spec.name) or self._compile(spec)
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
        with self._on_device():
            self._capture_guard(f"{coll.op} ({coll.what})", call)

    def instantiate(self, source) -> CudaGraph:
        with self._on_device():
            raw = _RawExec(source)
            raw.upload(self.stream)
            return _RankGraph(self, raw)


def _on_device_method(name):
    base = getattr(CudaBackend, name)

    def method(self, *args, **kwargs):
        with self._on_device():
            return base(self, *args, **kwargs)
    method.__name__, method.__doc__ = name, base.__doc__
    return method


for _name in ("describe", "compute_capability", "alloc", "upload", "download", "row", "rows",
              "reshape", "launch", "record_wait", "synchronize", "clock", "is_capturing",
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
        import os

        # every rank is a GPU of this host (NVLink or PCIe between them): NCCL's probe for
        # InfiniBand adapters would only cost start-up time
        os.environ.setdefault("NCCL_IB_DISABLE", "1")
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
                    capturing = [b for b in self.backends if b._capturing]
                    if not capturing:
                        raise
                    why = f"NCCL group during capture: {exc.__class__.__name__}: {exc}"
                    for b in capturing:
                        b._offence = b._offence or why
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
