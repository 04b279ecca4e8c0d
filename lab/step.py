"""One decode step, in named pieces.

`Step.items(plan)` yields one token's work in issue order: kernel launches (`Launch`), stream
waits (`StreamWait`) and, in a buggy step only, host work between two launches (`HostWork`).
Each piece of the step is a method; a variant of the step (each deliberate bug in lab/bugs.py)
is a subclass that overrides the one or two pieces it changes, so the clean path below reads in
one screen and each variant reads as its difference from it.

  prelude(plan)               host work before the step's launches (outside any capture): none
  prepare_rope(layer)         host work before RoPE: none (the tables are uploaded at start-up)
  norm_input(layer)           the buffer the attention norm reads: x
  attn_norm_kernel            rmsnorm: pdl_wait() is its first statement
  append_kv(plan, layer)      RoPE + KV append at the device-resident position
  prepare_attention(plan)     host work before attention: none (scratch allocated at start-up)
  scratch(splits)             the attention partials viewed for the plan
  attention(plan, layer, ..)  split-K attention partial; the context length is read on the device
  advance()                   the kernel that advances the device position

Two class attributes tell the engine how to allocate for the step (`scratch_splits_at_start`,
`tables_at_start_up`) and one how to issue it (`rebuilt_each_step`: a step whose launches or
host work depend on the position is built anew at each step, and issued as it is built).

`FusedStep` (LAB_FUSION=1) is the fused form of the step: 18 launches per token instead of 37
(kernels/fused.py). It reads straight through too; it keeps the host-work pieces (prelude,
prepare_rope, norm_input, prepare_attention, scratch) and adds its own (norm_qkv_rope,
attention_fused, sample). The one-op-per-kernel pieces it does not have are listed in
`FusedStep.absent`, with where their work went: a variant that overrides one of them (a
deliberate bug) cannot exist in the fused step, and lab/bugs.py refuses it, saying so.

Building a step never touches the device: host work is yielded, and only the engine's issue
loop runs it. `Step.launches(plan)` is therefore a query without side effects.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Callable

import numpy as np

from kernels import attention, embed, fused, matvec, mlp, position, rmsnorm, rope, sample
from .backend import Launch, StreamWait
from .bugspec import FUSED_ABSENT
from .plan import MAX_SPLITS, Plan


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
    """The clean decode step for one engine's buffers (engine.buf, engine.w, engine.backend)."""

    scratch_splits_at_start = MAX_SPLITS   # attention scratch for the largest plan, once
    tables_at_start_up = True              # RoPE tables uploaded when the engine is built
    rebuilt_each_step = False              # the same Launch objects at every step of a plan key

    def __init__(self, engine):
        # a weak reference: the engine owns its step, and a cycle would keep a dropped engine's
        # device memory alive until the next garbage collection
        self.engine = weakref.proxy(engine)
        self.lazy: dict = {}   # host state lazy initialisation changes (a failed capture restores it)

    # ---- the pieces ----------------------------------------------------------------------------
    def prelude(self, plan: Plan) -> None:
        """Host work before the step's launches, outside any capture: none."""

    def prepare_rope(self, layer: int):
        return ()

    def norm_input(self, layer: int):
        return self.engine.buf.x

    attn_norm_kernel = rmsnorm.rmsnorm

    def append_kv(self, plan: Plan, layer: int) -> Launch:
        c, b = self.engine.model.cfg, self.engine.buf
        return launch(rope.rope_kv_append, rope.grid_for(c.n_head, c.head_dim),
                      (b.qkv, b.pos, b.cos, b.sin, b.q, b.k_cache[layer], b.v_cache[layer]), layer)

    def prepare_attention(self, plan: Plan):
        return ()

    def scratch(self, splits: int):
        return self.engine.partials[splits]       # ([H, splits, hd], [H, splits, 2])

    def attention(self, plan: Plan, layer: int, part_o, part_ml, scale) -> Launch:
        c, b = self.engine.model.cfg, self.engine.buf
        return launch(attention.attn_partial, attention.partial_grid(c.n_head, plan.splits, c.head_dim),
                      (b.q, b.k_cache[layer], b.v_cache[layer], b.pos, part_o, part_ml, scale), layer)

    def advance(self):
        return [launch(position.advance, (position.ADVANCE_GRID, position.ADVANCE_BLOCK),
                       (self.engine.buf.pos,))]

    # ---- the step ----------------------------------------------------------------------------
    def items(self, plan: Plan):
        """Yield the step's items in issue order."""
        e = self.engine
        c, b, w, overlap = e.model.cfg, e.buf, e.w, e.cfg.overlap
        D, F, V = c.d_model, c.d_ff, c.vocab_size
        eps, scale = np.float32(c.norm_eps), np.float32(1.0 / np.sqrt(c.head_dim))
        # launch geometry comes from each kernel's own module, the one the kernel tests use
        rows = matvec.grid_for                                      # one warp per output row
        norm = (rmsnorm.RMSNORM_GRID, rmsnorm.RMSNORM_BLOCK)

        yield launch(embed.embed, embed.grid_for(D), (b.tokens, b.pos, w["tok_emb"], b.x))
        for i in range(c.n_layer):
            p = f"layers.{i}."
            yield launch(self.attn_norm_kernel, norm, (self.norm_input(i), w[p + "attn_norm"], b.h, eps), i)
            if overlap:  # q on the main stream, k and v on a side stream, in parallel
                (wq, wkv), (q_out, kv_out) = e.wqkv_views[i], e.qkv_views
                yield StreamWait("main", "side")                    # fork: side waits for h
                yield launch(matvec.matvec, rows(2 * D), (wkv, b.h, kv_out), i, "side")
                yield launch(matvec.matvec, rows(D), (wq, b.h, q_out), i)
                yield StreamWait("side", "main")                    # join before rope
            else:
                yield launch(matvec.matvec, rows(3 * D), (w[p + "wqkv"], b.h, b.qkv), i)
            yield from self.prepare_rope(i)
            yield self.append_kv(plan, i)
            yield from self.prepare_attention(plan)
            part_o, part_ml = self.scratch(plan.splits)
            yield self.attention(plan, i, part_o, part_ml, scale)
            if plan.split_combine:  # fission: merge, then project (bit-identical to the fused form)
                yield launch(attention.attn_merge, attention.merge_grid(c.n_head, c.head_dim),
                             (part_o, part_ml, b.o), i)
                yield launch(matvec.matvec_residual, rows(D), (w[p + "wo"], b.o, b.x), i)
            else:
                yield launch(attention.attn_combine, attention.combine_grid(D),
                             (part_o, part_ml, w[p + "wo"], b.x), i)
            yield launch(rmsnorm.rmsnorm, norm, (b.x, w[p + "mlp_norm"], b.h, eps), i)
            yield launch(mlp.swiglu_up, mlp.grid_for(F), (w[p + "w_gate"], w[p + "w_up"], b.h, b.act), i)
            yield launch(matvec.matvec_residual, rows(D), (w[p + "w_down"], b.act, b.x), i)
        yield launch(rmsnorm.rmsnorm, norm, (b.x, w["final_norm"], b.h, eps))
        yield launch(matvec.matvec, rows(V), (w["lm_head"], b.h, b.logits))
        yield launch(sample.argmax_next, (sample.ARGMAX_GRID, sample.ARGMAX_BLOCK),
                     (b.logits, b.pos, b.n_prompt, b.tokens))
        yield from self.advance()

    def launches(self, plan: Plan) -> list[Launch]:
        """The step's launches for `plan`, built without running its host work (a query)."""
        return [x for x in self.items(plan) if isinstance(x, Launch)]


class FusedStep(Step):
    """The fused decode step (LAB_FUSION=1): per layer norm_qkv_rope, attn_fused, norm_swiglu,
    matvec_residual; around them embed and norm_lm_head_argmax: 2 + 4 * n_layer launches (18
    for the tiny model). LAB_SPLIT_COMBINE means nothing here (decode_plan drops it from the
    plan under fusion); LAB_OVERLAP makes norm_qkv_rope two launches (q | k, v) on two streams."""

    # the one-op-per-kernel step's pieces this step does not have, and where their work went
    absent = FUSED_ABSENT

    # ---- the fused pieces ----------------------------------------------------------------------
    def norm_qkv_rope(self, plan: Plan, layer: int):
        """RMSNorm + qkv + RoPE + KV append at the device-resident position: one launch, or
        under LAB_OVERLAP the q part on the main stream and the k/v part on a side stream."""
        e = self.engine
        c, b, w = e.model.cfg, e.buf, e.w
        p = f"layers.{layer}."
        x, eps = self.norm_input(layer), np.float32(c.norm_eps)

        def args(W, part0):
            return (x, w[p + "attn_norm"], eps, W, np.int32(part0), b.pos, b.cos, b.sin, b.q,
                    b.k_cache[layer], b.v_cache[layer])
        if plan.overlap:
            wq, wkv = e.wqkv_views[layer]
            yield StreamWait("main", "side")                        # fork: side waits for x
            yield launch(fused.norm_qkv_rope, fused.qkv_grid(c.n_head, 2), args(wkv, 1), layer, "side")
            yield launch(fused.norm_qkv_rope, fused.qkv_grid(c.n_head, 1), args(wq, 0), layer)
            yield StreamWait("side", "main")                        # join before attention
        else:
            yield launch(fused.norm_qkv_rope, fused.qkv_grid(c.n_head, 3), args(w[p + "wqkv"], 0), layer)

    def attention_fused(self, plan: Plan, layer: int, part_o, part_ml, scale) -> Launch:
        """Partials + merge + Wo + residual; the context length is read on the device."""
        e = self.engine
        c, b = e.model.cfg, e.buf
        return launch(fused.attn_fused, fused.attention_grid(c.n_head, plan.splits, c.head_dim),
                      (b.q, b.k_cache[layer], b.v_cache[layer], b.pos, part_o, part_ml, scale,
                       e.w[f"layers.{layer}.wo"], b.x, e.counters[layer]), layer)

    def sample(self) -> Launch:
        """Final norm + LM head; its last block writes the next token id and advances pos."""
        e = self.engine
        c, b = e.model.cfg, e.buf
        return launch(fused.norm_lm_head_argmax, fused.rows_grid(c.vocab_size),
                      (b.x, e.w["final_norm"], np.float32(c.norm_eps), e.w["lm_head"], b.logits,
                       b.pos, b.n_prompt, b.tokens, e.counters[c.n_layer]))

    # ---- the step ----------------------------------------------------------------------------
    def items(self, plan: Plan):
        """Yield the fused step's items in issue order."""
        e = self.engine
        c, b, w = e.model.cfg, e.buf, e.w
        D, F = c.d_model, c.d_ff
        eps, scale = np.float32(c.norm_eps), np.float32(1.0 / np.sqrt(c.head_dim))

        yield launch(embed.embed, embed.grid_for(D), (b.tokens, b.pos, w["tok_emb"], b.x))
        for i in range(c.n_layer):
            p = f"layers.{i}."
            yield from self.prepare_rope(i)
            yield from self.norm_qkv_rope(plan, i)
            yield from self.prepare_attention(plan)
            part_o, part_ml = self.scratch(plan.splits)
            yield self.attention_fused(plan, i, part_o, part_ml, scale)
            yield launch(fused.norm_swiglu, fused.rows_grid(F),
                         (b.x, w[p + "mlp_norm"], eps, w[p + "w_gate"], w[p + "w_up"], b.act), i)
            yield launch(matvec.matvec_residual, matvec.grid_for(D), (w[p + "w_down"], b.act, b.x), i)
        yield self.sample()
