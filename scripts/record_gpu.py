"""Record the GPU figures the README and notebooks quote, as JSON with GPU, versions and date.

  python scripts/record_gpu.py --out DIR [--reps 5] [--tokens 128]

Writes DIR/decode_eager_vs_graph.json: interleaved paired eager vs graph ms/token at short
context, launches/token, nodes/graph, the per-launch budget of each arm, and a greedy sample.
(The launch-mechanism ladder is recorded by record_gpu_costs.py, beside the host costs.)
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lab.config import LabConfig  # noqa: E402
from lab.engine.runner import DecodeEngine  # noqa: E402
from lab.measure.bench import run_ab  # noqa: E402
from lab.measure.report import format_ab  # noqa: E402
from scripts import recorder  # noqa: E402


def main(argv=None) -> int:
    args = recorder.arguments(__doc__, reps=5, tokens=128).parse_args(argv)
    out = recorder.out_dir(args.out)
    model = recorder.load(args)
    cfg = LabConfig(backend="cuda")
    res = run_ab(model, cfg.replace(graph=False), cfg.replace(graph=True), reps=args.reps,
                 tokens=args.tokens, names=("eager", "graph"))
    for arm in res["arms"]:
        arm["us_per_launch"] = 1000.0 * arm["mean_ms"] / arm["launches_per_token"]
    eng = DecodeEngine(model, cfg)
    gen = eng.generate("ROMEO.\n", 200)
    res.update({"date": recorder.today(), "what": "eager vs graph decode, short context",
                "sample": gen.prompt + gen.text, "ledger": eng.ledger_summary()})
    recorder.write_json(out / "decode_eager_vs_graph.json", res)
    print(format_ab(res))
    return 0


if __name__ == "__main__":
    sys.exit(recorder.run(main))
