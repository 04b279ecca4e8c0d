"""LabConfig: every toggle of the lab in one frozen dataclass, and the ONLY reader of `LAB_*`.

Each toggle is one row of `TOGGLES` (variable, field, allowed values, default, meaning). Tests
and notebooks build a `LabConfig(...)` directly; the CLI and `make demo` use `from_env()`.
A bad value is a `LabError` naming the variable and the values allowed.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from lab.bugspec import (BUGS, RANK_BUGS, SPEC_BUGS, draft_refusal, fusion_refusal, loop_refusal,
                         persistent_refusal, ranks_refusal, tail_refusal)
from lab.errors import LabError

# (environment variable, LabConfig field, allowed values, default, meaning)
TOGGLES: tuple[tuple[str, str, tuple[str, ...], str, str], ...] = (
    ("LAB_BACKEND", "backend", ("auto", "cuda", "sim"), "auto",
     "auto = cuda when a usable GPU and CuPy are present, else the CPU simulator"),
    ("LAB_GRAPH", "graph", ("0", "1"), "1", "capture the decode step as a CUDA graph and replay it"),
    ("LAB_SPLIT_COMBINE", "split_combine", ("0", "1"), "0",
     "attention combine as two kernels (merge, project) instead of one; under LAB_FUSION=1 the "
     "fused attention's phases as launches of their own, its bits (LAB_ATTN_TAIL=grid: "
     "attn_partial + attn_combine; heads: partials, merge, per-head projection + residual)"),
    ("LAB_PDL", "pdl", ("0", "1"), "0",
     "programmatic dependent launch (sm_90+; refused with a message elsewhere)"),
    ("LAB_OVERLAP", "overlap", ("0", "1"), "0",
     "q and kv projections on two streams, forked and joined with events"),
    ("LAB_FUSION", "fusion", ("0", "1"), "0",
     "0: one op per kernel (37 launches per token); 1: the fused step (18: norms folded into "
     "the projections, RoPE + KV append into qkv, attention partials + merge + Wo + residual "
     "in one kernel, argmax + position advance into the LM head; kernels/fused.py). "
     "LAB_ATTN_TAIL picks its attention's form; LAB_SPLIT_COMBINE=1 splits that attention into "
     "its phases (22 launches with the grid tail, 26 with the heads tail; the same bits); the "
     "deliberate bugs that override a standalone kernel the fused step lacks are "
     "refused"),
    ("LAB_ATTN_TAIL", "attn_tail", ("grid", "heads"), "grid",
     "the fused attention's tail under LAB_FUSION=1 (kernels/fused.py): grid = attn_fused_grid, "
     "attn_partial's blocks and ceil(D/4) tail blocks in ONE launch, the tail blocks waiting on "
     "a counter for the partials, then attn_combine's merge + Wo + residual (the unfused "
     "attention's bits; LAB_SPLIT_COMBINE=1 makes it attn_partial + attn_combine); heads = "
     "attn_fused, the tail in the last block of each head (n_head blocks: lecture §6's combine, "
     "which LAB_SPLIT_COMBINE=1 splits into three launches that win under capture). "
     "LAB_PERSISTENT=1 runs the grid form"),
    ("LAB_PERSISTENT", "persistent", ("0", "1"), "0",
     "1: the whole decode step of a token in ONE persistent cooperative kernel "
     "(kernels/persistent.py: the math and bits of the fused step with LAB_ATTN_TAIL=grid, "
     "each phase waiting on counters in global memory for what it reads, no grid barrier; "
     "1 launch per token), captured in a graph or launched alone; refuses the other "
     "step variants (LAB_FUSION=1 too: it is implied)"),
    ("LAB_LAUNCH", "launch", ("dispatcher", "prebound"), "prebound",
     "eager launch mechanism: numba's dispatcher (types and flattens the arguments on every "
     "launch) or pre-bound (kernel handle and flattened arguments prepared once per plan, "
     "launched through cuda.core)"),
    ("LAB_LAUNCH_BLOCKING", "launch_blocking", ("0", "1"), "0",
     "wait for every launch to finish before the next call (as CUDA_LAUNCH_BLOCKING=1): a "
     "kernel's fault is then reported by its own launch, not by a later call; slow, for finding "
     "a fault"),
    ("LAB_KV_DTYPE", "kv_dtype", ("float32", "float16"), "float32", "element type of the KV cache"),
    ("LAB_PLAN_SWITCH", "plan_switch", ("recapture", "update"), "recapture",
     "at a plan change: capture and instantiate a graph for the new plan, or capture it and "
     "update the live executable graph in place (cudaGraphExecUpdate; instantiation when refused)"),
    ("LAB_RANKS", "ranks", ("1", "2"), "1",
     "tensor-parallel ranks, one GPU each (one simulated device each on the simulator): heads "
     "and MLP split across ranks, two all-reduces per layer and an all-gather of the logits, "
     "inside each rank's graph (one DecodeEngine for any rank count; the rank step: "
     "lab/engine/ranks.py)"),
    ("LAB_LOOP", "loop", ("host", "device"), "host",
     "generate: the host launches one graph per token, or ONE graph runs every step on the "
     "device (a WHILE node over a SWITCH of every plan's step; needs conditional nodes)"),
    ("LAB_DRAFT", "draft", ("0", "2", "4", "8", "16"), "0",
     "speculative decoding: tokens drafted per step on the device (LAB_DRAFTER), verified "
     "by one step of the model over draft + 1 positions, accepted on the device (0: one token "
     "per step; lab/engine/draft.py). Runs the unfused step on one device, with graphs or "
     "eagerly, PDL allowed; the other launch toggles are refused, and so is 16 (17 columns: "
     "past the MAX_COLS = 9 the verify kernels take)"),
    ("LAB_DRAFTER", "drafter", ("lookup", "ngram"), "lookup",
     "speculative decoding's drafter: prompt lookup (the tokens that followed the latest earlier "
     "occurrence of the text's last tokens: pays where the model copies its context) or an "
     "n-gram table of the training corpus (the token most often written after the last 4: pays "
     "where the model writes what its corpus writes); kernels/draft.py; needs LAB_DRAFT>0"),
    ("LAB_DRAFT_SPLITS", "draft_splits", ("1", "2", "4", "8", "16", "32", "64"), "16",
     "the verify attention's split count over the cache (NSPLIT): fixed for the whole "
     "generation, so ONE graph serves every position; its workspace grows with it; needs "
     "LAB_DRAFT>0 (as LAB_ATTN_TAIL=heads needs LAB_FUSION=1)"),
)
_BOOL_FIELDS = {"graph", "split_combine", "pdl", "overlap", "fusion", "persistent",
                "launch_blocking"}
_INT_FIELDS = {"ranks", "draft", "draft_splits"}
_ALL_BUGS = {**BUGS, **RANK_BUGS, **SPEC_BUGS}
_BUG_VARS = {b.env: name for name, b in _ALL_BUGS.items()}  # LAB_BUG_<NAME> -> bug (lab/bugspec.py)


@dataclass(frozen=True)
class LabConfig:
    backend: str = "auto"
    graph: bool = True
    split_combine: bool = False
    pdl: bool = False
    overlap: bool = False
    fusion: bool = False            # LAB_FUSION: the fused step (lab/engine/step.py FusedStep)
    attn_tail: str = "grid"         # LAB_ATTN_TAIL: the fused attention's tail (grid | heads)
    persistent: bool = False        # LAB_PERSISTENT: the step in one kernel (lab/engine/persistent.py)
    launch: str = "prebound"        # LAB_LAUNCH: how the cuda backend issues each kernel
    launch_blocking: bool = False   # LAB_LAUNCH_BLOCKING: wait for each launch (finding a fault)
    kv_dtype: str = "float32"
    plan_switch: str = "recapture"  # LAB_PLAN_SWITCH: a new graph per plan, or one graph updated
    loop: str = "host"              # LAB_LOOP: who runs generate's loop of steps
    ranks: int = 1                  # LAB_RANKS: tensor-parallel ranks (lab/engine/ranks.py)
    draft: int = 0                  # LAB_DRAFT: tokens drafted per step (lab/engine/draft.py)
    drafter: str = "lookup"         # LAB_DRAFTER: who drafts (kernels/draft.py)
    draft_splits: int = 16          # LAB_DRAFT_SPLITS: the verify attention's NSPLIT
    bugs: frozenset = frozenset()   # deliberate bugs switched on (names from lab/bugspec.py)

    def __post_init__(self):
        object.__setattr__(self, "bugs", frozenset(self.bugs))
        unknown = sorted(set(self.bugs) - set(_ALL_BUGS))
        if unknown:
            raise LabError(f"unknown bug(s) {unknown}; known: {', '.join(_ALL_BUGS)}")
        for var, fld, allowed, _, _ in TOGGLES:
            value = getattr(self, fld)
            shown = ("1" if value else "0") if fld in _BOOL_FIELDS else (
                str(value) if fld in _INT_FIELDS else value)
            if fld in _BOOL_FIELDS and not isinstance(value, bool):
                raise LabError(f"LabConfig.{fld} must be a bool, got {value!r}")
            if fld in _INT_FIELDS and (isinstance(value, bool) or not isinstance(value, int)):
                raise LabError(f"LabConfig.{fld} must be an int, got {value!r}")
            if shown not in allowed:
                raise LabError(f"{var}={shown!r} is not allowed; use one of {', '.join(allowed)}")
        why = fusion_refusal(self.bugs) if self.fusion else None
        if why:
            raise LabError(why)
        why = (ranks_refusal(self) or loop_refusal(self) or draft_refusal(self)
               or persistent_refusal(self) or tail_refusal(self))
        if why:
            raise LabError(why)

    def replace(self, **changes) -> "LabConfig":
        return dataclasses.replace(self, **changes)

    def with_toggles(self, assignments: Mapping[str, str]) -> "LabConfig":
        """Apply `{"LAB_GRAPH": "0", ...}` (as in `bench ab --a LAB_GRAPH=0`) to this config."""
        return self.replace(**_parse(assignments))

    def toggles(self) -> dict[str, str]:
        """This config as `LAB_*` strings (what a benchmark arm or a recorded result names)."""
        out = {}
        for var, fld, _, _, _ in TOGGLES:
            value = getattr(self, fld)
            out[var] = ("1" if value else "0") if fld in _BOOL_FIELDS else (
                str(value) if fld in _INT_FIELDS else value)
        for name in sorted(self.bugs):
            out[_ALL_BUGS[name].env] = "1"
        return out


def _parse(env: Mapping[str, str]) -> dict:
    known = {row[0]: row for row in TOGGLES}
    values = {}
    bugs = set()
    for var, raw in env.items():
        if not var.startswith("LAB_"):
            continue
        if var in _BUG_VARS:
            text = str(raw).strip()
            if text not in ("0", "1"):
                raise LabError(f"{var}={raw!r} is not allowed; use one of 0, 1")
            if text == "1":
                bugs.add(_BUG_VARS[var])
            continue
        if var not in known:
            raise LabError(f"unknown variable {var}; known: {', '.join(sorted([*known, *_BUG_VARS]))}")
        _, fld, allowed, _, _ = known[var]
        text = str(raw).strip()
        if text not in allowed:
            raise LabError(f"{var}={raw!r} is not allowed; use one of {', '.join(allowed)}")
        values[fld] = (text == "1") if fld in _BOOL_FIELDS else (
            int(text) if fld in _INT_FIELDS else text)
    if bugs:
        values["bugs"] = frozenset(bugs)
    return values


def from_env(env: Mapping[str, str] | None = None, **given: str) -> LabConfig:
    """Build a LabConfig from `LAB_*` variables (os.environ by default); unknown LAB_* is an error.
    `given` (e.g. LAB_DRAFT="4": what a command's own flag sets) is laid over them before the
    config is checked."""
    return LabConfig(**_parse({**(os.environ if env is None else env), **given}))


def describe() -> str:
    """A table of every toggle, its values and its default (for `decode-lab --help`)."""
    rows = [f"  {var:<26} {'|'.join(allowed):<16} default {default}: {meaning}"
            for var, _, allowed, default, meaning in TOGGLES]
    rows += [f"  {b.env:<26} {'0|1':<16} default 0: deliberate bug ({b.kind}): {b.what}"
             for b in _ALL_BUGS.values()]
    return "\n".join(rows)


STUDENT_ENV = "DECODE_LAB_STUDENT"   # a fixed self-check identity: CI, tests, the notebook build


def selfcheck_student() -> str | None:
    """The self-check identity fixed by DECODE_LAB_STUDENT (CI and the notebook build set it;
    lab/teach/selfcheck/questions.py), or None when it is unset or empty."""
    return os.environ.get(STUDENT_ENV) or None


def child_env(**overrides: str) -> dict[str, str]:
    """This process's environment with `overrides` set: for a child process that must read a
    variable at its start (numba's NUMBA_ENABLE_CUDASIM is read when numba is imported)."""
    return {**os.environ, **overrides}


def python_path(first: str) -> str:
    """PYTHONPATH for a child process: `first`, then this process's PYTHONPATH (if any)."""
    return os.pathsep.join(p for p in (first, os.environ.get("PYTHONPATH")) if p)


FIXTURE_ENV = "DECODE_LAB_FIXTURE"   # "large": the hands-on checks' larger random fixture


def fixture_size() -> str:
    """"large" when DECODE_LAB_FIXTURE=large, else "small": a hands-on check MAY draw a larger
    random fixture when asked (scripts/mutation_score.py asks it so when it re-runs a mutant
    listed as equivalent, lab/teach/mutate.py)."""
    return "large" if os.environ.get(FIXTURE_ENV) == "large" else "small"


CONFORMANCE_CACHE_ENV = "DECODE_LAB_CONFORMANCE_CACHE"   # a folder for simulated results


def conformance_cache() -> str | None:
    """The folder where `decode-lab conformance` keeps simulated results for other processes
    (DECODE_LAB_CONFORMANCE_CACHE; the test suite sets it), or None when unset or empty."""
    return os.environ.get(CONFORMANCE_CACHE_ENV) or None


def lab_environment() -> list[tuple[str, str]]:
    """This process's LAB_* variables as sorted (name, value) pairs (part of a kept result's key)."""
    return sorted((k, v) for k, v in os.environ.items() if k.startswith("LAB_"))


def nccl_env() -> None:
    """Set NCCL's environment before it starts, where the user has not: every rank is a GPU of
    this host (NVLink or PCIe between them), so NCCL's probe for InfiniBand adapters
    (NCCL_IB_DISABLE=1 skips it) would only cost start-up time."""
    os.environ.setdefault("NCCL_IB_DISABLE", "1")


STATE_ENV = "DECODE_LAB_STATE"   # the per-user state folder (default ~/.decode-lab)


def state_folder() -> Path:
    """The per-user folder of the lab's own state: the journal of temporary files (lab/files.py)
    and the saved tracebacks of internal errors (lab/exits.py). DECODE_LAB_STATE when set and
    not empty, else ~/.decode-lab (HOME decides ~). Not created here."""
    return Path(os.environ.get(STATE_ENV) or Path.home() / ".decode-lab")
