"""DecodeEngine: owns every buffer, issues the decode step (lab/step.py: its launches, in named
pieces) eagerly or as a CUDA graph (one graph per plan key), falling back to eager when a
capture fails.

Read top to bottom: allocate (weights, state, scratch) -> warm up -> reset(prompt) -> step():
decode_plan(position) -> graph for plan.key (capture on a miss) or the eager launches.
Beyond that: LAB_PLAN_SWITCH=update gives the live graph a new plan's parameters in place instead
of instantiating a graph per plan; LAB_LOOP=device makes `generate` ONE launch of a graph that
loops on the device (WHILE over a SWITCH of every plan's step).

A clean engine builds each plan's step once and issues the SAME Launch objects at every later
step with that plan key (eager or captured), so a backend can prepare each launch once
(LAB_LAUNCH=prebound). A deliberate bug (lab/bugs.py) overrides pieces of the step; most make the
step depend on the position or on host state, so it is rebuilt and issued as it is built.
LAB_FUSION=1 issues the fused step instead (lab/step.py FusedStep: 18 launches per token, not
37); it allocates nothing more than the unfused step, so it switches on a live engine like the
other launch toggles.

Device-resident state (read by kernels at run time, so a replay decodes the NEXT token):
  tokens [max_seq] int32  the prompt, then each generated id (written by argmax_next, or in
                          the fused step by norm_lm_head_argmax)
  pos    [1] int32        the step's position (advanced by the last kernel of the step)
  n_prompt [1] int32      generated ids are written only at positions >= n_prompt
  counters [n_layer + 1] int32  the fused step's "last block done" counters, one per launch
                          site (attn_fused per layer, norm_lm_head_argmax); 0 between launches
The host keeps `self.position`, a mirror used only to choose the plan. A captured launch keeps
the argument values it was captured with (buffers by address) unless the graph's nodes are
updated, but the memory behind them stays live: a replay reads whatever `pos` holds when it
runs. Advancing `pos` inside the graph is this engine's choice; writing it between graph
launches (an upload, or on a GPU a kernel-node parameter update) is correct too (notebook 02).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np

import kernels
from . import bugs
from .backend import Launch, StreamWait, make_backend
from .config import LabConfig
from .errors import CaptureError, LabError
from .instrument import LaunchLog
from .model import Model, check_request
from .plan import Plan, decode_plan, plan_boundaries
from .reference import rope_tables
from .step import FusedStep, HostWork, Step


@dataclass(frozen=True)
class LedgerEntry:
    step: int
    position: int
    plan_key: tuple
    outcome: str            # "eager" | "capture" (new graph, then replayed) | "replay" |
                            # "update" (the live graph updated to this plan, then replayed) | "fallback"
    reason: str = ""        # why a fallback happened, or "update-refused: ..." for a capture


@dataclass(frozen=True)
class CaptureFailure:
    reason: str             # the first offence, as the backend names it
    shown_at: str           # where the error showed: "launch 4 (attn_partial)", "end_capture", ...
    launch_index: int | None  # launches issued before it showed (None: at end_capture)


@dataclass
class Generation:
    prompt: str
    text: str               # the generated continuation
    tokens: np.ndarray      # prompt + generated ids
    steps: int
    seconds: float
    source: str             # "simulated ..." or "measured on ..."

    @property
    def ms_per_token(self) -> float:
        return 1000.0 * self.seconds / max(self.steps, 1)


@dataclass
class _Buffers:
    """Every device buffer the step touches; allocated once, never moved."""
    tokens: object = None
    pos: object = None
    n_prompt: object = None
    x: object = None
    h: object = None
    qkv: object = None
    q: object = None
    o: object = None
    act: object = None
    logits: object = None
    plan_of: object = None      # [max_seq] int32: the plan body each position runs (LAB_LOOP=device)
    counters: object = None     # [n_layer + 1] int32: the fused step's last-block counters, zeroed
    limit: object = None        # [1] int32: the device loop runs steps while pos < limit
    part_o: object = None
    part_ml: object = None
    cos: object = None
    sin: object = None
    k_cache: list = field(default_factory=list)
    v_cache: list = field(default_factory=list)


def scratch_views(be, part_o, part_ml, n_head: int, head_dim: int, splits: int) -> dict:
    """The attention scratch's views for each plan of up to `splits` splits over `n_head`
    heads: {1, 2, 4, ...: (part_o [n_head, s, head_dim], part_ml [n_head, s, 2])}. (The caller
    allocates the two buffers: the lazy-init detector names the allocation's call site.)"""
    views, s = {}, 1
    while s <= splits:
        views[s] = (be.reshape(part_o, (n_head, s, head_dim)), be.reshape(part_ml, (n_head, s, 2)))
        s *= 2
    return views


def progress_bar(it, progress: bool | None, desc: str):
    """`it` with a tqdm bar: progress True shows one, None shows one on a terminal once the loop
    takes over a second, False none (the iterable itself)."""
    if progress is False:
        return it
    from tqdm.auto import tqdm
    return tqdm(it, desc=desc, unit="step", disable=None if progress is None else False,
                delay=0.0 if progress else 1.0, leave=True)


class Requests:
    """What every engine does with a request, on top of its own reset / decode / tokens /
    describe and its ledger and graph caches (DecodeEngine on one device, lab/ranks.py's
    RankedEngine on several)."""

    def encode(self, prompt: str) -> np.ndarray:
        return self.model.tokenizer.encode(prompt)

    def generate(self, prompt: str, n_tokens: int, progress: bool | None = False) -> Generation:
        """Greedy generation of `n_tokens` after `prompt`; times the whole decode. `progress`:
        True shows a bar, None shows one on a terminal once the decode takes over a second.
        LAB_LOOP=device: one launch of the device loop runs every step (no bar: the host waits)."""
        ids = self.encode(prompt)
        self.reset(ids, n_tokens)
        steps = ids.size - 1 + n_tokens
        seconds = self.decode(steps, progress)
        tokens = self.tokens(ids.size + n_tokens)
        text = self.model.tokenizer.decode(tokens[ids.size:])
        return Generation(prompt, text, tokens, steps, seconds, self.describe())

    @property
    def graphs(self) -> dict:
        return dict(self._graphs)

    @property
    def capture_failures(self) -> dict:
        """{plan key: why its capture failed} for every plan that runs eagerly instead."""
        return dict(self._failed)

    def ledger_summary(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for e in self.ledger:
            out[e.outcome] = out.get(e.outcome, 0) + 1
        return out


class DecodeEngine(Requests):
    def __init__(self, model: Model, cfg: LabConfig | None = None, backend=None,
                 kv_init: str = "zeros", warm_up: bool = True, step: type[Step] = Step):
        """`step`: the step's pieces (lab/step.py); a subclass of Step is a variant for an
        experiment (e.g. a step with a join dropped), a subclass of FusedStep a variant of the
        fused step (LAB_FUSION=1 runs FusedStep when `step` is the clean Step). Deliberate bugs
        (cfg.bugs) override pieces on top of it."""
        self.model = model
        self._cfg = cfg or LabConfig()
        if self._cfg.ranks > 1:
            raise LabError(f"LAB_RANKS={self._cfg.ranks}: DecodeEngine drives one device; use "
                           f"lab.ranks.RankedEngine (or lab.ranks.make_engine, which picks)")
        self.backend = backend or make_backend(self._cfg)
        self.log = LaunchLog()
        self.backend.log = self.log
        self.ledger: list[LedgerEntry] = []
        self._graphs: dict[tuple, object] = {}
        self._defs: dict[tuple, object] = {}       # LAB_PLAN_SWITCH=update: captured, not instantiated
        self._live = None                          # the executable graph launched last
        self._loops: dict[tuple, object] = {}      # LAB_LOOP=device: toggles -> the loop graph
        self._built: dict[tuple, list] = {}        # plan key -> the step's items (clean engine)
        self._failed: dict[tuple, CaptureFailure] = {}   # plan keys whose capture failed
        self.position = 0
        self.n_prompt = 0
        self._steps = 0
        # the step's pieces: the clean step (fused or not), or the deliberate bugs' overrides
        # of it (lab/bugs.py)
        self._step = step
        self.pieces: Step = self._step_class(self._cfg)(self)
        self._retired: list = []  # buffers replaced by a lazy re-allocation; graphs may point at them
        self.warnings: list[str] = []
        self._alloc(kv_init)
        if warm_up:
            self.backend.warm_up(kernels.REGISTRY.values())
        self.bind()

    @property
    def cfg(self) -> LabConfig:
        return self._cfg

    @cfg.setter
    def cfg(self, value: LabConfig) -> None:
        """Switch launch toggles (GRAPH, PDL, OVERLAP, SPLIT_COMBINE, FUSION, LAUNCH) on the same
        buffers; graphs and built steps stay cached per plan key, and the key names each toggle
        that changes them (LAUNCH does not: both mechanisms capture the same graph). FUSION
        swaps the step's pieces (the host state lazy code recorded carries over). Toggles that
        change allocation (KV dtype, the lazy-allocation bugs) need a new engine."""
        alloc = ("kv_dtype", "bugs")
        if any(getattr(value, f) != getattr(self._cfg, f) for f in alloc):
            raise LabError(f"{', '.join(alloc)} change what the engine allocates: build a new "
                           f"DecodeEngine for them")
        if value.fusion != self._cfg.fusion:
            pieces = self._step_class(value)(self)
            pieces.lazy = self.pieces.lazy
            self.pieces = pieces
        self._cfg = value
        self.bind()

    def _step_class(self, cfg: LabConfig) -> type[Step]:
        """The step's pieces for `cfg`: the engine's step, or under LAB_FUSION=1 its fused form
        (FusedStep for the clean Step), with the deliberate bugs' overrides on top."""
        base = self._step
        if cfg.fusion and not issubclass(base, FusedStep):
            if base is not Step:
                raise LabError(f"step={base.__name__} is a variant of the one-op-per-kernel step; "
                               f"LAB_FUSION=1 runs the fused step (pass a subclass of FusedStep)")
            base = FusedStep
        elif not cfg.fusion and issubclass(base, FusedStep):
            raise LabError(f"step={base.__name__} is a variant of the fused step: it needs LAB_FUSION=1")
        return bugs.step_class(cfg.bugs, base)

    def bind(self) -> None:
        """Make this engine the backend's current user: its launch log, its PDL switch and its
        launch mechanism (two engines may share one backend, e.g. a benchmark's baseline and its
        arms)."""
        self.backend.log = self.log
        self.backend.pdl = self._pdl_usable()
        self.backend.mechanism = self.cfg.launch

    def _pdl_usable(self) -> bool:
        """LAB_PDL needs sm_90+: elsewhere it is refused with a message and the run goes on."""
        if not self.cfg.pdl:
            return False
        cc = getattr(self.backend, "compute_capability", lambda: (9, 0))()
        if cc < (9, 0):
            msg = (f"LAB_PDL=1 refused: programmatic dependent launch needs sm_90 or newer, this "
                   f"GPU is sm_{cc[0]}{cc[1]}; running without PDL")
            self.warnings.append(msg)
            warnings.warn(msg, stacklevel=3)
            return False
        return True

    # ---- allocation (once) -------------------------------------------------------------------
    def _alloc(self, kv_init: str) -> None:
        c, be = self.model.cfg, self.backend
        D, F, V, hd = c.d_model, c.d_ff, c.vocab_size, c.head_dim
        self.w = {}
        for name, arr in self.model.weights.items():
            self.w[name] = be.alloc(name, arr.shape, np.float32)
            be.upload(self.w[name], arr)
        b = self.buf = _Buffers()
        b.tokens = be.alloc("tokens", (c.max_seq,), np.int32)
        b.pos = be.alloc("pos", (1,), np.int32)
        b.n_prompt = be.alloc("n_prompt", (1,), np.int32)
        for name, n in (("x", D), ("h", D), ("qkv", 3 * D), ("q", D), ("o", D), ("act", F),
                        ("logits", V)):
            setattr(b, name, be.alloc(name, (n,), np.float32))
        # scratch for the largest plan, once (the lazy_scratch bug starts with one split instead)
        self.alloc_scratch(self.pieces.scratch_splits_at_start)
        cos, sin = rope_tables(hd, c.max_seq, c.rope_theta, np.float32)
        b.cos = be.alloc("rope_cos", cos.shape, np.float32)
        b.sin = be.alloc("rope_sin", sin.shape, np.float32)
        self.rope_host = (cos, sin)
        if self.pieces.tables_at_start_up:                # (lazy_table: on first use instead)
            be.upload(b.cos, cos)
            be.upload(b.sin, sin)
        b.plan_of = be.alloc("plan_of", (c.max_seq,), np.int32)
        be.upload(b.plan_of, np.searchsorted(plan_boundaries(c.max_seq), np.arange(c.max_seq),
                                             side="right").astype(np.int32))
        b.limit = be.alloc("limit", (1,), np.int32)
        # the fused step's last-block counters (zeroed; each launch leaves its slot at 0), and a
        # view per launch site, made here so no step ever creates one
        b.counters = be.alloc("counters", (c.n_layer + 1,), np.int32)
        self.counters = [be.rows(b.counters, i, i + 1) for i in range(c.n_layer + 1)]
        kv = np.dtype(self.cfg.kv_dtype)
        for i in range(c.n_layer):
            b.k_cache.append(be.alloc(f"k_cache.{i}", (c.max_seq, D), kv, init=kv_init))
            b.v_cache.append(be.alloc(f"v_cache.{i}", (c.max_seq, D), kv, init=kv_init))
        # row views for LAB_OVERLAP: wqkv rows [0, D) -> q, [D, 3D) -> k and v
        self.wqkv_views = [(be.rows(self.w[f"layers.{i}.wqkv"], 0, D),
                            be.rows(self.w[f"layers.{i}.wqkv"], D, 3 * D)) for i in range(c.n_layer)]
        self.qkv_views = (be.rows(b.qkv, 0, D), be.rows(b.qkv, D, 3 * D))

    def alloc_scratch(self, splits: int) -> None:
        """Attention scratch for plans of up to `splits` splits, and its views for each plan
        (made here, so no step ever creates one)."""
        c, be, b = self.model.cfg, self.backend, self.buf
        if b.part_o is not None:
            self._retired += [b.part_o, b.part_ml]  # a graph may still point at them
        b.part_o = be.alloc("part_o", (c.n_head * splits * c.head_dim,), np.float32)
        b.part_ml = be.alloc("part_ml", (c.n_head * splits * 2,), np.float32)
        self.partials = scratch_views(be, b.part_o, b.part_ml, c.n_head, c.head_dim, splits)

    # ---- one step ----------------------------------------------------------------------------
    def plan(self, position: int | None = None) -> Plan:
        return decode_plan(self.position if position is None else position, self.model.cfg, self.cfg)

    def step_launches(self, plan: Plan) -> list[Launch]:
        """The decode step's kernel launches for `plan`, in issue order. A query: nothing is
        issued, cached, allocated or uploaded (for a clean engine whose step for this plan key
        was already issued, the very objects its steps issue)."""
        items = self._built.get(plan.key)
        if items is not None:
            return [x for x in items if isinstance(x, Launch)]
        return self.pieces.launches(plan)

    def _items(self, plan: Plan):
        """The step's items to issue. Clean engine: the list built once per plan key (its build
        does no host work and does not depend on the position). A step rebuilt each step (most
        deliberate bugs): the build itself, issued as it yields, so the bug's host work happens
        between launches, where a capture sees it (and where the lazy-init detector places it)."""
        if self.pieces.rebuilt_each_step:
            return self.pieces.items(plan)
        items = self._built.get(plan.key)
        if items is None:
            items = self._built[plan.key] = list(self.pieces.items(plan))
        return items

    def _issue(self, item) -> None:
        if isinstance(item, Launch):
            self.backend.launch(item)
        elif isinstance(item, StreamWait):
            self.backend.record_wait(item.src, item.dst)
        else:
            item.run()                                   # HostWork (deliberate bugs only)

    # ---- requests ----------------------------------------------------------------------------
    def reset(self, prompt_ids, max_new_tokens: int = 0) -> None:
        """Start a request: the prompt goes to device memory, position to 0."""
        c = self.model.cfg
        ids = check_request(c, prompt_ids, max_new_tokens)
        host = np.zeros(c.max_seq, np.int32)
        host[:ids.size] = ids
        self.backend.upload(self.buf.tokens, host)
        self.backend.upload(self.buf.pos, np.zeros(1, np.int32))
        self.backend.upload(self.buf.n_prompt, np.array([ids.size], np.int32))
        self.position, self.n_prompt = 0, int(ids.size)

    def seek(self, position: int) -> None:
        """Jump the current request to `position` (device `pos` and host mirror) WITHOUT
        computing the positions before it: the KV rows in between are never written.

        What that is a fixture for depends on what the cache holds. With `kv_init="zeros"` (the
        default) a step at `position` does the work of a step at that context length (same plan,
        same bytes read) over reproducible zeros: usable for timing these kernels, whose work
        does not depend on the values, and for a narrow A/A byte-compare -- but zeros are not a
        real prefix, so it validates nothing about long-context outputs. With `kv_init="empty"`
        attention reads uninitialised memory: two runs differ, so it is no byte-compare fixture,
        and no trustworthy timing fixture either (garbage may hold NaN, inf or denormals, and
        nobody checked that the timing does not depend on them). Needs `reset(prompt)` first;
        the token read at `position` is the prompt's or the id 0 that reset wrote there, a valid
        id. `seek(self.position)` writes only `pos`: a host write between graph launches.
        """
        limit = self.model.cfg.max_seq - 1      # one step at `position` writes position + 1
        if self.n_prompt == 0:
            raise LabError("seek needs a request: call reset(prompt_ids) first")
        if not 0 <= position < limit:
            raise LabError(f"seek to position {position} is outside [0, {limit}): a decode step "
                           f"there would pass max_seq {self.model.cfg.max_seq}")
        self.backend.upload(self.buf.pos, np.array([position], np.int32))
        self.position = int(position)

    def step(self) -> LedgerEntry:
        """Decode one position: replay the plan's graph (capturing it on a miss) or run eagerly."""
        if self.position + 1 >= self.model.cfg.max_seq:
            raise LabError(f"position {self.position + 1} would exceed max_seq")
        plan = self.plan()
        self.log.step = self._steps
        self.backend.host_step("graph" if self.cfg.graph else "eager")
        if not self.cfg.graph:
            entry = self._eager(plan, "eager")
        else:
            entry = self._graph_step(plan)
        self.ledger.append(entry)
        self.position += 1
        self._steps += 1
        return entry

    def _eager(self, plan: Plan, outcome: str, reason: str = "") -> LedgerEntry:
        self.pieces.prelude(plan)
        for item in self._items(plan):
            self._issue(item)
        return LedgerEntry(self._steps, self.position, plan.key, outcome, reason)

    def _graph_step(self, plan: Plan) -> LedgerEntry:
        key = plan.key
        if key in self._failed:
            return self._eager(plan, "fallback", self._failed[key].reason)
        graph, outcome, note = self._graphs.get(key), "replay", ""
        failure = None
        if graph is None and self.cfg.plan_switch == "update" and self._live is not None:
            graph, note, failure = self._update_live(plan)
            outcome = "update"
        if graph is None and failure is None:
            graph, failure = self._new_graph(plan)
            outcome = "capture"
        if graph is None:
            self._failed[key] = failure
            return self._eager(plan, "fallback", failure.reason)
        graph.launch()
        self._live = graph
        self.log.record_replay(key, graph.node_count)
        return LedgerEntry(self._steps, self.position, key, outcome, note)

    def _new_graph(self, plan: Plan):
        """Capture and instantiate the plan's graph. Under LAB_PLAN_SWITCH=update the captured
        graph is kept too, so a later switch back to this plan is an update, not a capture."""
        if self.cfg.plan_switch != "update":
            return self.capture(plan)
        source, failure = self._kept_capture(plan)
        if source is None:
            return None, failure
        graph = self._graphs[plan.key] = self.backend.instantiate(source)
        return graph, None

    def _kept_capture(self, plan: Plan):
        """The plan's captured (not instantiated) graph, captured on first need and kept:
        (source, None), or (None, CaptureFailure)."""
        source = self._defs.get(plan.key)
        if source is None:
            source, failure = self.capture(plan, instantiate=False)
            if source is None:
                return None, failure
            self._defs[plan.key] = source
        return source, None

    def _update_live(self, plan: Plan):
        """LAB_PLAN_SWITCH=update: give the live graph the new plan's parameters in place.
        (graph, "", None) when done; (None, "update-refused: why", None) when the runtime refused,
        and then the caller instantiates a graph of its own for the plan, as recapture does;
        (None, "", CaptureFailure) when the step could not be captured at all."""
        source, failure = self._kept_capture(plan)
        if source is None:
            return None, "", failure
        why = self._live.update(source)
        if why is not None:
            return None, f"update-refused: {why}", None
        for k in [k for k, g in self._graphs.items() if g is self._live]:
            del self._graphs[k]               # the live graph now runs this plan, not its old one
        self._graphs[plan.key] = self._live
        return self._live, "", None

    def capture(self, plan: Plan, instantiate: bool = True):
        """Capture the step for `plan` into a graph: (graph, None), or (None, CaptureFailure)
        after ending the failed capture cleanly so that the caller can re-issue the step eagerly.
        A capture records the launches and runs none of the step's kernels: device memory is as
        it was until the graph is launched. A failed capture leaves no graph for the key and
        restores the host state that lazy code recorded while the capture was open.
        instantiate=False: the captured graph only (kept by the caller, not by the engine)."""
        be, pieces = self.backend, self.pieces
        saved = dict(pieces.lazy)
        pieces.prelude(plan)
        n, at = 0, "begin_capture"
        try:
            be.begin_capture()
            for item in self._items(plan):
                at = (f"launch {n} ({item.name})" if isinstance(item, Launch) else
                      f"host work before launch {n} ({item.what})" if isinstance(item, HostWork) else
                      f"stream wait before launch {n}")
                self._issue(item)
                n += isinstance(item, Launch)
            at, n = "end_capture", None
            graph = be.end_capture(instantiate=instantiate)
        except CaptureError as exc:
            reason = exc.reason
            if be.is_capturing():
                try:
                    be.end_capture()
                except CaptureError as sticky:
                    reason = sticky.reason
            pieces.lazy = saved  # the captured operations never ran: undo what lazy code recorded
            return None, CaptureFailure(reason, at, n)
        except BaseException:
            # not a capture problem (a programming error, an interrupt): end the capture, undo
            # the host state, and let the error through; the engine stays usable
            be.abort_capture()
            pieces.lazy = saved
            raise
        if instantiate:
            self._graphs[plan.key] = graph
        return graph, None

    # ---- generation (generate, encode: Requests) --------------------------------------------
    def describe(self) -> str:
        return self.backend.describe()

    def decode(self, steps: int, progress: bool | None = False) -> float:
        """Decode `steps` steps from the current position (after reset, or seek); the seconds
        they took on the backend's clock (which waits for issued work: wall time on a GPU, model
        time in the simulator). LAB_LOOP=device: ONE launch runs them all (no bar then)."""
        if self.position + steps >= self.model.cfg.max_seq:
            raise LabError(f"{steps} steps from position {self.position} would exceed max_seq "
                           f"{self.model.cfg.max_seq}")
        loop = self.device_loop() if self.cfg.loop == "device" else None
        if loop is not None:
            return self._run_device_loop(loop, steps)
        t0 = self.backend.clock()
        for _ in progress_bar(range(steps), progress, "decode"):
            self.step()
        return self.backend.clock() - t0

    # ---- the whole generation in one launch (LAB_LOOP=device) --------------------------------
    def device_loop_refusal(self) -> str | None:
        """Why LAB_LOOP=device cannot run here (None: it can)."""
        if not self.cfg.graph:
            return "it needs LAB_GRAPH=1 (the loop is one graph)"
        if self.cfg.bugs:
            return ("it runs the clean step only: a deliberate bug's host work cannot run inside "
                    "the loop, and a step that stops the position would never end it")
        return self.backend.loop_support()

    def device_loop(self):
        """The loop graph for the current toggles (built on first use: one body per plan), or
        None after a warning when it is refused; generate then runs the host loop."""
        why = self.device_loop_refusal()
        key = self.plan(0).key[2:]                 # the toggles: every plan of them shares a loop
        if why is None and key not in self._loops:
            plans = [self.plan(p) for p in [0] + plan_boundaries(self.model.cfg.max_seq)]

            def issue_body(k):
                for item in self._items(plans[k]):
                    self._issue(item)
            try:
                b = self.buf
                self._loops[key] = self.backend.build_loop(len(plans), issue_body, b.pos,
                                                           b.plan_of, b.limit)
            except (CaptureError, LabError) as exc:
                why = f"the device loop could not be built: {exc}"
        if why is not None:
            msg = f"LAB_LOOP=device refused: {why}; running the host loop"
            if msg not in self.warnings:
                self.warnings.append(msg)
                warnings.warn(msg, stacklevel=3)
            return None
        return self._loops[key]

    def _run_device_loop(self, loop, steps: int) -> float:
        """`steps` steps from the current position in ONE launch; the ledger gets a "device"
        entry per step (the plan the device chose from plan_of, known here after the fact)."""
        start = self.position
        self.backend.upload(self.buf.limit, np.array([start + steps], np.int32))
        self.log.step = self._steps
        t0 = self.backend.clock()
        loop.launch()
        seconds = self.backend.clock() - t0
        self.log.record_replay(("device loop",), loop.node_count)
        for i in range(steps):
            self.ledger.append(LedgerEntry(self._steps + i, start + i, self.plan(start + i).key,
                                           "device"))
        self.position, self._steps = start + steps, self._steps + steps
        return seconds

    def tokens(self, count: int | None = None) -> np.ndarray:
        """Token ids in device memory (prompt + generated), read only when asked for."""
        count = self.position + 1 if count is None else count
        return self.backend.download(self.buf.tokens)[:count]

    def logits(self) -> np.ndarray:
        return self.backend.download(self.buf.logits)

    def device_position(self) -> int:
        return int(self.backend.download(self.buf.pos)[0])

