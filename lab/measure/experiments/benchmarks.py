"""bench_ab.json, bench_sweep.json, bench_loo.json (+ a .png each): notebook 05's figures.

  bench_ab     eager vs graph: A/A gate on eager, paired interleaved A/B, standard errors and
               their ratio, per-token p50/p99
  bench_sweep  eager and graph ms/token and tok/s at CONTEXTS (seek)
  bench_loo    leave-one-out over GRAPH,SPLIT_COMBINE with the plain-baseline check
"""
from __future__ import annotations

from lab.config import LabConfig
from lab.measure import bench, report
from lab.measure.experiment import experiment

CONTEXTS = (64, 256, 512, 1000)
FILES = ("bench_ab.json", "bench_sweep.json", "bench_loo.json")


def _write(ctx, name: str, result: dict, table: str) -> None:
    ctx.write_json(f"{name}.json", result)
    report.save(result, plot_path=ctx.out / f"{name}.png")
    print(f"\n== {name} ==\n{table}", flush=True)


@experiment("bench", FILES + tuple(f.replace(".json", ".png") for f in FILES), priority=50)
def bench_figures(ctx) -> None:
    """Notebook 05's measurement figures: eager vs graph behind the A/A gate, the context sweep,
    leave-one-out over GRAPH and SPLIT_COMBINE."""
    reps, tokens, per_token, sweep_tokens = (2, 8, 20, 4) if ctx.quick else (5, 128, 1000, 16)
    cfg = LabConfig(backend=ctx.backend)
    eager, graph = cfg.replace(graph=False), cfg.replace(graph=True)
    ab = bench.run_ab(ctx.model, eager, graph, reps=reps, tokens=tokens, per_token=per_token,
                      names=("eager", "graph"))
    for arm in ab["arms"]:
        arm["us_per_launch"] = 1000.0 * arm["mean_ms"] / arm["launches_per_token"]
    ab["sem_ratio_eager_over_graph"] = ab["sem_ratio_a_over_b"]
    _write(ctx, "bench_ab", ab, report.format_ab(ab))
    sweep = bench.run_sweep(ctx.model, {"eager": eager, "graph": graph},
                            CONTEXTS[:2] if ctx.quick else CONTEXTS, reps=reps, tokens=sweep_tokens)
    _write(ctx, "bench_sweep", sweep, report.format_sweep(sweep))
    loo = bench.run_loo(ctx.model, "GRAPH,SPLIT_COMBINE", base=cfg, reps=reps,
                        tokens=8 if ctx.quick else 64)
    _write(ctx, "bench_loo", loo, report.format_loo(loo))
