"""CUDA graphs for the cuda backend, through cuda-bindings on CuPy's handles: the executable
graph (`CudaGraph`), a captured definition not yet instantiated (`CudaGraphDef`), and the device
loop (LAB_LOOP=device): a WHILE node over a SWITCH of every plan's step (`CudaLoopGraph`), built
by `CudaDeviceLoop`, the backend's mixin for it."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from lab.errors import CaptureError
from .base import Graph, LoopGraph

if TYPE_CHECKING:
    from .cuda import CudaBackend


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
        be = self._backend
        be._capture_guard("graph launch", self.graph.launch, be.streams[stream])
        be._wait_if_blocking("a graph")

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


class CudaDeviceLoop:
    """The whole generation in one launch (LAB_LOOP=device), a mixin of CudaBackend: the loop's
    condition kernels and its graph, each body captured into its conditional node."""

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
