"""Record the PDL / overlap figures of notebooks 06 and 07, as JSON with source and date.
(fission.json is recorded by record_gpu_costs.py, in the process whose host costs it measured.)

  python scripts/record_gpu_overlap.py --out DIR [--backend cuda] [--reps 5]

Writes:
  DIR/overlap_loo.json  leave-one-out over GRAPH,PDL,OVERLAP,SPLIT_COMBINE (all-on, all-off,
                        each-off; paired interleaved reps; standard errors; baseline check)
  DIR/pdl.json          graph vs graph + PDL (paired A/B) and the captured graph's edge types
  DIR/overlap.json      graph vs graph + OVERLAP (paired A/B)
  DIR/pdl_sweep.json    graph and graph + PDL interleaved at contexts 64 and 900 (seek: timing
                        only): PDL's gain at a short and a long context, which conformance holds
                        the simulator to
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lab.config import LabConfig  # noqa: E402
from lab.engine.runner import DecodeEngine  # noqa: E402
from lab.measure import bench, report  # noqa: E402
from scripts import recorder  # noqa: E402

PDL_CONTEXTS = (64, 900)     # PDL's gain at a short and a long context (pdl_sweep.json)


def main(argv=None) -> int:
    args = recorder.arguments(__doc__, backends=recorder.BACKENDS, weights=True, reps=5,
                              tokens=64).parse_args(argv)
    out = recorder.out_dir(args.out)
    model = recorder.load(args)
    cfg = LabConfig(backend=args.backend)
    t0 = time.perf_counter()

    loo = bench.run_loo(model, "GRAPH,PDL,OVERLAP,SPLIT_COMBINE", base=cfg, reps=args.reps,
                        tokens=args.tokens, progress=None)
    recorder.record(out, "overlap_loo", loo, report.format_loo(loo))

    pdl = bench.run_ab(model, cfg, cfg.replace(pdl=True), reps=args.reps, tokens=args.tokens,
                       names=("graph", "graph+pdl"), progress=None, per_token=200)
    eng = DecodeEngine(model, cfg.replace(pdl=True))
    eng.generate("ROMEO.\n", 4)
    graph = next(iter(eng.graphs.values()))
    edges = graph.edge_types() if hasattr(graph, "edge_types") else {}
    ms_graph = pdl["arms"][0]["mean_ms"]
    pdl.update(edge_types=edges, nodes=graph.node_count,
               pdl_worth_fraction=(ms_graph - pdl["arms"][1]["mean_ms"]) / ms_graph)
    recorder.record(out, "pdl", pdl, report.format_ab(pdl) + f"\nedges {edges}; PDL worth "
                    f"{100 * pdl['pdl_worth_fraction']:.1f}% of the graph arm")
    sweep = bench.run_sweep(model, {"graph": cfg, "graph+pdl": cfg.replace(pdl=True)},
                            PDL_CONTEXTS, reps=args.reps, tokens=16, progress=None)
    recorder.record(out, "pdl_sweep", sweep, report.format_sweep(sweep))
    overlap = bench.run_ab(model, cfg, cfg.replace(overlap=True), reps=args.reps,
                           tokens=args.tokens, names=("graph", "graph+overlap"), progress=None,
                           per_token=200)
    recorder.record(out, "overlap", overlap, report.format_ab(overlap))
    print(f"\nrecorded in {out} in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(recorder.run(main))
