"""decode_eager_vs_graph.json: eager against graph decode at short context (notebooks 01, 02)."""
from __future__ import annotations

from lab.config import LabConfig
from lab.measure.bench import run_ab
from lab.measure.experiment import experiment, today
from lab.measure.report import format_ab


@experiment("decode", ("decode_eager_vs_graph.json",), priority=20)
def decode(ctx) -> None:
    """Eager vs graph, paired and interleaved at short context: ms/token, launches, nodes, us
    per launch, and a greedy sample (notebooks 01 and 02)."""
    reps, tokens, sample = (2, 8, 8) if ctx.quick else (5, 128, 200)
    cfg = LabConfig(backend=ctx.backend)
    res = run_ab(ctx.model, cfg.replace(graph=False), cfg.replace(graph=True), reps=reps,
                 tokens=tokens, names=("eager", "graph"))
    for arm in res["arms"]:
        arm["us_per_launch"] = 1000.0 * arm["mean_ms"] / arm["launches_per_token"]
    eng = ctx.engine(cfg)
    gen = eng.generate("ROMEO.\n", sample)
    res.update({"date": today(), "what": "eager vs graph decode, short context",
                "sample": gen.prompt + gen.text, "ledger": eng.ledger_summary()})
    ctx.write_json("decode_eager_vs_graph.json", res)
    print(format_ab(res))
