"""CUDA graphs for the cuda backend, through cuda-bindings on CuPy's handles. A graph is
launched by the device it belongs to (`device.launch_graph(exec, stream)`).

  CudaGraph       an executable graph: node and edge types, launch, update in place, DOT
  CudaGraphDef    a captured graph not instantiated: the source of an update
  RawExec         an executable graph instantiated from a CudaGraphDef through cuda-bindings
  CudaLoopGraph   the device loop (LAB_LOOP=device): WHILE over a SWITCH of every plan's step
  DeviceLoop      builds it: the condition kernels, each body captured into its node
"""
from __future__ import annotations

import numpy as np

from lab.errors import CaptureError
from ..base import Graph, LoopGraph
from .capture import check, cudart


def _graph_handle(graph):
    return cudart().cudaGraph_t(init_value=int(graph.graph))


class CudaGraph(Graph):
    """An instantiated, uploaded graph of one device."""

    def __init__(self, device, graph):
        self.device = device               # what launches it: device.launch_graph(graph, stream)
        self.graph = graph                 # cupy.cuda.graph.Graph or RawExec (instantiated)
        self._node_types = None

    def _nodes(self):
        api = cudart()
        h = _graph_handle(self.graph)
        _, n = check(api.cudaGraphGetNodes(h, 0))
        nodes, _ = check(api.cudaGraphGetNodes(h, n))
        return nodes

    @property
    def node_count(self) -> int:
        return sum(self.node_types().values())

    def node_types(self) -> dict[str, int]:
        if self._node_types is None:
            api = cudart()
            out: dict[str, int] = {}
            for node in self._nodes():
                t = check(api.cudaGraphNodeGetType(node))
                name = getattr(t, "name", str(t)).replace("cudaGraphNodeType", "").lower()
                out[name] = out.get(name, 0) + 1
            self._node_types = out
        return dict(self._node_types)

    def edge_types(self) -> dict[str, int]:
        """Edges of the graph by type (default / programmatic), through cuda-bindings."""
        api = cudart()
        h = _graph_handle(self.graph)
        get = api.cudaGraphGetEdges
        try:
            res = get(h, 0)
        except TypeError:   # a cuda-bindings where the edge-data form is the _v2 call
            get = api.cudaGraphGetEdges_v2
            res = get(h, 0)
        n = check(res)[-1]
        full = check(get(h, n))
        if len(full) == 4:
            _, _, edge_data, _ = full
            out: dict[str, int] = {}
            for e in edge_data:
                kind = "programmatic" if int(getattr(e, "type", 0)) != 0 else "default"
                out[kind] = out.get(kind, 0) + 1
            return out
        return {"default": int(n)}

    def launch(self, stream: str = "main") -> None:
        self.device.launch_graph(self.graph, stream)

    def update(self, source: "CudaGraphDef") -> str | None:
        """cudaGraphExecUpdate: this executable graph takes `source`'s node parameters (the
        same topology required); None when done, else the runtime's result code."""
        api = cudart()
        exec_ = api.cudaGraphExec_t(init_value=int(self.graph.graphExec))
        err, info = api.cudaGraphExecUpdate(exec_, source.handle)
        if int(err) == 0:
            return None
        result = getattr(info, "result", None)
        return f"{getattr(result, 'name', result)} ({getattr(err, 'name', err)})"

    def dot(self) -> str:
        import os
        import tempfile
        api = cudart()
        fd, path = tempfile.mkstemp(suffix=".dot")
        os.close(fd)
        try:
            check((api.cudaGraphDebugDotPrint(_graph_handle(self.graph), path.encode(), 0)[0], None))
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
            cudart().cudaGraphDestroy(handle)

    def __del__(self):
        try:
            self.destroy()
        except Exception:   # noqa: BLE001  (interpreter shutdown)
            pass

    @property
    def node_count(self) -> int:
        return int(check(cudart().cudaGraphGetNodes(self.handle, 0))[1])

    def node_types(self) -> dict[str, int]:
        return {"kernel": self.node_count}

    def launch(self, stream: str = "main") -> None:
        raise RuntimeError("a captured graph that was not instantiated cannot be launched")


class RawExec:
    """An executable graph instantiated from a CudaGraphDef through cuda-bindings, with the
    attributes CudaGraph uses of CuPy's Graph (graph, graphExec, launch, upload)."""

    def __init__(self, source: CudaGraphDef):
        api = cudart()
        self._source = source                    # keeps the cudaGraph_t alive
        self.graph = int(source.handle)
        self._exec = check(api.cudaGraphInstantiate(source.handle, 0))
        self.graphExec = int(self._exec)

    def launch(self, stream) -> None:
        check(cudart().cudaGraphLaunch(self._exec, stream.ptr))

    def upload(self, stream) -> None:
        check(cudart().cudaGraphUpload(self._exec, stream.ptr))

    def destroy(self) -> None:
        """Destroy the executable graph and its source now, once (a graph holding NCCL
        collectives keeps its communicator's resources until both are gone)."""
        if self._exec is not None:
            exec_, self._exec = self._exec, None
            cudart().cudaGraphExecDestroy(exec_)
        self._source.destroy()

    def __del__(self):
        try:
            if self._exec is not None:
                cudart().cudaGraphExecDestroy(self._exec)
        except Exception:   # noqa: BLE001  (interpreter shutdown)
            pass


def _graph_nodes(graph) -> list:
    api = cudart()
    n = check(api.cudaGraphGetNodes(graph, 0))[1]
    return list(check(api.cudaGraphGetNodes(graph, n))[0]) if n else []


def _add_conditional(graph, deps: list, handle, kind, size: int):
    """Add a conditional node (WHILE or SWITCH) after `deps`: (node, its body graphs)."""
    api = cudart()
    params = api.cudaGraphNodeParams()
    params.type = api.cudaGraphNodeType.cudaGraphNodeTypeConditional
    params.conditional.handle = handle
    params.conditional.type = kind
    params.conditional.size = size
    node = check(api.cudaGraphAddNode(graph, deps or None, None, len(deps), params))
    return node, [params.conditional.phGraph_out[i] for i in range(size)]


class CudaLoopGraph(LoopGraph):
    """The device loop: one WHILE node whose body picks a plan's step with a SWITCH node."""

    def __init__(self, device, raw: RawExec, body_counts: list[int]):
        self.device = device               # what launches it: device.launch_graph(raw, stream)
        self._raw, self._counts = raw, body_counts

    def body_node_counts(self) -> list[int]:
        return list(self._counts)

    def launch(self, stream: str = "main") -> None:
        self.device.launch_graph(self._raw, stream)


class DeviceLoop:
    """The whole generation in one launch (LAB_LOOP=device) on `device` (its `cp`, main
    `stream`, `capture` state and `open_capture`): the loop's condition kernels and its graph,
    each body captured into its conditional node."""

    def __init__(self, device):
        self.device = device
        self._kernels = None        # the condition kernels, compiled on first use

    def support(self) -> str | None:
        """Conditional WHILE nodes need CUDA 12.3+, SWITCH nodes 12.8+ (runtime and driver);
        the condition kernels must compile (NVRTC). Checked, and compiled, outside any capture."""
        api = cudart()
        rt, drv = check(api.cudaRuntimeGetVersion()), check(api.cudaDriverGetVersion())
        if min(rt, drv) < 12080:
            return (f"conditional SWITCH nodes need CUDA 12.8 or newer; runtime {rt // 1000}."
                    f"{rt % 1000 // 10}, driver {drv // 1000}.{drv % 1000 // 10}")
        try:
            self._module()
        except Exception as exc:   # noqa: BLE001  (NVRTC or a missing header: say which)
            return f"the condition kernels (kernels/loop.py) did not compile: {exc}"
        return None

    def _module(self) -> dict:
        if self._kernels is None:
            import os

            from kernels import loop
            cp = self.device.cp
            # cuda_device_runtime_api.h needs crt/host_defines.h, which the pip CUDA headers
            # CuPy may point at lack: the toolkit's include folder first, where there is one
            dirs = ["/usr/local/cuda/include", os.path.join(cp.cuda.get_cuda_path() or "", "include")]
            mod = cp.RawModule(code=loop.SOURCE,
                               options=tuple(f"-I{d}" for d in dirs if os.path.isdir(d)))
            self._kernels = {name: mod.get_function(name) for name in loop.NAMES}
        return self._kernels

    def build(self, bodies: int, issue_body, pos, plan_of, limit) -> CudaLoopGraph:
        """WHILE (pos < limit) { loop_plan -> SWITCH (plan_of[pos]) { bodies } -> loop_continue },
        built with cuda-bindings; every body and condition kernel captured into its graph
        (cudaStreamBeginCaptureToGraph, global mode) on the main stream."""
        why = self.support()
        if why is not None:
            raise CaptureError(why)
        try:
            return self._build(bodies, issue_body, pos, plan_of, limit)
        except CaptureError:
            raise
        except Exception as exc:   # a refused runtime call: the device loop cannot be built here
            raise CaptureError(f"{type(exc).__name__}: {exc}") from exc

    def _build(self, bodies, issue_body, pos, plan_of, limit) -> CudaLoopGraph:
        api, k = cudart(), self._module()
        cond = api.cudaGraphConditionalNodeType
        graph = CudaGraphDef(check(api.cudaGraphCreate(0)))
        h_while = check(api.cudaGraphConditionalHandleCreate(
            graph.handle, 1, api.cudaGraphConditionalHandleFlags.cudaGraphCondAssignDefault))
        _, (body,) = _add_conditional(graph.handle, [], h_while, cond.cudaGraphCondTypeWhile, 1)
        h_switch = check(api.cudaGraphConditionalHandleCreate(body, 0, 0))
        setter = self._capture_into(body, [], lambda: k["loop_plan"](
            (1,), (1,), (pos.handle[0], plan_of.handle[0], np.uint64(int(h_switch)))))
        switch, graphs = _add_conditional(body, setter, h_switch, cond.cudaGraphCondTypeSwitch, bodies)
        counts = [len(self._capture_into(g, [], lambda i=i: issue_body(i))) for i, g in enumerate(graphs)]
        self._capture_into(body, [switch], lambda: k["loop_continue"](
            (1,), (1,), (pos.handle[0], limit.handle[0], np.uint64(int(h_while)))))
        raw = RawExec(graph)
        raw.upload(self.device.stream)
        return CudaLoopGraph(self.device, raw, counts)

    def _capture_into(self, graph, deps: list, issue) -> list:
        """Capture what `issue()` launches on the main stream INTO `graph`, after `deps`; the
        nodes it added. Same rules as begin_capture/end_capture (global mode, no collector)."""
        api, stream, capture = cudart(), self.device.stream, self.device.capture
        before = {int(n) for n in _graph_nodes(graph)}
        self.device.open_capture(lambda: check(api.cudaStreamBeginCaptureToGraph(
            stream.ptr, graph, deps or None, None, len(deps),
            api.cudaStreamCaptureMode.cudaStreamCaptureModeGlobal)))
        try:
            with stream:
                issue()
        except BaseException:
            # end the capture; the graph it went into belongs to its conditional node (keep it)
            api.cudaStreamEndCapture(stream.ptr)
            capture.close()
            capture.take_offence()
            raise
        try:
            check(api.cudaStreamEndCapture(stream.ptr))
        except Exception as exc:
            raise CaptureError(f"capture into a loop body failed: {exc}; first offence: "
                               f"{capture.offence or '-'}", capture.offence or str(exc)) from exc
        finally:
            capture.close()
        offence = capture.take_offence()
        if offence is not None:
            raise CaptureError(f"capture had a failed operation: {offence}", offence)
        return [n for n in _graph_nodes(graph) if int(n) not in before]
