"""Tensor-parallel decode over ranks (LAB_RANKS=2): one GPU per rank, one process, one thread.

Megatron's split of the tiny model over R ranks (R = 2):
  attention  rank r owns heads [r H/R, (r+1) H/R): its rows of wq, wk, wv (column-parallel,
             no communication), its slice of the KV cache, its heads' attention; the output
             projection is row-parallel: rank r multiplies its heads' outputs by its columns of
             wo, and an ALL-REDUCE sums the ranks' partial products into every rank's x.
  MLP        gate/up column-parallel (rank r's d_ff/R rows), down row-parallel + ALL-REDUCE.
  LM head    vocabulary-parallel: rank r computes logits for its ceil(V/R) rows (the last rank's
             padded with zero rows), an ALL-GATHER gives every rank all of them, and every rank
             takes the same argmax on its own device: the ranks agree on the next token id with
             no host round trip.
The residual add rides on the all-reduce: rank 0 adds its partial product to x
(matvec_residual), every other rank writes its partial product over x (matvec), and the sum
over ranks is x + W0 o0 + W1 o1. Per token: 2 all-reduces per layer + 1 all-gather.

Every rank issues the same step (RankStep: the one-GPU step's kernels, unchanged, on its shards)
and every rank must issue the same collectives in the same order: NCCL matches them by order
alone. One host thread drives every rank, so the engine issues the ranks in lockstep: each
rank's launches up to its next collective, then every rank's collective together (one NCCL
group). Eager, that is the step; captured, the same issue order fills one graph per rank (global
mode, every rank's capture open at once, ended before any is instantiated), and a token is one
graph launch per rank. On a GPU pair the engine checks the ranks' collective sequences before it
issues anything (a mismatch would hang both GPUs); the simulator lets them run and reports the
deadlock as NCCL would meet it (lab/backend/sim.py: SimRanks).

`make_engine(model, cfg)` builds a RankedEngine for LAB_RANKS=2 and a DecodeEngine otherwise.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import numpy as np

import kernels
from kernels import attention, embed, matvec, mlp, position, rmsnorm, rope, sample
from .backend import Collective, Launch, make_ranks
from .config import LabConfig
from .engine import DecodeEngine, LedgerEntry, Requests, progress_bar, scratch_views
from .errors import CaptureError, CollectiveError, LabError
from .instrument import LaunchLog
from .model import Model, check_request
from .plan import MAX_SPLITS, Plan, decode_plan
from .reference import rope_tables
from .step import launch


def make_engine(model: Model, cfg: LabConfig | None = None, **kw):
    """The engine for `cfg`: a RankedEngine for LAB_RANKS=2, else a DecodeEngine."""
    cfg = cfg or LabConfig()
    return RankedEngine(model, cfg, **kw) if cfg.ranks > 1 else DecodeEngine(model, cfg, **kw)


def check_divisible(model_cfg, ranks: int) -> None:
    """Heads and d_ff must split evenly over the ranks (a LabError naming both numbers)."""
    if model_cfg.n_head % ranks:
        raise LabError(f"LAB_RANKS={ranks}: the model's {model_cfg.n_head} attention heads do not "
                       f"split evenly over {ranks} ranks (n_head % ranks = "
                       f"{model_cfg.n_head % ranks}); use a rank count that divides {model_cfg.n_head}")
    if model_cfg.d_ff % ranks:
        raise LabError(f"LAB_RANKS={ranks}: the MLP's d_ff {model_cfg.d_ff} does not split evenly "
                       f"over {ranks} ranks")


def vocab_rows(vocab: int, ranks: int) -> int:
    """Rows of the LM head per rank (the last rank's padded with zero rows)."""
    return -(-vocab // ranks)


def shard(model: Model, rank: int, ranks: int) -> dict[str, np.ndarray]:
    """Rank `rank`'s weights, each a contiguous float32 array (what its kernels read)."""
    c, w = model.cfg, model.weights
    D, F, V = c.d_model, c.d_ff, c.vocab_size
    d, f, v = D // ranks, F // ranks, vocab_rows(V, ranks)
    cols, ffc = slice(rank * d, (rank + 1) * d), slice(rank * f, (rank + 1) * f)
    out = {"tok_emb": w["tok_emb"], "final_norm": w["final_norm"]}
    head = np.zeros((v * ranks, D), np.float32)
    head[:V] = w["lm_head"]
    out["lm_head"] = head[rank * v:(rank + 1) * v]
    for i in range(c.n_layer):
        p = f"layers.{i}."
        qkv = w[p + "wqkv"]
        out[p + "wqkv"] = np.concatenate([qkv[k * D:(k + 1) * D][cols] for k in range(3)])
        out[p + "wo"] = w[p + "wo"][:, cols]
        out[p + "w_gate"], out[p + "w_up"] = w[p + "w_gate"][ffc], w[p + "w_up"][ffc]
        out[p + "w_down"] = w[p + "w_down"][:, ffc]
        out[p + "attn_norm"], out[p + "mlp_norm"] = w[p + "attn_norm"], w[p + "mlp_norm"]
    return {k: np.ascontiguousarray(a, dtype=np.float32) for k, a in out.items()}


@dataclass
class RankBuffers:
    """One rank's device buffers (its shards of qkv, attention, MLP and logits; x replicated)."""
    tokens: object = None
    pos: object = None
    n_prompt: object = None
    x: object = None            # [D] the residual stream, the same on every rank
    x_shard: object = None      # [D / R] a reduce-scatter's share of x (LAB_BUG_RANK_SKEW)
    h: object = None
    qkv: object = None          # [3 D / R]
    q: object = None            # [D / R]
    o: object = None            # [D / R] the merged heads of this rank
    act: object = None          # [F / R]
    logits_part: object = None  # [ceil(V / R)] this rank's rows of the LM head
    logits: object = None       # [R ceil(V / R)] all of them, gathered
    part_o: object = None
    part_ml: object = None
    cos: object = None
    sin: object = None
    k_cache: list = field(default_factory=list)
    v_cache: list = field(default_factory=list)


class RankStep:
    """One rank's decode step, in named pieces like lab/step.py's Step: the same kernels on the
    rank's shards, with the collectives as items (`Collective`) where the ranks meet."""

    rebuilt_each_step = False

    def __init__(self, engine: "RankedEngine", rank: int):
        self.engine = weakref.proxy(engine)
        self.rank = rank

    # ---- the pieces ----------------------------------------------------------------------------
    def project_into_x(self, W, vec, layer):
        """x gets this rank's partial product W @ vec: rank 0 adds it to x (the residual), the
        others write it over x; the all-reduce after it sums them."""
        b = self.engine.bufs[self.rank]
        kern = matvec.matvec_residual if self.rank == 0 else matvec.matvec
        return launch(kern, matvec.grid_for(W.shape[0]), (W, vec, b.x), layer)

    def all_reduce(self, plan: Plan, layer: int, what: str):
        """Sum every rank's x into every rank's x."""
        b = self.engine.bufs[self.rank]
        yield Collective("all_reduce", b.x, b.x, what, layer)

    def gather_logits(self):
        b = self.engine.bufs[self.rank]
        yield Collective("all_gather", b.logits_part, b.logits, "logits")

    # ---- the step ----------------------------------------------------------------------------
    def items(self, plan: Plan):
        """Yield this rank's items in issue order: launches and collectives."""
        e, r = self.engine, self.rank
        c, b, w = e.model.cfg, e.bufs[r], e.w[r]
        D, R = c.d_model, e.ranks
        heads, F = c.n_head // R, c.d_ff // R
        eps, scale = np.float32(c.norm_eps), np.float32(1.0 / np.sqrt(c.head_dim))
        rows, norm = matvec.grid_for, (rmsnorm.RMSNORM_GRID, rmsnorm.RMSNORM_BLOCK)
        part_o, part_ml = e.partials[r][plan.splits]

        yield launch(embed.embed, embed.grid_for(D), (b.tokens, b.pos, w["tok_emb"], b.x))
        for i in range(c.n_layer):
            p = f"layers.{i}."
            yield launch(rmsnorm.rmsnorm, norm, (b.x, w[p + "attn_norm"], b.h, eps), i)
            yield launch(matvec.matvec, rows(3 * D // R), (w[p + "wqkv"], b.h, b.qkv), i)
            yield launch(rope.rope_kv_append, rope.grid_for(heads, c.head_dim),
                         (b.qkv, b.pos, b.cos, b.sin, b.q, b.k_cache[i], b.v_cache[i]), i)
            yield launch(attention.attn_partial, attention.partial_grid(heads, plan.splits, c.head_dim),
                         (b.q, b.k_cache[i], b.v_cache[i], b.pos, part_o, part_ml, scale), i)
            yield launch(attention.attn_merge, attention.merge_grid(heads, c.head_dim),
                         (part_o, part_ml, b.o), i)
            yield self.project_into_x(w[p + "wo"], b.o, i)
            yield from self.all_reduce(plan, i, "attention out")
            yield launch(rmsnorm.rmsnorm, norm, (b.x, w[p + "mlp_norm"], b.h, eps), i)
            yield launch(mlp.swiglu_up, mlp.grid_for(F), (w[p + "w_gate"], w[p + "w_up"], b.h, b.act), i)
            yield self.project_into_x(w[p + "w_down"], b.act, i)
            yield from self.all_reduce(plan, i, "MLP out")
        yield launch(rmsnorm.rmsnorm, norm, (b.x, w["final_norm"], b.h, eps))
        yield launch(matvec.matvec, rows(b.logits_part.shape[0]), (w["lm_head"], b.h, b.logits_part))
        yield from self.gather_logits()
        yield launch(sample.argmax_next, (sample.ARGMAX_GRID, sample.ARGMAX_BLOCK),
                     (e.vocab_view[r], b.pos, b.n_prompt, b.tokens))
        yield launch(position.advance, (position.ADVANCE_GRID, position.ADVANCE_BLOCK), (b.pos,))

    def launches(self, plan: Plan) -> list[Launch]:
        return [x for x in self.items(plan) if isinstance(x, Launch)]

    def collectives(self, plan: Plan) -> list[Collective]:
        return [x for x in self.items(plan) if isinstance(x, Collective)]


class RankSkewStep(RankStep):
    """LAB_BUG_RANK_SKEW: rank 1 chooses its all-reduce algorithm by itself. From the plans of 4
    splits on (context 64 and more) it does reduce-scatter + all-gather (the same sum, another
    pair of collectives) where rank 0 still issues one all-reduce. Right at short context; at
    the first long-context step the ranks' collective #0 no longer match."""

    def all_reduce(self, plan: Plan, layer: int, what: str):
        if self.rank != 1 or plan.splits < 4:
            yield from super().all_reduce(plan, layer, what)
            return
        b = self.engine.bufs[self.rank]
        yield Collective("reduce_scatter", b.x, b.x_shard, what + " (reduce-scatter)", layer)
        yield Collective("all_gather", b.x_shard, b.x, what + " (all-gather)", layer)


class RankedEngine(Requests):
    """Decode over `cfg.ranks` ranks: eager (lockstep issue) or one graph per rank per plan key."""

    def __init__(self, model: Model, cfg: LabConfig | None = None, group=None,
                 kv_init: str = "zeros", warm_up: bool = True):
        cfg = cfg or LabConfig(ranks=2)
        if cfg.ranks < 2:
            raise LabError("RankedEngine needs LAB_RANKS=2 (make_engine picks DecodeEngine for 1)")
        check_divisible(model.cfg, cfg.ranks)
        self.model, self.cfg, self.ranks = model, cfg, cfg.ranks
        self.group = group or make_ranks(cfg, cfg.ranks)
        if len(self.group.backends) != self.ranks:
            raise LabError(f"LAB_RANKS={self.ranks} needs {self.ranks} devices; the group has "
                           f"{len(self.group.backends)}")
        self.backends = self.group.backends
        self.logs = [LaunchLog() for _ in range(self.ranks)]
        for be, log in zip(self.backends, self.logs):
            be.log, be.mechanism, be.pdl = log, cfg.launch, False
        step = RankSkewStep if "rank_skew" in cfg.bugs else RankStep
        self.pieces = [step(self, r) for r in range(self.ranks)]
        self.ledger: list[LedgerEntry] = []
        self._graphs: dict[tuple, list] = {}
        self._built: dict[tuple, list] = {}
        self._failed: dict[tuple, str] = {}
        self.position = self.n_prompt = self._steps = 0
        self.collectives_issued = 0
        self._alloc(kv_init)
        if warm_up:
            for be in self.backends:
                be.warm_up(kernels.REGISTRY.values())
            self.warm_up_collectives()

    def warm_up_collectives(self) -> None:
        """Run each kind of collective the step may issue once, eagerly, on buffers that hold
        zeros at start-up. NCCL sets up its connections lazily, at a communicator's first
        collective of a kind, and that setup (allocations, a proxy handshake) cannot happen
        inside a capture: on the H200 pair the first all-reduce issued inside a capture failed
        with NCCL_ERROR_INTERNAL_ERROR. The lab's lazy-initialisation lesson, for a library."""
        kinds = [lambda b: Collective("all_reduce", b.x, b.x, "warm-up"),
                 lambda b: Collective("all_gather", b.logits_part, b.logits, "warm-up"),
                 lambda b: Collective("reduce_scatter", b.x, b.x_shard, "warm-up")]
        for make in kinds:
            with self.group.collectives():
                for be, b in zip(self.backends, self.bufs):
                    be.collective(make(b))
        self.group.clock()

    # ---- allocation (once per rank) -------------------------------------------------------------
    def _alloc(self, kv_init: str) -> None:
        c, R = self.model.cfg, self.ranks
        D, F, hd = c.d_model, c.d_ff, c.head_dim
        v = vocab_rows(c.vocab_size, R)
        cos, sin = rope_tables(hd, c.max_seq, c.rope_theta, np.float32)
        self.w, self.bufs, self.partials, self.vocab_view = [], [], [], []
        kv = np.dtype(self.cfg.kv_dtype)
        for r, be in enumerate(self.backends):
            w = {}
            for name, arr in shard(self.model, r, R).items():
                w[name] = be.alloc(name, arr.shape, np.float32)
                be.upload(w[name], arr)
            b = RankBuffers()
            b.tokens = be.alloc("tokens", (c.max_seq,), np.int32)
            b.pos = be.alloc("pos", (1,), np.int32)
            b.n_prompt = be.alloc("n_prompt", (1,), np.int32)
            for name, n in (("x", D), ("x_shard", D // R), ("h", D), ("qkv", 3 * D // R),
                            ("q", D // R), ("o", D // R), ("act", F // R), ("logits_part", v),
                            ("logits", v * R)):
                setattr(b, name, be.alloc(name, (n,), np.float32))
            heads = c.n_head // R
            b.part_o = be.alloc("part_o", (heads * MAX_SPLITS * hd,), np.float32)
            b.part_ml = be.alloc("part_ml", (heads * MAX_SPLITS * 2,), np.float32)
            views = scratch_views(be, b.part_o, b.part_ml, heads, hd, MAX_SPLITS)
            b.cos = be.alloc("rope_cos", cos.shape, np.float32)
            b.sin = be.alloc("rope_sin", sin.shape, np.float32)
            be.upload(b.cos, cos)
            be.upload(b.sin, sin)
            for i in range(c.n_layer):
                b.k_cache.append(be.alloc(f"k_cache.{i}", (c.max_seq, D // R), kv, init=kv_init))
                b.v_cache.append(be.alloc(f"v_cache.{i}", (c.max_seq, D // R), kv, init=kv_init))
            self.w.append(w)
            self.bufs.append(b)
            self.partials.append(views)
            self.vocab_view.append(be.rows(b.logits, 0, c.vocab_size))   # the real vocabulary

    # ---- queries ------------------------------------------------------------------------------
    def plan(self, position: int | None = None) -> Plan:
        return decode_plan(self.position if position is None else position, self.model.cfg, self.cfg)

    def step_items(self, plan: Plan, rank: int) -> list:
        """Rank `rank`'s items for `plan` (a query: nothing is issued)."""
        items = self._built.get((rank, plan.key))
        return list(items) if items is not None else list(self.pieces[rank].items(plan))

    def step_launches(self, plan: Plan, rank: int = 0) -> list[Launch]:
        return [x for x in self.step_items(plan, rank) if isinstance(x, Launch)]

    def step_collectives(self, plan: Plan, rank: int = 0) -> list[Collective]:
        return [x for x in self.step_items(plan, rank) if isinstance(x, Collective)]

    def collective_order(self, plan: Plan) -> str | None:
        """None when every rank issues the same collectives (op, count, dtype) in the same order
        for `plan`; else where the first difference is. NCCL matches collectives by order alone."""
        seqs = [[c.signature() for c in self.step_collectives(plan, r)] for r in range(self.ranks)]
        for k in range(max(len(s) for s in seqs)):
            have = [s[k] if k < len(s) else None for s in seqs]
            if len(set(have)) > 1:
                parts = [f"rank {r}: " + (self.step_collectives(plan, r)[k].describe() if h else
                                          f"none (it issues {len(seqs[r])})")
                         for r, h in enumerate(have)]
                return f"collective #{k} differs across ranks at position {plan.position} ({'; '.join(parts)})"
        return None

    def bill(self, plan: Plan | None = None) -> dict:
        """The launch bill with ranks: launches per rank per token, collectives per token."""
        plan = plan or self.plan()
        launches = [len(self.step_launches(plan, r)) for r in range(self.ranks)]
        colls = self.step_collectives(plan, 0)
        return {"ranks": self.ranks, "launches_per_rank": launches,
                "launches_per_token": sum(launches),
                "collectives_per_token": len(colls),
                "collectives": [c.describe() for c in colls],
                "nodes_per_rank_graph": [g.node_count for g in self._graphs.get(plan.key, [])]}

    # ---- issue ----------------------------------------------------------------------------------
    def _items(self, rank: int, plan: Plan):
        if self.pieces[rank].rebuilt_each_step:
            return self.pieces[rank].items(plan)
        key = (rank, plan.key)
        if key not in self._built:
            self._built[key] = list(self.pieces[rank].items(plan))
        return self._built[key]

    def _issue_step(self, plan: Plan) -> None:
        """Issue every rank's step in lockstep: each rank's launches up to its next collective,
        then every rank's pending collective in one group. A rank with none left while another
        waits in one is issued as it is: the device (or the simulator) meets the mismatch."""
        if not getattr(self.group, "simulated", False):
            why = self.collective_order(plan)
            if why is not None:                  # never hang a real GPU pair
                raise CollectiveError(f"refused before issuing: {why}; NCCL would hang both GPUs")
        its = [iter(self._items(r, plan)) for r in range(self.ranks)]
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
                    self.backends[r].launch(item)
                else:
                    done[r] = True
            if pending:
                with self.group.collectives():
                    for r, coll in pending:
                        self.backends[r].collective(coll)
                self.collectives_issued += len(pending)

    # ---- requests -------------------------------------------------------------------------------
    def reset(self, prompt_ids, max_new_tokens: int = 0) -> None:
        c = self.model.cfg
        ids = check_request(c, prompt_ids, max_new_tokens)
        host = np.zeros(c.max_seq, np.int32)
        host[:ids.size] = ids
        for be, b in zip(self.backends, self.bufs):
            be.upload(b.tokens, host)
            be.upload(b.pos, np.zeros(1, np.int32))
            be.upload(b.n_prompt, np.array([ids.size], np.int32))
        self.position, self.n_prompt = 0, int(ids.size)

    def step(self) -> LedgerEntry:
        """Decode one position on every rank: replay each rank's graph (capturing them on a
        miss) or issue the ranks' steps eagerly."""
        if self.position + 1 >= self.model.cfg.max_seq:
            raise LabError(f"position {self.position + 1} would exceed max_seq")
        plan = self.plan()
        for be, log in zip(self.backends, self.logs):
            log.step = self._steps
            be.host_step("graph" if self.cfg.graph else "eager")
        if not self.cfg.graph:
            entry = self._eager(plan, "eager")
        elif plan.key in self._failed:
            entry = self._eager(plan, "fallback", self._failed[plan.key])
        else:
            graphs, outcome = self._graphs.get(plan.key), "replay"
            if graphs is None:
                graphs, why = self.capture(plan)
                outcome = "capture"
            if graphs is None:
                self._failed[plan.key] = why
                entry = self._eager(plan, "fallback", why)
            else:
                for g, log in zip(graphs, self.logs):
                    g.launch()
                    log.record_replay(plan.key, g.node_count)
                entry = LedgerEntry(self._steps, self.position, plan.key, outcome)
        self.ledger.append(entry)
        self.position += 1
        self._steps += 1
        return entry

    def _eager(self, plan: Plan, outcome: str, reason: str = "") -> LedgerEntry:
        self._issue_step(plan)
        return LedgerEntry(self._steps, self.position, plan.key, outcome, reason)

    def capture(self, plan: Plan):
        """Capture every rank's step into a graph of its own, all captures open at once (global
        mode), ended before any is instantiated: ([graph per rank], None), or (None, why) after
        ending every capture -- a capture failure on one rank falls back on all ranks."""
        opened = []
        try:
            for be in self.backends:
                be.begin_capture()
                opened.append(be)
            self._issue_step(plan)
            defs = self.group.end_captures()
            opened = []
            graphs = [be.instantiate(d) for be, d in zip(self.backends, defs)]
        except CaptureError as exc:
            for be in reversed(opened):          # the reverse of the order they were opened
                be.abort_capture()
            return None, f"capture failed on a rank: {exc.reason}"
        except BaseException:
            for be in reversed(opened):
                be.abort_capture()
            raise
        self._graphs[plan.key] = graphs
        return graphs, None

    # ---- generation (generate, encode: Requests) --------------------------------------------------
    def decode(self, steps: int, progress: bool | None = False) -> float:
        if self.position + steps >= self.model.cfg.max_seq:
            raise LabError(f"{steps} steps from position {self.position} would exceed max_seq "
                           f"{self.model.cfg.max_seq}")
        t0 = self.group.clock()
        for _ in progress_bar(range(steps), progress, f"decode x{self.ranks} ranks"):
            self.step()
        return self.group.clock() - t0

    def describe(self) -> str:
        return self.group.describe()

    def rank_tokens(self, count: int | None = None) -> list[np.ndarray]:
        """Every rank's token ids (they must agree: each rank took the same argmax)."""
        count = self.position + 1 if count is None else count
        return [be.download(b.tokens)[:count] for be, b in zip(self.backends, self.bufs)]

    def tokens(self, count: int | None = None) -> np.ndarray:
        """Rank 0's token ids, after checking that every rank holds the same."""
        toks = self.rank_tokens(count)
        for r, t in enumerate(toks[1:], 1):
            if not np.array_equal(t, toks[0]):
                raise LabError(f"rank {r}'s tokens differ from rank 0's: the ranks disagree")
        return toks[0]

    def logits(self, rank: int = 0) -> np.ndarray:
        """The gathered logits of the real vocabulary, as rank `rank` holds them."""
        return self.backends[rank].download(self.vocab_view[rank])

    def device_position(self, rank: int = 0) -> int:
        return int(self.backends[rank].download(self.bufs[rank].pos)[0])

    def close(self) -> None:
        """Destroy every rank's graphs, then the group's NCCL communicators, in that order (a
        communicator destroyed while graphs that captured its collectives live can hang, and so
        can a process that exits with either alive). The engine is unusable afterwards."""
        for graphs in self._graphs.values():
            for g in graphs:
                getattr(g, "release", lambda: None)()
        self._graphs.clear()
        self.group.close()
