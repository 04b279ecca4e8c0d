"""Record how much identical engine INSTANCES differ: several graph engines with the same
config, run interleaved (rotating order), each one's ms/token with its standard error; and one
engine run twice in a row. Written to DIR/engine_instances.json.

  python scripts/record_gpu_instances.py --out DIR [--engines 4] [--reps 10] [--tokens 64]

Why: an A/B between two engines mixes the toggle's effect with whatever separates the two
instances (their buffers sit at different addresses). lab/measure/bench.py therefore runs arms that
differ only in launch toggles on ONE shared engine; this file is the measurement behind that.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lab.config import LabConfig  # noqa: E402
from lab.engine.runner import DecodeEngine  # noqa: E402
from lab.measure.stats import mean_sem  # noqa: E402
from scripts import recorder  # noqa: E402

PROMPT = "ROMEO.\n"


def main(argv=None) -> int:
    ap = recorder.arguments(__doc__, backends=("cuda", "sim"), reps=10, tokens=64)
    ap.add_argument("--engines", type=int, default=4)
    args = ap.parse_args(argv)
    out = recorder.out_dir(args.out)
    model = recorder.load(args)
    engines = [DecodeEngine(model, LabConfig(backend=args.backend)) for _ in range(args.engines)]
    for eng in engines:
        eng.generate(PROMPT, args.tokens)                       # warm-up: capture every plan

    def us_per_token(eng) -> float:
        return 1000.0 * eng.generate(PROMPT, args.tokens).ms_per_token

    per = {i: [] for i in range(args.engines)}
    for rep in range(args.reps):                                # rotate the order every rep
        for i in recorder.rotated(range(args.engines), rep):
            per[i].append(us_per_token(engines[i]))
    rows = []
    for i, v in per.items():
        m, s = mean_sem(v)
        b = engines[i].buf
        rows.append({"engine": i, "us_per_token": v, "mean_us": m, "sem_us": s,
                     "x_ptr": hex(b.x.ptr), "k_cache0_ptr": hex(b.k_cache[0].ptr)})
        print(f"engine {i}: {m:.2f} ± {s:.2f} us/token  (x at {hex(b.x.ptr)})")
    twice = ([], [])
    for _ in range(args.reps):
        twice[0].append(us_per_token(engines[0]))
        twice[1].append(us_per_token(engines[0]))
    m0, s0 = mean_sem(twice[0])
    m1, s1 = mean_sem(twice[1])
    print(f"engine 0 run twice in a row: {m0:.2f} ± {s0:.2f} then {m1:.2f} ± {s1:.2f} us/token")
    means = [r["mean_us"] for r in rows]
    recorder.write_json(out / "engine_instances.json", {
        "what": "identical graph engines, interleaved: per-instance ms/token",
        "source": engines[0].backend.describe(), "date": recorder.today(),
        "reps": args.reps, "tokens": args.tokens, "engines": rows,
        "spread_us": max(means) - min(means),
        "same_engine_twice": {"first_mean_us": m0, "first_sem_us": s0,
                              "second_mean_us": m1, "second_sem_us": s1}})
    print(f"spread between instances: {max(means) - min(means):.2f} us/token")
    return 0


if __name__ == "__main__":
    sys.exit(recorder.run(main))
