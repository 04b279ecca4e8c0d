"""plan_switch.json: what one plan change costs the host, per mechanism (notebook 11).

  capture + instantiate   LAB_PLAN_SWITCH=recapture: the step captured, instantiated, uploaded
  capture + update        LAB_PLAN_SWITCH=update: the step captured, then cudaGraphExecUpdate
  update only             the update alone, from a captured graph kept per plan
  node parameters         cudaGraphExecKernelNodeSetParams of the changed (or all) kernel nodes:
                          the floor of an in-place switch, no capture (cuda only)

Each timed between two device synchronizes, over `reps` switches between the first two plans,
alternating direction; medians and quartiles in microseconds. A check decodes with each
mechanism and compares the tokens.
"""
from __future__ import annotations

import time

import numpy as np

from lab.config import LabConfig
from lab.errors import LabError
from lab.measure.experiment import experiment, now

PROMPT = "ROMEO.\n"
REPS = 30


def _timed(be, fn) -> tuple[float, object]:
    be.synchronize()
    t0 = time.perf_counter()
    out = fn()
    be.synchronize()
    return 1e6 * (time.perf_counter() - t0), out


def _summary(us: list[float]) -> dict:
    q1, med, q3 = np.percentile(us, [25, 50, 75])
    return {"median_us": float(med), "q1_us": float(q1), "q3_us": float(q3), "n": len(us),
            "samples_us": [round(x, 2) for x in us]}


def _cu(result):
    """A cuda-bindings (err, *values) tuple unpacked, raising on an error code."""
    err, *values = result
    if int(err) != 0:
        raise RuntimeError(f"CUDA error {err!r}")
    return values[0] if len(values) == 1 else values


def _node_param_setter(live, source_from, source_to):
    """A function that sets, on `live` (instantiated from `source_from`), the kernel-node
    parameters of `source_to` for the node indices given. Through the driver API: numba's
    kernels are driver functions, which the runtime's cudaGraphKernelNodeGetParams refuses."""
    from cuda.bindings import driver as cu
    from cuda.bindings import runtime as cudart

    def nodes(src):
        n = _cu(cudart.cudaGraphGetNodes(src.handle, 0))[1]
        return [cu.CUgraphNode(init_value=int(x))
                for x in _cu(cudart.cudaGraphGetNodes(src.handle, n))[0]]

    old, new = nodes(source_from), nodes(source_to)
    params = [_cu(cu.cuGraphKernelNodeGetParams(n)) for n in new]
    exec_ = cu.CUgraphExec(init_value=int(live.graph.graphExec))

    def set_params(indices):
        for i in indices:
            _cu(cu.cuGraphExecKernelNodeSetParams(exec_, old[i], params[i]))
    return set_params


def _same_step(eng, live, plan, set_params, source) -> bool:
    """One step in `plan` from the same state, run by `live` after `set_params()` and after a
    cudaGraphExecUpdate from `source`: the same logits, bit for bit?"""
    logits = []
    for switch in (set_params, lambda: live.update(source)):
        switch()
        eng.reset(eng.encode(PROMPT), 0)
        eng.seek(plan.position)
        live.launch()
        logits.append(eng.logits())
    return bool(logits[0].tobytes() == logits[1].tobytes())


@experiment("plan_switch", files=("plan_switch.json",), priority=120,
            doc="host cost of one plan change per LAB_PLAN_SWITCH mechanism (notebook 11)")
def record(ctx) -> None:
    from lab.engine.runner import DecodeEngine
    from lab.plan import plan_boundaries
    model, reps = ctx.model, 2 if ctx.quick else REPS
    bounds = plan_boundaries(model.cfg.max_seq)
    eng = DecodeEngine(model, LabConfig(backend=ctx.backend, plan_switch="update"))
    be = eng.backend
    eng.generate(PROMPT, bounds[0] + 8)                 # warm: two plans met
    a, b = eng.plan(0), eng.plan(bounds[0])
    launches = {p.key: eng.step_launches(p) for p in (a, b)}
    changed = [i for i, (x, y) in enumerate(zip(launches[a.key], launches[b.key])) if x != y]
    defs = {p.key: eng.capture(p, instantiate=False)[0] for p in (a, b)}
    live = be.instantiate(defs[a.key])
    rows = {"capture + instantiate": [], "capture only": [], "instantiate only": [],
            "capture + update": [], "update only": [],
            "node parameters (changed nodes)": [], "node parameters (all nodes)": []}
    for rep in range(reps):
        src, dst = (a, b) if rep % 2 == 0 else (b, a)
        rows["capture + instantiate"].append(_timed(be, lambda: eng.capture(dst))[0])
        us_c, d = _timed(be, lambda: eng.capture(dst, instantiate=False)[0])
        rows["capture only"].append(us_c)
        rows["instantiate only"].append(_timed(be, lambda: be.instantiate(d))[0])
        us_u, why = _timed(be, lambda: live.update(d))
        if why is not None:
            raise LabError(f"cudaGraphExecUpdate refused: {why}")
        rows["capture + update"].append(us_c + us_u)
        us, why = _timed(be, lambda: live.update(defs[src.key]))   # back, from a kept graph
        if why is not None:
            raise LabError(f"cudaGraphExecUpdate refused: {why}")
        rows["update only"].append(us)
    node_params_ok = None
    if ctx.backend == "cuda":
        every = range(len(launches[a.key]))
        go = _node_param_setter(live, defs[a.key], defs[b.key])
        back = _node_param_setter(live, defs[a.key], defs[a.key])
        for _ in range(reps):
            rows["node parameters (changed nodes)"].append(_timed(be, lambda: go(changed))[0])
            back(changed)
            rows["node parameters (all nodes)"].append(_timed(be, lambda: go(every))[0])
            back(every)
        node_params_ok = _same_step(eng, live, b, lambda: go(changed), defs[b.key])
    # the check: decoding with each switch mechanism gives the recapture tokens
    n = bounds[1] + 8
    tokens = {mode: DecodeEngine(model, LabConfig(backend=ctx.backend, plan_switch=mode))
              .generate(PROMPT, n).tokens for mode in ("recapture", "update")}
    identical = bool(np.array_equal(tokens["recapture"], tokens["update"]))
    out = {"what": "host cost of one plan change (splits 1 <-> 2), per mechanism",
           "source": be.describe(), "date": now(),
           "recorded_by": "decode-lab record plan_switch",
           "plans": [list(a.key), list(b.key)], "nodes": len(launches[a.key]),
           "changed_nodes": [launches[a.key][i].name for i in changed],
           "reps": reps, "tokens_identical_update_vs_recapture": identical,
           "node_params_step_identical_to_update": node_params_ok,
           "note": ("" if ctx.backend == "cuda" else "a smoke run: wall times of the CPU "
                    "simulator's own Python, not a model of the GPU"),
           "rows": {k: _summary(v) for k, v in rows.items() if v}}
    ctx.write_json("plan_switch.json", out)
    ctx.progress(f"plan change {a.key[1]} <-> {b.key[1]} splits, {out['nodes']} nodes, "
                 f"{len(changed)} differ ({', '.join(sorted(set(out['changed_nodes'])))})")
    for k, r in out["rows"].items():
        ctx.progress(f"  {k:<34} median {r['median_us']:>9.1f} us  "
                     f"(q1 {r['q1_us']:.1f}, q3 {r['q3_us']:.1f})")
    ctx.progress(f"  tokens with update == recapture: {identical}; a step after the "
                 f"node-parameter update == after cudaGraphExecUpdate: {node_params_ok}")
    if not identical:
        raise LabError("FAIL: the update mechanism's tokens differ from recapture's")
