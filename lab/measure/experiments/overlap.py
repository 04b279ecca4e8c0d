"""overlap_loo.json, pdl.json, pdl_sweep.json, overlap.json: PDL and overlap (notebooks 06, 07).

  overlap_loo   leave-one-out over GRAPH,PDL,OVERLAP,SPLIT_COMBINE (baseline checked)
  pdl           graph vs graph + PDL (paired A/B) and the captured graph's edge types
  pdl_sweep     graph and graph + PDL interleaved at contexts PDL_CONTEXTS (seek: timing only)
  overlap       graph vs graph + OVERLAP (paired A/B): arms.OVERLAP, which conformance predicts
"""
from __future__ import annotations

from lab import DecodeEngine
from lab.config import LabConfig
from lab.measure import bench, report
from lab.measure.arms import OVERLAP
from lab.measure.experiment import experiment

PDL_CONTEXTS = (64, 900)     # PDL's gain at a short and a long context


@experiment("overlap", ("overlap_loo.json", "pdl.json", "pdl_sweep.json", "overlap.json"),
            priority=40)
def overlap(ctx) -> None:
    """PDL and overlap: leave-one-out over four factors, PDL's A/B with the graph's edge types,
    PDL at a short and a long context, overlap's A/B (notebooks 06 and 07)."""
    reps, tokens, per_token = (2, 8, 0) if ctx.quick else (5, 64, 200)
    cfg = LabConfig(backend=ctx.backend)
    loo = bench.run_loo(ctx.model, "GRAPH,PDL,OVERLAP,SPLIT_COMBINE", base=cfg, reps=reps,
                        tokens=tokens)
    ctx.write_json("overlap_loo.json", loo)
    print(report.format_loo(loo))

    pdl = bench.run_ab(ctx.model, cfg, cfg.replace(pdl=True), reps=reps, tokens=tokens,
                       names=("graph", "graph+pdl"), per_token=per_token)
    eng = DecodeEngine(ctx.model, cfg.replace(pdl=True))
    eng.generate("ROMEO.\n", 4)
    graph = next(iter(eng.graphs.values()))
    edges = graph.edge_types() if hasattr(graph, "edge_types") else {}
    ms_graph = pdl["arms"][0]["mean_ms"]
    pdl.update(edge_types=edges, nodes=graph.node_count,
               pdl_worth_fraction=(ms_graph - pdl["arms"][1]["mean_ms"]) / ms_graph)
    ctx.write_json("pdl.json", pdl)
    print(report.format_ab(pdl) + f"\nedges {edges}; PDL worth "
          f"{100 * pdl['pdl_worth_fraction']:.1f}% of the graph arm")

    sweep = bench.run_sweep(ctx.model, {"graph": cfg, "graph+pdl": cfg.replace(pdl=True)},
                            PDL_CONTEXTS, reps=reps, tokens=4 if ctx.quick else 16)
    ctx.write_json("pdl_sweep.json", sweep)
    print(report.format_sweep(sweep))

    a, b = OVERLAP.configs(cfg)
    res = bench.run_ab(ctx.model, a, b, reps=reps, tokens=tokens, names=OVERLAP.names,
                       per_token=per_token)
    ctx.write_json(OVERLAP.file, res)
    print(report.format_ab(res))
