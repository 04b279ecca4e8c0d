"""megakernel_bound.json: how close a restructured megakernel could come, measured with bodies
that leave work out (kernels/persistent.py's PROBES: timing only, their bits are not the
step's), graph replay interleaved with the default body and the best multi-node graph arms at
both contexts (notebook 10; docs/results.md's megakernel row).

  tails-noproj  the default body without its output projection phase: the time of every phase
                but that one, with the waits a body would have that folded the projection into
                the attention's tail (each merging block projecting its head). Such a body
                would add that work to this one's time: its ratio to the best multi-node arm
                cannot be below this body's, so where this body is not ahead of the arm, the
                fold cannot meet the gate
A GPU only: a probe has no twin, so the simulator cannot stand in for it.
"""
from __future__ import annotations

from lab.measure.experiment import experiment, today

ARMS = {"fused+pdl graph": {"fusion": True, "pdl": True},
        "fused+split+pdl graph": {"fusion": True, "split_combine": True, "pdl": True},
        "persistent graph": {"persistent": True}}
MULTI_NODE = ("fused+pdl graph", "fused+split+pdl graph")
CONTEXTS, REPS, TOKENS = (64, 900), 5, 64


def bound(rows: list[dict], probes) -> dict:
    """{context: {"best_multi_node", "best_ms", "persistent graph", "persistent NAME" per
    probe: ms/token over the best multi-node arm's (lab/measure/megakernel.py ratio_to_best),
    "gate_reachable": whether any probe is ahead of it (ratio < 1)}} from a sweep's rows."""
    from lab.measure.megakernel import ratio_to_best
    out = ratio_to_best(rows, MULTI_NODE)
    for r in out.values():
        r["gate_reachable"] = any(r[f"persistent {p}"] < 1.0 for p in probes)
    return out


@experiment("megakernel_bound", ("megakernel_bound.json",), priority=78, backends=("cuda",))
def megakernel_bound(ctx) -> None:
    """The megakernel's default body and each body that leaves work out (PROBES) against the
    best multi-node graph arms, graph replay, interleaved at contexts 64 and 900."""
    from kernels import persistent
    from lab.config import LabConfig
    from lab.measure.megakernel import persistent_error, sweep_with_variants
    reps, tokens = (2, 4) if ctx.quick else (REPS, TOKENS)
    probes = tuple(persistent.PROBES)
    sweep, arms = sweep_with_variants(ctx.model, LabConfig(backend=ctx.backend), ARMS, probes,
                                      CONTEXTS, reps, tokens)
    for a in arms[len(ARMS):]:
        persistent_error(a.engine)          # a wait that gave up fails the run
    if not sweep["meaningful"]:             # recorded as it is, said where it is read
        ctx.progress(f"megakernel_bound: timing not meaningful: {sweep['reason']}")
    ratios = bound(sweep["rows"], probes)
    for c, r in ratios.items():
        ctx.progress(f"context {c}: best multi-node {r['best_multi_node']} {r['best_ms']:.4f} "
                     f"ms/token; " + ", ".join(f"{a} / it {v:.3f}" for a, v in r.items()
                                               if a.startswith("persistent")))
    ctx.write_json("megakernel_bound.json", {
        "what": "the megakernel's default body and bodies that leave work out (timing only), "
                "graph replay ms/token against the best multi-node graph arms, interleaved",
        "source": sweep["source"], "date": today(),
        "default_variant": persistent.DEFAULT_VARIANT,
        "probes": {n: dict(v) for n, v in persistent.PROBES.items()},
        "sweep": sweep, "ratio_to_best_multi_node": ratios})
