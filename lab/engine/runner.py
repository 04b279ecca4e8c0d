"""DecodeEngine: owns every buffer, issues the decode step (lab/engine/step.py: its launches, in
named pieces) eagerly or as a CUDA graph (one graph per plan key), falling back to eager when a
capture fails. One class for one device and for tensor-parallel ranks (LAB_RANKS=2).

Read top to bottom, as a model runner: allocate (weights, state, scratch: lab/engine/buffers.py) ->
warm up -> reset(prompt) -> step(): decode_plan(position) -> the graph for plan.key (captured
on a miss: `capture`) or the eager launches. The optional modes, each one place to skip:
  graphs, fallback, LAB_PLAN_SWITCH=update   lab/engine/graphs.py (GraphCache)
  LAB_LOOP=device (generate in one launch)   lab/engine/device_loop.py (DeviceLoop)
  LAB_RANKS=2 (one device per rank)          lab/engine/ranks.py (RankStep, TensorParallel): every
                                             rank's step is issued in lockstep, collective by
                                             collective; a graph per rank per plan key
  LAB_FUSION=1 (18 launches per token)       lab/engine/step.py (FusedStep): swaps the step's pieces
  LAB_PERSISTENT=1 (1 launch per token)      lab/engine/persistent.py (PersistentStep): the fused
                                             step's math in one cooperative kernel
  LAB_DRAFT=k (speculative decoding)         lab/engine/spec.py (SpecStep, SpecDecode): the verify
                                             step over k + 1 positions, decoded in rounds
  deliberate bugs                            lab/engine/bugs.py: overrides of the step's pieces

A clean engine builds each plan's step once and issues the SAME Launch objects at every later
step with that plan key (eager or captured), so a backend can prepare each launch once
(LAB_LAUNCH=prebound). A deliberate bug overrides pieces of the step; most make the step depend
on the position or on host state, so it is rebuilt and issued as it is built.

The host keeps `self.position`, a mirror used only to choose the plan; the device keeps `pos`
(lab/engine/buffers.py lists the device-resident state). A captured launch keeps the argument values
it was captured with (buffers by address) unless the graph's nodes are updated, but the memory
behind them stays live: a replay reads whatever `pos` holds when it runs. Advancing `pos` inside
the graph is this engine's choice; writing it between graph launches (an upload, or on a GPU a
kernel-node parameter update) is correct too (notebook 02).
"""
from __future__ import annotations

import warnings

import numpy as np

import kernels
from . import bugs
from lab.backend import Collective, Launch, StreamWait, make_devices
from .buffers import Allocation, Device
from lab.config import LabConfig
from .device_loop import DeviceLoop
from lab.errors import CaptureError, CollectiveError, LabError
from .graphs import GraphCache
from .persistent import PersistentStep
from lab.backend.instrument import LaunchLog
from lab.ledger import CaptureFailure, LedgerEntry
from lab.model import Model, check_request
from lab.plan import Plan, decode_plan
from .ranks import TensorParallel, check_divisible, rank_step_class
from .requests import Generation, Requests  # noqa: F401 (Generation: where it was)
from .spec import SpecDecode, spec_step_class
from .step import FusedStep, HostWork, Step


def make_engine(model: Model, cfg: LabConfig | None = None, **kw) -> "DecodeEngine":
    """The engine for `cfg` (any LAB_RANKS: one class)."""
    return DecodeEngine(model, cfg or LabConfig(), **kw)


def step_for(cfg: LabConfig, base: type[Step] = Step) -> type[Step]:
    """The step's pieces for `cfg`: `base` (the engine's step), or under LAB_FUSION=1 its fused
    form (FusedStep for the clean Step), or with ranks the rank step, with the deliberate bugs'
    overrides on top."""
    if cfg.ranks > 1:
        return rank_step_class(cfg.bugs, base)
    if cfg.draft:
        return spec_step_class(cfg.bugs, base)
    if cfg.persistent:
        if not (base is Step or issubclass(base, PersistentStep)):
            raise LabError(f"step={base.__name__} is not a variant of the persistent step: "
                           f"LAB_PERSISTENT=1 runs PersistentStep (pass a subclass of it)")
        return bugs.step_class(cfg.bugs, PersistentStep if base is Step else base)
    if issubclass(base, PersistentStep):
        raise LabError(f"step={base.__name__} is a variant of the persistent step: it needs "
                       f"LAB_PERSISTENT=1")
    if cfg.fusion and not issubclass(base, FusedStep):
        if base is not Step:
            raise LabError(f"step={base.__name__} is a variant of the one-op-per-kernel step; "
                           f"LAB_FUSION=1 runs the fused step (pass a subclass of FusedStep)")
        base = FusedStep
    elif not cfg.fusion and issubclass(base, FusedStep):
        raise LabError(f"step={base.__name__} is a variant of the fused step: it needs LAB_FUSION=1")
    return bugs.step_class(cfg.bugs, base)


class DecodeEngine(Requests, Allocation, GraphCache, DeviceLoop, TensorParallel, SpecDecode):
    def __init__(self, model: Model, cfg: LabConfig | None = None, backend=None,
                 kv_init: str = "zeros", warm_up: bool = True, step: type[Step] = Step,
                 group=None):
        """`backend`: the device (one rank); `group`: the devices (LAB_RANKS>1; make_ranks's by
        default). `step`: the step's pieces (lab/engine/step.py); a subclass of Step is a variant
        for an experiment (e.g. a step with a join dropped), a subclass of FusedStep a variant of
        the fused step (LAB_FUSION=1 runs FusedStep when `step` is the clean Step), a subclass
        of RankStep one of the rank step. Deliberate bugs (cfg.bugs) override pieces on top."""
        self.model = model
        self._cfg = cfg or LabConfig()
        self.ranks = self._cfg.ranks
        if self.ranks > 1:
            check_divisible(model.cfg, self.ranks)
        self.group = make_devices(self._cfg, backend, group)
        self.devices = [Device(be, LaunchLog()) for be in self.group.backends]
        for d in self.devices:
            d.backend.log = d.log
        self.ledger: list[LedgerEntry] = []
        self._graphs: dict[tuple, object] = {}     # plan key -> graph (ranks: one per rank)
        self._defs: dict[tuple, object] = {}       # LAB_PLAN_SWITCH=update: captured, not instantiated
        self._live = None                          # the executable graph launched last
        self._loops: dict[tuple, object] = {}      # LAB_LOOP=device: toggles -> the loop graph
        self._built: dict[tuple, list] = {}        # (rank, plan key) -> the step's items (clean)
        self._failed: dict[tuple, CaptureFailure] = {}   # plan keys whose capture failed
        self.position = self.n_prompt = self._steps = 0
        self.collectives_issued = 0
        self._retired: list = []  # buffers replaced by a lazy re-allocation; graphs may point at them
        self.warnings: list[str] = []
        # allocate every device's buffers once, then bind each device its step's pieces: the
        # clean step (fused or not, one device or a rank), or the bugs' overrides of it
        self._step = step
        step_cls = step_for(self._cfg, self._step)
        self._allocate(step_cls, kv_init)
        self._pieces = [step_cls(self, r) for r in range(self.ranks)]
        # warm up: every kernel compiled and loaded (and NCCL's connections made) before any
        # timed region or capture
        if warm_up:
            for be in self.backends:
                be.warm_up(kernels.REGISTRY.values())
            if self.ranks > 1:
                self.warm_up_collectives()
        self.bind()

    # ---- a request: reset, then step; a step replays its plan's graph, or captures it ------------
    def reset(self, prompt_ids, max_new_tokens: int = 0) -> None:
        """Start a request: the prompt goes to device memory, position to 0."""
        c = self.model.cfg
        ids = check_request(c, prompt_ids, max_new_tokens)
        host = np.zeros(c.max_seq, np.int32)
        host[:ids.size] = ids
        for be, b in zip(self.backends, self.bufs):
            be.upload(b.tokens, host)
            be.upload(b.pos, np.zeros(1, np.int32))
            be.upload(b.n_prompt, np.array([ids.size], np.int32))
        if self.cfg.draft:   # the verify step stops at `limit` (decode sets it); counts from 0
            be.upload(b.limit, np.array([c.max_seq - 1], np.int32))
            self.clear_spec_stats()
        self.position, self.n_prompt = 0, int(ids.size)

    def step(self) -> LedgerEntry:
        """Decode one position: replay the plan's graph (capturing it on a miss) or run eagerly."""
        if self.position + 1 >= self.model.cfg.max_seq:
            raise LabError(f"position {self.position + 1} would exceed max_seq")
        plan = self.plan()
        for d in self.devices:
            d.log.step = self._steps
            d.backend.host_step("graph" if self.cfg.graph else "eager")
        if not self.cfg.graph:
            entry = self._eager(plan, "eager")
        else:
            entry = self._graph_step(plan)
        self.ledger.append(entry)
        self.position += 1
        self._steps += 1
        return entry

    def _eager(self, plan: Plan, outcome: str, reason: str = "") -> LedgerEntry:
        for pieces in self._pieces:
            pieces.prelude(plan)
        self._issue_step(plan)
        return LedgerEntry(self._steps, self.position, plan.key, outcome, reason)

    def capture(self, plan: Plan, instantiate: bool = True):
        """Capture the step for `plan` into a graph (with ranks: one per rank, every capture open
        at once, in global mode, ended before any is instantiated): (graph, None), or (None,
        CaptureFailure) after ending the failed captures cleanly so that the caller can re-issue
        the step eagerly. A capture records the launches and runs none of the step's kernels:
        device memory is as it was until the graph is launched. A failed capture leaves no graph
        for the key and restores the host state that lazy code recorded while it was open.
        instantiate=False: the captured graph only (kept by the caller, not by the engine)."""
        saved = [dict(p.lazy) for p in self._pieces]
        for pieces in self._pieces:
            pieces.prelude(plan)
        where, opened = ["begin_capture", 0], []
        try:
            for be in self.backends:
                be.begin_capture()
                opened.append(be)
            self._issue_step(plan, where)
            where = ["end_capture", None]
            graph = self._end_captures(instantiate)
        except CaptureError as exc:
            reason = self._close_failed_capture(exc, opened)
            self._restore_lazy(saved)  # the captured operations never ran
            return None, CaptureFailure(reason, *where)
        except BaseException:
            # not a capture problem (a programming error, an interrupt): end the captures, undo
            # the host state, and let the error through; the engine stays usable
            for be in reversed(opened):
                be.abort_capture()
            self._restore_lazy(saved)
            raise
        if instantiate:
            self._graphs[self.graph_key(plan)] = graph
        return graph, None

    def _restore_lazy(self, saved: list) -> None:
        for pieces, lazy in zip(self._pieces, saved):
            pieces.lazy = lazy

    # ---- issuing one step (eager, or into a capture) ---------------------------------------------
    def plan(self, position: int | None = None) -> Plan:
        return decode_plan(self.position if position is None else position, self.model.cfg, self.cfg)

    def _items(self, plan: Plan, rank: int = 0):
        """The step's items to issue. Clean engine: the list built once per plan key (its build
        does no host work and does not depend on the position). A step rebuilt each step (most
        deliberate bugs): the build itself, issued as it yields, so the bug's host work happens
        between launches, where a capture sees it (and where the lazy-init detector places it)."""
        pieces = self._pieces[rank]
        if pieces.rebuilt_each_step:
            return pieces.items(plan)
        items = self._built.get((rank, plan.key))
        if items is None:
            items = self._built[(rank, plan.key)] = list(pieces.items(plan))
        return items

    def _issue(self, item, rank: int = 0) -> None:
        be = self.devices[rank].backend
        if isinstance(item, Launch):
            be.launch(item)
        elif isinstance(item, StreamWait):
            be.record_wait(item.src, item.dst)
        else:
            item.run()                                   # HostWork (deliberate bugs only)

    def _issue_step(self, plan: Plan, where: list | None = None) -> None:
        """Issue every rank's step (one device: its step, item by item). Ranks in lockstep: each
        rank's items up to its next collective, then every rank's pending collective in one
        group. A rank with none left while another waits in one is issued as it is: the device
        (or the simulator) meets the mismatch. `where`: [what is being issued, launches before
        it], kept up to date for a capture's failure report."""
        if self.ranks > 1 and not self.group.simulated:
            why = self.collective_order(plan)
            if why is not None:                  # never hang a real GPU pair
                raise CollectiveError(f"refused before issuing: {why}; NCCL would hang both GPUs")
        its = [iter(self._items(plan, r)) for r in range(self.ranks)]
        done = [False] * self.ranks
        while not all(done):
            pending = []
            for r, it in enumerate(its):
                if done[r]:
                    continue
                for item in it:
                    if isinstance(item, Collective):
                        pending.append((r, item))
                        break
                    if where is not None:
                        where[0] = _issuing(item, where[1])
                    self._issue(item, r)
                    if where is not None:
                        where[1] += isinstance(item, Launch)
                else:
                    done[r] = True
            if pending:
                with self.group.collectives():
                    for r, coll in pending:
                        self.backends[r].collective(coll)
                self.collectives_issued += len(pending)

    # ---- queries: nothing is issued --------------------------------------------------------------
    def step_items(self, plan: Plan, rank: int = 0) -> list:
        """Rank `rank`'s items for `plan` (a query: nothing is issued, cached, allocated or
        uploaded; for a clean engine whose step for this plan key was already issued, the very
        objects its steps issue)."""
        items = self._built.get((rank, plan.key))
        return list(items) if items is not None else list(self._pieces[rank].items(plan))

    def step_launches(self, plan: Plan, rank: int = 0) -> list[Launch]:
        """The decode step's kernel launches for `plan`, in issue order (a query)."""
        items = self._built.get((rank, plan.key))
        if items is None:
            return self._pieces[rank].launches(plan)
        return [x for x in items if isinstance(x, Launch)]

    # ---- toggles switched on a live engine -------------------------------------------------------
    @property
    def cfg(self) -> LabConfig:
        return self._cfg

    @cfg.setter
    def cfg(self, value: LabConfig) -> None:
        """Switch launch toggles (GRAPH, PDL, OVERLAP, SPLIT_COMBINE, FUSION, LAUNCH) on the same
        buffers; graphs and built steps stay cached per plan key, and the key names each toggle
        that changes them (LAUNCH does not: both mechanisms capture the same graph). FUSION
        swaps the step's pieces (the host state lazy code recorded carries over). Toggles that
        change allocation (KV dtype, the lazy-allocation bugs, ranks) need a new engine."""
        alloc = ("kv_dtype", "bugs", "ranks", "draft", "draft_splits", "persistent")
        if any(getattr(value, f) != getattr(self._cfg, f) for f in alloc):
            raise LabError(f"{', '.join(alloc)} change what the engine allocates: build a new "
                           f"DecodeEngine for them")
        if value.fusion != self._cfg.fusion:
            pieces = step_for(value, self._step)(self)
            pieces.lazy = self.pieces.lazy
            self.pieces = pieces
        self._cfg = value
        self.bind()

    @property
    def pieces(self):
        """The step's pieces: one device's Step; with ranks, a list of one per rank."""
        return self._pieces[0] if self.ranks == 1 else list(self._pieces)

    @pieces.setter
    def pieces(self, value) -> None:
        self._pieces = [value] if self.ranks == 1 else list(value)

    def bind(self) -> None:
        """Make this engine its backends' current user: its launch logs, its PDL switch and its
        launch mechanism (two engines may share one backend, e.g. a benchmark's baseline and its
        arms)."""
        for d in self.devices:
            d.backend.log = d.log
            d.backend.pdl = self._pdl_usable()
            d.backend.mechanism = self.cfg.launch
            d.backend.blocking = self.cfg.launch_blocking

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

def _issuing(item, launches: int) -> str:
    """Where a capture is when it issues `item` after `launches` launches (its failure report)."""
    if isinstance(item, Launch):
        return f"launch {launches} ({item.name})"
    if isinstance(item, HostWork):
        return f"host work before launch {launches} ({item.what})"
    return f"stream wait before launch {launches}"
