"""DecodeEngine: allocate -> warm up -> reset(prompt) -> step(), for one device or tensor-parallel
ranks (LAB_RANKS=2). Its three parts, each built alone in a test:
  devices      lab/engine/devices.py      every rank's backend, log and buffers
  graph_cache  lab/engine/graph_cache.py  one graph per plan key: get or capture, update, fallback
  issuer       lab/engine/issuer.py       a step's items onto one device, or ranks in lockstep
The step is lab/engine/step.py's, composed from the config by lab/engine/compose.py; generate,
decode, drafting's rounds, the device loop and the ranks' bill are drivers that take an engine.
`position` mirrors the device's `pos` (only to choose the plan); `track_position` writes it.
"""
from __future__ import annotations

import weakref
from collections import Counter

import numpy as np

import kernels
from lab.backend import make_devices
from lab.config import LabConfig
from lab.errors import LabError
from lab.ledger import LedgerEntry
from lab.model import Model, check_request
from lab.plan import Plan, decode_plan, plan_boundaries
from . import device_loop, draft, ranks, requests
from .compose import compose_step
from .devices import Devices
from .graph_cache import GraphCache
from .issuer import Issuer
from .step import Step, step_kernels


def make_engine(model: Model, cfg: LabConfig | None = None, **kw) -> "DecodeEngine":
    """The engine for `cfg` (any LAB_RANKS: one class)."""
    return DecodeEngine(model, cfg or LabConfig(), **kw)


class DecodeEngine:
    def __init__(self, model: Model, cfg: LabConfig | None = None, backend=None,
                 kv_init: str = "zeros", warm_up: bool = True, step: type[Step] = Step,
                 group=None):
        """`backend`: the device (one rank); `group`: the devices (LAB_RANKS>1). `step`: the
        step's pieces (lab/engine/step.py), or a variant of its mode's step (compose_step)."""
        self.model, self._cfg, self._step = model, cfg or LabConfig(), step
        self.ranks = self._cfg.ranks
        ranks.check_divisible(model.cfg, self.ranks)
        self.group = make_devices(self._cfg, backend, group)
        self.ledger: list[LedgerEntry] = []
        self.warnings: list[str] = []
        self.loops: dict[tuple, object] = {}       # LAB_LOOP=device: toggles -> the loop graph
        self._position = self.n_prompt = self._steps = 0
        # allocate: every device's buffers once (the step's own among them), before any capture
        step_cls = compose_step(self._cfg, step)
        self.devices = Devices(model, self._cfg, self.group, step_cls, kv_init, ranks.shard)
        self.issuer = Issuer(self.backends, self.group, [step_cls(self, r) for r in range(self.ranks)])
        me = weakref.proxy(self)   # (no cycle: a dropped engine's memory goes at once)
        self.graph_cache = GraphCache(self.backends, self.group, lambda p, i: me.capture(p, i))
        # warm up: its kernels compiled (NCCL's connections made) before any timing or capture
        self._warm = warm_up
        if warm_up:
            self._warm_up()
            if self.ranks > 1:
                ranks.warm_up_collectives(self.devices)
        self.bind()

    def _warm_up(self) -> None:
        """Compile the kernels the step launches at any plan of the current toggles."""
        plans = [self.plan(p) for p in [0] + plan_boundaries(self.model.cfg.max_seq)]
        for pieces, be in zip(self.issuer.pieces, self.backends):
            be.warm_up([k for k in step_kernels(pieces, plans) if kernels.REGISTRY.get(k.name) is k])

    # ---- a request: reset, then step; a step replays its plan's graph, or runs eagerly ----------
    def reset(self, prompt_ids, max_new_tokens: int = 0) -> None:
        """Start a request: the prompt goes to device memory, position to 0."""
        c = self.model.cfg
        ids = check_request(c, prompt_ids, max_new_tokens)
        host = np.zeros(c.max_seq, np.int32)
        host[:ids.size] = ids
        for name, values in (("tokens", host), ("pos", [0]), ("n_prompt", [ids.size])):
            self.devices.upload(name, np.asarray(values, np.int32))
        if self.cfg.draft:   # the verify step stops at `limit` (decode sets it); counts from 0
            self.devices.upload("limit", np.array([c.max_seq - 1], np.int32))
            draft.clear_stats(self)
        self.n_prompt = int(ids.size)
        self.track_position(0, 0)

    def step(self) -> LedgerEntry:
        """Decode one position: replay the plan's graph (capturing it on a miss) or run eagerly."""
        if self.position + 1 >= self.model.cfg.max_seq:
            raise LabError(f"position {self.position + 1} would exceed max_seq")
        plan = self.plan()
        for d in self.devices:
            d.log.step = self._steps
            d.backend.host_step("graph" if self.cfg.graph else "eager")
        key = self.graph_key(plan) if self.cfg.graph else plan.key
        graph, outcome, note = (self.graph_cache.get(plan, key, self.cfg.plan_switch == "update")
                                if self.cfg.graph else (None, "eager", ""))
        if graph is None:            # eager (LAB_GRAPH=0), or the fallback of a failed capture
            for pieces in self.issuer.pieces:
                pieces.prelude(plan)
            self.issuer.issue_step(plan)
            entry = LedgerEntry(self._steps, self.position, plan.key, outcome, note)
        else:
            self.graph_cache.replay(graph, self.logs, key)
            entry = LedgerEntry(self._steps, self.position, key, outcome, note, plan.key)
        self.ledger.append(entry)
        self.track_position(self.position + 1)
        return entry

    def capture(self, plan: Plan, instantiate: bool = True):
        """The step for `plan` captured (ranks: a graph per rank): (graph, None), or (None,
        CaptureFailure) with the captures ended and the lazy host state restored; nothing runs.
        instantiate=False: the captured graph only (kept by the caller)."""
        pieces = self.issuer.pieces
        saved = [dict(p.lazy) for p in pieces]
        for p in pieces:
            p.prelude(plan)
        graph = None
        try:
            graph, failure = self.graph_cache.record(
                lambda where: self.issuer.issue_step(plan, where), instantiate)
        finally:
            if graph is None:   # failed, or raised: the captured operations never ran
                for p, lazy in zip(pieces, saved):
                    p.lazy = lazy
        if graph is not None and instantiate:
            self.graph_cache.put(self.graph_key(plan), graph)
        return graph, failure

    def track_position(self, position: int, steps: int = 1) -> None:
        """The one writer of `position`: the device's `pos` is at `position` after `steps` more
        steps (a step, a device loop, a round of drafted steps; reset and seek)."""
        self._position, self._steps = int(position), self._steps + steps

    position = property(lambda self: self._position, doc="the host's mirror of the device's pos")

    def seek(self, position: int) -> None:
        """Jump the request to `position` (device `pos` and host mirror) WITHOUT computing the
        positions before it: the KV rows in between are never written (what that is a fixture
        for: lab/engine/requests.py's check_seek)."""
        requests.check_seek(self, position)
        self.devices.upload("pos", np.array([position], np.int32))
        self.track_position(position, 0)

    # ---- queries: nothing is issued --------------------------------------------------------------
    def plan(self, position: int | None = None) -> Plan:
        return decode_plan(self.position if position is None else position, self.model.cfg, self.cfg)

    def graph_key(self, plan: Plan) -> tuple:
        return self.issuer.pieces[0].graph_key(plan)

    def step_launches(self, plan: Plan, rank: int = 0) -> list:
        return self.issuer.step_launches(plan, rank)

    # ---- toggles switched on a live engine -------------------------------------------------------
    @property
    def cfg(self) -> LabConfig:
        return self._cfg

    @cfg.setter
    def cfg(self, value: LabConfig) -> None:
        """Switch launch toggles on the same buffers (graphs and built steps stay cached per plan
        key); FUSION swaps the step's pieces. Toggles that change allocation are refused."""
        alloc = ("kv_dtype", "bugs", "ranks", "draft", "drafter", "draft_splits", "persistent")
        if any(getattr(value, f) != getattr(self._cfg, f) for f in alloc):
            raise LabError(f"{', '.join(alloc)} change what the engine allocates: build a new "
                           f"DecodeEngine for them")
        if value.fusion != self._cfg.fusion:
            pieces = compose_step(value, self._step)(self)
            pieces.lazy = self.pieces.lazy
            self.pieces = pieces
        self._cfg = value
        if self._warm:
            self._warm_up()
        self.bind()

    pieces = property(  # one device's Step; with ranks, a list of one per rank
        lambda self: self.issuer.pieces[0] if self.ranks == 1 else list(self.issuer.pieces),
        lambda self, v: setattr(self.issuer, "pieces", [v] if self.ranks == 1 else list(v)))

    def bind(self) -> None:
        """Make this engine its backends' current user (two engines may share one backend)."""
        self.devices.bind(self.cfg, self.warnings)

    def close(self) -> None:
        """Release every graph, then the communicators (the other order can hang); unusable after."""
        self.graph_cache.release()
        self.devices.close()

    # ---- the drivers' and the parts' public face --------------------------------------------------
    def encode(self, prompt: str) -> np.ndarray:
        return self.model.tokenizer.encode(prompt)

    def generate(self, prompt: str, n_tokens: int, progress: bool | None = False):
        return requests.generate(self, prompt, n_tokens, progress)

    def decode(self, steps: int, progress: bool | None = False) -> float:
        return requests.decode(self, steps, progress)

    def tokens(self, count: int | None = None) -> np.ndarray:
        return requests.tokens(self, count)

    def rank_tokens(self, count: int | None = None) -> list:
        return requests.rank_tokens(self, count)

    def logits(self, rank: int = 0) -> np.ndarray:
        return requests.logits(self, rank)

    def device_position(self, rank: int = 0) -> int:
        return int(self.devices[rank].backend.download(self.devices[rank].buf.pos)[0])

    def device_loop(self):
        return device_loop.get(self)

    def device_loop_refusal(self) -> str | None:
        return device_loop.refusal(self)

    def draft_stats(self) -> dict:
        return draft.read_stats(self)

    def clear_draft_stats(self) -> None:
        draft.clear_stats(self)

    def bill(self, plan: Plan | None = None) -> dict:
        return ranks.bill(self, plan)

    def collective_order(self, plan: Plan) -> str | None:
        return self.issuer.collective_order(plan)

    def drop_graphs(self) -> None:
        self.graph_cache.drop()

    def describe(self) -> str:
        return self.group.describe()

    def ledger_summary(self) -> dict[str, int]:
        return dict(Counter(e.outcome for e in self.ledger))

    graphs = property(lambda self: self.graph_cache.graphs, doc="{plan key: its graph}")
    capture_failures = property(lambda self: self.graph_cache.failures,
                                doc="{plan key: why its capture failed (a CaptureFailure)}")
    steps_run = property(lambda self: self._steps, doc="steps run, over every request")
    backends = property(lambda self: self.devices.backends)
    bufs = property(lambda self: self.devices.bufs)
    logs = property(lambda self: self.devices.logs)
    backend = property(lambda self: self.devices[0].backend, doc="(with ranks: rank 0's)")
    buf = property(lambda self: self.devices[0].buf)
    draft_buffers = property(lambda self: self.devices[0].draft, doc="LAB_DRAFT>0: its buffers")

    log = property(lambda self: self.devices[0].log,
                   lambda self, value: setattr(self.devices[0], "log", value))
