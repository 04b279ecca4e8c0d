"""Did the claimed path run? Each toggle of an engine side's spec against the engine's own record.

A side claims a path by its toggles (LAB_GRAPH=1, LAB_KV_DTYPE=float16, ...); `path_checks` reads
the evidence for each from the engine's ledger, launch log and backend (CHECKS: toggle -> reader).
A claim the run does not show is a dead fast path, and FAILs the comparison
(lab/measure/compare.py).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .compare_sides import REFERENCE, Run


# ---- did the claimed path run? -----------------------------------------------------------------
@dataclass(frozen=True)
class PathCheck:
    side: str
    claim: str                 # "LAB_GRAPH=1"
    ok: bool | None            # None: no evidence this tool can read for that claim
    evidence: str


def _issued(engine):
    """Launch-log records of launches issued one by one (eager steps and captures)."""
    return [r for r in engine.log.records if r.kind in ("eager", "capture")]


def _cache_name(provenance: str) -> str:
    return provenance.split(" ")[0].split("+")[0]      # "k_cache.0+512B (raw array)" -> k_cache.0


def _check_kv(engine, want: str) -> tuple[bool, str]:
    dtypes = {b.name: np.dtype(b.dtype).name for b in [*engine.buf.k_cache, *engine.buf.v_cache]}
    kernels, touched = Counter(), set()
    for r in _issued(engine):
        names = [_cache_name(p) for _, p in r.args if _cache_name(p) in dtypes]
        if names:
            kernels[r.kernel] += 1
            touched.update(names)
    used = sorted({dtypes[n] for n in touched})
    ok = bool(kernels) and used == [want] and set(dtypes.values()) == {want}
    return ok, (f"{len(dtypes)} cache buffers {'/'.join(sorted(set(dtypes.values())))}; "
                f"{sum(kernels.values())} launches ({', '.join(sorted(kernels)) or 'none'}) took "
                f"{len(touched)} of them: {'/'.join(used) or 'none'}")


def _check_graph(engine, want: str) -> tuple[bool, str]:
    seen = engine.ledger_summary()
    fell = next((e.reason for e in engine.ledger if e.outcome == "fallback"), "")
    if want == "1":   # every step a graph launch: replayed, newly captured, updated, or on the device
        ok = (seen.get("replay", 0) + seen.get("device", 0) > 0
              and not (seen.keys() - {"capture", "replay", "update", "device"}))
    else:
        ok = set(seen) == {"eager"}
    return ok, f"ledger {seen}" + (f"; first fallback: {fell}" if fell else "")


def _check_plan_switch(engine, want: str) -> tuple[bool | None, str]:
    """update: a change of plan updates the live graph (ledger "update"); recapture: never."""
    keys = list(dict.fromkeys(e.plan_key for e in engine.ledger))
    updates = sum(e.outcome == "update" for e in engine.ledger)
    if not engine.cfg.graph or len(keys) < 2:
        return None, f"not exercised: {len(keys)} plan(s), graph {engine.cfg.graph}"
    ok = updates > 0 if want == "update" else updates == 0
    return ok, f"{len(keys)} plans, ledger {engine.ledger_summary()}"


def _check_loop(engine, want: str) -> tuple[bool, str]:
    """device: the steps ran inside the device loop (ledger "device"); host: none did. A side
    fed ids step by step runs the host loop whatever it claims: LAB_LOOP=device is then dead."""
    device = sum(e.outcome == "device" for e in engine.ledger)
    ok = device > 0 if want == "device" else device == 0
    return ok, f"{device} of {len(engine.ledger)} steps in the device loop" + (
        f" ({engine.warnings[-1]})" if not ok and engine.warnings else "")


def _check_kernel(engine, want: str, on: str, off: str) -> tuple[bool, str]:
    seen = Counter(r.kernel for r in _issued(engine))
    ok = seen[on] > 0 and seen[off] == 0 if want == "1" else seen[off] > 0 and seen[on] == 0
    return ok, f"launch log: {on} x{seen[on]}, {off} x{seen[off]}"


def _check_split_combine(engine, want: str) -> tuple[bool | None, str]:
    """The split's kernel, against the one-kernel form's: attn_merge vs attn_combine, or under
    fusion attn_combine vs attn_fused_grid (LAB_ATTN_TAIL=grid) or attn_project_heads vs
    attn_fused (heads). Not read with ranks: the rank step always merges,
    then projects each rank's shard, whatever the toggle says."""
    if engine.cfg.ranks > 1:
        return None, ("not checked: with ranks the step always merges, then projects each rank's "
                      "shard (the all-reduce sums them), whatever LAB_SPLIT_COMBINE says")
    if engine.cfg.persistent:
        return _not_launches(engine, "LAB_SPLIT_COMBINE")
    if engine.cfg.fusion and engine.cfg.attn_tail == "grid":
        return _check_kernel(engine, want, "attn_combine", "attn_fused_grid")
    if engine.cfg.fusion:
        return _check_kernel(engine, want, "attn_project_heads", "attn_fused")
    return _check_kernel(engine, want, "attn_merge", "attn_combine")


def _not_launches(engine, var: str) -> tuple[None, str]:
    return None, f"not read: LAB_PERSISTENT=1 runs the whole step in one kernel, whatever {var} says"


def _check_fusion(engine, want: str) -> tuple[bool | None, str]:
    if engine.cfg.persistent:
        return _not_launches(engine, "LAB_FUSION")
    return _check_kernel(engine, want, "norm_qkv_rope", "rmsnorm")


def _check_persistent(engine, want: str) -> tuple[bool, str]:
    """1: every launch of the run is step_persistent (one per step); 0: none is."""
    seen = Counter(r.kernel for r in _issued(engine))
    other = sum(n for k, n in seen.items() if k != "step_persistent")
    ok = seen["step_persistent"] > 0 and other == 0 if want == "1" else seen["step_persistent"] == 0
    return ok, f"launch log: step_persistent x{seen['step_persistent']}, other kernels x{other}"


def _check_overlap(engine, want: str) -> tuple[bool, str]:
    side = sum(r.stream == "side" for r in _issued(engine))
    return (side > 0) == (want == "1"), f"{side} launches on the side stream"


def _check_pdl(engine, want: str) -> tuple[bool, str]:
    refused = [w for w in engine.warnings if "PDL" in w]
    pdl = bool(engine.backend.pdl)
    return pdl == (want == "1"), f"backend launches programmatically: {pdl}" + (
        f" ({refused[0]})" if refused else "")


def _check_launch(engine, want: str) -> tuple[bool, str]:
    eager = sum(r.kind == "eager" for r in _issued(engine))
    mech = engine.backend.mechanism
    return mech == want, f"backend launch mechanism {mech}; {eager} eager launches in the log"


def _check_backend(engine, want: str) -> tuple[bool, str]:
    return want == "auto" or engine.backend.name == want, engine.backend.describe()


CHECKS: dict[str, Callable] = {
    "LAB_BACKEND": _check_backend, "LAB_GRAPH": _check_graph, "LAB_KV_DTYPE": _check_kv,
    "LAB_PDL": _check_pdl, "LAB_OVERLAP": _check_overlap, "LAB_LAUNCH": _check_launch,
    "LAB_SPLIT_COMBINE": _check_split_combine,
    "LAB_FUSION": _check_fusion, "LAB_PERSISTENT": _check_persistent,
    "LAB_PLAN_SWITCH": _check_plan_switch, "LAB_LOOP": _check_loop,
}


def path_checks(run: Run, loop_run: Run | None = None) -> list[PathCheck]:
    """One check per toggle of the side's spec: does the engine's record show that path? ok is
    None where this tool reads no evidence for the toggle, or the run never exercised it.
    `loop_run`: the same spec decoding the whole generation (a side fed step by step always runs
    the host loop), whose engine the LAB_LOOP claim is read from."""
    if run.spec.is_reference:
        return [PathCheck(run.label, REFERENCE, True, "float64 oracle: no engine, no toggles")]
    out = []
    for var, value in run.spec.cfg.toggles().items():
        check = CHECKS.get(var)
        if check is None:
            what = "a deliberate bug" if var.startswith("LAB_BUG_") else "this toggle"
            out.append(PathCheck(run.label, f"{var}={value}", None,
                                 f"not checked: compare reads no evidence of {what}"))
            continue
        side, engine = run.label, run.engine
        if var == "LAB_LOOP" and loop_run is not None:
            side, engine = f"{run.label} ({loop_run.label})", loop_run.engine
        ok, evidence = check(engine, value)
        out.append(PathCheck(side, f"{var}={value}", ok, evidence))
    return out
