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
# # 02 — Graph-resident decode
#
# A captured launch keeps the argument values it was captured with — pointers, by-value sizes,
# grids, the kernel itself — until someone updates the graph's node parameters. The memory
# behind those pointers stays live: a replay reads whatever the buffers hold when it runs. So a
# graph can decode token after token when everything that changes per token is **read from
# device memory at run time**: here the position (`pos`), the token ids (`tokens`) and the KV
# cache. Something must also change that memory between tokens. This engine does it with
# kernels *inside* the step — the argmax writes the next token id, the last kernel advances
# `pos` — so N replays of one graph decode N tokens with no host work in between. Writing the
# position from the host between launches is correct too; a section below runs both.
#
# What a graph keeps fixed is decided in one place, `decode_plan(position)`: the number of
# attention `splits` grows with the context, so the attention grid changes at a few plan
# boundaries. By default this engine **recaptures**: each plan key gets its own graph. CUDA
# offers two other ways to follow a changing grid or loop bound — updating an instantiated
# graph's kernel nodes in place (`cudaGraphExecKernelNodeSetParams` for one node,
# `cudaGraphExecUpdate` for a whole graph) and conditional nodes (a graph that branches or
# loops on a device value). This notebook stays with recapture; notebook 11 tries the others.

# %%
import json
from pathlib import Path

import numpy as np
import matplotlib.pyplot as plt

from lab import DecodeEngine, LabConfig, load_model
from lab.backend.sim import SimBackend
from lab.measure import plots, report
from lab.plan import decode_plan, plan_boundaries
from lab.measure.replay_check import replay_check
from kernels import attention

model = load_model()
engine = DecodeEngine(model, LabConfig())        # graph on; backend auto (GPU if usable)
SIM = LabConfig(backend="sim")
PROMPT = "ROMEO.\n"


def show(text):
    print(report.wrapped(text))


show(f"backend: {engine.backend.describe()}")
print("plan boundaries (first position of each new plan):", plan_boundaries(model.cfg.max_seq))
for pos in (0, 31, 32, 100, 1000):
    p = decode_plan(pos, model.cfg, engine.cfg)
    grid, _ = attention.partial_grid(model.cfg.n_head, p.splits, model.cfg.head_dim)
    print(f"  position {pos:>4}: splits {p.splits:>2}, attention grid {grid}")
show(f"a plan key (one graph each): {decode_plan(0, model.cfg, engine.cfg).key}")

# %% [markdown]
# ## Capture the step
# A capture **records** the launches; it runs none of them. The check below reads the device
# position and the logits before and after capturing: the step's last kernel would advance the
# position, the lm head would write the logits — neither happened. Only launching the graph
# runs its kernels.
#
# The capture runs in *global* mode: a call that cannot be part of a graph fails loudly instead
# of silently running once at capture time. That covers synchronisations, synchronous copies
# and allocations that make a pool grow through a synchronous allocator (`cudaMalloc`) — not
# every allocation: a stream-ordered allocation (`cudaMallocAsync`) is capturable and becomes a
# graph memory node. This engine allocates everything at start-up, so it needs neither.

# %%
plan = engine.plan(0)
before = engine.device_position(), engine.logits().copy()
graph, failure = engine.capture(plan)          # failure: None, or why the capture failed
after = engine.device_position(), engine.logits()
launches = engine.step_launches(plan)
print(f"launches per step: {len(launches)}; graph nodes: {graph.node_count}; "
      f"node types: {graph.node_types()}")
print(f"device position before / after the capture: {before[0]} / {after[0]}; "
      f"logits unchanged: {before[1].tobytes() == after[1].tobytes()}")
graph.launch()
print(f"after one launch of the graph: device position {engine.device_position()}")

# %% [markdown]
# ## Replay it, token after token
# `generate` replays the graph for every step, capturing a new graph only when the plan key
# changes. The ledger records, per step, whether it was a replay, a new capture, or an eager
# fallback (with the reason).

# %%
gen = engine.generate(PROMPT, 150)
print(gen.prompt + gen.text)
print()
print("ledger summary:", engine.ledger_summary())
for e in engine.ledger:
    if e.outcome != "replay":
        print(f"  step {e.step:>3} position {e.position:>3}: {e.outcome:<8} "
              f"(splits {engine.plan(e.position).splits})")

# %% [markdown]
# ## Where the position advances: inside the graph, or between launches
# Two correct designs, and one broken one, each decoding twelve tokens on the simulator as graph
# replays:
#
# - **inside the graph** (this engine): the step's last kernel advances `pos`;
# - **between launches**: `LAB_BUG_POS_OUTSIDE_GRAPH` has no such kernel, and here the host
#   writes the device position before *every* step (`engine.seek(engine.position)` writes `pos`
#   and nothing else), eager prompt steps and replays alike;
# - **only before the capture**: the same engine without those writes — its upload runs before
#   eager steps and before the capture, never before a replay (the deliberate bug).
#
# The simulator has no per-node parameter update, so the second design writes device memory.
# On a GPU the by-value form of the same idea keeps the position a kernel argument and updates
# the node before each launch with `cudaGraphExecKernelNodeSetParams`: also correct, also host
# work per token.

# %%
def twelve_tokens(bugs, host_writes_pos):
    """Twelve tokens after PROMPT, every step a graph replay: (their ids, the ledger)."""
    eng = DecodeEngine(model, SIM.replace(bugs=bugs))
    ids = eng.encode(PROMPT)
    eng.reset(ids, 12)
    while eng.position < ids.size - 1 + 12:
        if host_writes_pos:
            eng.seek(eng.position)                 # a host write of pos between launches
        eng.step()
    return eng.tokens()[ids.size:], eng.ledger_summary()


designs = {"inside the graph (a kernel)": (set(), False),
           "host write before every launch": ({"pos_outside_graph"}, True),
           "host write before capture only": ({"pos_outside_graph"}, False)}
first = None
print(f"{'pos advanced by':<31} {'text (repr)':<27} {'= 1st':<6} ledger")
for name, (bugs, writes) in designs.items():
    new_ids, ledger = twelve_tokens(bugs, writes)
    first = new_ids if first is None else first
    same = new_ids.tobytes() == first.tobytes()
    print(f"{name:<31} {model.tokenizer.decode(new_ids)!r:<27} {str(same):<6} {ledger}")

# %% [markdown]
# The first two rows decode the same ids, every step after the first capture a replay: a replay
# reads `pos` from device memory when it runs, whoever wrote it. The third row has the same
# replays and goes wrong from its second replay on: the value it reads was written once, before
# the capture. Keeping the increment inside the graph saves the host a write per token; it is a
# choice, not the only correct design. (The write here goes to the current position, so it
# skips nothing. `seek` to a *later* position leaves the KV rows in between unwritten: with
# zeroed caches that is a fixture for timing these kernels and for a narrow A/A, with
# uninitialised caches it is a fixture for neither — notebook 05.)

# %% [markdown]
# ## Byte-compare replays with eager steps
# `replay_check` decodes the same tokens eagerly and as graph replays, for several prompts on
# one engine (so the second prompt replays graphs captured during the first, after a reset),
# and compares every token id and every logit **bit for bit**. Bytes are the right bar *here*
# because this lab's kernels are deterministic — no atomic in any sum (the fused step's one
# atomic counter only elects which block finishes the work), a fixed reduction order — and
# both arms start from the same state and run the same launches: a difference is a bug, not
# "numerical drift". Kernels with atomics or order-dependent reductions would not promise that,
# and there only an A/A control separates a bug from run-to-run noise. The check replays 72
# steps per prompt, across plan boundaries and after a request reset: three replays catch this
# lab's frozen-value bugs (notebook 04), but no fixed number proves a graph correct.

# %%
check = replay_check(engine, [PROMPT, "To be, or not to be"], replays=72)
print(check.summary())
assert check.ok

# %% [markdown]
# ## Eager vs graph: the timeline
# Simulated: an eager step pays one host submit per launch; a replay pays one submit per graph
# and a small per-node cost on the device.

# %%
fig, axes = plt.subplots(2, 1, figsize=(11, 5.5), sharex=True)
sims = {}
for ax, graph_on in zip(axes, (False, True)):
    sim = DecodeEngine(model, LabConfig(backend="sim", graph=graph_on), backend=SimBackend(seed=2))
    sim.generate(PROMPT, 20)
    sim.backend.timeline.clear()
    t0 = sim.backend.clock() * 1e6
    for _ in range(3):
        sim.step()
    plots.timeline(sim.backend.timeline, ax=ax, t0=t0,
                   title=f"3 decode steps, {'graph replays' if graph_on else 'eager'}")
    sims[graph_on] = (sim.backend.clock() * 1e6 - t0) / 3
fig.tight_layout()
plt.show()
print(f"simulated: eager {sims[False]:.1f} us/token, graph {sims[True]:.1f} us/token, "
      f"ratio {sims[False] / sims[True]:.1f}x")

# %% [markdown]
# Top: eager, the host lane is a solid run of submits, one per launch, and the device lane
# is mostly gaps — each kernel waits for its submit. Bottom: three graph replays, three thin
# submits at the very start of the host lane — the host has issued all three steps before the
# device is far into the first — and the device runs the nodes back to back, so the three
# steps take a fraction of the eager time (the printed ratio). The replays are not free: each
# still pays its submit, and every node its own device time and the gap before it — which is
# what notebook 07's PDL attacks.

# %% [markdown]
# ## Recorded on the H200
# Interleaved, paired eager vs graph ms/token at short context, recorded by
# `decode-lab record decode` (present once a GPU run has been recorded).

# %%
rec = Path("../data/gpu/decode_eager_vs_graph.json")
ab = json.loads(rec.read_text()) if rec.exists() else None
show(report.format_ab(ab) if ab else "no recorded GPU figures yet")
if ab:
    ratio, n_tok = ab["sem_ratio_a_over_b"], ab["per_token_samples"]
    show(f"sems' ratio {ratio:.1f}x -> variances' ratio {ratio ** 2:.0f}x (equal reps: its "
         f"square); each p99 from {n_tok} tokens rests on its {n_tok // 100} slowest")

# %% [markdown]
# Read the A/A line first: the A/B means something only if that gate passed. The graph arm's
# standard error is far below the eager arm's. That ratio compares standard errors — spreads
# of the mean; with the same number of reps in both arms the variances differ by its square
# (the last line computes both from the recording), so quote the statistic you computed. A tight mean
# also says nothing about the tail: the p50/p99 columns come from a separate pass over many
# single tokens, and a p99 is only as good as the count of slow tokens under it — the five
# paired reps could not have shown it.

# %% [markdown]
# ## What you should now be able to do
# - Say what must live in device memory for a replay to be right (the position, the token ids)
#   and what the capture key must hold (what changes the captured work: the plan).
# - Check a captured step against the eager step, replay after replay, byte for byte.
# - Read the ledger: which steps captured, replayed or fell back, and why.
# - Read an A/B only after its A/A gate, and quote the statistic you computed (standard errors,
#   or variances as their square), not the other one.
