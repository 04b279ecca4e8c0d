# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 05 — Measurement you can trust
#
# A speed claim in this lab is made the way good engine teams make it:
#
# 1. **both arms in one process**, same weights, same build — the arms differ only by `LAB_*`
#    toggles; arms that differ only in launch toggles run on **one shared engine** (same
#    buffers, same addresses), because identical engine instances differ by their buffers'
#    placement alone (measured on the H200, shown at the end);
# 2. **interleaved**, the order alternated per rep (A B, B A, A B, ...), so slow drift of the
#    machine hits both arms alike, and each difference is **paired** by rep;
# 3. **warm-up excluded** (compilation, capture);
# 4. **A/A first**: A against a second copy of A, interleaved exactly like the A/B. If A already
#    differs from A beyond its noise
#    (paired |t| > 3), or the outputs (token ids, final logits) are not byte-identical, an A/B
#    is not meaningful — whatever its t says;
# 5. every number comes with its **standard error** and its **source** (measured on which GPU,
#    or simulated).
#
# Everything below runs on the CPU simulator (reps and tokens kept small so the notebook runs
# in seconds); its cost model is calibrated from H200 measurements and every figure says
# "simulated". Recorded GPU figures, when present, are shown at the end.

# %%
import glob
import json
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from lab import bench, stats
from lab.backend.costmodel import CostModel
from lab.backend.sim import SimBackend
from lab.config import LabConfig
from lab.engine import DecodeEngine
from lab.model import load_model

model = load_model()
SIM = LabConfig(backend="sim")
EAGER, GRAPH = SIM.replace(graph=False), SIM.replace(graph=True)
print(f"max_seq {model.cfg.max_seq}; cost model: {CostModel()}")

# %% [markdown]
# ## A/A first, then A/B
# `run_ab` runs eager against a copy of eager (the A/A gate), then eager against graph, then a
# separate per-token pass (a `clock()` around every step — on a GPU that synchronizes per token,
# so it cannot share the throughput pass) for p50/p99.

# %%
ab = bench.run_ab(model, EAGER, GRAPH, reps=5, tokens=24, per_token=300, names=("eager", "graph"))
aa = ab["aa"]
print(f"A/A: paired t = {aa['t']:.2f}, outputs byte-identical: {aa['outputs_identical']} -> "
      f"{'PASS' if aa['ok'] else 'FAIL: ' + aa['reason']}")
print()
print(bench.format_ab(ab))

# %% [markdown]
# ### An A/A that fails
# Give the second copy of A its own engine on a noisy host (huge submit jitter and frequent
# stalls — a busy machine, a preempted thread). A is now "different from itself", and the
# harness refuses to report the A/B as meaningful.

# %%
noisy = CostModel(eager_jitter=1.0, eager_spike_p=0.3, eager_spike_us=2000.0)
bad = bench.run_ab(model, EAGER, GRAPH, reps=3, tokens=12, per_token=0, names=("eager", "graph"),
                   backend_factory=lambda cfg, i: SimBackend(noisy if i == 1 else CostModel(), seed=i))
print(bench.format_ab(bad))

# %% [markdown]
# ## Standard errors of both arms
# Eager decode is **host-bound**: ~37 launches per token, each a ~100 us trip through numba's
# dispatcher, so any slow drift of the host (clock boost, another process) moves the eager arm
# from rep to rep. A graph replay is **device-bound**: one submit per token, then the device runs
# 37 nodes back to back, so host drift hardly reaches it. The captured arm's standard error is
# orders of magnitude smaller (on a GPU the target is at least 10x).

# %%
fig, axes = plt.subplots(1, 2, figsize=(10, 3.2))
bench.plot(ab, ax=axes)
fig.tight_layout()
print(f"sem eager / sem graph = {ab['sem_ratio_a_over_b']:.0f}x (simulated)")

# %% [markdown]
# ## Context sweep
# Long contexts are reached with `DecodeEngine.seek(position)`: it sets the device position (and
# the host mirror) without computing the positions before it. A step at a sought position does
# the work of a step at that context length — same plan (attention splits), same bytes read —
# so **seek is valid for timing**. The decode at context `c` runs positions `c .. c + tokens - 1`;
# `c + tokens` must stay below `max_seq`, else the sweep refuses with a clear error.

# %%
sweep = bench.run_sweep(model, {"eager": EAGER, "graph": GRAPH}, [64, 256, 512, 1000],
                        reps=3, tokens=8)
print(bench.format_sweep(sweep))
bench.plot(sweep)

# %% [markdown]
# ## The seek A/A trap
# Seek is **invalid for byte-compares**: attention reads KV rows that were never written, i.e.
# whatever the cache memory held. Two eager engines (the same config: an A/A) at context 900:
# with uninitialised caches (`kv_init="empty"`, memory recycled from earlier tensors) each reads
# *different* garbage, and the A/A byte-compare FAILS — not because anything is wrong with eager
# decoding. With zero-initialised caches both read zeros and the A/A PASSES. (The zeroed outputs
# are still not what a real 900-token context would produce: timing only.)

# %%
def sought(kv_init, position=900, steps=6):
    eng = DecodeEngine(model, EAGER, kv_init=kv_init)
    eng.reset(eng.encode("ROMEO.\n"), 0)
    eng.seek(position)
    for _ in range(steps):
        eng.step()
    return eng.tokens(position + steps + 1)[position + 1:], eng.logits()

for kv_init in ("empty", "zeros"):
    a, b = sought(kv_init), sought(kv_init)
    why = stats.outputs_differ([a], [b])
    print(f"kv_init={kv_init!r:8} A/A at context 900: {'FAIL — ' + why if why else 'PASS'}; "
          f"ids {a[0].tolist()} vs {b[0].tolist()}")

# %% [markdown]
# ## Leave-one-out
# With several optimisations, "what is each one worth?" depends on what else is on. Leave-one-out
# runs all-on, all-off and each-factor-off arms interleaved; a factor's worth is (its-off arm) −
# (all-on), paired by rep. The interaction row is the total minus the sum of the single worths
# (0 if the factors simply add). The all-off arm is checked against a plain baseline — a fresh
# engine with the same config, its reps run back to back — and flagged if the gap is outside
# the noise (interleaving must not change what an arm measures).

# %%
loo = bench.run_loo(model, "GRAPH,SPLIT_COMBINE", base=SIM, reps=4, tokens=16)
print(bench.format_loo(loo))
bench.plot(loo)

# %% [markdown]
# ## Recorded GPU figures
# `scripts/record_gpu_bench.py --out data/gpu` records the same three measurements on a GPU
# (`bench_ab.json`, `bench_sweep.json`, `bench_loo.json`, each with its GPU, versions and date).
# They are shown here next to the simulated ones when present.

# %%
FORMAT = {"bench_ab": bench.format_ab, "bench_sweep": bench.format_sweep, "bench_loo": bench.format_loo}
SIMULATED = {"bench_ab": ab, "bench_sweep": sweep, "bench_loo": loo}
recorded = sorted(glob.glob("../data/gpu/bench_*.json"))
if not recorded:
    print("no recorded GPU figures yet (run scripts/record_gpu_bench.py on a GPU)")
for path in recorded:
    name = Path(path).stem
    try:
        rec = json.loads(Path(path).read_text())
        print(f"=== {name}: {rec['source']} — {rec.get('date', '?')}")
        print(FORMAT[name](rec) if name in FORMAT else json.dumps(rec, indent=1)[:2000])
    except Exception as exc:  # a file from another version of the lab: show, do not fail
        print(f"=== {name}: unreadable here ({exc.__class__.__name__}: {exc})")
        continue
    if name in SIMULATED:
        fig = plt.figure(figsize=(11, 3.2))
        if name == "bench_ab":
            axes = fig.subplots(1, 4)
            bench.plot(rec, ax=axes[:2])
            bench.plot(SIMULATED[name], ax=axes[2:])
        else:
            axes = fig.subplots(1, 2)
            bench.plot(rec, ax=axes[0])
            bench.plot(SIMULATED[name], ax=axes[1])
        fig.tight_layout()

# %% [markdown]
# ## Why arms share one engine
# Identical graph engines — same config, same weights — run interleaved on the H200, each one's
# ms/token with its standard error (`scripts/record_gpu_instances.py`). If instances differ by
# more than their noise, an A/B between two engines would report that difference as an effect
# of the toggle; one engine run twice shows the run-to-run part alone.

# %%
rec = Path("../data/gpu/engine_instances.json")
if rec.exists():
    r = json.loads(rec.read_text())
    print(r["source"], "-", r["date"])
    for e in r["engines"]:
        print(f"  engine {e['engine']}: {e['mean_us']:.2f} ± {e['sem_us']:.2f} us/token (x at {e['x_ptr']})")
    t = r["same_engine_twice"]
    print(f"  spread between instances: {r['spread_us']:.2f} us/token; one engine twice: "
          f"{t['first_mean_us']:.2f} ± {t['first_sem_us']:.2f} then {t['second_mean_us']:.2f} ± {t['second_sem_us']:.2f}")
else:
    print("no recorded instance measurement yet")
