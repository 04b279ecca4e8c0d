"""engine_instances.json: how much identical graph engines differ (notebook 05).

An A/B between two engines mixes the toggle's effect with whatever separates the instances
(their buffers sit at different addresses): lab/measure/bench.py therefore runs arms that differ
only in launch toggles on ONE engine; this file is the measurement behind that rule.
"""
from __future__ import annotations

from lab.config import LabConfig
from lab import DecodeEngine
from lab.measure.experiment import experiment, today
from lab.measure.stats import mean_sem, rotated

PROMPT = "ROMEO.\n"


@experiment("instances", ("engine_instances.json",), priority=60)
def instances(ctx) -> None:
    """Several graph engines of one config, interleaved in rotating order, each one's us/token
    with its standard error; and one engine run twice in a row (notebook 05)."""
    n, reps, tokens = (2, 2, 8) if ctx.quick else (4, 10, 64)
    engines = [DecodeEngine(ctx.model, LabConfig(backend=ctx.backend)) for _ in range(n)]
    for eng in engines:
        eng.generate(PROMPT, tokens)                             # warm-up: capture every plan

    def us_per_token(eng) -> float:
        return 1000.0 * eng.generate(PROMPT, tokens).ms_per_token

    per = {i: [] for i in range(n)}
    for rep in range(reps):                                      # rotate the order every rep
        for i in rotated(range(n), rep):
            per[i].append(us_per_token(engines[i]))
    rows = []
    for i, v in per.items():
        m, s = mean_sem(v)
        b = engines[i].buf
        rows.append({"engine": i, "us_per_token": v, "mean_us": m, "sem_us": s,
                     "x_ptr": hex(b.x.ptr), "k_cache0_ptr": hex(b.k_cache[0].ptr)})
        print(f"engine {i}: {m:.2f} ± {s:.2f} us/token  (x at {hex(b.x.ptr)})")
    twice = ([], [])
    for _ in range(reps):
        twice[0].append(us_per_token(engines[0]))
        twice[1].append(us_per_token(engines[0]))
    (m0, s0), (m1, s1) = mean_sem(twice[0]), mean_sem(twice[1])
    means = [r["mean_us"] for r in rows]
    ctx.write_json("engine_instances.json", {
        "what": "identical graph engines, interleaved: per-instance ms/token",
        "source": engines[0].backend.describe(), "date": today(),
        "reps": reps, "tokens": tokens, "engines": rows, "spread_us": max(means) - min(means),
        "same_engine_twice": {"first_mean_us": m0, "first_sem_us": s0,
                              "second_mean_us": m1, "second_sem_us": s1}})
    print(f"engine 0 run twice in a row: {m0:.2f} ± {s0:.2f} then {m1:.2f} ± {s1:.2f} us/token; "
          f"spread between instances: {max(means) - min(means):.2f} us/token")
