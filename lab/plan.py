"""decode_plan(): every host decision about one decode step, made in one place.

The plan holds what a captured graph freezes by design -- the number of attention `splits` (and
with it the attention grids) and the kernel choices: the combine's, and the fused step's.
Everything that changes every token (position, token id, KV contents) is NOT here: it lives in
device memory.

The engine calls `decode_plan()` both to build a step's launches and to decide whether the
cached graph still fits (`plan.key`); one function, so the two can never disagree.
"""
from __future__ import annotations

from dataclasses import dataclass

# Attention work per block: the context is cut into `splits` slices of at most ~CHUNK_TARGET
# positions, rounded to a power of two so plans (and graphs) change only at a few boundaries.
CHUNK_TARGET = 32
MAX_SPLITS = 32
# the split counts a plan may have: the engine views its attention scratch for each of them
SPLIT_CHOICES = tuple(2 ** i for i in range(MAX_SPLITS.bit_length()))


@dataclass(frozen=True)
class Plan:
    position: int          # the step's position (context length is position + 1)
    splits: int            # attention slices per head
    split_combine: bool    # combine as merge + project (2 kernels) instead of one; fused: attn_fused
                           # as partials + merge + per-head projection (3 kernels)
    n_head: int
    pdl: bool = False      # launches are programmatic (PDL edges in the graph)
    overlap: bool = False  # the k/v projection runs on a side stream (a parallel branch)
    fusion: bool = False   # the fused step (18 launches) instead of one op per kernel (37)
    draft: int = 0         # LAB_DRAFT: tokens drafted per step (the verify step over draft + 1)
    persistent: bool = False  # LAB_PERSISTENT: the whole step in one cooperative kernel
    attn_tail: str = "grid"   # LAB_ATTN_TAIL: the fused attention's tail (fusion only)

    @property
    def key(self) -> tuple:
        """What a captured graph depends on: a different key means a different graph (a fused
        and an unfused step never share one; a verify step's key names its draft length)."""
        key = ("splits", self.splits, "split_combine", self.split_combine, "pdl", self.pdl,
               "overlap", self.overlap, "fusion", self.fusion)
        if self.persistent:   # one kernel: the splits are its scratch view's shape
            key += ("persistent", True)
        elif self.fusion:     # the fused attention's kernel(s)
            key += ("attn_tail", self.attn_tail)
        return key + ("draft", self.draft) if self.draft else key


def splits_for(context: int) -> int:
    """Smallest power of two with context / splits <= CHUNK_TARGET, capped at MAX_SPLITS."""
    if context < 1:
        raise ValueError(f"context must be >= 1, got {context}")
    need = -(-context // CHUNK_TARGET)
    splits = 1
    while splits < need and splits < MAX_SPLITS:
        splits *= 2
    return splits


def decode_plan(position: int, model_cfg, lab_cfg, splits: int | None = None) -> Plan:
    """The plan for the decode step at `position` (0-based) of a model and lab configuration.
    `splits` pins the attention split count (one of SPLIT_CHOICES), for experiments on the
    policy; None (the default) follows the policy, `splits_for(position + 1)`."""
    if not 0 <= position < model_cfg.max_seq:
        raise ValueError(f"position {position} outside [0, {model_cfg.max_seq})")
    draft = getattr(lab_cfg, "draft", 0)
    if draft:
        # speculative decoding: the host does not know the position between its reads (each
        # step advances it by the accepted count, on the device), so the verify step's split
        # count is fixed (LAB_DRAFT_SPLITS): one plan, one graph for the whole generation
        return Plan(position, lab_cfg.draft_splits, False, model_cfg.n_head, lab_cfg.pdl,
                    False, False, draft)
    if splits is None:
        splits = splits_for(position + 1)
    elif splits not in SPLIT_CHOICES:
        raise ValueError(f"splits={splits!r}: use one of {', '.join(map(str, SPLIT_CHOICES))}")
    # split_combine: the unfused step's combine as merge + project, or under LAB_FUSION the
    # fused attention's phases as launches of their own (lab/engine/step.py FusedStep.attend)
    return Plan(position, splits, lab_cfg.split_combine, model_cfg.n_head, lab_cfg.pdl,
                lab_cfg.overlap, lab_cfg.fusion, persistent=getattr(lab_cfg, "persistent", False),
                attn_tail=getattr(lab_cfg, "attn_tail", "grid"))


def plan_boundaries(max_seq: int) -> list[int]:
    """Positions at which the plan key changes (the first position of each new plan)."""
    out, prev = [], splits_for(1)
    for pos in range(1, max_seq):
        s = splits_for(pos + 1)
        if s != prev:
            out.append(pos)
            prev = s
    return out
