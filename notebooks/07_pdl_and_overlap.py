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
# # 07 — PDL and multi-stream overlap
#
# A CUDA graph replaces the host's submit per launch with one submit per graph. It does not make
# the nodes free: what is left between two dependent kernels is a **device-side gap** — the
# second grid is launched only when the first has finished. Two ways to shrink what remains:
#
# - **PDL (programmatic dependent launch, sm_90+)**: the next kernel may be launched while the
#   current one still runs; it blocks in `griddepcontrol.wait` (our `pdl_wait()`) until its
#   predecessor has completed and its memory is visible. Safe only if every kernel waits
#   before it reads what a predecessor wrote — here the wait is every kernel's first statement,
#   and a static check enforces it. PDL has three pieces, each with its own guarantee (next).
# - **multi-stream overlap**: launches with no data dependency run side by side. Here the k/v
#   projection runs on a side stream while the q projection runs on the main one, forked and
#   joined with events; captured, they become parallel branches of the graph.

# %%
import json
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from lab import DecodeEngine, LabConfig, Step, load_model
from lab.backend import StreamWait
from lab.backend.sim import SimBackend
from lab.measure import bench, conformance, plots, report
from kernels.pdl import LATE_TRIGGER
from lab.pdl_check import late_trigger_violations, wait_first_violations

model = load_model()
cfg = LabConfig()
SIM = LabConfig(backend="sim")


def show(text):
    print(report.wrapped(text))



# %% [markdown]
# ## PDL's three pieces, and what each guarantees
# 1. **The launch attribute**, set on the *dependent's* launch: programmatic stream
#    serialisation (`cudaLaunchAttributeProgrammaticStreamSerialization`; here
#    `LaunchConfig(programmatic_stream_serialization=True)` under `LAB_PDL=1`, and captured as a
#    programmatic graph edge). It allows the dependent to be launched before the kernel ahead of
#    it has finished. It promises nothing about data; without it the stream orders the two
#    kernels as usual and the other two pieces change nothing.
# 2. **The primary's trigger**, `pdl_launch_dependents()` (`griddepcontrol.launch_dependents`):
#    once every block of the primary has triggered or exited, the dependent may launch. A
#    scheduling hint: it neither means the primary is done nor makes its writes visible.
# 3. **The dependent's wait**, `pdl_wait()` (`griddepcontrol.wait`): blocks until the primary
#    has completed and its memory is visible. The only piece that orders data.
#
# So how far a dependent overlaps its predecessor is an opportunity, never something
# correctness may rest on, and work on *other* streams (the overlap below) still needs ordinary
# events. Nor does "the wait returns at once on an ordinary launch" prove that the step's bytes
# are the same with PDL on and off: `tests/backend/test_pdl.py` compares them, on the simulator and on
# a GPU. Where each piece sits in this lab:

# %%
import ast
import inspect
import textwrap

from kernels import REGISTRY


def calls(spec, fn):
    """Does the kernel's source call `fn`?"""
    tree = ast.parse(textwrap.dedent(inspect.getsource(spec.py_func)))
    return any(isinstance(n, ast.Call) and getattr(n.func, "id", None) == fn
               for n in ast.walk(tree))


pdl_graph = DecodeEngine(model, SIM.replace(pdl=True))
pdl_graph.generate("ROMEO.\n", 1)
graph = next(iter(pdl_graph.graphs.values()))
no_trigger = [k for k, s in REGISTRY.items() if not calls(s, "pdl_launch_dependents")]
late = sorted(wait_first_violations())
n = len(REGISTRY)
print(f"1 attribute: on every launch under LAB_PDL=1; captured: "
      f"{'programmatic' if graph.pdl else 'ordinary'} edges, {graph.node_count} nodes (simulated)")
show(f"2 trigger:   {n - len(no_trigger)} of {n} registered kernels call "
     f"pdl_launch_dependents(); not: {no_trigger}")
print(f"3 wait:      {n - len(late)} of {n} registered kernels wait first; not: {late}")
show(f"   trigger after their work, not right after the wait: {list(LATE_TRIGGER)} "
     f"(checked: {late_trigger_violations() or 'all do'})")

# %% [markdown]
# Every kernel a step uses waits first. Most trigger right after the wait, since the trigger
# only lets the next kernel's launch begin; the split-K attention partials trigger after their
# partials, for a reason measured at long context (below, "PDL at long context"). Three
# kernels never trigger: the cost recorder's probes `spin` (meant to hold its stream until it
# ends) and `pos_set`, and `step_persistent`, the whole step in one kernel (LAB_PDL=1 is refused
# with it: it has no node boundary inside a token). One kernel does not wait first: the
# deliberate bug `rmsnorm_late_wait`, which reads before it waits; the static check below names
# it, and the simulator's race report and hazard table show what it does.
#
# ## The static check: is the wait first?

# %%
show(f"kernels whose first statement is not pdl_wait(): {wait_first_violations()}")
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
    show(f"bugs={set(bugs) or '{}'}: {len(eng.backend.races)} races; "
         + (eng.backend.races[0] if eng.backend.races else ""))

# %% [markdown]
# ## Hazards that change the data
# A race report is a warning; wrong tokens are a failure. On a GPU a missing dependency shows
# up only when the hardware happens to run the consumer first. The simulator does not wait for
# luck: issued work sits in queues until something needs its results, then runs in an
# **adversarial order** among those its dependencies allow (`SimBackend(order="adversarial")`,
# the default) — the most recently issued ready work first, so a consumer whose dependency is
# missing runs *before* its producer. Under PDL, a read before `pdl_wait()` sees the
# predecessor's **inputs** (the predecessor has not run yet). `order="issue"` runs everything in
# issue order instead: then the race is still reported, but the data never changes.
#
# Two hazards, each decoded for 24 tokens and compared with a reference (eager, no PDL, issue
# order):
#
# - **late wait under PDL** (`LAB_BUG_LATE_WAIT`): `rmsnorm_late_wait` reads its input `x`
#   before its `pdl_wait()`, while its predecessor (`embed`) writes `x`;
# - **a dropped join** with overlap on: the step's `StreamWait("side", "main")` is filtered out,
#   so `rope_kv_append` on the main stream may read the k/v projection before the side stream
#   has written it.

# %%
PROMPT, N = "ROMEO.\n", 24


class NoJoin(Step):
    """The overlap step with its join dropped: the main stream no longer waits for the side.
    A variant of the step overrides a piece of it (here the whole item list, filtered)."""

    def items(self, plan):
        return iter([x for x in super().items(plan)
                     if not (isinstance(x, StreamWait) and (x.src, x.dst) == ("side", "main"))])


def decode(config, order, step=Step):
    eng = DecodeEngine(model, config, backend=SimBackend(seed=0, order=order), step=step)
    return eng.generate(PROMPT, N), eng


ref, _ = decode(SIM.replace(graph=False), "issue")
n_prompt = len(model.tokenizer.encode(PROMPT))
show(f"reference (eager, no PDL, issue order): {ref.text!r}")
LATE = SIM.replace(bugs={"late_wait"})
CASES = [("late wait, PDL, eager", LATE.replace(graph=False, pdl=True), Step),
         ("late wait, PDL, graph", LATE.replace(pdl=True), Step),
         ("late wait, no PDL, graph", LATE, Step),
         ("dropped join, eager", SIM.replace(graph=False, overlap=True), NoJoin),
         ("dropped join, graph", SIM.replace(overlap=True), NoJoin)]
print(f"{'case':<25} {'order':<12} {'tokens':<24} {'races':>5}  {'text (first 24 chars)'}")
hazards = {}
for name, config, step in CASES:
    for order in ("adversarial", "issue"):
        gen, eng = decode(config, order, step)
        diff = np.flatnonzero(gen.tokens != ref.tokens)
        verdict = f"WRONG from new token {diff[0] - n_prompt + 1}" if diff.size else "= reference"
        hazards[name, order] = (gen, eng)
        print(f"{name:<25} {order:<12} {verdict:<24} {len(eng.backend.races):>5}  "
              f"{gen.text[:24]!r}")
_, eng = hazards["late wait, PDL, graph", "adversarial"]
show(f"race named (late wait): {eng.backend.races[0]}")
_, eng = hazards["dropped join, graph", "adversarial"]
show(f"dropped join, graph mode: capture ledger {eng.ledger_summary()}; "
     f"{next(e.reason for e in eng.ledger if e.outcome == 'fallback')}")

# %% [markdown]
# Read the table row by row. The late wait under PDL gives **wrong tokens** in adversarial order —
# from the very first new token — eagerly and captured, and the race report names the kernel, the
# argument and the predecessor; in issue order the same run reports the same races but decodes
# exactly the reference — a simulator (or a lucky GPU) that runs work in issue order would pass
# this bug. Without PDL the late wait is harmless: nothing runs early. The dropped join is no PDL
# race, so the race report stays empty; it still gives wrong tokens eagerly in adversarial order,
# where `rope_kv_append` runs before the k/v projection it reads. In graph mode the capture
# refuses the unjoined side stream, the engine falls back to eager launches (the ledger above),
# and those give the same wrong tokens. Every correct combination of the toggles stays
# byte-identical in any order (`tests/backend/test_hazards.py` checks all sixteen).

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
    events = eng.backend.timeline
    plots.timeline(events, ax=ax, t0=t0, title=f"one step, {title}")
    span = max(e.dev_end for e in events) - min(e.dev_start for e in events)
    print(f"{title:<16} device busy from first to last kernel: {span:6.1f} us (simulated)")
fig.tight_layout()
plt.show()

# %% [markdown]
# In each panel the dark bar on the host lane is the step's one graph submit; the device lane
# is the step's nodes, attention's two (`attn_partial` red, `attn_combine` orange) the
# longest. With PDL (middle) the same
# nodes sit closer together and the step ends earlier (the printed device spans). With overlap
# (bottom) the fused q/k/v projection becomes two matvecs, the k/v one on the side lane beside
# the q one; but every fork and join costs, the step has more nodes, and the main lane waits for
# the side branch before `rope_kv_append` — the step is no shorter. On this model the side
# branch is too small for running it in parallel to pay for the join.

# %% [markdown]
# ## What each factor is worth: leave-one-out
# All four factors on, each one off in turn, all off — interleaved, paired reps. A factor's
# worth is (its arm with it off) − (all on): what it buys *in the presence of the others*.
# Simulated here (small reps); the H200's table follows.

# %%
loo = bench.run_loo(model, "GRAPH,PDL,OVERLAP,SPLIT_COMBINE", base=cfg, reps=3, tokens=24)
show(report.format_loo(loo))

# %% [markdown]
# ## Recorded on the H200
# Read the A/A line before the A/B line. The arms run on one shared engine (same buffers): on
# the H200, separate but identical graph engines differ by a steady amount, a microsecond or
# two per token, from buffer placement alone (`engine_instances.json`, notebook 05),
# enough to fail the A/A gate and to swamp an effect of overlap's size.
# `decode-lab record overlap`: leave-one-out with 5 paired reps; graph vs graph + PDL with
# the captured graph's edge types (programmatic edges counted through cuda-bindings); graph vs
# graph + overlap.

# %%
for name in ("overlap_loo", "pdl", "overlap"):
    rec = Path(f"../data/gpu/{name}.json")
    if not rec.exists():
        print(f"no recorded {name} yet")
        continue
    r = json.loads(rec.read_text())
    if name == "overlap_loo":
        show(report.format_loo(r))
    else:
        show(report.format_ab(r))
    if name == "pdl":
        print("graph edges:", r["edge_types"],
              f"-> PDL worth {100 * r['pdl_worth_fraction']:.1f}% of the graph arm")
    print()

# %% [markdown]
# ## The simulator's prediction beside the H200
# The conformance check (`lab.measure.conformance`, notebook 05) re-runs each recorded lesson on the
# simulator with the recording's settings, from component costs only (each kernel's node time
# with and without PDL, the measured fork/join cost). Its PDL and overlap rows. PDL is judged as
# the share of the graph step it saves, on the ladder (`ladder.json`, recorded in the same
# process and on the same engine instance as the component costs): the graph step *without* PDL
# moves with buffer placement from engine to engine, and PDL hides most of that, so `pdl.json`,
# recorded in another process, may show a larger gain than the components predict.

# %%
table = conformance.run(model, only=("ladder", "overlap"))   # the lessons shown here
rows = [row for row in table["rows"] if row.lesson.startswith(("graph: ms", "graph+pdl", "PDL",
                                                                  "overlap"))]
w = max(len(row.lesson) for row in rows)
print(f"{'lesson':<{w}} {'unit':<9} {'simulated':>10} {'H200':>10} {'ratio':>6}  verdict")
for row in rows:
    fmt = "10.4f" if row.unit == "ms" else "+10.2f"
    print(f"{row.lesson:<{w}} {row.unit:<9} {row.sim:{fmt}} {row.gpu:{fmt}} "
          f"{row.ratio:>6.2f}  {'PASS' if row.ok else 'FAIL'}")
show(f"H200: {table['gpu_source']}; simulator: {table['cost_source']}")

# %% [markdown]
# ## PDL at long context: where the trigger goes
# A PDL gain measured at one context is a claim about that context. With every kernel
# triggering right after its wait, the H200 records graph + PDL *slower* than the plain graph
# at context 900 while it saves time at 64 (the `trigger early` rows below).
# `decode-lab record pdl_context` finds the edge: the unfused step captured as a chain
# (its `advance` left out, so every step attends over the same context), every launch
# programmatic except one kernel's, arms interleaved. An arm minus graph + PDL is what the edge
# into that kernel saves (positive) or costs (negative). It runs three times, each a process
# with the kernels compiled another way: the lab's kernels (the attention partials trigger
# after their partials), `--trigger early` (every kernel triggers right after its wait, the
# attention partials included), `--trigger none` (no kernel triggers: a dependent launches when
# its predecessor exits).

# %%
def pdl_context(name):
    path = Path(f"../data/gpu/{name}.json")
    return json.loads(path.read_text()) if path.exists() else None


runs = {"lab kernels": pdl_context("pdl_context"), "trigger early": pdl_context("pdl_context_early"),
        "no trigger": pdl_context("pdl_context_none")}
if not any(runs.values()):
    print("not recorded yet: decode-lab record pdl_context --backend cuda --out DIR")
else:
    print(f"{'kernels':<14} {'context':>7} {'graph':>8} {'graph+pdl':>10} {'PDL saves':>10}  "
          f"worst edge (arm - graph+pdl, us/step)")
    for label, res in runs.items():
        for c in (res or {}).get("contexts", []):
            arm = {r["arm"]: r for r in c["rows"]}
            edges = {a[6:]: r["minus_pdl_us"] for a, r in arm.items() if a.startswith("pdl - ")}
            worst = min(edges, key=edges.get)
            print(f"{label:<14} {c['context']:>7} {arm['graph']['us_per_step']:>8.2f} "
                  f"{arm['graph+pdl']['us_per_step']:>10.2f} "
                  f"{arm['graph']['us_per_step'] - arm['graph+pdl']['us_per_step']:>+10.2f}  "
                  f"{worst} {edges[worst]:+.2f}")
    show(f"source: {next(r for r in runs.values() if r)['source']}")

# %%
if runs["lab kernels"] and runs["trigger early"]:
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6), sharey=True)
    for ax, ci in zip(axes, (0, 1)):
        names = runs["lab kernels"]["contexts"][ci]["kernels"]
        x = np.arange(len(names))
        for k, (label, res) in enumerate(r for r in runs.items() if r[1]):
            c = res["contexts"][ci]
            arm = {r["arm"]: r for r in c["rows"]}
            ax.bar(x + (k - 1) * 0.27, [arm[f"pdl - {n}"]["minus_pdl_us"] for n in names],
                   0.27, label=label)
        ax.axhline(0, color="k", lw=0.6)
        ax.set_xticks(x, names, rotation=60, ha="right", fontsize=8)
        ax.set_title(f"context {runs['lab kernels']['contexts'][ci]['context']}")
    axes[0].set_ylabel("us per step: PDL except this kernel\nminus PDL everywhere")
    axes[1].legend(fontsize=8, loc="lower left")
    fig.suptitle("what the edge into each kernel saves (> 0) or costs (< 0) under PDL (H200)")
    fig.tight_layout()
    plt.show()

# %% [markdown]
# The bars show where the trigger matters. With every kernel triggering first, the edge into
# `attn_combine` costs more at context 900 than PDL saves everywhere else: `attn_partial`'s grid
# (n_head, splits) is 4 x 32 = 128 blocks there, nearly one per SM of the H200's 132, and runs
# long. The combine's blocks are launched as soon as every partial block has started; what the
# chains show is consistent with those blocks being placed on the few SMs the partials leave
# free and running there packed (the recording names the edge; it does not observe where the
# blocks went). At context 64 the partials are 4 x 2 blocks and leave the GPU nearly free.
# Triggering after the partials launches the combine when the partial blocks are finishing, and
# PDL pays at both contexts; no trigger at all (a dependent launches when its predecessor
# exits) pays less, since every other edge then overlaps only the launch itself. The kernels that trigger late are listed in
# `kernels/pdl.py` (`LATE_TRIGGER`) and held to it by `lab/pdl_check.py`.
#
# The simulator prices a PDL edge from chains of two adjacent kernels (`switches` in
# `kernel_costs.json`), measured at context 1000 as well as 64 for the unfused step's pairs
# into and out of attention, since the keys there carry the long plan's grid; it records PDL
# launch by launch in a capture, as CUDA does, so it can run the same protocol
# (`lab/measure/pdl_edges.py`) on its own clock. Conformance holds its graph + PDL - graph per
# chained step against the recording at both contexts:

# %%
pdl_table = conformance.run(model, only=("pdl context",))
if not pdl_table["rows"]:
    print("pdl_context.json not recorded yet")
for row in pdl_table["rows"]:
    print(f"{row.lesson.split(': ')[0]:<32} simulated {row.sim:+6.2f}, H200 {row.gpu:+6.2f} "
          f"± {row.gpu_sem:.2f}, ratio {row.ratio:4.2f}  {row.verdict}")
    if row.finding and not row.ok:
        show(f"  finding ({conformance.FINDINGS_FILE}): {row.finding}")
print("(each: graph+pdl - graph per chained step, us/step)")

# %% [markdown]
# Why a chain and not a decode: a chain holds every step at one context and lets one edge be
# left out at a time. It does not hold buffer placement: in this recording both rows are
# findings (printed under each), the chain's graph step WITHOUT PDL running slower than its
# kernels add up to while its graph + PDL step comes close to them. That step without PDL also ran
# some microseconds slower in the lab kernels' process than in the other two (the `graph`
# column of the first table): it moves with buffer placement from engine to engine, and PDL
# hides most of it (notebook 05: the engine-instance A/A and the recorded findings of the
# conformance table). A decode shows the same: the same pass also timed graph and graph + PDL
# as decodes at both contexts (`pdl_sweep.json`, `decode-lab record overlap`, the two arms
# interleaved on one engine), and PDL saves there a little more than it saves in the lab
# kernels' chain:

# %%
sweep_file = Path("../data/gpu/pdl_sweep.json")
if sweep_file.exists():
    sweep = json.loads(sweep_file.read_text())
    ms = {(r["context"], r["arm"]): r["mean_ms"] for r in sweep["rows"]}
    for c in sweep["contexts"]:
        print(f"context {c:>4}: graph {1000 * ms[(c, 'graph')]:6.2f}  graph+pdl "
              f"{1000 * ms[(c, 'graph+pdl')]:6.2f} us/token  -> PDL saves "
              f"{1000 * (ms[(c, 'graph')] - ms[(c, 'graph+pdl')]):5.2f} us/token (decode)")
    show(f"source: {sweep['source']}, {sweep['date']}")
else:
    print("pdl_sweep.json not recorded yet")

# %% [markdown]
# The whole-step rows are predictions: the simulator prices a PDL node from chains of one kernel
# launched with programmatic edges (`node_pdl_us`), a kernel switch from chains of adjacent
# pairs, the overlap from one measured fork/join pair — and adds them up. A passing row says
# the parts add up to the whole; a failing row is a finding, not a rounding error: the whole
# step gains more (ratio below 1) or less (above 1) than its measured parts predict, and the
# ratio says by how much. At the ladder's short context the sign is clear on both: PDL saves
# time, while overlap, on this model, costs time captured: under a microsecond per token in
# its A/B (`overlap.json`), a little more in the leave-one-out beside PDL and the split (both
# printed above).
# PDL's gain is not a constant of the kernels: it depends on where each kernel triggers and on
# how much of the GPU its grid fills (above), so a PDL claim holds for the contexts it was
# measured at.
#
# ## What you should now be able to do
# - Say what PDL overlaps (a dependent kernel's launch and prologue with its predecessor's
#   tail) and the rule that keeps it safe: `pdl_wait()` before the first read of a
#   predecessor's output.
# - Find a wait-first violation with the PDL check, and the race it causes on the simulator.
# - Find which edge makes PDL lose (leave one kernel's edge out at a time) and move that
#   kernel's trigger.
# - Fork and join a step over two streams with events, and measure whether it pays.
# - Attribute several factors with a leave-one-out table, after checking its all-off arm.
