"""DecodeEngine: owns every buffer, builds a decode step as a list of launches, and runs it
eagerly or as a CUDA graph (one graph per plan key), falling back to eager when a capture fails.

Read top to bottom: allocate (weights, state, scratch) -> warm up -> reset(prompt) -> step():
decode_plan(position) -> graph for plan.key (capture on a miss) or the eager launches.

A clean engine builds each plan's step once and issues the SAME Launch objects at every later
step with that plan key (eager or captured), so a backend can prepare each launch once
(LAB_LAUNCH=prebound). With a deliberate bug on, the step is rebuilt and issued as it is built.

Device-resident state (read by kernels at run time, so a replay decodes the NEXT token):
  tokens [max_seq] int32  the prompt, then each generated id (written by argmax_next)
  pos    [1] int32        the step's position (advanced by the last kernel of the step)
  n_prompt [1] int32      generated ids are written only at positions >= n_prompt
The host keeps `self.position`, a mirror used only to choose the plan.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np

import kernels
from kernels import attention, embed, matvec, mlp, position, rmsnorm, rope, sample
from . import bugs
from .backend import Launch, StreamWait, make_backend
from .config import LabConfig
from .errors import CaptureError, LabError
from .instrument import LaunchLog
from .model import Model, check_request
from .plan import MAX_SPLITS, Plan, decode_plan
from .reference import rope_tables


@dataclass(frozen=True)
class LedgerEntry:
    step: int
    position: int
    plan_key: tuple
    outcome: str            # "eager" | "capture" (new graph, then replayed) | "replay" | "fallback"
    reason: str = ""        # why a fallback happened


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
    part_o: object = None
    part_ml: object = None
    cos: object = None
    sin: object = None
    k_cache: list = field(default_factory=list)
    v_cache: list = field(default_factory=list)


class DecodeEngine:
    def __init__(self, model: Model, cfg: LabConfig | None = None, backend=None,
                 kv_init: str = "zeros", warm_up: bool = True):
        self.model = model
        self._cfg = cfg or LabConfig()
        self.backend = backend or make_backend(self._cfg)
        self.log = LaunchLog()
        self.backend.log = self.log
        self.ledger: list[LedgerEntry] = []
        self._graphs: dict[tuple, object] = {}
        self._step_items: dict[tuple, list] = {}   # plan key -> the step's items (clean engine)
        self._uncapturable: dict[tuple, str] = {}
        self.position = 0
        self.n_prompt = 0
        self._steps = 0
        # host-side state that lazy initialisation changes (only the deliberate bugs use it);
        # a failed capture restores it, since the captured operations never ran
        self._lazy: dict = {}
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
        """Switch launch toggles (GRAPH, PDL, OVERLAP, SPLIT_COMBINE, LAUNCH) on the same buffers;
        graphs and built steps stay cached per plan key, and the key names each toggle that
        changes them (LAUNCH does not: both mechanisms capture the same graph). Toggles that
        change allocation (KV dtype, the lazy-allocation bugs) need a new engine."""
        alloc = ("kv_dtype", "bugs")
        if any(getattr(value, f) != getattr(self._cfg, f) for f in alloc):
            raise LabError(f"{', '.join(alloc)} change what the engine allocates: build a new "
                           f"DecodeEngine for them")
        self._cfg = value
        self.bind()

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
        D, F, V, H, hd = c.d_model, c.d_ff, c.vocab_size, c.n_head, c.head_dim
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
        cap = 1 if bugs.has(self.cfg, "lazy_scratch") else MAX_SPLITS
        self._lazy["scratch_splits"] = cap
        b.part_o = be.alloc("part_o", (H * cap * hd,), np.float32)
        b.part_ml = be.alloc("part_ml", (H * cap * 2,), np.float32)
        cos, sin = rope_tables(hd, c.max_seq, c.rope_theta, np.float32)
        b.cos = be.alloc("rope_cos", cos.shape, np.float32)
        b.sin = be.alloc("rope_sin", sin.shape, np.float32)
        self._rope_host = (cos, sin)
        if bugs.has(self.cfg, "lazy_table"):
            self._lazy["rope_uploaded"] = False       # BUG: uploaded on first use instead
        else:
            be.upload(b.cos, cos)
            be.upload(b.sin, sin)
        kv = np.dtype(self.cfg.kv_dtype)
        for i in range(c.n_layer):
            b.k_cache.append(be.alloc(f"k_cache.{i}", (c.max_seq, D), kv, init=kv_init))
            b.v_cache.append(be.alloc(f"v_cache.{i}", (c.max_seq, D), kv, init=kv_init))
        # row views for LAB_OVERLAP: wqkv rows [0, D) -> q, [D, 3D) -> k and v
        self._wqkv_views = [(be.rows(self.w[f"layers.{i}.wqkv"], 0, D),
                             be.rows(self.w[f"layers.{i}.wqkv"], D, 3 * D)) for i in range(c.n_layer)]
        self._qkv_views = (be.rows(b.qkv, 0, D), be.rows(b.qkv, D, 3 * D))
        # views of the partials for each plan, made here so no step ever creates one
        self._partials = {}
        s = 1
        while s <= cap:
            self._partials[s] = (be.reshape(b.part_o, (H, s, hd)), be.reshape(b.part_ml, (H, s, 2)))
            s *= 2

    # ---- lazy initialisation: only the deliberate bugs (lab/bugs.py) take these paths ---------
    def _ensure_rope_tables(self) -> None:
        """BUG lazy_table: upload the RoPE tables on first use, "best effort": a failed upload
        is only noted (an all too common pattern), so inside a capture the failure does not
        show here; the sticky capture error shows later, at end_capture."""
        if not self._lazy.get("rope_uploaded", True):
            self._lazy["rope_uploaded"] = True        # marked first, as such code usually is
            try:
                self.backend.upload(self.buf.cos, self._rope_host[0])
                self.backend.upload(self.buf.sin, self._rope_host[1])
            except CaptureError as exc:
                self.warnings.append(f"rope table upload failed: {exc}")

    def _partials_for(self, splits: int):
        """The partial buffers viewed for `splits`; BUG lazy_scratch grows them on demand."""
        if splits > self._lazy["scratch_splits"]:
            c, be, b = self.model.cfg, self.backend, self.buf
            self._lazy["scratch_splits"] = splits     # capacity recorded, then allocated
            self._retired += [b.part_o, b.part_ml]
            b.part_o = be.alloc("part_o", (c.n_head * splits * c.head_dim,), np.float32)
            b.part_ml = be.alloc("part_ml", (c.n_head * splits * 2,), np.float32)
            self._partials = {}
        if splits not in self._partials:
            c, be, b = self.model.cfg, self.backend, self.buf
            self._partials[splits] = (be.reshape(b.part_o, (c.n_head, splits, c.head_dim)),
                                      be.reshape(b.part_ml, (c.n_head, splits, 2)))
        return self._partials[splits]

    def _host_prelude(self, plan: Plan) -> None:
        """Host work before a step's launches. Clean engine: none. BUG pos_outside_graph: the
        host uploads the position -- at capture time only, so replays never see it again."""
        if bugs.has(self.cfg, "pos_outside_graph"):
            self.backend.upload(self.buf.pos, np.array([plan.position], np.int32))

    # ---- one step as launches ----------------------------------------------------------------
    def plan(self, position: int | None = None) -> Plan:
        return decode_plan(self.position if position is None else position, self.model.cfg, self.cfg)

    def step_launches(self, plan: Plan) -> list[Launch]:
        """The decode step's kernel launches for `plan`, in issue order (for a clean engine, the
        very objects its steps issue)."""
        return [x for x in self._items(plan) if isinstance(x, Launch)]

    def _items(self, plan: Plan):
        """The step's items to issue. Clean engine: the list built once per plan key (its build
        does no host work and does not depend on the position). With a deliberate bug on: the
        build itself, issued as it yields, so the bug's host work happens between launches,
        where a capture sees it (and where the lazy-init detector places it)."""
        if self.cfg.bugs:
            return self.build_step(plan)
        items = self._step_items.get(plan.key)
        if items is None:
            items = self._step_items[plan.key] = list(self.build_step(plan))
        return items

    def _issue(self, item) -> None:
        if isinstance(item, StreamWait):
            self.backend.record_wait(item.src, item.dst)
        else:
            self.backend.launch(item)

    def build_step(self, plan: Plan):
        """Yield the step's launches one at a time. The engine issues each as it is yielded, so
        any host work done while building (only the deliberate bugs do some) happens right
        before the launch that needs it -- where a capture would see it."""
        c, b, w = self.model.cfg, self.buf, self.w
        D, F, V, H, hd = c.d_model, c.d_ff, c.vocab_size, c.n_head, c.head_dim
        eps, scale = np.float32(c.norm_eps), np.float32(1.0 / np.sqrt(hd))
        # launch geometry comes from each kernel's own module, the one the kernel tests use
        rows = matvec.grid_for                              # one warp per output row
        norm = (rmsnorm.RMSNORM_GRID, rmsnorm.RMSNORM_BLOCK)
        bug = lambda name: bugs.has(self.cfg, name)  # noqa: E731  (deliberate bugs, lab/bugs.py)

        def L(kern, geometry, args, layer=None, stream="main") -> Launch:
            grid, block = geometry
            return Launch(kern, tuple(grid), tuple(block), tuple(args), layer, stream)

        yield L(embed.embed, embed.grid_for(D), (b.tokens, b.pos, w["tok_emb"], b.x))
        for i in range(c.n_layer):
            p = f"layers.{i}."
            x_in = self.backend.raw(b.x) if bug("raw_array") and i == 0 else b.x
            norm_k = rmsnorm.rmsnorm_late_wait if bug("late_wait") else rmsnorm.rmsnorm
            yield L(norm_k, norm, (x_in, w[p + "attn_norm"], b.h, eps), i)
            if self.cfg.overlap:  # q on the main stream, k and v on a side stream, in parallel
                wq, wkv = self._wqkv_views[i]
                q_out, kv_out = self._qkv_views
                yield StreamWait("main", "side")                      # fork: side waits for h
                yield L(matvec.matvec, rows(2 * D), (wkv, b.h, kv_out), i, "side")
                yield L(matvec.matvec, rows(D), (wq, b.h, q_out), i)
                yield StreamWait("side", "main")                      # join before rope
            else:
                yield L(matvec.matvec, rows(3 * D), (w[p + "wqkv"], b.h, b.qkv), i)
            self._ensure_rope_tables()
            if bug("frozen_kv_row"):  # the host picks the row: a pointer the graph freezes
                row = plan.position
                yield L(rope.rope_kv_append_row, rope.grid_for(H, hd), (b.qkv, b.pos, b.cos, b.sin,
                        b.q, self.backend.row(b.k_cache[i], row), self.backend.row(b.v_cache[i], row)), i)
            else:
                yield L(rope.rope_kv_append, rope.grid_for(H, hd),
                        (b.qkv, b.pos, b.cos, b.sin, b.q, b.k_cache[i], b.v_cache[i]), i)
            part_o, part_ml = self._partials_for(plan.splits)  # [H, splits, hd], [H, splits, 2]
            partial = attention.partial_grid(H, plan.splits, hd)
            if bug("ctx_by_value"):   # a loop bound by value: the graph freezes it
                yield L(attention.attn_partial_len, partial, (b.q, b.k_cache[i], b.v_cache[i],
                        np.int32(plan.position + 1), part_o, part_ml, scale), i)
            else:
                yield L(attention.attn_partial, partial,
                        (b.q, b.k_cache[i], b.v_cache[i], b.pos, part_o, part_ml, scale), i)
            if plan.split_combine:  # fission: merge, then project (bit-identical to the fused form)
                yield L(attention.attn_merge, attention.merge_grid(H, hd), (part_o, part_ml, b.o), i)
                yield L(matvec.matvec_residual, rows(D), (w[p + "wo"], b.o, b.x), i)
            else:
                yield L(attention.attn_combine, attention.combine_grid(D),
                        (part_o, part_ml, w[p + "wo"], b.x), i)
            yield L(rmsnorm.rmsnorm, norm, (b.x, w[p + "mlp_norm"], b.h, eps), i)
            yield L(mlp.swiglu_up, mlp.grid_for(F), (w[p + "w_gate"], w[p + "w_up"], b.h, b.act), i)
            yield L(matvec.matvec_residual, rows(D), (w[p + "w_down"], b.act, b.x), i)
        yield L(rmsnorm.rmsnorm, norm, (b.x, w["final_norm"], b.h, eps))
        yield L(matvec.matvec, rows(V), (w["lm_head"], b.h, b.logits))
        yield L(sample.argmax_next, (sample.ARGMAX_GRID, sample.ARGMAX_BLOCK),
                (b.logits, b.pos, b.n_prompt, b.tokens))
        if not bug("pos_outside_graph"):  # (the bug uploads the position in _host_prelude)
            yield L(position.advance, (position.ADVANCE_GRID, position.ADVANCE_BLOCK), (b.pos,))

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

        Valid for timing: a step at `position` does the work of a step at that context length
        (same plan, same bytes read). INVALID for byte-compares: attention reads the unwritten
        rows, i.e. whatever the cache held -- zeros with `kv_init="zeros"` (reproducible), stale
        garbage with `kv_init="empty"` (two runs differ). Needs `reset(prompt)` first; the token
        read at `position` is the prompt's or the id 0 that reset wrote there, a valid id.
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
        self._host_prelude(plan)
        for item in self._items(plan):
            self._issue(item)
        return LedgerEntry(self._steps, self.position, plan.key, outcome, reason)

    def _graph_step(self, plan: Plan) -> LedgerEntry:
        key = plan.key
        if key in self._uncapturable:
            return self._eager(plan, "fallback", self._uncapturable[key])
        graph, outcome = self._graphs.get(key), "replay"
        if graph is None:
            graph, reason = self.capture(plan)
            if graph is None:
                self._uncapturable[key] = reason
                return self._eager(plan, "fallback", reason)
            outcome = "capture"
        graph.launch()
        self.log.record_replay(key, graph.node_count)
        return LedgerEntry(self._steps, self.position, key, outcome)

    def capture(self, plan: Plan):
        """Capture the step for `plan` into a graph: (graph, None), or (None, reason) after
        ending the failed capture cleanly so that the caller can re-issue the step eagerly."""
        be = self.backend
        saved = dict(self._lazy)
        self._host_prelude(plan)
        try:
            be.begin_capture()
            for item in self._items(plan):
                self._issue(item)
            graph = be.end_capture()
        except CaptureError as exc:
            reason = exc.reason
            if be.is_capturing():
                try:
                    be.end_capture()
                except CaptureError as sticky:
                    reason = sticky.reason
            self._lazy = saved  # the captured operations never ran: undo what lazy code recorded
            return None, reason
        except BaseException:
            # not a capture problem (a programming error, an interrupt): end the capture, undo
            # the host state, and let the error through; the engine stays usable
            be.abort_capture()
            self._lazy = saved
            raise
        self._graphs[plan.key] = graph
        return graph, None

    # ---- generation --------------------------------------------------------------------------
    def encode(self, prompt: str) -> np.ndarray:
        return self.model.tokenizer.encode(prompt)

    def generate(self, prompt: str, n_tokens: int, progress: bool | None = False) -> Generation:
        """Greedy generation of `n_tokens` after `prompt`; times the whole decode. `progress`:
        True shows a bar, None shows one on a terminal once the decode takes over a second."""
        ids = self.encode(prompt)
        self.reset(ids, n_tokens)
        steps = ids.size - 1 + n_tokens
        it = range(steps)
        if progress is not False:
            from tqdm.auto import tqdm
            it = tqdm(it, desc="decode", unit="step", disable=None if progress is None else False,
                      delay=0.0 if progress else 1.0, leave=True)
        t0 = self.backend.clock()   # waits for issued work: wall time on a GPU, model time in sim
        for _ in it:
            self.step()
        seconds = self.backend.clock() - t0
        tokens = self.tokens(ids.size + n_tokens)
        text = self.model.tokenizer.decode(tokens[ids.size:])
        return Generation(prompt, text, tokens, steps, seconds, self.backend.describe())

    def tokens(self, count: int | None = None) -> np.ndarray:
        """Token ids in device memory (prompt + generated), read only when asked for."""
        count = self.position + 1 if count is None else count
        return self.backend.download(self.buf.tokens)[:count]

    def logits(self) -> np.ndarray:
        return self.backend.download(self.buf.logits)

    def device_position(self) -> int:
        return int(self.backend.download(self.buf.pos)[0])

    @property
    def graphs(self) -> dict:
        return dict(self._graphs)

    def ledger_summary(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for e in self.ledger:
            out[e.outcome] = out.get(e.outcome, 0) + 1
        return out
