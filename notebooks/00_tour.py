# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 00 — A tour of decode-lab
#
# A small character-level transformer (4 layers, d_model 256, trained on Shakespeare) decodes
# one token at a time. Each token is a **decode step**: a fixed list of kernel launches
# (`numba.cuda` kernels on a GPU, their NumPy twins on the CPU simulator). This notebook loads
# the model, generates text, and looks at the launch log: which kernels run, with which grids
# and arguments, and where the time goes.
#
# Every number below says where it came from: *measured* on a named GPU with versions, or
# *simulated* by the CPU simulator's cost model.

# %%
import numpy as np
import matplotlib.pyplot as plt

from lab import DecodeEngine, LabConfig, load_model
from lab.backend.sim import SimBackend
from lab.measure import plots
from lab.measure.report import wrapped

model = load_model()
cfg = LabConfig(graph=False)          # backend "auto": the GPU if one is usable, else the simulator
engine = DecodeEngine(model, cfg)


def show(text):
    print(wrapped(text))


show(f"backend: {engine.backend.describe()}")
c = model.cfg
print(f"model: {c.n_layer} layers, d_model {c.d_model}, {c.n_head} heads, d_ff {c.d_ff}, "
      f"vocab {c.vocab_size}, max_seq {c.max_seq}, "
      f"{sum(a.size for a in model.weights.values()):,} parameters")

# %% [markdown]
# ## Generate
# Greedy decoding: the prompt is written into device memory, then every step embeds the token at
# the current position, runs the layers, and an `argmax_next` kernel writes the next token id
# back into device memory. The host reads the ids only at the end.

# %%
gen = engine.generate("ROMEO.\n", 200)
print(gen.prompt + gen.text)
show(f"\n{gen.steps} steps, {gen.ms_per_token:.3f} ms/token — {gen.source}")

# %% [markdown]
# ## The launch log of one step
# Every launch is recorded with its kernel, layer, grid, block and each argument's provenance:
# a buffer name (a device pointer) or a value passed *by value*. Step 10 is shown (each row's
# arguments cut to fit the page).

# %%
rows = engine.log.table(10)
print(f"{'#':>2} {'kernel':<16} {'layer':>5} {'grid':<9} {'block':<7} args")
for r in rows:
    print(f"{r['#']:>2} {r['kernel']:<16} {str(r['layer']):>5} {str(r['grid']):<9} "
          f"{str(r['block']):<7} {r['args'][:56]}")

# %%
per_layer = engine.log.kernels_per_layer(10)
print("launches per layer:", {k: v for k, v in per_layer.items() if k is not None})
print("outside the layers:", per_layer[None])
print("launches per token:", sum(per_layer.values()))

# %% [markdown]
# ## Where the time goes: a timeline
# The simulator's timeline shows the host submitting launches (top lane) and the device running
# kernels (bottom lane). Eagerly, every launch costs the host a submit (several microseconds
# even pre-bound, the default `LAB_LAUNCH`; tens through numba's dispatcher), longer than most
# of these tiny kernels run: the device mostly waits.
# The same step as one CUDA graph costs one submit. These timelines are **simulated**, whatever
# backend ran the generation above.

# %%
fig, axes = plt.subplots(2, 1, figsize=(11, 5.5))
for ax, graph in zip(axes, (False, True)):
    sim = DecodeEngine(model, LabConfig(backend="sim", graph=graph), backend=SimBackend(seed=1))
    sim.generate("ROMEO.\n", 12)
    sim.backend.timeline.clear()
    sim.step()                                     # one more step, timed alone
    plots.timeline(sim.backend.timeline, ax=ax,
                   title=f"one decode step, {'graph replay' if graph else 'eager'}",
                   source="simulated")
fig.tight_layout()
plt.show()

# %% [markdown]
# Top, eager: the host lane is a solid run of submits, one per launch, and the device lane is
# mostly idle — each tiny kernel finishes long before the host has submitted the next. Bottom,
# the graph: one dark submit on the host lane, and the device runs the step's kernels back to
# back. Replaying a graph is not free — the submit remains, and each node still costs its run
# time plus a gap before it (notebooks 01 and 07 price both) — but the host no longer paces
# the device.

# %% [markdown]
# ## Recorded GPU figures
# What the same step costs on the project's H200, recorded by `decode-lab record decode`
# (if the file is present).

# %%
import json
from pathlib import Path
rec = Path("../data/gpu/decode_eager_vs_graph.json")
if rec.exists():
    r = json.loads(rec.read_text())
    show(f"{r['source']} — {r['date']}")
    for arm in r["arms"]:
        print(f"  {arm['name']:<6} {arm['mean_ms']:.4f} ± {arm['sem_ms']:.4f} ms/token, "
              f"{arm['launches_per_token']} launches/token, {arm['us_per_launch']:.2f} us/launch")
else:
    print("no recorded GPU figures yet")

# %% [markdown]
# ## What you should now be able to do
# - Generate from the lab's model on either backend and say which one produced a figure (the
#   `source` line: a GPU with its versions, or "simulated").
# - Read one step's launch log: which kernels, in which order, per layer and around the layers.
# - Read a timeline: tell a host-bound eager step (the device waits for each submit) from a
#   replayed graph (one submit, the device runs the kernels back to back).
