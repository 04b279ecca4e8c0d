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
# # 11 — Beyond recapture: update the graph in place, and run the whole generation on the device
#
# Until now a plan change (the attention split count grows with the context) meant a **new
# graph**: capture the step again, instantiate it, keep one graph per plan key. CUDA has two
# more tools, and this notebook uses both:
#
# 1. **Update in place** (`LAB_PLAN_SWITCH=update`): capture the new plan's step, then
#    `cudaGraphExecUpdate` gives the *live* executable graph the new node parameters (grids,
#    pointers, sizes) — no instantiation, one executable graph. The runtime refuses when the
#    topology differs (another node count, other edges), and the engine then instantiates, as
#    recapture does; the ledger says which happened and why.
# 2. **The whole generation in one launch** (`LAB_LOOP=device`): a conditional **WHILE** node
#    repeats a body while a device value says so, and a **SWITCH** node inside it runs one of
#    several bodies chosen by a device value. The body picks the plan from the device-resident
#    position, so one graph covers every plan, and N tokens are ONE host launch.
#
# Everything here runs on the simulator (which models exec update and conditional nodes); the
# costs measured on the H200 are read from `data/gpu/` when present.

# %%
import json
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from lab import DecodeEngine, LabConfig, load_model
from lab.backend.costmodel import CostModel
from lab.backend.sim import SimBackend
from lab.measure import report
from lab.measure.report import show
from lab.measure.audit import loop_report

model = load_model()
SIM = LabConfig(backend="sim")
GPU = Path("../data/gpu")
PROMPT, N = "ROMEO.\n", 120


def recorded(name):
    path = GPU / name
    return json.loads(path.read_text()) if path.is_file() else None


def changes(eng):
    return [(e.position, e.outcome, e.reason) for e in eng.ledger if e.outcome != "replay"]


# %% [markdown]
# ## 1. A plan change by update
# Two engines decode the same prompt across two plan boundaries (positions 32 and 64). The
# recapture engine ends with one graph per plan; the update engine with ONE graph, updated at
# each boundary. Same tokens, same logits, byte for byte.

# %%
rec = DecodeEngine(model, SIM)
upd = DecodeEngine(model, SIM.replace(plan_switch="update"))
g_rec, g_upd = rec.generate(PROMPT, N), upd.generate(PROMPT, N)
print("recapture: graphs", len(rec.graphs), "ledger", changes(rec))
print("update:    graphs", len(upd.graphs), "ledger", changes(upd))
print("tokens identical:", np.array_equal(g_rec.tokens, g_upd.tokens),
      "| final logits identical:", rec.logits().tobytes() == upd.logits().tobytes())
show(f"source: {upd.backend.describe()}")

# %% [markdown]
# A second request starts again at position 0: the update engine switches the live graph back
# to the one-split plan **from the graph it captured the first time** (it keeps each plan's
# captured graph), so there is no capture at all, only updates:

# %%
captures_before = sum(r.kind == "capture" for r in upd.log.records)
start = len(upd.ledger)
upd.generate("To be, or not to be", 40)
print("second request:", [(e.position, e.outcome) for e in upd.ledger[start:] if e.outcome != "replay"])
print("captured launches in the second request:",
      sum(r.kind == "capture" for r in upd.log.records) - captures_before)

# %% [markdown]
# The runtime's rule: same nodes, same edges, same edge types. Switching a toggle that adds
# nodes (the fissioned combine: 4 more kernels) cannot be an update; the ledger records the
# refusal and the instantiation that followed:

# %%
upd.cfg = upd.cfg.replace(split_combine=True)
start = len(upd.ledger)
upd.generate(PROMPT, 4)
show(f"after LAB_SPLIT_COMBINE=1: {changes(upd)[-1]}")

# %% [markdown]
# What a plan change costs on the H200, per mechanism (`decode-lab record plan_switch`;
# medians over alternating switches between the first two plans, a synchronize around each):

# %%
ps = recorded("plan_switch.json")
if ps is None:
    print("data/gpu/plan_switch.json is not recorded yet: decode-lab record plan_switch on a GPU")
else:
    print(f"{'mechanism':<34} {'median us':>10} {'q1':>8} {'q3':>8}")
    for name, r in ps["rows"].items():
        print(f"{name:<34} {r['median_us']:>10.1f} {r['q1_us']:>8.1f} {r['q3_us']:>8.1f}")
    show(f"{ps['nodes']} nodes, {len(ps['changed_nodes'])} differ between the plans "
         f"({', '.join(sorted(set(ps['changed_nodes'])))}); tokens identical with update: "
         f"{ps['tokens_identical_update_vs_recapture']}")
    show(f"source: {ps['source']}, {ps['date']}")

# %% [markdown]
# Read the table from the top. Capturing the 37 launches is most of what a plan change costs;
# instantiation is the rest, and an update replaces only that second part. Keeping each plan's
# captured graph turns a switch back into an update alone (the `update only` row). Setting the
# parameters of just the kernel nodes that differ (`cudaGraphExecKernelNodeSetParams`) costs
# about as much as the whole update here, and it is the floor of an in-place switch: with the
# new parameters in hand (here taken from a captured graph), no capture is needed at all.
#
# ## 2. The position, updated between launches
# The lab keeps the position in device memory, advanced by a kernel inside the step, so a
# replay reads the NEXT position by itself. The corrected lecture names the other correct
# design: the position is a launch parameter, and the host **updates the graph's node
# parameters between launches**. The deliberate bug `ctx_by_value` passes the context length
# by value — frozen at capture, wrong from replay 2. Updating the live graph before every launch
# makes the same step right again (here from a fresh capture of each step, the simple and slow
# way; a node-parameter update is the fast one):

# %%
frozen = DecodeEngine(model, SIM.replace(bugs={"ctx_by_value"}))
wrong = frozen.generate(PROMPT, 40)

by_value = DecodeEngine(model, SIM.replace(bugs={"ctx_by_value"}))
ids = by_value.encode(PROMPT)
by_value.reset(ids, 40)
live = None
for _ in range(len(ids) - 1 + 40):
    source, _ = by_value.capture(by_value.plan(), instantiate=False)   # this step's parameters
    if live is None:
        live = by_value.backend.instantiate(source)
    else:
        assert live.update(source) is None
    live.launch()
    by_value.track_position(by_value.position + 1)   # the launch advanced pos on the device
right = by_value.tokens(len(ids) + 40)
clean = DecodeEngine(model, SIM).generate(PROMPT, 40)
print("ctx_by_value, replayed as captured: ", repr(wrong.text[:40]))
print("ctx_by_value, updated every launch: ", repr(by_value.model.tokenizer.decode(right[len(ids):])[:40]))
print("clean engine:                       ", repr(clean.text[:40]))
print("updated == clean:", np.array_equal(right, clean.tokens))

# %% [markdown]
# Both designs are correct; they differ in who pays. The device-resident position costs one tiny
# kernel per step and nothing on the host; the update costs host time before every launch (on
# the H200 table above: the `update only` row for an update from a kept graph, the `capture +
# update` row with a capture), and the host must stay in the loop — which the next section
# removes altogether.
#
# ## 3. The whole generation in one launch
# The ladder so far, counted from the launch log of one generation each: eagerly the host
# launches every kernel of every step; with a graph per plan it launches one graph per step (and
# still decides each step's plan, records the ledger, advances its position mirror); with the
# device loop it launches once, and the device decides the rest.

# %%
ladder = {"eager (one launch per kernel)": SIM.replace(graph=False),
          "graph (one launch per step)": SIM,
          "device loop (one launch per generation)": SIM.replace(loop="device")}
print(f"{'mode':<41} {'steps':>5} {'host launches':>13}  host work per step")
for name, config in ladder.items():
    eng = DecodeEngine(model, config)
    gen = eng.generate(PROMPT, N)
    launches = sum(r.kind in ("eager", "replay") for r in eng.log.records)
    work = {"eager": "plan, 37 launches, ledger", "graph": "plan, 1 graph launch, ledger",
            "device loop": "none: one upload per generation"}
    print(f"{name:<41} {gen.steps:>5} {launches:>13}  {work[name.split(' (')[0]]}")
print("[simulated]")

# %% [markdown]
# `LAB_LOOP=device` builds, once, a graph of this shape, and `generate` launches it ONCE. Its
# DOT (what `decode-lab generate --save-dot` writes for it) and the audit's reading of it:

# %%
dev = DecodeEngine(model, SIM.replace(loop="device"))
g_dev = dev.generate(PROMPT, N)
print(dev.device_loop().dot())
show(loop_report(dev))
print()
replays = [r for r in dev.log.records if r.kind == "replay"]
print(f"host launches for {g_dev.steps} steps: {len(replays)}; ledger: {dev.ledger_summary()}")
print("tokens identical to the host loop:", np.array_equal(g_dev.tokens, g_rec.tokens))

# %% [markdown]
# Each iteration runs `loop_plan` (a kernel that sets the SWITCH value to `plan_of[pos]`), the
# chosen plan's 37 kernels, then `loop_continue` (sets the WHILE value to `pos < limit`). The
# conditions are computed by kernels from device memory, so nothing the host knows is frozen
# into them: only pointers. `kernels/loop.py` holds the two condition kernels (CUDA C: numba
# cannot call `cudaGraphSetConditional`) beside their NumPy twins, which the simulator runs.
#
# It is not free. Each iteration's conditional nodes and condition kernels cost the device
# time of their own, measured on the H200 with a one-node body (`kernel_costs.json`,
# `floors.loop`), which the simulator charges per iteration:

# %%
measured = CostModel.load()
loop_floor = json.loads((GPU / "kernel_costs.json").read_text())["floors"]["loop"]
show(f"one iteration with a one-node body: {loop_floor['per_iteration_us']:.2f} us; the node alone "
     f"in a plain chain: {loop_floor['advance_node_us']:.2f} us -> the loop adds "
     f"{measured.loop_iteration_us():.2f} us per iteration [{measured.describe()}]")

# %% [markdown]
# So what does it buy? With the measured H200 host the graph step is device-bound: the host
# submits the next replay long before the device needs it, and the loop's own cost per
# iteration is more than the host loop ever waited. Make the host slower (a busy server
# process, a Python stack doing other work) and the host loop becomes host-bound while the
# device loop does not notice:

# %%
rows = []
for scale in (1, 20, 40, 60):
    cost = measured.replace(host_scale=float(scale))
    for loop in ("host", "device"):
        eng = DecodeEngine(model, SIM.replace(loop=loop), backend=SimBackend(cost, seed=0))
        eng.generate(PROMPT, 8)                                   # warm-up: capture, build
        rows.append((scale, loop, eng.generate(PROMPT, 64).ms_per_token * 1000))
print(f"{'host slower by':>14} {'loop':>7} {'us/token':>9}   (simulated)")
for scale, loop, us in rows:
    print(f"{scale:>13}x {loop:>7} {us:>9.1f}")
fig, ax = plt.subplots(figsize=(5.5, 3))
for loop in ("host", "device"):
    ax.plot([r[0] for r in rows if r[1] == loop], [r[2] for r in rows if r[1] == loop], "o-",
            label=f"LAB_LOOP={loop}")
ax.set_xlabel("host cost x measured H200 host")
ax.set_ylabel("us / token")
ax.set_title("host loop vs device loop [simulated]", fontsize=9)
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# The device loop's line is flat, a loop iteration's cost above the host loop's at the
# measured host: its host work is one launch per generation whatever the host costs. The host
# loop's line crosses it once the host's per-step work (the engine's own step and one graph
# submit) exceeds the step's device time plus that iteration cost. On the H200, recorded
# (`decode-lab record device_loop`, paired and interleaved on one engine behind an A/A gate):

# %%
dl = recorded("device_loop.json")
if dl is None:
    print("data/gpu/device_loop.json is not recorded yet: decode-lab record device_loop on a GPU")
else:
    for name in ("plain", "pdl", "fused", "fused+pdl"):
        if name not in dl:   # recorded before the fused step existed
            continue
        print(f"[{name}]")
        show(report.format_ab(dl[name]))
    print("host launches per generate:", dl["launches"], "| bodies:", dl["bodies"])

# %% [markdown]
# One length says little about a loop whose one launch is shared by every token. The same
# recorder times both loops, without and with PDL, at several generation lengths (the four arms
# interleaved on one engine, the order reversed every other rep), and what the FIRST generate
# of a fresh engine costs: the host loop captures and instantiates each plan's graph when the
# position reaches it; the device loop captures every plan's body and instantiates the loop
# graph before its one launch.

# %%
if dl is not None:
    sweep = dl["lengths"]
    arms, lengths = sweep["arms"], sweep["lengths"]
    names = [n for n in arms if n != "tokens identical"]
    print(f"{'tokens':>6} " + " ".join(f"{n:>16}" for n in names) + "  device/host  +pdl")
    for n in lengths:
        us = {a: 1000 * arms[a][str(n)]["mean_ms"] for a in names}
        print(f"{n:>6} " + " ".join(f"{us[a]:>9.1f} ± {1000 * arms[a][str(n)]['sem_ms']:>4.1f}"
                                     for a in names)
              + f"  {us['device loop'] / us['host loop']:>11.3f}"
              + f"  {us['device loop +pdl'] / us['host loop +pdl']:.3f}")
    print("us/token, mean ± sem over", sweep["reps"], "reps; tokens identical across arms:",
          all(arms["tokens identical"].values()))
    fig, ax = plt.subplots(figsize=(5.5, 3))
    for a in names:
        ax.errorbar(lengths, [1000 * arms[a][str(n)]["mean_ms"] for n in lengths],
                    [1000 * arms[a][str(n)]["sem_ms"] for n in lengths], marker="o",
                    ls="-" if a.startswith("host") else "--", label=a)
    ax.set_xscale("log")
    ax.set_xlabel("tokens generated")
    ax.set_ylabel("us / token")
    ax.set_title(report.source_label(dl["source"]), fontsize=8)
    ax.legend(fontsize=7, bbox_to_anchor=(1.02, 1), loc="upper left")   # beside, not over, the data
    fig.tight_layout()
    plt.show()
    first = dl["first"]
    print(f"first generate of {first['tokens']} tokens on a fresh engine (wall ms):")
    print(f"{'loop':<12} {'first':>8} {'steady':>8} {'one-time':>9} {'of it, build':>13}")
    for name, r in first["loops"].items():
        build = f"{r['build_ms']:.1f}" if r["build_ms"] is not None else "-"
        print(f"{name:<12} {r['first_ms']:>8.1f} {r['steady_ms']:>8.1f} {r['one_time_ms']:>9.1f}"
              f" {build:>13}")
    show(f"source: {dl['source']}, {dl['date']}")

# %% [markdown]
# On the H200 the device loop is the SLOWER one, by about one loop iteration's cost per token
# (the difference above, against `floors.loop`): the H200's host keeps up with a device-bound
# step, so there was no host time to save, and the conditional machinery adds device time.
# The one launch pays where the host cannot keep up, and it frees the host thread either way.
# (`decode-lab conformance` holds the simulator's prediction of this difference against the
# recording.) Where conditional nodes are missing (CUDA before 12.8 for SWITCH), or the step is
# not clean (a deliberate bug's host work cannot run inside the loop), the engine refuses with
# a message and runs the host loop:

# %%
import warnings  # noqa: E402

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    DecodeEngine(model, SIM.replace(loop="device", bugs={"ctx_by_value"})).generate(PROMPT, 4)
show(caught[0].message)

# %% [markdown]
# ### What the host can no longer do, and how the lab gets it back
# With the loop on the device the host sees nothing until the launch ends: no token can be
# streamed out as it is made, and the host cannot stop early (at a stop string, or when a user
# cancels). Two standard answers: the device writes its progress into pinned, host-mapped
# memory that the host polls while the graph runs; or the generation is cut into **chunks of K
# tokens, one launch each**, with the host reading the new tokens — and deciding whether to go
# on — between chunks. The lab does the second: `engine.decode(K)` runs K steps in one launch
# from wherever the request is. Here, chunks of 16, stopping at the first blank line:

# %%
eng = DecodeEngine(model, SIM.replace(loop="device"))
ids = eng.encode(PROMPT)
budget, chunk, text = 96, 16, ""
eng.reset(ids, budget)
eng.decode(len(ids) - 1)                                  # the prompt's steps: one launch
launches = 1
while eng.position < len(ids) - 1 + budget and "\n\n" not in text:
    eng.decode(min(chunk, len(ids) - 1 + budget - eng.position))     # one launch per chunk
    launches += 1
    new = model.tokenizer.decode(eng.tokens(eng.position + 1)[len(ids):])
    print(f"launch {launches}: +{new[len(text):]!r}")
    text = new
print(f"stopped after {eng.position - (len(ids) - 1)} of {budget} tokens, {launches} launches "
      f"[simulated]")

# %% [markdown]
# Each chunk costs one host launch instead of K, and the stop check waits at most K tokens.
# K trades the two: K = 1 is the host loop again, K = the whole budget is one launch with no
# early stop.
#
# ### Checking the loop with a race checker, and checking the checker
# `compute-sanitizer --tool racecheck` watches shared memory for hazards between a block's
# threads. Run on the device loop it does not report a hazard: it crashes the process (a
# segmentation fault right after the loop's launch), while the same tokens come out right
# without it. Before concluding anything about the loop, take it apart and run each piece under
# the tool (`decode-lab record sanitize_loop` runs each piece, a process each, all at once):
# a loop with nothing of the model in it, each kernel alone as the body, bodies of chosen kernels in
# chosen orders, and the loop's bodies as ordinary graphs. The H200's answers:

# %%
san = (GPU / "sanitize_loop.txt").read_text().splitlines()
rows = [ln.split(" / ")[0].split() for ln in san
        if ln[:1].isalpha() and ln.split(" / ")[0].split()[-1:] in (["0"], ["1"])
        and len(ln.split(" / ")[0].split()) == 3]
pieces = {piece: int(code) for piece, code, _ in rows}
SEGFAULT = (11, 139)      # the file's header: exit 11 or 139 is a segmentation fault
for piece in ("minimal", "shared", "kernel-embed", "kernel-rmsnorm", "body", "one-body", "loop",
              "kernels-embed-rmsnorm", "kernels-rmsnorm-embed", "kernels-matvec-rmsnorm",
              "kernels-rmsnorm-matvec", "kernels-rmsnorm-matvec-swiglu_up",
              "kernels-matvec-matvec-matvec", "prefix-2-warm", "prefix-2-eager"):
    if piece in pieces:
        code = pieces[piece]
        verdict = ("clean, 0 hazards" if code == 0 else "CRASHED" if code in SEGFAULT
                   else f"FAILED (exit {code})")
        print(f"{piece:<34} exit {code:>3}  {verdict}")
show(f"source: data/gpu/sanitize_loop.txt: {san[0]}")

# %% [markdown]
# Read it as a bisection. The conditional nodes themselves are fine (`minimal`, `shared`: a
# WHILE over a SWITCH with one or two small kernels in the body), and so is every kernel alone.
# What crashes the tool is an order: a kernel that uses shared memory on the GPU (`rmsnorm`,
# whose block reduction goes through shared memory; `matvec` and `swiglu_up` reduce with warp
# shuffles and touch none) placed AFTER another kernel node of the same conditional body. With
# `rmsnorm` first, the same kernels run clean. Neither workaround helps: running the body's
# kernels once before the loop is built (`prefix-2-warm`) or loading every module eagerly
# (`prefix-2-eager`, `CUDA_MODULE_LOADING=EAGER`). The step begins `embed`, `rmsnorm`, so the
# loop cannot be racechecked as a loop on this version of the tool; its bodies can, as ordinary
# graphs (`body`: clean), and that is the race check the loop gets. The tool's crash, with the
# smallest body that triggers it (`--mode kernels --kernels embed,rmsnorm`), is a report for the
# tool's makers, not a hazard in the lab's kernels.
#
# ## What you should now be able to do
# - Follow a plan change three ways — recapture, update the live graph in place, or select the
#   plan on the device with a SWITCH node — and say what each costs on the H200 and when the
#   runtime refuses an update.
# - Keep a per-token value correct under replay either way the corrected lecture allows: in
#   device memory, advanced inside the graph, or as a node parameter updated between launches.
# - Read what a device loop buys (one host launch per generation, a host that is free) and what
#   it costs (each iteration's conditional machinery), and say when the host loop is faster.
# - Give a device-resident generation back its early stop and streaming with chunks of K tokens.
# - When a checking tool fails on a whole program, bisect the program under the tool before
#   blaming either, and say which check the program still gets.

