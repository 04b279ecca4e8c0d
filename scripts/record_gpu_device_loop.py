"""Record the host loop against the device loop (LAB_LOOP), as JSON with source and date:
graph replays launched by the host, one per token, against ONE launch of a WHILE-over-SWITCH
graph for the whole generation; without and with PDL, unfused and fused (LAB_FUSION).

  python scripts/record_gpu_device_loop.py --out DIR [--backend cuda] [--reps 5] [--tokens 256]
                                           [--lengths 16,64,256,900]

Three measurements, all at the notebooks' prompt:
- "plain" / "pdl" / "fused" / "fused+pdl": paired, interleaved A/B behind an A/A gate on one
  shared engine (lab/measure/bench.py) at --tokens generated tokens;
- "lengths": ms/token of both loops (with and without PDL) at each generation length, the four
  arms interleaved on one engine per rep (the order reversed every other rep), so the loops'
  difference can be read against the length (the device loop's one launch is amortised over
  more tokens; its per-iteration machinery is not);
- "first": what the FIRST generate costs on a fresh engine (kernels already compiled in the
  process): the host loop captures and instantiates each plan's graph as the position reaches
  it, the device loop captures every plan's body and instantiates the loop graph before its one
  launch. Each is timed end to end against a second, steady generate of the same length.

Writes DIR/device_loop.json: {"plain", "pdl", "fused", "fused+pdl": A/B results,
"lengths": {...}, "first": {...}, "bodies": node counts, "launches": host launches per generate
for each loop}.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lab.config import LabConfig  # noqa: E402
from lab.engine.runner import DecodeEngine  # noqa: E402
from lab.errors import LabError  # noqa: E402
from lab.measure import bench, report  # noqa: E402
from lab.measure.stats import mean_sem  # noqa: E402
from scripts import recorder  # noqa: E402

LOOPS = (("host loop", dict(loop="host")), ("device loop", dict(loop="device")))


def parse_lengths(text: str, max_new: int) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise LabError(f"--lengths must be comma-separated integers, got {text!r}") from None
    bad = [n for n in vals if not 1 <= n <= max_new]
    if not vals or bad:
        raise LabError(f"--lengths {text!r}: each length must be in [1, {max_new}] (max_seq "
                       f"minus the prompt)")
    return vals


def lengths_sweep(model, base: LabConfig, lengths, reps: int, progress) -> dict:
    """ms/token of host and device loop, plain and PDL, at each generation length."""
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
    out = {}
    for name, kw in LOOPS:
        eng = DecodeEngine(model, base.replace(**kw))
        ids = eng.encode(bench.BENCH_PROMPT)
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


def main(argv=None) -> int:
    ap = recorder.arguments(__doc__, backends=("cuda", "sim"), reps=5, tokens=256)
    ap.add_argument("--lengths", default="16,64,256,900")
    ap.add_argument("--first-tokens", type=int, default=256)
    args = ap.parse_args(argv)
    model = recorder.load(args)
    max_new = model.cfg.max_seq - len(bench.BENCH_PROMPT)
    lengths = parse_lengths(args.lengths, max_new)
    path = recorder.out_dir(args.out) / "device_loop.json"
    base = LabConfig(backend=args.backend)
    progress = recorder.stopwatch()

    out = {"what": "host loop (a graph launch per token) vs device loop (one launch per "
                   "generate: WHILE over SWITCH of every plan's step)"}
    for name, cfg in (("plain", base), ("pdl", base.replace(pdl=True)),
                      ("fused", base.replace(fusion=True)),
                      ("fused+pdl", base.replace(fusion=True, pdl=True))):
        res = bench.run_ab(model, cfg, cfg.replace(loop="device"), reps=args.reps,
                           tokens=args.tokens, names=("host loop", "device loop"), progress=None,
                           per_token=0)
        out[name] = res
        print(f"== {name} ==\n{report.format_ab(res)}", flush=True)
    progress(f"lengths {lengths}, {args.reps} reps")
    out["lengths"] = lengths_sweep(model, base, lengths, args.reps, progress)
    progress(f"first generate of {args.first_tokens} tokens on a fresh engine")
    out["first"] = {"tokens": args.first_tokens, "prompt": bench.BENCH_PROMPT,
                    "what": "wall ms of a fresh engine's first generate (captures, "
                            "instantiation, then the steps) and of a second one",
                    "loops": first_generate(model, base, args.first_tokens)}
    for name, row in out["first"]["loops"].items():
        progress(f"  {name}: first {row['first_ms']:.1f} ms, steady {row['steady_ms']:.1f} ms, "
                 f"one-time {row['one_time_ms']:.1f} ms ({row['graphs']} graphs)")
    eng = DecodeEngine(model, base.replace(loop="device"))
    gen = eng.generate(bench.BENCH_PROMPT, args.tokens)
    out["warnings"] = eng.warnings
    out["launches"] = {"host loop": gen.steps,
                       "device loop": sum(r.kind == "replay" for r in eng.log.records)}
    loop = eng.device_loop()
    out["bodies"] = loop.body_node_counts() if loop is not None else []
    out["source"], out["date"] = out["plain"]["source"], out["plain"]["date"]
    out["recorded_by"] = "scripts/record_gpu_device_loop.py"
    recorder.write_json(path, out)
    print(f"launches per generate: {out['launches']}; bodies: {out['bodies']}; "
          f"warnings: {out['warnings'] or 'none'}\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(recorder.run(main))
