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
# # 01 — The launch bill
#
# A decode step of a small model is dozens of tiny kernels. Before optimising any of them, count
# the bill:
#
# **launches per token = kernels per layer × layers (× ranks) + the kernels outside the layers**
#
# and the **per-launch budget = step time / launches per token**. If the budget is close to
# what the host needs to *submit* one launch, the GPU is waiting on the host, and no kernel
# tuning helps; removing launches (fusion) or their host cost (CUDA graphs) does.

# %%
import json
from pathlib import Path

import matplotlib.pyplot as plt

from lab.config import LabConfig
from lab.engine import DecodeEngine
from lab.instrument import launch_bill
from lab.model import load_model
from lab import plots

model = load_model()
RANKS = 1   # this lab runs on one GPU; tensor parallelism would multiply the bill per rank

# %% [markdown]
# ## Count it from the launch log
# The engine records every launch. One step's log, grouped by layer:

# %%
bills = []
for graph in (False, True):
    eng = DecodeEngine(model, LabConfig(graph=graph))
    eng.generate("ROMEO.\n", 16)                      # warm-up: compile, capture
    gen = eng.generate("ROMEO.\n", 128)
    step = next(r.step for r in reversed(eng.log.records) if r.kind in ("eager", "capture"))
    bills.append(launch_bill(eng.log, step, "graph" if graph else "eager", gen.ms_per_token, gen.source))
    if not graph:
        per_layer = eng.log.kernels_per_layer(step)
        print("kernels in layer 0:", [r.kernel for r in eng.log.for_step(step) if r.layer == 0])
        print("outside the layers:", [r.kernel for r in eng.log.for_step(step) if r.layer is None])
b = bills[0]
print(f"\n{b.kernels_per_layer} kernels/layer x {b.layers} layers x {RANKS} rank "
      f"+ {b.other_kernels} = {b.launches_per_token} launches/token")

# %% [markdown]
# ## The bill, eager and captured
# With the graph the launch count per token is the same — but the host pays one submit per
# graph instead of one per launch, so the per-launch budget collapses. (In graph mode the
# launches were counted when the step was captured.)

# %%
print(f"{'mode':<6} {'launches/token':>14} {'ms/token':>9} {'us/launch':>9}  source")
for b in bills:
    print(f"{b.mode:<6} {b.launches_per_token:>14} {b.ms_per_token:>9.4f} {b.us_per_launch:>9.2f}  {b.source}")
plots.bill_bars(bills)
plt.show()

# %% [markdown]
# ## What the H200 measured
# Recorded by `scripts/record_gpu.py` on the project's H200 (interleaved, paired reps).
# Compare the eager per-launch budget with the host cost of one numba launch: the eager step is
# host-bound, launch by launch.

# %%
rec = Path("../data/gpu/decode_eager_vs_graph.json")
if rec.exists():
    r = json.loads(rec.read_text())
    print(r["source"], "-", r["date"])
    for arm in r["arms"]:
        print(f"  {arm['name']:<6} {arm['launches_per_token']} launches/token, "
              f"{arm['mean_ms']:.4f} ± {arm['sem_ms']:.4f} ms/token -> {arm['us_per_launch']:.2f} us/launch")
else:
    print("no recorded GPU figures yet")
