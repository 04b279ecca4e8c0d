"""device_loop.json: the host loop (a graph replay per token) against the device loop (one
launch of a WHILE-over-SWITCH graph per generate), LAB_LOOP (notebook 11).

  AB           "plain" / "pdl" / "fused" / "fused+pdl": paired, interleaved A/B behind an A/A
               gate on one engine (lab/measure/bench.py); conformance predicts "plain"
  lengths      ms/token of both loops, without and with PDL, at each generation length
  first        a fresh engine's first generate against a second one, per loop
  bodies       node counts of the loop's bodies; launches per generate for each loop
"""
from __future__ import annotations

import time

from lab.config import LabConfig
from lab.measure.experiment import experiment

LOOPS = (("host loop", dict(loop="host")), ("device loop", dict(loop="device")))
DEVICE_LOOP = dict(loop="device")       # arm B of every A/B below; arm A is the host loop
AB = {"plain": {}, "pdl": dict(pdl=True), "fused": dict(fusion=True),
      "fused+pdl": dict(fusion=True, pdl=True)}
REPS, TOKENS, LENGTHS, FIRST_TOKENS = 5, 256, (16, 64, 256, 900), 256
QUICK = dict(reps=2, tokens=2, lengths=(2, 4), first_tokens=8)


def lengths_sweep(model, base: LabConfig, lengths, reps: int, progress) -> dict:
    """ms/token of host and device loop, plain and PDL, at each generation length: the four
    arms interleaved on one engine, the order reversed every other rep."""
    from lab.measure import bench
    from lab.measure.stats import mean_sem
    pool: dict = {}
    arms = [bench.make_arm(model, f"{name}{' +pdl' if pdl else ''}", base.replace(pdl=pdl, **kw),
                           i, pool=pool)
            for i, (pdl, (name, kw)) in enumerate((p, l) for p in (False, True) for l in LOOPS)]
    rows = {a.name: {} for a in arms}
    for n in lengths:
        for a in arms:
            a.clear()
        bench.interleave(arms, reps, bench.decode_run(bench.BENCH_PROMPT, n))
        same = all(not bench.outputs_differ(arms[0].runs, a.runs) for a in arms[1:])
        for a in arms:
            m, s = mean_sem(a.ms)
            rows[a.name][str(n)] = {"ms_per_token": list(a.ms), "mean_ms": m, "sem_ms": s}
        host, dev = rows["host loop"][str(n)], rows["device loop"][str(n)]
        progress(f"  {n:>4} tokens: host {host['mean_ms']:.4f} device {dev['mean_ms']:.4f} "
                 f"ms/token (device/host {dev['mean_ms'] / host['mean_ms']:.3f}); "
                 f"tokens identical across arms: {same}")
        rows.setdefault("tokens identical", {})[str(n)] = same
    return {"lengths": list(lengths), "reps": reps, "prompt": bench.BENCH_PROMPT,
            "order": "the four arms interleaved on one engine, reversed every other rep; "
                     "one untimed warm-up run per arm and length",
            "arms": rows}


def first_generate(model, base: LabConfig, n: int) -> dict:
    """Wall ms of the first and of a second generate of n tokens on a fresh engine, per loop."""
    from lab.engine.runner import DecodeEngine
    from lab.measure.arms import BENCH_PROMPT
    out = {}
    for name, kw in LOOPS:
        eng = DecodeEngine(model, base.replace(**kw))
        ids = eng.encode(BENCH_PROMPT)
        times, build_ms = [], None
        for _ in range(2):
            eng.reset(ids, n)
            t0 = time.perf_counter()
            eng.backend.clock()              # a clock read waits for issued work
            if name == "device loop" and build_ms is None:   # the loop graph, before its launch
                eng.device_loop()
                build_ms = 1000.0 * (time.perf_counter() - t0)
            eng.decode(ids.size - 1 + n)
            eng.backend.clock()
            times.append(1000.0 * (time.perf_counter() - t0))
        out[name] = {"first_ms": times[0], "steady_ms": times[1],
                     "one_time_ms": times[0] - times[1], "build_ms": build_ms,
                     "graphs": len(eng.graphs), "ledger": eng.ledger_summary()}
    return out


@experiment("device_loop", files=("device_loop.json",), priority=130,
            doc="host loop vs device loop (LAB_LOOP): A/B, lengths, first generate (notebook 11)")
def record(ctx) -> None:
    from lab.engine.runner import DecodeEngine
    from lab.measure import bench, report
    p = QUICK if ctx.quick else dict(reps=REPS, tokens=TOKENS, lengths=LENGTHS,
                                     first_tokens=FIRST_TOKENS)
    model, base = ctx.model, LabConfig(backend=ctx.backend)
    out = {"what": "host loop (a graph launch per token) vs device loop (one launch per "
                   "generate: WHILE over SWITCH of every plan's step)"}
    for name, kw in AB.items():
        cfg = base.replace(**kw)
        res = bench.run_ab(model, cfg, cfg.replace(**DEVICE_LOOP), reps=p["reps"],
                           tokens=p["tokens"], names=("host loop", "device loop"),
                           progress=None, per_token=0)
        out[name] = res
        ctx.progress(f"== {name} ==\n{report.format_ab(res)}")
    ctx.progress(f"lengths {list(p['lengths'])}, {p['reps']} reps")
    out["lengths"] = lengths_sweep(model, base, p["lengths"], p["reps"], ctx.progress)
    ctx.progress(f"first generate of {p['first_tokens']} tokens on a fresh engine")
    out["first"] = {"tokens": p["first_tokens"], "prompt": bench.BENCH_PROMPT,
                    "what": "wall ms of a fresh engine's first generate (captures, "
                            "instantiation, then the steps) and of a second one",
                    "loops": first_generate(model, base, p["first_tokens"])}
    for name, row in out["first"]["loops"].items():
        ctx.progress(f"  {name}: first {row['first_ms']:.1f} ms, steady {row['steady_ms']:.1f} "
                     f"ms, one-time {row['one_time_ms']:.1f} ms ({row['graphs']} graphs)")
    eng = DecodeEngine(model, base.replace(**DEVICE_LOOP))
    gen = eng.generate(bench.BENCH_PROMPT, p["tokens"])
    out["warnings"] = eng.warnings
    out["launches"] = {"host loop": gen.steps,
                       "device loop": sum(r.kind == "replay" for r in eng.log.records)}
    loop = eng.device_loop()
    out["bodies"] = loop.body_node_counts() if loop is not None else []
    out["source"], out["date"] = out["plain"]["source"], out["plain"]["date"]
    out["recorded_by"] = "decode-lab record device_loop"
    ctx.write_json("device_loop.json", out)
    ctx.progress(f"launches per generate: {out['launches']}; bodies: {out['bodies']}; "
                 f"warnings: {out['warnings'] or 'none'}")
