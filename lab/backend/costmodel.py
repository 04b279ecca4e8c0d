"""The simulator's cost model, built ONLY from measured component costs (data/gpu/
kernel_costs.json, recorded on a GPU by `decode-lab record costs`). No whole-step recording
feeds it: those are what `decode-lab conformance` checks its predictions against.

  cost_key, launch_bytes,   what identifies a launch's cost, the bytes it is handed, the
  launch_context            context it runs at
  KernelFit                 one launch's fitted node time, a + b * context (piecewise)
  CollectiveCosts           a collective's device and host us (data/gpu/ranks.json)
  CostModel                 every figure of the model and the functional form that uses them
  with_supplement           a cost file with spec_costs.json's measured rows merged in
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lab import schema
from lab.errors import LabError
from .base import Buffer, Launch, RawArray

COSTS_FILE = Path(__file__).resolve().parents[2] / "data" / "gpu" / "kernel_costs.json"
MECHANISMS = ("dispatcher", "prebound")
# a deliberate bug's kernel costs what its clean twin costs (same work, another contract)
TWIN_OF = {"rmsnorm_late_wait": "rmsnorm", "attn_partial_len": "attn_partial",
           "rope_kv_append_row": "rope_kv_append", "argmax_next_float": "argmax_next"}
# a kernel a cost file predates stands in, until it is recorded, as the kernel that does its job
# (listed in `misses`, as every stand-in): the n-gram drafter as prompt lookup
STAND_IN_OF = {"draft_ngram": "draft_lookup"}
# arguments a kernel reads one entry of per output, never whole: draft_ngram's table (25 MB for
# the real model) is read once per drafted column
SPARSE_ARGS = ("table",)
KV_ARGS = ("k_cache", "v_cache")
# kernels that read `context` rows of the KV cache (the others touch one row: an append)
CONTEXT_KERNELS = ("attn_partial", "attn_partial_len", "attn_fused", "attn_fused_grid", "attn_partial_wide",
                   "verify_partial", "step_persistent")
# kernels that run a whole step (every layer's weights): left out of the bandwidth fit, which
# stands in for an unrecorded kernel of a step and would be dominated by their bytes
WHOLE_STEP_KERNELS = ("step_persistent",)


MISSING = "missing key {!r} (re-record it with decode-lab record costs on a GPU)"
SUPPLEMENT = "spec_costs.json"   # measured costs a cost file lacks, beside it (decode-lab record spec_costs)


def with_supplement(data: dict, extra: dict) -> dict:
    """The cost file's data with a supplement's measurements added: its kernels and switches
    (keys the file lacks; the file wins on a key both hold) and floors.capture (when the file
    has none). `supplement` in the result names the supplement's source and date."""
    out = json.loads(json.dumps(data))
    have = {r["key"] for r in out["kernels"]}
    out["kernels"] += [r for r in extra.get("kernels", []) if r["key"] not in have]
    pairs = {(r["prev"], r["key"]) for r in out["switches"]}
    out["switches"] += [r for r in extra.get("switches", []) if (r["prev"], r["key"]) not in pairs]
    capture = extra.get("floors", {}).get("capture")
    if capture and "capture" not in out.get("floors", {}):
        out["floors"]["capture"] = capture
    out["supplement"] = f"{SUPPLEMENT}: {extra.get('source', '?').split(',')[0]}, {extra.get('date', '?')}"
    return out


def _per_graph(fit: tuple | None, nodes: int) -> float:
    return 0.0 if fit is None else fit[0] + fit[1] * nodes


def _fit_or_none(data: dict, what: str, path) -> tuple | None:
    """(intercept, per node) of floors.capture.<what>, or None when the file has no such
    recording (a cost file recorded without the capture floor)."""
    if what not in data.get("floors", {}).get("capture", {}):
        return None
    return (_num(data, f"floors.capture.{what}.intercept_us", path, positive=False),
            _num(data, f"floors.capture.{what}.per_node_us", path, positive=False))


def _buffer(a):
    return a.buf if isinstance(a, RawArray) else a


_ARG_KEYS: dict[tuple, str] = {}     # (shape, dtype) -> "256x64:float32", made once each


def _arg_key(b: Buffer) -> str:
    """A buffer's part of a cost key: its shape and its dtype's name."""
    key = _ARG_KEYS.get((b.shape, b.dtype))
    if key is None:
        key = f"{'x'.join(map(str, b.shape))}:{np.dtype(b.dtype).name}"
        _ARG_KEYS[(b.shape, b.dtype)] = key
    return key


def cost_key(launch: Launch) -> str:
    """What a launch's cost depends on besides the context: kernel, grid, block, the shapes and
    dtypes of its buffers (`attn_partial grid=(4, 4) block=(64,) [256:float32, ...]`). Kept in
    the launch's `prepared` slot: a clean engine issues the same Launch objects every step."""
    key = launch.prepared.get("cost_key")
    if key is None:
        shapes = ", ".join(_arg_key(b) for b in map(_buffer, launch.args) if isinstance(b, Buffer))
        key = launch.prepared["cost_key"] = (f"{launch.name} grid={tuple(launch.grid)} "
                                             f"block={tuple(launch.block)} [{shapes}]")
    return key


def launch_bytes(launch: Launch, context: int) -> int:
    """Bytes a launch moves: its buffers, of the KV cache only the rows it touches (`context`
    rows for attention, one for an append; of a stacked cache [layers, max_seq, D], the
    persistent step's, those rows in every layer)."""
    names = launch.kernel.arg_names
    total = 0
    for name, a in zip(names, launch.args):
        b = _buffer(a)
        if not isinstance(b, Buffer):
            continue
        if name in KV_ARGS and len(b.shape) in (2, 3):
            rows = context if launch.name in CONTEXT_KERNELS else 1
            seq = b.shape[-2]
            total += min(rows, seq) * b.nbytes // seq
        elif name in SPARSE_ARGS:
            cols = _buffer(launch.args[names.index("cols")]) if "cols" in names else None
            total += np.dtype(b.dtype).itemsize * (int(np.prod(cols.shape))
                                                   if isinstance(cols, Buffer) else 1)
        else:
            total += b.nbytes
    return total


def launch_context(launch: Launch, arrays) -> int:
    """The context length a launch works on, read as the device would: the `pos` it reads
    (context = pos + 1) or a by-value `ctx_len`; 1 for a launch with neither."""
    names = launch.kernel.arg_names
    if "ctx_len" in names:
        return int(arrays[names.index("ctx_len")])
    if "pos" in names:
        return int(arrays[names.index("pos")][0]) + 1
    return 1


@dataclass(frozen=True)
class KernelFit:
    """Node time of one cost key against the context (us), without and with PDL: the straight
    line through its measured contexts when there are one or two (a + b * context), piecewise
    linear between them when there are more (a kernel whose slices grow with a context it
    covers with a fixed split count, verify_partial: flat at first, then linear), extended
    beyond the first and last by their segments' slopes."""
    a: float
    b: float
    a_pdl: float
    b_pdl: float
    bytes: int
    contexts: tuple[int, ...]
    measured: tuple[tuple[int, float, float], ...]    # (context, node_us, node_pdl_us)
    knots: tuple = ()     # (contexts, node_us, node_pdl_us), sorted: more than two contexts

    def node(self, context: int, pdl: bool) -> float:
        if not self.knots:
            return (self.a_pdl + self.b_pdl * context) if pdl else (self.a + self.b * context)
        x, y = self.knots[0], self.knots[2 if pdl else 1]
        i = min(max(int(np.searchsorted(x, context)), 1), len(x) - 1)   # its segment
        return float(y[i - 1] + (y[i] - y[i - 1]) * (context - x[i - 1]) / (x[i] - x[i - 1]))


def _fit(rows) -> KernelFit:
    ctx = np.array([r["context"] for r in rows], float)
    us = np.array([r["node_us"] for r in rows], float)
    pdl = np.array([r["node_pdl_us"] for r in rows], float)
    distinct = sorted(set(ctx.tolist()))
    knots = ()
    if len(distinct) >= 2:
        b, a = np.polyfit(ctx, us, 1)
        b_p, a_p = np.polyfit(ctx, pdl, 1)
        if len(distinct) > 2:
            x = np.array(distinct)
            knots = (x, np.array([us[ctx == c].mean() for c in x]),
                     np.array([pdl[ctx == c].mean() for c in x]))
    else:
        a, b, a_p, b_p = us.mean(), 0.0, pdl.mean(), 0.0
    return KernelFit(float(a), float(b), float(a_p), float(b_p), int(rows[0]["bytes"]),
                     tuple(int(c) for c in ctx),
                     tuple((int(c), float(u), float(p)) for c, u, p in zip(ctx, us, pdl)), knots)


def _get(data: dict, path: str, source: Path):
    """data[a][b]... for path "a.b...", or a LabError naming the file and the missing key."""
    cur = data
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur:
            raise LabError(f"{source}: " + MISSING.format(path))
        cur = cur[part]
    return cur


# (path, digest of its bytes, digest of its supplement's) -> CostModel.load's fields: the
# dicts in them are never changed after loading, so models built from them may share them
_LOADED: dict[tuple, dict] = {}


def _bytes_digest(path: Path) -> str | None:
    """sha256 of a file's bytes; None when it cannot be read (load then says why)."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _num(data, path, source, positive=True) -> float:
    v = _get(data, path, source)
    if not isinstance(v, (int, float)) or not math.isfinite(v) or (positive and v <= 0):
        raise LabError(f"{source}: {path} = {v!r} is not a {'positive ' if positive else ''}number")
    return float(v)


RANKS_FILE = COSTS_FILE.parent / "ranks.json"


@dataclass(frozen=True)
class CollectiveCosts:
    """What a collective costs the simulator (LAB_RANKS=2): device us per collective as a graph
    node and eagerly, and host us per eager collective call, per op. Read from the
    `collectives` section of data/gpu/ranks.json (decode-lab record ranks, recorded on a GPU
    pair); until that is recorded, the figures of one probe of the project's H200 pair stand in
    (`source` says which)."""
    source: str
    graph_us: dict          # op -> device us of one collective node in a graph
    eager_us: dict          # op -> device us of one eager collective
    host_call_us: dict      # op -> host us of one eager collective call (both ranks' group)

    # A probe on the project's H200 pair (2026-11-30): a graph of one kernel + one all-reduce of
    # 256 floats replayed in 17.5 us; eagerly, kernel + all-reduce took 103-131 us per step.
    PROBE = {"source": "upper bounds from one probe of the project's H200 pair, 2026-11-30 (a graph "
                       "of one kernel + one all-reduce of 256 floats: 17.5 us per replay; eagerly "
                       "103-131 us per step); not yet recorded by decode-lab record ranks",
             "graph_us": {"all_reduce": 17.5}, "eager_us": {"all_reduce": 17.5},
             "host_call_us": {"all_reduce": 50.0}}   # 103-131 us per step of two ranks

    @classmethod
    def load(cls, path=None) -> "CollectiveCosts":
        path = Path(path) if path is not None else RANKS_FILE
        if not path.is_file():
            return cls.from_dict(cls.PROBE)
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise LabError(f"{path}: no readable 'collectives' section ({exc!r})") from None
        return cls.from_dict(schema.check(data, schema.RANKS, path.name)["collectives"])

    @classmethod
    def from_dict(cls, d: dict) -> "CollectiveCosts":
        try:
            return cls(str(d["source"]), dict(d["graph_us"]), dict(d["eager_us"]),
                       dict(d["host_call_us"]))
        except (KeyError, TypeError) as exc:
            raise LabError(f"collective costs need source, graph_us, eager_us and host_call_us: "
                           f"{exc!r}") from None

    @staticmethod
    def _of(table: dict, op: str) -> float:
        return float(table.get(op, table.get("all_reduce", next(iter(table.values())))))

    def device_us(self, coll, graph: bool) -> float:
        return self._of(self.graph_us if graph else self.eager_us, coll.op)

    def host_us(self, coll) -> float:
        """One rank's share of the host's eager call (the group's cost split over its ranks is
        charged per rank's call; the figures are per rank)."""
        return self._of(self.host_call_us, coll.op)


@dataclass(frozen=True)
class CostModel:
    """Each figure below comes from one key of the cost file (`sources`). The form:
    - a graph NODE costs `a + b * context` us per distinct launch (`cost_key`; chains of n
      copies measured it, gap to the next node included, so a step's nodes add); within one
      key, time is linear in context (attention walks context / splits per block), a key seen
      at one context has b = 0, one seen at more than two is interpolated piecewise;
    - with PDL a node has its own measured time; a node after ANOTHER kernel pays that pair's
      measured switch (their mean for a pair never measured); a replay pays a per-replay
      overhead before its first node, a join of another stream's branch the fork/join cost;
    - eagerly a kernel costs its node time minus the graph floor plus the eager floor; the HOST
      pays per launch its mechanism's measured cost (scaled to a whole step's sequence), per
      step the engine's measured host work, per capture and instantiation the per-graph +
      per-node floor; device and host run as a pipeline;
    - noise comes from the recorded SPREADS only, as mean-1 lognormal factors: per-launch host
      jitter, a slow host drift (redrawn every rep's duration), per-node graph jitter;
    - a launch never measured (`misses`) takes a STAND-IN, not a prediction: its kernel's
      launch on the same shapes under another geometry, else its clean twin's nearest launch,
      else the empty-node floor plus its bytes over the bandwidth fitted to the measured
      kernels (a guess of the right order at best: those kernels' data sit in L2)."""
    source: str                       # the GPU and versions the components were measured on
    path: str                         # the file they were read from
    date: str
    kernels: dict                     # cost_key -> KernelFit
    graph_launch_us: float            # device overhead per replay   floors.empty.intercept_us
    empty_node_us: float              # one empty node               floors.empty.per_node_us
    empty_node_pdl_us: float          # the same with PDL            floors.empty_pdl.per_node_us
    join_us: float                    # one fork/join pair           floors.fork_join.extra_us_per_pair
    eager_floor_us: float             # one empty eager kernel       floors.eager_device.per_launch_us
    graph_submit_us: float            # host, one graph launch       floors.graph_submit_us
    switch_us: dict                   # (prev key, key) -> (us, us with PDL)   switches[]
    host_launch_us: dict              # mechanism -> {cost_key: us}  host.<mechanism> x sequence
    engine_host_us: dict              # "eager"/"graph" -> us/step   engine_host_us
    bandwidth_gbs: float              # fitted over the measured kernels (fallback only)
    launch_jitter: float              # lognormal sigma per eager launch   noise.prebound
    drift: float                      # lognormal sigma of host speed      noise.prebound
    drift_us: float                   # redrawn after this much model time  noise.prebound.rep_seconds
    node_jitter: float                # lognormal sigma per graph node     noise.graph.rep_cv
    host_scale: float = 1.0           # 1 = the measured host; notebooks make a slower, noisier one
    loop_overhead_us: float | None = None   # device loop, per iteration  floors.loop.overhead_us
    capture_us: tuple | None = None   # host (per graph, per node) to capture   floors.capture.capture
    instantiate_us: tuple | None = None   # host (per graph, per node) to instantiate   ... .instantiate
    supplement: str = ""              # the supplement merged in, if any (SUPPLEMENT)
    misses: set = field(default_factory=set, compare=False, repr=False)

    @property
    def sources(self) -> dict[str, str]:
        """Each figure of the model and the key of the recorded file it comes from."""
        return {"kernels": "kernels[] (chains of one launch: per-node slope, with/without PDL)",
                "graph_launch_us": "floors.empty.intercept_us", "empty_node_us": "floors.empty.per_node_us",
                "empty_node_pdl_us": "floors.empty_pdl.per_node_us",
                "join_us": "floors.fork_join.extra_us_per_pair",
                "eager_floor_us": "floors.eager_device.per_launch_us",
                "graph_submit_us": "floors.graph_submit_us",
                "switch_us": "switches[] (chains of adjacent pairs)",
                "host_launch_us": "host.<mechanism> x host.<mechanism>_step_sequence_us / "
                                  "host.<mechanism>_alone_over_step_us",
                "engine_host_us": "engine_host_us", "bandwidth_gbs": "fit of kernels[] bytes vs time",
                "launch_jitter": "noise.prebound.token_cv_robust x sqrt(launches_per_token)",
                "drift": "noise.prebound.rep_cv beyond per-token jitter",
                "drift_us": "noise.prebound.rep_seconds",
                "node_jitter": "noise.graph.rep_cv x sqrt(launches_per_token x tokens_per_rep)",
                "loop_overhead_us": "floors.loop.overhead_us (only LAB_LOOP=device needs it)",
                "capture_us": "floors.capture.capture (0 when not recorded)",
                "instantiate_us": "floors.capture.instantiate (0 when not recorded)",
                "supplement": f"{SUPPLEMENT} beside the cost file, if any (decode-lab record spec_costs)"}

    # ---- loading ---------------------------------------------------------------------------
    @classmethod
    def load(cls, path=None) -> "CostModel":
        """Read a kernel_costs.json (and the SUPPLEMENT beside it), each checked against its
        schema (lab/schema.py) before use: a missing or malformed file, or a field of the wrong
        type or range, is a LabError naming the file and the field. A new model each call; what
        it is built from is read, checked and fitted once per process for the same bytes of the
        two files (`_LOADED`: engines and tests load the same file hundreds of times)."""
        path = Path(path) if path is not None else COSTS_FILE
        extra = path.with_name(SUPPLEMENT)
        key = (str(path), _bytes_digest(path), _bytes_digest(extra))
        fields = _LOADED.get(key)       # an unreadable file is never kept: read_json refuses it
        if fields is None:
            data = schema.read_json(path, absent="it is recorded on a GPU by decode-lab record "
                                    "costs", what="the simulator's cost file ")
            schema.check(data, schema.KERNEL_COSTS, path.name, MISSING)
            if extra.is_file():
                more = schema.read_json(extra, what="the cost file's supplement ")
                data = with_supplement(data, schema.check(more, schema.SPEC_COSTS, extra.name,
                                                          MISSING.replace("costs", "spec_costs")))
            fields = _LOADED[key] = _fields(data, path)
        return cls(**fields)

    @classmethod
    def from_dict(cls, data: dict, path: Path = Path("<dict>")) -> "CostModel":
        return cls(**_fields(data, path))

    def capture_host_us(self, nodes: int) -> float:
        """Host us to capture a graph of `nodes` launches, as measured (floors.capture); 0 for
        a cost file recorded without it."""
        return _per_graph(self.capture_us, nodes) * self.host_scale

    def instantiate_host_us(self, nodes: int) -> float:
        """Host us to instantiate a captured graph of `nodes` launches (floors.capture)."""
        return _per_graph(self.instantiate_us, nodes) * self.host_scale

    def loop_iteration_us(self) -> float:
        """What the device loop adds per iteration (WHILE + SWITCH + two condition kernels), as
        measured; a cost file recorded without it cannot simulate LAB_LOOP=device."""
        if self.loop_overhead_us is None:
            raise LabError(f"{self.path} has no floors.loop.overhead_us: the device loop's cost "
                           f"was not recorded (decode-lab record costs records it on a GPU "
                           f"with conditional nodes)")
        return self.loop_overhead_us

    def replace(self, **changes) -> "CostModel":
        return dataclasses.replace(self, misses=set(), **changes)

    def describe(self) -> str:
        return (f"component costs from {Path(self.path).name}, {self.source.split(',')[0]}, "
                f"{self.date}" + (f" (+ {self.supplement})" if self.supplement else ""))

    # ---- device ------------------------------------------------------------------------------
    def _fit_for(self, launch: Launch):
        key = cost_key(launch)
        fit = self.kernels.get(key)
        if fit is not None:
            return fit
        self.misses.add(key)
        if key in self._miss_fits:          # a miss is resolved once: the search below is a scan
            return self._miss_fits[key]
        fit = self._miss_fits[key] = self._stand_in(launch, key)
        return fit

    @functools.cached_property
    def _miss_fits(self) -> dict:
        """cost key -> the fit that stands in for it (a key the recording lacks)."""
        return {}

    def _stand_in(self, launch: Launch, key: str):
        """The recorded fit that stands in for a launch whose key was not recorded."""
        family = TWIN_OF.get(launch.name, STAND_IN_OF.get(launch.name, launch.name))
        # the same kernel on the same argument shapes under another grid/block (its geometry
        # changed since the recording): the recorded launch of that work, until re-recorded
        shapes = key.split(" [", 1)[1]
        same = [f for k, f in self.kernels.items()
                if k.split(" ", 1)[0] == family and k.split(" [", 1)[1] == shapes]
        if same:
            return same[0]
        cands = [(k, f) for k, f in self.kernels.items() if k.split(" ", 1)[0] == family]
        if cands:
            nb = launch_bytes(launch, 1)
            return min(cands, key=lambda kf: abs(kf[1].bytes - nb))[1]
        return None

    def node_us(self, launch: Launch, context: int, pdl: bool, prev: Launch | None = None) -> float:
        """Device time of `launch` as a graph node (the gap to the next node included), after
        `prev` on its stream (None: nothing before it). A launch the cost file has no row for
        (listed in `misses`) gets a stand-in (see `_stand_in`); one without even a recorded
        relative gets the empty-node floor plus its bytes over the fitted bandwidth: a
        placeholder of the right order, never a prediction."""
        fit = self._fit_for(launch)
        if fit is not None:
            us = max(fit.node(context, pdl), 0.0)
        else:   # the stand-in of last resort (LAB_PERSISTENT=1 under a file without its rows)
            floor = self.empty_node_pdl_us if pdl else self.empty_node_us
            us = floor + launch_bytes(launch, context) / (self.bandwidth_gbs * 1e3)
        return us + self.switch(prev, launch, pdl)

    def switch(self, prev: Launch | None, launch: Launch, pdl: bool) -> float:
        """The extra cost of `launch` following another kernel (0 after itself or nothing)."""
        if prev is None or prev.kernel is launch.kernel:
            return 0.0
        extra = self.switch_us.get((cost_key(prev), cost_key(launch)))
        if extra is None:
            extra = self._mean_switch
        return extra[1] if pdl else extra[0]

    @functools.cached_property
    def _mean_switch(self) -> tuple[float, float]:
        v = np.array(list(self.switch_us.values()), float)
        return float(v[:, 0].mean()), float(v[:, 1].mean())

    def eager_us(self, launch: Launch, context: int, prev: Launch | None = None) -> float:
        """Device time of `launch` launched eagerly: its body plus the eager floor."""
        body = self.node_us(launch, context, False, prev) - self.empty_node_us
        return max(body, 0.0) + self.eager_floor_us

    # ---- host --------------------------------------------------------------------------------
    def host_launch(self, launch: Launch, mechanism: str, rng: np.random.Generator) -> float:
        """Host us of one eager launch through `mechanism`, with its jitter."""
        us = self.host_launch_us[mechanism].get(cost_key(launch))
        if us is None:
            us = self._host_launch_by_kernel[mechanism].get(launch.name)
        if us is None:                  # a kernel the recording lacks: the mechanism's mean
            us = self._host_launch_means[mechanism]
        return us * self.host_scale * _unit_lognormal(rng, self.launch_jitter)

    @functools.cached_property
    def _host_launch_by_kernel(self) -> dict[str, dict[str, float]]:
        """Per mechanism, the mean host cost of each kernel over its measured keys: what a launch
        of a measured kernel with an unmeasured geometry costs. The host cost of a launch is its
        argument list's, not its grid's: the recorder measures each launch of the step at one
        position (BASE_POSITION in lab/measure/costfile.py), and the attention kernels change grid and
        partials shape with the context's plan; the keys of one kernel at other geometries cost
        about the same on the H200 (pre-bound: matvec's four keys 10.67 to 10.79 us,
        norm_qkv_rope's three 16.30 to 16.35; all kernels 9.6 to 16.4). The mean of all kernels
        would price every attention launch before position 64 at the all-kernel mean, and the
        heads tail's split 30% above its eager A/B."""
        out: dict[str, dict[str, float]] = {}
        for m, per in self.host_launch_us.items():
            by: dict[str, list] = {}
            for k, us in per.items():
                by.setdefault(k.split(" ", 1)[0], []).append(us)
            out[m] = {name: float(np.mean(v)) for name, v in by.items()}
        return out

    @functools.cached_property
    def _host_launch_means(self) -> dict[str, float]:
        return {m: float(np.mean(list(per.values()))) for m, per in self.host_launch_us.items()}

    def graph_submit(self, rng: np.random.Generator) -> float:
        return self.graph_submit_us * self.host_scale * _unit_lognormal(rng, self.launch_jitter)

    def engine_step(self, mode: str) -> float:
        return self.engine_host_us[mode] * self.host_scale

    def host_speed(self, rng: np.random.Generator) -> float:
        """A new host-speed factor (multiplies host costs until the next redraw)."""
        return _unit_lognormal(rng, self.drift)

    def node_noise(self, rng: np.random.Generator) -> float:
        return _unit_lognormal(rng, self.node_jitter)


def _fields(data: dict, path: Path) -> dict:
    """CostModel's fields from a cost file's content, checked against schema.KERNEL_COSTS
    first: a LabError names the field that is missing or of the wrong type or range (an empty
    kernels table included: the model would be placeholders only)."""
    schema.check(data, schema.KERNEL_COSTS, Path(path).name, MISSING)
    by_key: dict[str, list] = {}
    for r in data["kernels"]:
        by_key.setdefault(r["key"], []).append(r)
    kernels = {k: _fit(v) for k, v in by_key.items()}
    empty = _num(data, "floors.empty.per_node_us", path)
    host = {}
    for m in MECHANISMS:   # per kernel, scaled to the cost per launch in a step's sequence
        scale = (_num(data, f"host.{m}_step_sequence_us", path)
                 / _num(data, f"host.{m}_alone_over_step_us", path))
        host[m] = {k: float(v) * scale for k, v in _get(data, f"host.{m}", path).items()}
    switches = {}
    for r in data["switches"]:
        switches[(r["prev"], r["key"])] = (float(r["extra_us"]), float(r["extra_pdl_us"]))
    lpt = _num(data, "launches_per_token", path)
    pre, graph = (_get(data, f"noise.{k}", path) for k in ("prebound", "graph"))
    tok_cv = _num(data, "noise.prebound.token_cv_robust", path, positive=False)
    rep_cv = _num(data, "noise.prebound.rep_cv", path, positive=False)
    drift = math.sqrt(max(rep_cv ** 2 - tok_cv ** 2 / pre.get("tokens_per_rep", 1), 0.0))
    # effective bandwidth over the measured kernels (node time above the empty floor), a
    # whole step's kernel left out (WHOLE_STEP_KERNELS): only a stand-in's figure uses it
    per_op = [f for k, f in kernels.items() if k.split(" ", 1)[0] not in WHOLE_STEP_KERNELS]
    b = np.array([f.bytes for f in per_op], float)
    t = np.array([max(f.node(f.contexts[0], False) - empty, 1e-3) for f in per_op])
    bw = float(b.sum() / t.sum() / 1e3)
    return dict(
        source=str(_get(data, "source", path)), path=str(path), date=str(data.get("date", "?")),
        kernels=kernels,
        graph_launch_us=_num(data, "floors.empty.intercept_us", path, positive=False),
        empty_node_us=empty,
        empty_node_pdl_us=_num(data, "floors.empty_pdl.per_node_us", path),
        join_us=_num(data, "floors.fork_join.extra_us_per_pair", path, positive=False),
        eager_floor_us=_num(data, "floors.eager_device.per_launch_us", path),
        graph_submit_us=_num(data, "floors.graph_submit_us", path),
        switch_us=switches, host_launch_us=host,
        engine_host_us={m: _num(data, f"engine_host_us.{m}", path) for m in ("eager", "graph")},
        bandwidth_gbs=bw,
        launch_jitter=tok_cv * math.sqrt(lpt),
        drift=drift, drift_us=1e6 * _num(data, "noise.prebound.rep_seconds", path),
        node_jitter=_num(data, "noise.graph.rep_cv", path, positive=False) * math.sqrt(
            lpt * _num(data, "noise.graph.tokens_per_rep", path)),
        loop_overhead_us=(_num(data, "floors.loop.overhead_us", path, positive=False)
                          if "overhead_us" in data.get("floors", {}).get("loop", {}) else None),
        capture_us=_fit_or_none(data, "capture", path),
        supplement=str(data.get("supplement", "")),
        instantiate_us=_fit_or_none(data, "instantiate", path),
    )


def _unit_lognormal(rng: np.random.Generator, sigma: float) -> float:
    """A lognormal factor with MEAN 1: the measured costs are means already, so noise must
    spread them without moving them (a median-1 lognormal would add exp(sigma^2 / 2) - 1)."""
    return float(rng.lognormal(-0.5 * sigma * sigma, sigma)) if sigma > 0 else 1.0
