"""Deliberate bugs, one switch each (`LAB_BUG_<NAME>=1`, or `LabConfig(bugs={"name"})`).

Each is a real failure class of graph-resident decode, small enough to read in one place:

frozen (right on replay 1, wrong from replay 2 -- a host value frozen into the graph):
  frozen_kv_row      the host computes the KV-cache row view k_cache[pos] and passes its pointer
  ctx_by_value       the context length reaches attention as a by-value loop bound
  pos_outside_graph  the host uploads the position before each step instead of a kernel
                     advancing it inside the step; a replay never re-runs that upload
illegal (the capture fails; the eager fallback keeps the output right; the ledger says why):
  lazy_table         the RoPE tables are uploaded on first use instead of at start-up
  lazy_scratch       the attention scratch is allocated when the plan needs more than it has
  raw_array          a kernel receives a raw CuPy array, which numba synchronises on
                     (array-interface sync), instead of the once-wrapped device array
race (only under LAB_PDL=1: a programmatic launch starts before its predecessor ends):
  late_wait          a kernel reads its input before its PDL wait (rmsnorm_late_wait)

The engine asks `has(cfg, name)` at the few places a bug changes what it does; everything else
about the bug (what it freezes, how it is caught, the fix) is described here for the notebooks.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Bug:
    name: str
    kind: str          # "frozen", "illegal" or "race"
    what: str          # what a capture freezes, or which illegal operation fires
    caught_by: str     # "audit", "lazy-init detector" or "PDL check"
    fix: str

    @property
    def env(self) -> str:
        return f"LAB_BUG_{self.name.upper()}"


BUGS: dict[str, Bug] = {b.name: b for b in (
    Bug("frozen_kv_row", "frozen", "pointer: the KV-cache row k_cache[pos] (buffer + offset)", "audit",
        "pass the whole cache; the kernel indexes the row with the device-resident position"),
    Bug("ctx_by_value", "frozen", "loop bound: the context length passed by value", "audit",
        "read the context length from device memory (pos[0] + 1) inside the kernel"),
    Bug("pos_outside_graph", "frozen", "the position, uploaded by the host before the step", "audit",
        "advance the position with a kernel inside the captured step"),
    Bug("lazy_table", "illegal", "table upload on first use (synchronous host-to-device copy)",
        "lazy-init detector", "upload every table at start-up, before any capture"),
    Bug("lazy_scratch", "illegal", "scratch allocation when the capacity is short",
        "lazy-init detector", "allocate scratch for the largest plan once, at start-up"),
    Bug("raw_array", "illegal", "array-interface synchronisation of a raw CuPy argument",
        "lazy-init detector", "wrap each buffer once with cuda.as_cuda_array(x, sync=False)"),
    Bug("late_wait", "race", "a read of the predecessor's output before the PDL wait",
        "PDL check", "make pdl_wait() the first statement of every kernel"),
)}


def has(cfg, name: str) -> bool:
    if name not in BUGS:
        raise KeyError(f"unknown bug {name!r}")
    return name in cfg.bugs
