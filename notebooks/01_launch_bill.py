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
# # 01 — The launch bill
#
# A decode step of a small model is dozens of tiny kernels. Before optimising any of them, count
# the bill:
#
# **launches per token = (kernels per layer × layers + the kernels outside the layers) × ranks**
#
# and the **per-launch budget = step time / launches per token**. If the budget is close to
# what the host needs to *submit* one launch, the GPU is waiting on the host, and no kernel
# tuning helps; removing launches (fusion), their host cost (a cheaper launch path), or the
# per-kernel submit altogether (CUDA graphs) does. The lecture's rule of thumb is about this
# budget: **once it is under ~10 us per launch, capture is worth doing** — submitting one launch
# costs the host several microseconds even on a fast path, so at that budget the submits are a
# large share of the step. And the budget only shrinks as the kernels get faster: the launches
# stay, so the bill becomes a larger share of a smaller step.

# %%
import json
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from lab import DecodeEngine, LabConfig, load_model
from lab.backend.instrument import LaunchBill, launch_bill
from lab.measure import bench, plots, report
from lab.measure.report import show

model = load_model()
RANKS = 1   # this lab runs on one GPU; tensor parallelism would multiply the bill per rank
GPU = Path("../data/gpu")


def recorded(name):
    """A recorded GPU file (data/gpu/NAME.json) as a dict, or None when it is not there."""
    path = GPU / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


# %% [markdown]
# ## Count it from the launch log
# The engine records every launch. One step's log, grouped by layer:

# %%
MODES = {"eager (dispatcher)": LabConfig(graph=False, launch="dispatcher"),
         "eager (prebound)": LabConfig(graph=False),          # LAB_LAUNCH's default: prebound
         "graph": LabConfig(graph=True)}
bills = []
for mode, cfg in MODES.items():
    eng = DecodeEngine(model, cfg)
    eng.generate("ROMEO.\n", 16)                      # warm-up: compile, prepare, capture
    gen = eng.generate("ROMEO.\n", 128)
    step = next(r.step for r in reversed(eng.log.records) if r.kind in ("eager", "capture"))
    bills.append(launch_bill(eng.log, step, mode, gen.ms_per_token, gen.source))
    if mode == "eager (prebound)":
        show(f"kernels in layer 0: {[r.kernel for r in eng.log.for_step(step) if r.layer == 0]}")
        show(f"outside the layers: {[r.kernel for r in eng.log.for_step(step) if r.layer is None]}")
b = bills[0]
print(f"\n({b.kernels_per_layer} kernels/layer x {b.layers} layers + {b.other_kernels}) "
      f"x {RANKS} rank = {b.launches_per_token} launches/token")

# %% [markdown]
# ## The lecture's worked example: 93 layers
# The same arithmetic on the engine the lecture describes (its figures, a historical report,
# not measured here): about 30 kernel launches per layer, 93 layers, each tensor-parallel rank
# issuing its own launches — so the count below is per rank — at the 21 and 26 tokens/s the
# engine reached before capture. The budget comes from the lab's own `LaunchBill`, the launch
# count from the formula above.

# %%
BUDGET_RULE_US = 10.0    # the lecture's rule of thumb: under ~10 us per launch, capture pays
LECTURE = {"kernels_per_layer": 30, "layers": 93, "other_kernels": 0}   # per rank
n93 = (LECTURE["kernels_per_layer"] * LECTURE["layers"] + LECTURE["other_kernels"]) * RANKS
print(f"the lecture's engine: {LECTURE['kernels_per_layer']} kernels/layer x {LECTURE['layers']} "
      f"layers + {LECTURE['other_kernels']} = {n93} launches/token per rank")
for tok_s in (21, 26):
    bill = LaunchBill(f"lecture, {tok_s} tok/s", **LECTURE, launches_per_token=n93,
                      ms_per_token=1000.0 / tok_s, source="the lecture's report (not measured)")
    side = "above" if bill.us_per_launch > BUDGET_RULE_US else "under"
    print(f"  {tok_s} tok/s: {bill.ms_per_token:.1f} ms/token / {n93} launches = "
          f"{bill.us_per_launch:.1f} us per launch ({side} the ~{BUDGET_RULE_US:.0f} us line)")
print(f"  the budget reaches {BUDGET_RULE_US:.0f} us at "
      f"{1e6 / (n93 * BUDGET_RULE_US):.1f} tok/s: every gain in speed brings the bill closer")

# %% [markdown]
# At both speeds each launch may still take more than 10 us, so the bill is not yet the step —
# but the launches do not shrink as the kernels speed up, and a few more wins put the budget
# under the line, where the host's submits dominate. That engine captured its decode step into
# one graph per rank. This lab's step is tiny by comparison: its pre-bound budget is at the
# line from the start (the bills above, and the H200's below).

# %% [markdown]
# ## The bill, eager and captured
# "Eager" means one host launch per kernel. It now comes in two launch mechanisms
# (`LAB_LAUNCH`): numba's **dispatcher**, which types and flattens every argument at every
# launch, and the **pre-bound** path (the default), which prepares each kernel's handle and
# flattened arguments once per plan and then only submits. Unless a notebook says otherwise,
# *eager* in this lab is the pre-bound path. With the graph the launch count per token is the
# same — but the host pays one submit per graph instead of one per launch, so the per-launch
# budget collapses. It does not reach zero: a replay still pays its submit, and each node its
# run time and the gap before it. (In graph mode the launches were counted when the step was
# captured.)

# %%
print(f"{'mode':<18} {'launches/token':>14} {'ms/token':>9} {'us/launch':>9}  source")
for b in bills:
    print(f"{b.mode:<18} {b.launches_per_token:>14} {b.ms_per_token:>9.4f} {b.us_per_launch:>9.2f}"
          f"  {report.source_label(b.source)}")
show(f"source: {bills[0].source}")
ax = plots.bill_bars(bills)
ax.set_title(f"launch bill [{report.source_label(bills[0].source)}]", fontsize=9)
ax.tick_params(axis="x", labelsize=8)
plt.show()

# %% [markdown]
# The three bars have the same launch count; only what each launch costs the host differs. The
# dispatcher's bar is the tallest by far: its per-launch budget is the host's cost of typing and
# flattening every argument. The pre-bound bar is several times lower — the same 37 launches,
# each now only a submit. The graph bar is lowest: the host submits once per token and the
# device runs the nodes back to back, so its "us/launch" is device time per node, not host
# time. (These figures are the simulator's; the H200's follow.)

# %% [markdown]
# ## What the H200 measured
# Recorded by `decode-lab record decode` on the project's H200 (interleaved, paired reps): eager
# (the launch mechanism is printed with each arm) against graph.

# %%
r = recorded("decode_eager_vs_graph")
if r is not None:
    show(f"{r['source']} - {r['date']}")
    for arm in r["arms"]:
        launch = arm["toggles"].get("LAB_LAUNCH", "dispatcher")
        how = f"graph" if arm["toggles"].get("LAB_GRAPH") == "1" else f"eager, {launch}"
        print(f"  {arm['name']:<6} ({how}) {arm['launches_per_token']} launches/token, "
              f"{arm['mean_ms']:.4f} ± {arm['sem_ms']:.4f} ms/token -> "
              f"{arm['us_per_launch']:.2f} us/launch")
else:
    print("no recorded GPU figures yet")

# %% [markdown]
# ## The launch-mechanism ladder
# The same decode, one rung at a time (`bench.LADDER`): each rung removes one host cost. The
# launch rungs differ only in launch toggles, so they run interleaved on **one engine** (the same
# buffers), their reps paired, and their outputs byte-compared. The last rung, `persistent`, is
# the step itself made one kernel (`LAB_PERSISTENT=1`, notebook 10): it runs on an engine of its
# own (its weights are stacked for the one kernel), in the fused step's arithmetic, so only its
# token ids are compared with the others'. First on the simulator, whose costs are built only
# from component measurements (`data/gpu/kernel_costs.json`: single kernels, empty-kernel floors,
# host cost per launch) — never from a whole-step recording — so each rung below is a
# *prediction*, except where it is marked as priced by a stand-in: a kernel the cost file has no
# recording of gets a placeholder price (the empty-node floor plus its bytes over a fitted
# bandwidth), which predicts nothing.

# %%
SIM = LabConfig(backend="sim")
sim_ladder = bench.run_ladder(model, SIM, reps=3, tokens=32)
gpu_ladder = recorded("ladder")


def ladder_table(sim, gpu):
    """Rung by rung: the simulator's ms/token beside the H200's (when recorded)."""
    s_arms = {a["name"]: a for a in sim["arms"]}
    g_arms = {a["name"]: a for a in gpu["arms"]} if gpu else {}
    print(f"{'':<11} {'--- simulated ---':^28}   {'--- measured (H200) ---':^28}".rstrip())
    print(f"{'rung':<11} {'ms/token':>9} {'± sem us':>8} {'us/launch':>9}   "
          f"{'ms/token':>9} {'± sem us':>8} {'us/launch':>9} {'sim/GPU':>8}")
    stand_ins = set()
    for name, _, _ in bench.LADDER:
        s = s_arms[name]
        mark = "*" if s.get("stand_in") else " "
        stand_ins.update(s.get("stand_in", ()))
        line = (f"{name:<11}{mark}{s['mean_ms']:>9.4f} {1000 * s['sem_ms']:>8.2f} "
                f"{s['us_per_launch']:>9.2f}   ")
        if name in g_arms:
            g = g_arms[name]
            line += (f"{g['mean_ms']:>9.4f} {1000 * g['sem_ms']:>8.2f} {g['us_per_launch']:>9.2f} "
                     f"{s['mean_ms'] / g['mean_ms']:>8.2f}")
        else:
            line += f"{'(not recorded)':>28}"
        print(line)
    if stand_ins:
        show(f"* simulated from a STAND-IN, not a prediction: the cost file has no recorded cost "
             f"for {', '.join(sorted(stand_ins))} (decode-lab record costs records it on a "
             f"GPU)")
    for label, res in (("simulated", sim), ("measured", gpu)):
        if res is None:
            continue
        counts = {(a["launches_per_token"], a["nodes_per_graph"]) for a in res["arms"]}
        outputs = f"outputs {'byte-identical' if res['outputs_identical'] else 'DIFFER'}"
        if any(a["toggles"].get("LAB_PERSISTENT") == "1" for a in res["arms"]):
            outputs += (" within each arithmetic, token ids "
                        + ("identical" if res["token_ids_identical"] else "DIFFER") + " across all")
        show(f"{label}: {res['reps']} reps x {res['tokens']} tokens; (launches/token, "
             f"nodes/graph) per rung: {sorted(counts)}; {outputs}; "
             f"source: {res['source']}" + (f" ({res['date']})" if label == "measured" else ""))


ladder_table(sim_ladder, gpu_ladder)

# %% [markdown]
# `us/launch` is the per-launch *budget* (ms/token ÷ launches per token), wall time: for the
# eager rungs that is mostly host time, for the graph rungs device time per node. Below, the two
# side by side: one bar per source per rung, on a log axis (the rungs span more than an order
# of magnitude).

# %%
rungs = [name for name, _, _ in bench.LADDER]
series = [(gpu_ladder, "#1f77b4")] if gpu_ladder else []
series.append((sim_ladder, "#ff7f0e"))
fig, ax = plt.subplots(figsize=(8, 3.8))
width = 0.8 / len(series)
for j, (res, color) in enumerate(series):
    arms = {a["name"]: a for a in res["arms"]}
    have = [i for i, n in enumerate(rungs) if n in arms]   # a recording may lack a newer rung
    x = np.array(have) + (j - (len(series) - 1) / 2) * width
    ms = [arms[rungs[i]]["mean_ms"] for i in have]
    label = report.source_label(res["source"])
    label += (f" ({res['date'][:10]})" if label != "simulated"
              else " (prediction from kernel_costs.json)")
    sem = [arms[rungs[i]]["sem_ms"] for i in have]
    bars = ax.bar(x, ms, width, yerr=sem, capsize=3, color=color, label=label)
    for bar, i, v, e in zip(bars, have, ms, sem):
        hatch = arms[rungs[i]].get("stand_in")
        if hatch:
            bar.set_hatch("//")
        ax.annotate(f"{v:.3f}" + ("\nstand-in" if hatch else ""),
                    (bar.get_x() + bar.get_width() / 2, (v + e) * 1.06), ha="center",
                    va="bottom", fontsize=7)
ax.set_xticks(range(len(rungs)), rungs)
ax.set_yscale("log")
lows = [a["mean_ms"] for res, _ in series for a in res["arms"]]
ax.set_ylim(min(lows) / 3, max(lows) * 3)
ax.set_ylabel("ms / token (± sem), log scale")
ax.set_title("launch-mechanism ladder: measured beside simulated", fontsize=9)
ax.legend(fontsize=7, loc="upper right")
fig.tight_layout()
plt.show()
for res, _ in series:
    ms = {a["name"]: a["mean_ms"] for a in res["arms"]}
    stand_in = {a["name"] for a in res["arms"] if a.get("stand_in")}
    have = [n for n in rungs if n in ms]
    steps = ", ".join(f"{a} / {b} = {ms[a] / ms[b]:.2f}x"
                      + (" (a stand-in)" if {a, b} & stand_in else "")
                      for a, b in zip(have, have[1:]))
    label = "simulated" if report.source_label(res["source"]) == "simulated" else "H200"
    show(f"{label:<10} {steps}")

# %% [markdown]
# Read the chart from left to right: each launch rung is lower than the one before it, on both
# sources, and the printed ratios say by how much. The two large steps are from the dispatcher
# to pre-bound (the same launches, much less host work per launch) and from pre-bound to graph
# (the per-kernel submit is gone); PDL is the small last step of the launch rungs. Where the two
# bars of a rung differ, the simulator's prediction from component costs misses the whole-step
# measurement by that much; notebook 05's conformance table puts a verdict on each rung the
# recording has. The persistent rung is another kind of step: whether one kernel whose phases
# wait on counters beats a graph of 37 nodes is what its recording says (the simulator prices it
# from that kernel's own recorded node time, so its bar is a consistency check, not a
# prediction).
#
# What each rung removes (`bench.LADDER`):

# %%
for name, toggles, what in bench.LADDER:
    show(f"{name:<11} {what}")

# %% [markdown]
# - **dispatcher**: every launch goes through numba's dispatcher, which types and flattens every
#   argument, every time. On the H200 host this cost tens of microseconds per launch (the
#   table below prints it within a step's sequence; the figure moves from process to process),
#   so 37 launches are milliseconds per token of pure host work: about the whole step (the
#   table's host share on the dispatcher rung).
# - **prebound** removes the typing and flattening: the kernel handle and the flattened argument
#   list are prepared once per plan, and each launch is one submit through `cuda.core`. One host
#   submit per kernel remains — several microseconds, in a budget near the ~10 us line — so
#   the step is still **host-bound**: the device finishes each kernel before the host has
#   submitted the next.
# - **graph** removes the per-kernel submit: the host submits once per token, and the device runs
#   the 37 nodes back to back. The step is now **device-bound**; what is left per node is the
#   kernel's own time plus the gap between two dependent nodes.
# - **graph+pdl** shrinks that gap: with programmatic edges each node's launch overlaps its
#   predecessor's tail, and the node waits (`pdl_wait()`) only before it reads (notebook 07).
# - **persistent** removes the node boundaries themselves: the whole step is one cooperative
#   kernel (`LAB_PERSISTENT=1`, notebook 10, section 7), one launch and one graph node per
#   token, each phase waiting on a counter in global memory for the data it reads instead
#   (20 waits a token, no grid barrier). A wait is a round trip through L2, which can cost
#   more than a node boundary under PDL (notebook 10, section 7, times each phase), so what it
#   wins is the launches' latency and tails, and only where its waits cost less than that.
#
# How much of each rung's budget the host takes: the host cost per launch measured on the H200
# (`kernel_costs.json`: each mechanism's host time per launch within a step's sequence of
# launches; a graph's one submit per token spread over its kernels) against the rung's budget
# on the ladder above (`ladder.json`, recorded in the same process):

# %%
costs = recorded("kernel_costs")
if costs is not None and gpu_ladder is not None:
    host, n = costs["host"], costs["launches_per_token"]
    budget = {a["name"]: a["us_per_launch"] for a in gpu_ladder["arms"]}
    per_kernel = {"dispatcher": host["dispatcher_step_sequence_us"],
                  "prebound": host["prebound_step_sequence_us"],
                  "graph": costs["floors"]["graph_submit_us"] / n,
                  "graph+pdl": costs["floors"]["graph_submit_us"] / n}
    print(f"{'rung':<11} {'host us/launch':>14} {'budget us':>9} {'host share':>10}  "
          f"host cost from kernel_costs.json")
    for name, us in per_kernel.items():
        key = ("floors.graph_submit_us / launches_per_token" if name.startswith("graph")
               else f"host.{name}_step_sequence_us")
        print(f"{name:<11} {us:>14.2f} {budget[name]:>9.2f} {us / budget[name]:>10.0%}  {key}")
    eh = costs["engine_host_us"]
    print(f"plus the engine's own host work per step: eager {eh['eager']:.1f} us, "
          f"graph {eh['graph']:.1f} us (engine_host_us)")
    show(f"source: {costs['source']} ({costs['date']})")
else:
    print("no recorded component costs yet")

# %% [markdown]
# On both eager rungs the host's cost per launch is about the whole budget (the printed host
# share): the step is the host's submits, whichever mechanism issues them. The pre-bound budget
# is at the ~10 us line (the `budget us` column here, and the eager-vs-graph recording above),
# where the rule of thumb says capture pays — and the graph rung is the proof. (The
# dispatcher's budget is far above the line only because its own host cost inflates the step:
# the rule is a quick test, the host share is the diagnosis.) A graph's single submit, spread
# over 37 kernels, is a small fraction of a microsecond per kernel, paid once per token while
# the device works: the graph rungs are set by the device, the eager rungs by the host. To go
# below the pre-bound rung you must stop paying the host per kernel.

# %% [markdown]
# ## What you should now be able to do
# - Count a step's launches: kernels per layer × layers + the kernels outside the layers, and
#   with ranks (k × layers + other) × ranks, as the engine's own bill counts them.
# - Divide a step's time by its launches to get the per-launch budget, and compare it with the
#   host's cost per launch to say whether the step is host-bound and whether capture pays.
# - Say what each rung of the launch ladder removes (per-launch typing, the per-launch submit)
#   and where each rung's figure came from.
