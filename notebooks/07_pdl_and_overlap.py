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
# # 07 — PDL and multi-stream overlap
#
# A CUDA graph removes the host cost of each launch. What is left between two dependent
# kernels is a **device-side gap**: the second grid is launched only when the first has
# finished. Two ways to shrink what remains:
#
# - **PDL (programmatic dependent launch, sm_90+)**: the next kernel may be launched while the
#   current one still runs; it blocks in `griddepcontrol.wait` (our `pdl_wait()`) until its
#   predecessor has completed and its memory is visible. Safe only if every kernel waits
#   before it reads what a predecessor wrote — here the wait is every kernel's first statement,
#   and a static check enforces it.
# - **multi-stream overlap**: launches with no data dependency run side by side. Here the k/v
#   projection runs on a side stream while the q projection runs on the main one, forked and
#   joined with events; captured, they become parallel branches of the graph.

# %%
import json
from pathlib import Path

import matplotlib.pyplot as plt

from lab import bench, plots
from lab.backend.sim import SimBackend
from lab.config import LabConfig
from lab.engine import DecodeEngine
from lab.model import load_model
from lab.pdl_check import wait_first_violations

model = load_model()
cfg = LabConfig()

# %% [markdown]
# ## The static check: is the wait first?

# %%
print("kernels whose first statement is not pdl_wait():", wait_first_violations())
print("(rmsnorm_late_wait is the deliberate bug LAB_BUG_LATE_WAIT)")

# %% [markdown]
# ## The simulator's race report
# Under PDL a kernel's code *before* its wait runs while its predecessor may still be writing.
# The simulator knows, from the source, which arguments each kernel touches before its wait,
# and reports a race when the predecessor writes one of them.

# %%
for bugs in (frozenset(), {"late_wait"}):
    eng = DecodeEngine(model, LabConfig(backend="sim", pdl=True, bugs=bugs))
    eng.generate("ROMEO.\n", 2)
    print(f"bugs={set(bugs) or '{}'}: {len(eng.backend.races)} races;",
          eng.backend.races[0] if eng.backend.races else "")

# %% [markdown]
# ## Timelines (simulated): graph, graph + PDL, graph + overlap
# One decode step each. PDL shortens every node's gap; overlap puts the k/v projection beside
# the q projection on a second device lane.

# %%
fig, axes = plt.subplots(3, 1, figsize=(11, 8), sharex=True)
for ax, (title, extra) in zip(axes, [("graph", {}), ("graph + PDL", {"pdl": True}),
                                     ("graph + overlap", {"overlap": True})]):
    eng = DecodeEngine(model, LabConfig(backend="sim", **extra), backend=SimBackend(seed=5))
    eng.generate("ROMEO.\n", 8)
    eng.backend.timeline.clear()
    t0 = eng.backend.clock() * 1e6
    eng.step()
    plots.timeline(eng.backend.timeline, ax=ax, t0=t0, title=f"one step, {title}")
fig.tight_layout()

# %% [markdown]
# ## What each factor is worth: leave-one-out
# All four factors on, each one off in turn, all off — interleaved, paired reps. A factor's
# worth is (its arm with it off) − (all on): what it buys *in the presence of the others*.
# Simulated here (small reps); the H200's table follows.

# %%
loo = bench.run_loo(model, "GRAPH,PDL,OVERLAP,SPLIT_COMBINE", base=cfg, reps=3, tokens=24)
print(bench.format_loo(loo))

# %% [markdown]
# ## Recorded on the H200
# Read the A/A line before the A/B line. The arms run on one shared engine (same buffers): on
# the H200, separate but identical graph engines differ by a steady microsecond or two per token
# from buffer placement alone (`engine_instances.json`, notebook 05), enough to fail the A/A
# gate and to blur an effect of PDL's size.
# `scripts/record_gpu_overlap.py`: leave-one-out with 5 paired reps, and graph vs graph + PDL
# with the captured graph's edge types (programmatic edges counted through cuda-bindings).

# %%
for name in ("overlap_loo", "pdl"):
    rec = Path(f"../data/gpu/{name}.json")
    if not rec.exists():
        print(f"no recorded {name} yet")
        continue
    r = json.loads(rec.read_text())
    if name == "overlap_loo":
        print(bench.format_loo(r))
    else:
        print(bench.format_ab(r))
        print("graph edges:", r["edge_types"], f"-> PDL worth {100 * r['pdl_worth_fraction']:.1f}% of the graph arm")
