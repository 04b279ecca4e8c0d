"""Record the measurement figures of notebook 05 on a GPU, as JSON with source and date.

  python scripts/record_gpu_bench.py --out DIR [--backend cuda] [--reps 5]

Writes, each with `source` (backend.describe(): GPU, versions) and `date`:
  DIR/bench_ab.json     eager vs graph: A/A gate on eager, paired interleaved A/B over --reps reps,
                        both arms' standard errors and their ratio, per-token p50/p99
  DIR/bench_sweep.json  eager and graph ms/token and tok/s at contexts 64,256,512,1000 (seek)
  DIR/bench_loo.json    leave-one-out over GRAPH,SPLIT_COMBINE with the plain-baseline check
and a .png beside each; prints the tables. About a minute on an H200 (eager ~2.4 ms/token).
`--backend sim --weights W` runs the same thing on the simulator (a dry run).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lab.config import LabConfig  # noqa: E402
from lab.measure import bench, report  # noqa: E402
from scripts import recorder  # noqa: E402


def main(argv=None) -> int:
    ap = recorder.arguments(__doc__, backends=recorder.BACKENDS, weights=True, reps=5, tokens=128)
    ap.add_argument("--per-token", type=int, default=1000)
    ap.add_argument("--contexts", default="64,256,512,1000")
    ap.add_argument("--sweep-tokens", type=int, default=16)
    args = ap.parse_args(argv)
    contexts = bench.parse_contexts(args.contexts)          # bad input: refused before the run
    out = recorder.out_dir(args.out)
    model = recorder.load(args)
    cfg = LabConfig(backend=args.backend)
    eager, graph = cfg.replace(graph=False), cfg.replace(graph=True)

    t0 = time.perf_counter()
    ab = bench.run_ab(model, eager, graph, reps=args.reps, tokens=args.tokens,
                      per_token=args.per_token, names=("eager", "graph"), progress=None)
    for arm in ab["arms"]:
        arm["us_per_launch"] = 1000.0 * arm["mean_ms"] / arm["launches_per_token"]
    ab["sem_ratio_eager_over_graph"] = ab["sem_ratio_a_over_b"]
    recorder.record(out, "bench_ab", ab, report.format_ab(ab), plot=True)
    sweep = bench.run_sweep(model, {"eager": eager, "graph": graph},
                            contexts, reps=args.reps,
                            tokens=args.sweep_tokens, progress=None)
    recorder.record(out, "bench_sweep", sweep, report.format_sweep(sweep), plot=True)
    loo = bench.run_loo(model, "GRAPH,SPLIT_COMBINE", base=cfg, reps=args.reps, tokens=64,
                        progress=None)
    recorder.record(out, "bench_loo", loo, report.format_loo(loo), plot=True)
    print(f"\nrecorded in {out} in {time.perf_counter() - t0:.0f} s; source: {ab['source']}")
    return 0


if __name__ == "__main__":
    sys.exit(recorder.run(main))
