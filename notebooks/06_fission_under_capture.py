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
# # 06 — Fission under capture: one kernel eagerly, a split once captured
#
# **The claim** (the lecture's §6, corrected edition). A kernel that did several things in one
# launch — in the lecture, the attention combine that merged the per-slice partials and
# projected the result, with one thread walking the slices while its block waited — was the
# right design while every launch was a host submit: a second kernel per layer meant more
# submits per token. Once the decode step was captured as one graph, the same split into a merge
# and a projection became a win. The rule behind it: capture moves most of a launch's price off
# the host (one submit per graph, not one per kernel), but a graph node is not free, so a split
# you once rejected because it "adds a launch" deserves a fresh measurement under capture —
# counting the extra nodes and the traffic between the halves. Whether fusing or splitting wins
# is settled by how launches are paid for, not by the arithmetic.
#
# This notebook tests that claim on the lab's own kernels: first on the case the lecture is
# about (a fused kernel with a serial tail: the fused step's heads tail), then on a fused kernel
# whose tail fills the grid (the fused step's default, the grid tail), then on a split that does
# **not** pay.
#
# ## What one launch costs, eagerly and captured
# Eagerly the host submits every kernel; captured, the host submits the graph once per token and
# each kernel is one node, whose cost is device time. The H200's component measurements
# (`data/gpu/kernel_costs.json`) give both prices:

# %%
import json
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from lab import DecodeEngine, LabConfig, load_model
from lab.backend.costmodel import CostModel, cost_key
from lab.measure import bench, conformance, report
from lab.measure.report import show
from lab.measure.replay_check import decode_after_prompt

model = load_model()
cfg = LabConfig()
FUSED = cfg.replace(fusion=True, attn_tail="heads")   # LAB_FUSION=1 LAB_ATTN_TAIL=heads: §6's case
GPU = Path("../data/gpu")
costs = json.loads((GPU / "kernel_costs.json").read_text())   # components, measured on the H200
fission = json.loads((GPU / "fission.json").read_text())      # whole-step A/Bs, on the H200
L = model.cfg.n_layer

host, floors = costs["host"], costs["floors"]
prices = [("eager, numba's dispatcher", "host submit", host["dispatcher_step_sequence_us"],
           "host.dispatcher_step_sequence_us"),
          ("eager, pre-bound (default)", "host submit", host["prebound_step_sequence_us"],
           "host.prebound_step_sequence_us"),
          ("captured", "graph node", floors["empty"]["per_node_us"], "floors.empty.per_node_us")]
print("what one more launch costs (us per launch):")
for mech, what, us, key in prices:
    print(f"  {mech:<27} {what:<12} {us:>7.2f}   {key}")
print(f"  (captured, the host submits the whole graph once per token: "
      f"{floors['graph_submit_us']:.2f} us, floors.graph_submit_us)")
print(f"a pre-bound host submit costs {prices[1][2] / prices[2][2]:.1f} empty graph nodes")
show(f"measured: {costs['source']} ({costs['date']})")

# %% [markdown]
# ## The fused attention and its split: same bits, more launches
# Under `LAB_FUSION=1` the attention of a layer is one kernel. Which kernel is a toggle,
# `LAB_ATTN_TAIL`; from here to the section on the grid tail, the notebook takes the **heads
# tail** (`LAB_ATTN_TAIL=heads`), the lecture's case. With it the kernel is `attn_fused`
# (`kernels/fused.py`):
# its (head, slice) blocks write the softmax partials; the last block of each head to finish
# merges that head and projects it through its columns of `Wo`; the last head's block sums the
# heads in head order and adds the residual. Everything after the partials is a **serial
# tail**: a few blocks working, behind two count-and-elect steps, while the rest of the grid has
# finished: the lecture's "combine in a grid of n_head blocks". `LAB_SPLIT_COMBINE=1` splits
# it into its three phases as launches of their own
# (`kernels/fused_split.py`): `attn_partial_wide` (the partials alone, the same grid and block),
# `attn_merge` (the merge into `o`) and `attn_project_heads` (each head's `Wo` columns dotted
# with `o`, summed in head order, plus the residual, a warp per row over the whole grid).
#
# The split is bit-identical by construction: the same device functions, the same accumulation
# order, o rounded to float32 at the same point, and no atomics in any result (`attn_fused`'s
# one atomic only *elects* the block that does the tail). A byte-compare is therefore a fair
# test, on the simulator as on the GPU:

# %%
ids = model.tokenizer.encode("ROMEO.\n")
TOKENS = 24


def both_forms(base, tag):
    """`base` without and with LAB_SPLIT_COMBINE, eager: each form's engine and step's launches
    (layer 0's shown), whether their logits over TOKENS tokens are bit-identical, and the
    launches per token the split adds."""
    engines, launches, logits = {}, {}, {}
    for split in (False, True):
        eng = engines[split] = DecodeEngine(model, base.replace(graph=False, split_combine=split))
        logits[split] = decode_after_prompt(eng, ids, TOKENS, graph=False)[0].logits.tobytes()
        step = launches[split] = eng.step_launches(eng.plan(0))
        show(f"{tag} split_combine={int(split)}: {len(step)} launches/token, layer 0: "
             f"{[l.name for l in step if l.layer == 0]}")
    return (engines, launches, logits[False] == logits[True],
            len(launches[True]) - len(launches[False]))


fused_eng, _, same, fused_extra = both_forms(FUSED, "heads tail")
print(f"fused vs fused+split, logits bit-identical over {TOKENS} tokens: {same}")
print(f"the split adds {fused_extra} launches per token "
      f"({fused_extra // L} per layer x {L} layers)")

# %% [markdown]
# ## What the components say, node by node
# `kernel_costs.json` records each kernel as a graph node (chains of one launch; the time per
# node includes the gap to the next) at a ladder of context lengths. Per layer, the fused kernel
# against its three phases, and what each spends after the partials: `attn_fused` minus
# `attn_partial_wide` (the same partial work on the same grid) is the fused kernel's tail;
# `attn_merge` plus `attn_project_heads` is the split's, two node floors included.

# %%
ATT = ("attn_fused", "attn_partial_wide", "attn_merge", "attn_project_heads")
node, grid = {}, {}                      # (kernel, context) -> node us / grid, as recorded
for r in costs["kernels"]:
    if r["kernel"] in ATT:
        node[r["kernel"], r["context"]] = r["node_us"]
        grid[r["kernel"], r["context"]] = r["grid"]
proj_at = sorted(c for k, c in node if k == "attn_project_heads")
proj = float(np.mean([node["attn_project_heads", c] for c in proj_at]))
print(f"node us per layer ({report.source_label(costs['source'])}, kernel_costs.json):")
print(f"{'context':>7} {'splits':>6} {'fused':>7} {'wide':>6} {'merge':>6} {'project':>7}   "
      f"{'fused tail':>10} {'split tail':>10} {'split - fused':>13}")
for c in sorted(c for k, c in node if k == "attn_fused"):
    fz, wide, mg = node["attn_fused", c], node["attn_partial_wide", c], node["attn_merge", c]
    print(f"{c:>7} {grid['attn_fused', c][1]:>6} {fz:>7.2f} {wide:>6.2f} {mg:>6.2f} {proj:>7.2f}"
          f"   {fz - wide:>10.2f} {mg + proj:>10.2f} {wide + mg + proj - fz:>+13.2f}")
show(f"(attn_project_heads is recorded at context {proj_at}: it reads Wo, o and x, never the "
     f"KV cache, so one row serves every context)")

# %% [markdown]
# Every row has the same sign: per layer, the split's two extra nodes plus its merge and
# projection take less device time than the fused kernel's tail. That is the device side. The
# host side is the other half of the sign flip: eagerly, each of the split's launches is a host
# submit, and the decode step is host-bound (notebook 01). Both estimates below come from the
# same file, through the simulator's cost model (`lab/backend/costmodel.py`, built from this
# file alone): the host's pre-bound submits and the engine's own host work per step, each
# kernel's eager device time, and each kernel's node time with the measured extra for
# following another kernel. The graph estimate averages over the contexts the H200 run walked.

# %%
quiet = CostModel.load(GPU / "kernel_costs.json").replace(launch_jitter=0.0)
rng = np.random.default_rng(0)
base_pos = costs["method"]["base_position"]     # the plan whose host costs were recorded


def step_us(eng, pos):
    """(host, eager device, graph device) us of one step at `pos`, from the components."""
    launches, ctx = eng.step_launches(eng.plan(pos)), pos + 1
    prev = [None] + launches[:-1]
    host_us = quiet.engine_step("eager") + sum(quiet.host_launch(l, "prebound", rng)
                                               for l in launches)
    eager_dev = sum(quiet.eager_us(l, ctx, p) for p, l in zip(prev, launches))
    graph_dev = sum(quiet.node_us(l, ctx, False, p) for p, l in zip(prev, launches))
    return host_us, eager_dev, graph_dev


def estimates(engines, names, rec):
    """The eager and graph estimates of B - A (us/token) from the components, printed."""
    eager = {s: step_us(engines[s], base_pos) for s in (False, True)}
    for s in (False, True):
        h, d, _ = eager[s]
        print(f"  eager step, {names[s]:<6} at context {base_pos + 1}: host {h:6.1f} us, "
              f"device {d:6.1f} us -> {'host' if h > d else 'device'}-bound")
    e_est = eager[True][0] - eager[False][0]
    steps = len(engines[False].encode(rec["prompt"])) - 1 + rec["tokens"]
    g_est = float(np.mean([step_us(engines[True], p)[2] - step_us(engines[False], p)[2]
                           for p in range(steps)]))
    print(f"  eager estimate: host(B) - host(A) = {e_est:+.1f} us/token")
    print(f"  graph estimate: node times of B - A, mean over contexts 1..{steps} = "
          f"{g_est:+.1f} us/token")
    return e_est, g_est


fused_est = estimates(fused_eng, ("fused", "split"), fission["fused"]["graph"])
nodes_floor = fused_extra * floors["empty"]["per_node_us"]
print(f"  of which: {fused_extra} extra nodes' floors {nodes_floor:+.1f}; the fused tail removed "
      f"(net of merge, projection) {fused_est[1] - nodes_floor:+.1f}")

# %% [markdown]
# The estimate predicts the sign flip: eagerly a loss (more host submits on a host-bound step;
# the device time the split saves is hidden behind the host), captured a win (the extra nodes'
# floors are small beside the tail they remove).
#
# ## The simulator's paired A/B, eager and captured
# A paired, interleaved A/B in each mode (A = `attn_fused`, B = its split), behind an A/A gate,
# on the simulator: each kernel costs its measured node time, each eager launch its measured
# host time, with the recorded host noise. Read the A/A line first, then the A/B line.

# %%
def ab_lines(label, d, names):
    """The A/B record `d` (a run_ab result or a recording) in three lines."""
    a, b = d["arms"]
    aa = d["aa"]
    if a["toggles"].get("LAB_GRAPH") == "0":      # eager: which launch path the host used
        label += f", LAB_LAUNCH={a['toggles'].get('LAB_LAUNCH', '?')}"
    verdict = "meaningful" if d["meaningful"] else "NOT meaningful: " + d["reason"]
    show(f"[{label}] {names[0]} {a['mean_ms']:.4f} ± {a['sem_ms']:.4f}, {names[1]} "
         f"{b['mean_ms']:.4f} ± {b['sem_ms']:.4f} ms/token")
    show(f"    A/A: A' - A = {1000 * aa['diff_ms']:+.2f} ± {1000 * aa['sem_ms']:.2f} us/token "
         f"-> {verdict}")
    show(f"    B - A = {1000 * d['diff_b_minus_a_ms']:+.2f} ± {1000 * d['diff_sem_ms']:.2f} "
         f"us/token; {a['launches_per_token']} -> {b['launches_per_token']} launches/token, "
         f"{d['reps']} paired reps of {d['tokens']} tokens")


def sim_ab(base, names, reps, tokens):
    """The simulator's paired A/B (B: base with LAB_SPLIT_COMBINE=1) in each mode."""
    out = {}
    for mode in ("eager", "graph"):
        a = base.replace(graph=(mode == "graph"))
        out[mode] = bench.run_ab(model, a, a.replace(split_combine=True), reps=reps[mode],
                                 tokens=tokens, names=names, per_token=0)
        ab_lines(f"{mode}, {report.source_label(out[mode]['source'])}", out[mode], names)
    return out


REC_TOKENS = fission["fused"]["graph"]["tokens"]   # the recording's run length, contexts alike
fused_sim = sim_ab(FUSED, ("fused", "split"), {"eager": 8, "graph": 4}, REC_TOKENS)
for mode, est in zip(("eager", "graph"), fused_est):
    d = fused_sim[mode]
    dev = 1000 * d["diff_b_minus_a_ms"] - est
    print(f"{mode}: simulated - component estimate = {dev:+.1f} us/token "
          f"({dev / (1000 * d['diff_sem_ms']):+.1f} sem)")

# %% [markdown]
# The simulated A/B runs the recording's prompt and token count, with fewer reps and with the
# simulated host's noise; the estimate has no noise, and its eager side prices the host at the
# one plan whose host costs were recorded. The last two lines put the difference between the two
# in units of the A/B's standard error. The eager A/A line shows how far two copies of the same
# arm drift apart on a noisy host: set it beside the size of `B - A` before reading the sign.
#
# ## Recorded on the H200
# The same A/B on the GPU (`decode-lab record costs`, `fission.json["fused"]`), both arms
# on one shared engine (the eager line names the launch path the host used).

# %%
show(f"{fission['source']} - {fission['date']}")
for mode in ("eager", "graph"):
    ab_lines(f"{mode}, H200", fission["fused"][mode], ("fused", "split"))
g, e = (fission["fused"][m] for m in ("graph", "eager"))
print(f"captured: {g['diff_b_minus_a_ms'] / g['diff_sem_ms']:+.0f} standard errors from zero; "
      f"eager: {e['diff_b_minus_a_ms'] / e['diff_sem_ms']:+.1f}")

# %% [markdown]
# ## The simulator's prediction beside the H200
# The conformance check (`lab.measure.conformance`, notebook 05) re-runs each recorded A/B on the
# simulator at the recording's settings, without noise (the model's expectation), and puts it
# beside the recording. Its `fission` lesson has an eager and a captured row for each split;
# the fused step's (heads tail):

# %%
table = conformance.run(model, only=("fission",))   # the lesson this notebook is about
rows = {row.lesson: row for row in table["rows"]}


def conformance_lines(prefix):
    """The rows whose lesson starts with `prefix`; a failing row's recorded finding after them
    (data/gpu/conformance_findings.json: why it fails, as measured)."""
    mine = [row for row in rows.values() if row.lesson.startswith(prefix)]
    print(f"{'lesson':<42} {'unit':<9} {'simulated':>9} {'H200':>8} {'± sem':>6}  verdict")
    for row in mine:
        print(f"{row.lesson:<42} {row.unit:<9} {row.sim:>+9.2f} {row.gpu:>+8.2f} "
              f"{row.gpu_sem:>6.2f}  {row.verdict}")
    for row in mine:
        if row.finding and not row.ok:
            show(f"finding, {row.lesson}: {row.finding}")


conformance_lines("fused fission")
show(f"H200: {table['gpu_source']}; simulator: {table['cost_source']}")

# %% [markdown]
# ## One picture: the sign flips with the launch mechanism
# Split minus fused, in microseconds per token, for each launch mechanism: the simulator's A/B
# above, the H200's recording, and the component estimate (the marker). Error bars are one
# standard error of the paired difference.

# %%
fig, ax = plt.subplots(figsize=(7.5, 3.9))
x = np.arange(2)
bars = [("simulated A/B", fused_sim, "tab:blue"),
        ("H200 recording", fission["fused"], "tab:orange")]
for i, (label, res, color) in enumerate(bars):
    diff = [1000 * res[m]["diff_b_minus_a_ms"] for m in ("eager", "graph")]
    sem = [1000 * res[m]["diff_sem_ms"] for m in ("eager", "graph")]
    bar = ax.bar(x + (i - 0.5) * 0.36, diff, 0.36, yerr=sem, capsize=4, color=color, label=label)
    ax.bar_label(bar, [f"{d:+.1f} ± {s:.1f}" for d, s in zip(diff, sem)], padding=2, fontsize=8)
ax.plot(x, fused_est, "kD", label="component estimate")
ax.axhline(0, color="grey", lw=0.8)
ax.margins(y=0.15)
ax.set_xticks(x, ["eager (host submits)", "graph (nodes)"])
ax.set_ylabel("split - fused, us/token")
ax.set_title(f"attn_fused vs its 3-kernel split, {L} layers\n"
             f"simulated: from the components in kernel_costs.json ({costs['date']})\n"
             f"{report.source_label(fission['source'])}: fission.json "
             f"({fission['date'][:10]})", fontsize=9)
ax.legend(fontsize=8, loc="upper right")
plt.show()

# %% [markdown]
# The same split, the same bits, opposite signs. Eagerly the bars stand above zero: the split's
# extra launches are host submits, and on a host-bound step those are the whole story — the
# device time the split saves is idle time the device would have spent waiting for the host
# anyway. Captured, the bars stand below zero: the host is out of the loop, an extra launch is
# one node's floor, and the split removes the fused kernel's serial tail. The eager recording's
# error bar is the wider one (a host-bound effect on a host whose speed drifts from rep to rep);
# the captured one is barely visible. The simulator, which knows only the components, predicts both
# signs (the conformance rows). A row marked `PASS (2 sem)` is outside the relative band but within
# two of the recording's own standard errors: that recording is too noisy to tell the prediction
# from what it measured, which is why the recorder runs the eager A/B with many paired reps. A
# row marked `FAIL (finding)` misses by more than either allows, and
# `data/gpu/conformance_findings.json` records why, as measured (printed under the table). The
# simulator prices each added launch at its own kernel's recorded host cost (host cost follows a
# kernel's arguments, not its grid); the eager row here is a finding in this recording all the
# same. The recording's process ran the fused eager step about 1.2 times slower than the cost
# file's host costs say, in its A/A and its A/B alike, and the split's added launches, paced by
# the host, cost more in proportion. A fresh process ran the same step at the model's figure
# (`scripts/eager_host_probe.py`, whose printouts sit beside the recordings): the process's
# host moved, not the launches' costs (the finding gives the figures).

# %% [markdown]
# ## The grid tail: one kernel that fills the grid, and its split
# The heads tail loses to its split under capture because its merge and projection run on `n_head`
# blocks while the rest of the GPU idles. The fused step's default tail (`LAB_ATTN_TAIL=grid`, what
# `LAB_FUSION=1` runs unless told otherwise) keeps one launch and drops that reason.
# `attn_fused_grid` (`kernels/fused.py`) is one 1-D grid of `attn_partial`'s 128-thread blocks:
# first the `n_head x splits` partial blocks, then `ceil(D / 4)` tail blocks. Each partial block,
# once its partials are written, counts itself on a device counter (`count_arrival`); each tail
# block loads its rows of `Wo` into registers, waits until the count says every partial is written
# (`wait_arrivals`: a spin on the counter with a nanosleep backoff), then does `attn_combine`'s
# work: the merge, its rows' dots with `o`, the residual. Its bits are the unfused attention's, and
# its split (`LAB_SPLIT_COMBINE=1` with the grid tail) is exactly the unfused attention's two
# launches, `attn_partial` then `attn_combine`: one extra launch per layer, not two. There is no
# serial tail left to remove. Does the split still pay?

# %%
GRID = cfg.replace(fusion=True)                   # LAB_FUSION=1, the default tail: grid
grid_eng, _, same, grid_extra = both_forms(GRID, "grid tail")
print(f"grid tail vs its split, logits bit-identical over {TOKENS} tokens: {same}")
print(f"the split adds {grid_extra} launches per token "
      f"({grid_extra // L} per layer x {L} layers)")

# %% [markdown]
# Node by node (`kernel_costs.json`, the same H200 pass as above): the one kernel against its
# two halves as nodes of their own, with how many blocks of each kind its grid holds, and the
# heads tail's `attn_fused` beside it for scale.

# %%
GT = ("attn_fused_grid", "attn_partial", "attn_combine")
node_pdl = {}                            # (kernel, context) -> node us with PDL, as recorded
for r in costs["kernels"]:
    if r["kernel"] in GT:
        node[r["kernel"], r["context"]] = r["node_us"]
        node_pdl[r["kernel"], r["context"]] = r["node_pdl_us"]
        grid[r["kernel"], r["context"]] = r["grid"]
print(f"node us per layer ({report.source_label(costs['source'])}, kernel_costs.json):")
print(f"{'context':>7} {'partial':>7} {'tail':>4}   {'fused grid':>10} {'partial':>7} "
      f"{'combine':>7} {'split - fused':>13} {'with PDL':>8}   {'heads':>6}")
grid_rows = []
for c in sorted(c for k, c in node if k == "attn_fused_grid"):
    n_part = int(np.prod(grid["attn_partial", c]))
    fg, pa, co = (node[k, c] for k in GT)
    with_pdl = node_pdl["attn_partial", c] + node_pdl["attn_combine", c] - node_pdl[GT[0], c]
    grid_rows.append((c, fg, pa + co, node["attn_fused", c]))
    print(f"{c:>7} {n_part:>7} {grid['attn_fused_grid', c][0] - n_part:>4}   {fg:>10.2f} "
          f"{pa:>7.2f} {co:>7.2f} {pa + co - fg:>+13.2f} {with_pdl:>+8.2f}   "
          f"{node['attn_fused', c]:>6.2f}")
show("(partial, tail: attn_fused_grid's blocks of each kind; with PDL: split - fused from the "
     "chains timed with PDL, node_pdl_us; heads: attn_fused, the heads tail's one kernel)")

# %% [markdown]
# Every row has the same sign again, with PDL or without: the two nodes take less device time
# than the one kernel, though by far less than the heads tail's split saved, and by most at the
# longest contexts, whose grids hold the most partial blocks. The one kernel is far cheaper than
# `attn_fused` at every context.
#
# The step-level estimates, as for the heads tail:

# %%
grid_est = estimates(grid_eng, ("fused", "split"), fission["fused_grid"]["graph"])

# %% [markdown]
# The simulator's paired A/B (A = `attn_fused_grid`, B = `attn_partial` + `attn_combine`), the
# H200's recording of the same pair (`fission.json["fused_grid"]`: plain capture, no PDL, as
# every recording in that file), and their conformance rows:

# %%
grid_sim = sim_ab(GRID, ("fused", "split"), {"eager": 8, "graph": 4},
                  fission["fused_grid"]["graph"]["tokens"])
show(f"{fission['source']} - {fission['date']}")
for mode in ("eager", "graph"):
    ab_lines(f"{mode}, H200", fission["fused_grid"][mode], ("fused", "split"))
conformance_lines("fused grid fission")
g = fission["fused_grid"]["graph"]
print(f"captured, H200: {g['diff_b_minus_a_ms'] / g['diff_sem_ms']:+.0f} standard errors from "
      f"zero, {1000 * g['diff_b_minus_a_ms'] / grid_extra:+.2f} us per extra node")

# %% [markdown]
# ## The grid tail under capture and PDL, on the H200
# The fission recordings run without PDL. With PDL (notebook 07) a node's launch overlaps the
# end of the node before it, and the split's `attn_combine` waits for `attn_partial` in
# hardware (`griddepcontrol.wait`, `pdl_wait` in the kernels) rather than on a counter. The
# H200 also timed the whole step in several arms at a short and a long context
# (`data/gpu/fused_tails.json`, `decode-lab record tails` in the same pass:
# `lab.measure.bench.run_sweep`, means of independent reps, not a paired A/B):

# %%
tails = json.loads((GPU / "fused_tails.json").read_text())   # the GPU's, not the simulator's
show(f"{tails['source']} - {tails['date']}; {tails['reps']} reps x {tails['tokens']} tokens")


def step_name(row):
    """The step an arm ran: unfused, or fused with its tail (and split)."""
    t = row["toggles"]
    if t["LAB_FUSION"] == "0":
        return "unfused"
    return f"fused {t['LAB_ATTN_TAIL']}" + (" + split" if t["LAB_SPLIT_COMBINE"] == "1" else "")


tail = {}                                    # (step, pdl, context) -> (mean us, sem us)
print(f"{'arm':<27} {'step':<18} {'PDL':>3} {'context':>7} {'us/token':>8} {'± sem':>5} "
      f"{'launches':>8}")
for row in tails["rows"]:
    pdl = row["toggles"]["LAB_PDL"]
    tail[step_name(row), pdl, row["context"]] = (1000 * row["mean_ms"], 1000 * row["sem_ms"])
    print(f"{row['arm']:<27} {step_name(row):<18} {pdl:>3} {row['context']:>7} "
          f"{1000 * row['mean_ms']:>8.2f} {1000 * row['sem_ms']:>5.2f} "
          f"{row['launches_per_token']:>8}")


def tail_diff(b, a, c, pdl=("1", "1")):
    """B - A in us/token at context c (PDL of B, of A), the two means' standard errors combined."""
    (mb, sb), (ma, sa) = tail[b, pdl[0], c], tail[a, pdl[1], c]
    return f"{mb - ma:+7.2f} ± {np.hypot(sb, sa):.2f} us/token"


for c in tails["contexts"]:
    print(f"context {c}, graph+pdl:")
    print(f"  fused grid + split - fused grid  {tail_diff('fused grid + split', 'fused grid', c)}")
    print(f"  fused grid - unfused             {tail_diff('fused grid', 'unfused', c)}")
    print(f"  fused heads - fused grid         {tail_diff('fused heads', 'fused grid', c)}")
    print(f"  fused grid, PDL on - PDL off     "
          f"{tail_diff('fused grid', 'fused grid', c, ('1', '0'))}")
print(f"a graph node boundary (kernel_costs.json floors): {floors['empty']['per_node_us']:.2f} us, "
      f"with PDL {floors['empty_pdl']['per_node_us']:.2f} us")

# %%
fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(11, 4))
ctx = [r[0] for r in grid_rows]
for i, (label, color) in enumerate((("attn_fused_grid (one kernel)", "tab:blue"),
                                    ("attn_partial + attn_combine (its split)", "tab:green"),
                                    ("attn_fused (heads tail)", "tab:red")), start=1):
    ax0.plot(ctx, [r[i] for r in grid_rows], "o-", color=color, label=label)
ax0.set_xscale("log")
ax0.set_xlabel("context")
ax0.set_ylabel("node us per layer")
ax0.set_title(f"graph nodes, no PDL: kernel_costs.json ({costs['date']})", fontsize=9)
ax0.legend(fontsize=8)
steps = ["unfused", "fused heads", "fused grid", "fused grid + split"]
w = 0.38
for j, c in enumerate(tails["contexts"]):
    mean = [tail[s, "1", c][0] for s in steps]
    sem = [tail[s, "1", c][1] for s in steps]
    bar = ax1.bar(np.arange(len(steps)) + (j - 0.5) * w, mean, w, yerr=sem, capsize=3,
                  label=f"context {c}")
    ax1.bar_label(bar, [f"{m:.1f}" for m in mean], padding=2, fontsize=7)
ax1.set_xticks(np.arange(len(steps)), steps, fontsize=8)
ax1.set_ylabel("us/token")
ax1.margins(y=0.12)
ax1.set_title(f"whole step, graph+pdl: fused_tails.json ({tails['date'][:10]}, "
              f"{report.source_label(tails['source'])})", fontsize=9)
ax1.legend(fontsize=8, loc="upper left")
fig.tight_layout()
plt.show()

# %% [markdown]
# Left, device time per layer: the grid tail's one kernel sits far below the heads tail's at every
# context, and still above its own two halves as two nodes. Right, the whole step on the GPU under
# capture and PDL: the heads tail is the slowest arm, the grid tail beats the unfused step at the
# short context and not at the long one, and the grid tail's split beats everything at both. So even
# the one-kernel form that fills the grid loses to its split once the step is captured, on this GPU:
# without PDL in the fission recording, and in this sweep with PDL, at both contexts (the
# differences printed above). Eagerly the split loses, as the simulator says (one more host
# submit per layer on a host-bound step): the recording's 40 paired reps resolve that
# difference, and its conformance row (above) sets it against the simulated figure. On a host
# whose speed drifts, a host-bound difference of this size takes many paired reps: its standard
# error shrinks only as one over the square root of their number.
#
# Why, as these measurements read: inside one kernel, the tail blocks learn that the partials
# are written by polling a counter, a memory round trip per read with a nanosleep between reads,
# and only then merge. Between two nodes the same hand-off is a node boundary, about the floor
# printed above, and under PDL `attn_combine` is already launched while `attn_partial` runs and
# waits in hardware (`griddepcontrol.wait`), released without a poll. The spin and merge inside
# the kernel cost more than that boundary. The heads tail's split wins by much more because
# what it removes is worse: a tail on `n_head` blocks. What the grid tail shows is that fusing
# across a grid-wide dependency costs time here, where the hardware already provides a cheaper
# wait between launches; whether it would on another GPU, or with a cheaper wait, is a fresh
# measurement, not a rule.

# %% [markdown]
# ## Where fission does not pay: the unfused combine
# The unfused step (`LAB_FUSION=0`) has a split too: its combine, `attn_combine` (every block
# re-merges all heads into shared memory, then computes its rows of `Wo · o` plus the residual),
# against `attn_merge` then `matvec_residual`. Bit-identical again, one more launch per layer:

# %%
unf_eng, unf_launches, same, unf_extra = both_forms(cfg, "fusion=0")
print(f"logits bit-identical over {TOKENS} tokens: {same}")
print(f"fission adds {unf_extra} launches per token (one per layer)")

# %% [markdown]
# The same components as for the fused pair: per layer, node times (`kernel_costs.json`) of the
# one kernel against the merge and the `Wo` matvec, then the step-level estimates.

# %%
layer0 = [l for l in unf_launches[True] if l.layer == 0]
wo_key = cost_key(layer0[[l.name for l in layer0].index("attn_merge") + 1])  # x += Wo o
wo = float(np.mean([r["node_us"] for r in costs["kernels"] if r["key"] == wo_key]))
comb = {r["context"]: r["node_us"] for r in costs["kernels"] if r["kernel"] == "attn_combine"}
print(f"node us per layer ({report.source_label(costs['source'])}, kernel_costs.json):")
print(f"{'context':>7} {'attn_combine':>12} {'attn_merge':>10} {'Wo matvec':>9} "
      f"{'split - combine':>15}")
for c in sorted(comb):
    print(f"{c:>7} {comb[c]:>12.2f} {node['attn_merge', c]:>10.2f} {wo:>9.2f} "
          f"{node['attn_merge', c] + wo - comb[c]:>+15.2f}")
unf_est = estimates(unf_eng, ("combine", "split"), fission["graph"])

# %% [markdown]
# The components predict a loss in **both** modes: eagerly the same host submits as before; and
# captured, the split's nodes cost more than the kernel they replace, because `attn_combine`
# has no serial tail to remove. Its merge is done redundantly but in parallel by every block,
# and its projection already spreads over the grid; the split only adds a node's floor and a
# merge kernel, and nothing on this model's small combine wins that device time back.
#
# The simulator's A/B and the H200's recording of this pair, then their conformance rows:

# %%
unf_sim = sim_ab(cfg, ("combine", "split"), {"eager": 6, "graph": 3}, 32)
show(f"{fission['source']} - {fission['date']}")
for mode in ("eager", "graph"):
    ab_lines(f"{mode}, H200", fission[mode], ("combine", "split"))
conformance_lines("fission (")
per_node = {k: 1000 * d["graph"]["diff_b_minus_a_ms"] / n for k, d, n in
            (("unfused", fission, unf_extra), ("fused heads", fission["fused"], fused_extra),
             ("fused grid", fission["fused_grid"], grid_extra))}
print("captured, H200, B - A per extra node: "
      + ", ".join(f"{k} {us:+.2f} us" for k, us in per_node.items()))

# %% [markdown]
# So the lecture's rule holds in its honest form: capture changes the *price* of a launch — a
# host submit becomes a node — and with it which shape wins, but it does not decide by itself.
# Where a kernel carries a serial tail (the heads tail), the split removes latency the extra
# nodes cost less than, and it wins once captured while still losing eagerly. Where the kernel
# fills the grid but makes some of its blocks wait for the others (the grid tail), the split
# still wins captured on this GPU, by less per node: a node boundary, and under PDL a wait in
# hardware, cost less than the kernel's own wait. Where neither holds (the unfused combine),
# each extra node is device time with nothing to win back, and the split loses in both modes —
# by less captured than eagerly. Re-measure each verdict when the kernels, the model or the
# launch mechanism change.
#
# ## What you should now be able to do
# - Split a kernel into launches without moving a bit (same device functions, same accumulation
#   order, no atomics in a result) and prove it with a byte-compare.
# - Price a launch under each mechanism from the component measurements (a host submit eagerly,
#   a node's device time captured) and say when an eager step is host-bound.
# - Estimate both sides of a fission's sign flip from components — extra host submits eagerly;
#   extra node floors against the serial tail removed, captured — before measuring it.
# - Check the estimate with a paired A/B behind an A/A gate in each mode, read its sign and
#   standard error, and hold the simulator's prediction against a GPU recording.
# - Tell a split that wins under capture (it removes a serial tail, or an in-kernel wait that
#   costs more than a node boundary) from one that does not (it only adds nodes), with the
#   numbers to show which is which.
