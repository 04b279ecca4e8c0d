"""Record the host loop against the device loop (LAB_LOOP), as JSON with source and date:
graph replays launched by the host, one per token, against ONE launch of a WHILE-over-SWITCH
graph for the whole generation; without and with PDL. Paired, interleaved A/B behind an A/A
gate on one shared engine (lab/bench.py), at the notebooks' prompt.

  python scripts/record_gpu_device_loop.py --out DIR [--backend cuda] [--reps 5] [--tokens 200]

Writes DIR/device_loop.json: {"plain": A/B result, "pdl": A/B result, "bodies": node counts,
"launches": host launches per generate for each loop}.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lab import bench, report  # noqa: E402
from lab.config import LabConfig  # noqa: E402
from lab.engine import DecodeEngine  # noqa: E402
from lab.model import DEFAULT_WEIGHTS, load_model  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--backend", default="cuda", choices=("cuda", "sim"))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=200)
    args = ap.parse_args()
    model = load_model(DEFAULT_WEIGHTS)
    base = LabConfig(backend=args.backend)
    out = {"what": "host loop (a graph launch per token) vs device loop (one launch per "
                   "generate: WHILE over SWITCH of every plan's step)"}
    for name, cfg in (("plain", base), ("pdl", base.replace(pdl=True))):
        res = bench.run_ab(model, cfg, cfg.replace(loop="device"), reps=args.reps,
                           tokens=args.tokens, names=("host loop", "device loop"), progress=None,
                           per_token=0)
        out[name] = res
        print(f"== {name} ==\n{report.format_ab(report.narrow(res))}", flush=True)
    eng = DecodeEngine(model, base.replace(loop="device"))
    gen = eng.generate("ROMEO.\n", args.tokens)
    out["warnings"] = eng.warnings
    out["launches"] = {"host loop": gen.steps,
                       "device loop": sum(r.kind == "replay" for r in eng.log.records)}
    loop = eng.device_loop()
    out["bodies"] = loop.body_node_counts() if loop is not None else []
    out["source"], out["date"] = out["plain"]["source"], out["plain"]["date"]
    out["recorded_by"] = "scripts/record_gpu_device_loop.py"
    path = Path(args.out) / "device_loop.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2, default=report.jsonable))
    print(f"launches per generate: {out['launches']}; bodies: {out['bodies']}; "
          f"warnings: {out['warnings'] or 'none'}\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
