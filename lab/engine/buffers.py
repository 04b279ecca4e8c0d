"""What lives on each device of an engine: allocated once, never moved.

`Device` is one rank's share of an engine: its backend, its launch log, its buffers, its weights
(the whole model on one device, its shard with ranks: lab/engine/ranks.py) and its views of the
attention scratch for each plan. `Allocation` (a mixin of lab/engine/runner.py's DecodeEngine) makes
them, in the same order on every device, and names them the way one device reads them
(`engine.buf`, `engine.backend`) or ranks do (`engine.bufs[r]`, `engine.backends[r]`).

Device-resident state (read by kernels at run time, so a replay decodes the NEXT token):
  tokens [max_seq] int32  the prompt, then each generated id (written by argmax_next, or in
                          the fused step by norm_lm_head_argmax)
  pos    [1] int32        the step's position (advanced by the last kernel of the step)
  n_prompt [1] int32      generated ids are written only at positions >= n_prompt
  counters [n_layer * (n_head + 1) + 1] int32  the fused step's "last block done" counters:
                          per layer attn_fused's n_head + 1 slots (one per head, one for the
                          heads), then norm_lm_head_argmax's one; 0 between launches
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kernels import fused
from lab.plan import plan_boundaries
from .persistent import alloc_persistent
from .ranks import shard, vocab_rows
from .spec import alloc_spec
from lab.reference import rope_tables


@dataclass
class Buffers:
    """Every device buffer the step touches; allocated once, never moved."""
    tokens: object = None
    pos: object = None
    n_prompt: object = None
    x: object = None            # [D] the residual stream (with ranks: the same on every rank)
    x_shard: object = None      # [D / R] a reduce-scatter's share of x (ranks: LAB_BUG_RANK_SKEW)
    h: object = None
    qkv: object = None          # [3 D / R]
    q: object = None            # [D / R]
    o: object = None            # [D / R] the merged heads (of this rank)
    act: object = None          # [F / R]
    logits_part: object = None  # [ceil(V / R)] ranks: this rank's rows of the LM head
    logits: object = None       # [R ceil(V / R)] every row (ranks: gathered)
    plan_of: object = None      # [max_seq] int32: the plan body each position runs (LAB_LOOP=device)
    counters: object = None     # [n_layer * (n_head + 1) + 1] int32: the fused step's last-block
                                # counters, zeroed
    head_out: object = None     # [n_head, D] attn_fused's per-head projections (LAB_FUSION=1)
    limit: object = None        # [1] int32: the device loop runs steps while pos < limit
    part_o: object = None
    part_ml: object = None
    cos: object = None
    sin: object = None
    k_cache: list = field(default_factory=list)
    v_cache: list = field(default_factory=list)


@dataclass(eq=False)
class Device:
    """One rank's device and what lives on it."""
    backend: object
    log: object                                     # its instrument.LaunchLog
    buf: Buffers = field(default_factory=Buffers)
    w: dict = field(default_factory=dict)           # weight name -> buffer (ranks: the shard)
    partials: dict = field(default_factory=dict)    # splits -> the attention scratch's views
    vocab_view: object = None                       # the logits of the real vocabulary
    spec: object = None                             # LAB_DRAFT>0: the verify step's buffers
    persistent: object = None                       # LAB_PERSISTENT=1: the stacked weights, KV


def scratch_views(be, part_o, part_ml, n_head: int, head_dim: int, splits: int) -> dict:
    """The attention scratch's views for each plan of up to `splits` splits over `n_head`
    heads: {1, 2, 4, ...: (part_o [n_head, s, head_dim], part_ml [n_head, s, 2])}. (The caller
    allocates the two buffers: the lazy-init detector names the allocation's call site.)"""
    views, s = {}, 1
    while s <= splits:
        views[s] = (be.reshape(part_o, (n_head, s, head_dim)), be.reshape(part_ml, (n_head, s, 2)))
        s *= 2
    return views


class Allocation:
    """Allocate every device's buffers once (a mixin of DecodeEngine: it reads model, cfg,
    ranks, devices)."""

    def _allocate(self, step_cls, kv_init: str) -> None:
        c = self.model.cfg
        self.rope_host = rope_tables(c.head_dim, c.max_seq, c.rope_theta, np.float32)
        for rank in range(self.ranks):
            self._alloc_device(rank, step_cls, kv_init)

    def _alloc_device(self, rank: int, step_cls, kv_init: str) -> None:
        c, R, d = self.model.cfg, self.ranks, self.devices[rank]
        be, b = d.backend, d.buf
        kv = np.dtype(self.cfg.kv_dtype)
        if self.cfg.persistent:   # refused here, before any allocation, if the device cannot run it
            d.persistent = alloc_persistent(be, self.model, kv, kv_init)
        D, F, v = c.d_model, c.d_ff // R, vocab_rows(c.vocab_size, R)
        for name, arr in (self.model.weights if R == 1 else shard(self.model, rank, R)).items():
            d.w[name] = be.alloc(name, arr.shape, np.float32)
            be.upload(d.w[name], arr)
        b.tokens = be.alloc("tokens", (c.max_seq,), np.int32)
        b.pos = be.alloc("pos", (1,), np.int32)
        b.n_prompt = be.alloc("n_prompt", (1,), np.int32)
        for name, n in (("x", D), ("x_shard", D // R), ("h", D), ("qkv", 3 * D // R),
                        ("q", D // R), ("o", D // R), ("act", F), ("logits_part", v),
                        ("logits", v * R)):
            if R > 1 or name not in ("x_shard", "logits_part"):   # the ranks' own buffers
                setattr(b, name, be.alloc(name, (n,), np.float32))
        # scratch for the largest plan, once (the lazy_scratch bug starts with one split instead)
        self.alloc_scratch(step_cls.scratch_splits_at_start, rank)
        cos, sin = self.rope_host
        b.cos = be.alloc("rope_cos", cos.shape, np.float32)
        b.sin = be.alloc("rope_sin", sin.shape, np.float32)
        if step_cls.tables_at_start_up:                # (lazy_table: on first use instead)
            be.upload(b.cos, cos)
            be.upload(b.sin, sin)
        if R == 1:
            self._alloc_one_device_modes(d)
        if self.cfg.draft:                                  # the verify step's (lab/engine/spec.py)
            d.spec = alloc_spec(be, c, self.cfg.draft, self.cfg.draft_splits)
        for i in range(c.n_layer):
            if d.persistent is not None:   # each layer's cache: a row of the stacked one
                b.k_cache.append(be.row(d.persistent.k_cache, i))
                b.v_cache.append(be.row(d.persistent.v_cache, i))
                continue
            b.k_cache.append(be.alloc(f"k_cache.{i}", (c.max_seq, D // R), kv, init=kv_init))
            b.v_cache.append(be.alloc(f"v_cache.{i}", (c.max_seq, D // R), kv, init=kv_init))
        d.vocab_view = b.logits if R == 1 else be.rows(b.logits, 0, c.vocab_size)

    def _alloc_one_device_modes(self, d: Device) -> None:
        """What only the one-device modes read: the device loop's plan table and limit
        (LAB_LOOP=device), the fused step's last-block counters (LAB_FUSION=1: zeroed; each
        launch leaves its slots at 0) with a view per launch site and attn_fused's per-head
        scratch, and the row views LAB_OVERLAP
        splits the q/k/v projection with -- views made here, so no step ever creates one."""
        c, be, b, D = self.model.cfg, d.backend, d.buf, self.model.cfg.d_model
        b.plan_of = be.alloc("plan_of", (c.max_seq,), np.int32)
        be.upload(b.plan_of, np.searchsorted(plan_boundaries(c.max_seq), np.arange(c.max_seq),
                                             side="right").astype(np.int32))
        b.limit = be.alloc("limit", (1,), np.int32)
        slots = fused.counter_slots(c.n_head)                 # attn_fused's, per layer
        b.counters = be.alloc("counters", (c.n_layer * slots + 1,), np.int32)
        self.counters = [be.rows(b.counters, i * slots, (i + 1) * slots) for i in range(c.n_layer)]
        self.counters.append(be.rows(b.counters, c.n_layer * slots, c.n_layer * slots + 1))
        b.head_out = be.alloc("head_out", (c.n_head, D), np.float32)
        # wqkv rows [0, D) -> q, [D, 3D) -> k and v
        self.wqkv_views = [(be.rows(d.w[f"layers.{i}.wqkv"], 0, D),
                            be.rows(d.w[f"layers.{i}.wqkv"], D, 3 * D)) for i in range(c.n_layer)]
        self.qkv_views = (be.rows(b.qkv, 0, D), be.rows(b.qkv, D, 3 * D))

    def alloc_scratch(self, splits: int, rank: int = 0) -> None:
        """Attention scratch for plans of up to `splits` splits, and its views for each plan
        (made here, so no step ever creates one)."""
        c, d = self.model.cfg, self.devices[rank]
        be, b, heads = d.backend, d.buf, c.n_head // self.ranks
        if b.part_o is not None:
            self._retired += [b.part_o, b.part_ml]  # a graph may still point at them
        b.part_o = be.alloc("part_o", (heads * splits * c.head_dim,), np.float32)
        b.part_ml = be.alloc("part_ml", (heads * splits * 2,), np.float32)
        d.partials = scratch_views(be, b.part_o, b.part_ml, heads, c.head_dim, splits)

    # ---- each device's share, by the names one device or ranks read it ------------------------
    @property
    def backends(self) -> list:
        return [d.backend for d in self.devices]

    @property
    def logs(self) -> list:
        return [d.log for d in self.devices]

    @property
    def bufs(self) -> list[Buffers]:
        return [d.buf for d in self.devices]

    @property
    def backend(self):
        """The device's backend (with ranks: rank 0's)."""
        return self.devices[0].backend

    @property
    def log(self):
        return self.devices[0].log

    @log.setter
    def log(self, value) -> None:
        self.devices[0].log = value

    @property
    def buf(self) -> Buffers:
        return self.devices[0].buf

    @property
    def w(self):
        """One device: its weights {name: buffer}; ranks: one such dict per rank."""
        return self.devices[0].w if self.ranks == 1 else [d.w for d in self.devices]

    @property
    def partials(self):
        """One device: its scratch views {splits: (part_o, part_ml)}; ranks: one per rank."""
        return self.devices[0].partials if self.ranks == 1 else [d.partials for d in self.devices]
