"""The persistent step (LAB_PERSISTENT=1): one token, ONE launch -- kernels/persistent.py's
`step_persistent`, a cooperative kernel that runs the fused step's math (the bits of
LAB_FUSION=1 with LAB_ATTN_TAIL=grid) phase by phase over a persistent grid, each phase waiting
on counters in global memory for exactly what it reads (no grid barrier).

What it needs that the other steps do not, allocated once at start-up (`own_buffers`:
`alloc_persistent`, before any capture, and only in this mode):
  norms [L, 2, D], wqkv [L, 3D, D], wo [L, D, D], w_gu [L, 2, F, D], w_down [L, D, F]
      every layer's weights stacked (a copy of the per-layer buffers: the kernel walks the
      layers itself, and one argument per stack keeps its argument list at 24)
  k_cache, v_cache [L, max_seq, D]
      the KV cache as ONE buffer per K and V; `Buffers.k_cache[i]` are its rows, so everything
      that reads a layer's cache (evidence, downloads) sees the same memory
  counter [counter_slots(n_head)] int32
      the kernel's error word, then its counts (zeros at start; each clean launch leaves them
      `settled`: the default's arrive exit zeroes them, the epoch variant's advances a launch
      count E the next launch's targets start from; either way a graph replays with no host
      work)
  geometry
      (grid, block) from `kernels.persistent.persistent_geometry`: as many blocks as SMs,
      capped by the blocks the device can co-schedule (the backend's `cooperative_limits`; the
      simulator, which has no occupancy API, uses SIM_GRID). A device that cannot co-schedule
      a block, or has no cooperative launch, is refused (`check_device`) before any buffer is
      allocated.

The error word: a wait in the kernel that gives up (its producers never counted, within
kernels/persistent.py's SPIN_LIMIT polls) writes which wait it was there, and the launch still
ends. The host never reads it inside a step: `check_decode` reads it once a decode's steps are
done, zeroes the whole counter (word and counts: a clean start whatever the counts were left
at) and raises a DeviceFault naming the wait (the device itself is sound: the next request
decodes normally).

The kernel: `PersistentStep.kernel`, kernels/persistent.py's registered step_persistent (its
default variant); `variant_step(name)` is the step launching another of its VARIANTS
(scripts/megakernel_probe.py times them side by side).

The step keeps the host-work pieces of the fused step (prepare_rope, prepare_attention,
scratch, graph_key: the lazy-initialisation bugs and STEP_KEY work here too) and lacks every
launch piece (`PERSISTENT_ABSENT`, lab/bugspec.py: a bug overriding one is refused). The split
count still comes from the plan: the kernel reads it from the scratch view's shape, so the
graph cache keeps one graph per plan key, exactly as for the fused step.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import kernels
from kernels import persistent
from lab.bugspec import PERSISTENT_ABSENT
from lab.errors import DeviceFault, LabError
from lab.plan import Plan
from .step import FusedStep, launch


@dataclass
class PersistentBuffers:
    norms: object = None
    wqkv: object = None
    wo: object = None
    w_gu: object = None
    w_down: object = None
    k_cache: object = None
    v_cache: object = None
    counter: object = None
    geometry: tuple = ()


def launch_geometry(be, model_cfg, kernel=None) -> tuple:
    """(grid, block) of step_persistent (or `kernel`, a variant's spec) on backend `be`, or a
    LabError saying why this device cannot run it (no cooperative launch, or not one block of
    it co-resident)."""
    threads = persistent.PERSISTENT_THREADS
    limits = be.cooperative_limits(kernel or kernels.REGISTRY["step_persistent"], threads)
    if limits is None:                               # the simulator: no occupancy to ask
        sms = co_resident = persistent.SIM_GRID
    else:
        sms, co_resident, why = limits
        if why:
            raise LabError(f"LAB_PERSISTENT=1 refused on this device: {why}")
    try:
        return persistent.persistent_geometry(model_cfg.head_dim, sms, co_resident, threads)
    except ValueError as exc:
        raise LabError(f"LAB_PERSISTENT=1 refused on this device: {exc}") from None


def alloc_persistent(be, model, kv_dtype, kv_init: str, kernel=None) -> PersistentBuffers:
    """The persistent step's buffers (above), weights uploaded; refuses before allocating."""
    c, w, f32 = model.cfg, model.weights, np.float32
    out = PersistentBuffers(geometry=launch_geometry(be, c, kernel))
    L = range(c.n_layer)
    host = {
        "norms": np.stack([np.stack([w[f"layers.{i}.attn_norm"], w[f"layers.{i}.mlp_norm"]]) for i in L]),
        "wqkv": np.stack([w[f"layers.{i}.wqkv"] for i in L]),
        "wo": np.stack([w[f"layers.{i}.wo"] for i in L]),
        "w_gu": np.stack([np.stack([w[f"layers.{i}.w_gate"], w[f"layers.{i}.w_up"]]) for i in L]),
        "w_down": np.stack([w[f"layers.{i}.w_down"] for i in L]),
    }
    for name, arr in host.items():
        buf = be.alloc(f"persistent.{name}", arr.shape, f32)
        be.upload(buf, arr)
        setattr(out, name, buf)
    for name in ("k_cache", "v_cache"):
        setattr(out, name, be.alloc(name, (c.n_layer, c.max_seq, c.d_model), kv_dtype, init=kv_init))
    out.counter = be.alloc("persistent.counter", (persistent.counter_slots(c.n_head),), np.int32)
    return out


def check_error_word(be, counter) -> None:
    """A DeviceFault naming the wait that gave up, if the kernel's error word says one did; the
    counter is zeroed first (reported once; the counts start clean, whatever they were left at)."""
    word = be.download(counter)
    code = int(word[persistent.SLOT_ERR])
    if code:
        be.upload(counter, np.zeros_like(word))
        raise DeviceFault(f"step_persistent: a wait gave up after {persistent.SPIN_LIMIT} polls "
                          f"({persistent.describe_wait(code)}): its producers never counted, "
                          f"so this decode's tokens are no result (error word {code}, read "
                          f"after the decode)")


class PersistentStep(FusedStep):
    """The step as one launch of step_persistent (1 launch per token, layer None: no layer
    stack of launches). Its host work is the fused step's: the tables' and the scratch's
    preparation (none, unless a lazy-initialisation bug overrides them), then the launch."""

    absent = PERSISTENT_ABSENT
    kernel = persistent.step_persistent    # a variant's step (variant_step) launches its own

    @classmethod
    def check_device(cls, be, model_cfg) -> None:
        launch_geometry(be, model_cfg, cls.kernel)

    @classmethod
    def own_buffers(cls, dev, model, cfg, kv_init: str) -> None:
        super().own_buffers(dev, model, cfg, kv_init)
        dev.persistent = alloc_persistent(dev.backend, model, np.dtype(cfg.kv_dtype), kv_init,
                                          cls.kernel)

    def check_decode(self) -> None:
        """After a decode's steps: the error word, read once (a DeviceFault if a wait gave up,
        the word cleared)."""
        check_error_word(self.dev.backend, self.dev.persistent.counter)

    def items(self, plan: Plan):
        for layer in range(self.engine.model.cfg.n_layer):
            yield from self.prepare_rope(layer)
        yield from self.prepare_attention(plan)
        part_o, part_ml = self.scratch(plan.splits)
        yield self.whole_step(part_o, part_ml)

    def whole_step(self, part_o, part_ml):
        """The token's step: embed, every layer, the LM head, argmax and pos += 1."""
        c, b, w, pb = self.engine.model.cfg, self.dev.buf, self.dev.w, self.dev.persistent
        return launch(self.kernel, pb.geometry,
                      (b.tokens, b.pos, b.n_prompt, w["tok_emb"], pb.norms, pb.wqkv, pb.wo,
                       pb.w_gu, pb.w_down, w["final_norm"], w["lm_head"], np.float32(c.norm_eps),
                       np.float32(1.0 / np.sqrt(c.head_dim)), b.cos, b.sin, pb.k_cache,
                       pb.v_cache, b.x, b.q, part_o, part_ml, b.act, b.logits, pb.counter))


def variant_step(name: str) -> type[PersistentStep]:
    """The persistent step launching variant `name` of the kernel (kernels/persistent.py's
    VARIANTS, `variant_spec`): pass it as DecodeEngine(..., step=...) with LAB_PERSISTENT=1."""
    spec = persistent.variant_spec(name)
    if spec is PersistentStep.kernel:
        return PersistentStep
    return type(f"PersistentStep[{name}]", (PersistentStep,), {"kernel": spec})
