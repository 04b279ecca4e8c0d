"""Record the GPU figures the README and notebooks quote, as JSON with GPU, versions and date.

  python scripts/record_gpu.py --out DIR [--reps 5] [--tokens 128]

Writes DIR/decode_eager_vs_graph.json: interleaved paired eager vs graph ms/token at short
context, launches/token, nodes/graph, the per-launch budget of each arm, and a greedy sample.
(The launch-mechanism ladder is recorded by record_gpu_costs.py, beside the host costs.)
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lab.bench import run_ab  # noqa: E402
from lab.report import format_ab  # noqa: E402
from lab.config import LabConfig  # noqa: E402
from lab.engine import DecodeEngine  # noqa: E402
from lab.model import load_model  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=128)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = load_model()
    cfg = LabConfig(backend="cuda")
    res = run_ab(model, cfg.replace(graph=False), cfg.replace(graph=True), reps=args.reps,
                 tokens=args.tokens, names=("eager", "graph"))
    for arm in res["arms"]:
        arm["us_per_launch"] = 1000.0 * arm["mean_ms"] / arm["launches_per_token"]
    eng = DecodeEngine(model, cfg)
    gen = eng.generate("ROMEO.\n", 200)
    res.update({"date": dt.date.today().isoformat(), "what": "eager vs graph decode, short context",
                "sample": gen.prompt + gen.text, "ledger": eng.ledger_summary()})
    (out / "decode_eager_vs_graph.json").write_text(json.dumps(res, indent=2))
    print(format_ab(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
