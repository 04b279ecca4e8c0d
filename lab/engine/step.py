"""One decode step, in named pieces: the path of one token, written once.

`Step.items(plan)` yields one token's work in issue order: kernel launches (`Launch`), stream
waits (`StreamWait`), collectives among ranks (`Collective`) and, in a buggy step only, host
work between two launches (`HostWork`). Each piece of the step is a method; a variant of the
step is a subclass that overrides the pieces it changes, so the clean path below reads in one
screen and each variant reads as its difference from it:

  - each deliberate bug (lab/engine/bugs.py) overrides one or two pieces;
  - `FusedStep` (LAB_FUSION=1, below) overrides the four blocks (qkv_rope, attend, mlp_up,
    head) with its fused kernels: 18 launches per token instead of 37 (26 with its attention
    split into its phases, LAB_SPLIT_COMBINE=1). The pieces it never
    calls are listed in `FusedStep.absent`, with where their work went: a bug that overrides
    one of them cannot exist in the fused step, and lab/engine/bugs.py refuses it, saying so;
  - `RankStep` (LAB_RANKS=2, lab/engine/ranks.py) overrides the shard sizes, the projections into
    x, the all-reduces and the LM head's gather.

The pieces, in the order the token meets them:

  prelude(plan)               host work before the step's launches (outside any capture): none
  check_decode()              what the host checks once a decode's steps are done: nothing
  qkv_rope(plan, layer)       attention norm, q/k/v projection, RoPE + KV append
    norm_input(layer)           the buffer the attention norm reads: x
    attn_norm_kernel            rmsnorm: pdl_wait() is its first statement
    qkv(plan, layer)            one matvec, or under LAB_OVERLAP q | k, v on two streams
    prepare_rope(layer)         host work before RoPE: none (the tables are uploaded at start-up)
    append_kv(plan, layer)      RoPE + KV append at the device-resident position
  prepare_attention(plan)     host work before attention: none (scratch allocated at start-up)
  scratch(splits)             the attention partials viewed for the plan
  attend(plan, layer, ..)     attention partials, then combine: merge + Wo + residual
    attention(plan, layer, ..)  split-K attention partial; the context length is read on the device
    combine(plan, layer, ..)    one kernel (attn_combine), or under LAB_SPLIT_COMBINE two:
      merge_then_project(..)      attn_merge, then project_into_x with Wo
  all_reduce(plan, layer, ..) the sum over ranks of what each rank added to x: none on one device
  mlp_up(plan, layer)         MLP norm + gate/up (SwiGLU)
  project_into_x(W, v, layer) x += W v (the MLP's down projection, the attention output's)
  head()                      final norm, LM head, argmax -> next token id, advance()
    lm_head()                   the logits (a rank: its rows, then every rank's gathered)
    sample_next()               argmax_next: the next token id into tokens[pos + 1]
    advance()                   the kernel that advances the device position
  shard_sizes()               (heads, d_ff) this device computes: all of them on one device
  graph_key(plan)             the key the engine's graph cache files this step's graph under:
                              the plan key (what changes the captured work), nothing else

Two class attributes and two class methods tell the devices how to allocate for the step
(`scratch_splits_at_start`, `tables_at_start_up`, `check_device`, `own_buffers`) and one
attribute tells the engine how to issue it (`rebuilt_each_step`: a step whose launches or
host work depend on the position is built anew at each step, and issued as it is built).

A step is bound to one device of its engine (`self.dev`: that rank's backend, buffers, weights
and scratch views). Building a step never touches the device: host work is yielded, and only
the engine's issue loop runs it. `Step.launches(plan)` is therefore a query without side effects.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Callable

import numpy as np

from kernels import attention, embed, fused, fused_split, matvec, mlp, position, rmsnorm, rope, sample
from lab.backend import Launch, StreamWait
from lab.bugspec import FUSED_ABSENT
from lab.plan import MAX_SPLITS, Plan, plan_boundaries


@dataclass(frozen=True)
class HostWork:
    """Host work the step does between two launches (only the lazy-initialisation bugs do any):
    issuing the step runs it; querying the step skips it."""
    what: str
    run: Callable[[], None]


def launch(kern, geometry, args, layer=None, stream="main") -> Launch:
    grid, block = geometry
    return Launch(kern, tuple(grid), tuple(block), tuple(args), layer, stream)


class Step:
    """The clean decode step for one device of an engine (rank `rank`: `engine.devices[rank]`)."""

    scratch_splits_at_start = MAX_SPLITS   # attention scratch for the largest plan, once
    tables_at_start_up = True              # RoPE tables uploaded when the engine is built
    rebuilt_each_step = False              # the same Launch objects at every step of a plan key

    def __init__(self, engine, rank: int = 0):
        # a weak reference: the engine owns its step, and a cycle would keep a dropped engine's
        # device memory alive until the next garbage collection
        self.engine = weakref.proxy(engine)
        self.rank = rank
        self.dev = engine.devices[rank]   # this rank's backend, buffers, weights, scratch views
        self.lazy: dict = {}   # host state lazy initialisation changes (a failed capture restores it)

    # ---- the buffers this step reads beyond the common ones (lab/engine/devices.py) -------------
    @classmethod
    def check_device(cls, be, model_cfg) -> None:
        """Refuse (a LabError) a device that cannot run this step, before any allocation."""

    @classmethod
    def own_buffers(cls, dev, model, cfg, kv_init: str) -> None:
        """The one-device modes' buffers on `dev` (a live engine may switch fusion, overlap or
        the device loop on): the device loop's plan table and limit, the fused step's last-block
        counters (zeroed; each launch leaves its slots at 0) with a view per launch site and
        attn_fused's per-head scratch, and the row views LAB_OVERLAP splits the q/k/v
        projection with -- views made here, so no step ever creates one."""
        c, be, b, D = model.cfg, dev.backend, dev.buf, model.cfg.d_model
        b.plan_of = be.alloc("plan_of", (c.max_seq,), np.int32)
        be.upload(b.plan_of, np.searchsorted(plan_boundaries(c.max_seq), np.arange(c.max_seq),
                                             side="right").astype(np.int32))
        b.limit = be.alloc("limit", (1,), np.int32)
        slots = fused.counter_slots(c.n_head)                 # attn_fused's, per layer
        b.counters = be.alloc("counters", (c.n_layer * slots + 1,), np.int32)
        dev.counters = [be.rows(b.counters, i * slots, (i + 1) * slots) for i in range(c.n_layer)]
        dev.counters.append(be.rows(b.counters, c.n_layer * slots, c.n_layer * slots + 1))
        b.head_out = be.alloc("head_out", (c.n_head, D), np.float32)
        # wqkv rows [0, D) -> q, [D, 3D) -> k and v
        dev.wqkv_views = [(be.rows(dev.w[f"layers.{i}.wqkv"], 0, D),
                           be.rows(dev.w[f"layers.{i}.wqkv"], D, 3 * D)) for i in range(c.n_layer)]
        dev.qkv_views = (be.rows(b.qkv, 0, D), be.rows(b.qkv, D, 3 * D))

    # ---- the pieces ----------------------------------------------------------------------------
    def shard_sizes(self) -> tuple[int, int]:
        """(heads, d_ff) this device computes: every head and the whole MLP."""
        c = self.engine.model.cfg
        return c.n_head, c.d_ff

    def prelude(self, plan: Plan) -> None:
        """Host work before the step's launches, outside any capture: none."""

    def check_decode(self) -> None:
        """What the host checks once a decode's steps are done (requests.decode): nothing."""

    def qkv_rope(self, plan: Plan, layer: int):
        b, w, eps = self.dev.buf, self.dev.w, np.float32(self.engine.model.cfg.norm_eps)
        yield launch(self.attn_norm_kernel, _NORM,
                     (self.norm_input(layer), w[f"layers.{layer}.attn_norm"], b.h, eps), layer)
        yield from self.qkv(plan, layer)
        yield from self.prepare_rope(layer)
        yield self.append_kv(plan, layer)

    def norm_input(self, layer: int):
        return self.dev.buf.x

    attn_norm_kernel = rmsnorm.rmsnorm

    def qkv(self, plan: Plan, layer: int):
        e, b, w = self.engine, self.dev.buf, self.dev.w
        if e.cfg.overlap:  # q on the main stream, k and v on a side stream, in parallel
            D = e.model.cfg.d_model
            (wq, wkv), (q_out, kv_out) = self.dev.wqkv_views[layer], self.dev.qkv_views
            yield StreamWait("main", "side")                    # fork: side waits for h
            yield launch(matvec.matvec, _ROWS(2 * D), (wkv, b.h, kv_out), layer, "side")
            yield launch(matvec.matvec, _ROWS(D), (wq, b.h, q_out), layer)
            yield StreamWait("side", "main")                    # join before rope
        else:
            W = w[f"layers.{layer}.wqkv"]                       # [3 D, D] (a rank: its rows)
            yield launch(matvec.matvec, _ROWS(W.shape[0]), (W, b.h, b.qkv), layer)

    def prepare_rope(self, layer: int):
        return ()

    def append_kv(self, plan: Plan, layer: int) -> Launch:
        c, b = self.engine.model.cfg, self.dev.buf
        return launch(rope.rope_kv_append, rope.grid_for(self.shard_sizes()[0], c.head_dim),
                      (b.qkv, b.pos, b.cos, b.sin, b.q, b.k_cache[layer], b.v_cache[layer]), layer)

    def prepare_attention(self, plan: Plan):
        return ()

    def scratch(self, splits: int):
        return self.dev.partials[splits]       # ([H, splits, hd], [H, splits, 2])

    def attend(self, plan: Plan, layer: int, part_o, part_ml, scale):
        yield self.attention(plan, layer, part_o, part_ml, scale)
        yield from self.combine(plan, layer, part_o, part_ml)

    def attention(self, plan: Plan, layer: int, part_o, part_ml, scale) -> Launch:
        c, b = self.engine.model.cfg, self.dev.buf
        return launch(attention.attn_partial,
                      attention.partial_grid(self.shard_sizes()[0], plan.splits, c.head_dim),
                      (b.q, b.k_cache[layer], b.v_cache[layer], b.pos, part_o, part_ml, scale), layer)

    def combine(self, plan: Plan, layer: int, part_o, part_ml):
        if plan.split_combine:  # fission: merge, then project (bit-identical to the fused form)
            yield from self.merge_then_project(layer, part_o, part_ml)
        else:
            yield self.combine_one(layer, part_o, part_ml)

    def combine_one(self, layer: int, part_o, part_ml) -> Launch:
        """attn_combine: the merge, the output projection and the residual add in one launch."""
        b, D = self.dev.buf, self.engine.model.cfg.d_model
        return launch(attention.attn_combine, attention.combine_grid(D),
                      (part_o, part_ml, self.dev.w[f"layers.{layer}.wo"], b.x), layer)

    def merge_then_project(self, layer: int, part_o, part_ml):
        b, hd = self.dev.buf, self.engine.model.cfg.head_dim
        yield launch(attention.attn_merge, attention.merge_grid(self.shard_sizes()[0], hd),
                     (part_o, part_ml, b.o), layer)
        yield self.project_into_x(self.dev.w[f"layers.{layer}.wo"], b.o, layer)

    def project_into_x(self, W, vec, layer: int) -> Launch:
        """x += W @ vec (the residual add rides on the projection)."""
        return launch(matvec.matvec_residual, _ROWS(W.shape[0]), (W, vec, self.dev.buf.x), layer)

    def all_reduce(self, plan: Plan, layer: int, what: str):
        return ()          # one device holds the whole sum

    def mlp_up(self, plan: Plan, layer: int):
        b, w, p = self.dev.buf, self.dev.w, f"layers.{layer}."
        eps, F = np.float32(self.engine.model.cfg.norm_eps), self.shard_sizes()[1]
        yield launch(rmsnorm.rmsnorm, _NORM, (b.x, w[p + "mlp_norm"], b.h, eps), layer)
        yield launch(mlp.swiglu_up, mlp.grid_for(F), (w[p + "w_gate"], w[p + "w_up"], b.h, b.act), layer)

    def head(self):
        b, w = self.dev.buf, self.dev.w
        yield launch(rmsnorm.rmsnorm, _NORM, (b.x, w["final_norm"], b.h,
                                              np.float32(self.engine.model.cfg.norm_eps)))
        yield from self.lm_head()
        yield self.sample_next()
        yield from self.advance()

    def lm_head(self):
        b, V = self.dev.buf, self.engine.model.cfg.vocab_size
        yield launch(matvec.matvec, _ROWS(V), (self.dev.w["lm_head"], b.h, b.logits))

    def sample_next(self) -> Launch:
        b = self.dev.buf
        return launch(sample.argmax_next, (sample.ARGMAX_GRID, sample.ARGMAX_BLOCK),
                      (self.dev.vocab_view, b.pos, b.n_prompt, b.tokens))

    def advance(self):
        return [launch(position.advance, (position.ADVANCE_GRID, position.ADVANCE_BLOCK),
                       (self.dev.buf.pos,))]

    def graph_key(self, plan: Plan) -> tuple:
        return plan.key

    # ---- the step ----------------------------------------------------------------------------
    def items(self, plan: Plan):
        """Yield the step's items in issue order."""
        c, b, w = self.engine.model.cfg, self.dev.buf, self.dev.w
        scale = np.float32(1.0 / np.sqrt(c.head_dim))

        yield launch(embed.embed, embed.grid_for(c.d_model), (b.tokens, b.pos, w["tok_emb"], b.x))
        for i in range(c.n_layer):
            yield from self.qkv_rope(plan, i)
            yield from self.prepare_attention(plan)
            part_o, part_ml = self.scratch(plan.splits)
            yield from self.attend(plan, i, part_o, part_ml, scale)
            yield from self.all_reduce(plan, i, "attention out")
            yield from self.mlp_up(plan, i)
            yield self.project_into_x(w[f"layers.{i}.w_down"], b.act, i)
            yield from self.all_reduce(plan, i, "MLP out")
        yield from self.head()

    def launches(self, plan: Plan) -> list[Launch]:
        """The step's launches for `plan`, built without running its host work (a query)."""
        return [x for x in self.items(plan) if isinstance(x, Launch)]


def step_kernels(pieces: Step, plans) -> list:
    """The kernels `pieces` launches at any of `plans` (a query; the lazy host state its build
    may record is restored; a step that cannot be built here fails where it is issued)."""
    lazy, found = dict(pieces.lazy), {}
    try:
        for plan in plans:
            found.update((x.kernel.name, x.kernel) for x in pieces.launches(plan))
    except Exception:   # noqa: BLE001 (the step's own error shows when it is issued)
        pass
    pieces.lazy = lazy
    return list(found.values())


# launch geometry comes from each kernel's own module, the one the kernel tests use
_ROWS = matvec.grid_for                                      # one warp per output row
_NORM = (rmsnorm.RMSNORM_GRID, rmsnorm.RMSNORM_BLOCK)


class FusedStep(Step):
    """The fused decode step (LAB_FUSION=1): per layer norm_qkv_rope, the fused attention,
    norm_swiglu, matvec_residual; around them embed and norm_lm_head_argmax: 2 + 4 * n_layer
    launches (18 for the tiny model). The fused attention is attn_fused_grid
    (LAB_ATTN_TAIL=grid) or attn_fused (heads). LAB_SPLIT_COMBINE splits it into its phases as
    launches of their own, the same bits: attn_partial + attn_combine (grid: 22 launches), or
    attn_partial_wide, attn_merge, attn_project_heads (heads: 26); LAB_OVERLAP makes
    norm_qkv_rope two launches (q | k, v) on two streams.
    It keeps the host-work pieces (prelude, prepare_rope, norm_input, prepare_attention, scratch)."""

    # the one-op-per-kernel step's pieces this step does not have, and where their work went
    absent = FUSED_ABSENT

    # ---- the blocks of Step.items, fused ---------------------------------------------------------
    def qkv_rope(self, plan: Plan, layer: int):
        yield from self.prepare_rope(layer)
        yield from self.norm_qkv_rope(plan, layer)

    def attend(self, plan: Plan, layer: int, part_o, part_ml, scale):
        if plan.attn_tail == "grid" and not plan.persistent:
            if plan.split_combine:  # fission: attn_fused_grid's two kinds of block as launches
                yield from self.attention_grid_split(plan, layer, part_o, part_ml, scale)
            else:
                yield self.attention_grid(plan, layer, part_o, part_ml, scale)
        elif plan.split_combine:  # fission: attn_fused's phases as three launches, its bits
            yield from self.attention_split(plan, layer, part_o, part_ml, scale)
        else:
            yield self.attention_fused(plan, layer, part_o, part_ml, scale)

    def mlp_up(self, plan: Plan, layer: int):
        """RMSNorm + gate/up + SwiGLU: one launch."""
        c, b, w, p = self.engine.model.cfg, self.dev.buf, self.dev.w, f"layers.{layer}."
        yield launch(fused.norm_swiglu, fused.rows_grid(c.d_ff),
                     (b.x, w[p + "mlp_norm"], np.float32(c.norm_eps), w[p + "w_gate"],
                      w[p + "w_up"], b.act), layer)

    def head(self):
        yield self.sample()

    # ---- the fused kernels -----------------------------------------------------------------------
    def norm_qkv_rope(self, plan: Plan, layer: int):
        """RMSNorm + qkv + RoPE + KV append at the device-resident position: one launch, or
        under LAB_OVERLAP the q part on the main stream and the k/v part on a side stream."""
        e = self.engine
        c, b, w = e.model.cfg, self.dev.buf, self.dev.w
        p = f"layers.{layer}."
        x, eps = self.norm_input(layer), np.float32(c.norm_eps)

        def args(W, part0):
            return (x, w[p + "attn_norm"], eps, W, np.int32(part0), b.pos, b.cos, b.sin, b.q,
                    b.k_cache[layer], b.v_cache[layer])
        if plan.overlap:
            wq, wkv = self.dev.wqkv_views[layer]
            yield StreamWait("main", "side")                        # fork: side waits for x
            yield launch(fused.norm_qkv_rope, fused.qkv_grid(c.d_model, 2), args(wkv, 1), layer, "side")
            yield launch(fused.norm_qkv_rope, fused.qkv_grid(c.d_model, 1), args(wq, 0), layer)
            yield StreamWait("side", "main")                        # join before attention
        else:
            yield launch(fused.norm_qkv_rope, fused.qkv_grid(c.d_model, 3), args(w[p + "wqkv"], 0), layer)

    def attention_fused(self, plan: Plan, layer: int, part_o, part_ml, scale) -> Launch:
        """Partials + per-head merge and projection + their sum + residual, one launch; the
        context length is read on the device."""
        e, b = self.engine, self.dev.buf
        c = e.model.cfg
        return launch(fused.attn_fused, fused.attention_grid(c.n_head, plan.splits, c.head_dim),
                      (b.q, b.k_cache[layer], b.v_cache[layer], b.pos, part_o, part_ml, scale,
                       self.dev.w[f"layers.{layer}.wo"], b.x, b.head_out, self.dev.counters[layer]), layer)

    def attention_grid(self, plan: Plan, layer: int, part_o, part_ml, scale) -> Launch:
        """LAB_ATTN_TAIL=grid: partials and the tail in one launch that fills the grid, the tail
        blocks waiting on a counter (kernels/fused.py attn_fused_grid); the unfused attention's
        bits."""
        e, b = self.engine, self.dev.buf
        c = e.model.cfg
        return launch(fused.attn_fused_grid, fused.grid_tail_grid(c.n_head, plan.splits, c.d_model),
                      (b.q, b.k_cache[layer], b.v_cache[layer], b.pos, part_o, part_ml, scale,
                       self.dev.w[f"layers.{layer}.wo"], b.x, self.dev.counters[layer]), layer)

    def attention_grid_split(self, plan: Plan, layer: int, part_o, part_ml, scale):
        """attn_fused_grid as two launches (LAB_ATTN_TAIL=grid, LAB_SPLIT_COMBINE=1): its partial
        blocks are attn_partial, its tail blocks attn_combine -- the unfused step's attention,
        issued by the unfused step's own pieces."""
        yield Step.attention(self, plan, layer, part_o, part_ml, scale)
        yield Step.combine_one(self, layer, part_o, part_ml)

    def attention_split(self, plan: Plan, layer: int, part_o, part_ml, scale):
        """attn_fused as three launches (LAB_SPLIT_COMBINE=1): its partials, the merge into o,
        the per-head projections summed in head order + residual."""
        c, b = self.engine.model.cfg, self.dev.buf
        yield launch(fused_split.attn_partial_wide, fused.attention_grid(c.n_head, plan.splits, c.head_dim),
                     (b.q, b.k_cache[layer], b.v_cache[layer], b.pos, part_o, part_ml, scale), layer)
        yield launch(attention.attn_merge, attention.merge_grid(c.n_head, c.head_dim),
                     (part_o, part_ml, b.o), layer)
        yield launch(fused_split.attn_project_heads, fused.project_grid(c.d_model),
                     (self.dev.w[f"layers.{layer}.wo"], b.o, b.x, np.int32(c.head_dim)), layer)

    def sample(self) -> Launch:
        """Final norm + LM head; its last block writes the next token id and advances pos."""
        e, b, w = self.engine, self.dev.buf, self.dev.w
        c = e.model.cfg
        return launch(fused.norm_lm_head_argmax, fused.lm_head_grid(c.vocab_size),
                      (b.x, w["final_norm"], np.float32(c.norm_eps), w["lm_head"], b.logits,
                       b.pos, b.n_prompt, b.tokens, self.dev.counters[c.n_layer]))
