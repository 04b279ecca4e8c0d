"""Record what a plan change costs on the host, three ways (LAB_PLAN_SWITCH), per plan change:

  capture + instantiate   what LAB_PLAN_SWITCH=recapture does: the step's 37 launches captured,
                          the graph instantiated and uploaded
  capture + update        what LAB_PLAN_SWITCH=update does: the step captured (not instantiated),
                          then cudaGraphExecUpdate of the live executable graph
  update only             the update alone, from a captured graph kept per plan (a switch back
                          to a plan met before: what the engine does the second time)
  node parameters         cudaGraphExecKernelNodeSetParams for the kernel nodes whose launch
                          differs between the two plans (and for all of them), given the new
                          parameters: the floor of an in-place switch, with no capture at all

Each is timed with a device synchronize before and after (so queued work is not counted) over
--reps switches between the first two plans, alternating direction; medians and quartiles in
microseconds. A check decodes with each mechanism and compares tokens with recapture. Written to
DIR/plan_switch.json.

  python scripts/record_gpu_plan_switch.py --out DIR [--reps 30] [--backend cuda|sim]
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lab.config import LabConfig  # noqa: E402
from lab.engine.runner import DecodeEngine  # noqa: E402
from lab.plan import plan_boundaries  # noqa: E402
from scripts import recorder  # noqa: E402

PROMPT = "ROMEO.\n"


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


def _node_param_setter(live, source_from, source_to):
    """A function that sets, on `live` (instantiated from `source_from`), the kernel-node
    parameters of `source_to` for the nodes whose launch differs (or all): cuda only. Through
    the driver API: numba's kernels are driver functions, which the runtime's
    cudaGraphKernelNodeGetParams refuses (cudaErrorInvalidDeviceFunction)."""
    from cuda.bindings import driver as cu
    from cuda.bindings import runtime as cudart

    from lab.backend.cuda import _check

    def nodes(src):
        n = _check(cudart.cudaGraphGetNodes(src.handle, 0))[1]
        return [cu.CUgraphNode(init_value=int(x))
                for x in _check(cudart.cudaGraphGetNodes(src.handle, n))[0]]

    old, new = nodes(source_from), nodes(source_to)
    params = [_check(cu.cuGraphKernelNodeGetParams(n)) for n in new]
    exec_ = cu.CUgraphExec(init_value=int(live.graph.graphExec))

    def set_params(indices):
        for i in indices:
            _check(cu.cuGraphExecKernelNodeSetParams(exec_, old[i], params[i]))
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


def main(argv=None) -> int:
    args = recorder.arguments(__doc__, backends=("cuda", "sim"), reps=30).parse_args(argv)
    path = recorder.out_dir(args.out) / "plan_switch.json"
    model = recorder.load(args)
    eng = DecodeEngine(model, LabConfig(backend=args.backend, plan_switch="update"))
    be = eng.backend
    eng.generate(PROMPT, plan_boundaries(model.cfg.max_seq)[0] + 8)    # warm: two plans met
    a, b = eng.plan(0), eng.plan(plan_boundaries(model.cfg.max_seq)[0])
    launches = {p.key: eng.step_launches(p) for p in (a, b)}
    changed = [i for i, (x, y) in enumerate(zip(launches[a.key], launches[b.key])) if x != y]
    defs = {p.key: eng.capture(p, instantiate=False)[0] for p in (a, b)}
    live = be.instantiate(defs[a.key])
    rows = {"capture + instantiate": [], "capture only": [], "instantiate only": [],
            "capture + update": [], "update only": [],
            "node parameters (changed nodes)": [], "node parameters (all nodes)": []}
    for rep in range(args.reps):
        src, dst = (a, b) if rep % 2 == 0 else (b, a)
        rows["capture + instantiate"].append(_timed(be, lambda: eng.capture(dst))[0])
        us_c, d = _timed(be, lambda: eng.capture(dst, instantiate=False)[0])
        rows["capture only"].append(us_c)
        rows["instantiate only"].append(_timed(be, lambda: be.instantiate(d))[0])
        us_u, why = _timed(be, lambda: live.update(d))
        assert why is None, why
        rows["capture + update"].append(us_c + us_u)
        us, why = _timed(be, lambda: live.update(defs[src.key]))   # back, from a kept graph
        assert why is None, why
        rows["update only"].append(us)
    if args.backend == "cuda":
        go = _node_param_setter(live, defs[a.key], defs[b.key])
        back = _node_param_setter(live, defs[a.key], defs[a.key])
        for _ in range(args.reps):
            rows["node parameters (changed nodes)"].append(_timed(be, lambda: go(changed))[0])
            back(changed)
            rows["node parameters (all nodes)"].append(
                _timed(be, lambda: go(range(len(launches[a.key]))))[0])
            back(range(len(launches[a.key])))
        node_params_ok = _same_step(eng, live, b, lambda: go(changed), defs[b.key])
    else:
        node_params_ok = None
    # the check: decoding with each switch mechanism gives the recapture tokens
    n = plan_boundaries(model.cfg.max_seq)[1] + 8
    tokens = {mode: DecodeEngine(model, LabConfig(backend=args.backend, plan_switch=mode))
              .generate(PROMPT, n).tokens for mode in ("recapture", "update")}
    identical = bool(np.array_equal(tokens["recapture"], tokens["update"]))
    out = {"what": "host cost of one plan change (splits 1 <-> 2), per mechanism",
           "source": be.describe(), "date": recorder.now(),
           "recorded_by": "scripts/record_gpu_plan_switch.py",
           "plans": [list(a.key), list(b.key)], "nodes": len(launches[a.key]),
           "changed_nodes": [launches[a.key][i].name for i in changed],
           "reps": args.reps, "tokens_identical_update_vs_recapture": identical,
           "node_params_step_identical_to_update": node_params_ok,
           "note": ("" if args.backend == "cuda" else "a smoke run: wall times of the CPU "
                    "simulator's own Python, not a model of the GPU"),
           "rows": {k: _summary(v) for k, v in rows.items() if v}}
    recorder.write_json(path, out)
    print(f"plan change {a.key[1]} <-> {b.key[1]} splits, {out['nodes']} nodes, "
          f"{len(changed)} differ ({', '.join(sorted(set(out['changed_nodes'])))}); {out['source']}")
    for k, r in out["rows"].items():
        print(f"  {k:<34} median {r['median_us']:>9.1f} us  (q1 {r['q1_us']:.1f}, q3 {r['q3_us']:.1f})")
    print(f"  tokens with update == recapture: {identical}; a step after the node-parameter "
          f"update == after cudaGraphExecUpdate: {node_params_ok}")
    print(f"wrote {path}")
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(recorder.run(main))
