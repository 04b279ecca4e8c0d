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
# # 06 — Fission that only pays once the step is captured
#
# The attention **combine** merges the per-slice softmax partials and applies the output
# projection with the residual add. It exists in two shapes:
#
# - **one kernel** (`attn_combine`): every block re-merges all heads into shared memory, then
#   computes its rows of `Wo · o`;
# - **two kernels** (`attn_merge` then `matvec_residual`): the merge runs once, on a grid sized
#   for it, and the projection is a plain matvec.
#
# The two are **bit-identical** by construction (the same device functions in the same order).
# Which one is faster depends on the launch mechanism: eagerly, the extra launch costs a whole
# host submit; captured, it costs one more graph node — and the better grids may win it back.
# `LAB_SPLIT_COMBINE` switches between them on one build.

# %%
import json
from pathlib import Path

import numpy as np

from lab import bench
from lab.config import LabConfig
from lab.engine import DecodeEngine
from lab.model import load_model
from lab.verify import run_arm

model = load_model()
cfg = LabConfig()

# %% [markdown]
# ## Same bits, one more launch per layer

# %%
ids = model.tokenizer.encode("ROMEO.\n")
arms = {}
for split in (False, True):
    eng = DecodeEngine(model, cfg.replace(graph=False, split_combine=split))
    arms[split] = run_arm(eng, ids, 40, graph=False)[0]
    print(f"split_combine={int(split)}: {len(eng.step_launches(eng.plan(0)))} launches/token, "
          f"layer 0: {[l.name for l in eng.step_launches(eng.plan(0)) if l.layer == 0]}")
print("logits bit-identical over 40 tokens:", arms[False].logits.tobytes() == arms[True].logits.tobytes())

# %% [markdown]
# ## Eager vs captured: which shape wins?
# A paired, interleaved A/B in each mode (A = one kernel, B = two kernels), behind an A/A gate.
# On the simulator the kernel work is tiny and the same in both shapes, so the comparison shows
# the *launch* cost of fission: one host submit eagerly, one graph node when captured.

# %%
for mode in ("eager", "graph"):
    base = cfg.replace(graph=(mode == "graph"))
    res = bench.run_ab(model, base, base.replace(split_combine=True), reps=3, tokens=24,
                       names=("combine", "split"), per_token=0)
    a, b = res["arms"]
    print(f"[{mode}] one kernel {a['mean_ms']:.4f} ms/token, two kernels {b['mean_ms']:.4f} ms/token "
          f"-> fission costs {1000 * (b['mean_ms'] - a['mean_ms']):+.2f} us/token "
          f"({'meaningful' if res['meaningful'] else 'not meaningful: ' + res['reason']}) [{bench.source_label(res['source'])}]")

# %% [markdown]
# ## Recorded on the H200
# The same comparison on the GPU (`scripts/record_gpu_overlap.py`), where the two shapes' grids
# really differ in cost.

# %%
rec = Path("../data/gpu/fission.json")
if rec.exists():
    r = json.loads(rec.read_text())
    print(r["source"], "-", r["date"])
    for mode in ("eager", "graph"):
        a, b = r[mode]["arms"]
        d = r[mode]
        print(f"  [{mode}] one kernel {a['mean_ms']:.4f} ± {a['sem_ms']:.4f}, two kernels "
              f"{b['mean_ms']:.4f} ± {b['sem_ms']:.4f} ms/token; B - A = "
              f"{1000 * d['diff_b_minus_a_ms']:+.2f} ± {1000 * d['diff_sem_ms']:.2f} us/token")
        aa = d["aa"]
        print(f"          A/A: A' - A = {1000 * aa['diff_ms']:+.2f} ± {1000 * aa['sem_ms']:.2f} us/token -> "
              + ("the A/B is meaningful" if d["meaningful"] else "NOT meaningful: " + d["reason"]))
else:
    print("no recorded GPU figures yet")

# %% [markdown]
# Read it in this order: the A/A line first, then the A/B line. Eagerly, the four extra launches
# per token each cost a whole host submit — hundreds of microseconds per token, far more than any
# grid could win back. Captured, the extra node costs about a microsecond of device time, and
# the separate merge kernel (one block per head instead of every projection block re-merging all
# heads) can win that back: the sign of a sub-microsecond difference decides it, which is why
# both arms run on one engine and the A/A line must pass before the A/B line is read. The same
# kernel shape can be the wrong choice eagerly and the right one once the step is a graph.
