"""Deliberate bugs, one switch each (`LAB_BUG_<NAME>=1`, or `LabConfig(bugs={"name"})`).

Each is a real failure class of graph-resident decode, small enough to read in one place:

frozen (right on replay 1, wrong from replay 2 -- a host value frozen into the graph):
  frozen_kv_row      the host computes the KV-cache row view k_cache[pos] and passes its pointer
  ctx_by_value       the context length reaches attention as a by-value loop bound
  pos_outside_graph  the host uploads the position before each eager step and before the
                     capture, and no kernel advances it inside the step; a replay never re-runs
                     that upload (a host write before EVERY launch would be correct: the fix)
illegal (the capture fails; the eager fallback keeps the output right; the ledger says why):
  lazy_table         the RoPE tables are uploaded on first use instead of at start-up
  lazy_scratch       the attention scratch is grown through the pool's synchronous allocator
                     when the plan needs more than it has (a stream-ordered allocation,
                     cudaMallocAsync, would be capturable: it becomes a graph memory node)
  raw_array          a kernel receives a raw CuPy array, which numba synchronises on
                     (array-interface sync), instead of the once-wrapped device array
race (only under LAB_PDL=1: a programmatic launch starts before its predecessor ends):
  late_wait          a kernel reads its input before its PDL wait (rmsnorm_late_wait)
fault (a kernel faults on the device; the error is reported by a later call, as CUDA does):
  float_ids          the sampler gets the token buffer viewed as float32; the next step's
                     embedding reads the float's bits as an id and faults far outside its table
unreplayed (every capture succeeds and the tokens are right, but no graph is ever replayed:
case study 004's question, "does the runtime replay what it captured?"):
  step_key           the graph cache's key holds the engine's step count, so no two steps
                     share a key (as a speculative decoder that keys its verify graph on the
                     accepted count may); only the ledger (capture, capture, ...), the replay
                     gate and the audit's key check show it

The same bug has other forms, with no toggle (`KEY_VARIANTS`, `key_variant_step`: the replay
gate's and the audit's fixtures): a key that holds position // 2 (each key met twice), position
+ 1 (every graph found again when a warm-up visited the same positions), a step count with no
name, the step count // 2 (a key that repeats once before it changes) and a clock tick. Each
is a graph key that takes more values than the plan does; lab/ledger.py's `key_changes` finds
them all.

Each bug is a named override of one or two pieces of the clean step (lab/engine/step.py): the
classes at the end of this file are the whole of what a bug changes (`OVERRIDES`);
lab/engine/compose.py's `compose_step` puts the switched-on bugs on the step; the `Bug` rows (lab/bugspec.py, light, so the config can
check a toggle set without importing the step) say what each freezes, how it is caught, the fix
and the pieces it overrides.

With the fused step (LAB_FUSION=1, `FusedStep`) a bug works when the pieces it overrides are
still there -- lazy_table (its host work comes before norm_qkv_rope, where RoPE now is),
lazy_scratch (attn_fused uses the same scratch) and raw_array (norm_qkv_rope reads the norm's
input) -- and is refused, with a LabError saying why, when it overrides a piece the fused step
does not have (`FusedStep.absent`): frozen_kv_row (the standalone RoPE + KV append),
ctx_by_value (the standalone attention partial), pos_outside_graph (the standalone position
kernel) and late_wait (the standalone rmsnorm). A bug never silently vanishes.
"""
from __future__ import annotations

import numpy as np

from kernels import attention, rmsnorm, rope, sample
from lab.backend import Buffer
from lab.bugspec import (BUGS, RANK_BUGS, Bug, fusion_refusal,  # noqa: F401 (the table)
                         ranks_refusal)
from lab.bugspec import refusals as _refusals
from lab.errors import CaptureError
from .step import HostWork, Step, launch


# ---- each bug as the pieces of the step it overrides ---------------------------------------------
class _Buggy(Step):
    rebuilt_each_step = True   # its launches or host work depend on the position or on host state


class FrozenKvRow(_Buggy):
    def append_kv(self, plan, layer):
        """The host picks the KV row: a pointer (cache + position * row bytes) the graph freezes."""
        c, b, be = self.engine.model.cfg, self.dev.buf, self.dev.backend
        row = plan.position
        return launch(rope.rope_kv_append_row, rope.grid_for(c.n_head, c.head_dim),
                      (b.qkv, b.pos, b.cos, b.sin, b.q, be.row(b.k_cache[layer], row),
                       be.row(b.v_cache[layer], row)), layer)


class CtxByValue(_Buggy):
    def attention(self, plan, layer, part_o, part_ml, scale):
        """The context length passed by value: a loop bound the graph freezes."""
        c, b = self.engine.model.cfg, self.dev.buf
        return launch(attention.attn_partial_len, attention.partial_grid(c.n_head, plan.splits, c.head_dim),
                      (b.q, b.k_cache[layer], b.v_cache[layer], np.int32(plan.position + 1),
                       part_o, part_ml, scale), layer)


class PosOutsideGraph(_Buggy):
    def prelude(self, plan):
        """The host uploads the position before the step: at capture time only, for a graph."""
        self.dev.backend.upload(self.dev.buf.pos, np.array([plan.position], np.int32))

    def advance(self):
        return []     # no kernel advances the position inside the step


class LazyTable(_Buggy):
    tables_at_start_up = False

    def __init__(self, engine, rank=0):
        super().__init__(engine, rank)
        self.lazy["rope_uploaded"] = False

    def prepare_rope(self, layer):
        if not self.lazy["rope_uploaded"]:
            yield HostWork("upload the RoPE tables on first use", self.upload_tables_on_first_use)

    def upload_tables_on_first_use(self):
        """Upload the RoPE tables on first use, "best effort": a failed upload is only noted (an
        all too common pattern), so inside a capture the failure does not show here; the
        capture, invalidated by it, fails later, at end_capture."""
        self.lazy["rope_uploaded"] = True        # marked first, as such code usually is
        be, b, (cos, sin) = self.dev.backend, self.dev.buf, self.engine.devices.rope_host
        try:
            be.upload(b.cos, cos)
            be.upload(b.sin, sin)
        except CaptureError as exc:
            self.engine.warnings.append(f"rope table upload failed: {exc}")


class LazyScratch(_Buggy):
    scratch_splits_at_start = 1

    def __init__(self, engine, rank=0):
        super().__init__(engine, rank)
        self.lazy["scratch_splits"] = self.scratch_splits_at_start

    def prepare_attention(self, plan):
        if plan.splits > self.lazy["scratch_splits"]:
            yield HostWork(f"grow the attention scratch to {plan.splits} splits",
                           lambda: self.grow_scratch(plan.splits))

    def grow_scratch(self, splits):
        """Allocate scratch for `splits` when the plan needs more than there is."""
        self.lazy["scratch_splits"] = splits     # capacity recorded, then allocated
        self.engine.devices.alloc_scratch(splits, self.rank)

    def scratch(self, splits):
        if splits <= self.lazy["scratch_splits"]:
            return self.dev.partials[splits]
        # a query before the growth: the buffers this step would allocate do not exist yet
        c = self.engine.model.cfg
        return (Buffer("part_o (not yet allocated)", 0, (c.n_head, splits, c.head_dim), np.dtype(np.float32)),
                Buffer("part_ml (not yet allocated)", 0, (c.n_head, splits, 2), np.dtype(np.float32)))


class RawArrayArg(_Buggy):
    def norm_input(self, layer):
        """Layer 0's norm gets x as the raw framework array (numba synchronises on it)."""
        x = self.dev.buf.x
        return self.dev.backend.raw(x) if layer == 0 else x


class LateWait(_Buggy):
    rebuilt_each_step = False           # the same launches every step: only a kernel differs
    attn_norm_kernel = rmsnorm.rmsnorm_late_wait


class FloatIds(Step):
    def sample_next(self):
        """The sampler handed the token buffer as float32 (the wrong dtype for int32 ids)."""
        b, be = self.dev.buf, self.dev.backend
        return launch(sample.argmax_next_float, (sample.ARGMAX_GRID, sample.ARGMAX_BLOCK),
                      (self.dev.vocab_view, b.pos, b.n_prompt, be.view_as(b.tokens, np.float32)))


class StepKey(Step):
    def graph_key(self, plan):
        """The graph filed under the plan key AND the engine's step count: a new key at every
        step, so every step captures a graph that is right, and that no later step looks up."""
        return (*plan.key, "step", self.engine.steps_run)


# ---- case 004's other forms: graph keys that do not come back (no toggle: the replay gate's and
# the audit's fixtures) --------------------------------------------------------------------------
class _KeyVariant:
    """A graph key of the plan key and one more part (`extra`): a mixin over any step (the
    one-token step, the fused or the verify step), so each form exists wherever a graph key
    does. Every capture succeeds and the tokens are right; whether a later step finds the graph
    depends on whether the extra part comes back."""

    def extra(self) -> tuple:
        raise NotImplementedError

    def graph_key(self, plan):
        return (*super().graph_key(plan), *self.extra())


class HalfPositionKey(_KeyVariant):
    """position // 2: each key met twice in a decode (captured, then replayed once)."""
    def extra(self):
        return ("half", self.engine.position // 2)


class NextPositionKey(_KeyVariant):
    """position + 1 (the context length): a new key at every position; a run that revisits the
    positions (a warm-up, then timed reps) finds each graph again."""
    def extra(self):
        return ("ctx", self.engine.position + 1)


class UnnamedCounterKey(_KeyVariant):
    """The engine's step count with no name before it: a part a (name, value) reading skips."""
    def extra(self):
        return (self.engine.steps_run,)


class PairKey(_KeyVariant):
    """The step count // 2: a key repeats once (one replay) before it changes, so no part of it
    differs at every step."""
    def extra(self):
        return ("pair", self.engine.steps_run // 2)


class ClockKey(_KeyVariant):
    """The backend's clock in 1 ms ticks (a host sync, as reading a clock after the device's
    work is): a few steps share a tick, then it moves on, and it never comes back."""
    def extra(self):
        return ("tick", int(self.engine.backend.clock() * 1e3))


KEY_VARIANTS: dict[str, type] = {
    "half_position": HalfPositionKey, "next_position": NextPositionKey,
    "unnamed_counter": UnnamedCounterKey, "pair": PairKey, "clock": ClockKey,
}


def key_variant_step(name: str, base: type[Step] = Step) -> type[Step]:
    """`base` with the graph key of KEY_VARIANTS[name]: pass it as DecodeEngine(step=...). For
    LAB_DRAFT>0 pass a verify step as `base` (lab/engine/draft.py's DraftStep)."""
    return type(f"{base.__name__}+{name}_key", (KEY_VARIANTS[name], base), {})


OVERRIDES: dict[str, type[Step]] = {
    "frozen_kv_row": FrozenKvRow, "ctx_by_value": CtxByValue, "pos_outside_graph": PosOutsideGraph,
    "lazy_table": LazyTable, "lazy_scratch": LazyScratch, "raw_array": RawArrayArg,
    "late_wait": LateWait, "float_ids": FloatIds, "step_key": StepKey,
}


def refusals(names, base: type[Step] = Step) -> dict[str, str]:
    """{bug: why it cannot exist in `base`} for the named bugs that override a piece `base` does
    not have (`base.absent`: the fused step's missing one-op-per-kernel pieces)."""
    return _refusals(names, getattr(base, "absent", {}))
