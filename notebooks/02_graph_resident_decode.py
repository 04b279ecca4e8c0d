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
# # 02 — Graph-resident decode
#
# A CUDA graph freezes everything the host passed at capture: pointers, sizes, grids, kernel
# choice. So a graph can decode token after token only if **everything that changes per token
# lives in device memory**: here the position (`pos`), the token ids (`tokens`) and the KV cache.
# The position increment and the argmax that writes the next token id are kernels *inside* the
# step, so N replays of one graph decode N tokens with no host work in between.
#
# What a graph may freeze is decided in one place, `decode_plan(position)`: the number of
# attention `splits` grows with the context, so the attention grid changes at a few plan
# boundaries. Each plan key gets its own graph.

# %%
import numpy as np
import matplotlib.pyplot as plt

from lab.config import LabConfig
from lab.engine import DecodeEngine
from lab.model import load_model
from lab.plan import decode_plan, plan_boundaries
from lab.verify import replay_check
from lab.backend.sim import SimBackend
from lab import plots
from kernels import attention

model = load_model()
engine = DecodeEngine(model, LabConfig())        # graph on; backend auto (GPU if usable)
print("backend:", engine.backend.describe())
print("plan boundaries (first position of each new plan):", plan_boundaries(model.cfg.max_seq))
for pos in (0, 31, 32, 100, 1000):
    p = decode_plan(pos, model.cfg, engine.cfg)
    grid, _ = attention.partial_grid(model.cfg.n_head, p.splits, model.cfg.head_dim)
    print(f"  position {pos:>4}: splits {p.splits:>2}, attention grid {grid}, key {p.key}")

# %% [markdown]
# ## Capture the step
# The capture runs in *global* mode: any synchronising or allocating call during it fails
# loudly instead of silently running once at capture time. The graph's node count equals the
# launch count of the step.

# %%
plan = engine.plan(0)
graph, failure = engine.capture(plan)          # failure: None, or why the capture failed
launches = engine.step_launches(plan)
print(f"launches per step: {len(launches)}; graph nodes: {graph.node_count}; node types: {graph.node_types()}")

# %% [markdown]
# ## Replay it, token after token
# `generate` replays the graph for every step, capturing a new graph only when the plan key
# changes. The ledger records, per step, whether it was a replay, a new capture, or an eager
# fallback (with the reason).

# %%
gen = engine.generate("ROMEO.\n", 150)
print(gen.prompt + gen.text)
print()
print("ledger summary:", engine.ledger_summary())
for e in engine.ledger:
    if e.outcome != "replay":
        print(f"  step {e.step:>3} position {e.position:>3}: {e.outcome:<8} key {e.plan_key}")

# %% [markdown]
# ## Byte-compare replays with eager steps
# `replay_check` decodes the same tokens eagerly and as graph replays, for several prompts on
# one engine (so the second prompt replays graphs captured during the first, after a reset),
# and compares every token id and every logit **bit for bit**. Graph and eager run the same
# kernels on the same data: any difference is a bug, never "numerical drift".

# %%
report = replay_check(engine, ["ROMEO.\n", "To be, or not to be"], replays=72)
print(report.summary())
assert report.ok

# %% [markdown]
# ## Eager vs graph: the timeline
# Simulated: an eager step pays one host submit per launch; a replay pays one submit per graph
# and a small per-node cost on the device.

# %%
fig, axes = plt.subplots(2, 1, figsize=(11, 5.5), sharex=True)
sims = {}
for ax, graph_on in zip(axes, (False, True)):
    sim = DecodeEngine(model, LabConfig(backend="sim", graph=graph_on), backend=SimBackend(seed=2))
    sim.generate("ROMEO.\n", 20)
    sim.backend.timeline.clear()
    t0 = sim.backend.clock() * 1e6
    for _ in range(3):
        sim.step()
    plots.timeline(sim.backend.timeline, ax=ax, t0=t0,
                   title=f"3 decode steps, {'graph replays' if graph_on else 'eager'}")
    sims[graph_on] = (sim.backend.clock() * 1e6 - t0) / 3
fig.tight_layout()
print(f"simulated: eager {sims[False]:.1f} us/token, graph {sims[True]:.1f} us/token, "
      f"ratio {sims[False] / sims[True]:.1f}x")

# %% [markdown]
# ## Recorded on the H200
# Interleaved, paired eager vs graph ms/token at short context, recorded by
# `scripts/record_gpu.py` (present once a GPU run has been recorded).

# %%
import json
from pathlib import Path
from lab.report import format_ab
rec = Path("../data/gpu/decode_eager_vs_graph.json")
print(format_ab(json.loads(rec.read_text())) if rec.exists() else "no recorded GPU figures yet")
