"""The devices of an engine: each rank's backend, launch log and buffers, allocated once, never
moved (nano-vllm's allocate_kv_cache, one per rank).

  Buffers   the buffers every step reads (below)
  Device    one rank: its backend, log, buffers, weights, scratch views, and the buffers its step
            declares (the step's `own_buffers`: the one-device modes', the drafting step's, the
            persistent step's)
  Devices   every rank's Device, made in the same order on each; the attention scratch (re)made;
            `bind` (the engine using them), `close` (the group's communicators)

Device-resident state (read by kernels at run time, so a replay decodes the NEXT token):
  tokens [max_seq] int32  the prompt, then each generated id (written by the step's argmax)
  pos    [1] int32        the step's position (advanced by the last kernel of the step)
  n_prompt [1] int32      generated ids are written only at positions >= n_prompt
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np

from lab.backend.instrument import LaunchLog
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
    limit: object = None        # [1] int32: the device loop and drafting run while pos < limit
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
    counters: list = field(default_factory=list)    # LAB_FUSION=1: a view per launch site
    wqkv_views: list = field(default_factory=list)  # LAB_OVERLAP: per layer (wq rows, wkv rows)
    qkv_views: tuple = ()                           # LAB_OVERLAP: (q rows, kv rows) of qkv
    draft: object = None                            # LAB_DRAFT>0: the drafting step's buffers
    persistent: object = None                       # LAB_PERSISTENT=1: the stacked weights, KV


def scratch_views(be, part_o, part_ml, n_head: int, head_dim: int, splits: int) -> dict:
    """The attention scratch's views for each plan of up to `splits` splits over `n_head`
    heads: {1, 2, 4, ...: (part_o [n_head, s, head_dim], part_ml [n_head, s, 2])}."""
    views, s = {}, 1
    while s <= splits:
        views[s] = (be.reshape(part_o, (n_head, s, head_dim)), be.reshape(part_ml, (n_head, s, 2)))
        s *= 2
    return views


class Devices:
    """Every rank's Device of `group` (make_devices'), each holding the model (its shard with
    ranks) and the buffers of `step_cls`, the step the engine issues."""

    def __init__(self, model, cfg, group, step_cls, kv_init: str = "zeros", shard=None):
        """`shard(model, rank, ranks)`: rank `rank`'s weights (ranks > 1 only)."""
        self.model, self.cfg, self.group = model, cfg, group
        self.ranks = len(group.backends)
        self.all = [Device(be, LaunchLog()) for be in group.backends]
        for d in self.all:
            d.backend.log = d.log
        self.retired: list = []   # scratch replaced by a lazy re-allocation; graphs may point at it
        c = model.cfg
        self.rope_host = rope_tables(c.head_dim, c.max_seq, c.rope_theta, np.float32)
        for d in self.all:
            step_cls.check_device(d.backend, c)   # refused before anything is allocated
        for rank in range(self.ranks):
            self._alloc_device(rank, step_cls, kv_init, shard)

    def __getitem__(self, rank: int) -> Device:
        return self.all[rank]

    def __iter__(self):
        return iter(self.all)

    def __len__(self) -> int:
        return self.ranks

    def _alloc_device(self, rank: int, step_cls, kv_init: str, shard) -> None:
        c, R, d = self.model.cfg, self.ranks, self.all[rank]
        be, b = d.backend, d.buf
        kv = np.dtype(self.cfg.kv_dtype)
        D, F, v = c.d_model, c.d_ff // R, -(-c.vocab_size // R)
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
        step_cls.own_buffers(d, self.model, self.cfg, kv_init)
        for i in range(c.n_layer):
            if d.persistent is not None:   # each layer's cache: a row of the stacked one
                b.k_cache.append(be.row(d.persistent.k_cache, i))
                b.v_cache.append(be.row(d.persistent.v_cache, i))
                continue
            b.k_cache.append(be.alloc(f"k_cache.{i}", (c.max_seq, D // R), kv, init=kv_init))
            b.v_cache.append(be.alloc(f"v_cache.{i}", (c.max_seq, D // R), kv, init=kv_init))
        d.vocab_view = b.logits if R == 1 else be.rows(b.logits, 0, c.vocab_size)

    def alloc_scratch(self, splits: int, rank: int = 0) -> None:
        """Attention scratch for plans of up to `splits` splits, and its views for each plan
        (made here, so no step ever creates one)."""
        c, d = self.model.cfg, self.all[rank]
        be, b, heads = d.backend, d.buf, c.n_head // self.ranks
        if b.part_o is not None:
            self.retired += [b.part_o, b.part_ml]  # a graph may still point at them
        b.part_o = be.alloc("part_o", (heads * splits * c.head_dim,), np.float32)
        b.part_ml = be.alloc("part_ml", (heads * splits * 2,), np.float32)
        d.partials = scratch_views(be, b.part_o, b.part_ml, heads, c.head_dim, splits)

    @property
    def backends(self) -> list:
        return [d.backend for d in self.all]

    @property
    def logs(self) -> list:
        return [d.log for d in self.all]

    @property
    def bufs(self) -> list[Buffers]:
        return [d.buf for d in self.all]

    def upload(self, name: str, values) -> None:
        """Write `values` into buffer `name` of every rank (the same on each)."""
        for d in self.all:
            d.backend.upload(getattr(d.buf, name), np.asarray(values))

    def bind(self, cfg, warned: list) -> None:
        """Make these devices' user the engine of `cfg`: its launch logs, its PDL switch and its
        launch mechanism. LAB_PDL needs sm_90+: elsewhere it is refused with a message (added
        to `warned`, once per call) and the run goes on without it."""
        pdl = bool(cfg.pdl)
        cc = getattr(self.all[0].backend, "compute_capability", lambda: (9, 0))()
        if pdl and cc < (9, 0):
            msg = (f"LAB_PDL=1 refused: programmatic dependent launch needs sm_90 or newer, this "
                   f"GPU is sm_{cc[0]}{cc[1]}; running without PDL")
            warned.append(msg)
            warnings.warn(msg, stacklevel=4)
            pdl = False
        for d in self.all:
            d.backend.log = d.log
            d.backend.pdl = pdl
            d.backend.mechanism = cfg.launch
            d.backend.blocking = cfg.launch_blocking

    def close(self) -> None:
        """Destroy the group's NCCL communicators (after every graph that captured their
        collectives: the graph cache's `release`). The devices are unusable afterwards."""
        self.group.close()
