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
# # 05 — Measurement you can trust
#
# A speed claim in this lab is made the way good engine teams make it:
#
# 1. **both arms in one process**, same weights, same build — the arms differ only by `LAB_*`
#    toggles; arms that differ only in launch toggles run on **one shared engine** (same
#    buffers, same addresses), because identical engine instances differ by their buffers'
#    placement alone (measured on the H200, shown at the end);
# 2. **interleaved**, the order alternated per rep (A B, B A, A B, ...), so slow drift of the
#    machine hits both arms alike, and each difference is **paired** by rep;
# 3. **warm-up excluded** (compilation, capture);
# 4. **A/A first**: A against a second copy of A, interleaved exactly like the A/B. If A already
#    differs from A beyond its noise
#    (paired |t| > 3), or the outputs (token ids, final logits) are not byte-identical, an A/B
#    is not meaningful — whatever its t says;
# 5. every number comes with its **standard error** and its **source** (measured on which GPU,
#    or simulated).
#
# Everything below runs on the CPU simulator (reps and tokens kept small so the notebook runs
# in seconds). Its cost model is built **only from component costs measured on the H200**
# (`data/gpu/kernel_costs.json`: each kernel as a graph node, empty-kernel floors, the host's
# cost per launch, the measured spreads for its noise) and every figure it produces says
# "simulated". Recorded GPU figures, when present, are shown at the end, and the last section
# checks the simulator's predictions against them.
#
# Tables list only the toggles that differ between their arms (each result keeps the full set
# in its arms' `toggles`).

# %%
import glob
import json
import textwrap
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from scipy import stats as st   # a dev extra, like the notebook build itself

from lab import bench, conformance, report, stats
from lab.backend.costmodel import CostModel
from lab.backend.sim import SimBackend
from lab.config import LabConfig
from lab.engine import DecodeEngine
from lab.model import load_model

model = load_model()
SIM = LabConfig(backend="sim")
EAGER, GRAPH = SIM.replace(graph=False), SIM.replace(graph=True)


def show(text):
    print(report.wrapped(text))


narrow = report.narrow


measured = CostModel.load()
show(f"max_seq {model.cfg.max_seq}; cost model: {measured.describe()}")
host = {m: float(np.mean(list(v.values()))) for m, v in measured.host_launch_us.items()}
figures = [("host_launch_us", f"dispatcher {host['dispatcher']:.2f}, "
                              f"prebound {host['prebound']:.2f} us (mean per kernel)"),
           ("graph_submit_us", f"{measured.graph_submit_us:.2f} us per graph launch (host)"),
           ("engine_host_us", f"eager {measured.engine_host_us['eager']:.2f}, "
                              f"graph {measured.engine_host_us['graph']:.2f} us per step (host)"),
           ("graph_launch_us", f"{measured.graph_launch_us:.2f} us per replay (device)"),
           ("empty_node_us", f"{measured.empty_node_us:.3f} us per empty node (device)"),
           ("eager_floor_us", f"{measured.eager_floor_us:.3f} us per empty eager kernel (device)"),
           ("launch_jitter", f"sigma {measured.launch_jitter:.3f} per eager launch (lognormal)"),
           ("node_jitter", f"sigma {measured.node_jitter:.3f} per graph node (lognormal)")]
print(f"{len(measured.kernels)} measured launches (kernel, grid, block, shapes), "
      f"{len(measured.switch_us)} kernel switches; a few figures:")
for name, value in figures:
    print(f"  {name:<16} {value}")
    print(textwrap.fill(f"<- {measured.sources[name]}", 100, initial_indent=" " * 19,
                        subsequent_indent=" " * 22))

# %% [markdown]
# ## A/A first, then A/B
# `run_ab` runs eager against a copy of eager (the A/A gate), then eager against graph, then a
# separate per-token pass (a `clock()` around every step — on a GPU that synchronizes per token,
# so it cannot share the throughput pass) for p50/p99.

# %%
ab = bench.run_ab(model, EAGER, GRAPH, reps=5, tokens=24, per_token=300, names=("eager", "graph"))
aa = ab["aa"]
show(f"A/A: paired t = {aa['t']:.2f}, outputs byte-identical: {aa['outputs_identical']} -> "
     f"{'PASS' if aa['ok'] else 'FAIL: ' + aa['reason']}")
if not aa["ok"]:
    print("(nothing differs between A and A' here: a correct A/A fails by chance about one time "
          "in 25\n at this threshold, see 'How often does a correct A/A fail?' below)")
print()
show(report.format_ab(narrow(ab)))

# %% [markdown]
# ### An A/A that fails
# Give the second copy of A its own engine on a **busy host**: the same measured costs, but every
# host cost three times as slow (`host_scale=3.0`) and each launch's host time scattered far
# more widely (`launch_jitter=1.0`, a lognormal sigma; the measured host's is printed above) —
# another process on the machine, a preempted thread. Every arm here gets its own backend
# (`backend_factory`); only A' (index 1) gets the busy one. A is now "different from itself",
# because its second copy runs on a different, slower host, and the harness refuses to report
# the A/B as meaningful.

# %%
noisy = measured.replace(host_scale=3.0, launch_jitter=1.0)
bad = bench.run_ab(model, EAGER, GRAPH, reps=3, tokens=12, per_token=0, names=("eager", "graph"),
                   backend_factory=lambda cfg, i: SimBackend(noisy if i == 1 else measured, seed=i))
show(report.format_ab(narrow(bad)))

# %% [markdown]
# ### How often does a correct A/A fail?
# The gate is a test, so it has a false-alarm rate: with 5 reps (4 degrees of freedom) a paired
# |t| above 3 happens by chance with probability 2·P(T₄ > 3), about 4%. The gate is only useful
# if the noise it sees is the noise the t-test assumes. `tests/test_bench.py::
# test_aa_false_alarm_rate_is_nominal_over_seeds` runs the first example's A/A (eager, 5 reps ×
# 24 tokens) over 50 simulator seeds and checks that the gate fails no more often than the nominal
# 4% allows (at most the 95th percentile of Binomial(50, 4%)). Here, 20 of those seeds (about a
# second each):

# %%
key = (EAGER.backend, EAGER.kv_dtype, EAGER.bugs, "zeros")
nominal = 2 * st.t.sf(bench.AA_T_THRESHOLD, df=4)
ts = []
for seed in range(20):
    pool = {key: DecodeEngine(model, EAGER, backend=SimBackend(measured, seed=seed))}
    res, _ = bench.run_aa(model, EAGER, reps=5, tokens=24, pool=pool)
    ts.append(res["t"])
alarms = sum(abs(t) > bench.AA_T_THRESHOLD for t in ts)
show("paired t per seed: " + " ".join(f"{t:+.2f}" for t in ts))
show(f"false alarms: {alarms} of {len(ts)} seeds ({alarms / len(ts):.0%}); nominal rate "
     f"{nominal:.1%} -> expected {nominal * len(ts):.1f} of {len(ts)}; at most "
     f"{st.binom.ppf(0.95, len(ts), nominal):.0f} is within the nominal rate's 95th percentile "
     f"(simulated)")

# %% [markdown]
# ## Standard errors of both arms
# Eager decode is **host-bound**: 37 launches per token, each a host submit (pre-bound: the
# `host_launch_us` figure printed at the top), so any slow drift of the host (clock boost,
# another process) moves the eager arm from rep to rep. A graph replay is **device-bound**: one
# submit per token, then the device runs 37 nodes back to back, so host drift hardly reaches it.

# %%
fig, axes = plt.subplots(1, 2, figsize=(10, 3.2))
report.plot(ab, ax=axes)
fig.tight_layout()
plt.show()
print(f"sem eager / sem graph = {ab['sem_ratio_a_over_b']:.0f}x (simulated)")

# %% [markdown]
# Left: the four arms' ms/token — the eager arms close together, the graph arm well below
# them. Right (log scale): each arm's standard error; the captured arm's is more than an order
# of magnitude below the eager arms' (the printed ratio), because the host's drift reaches only
# the arm whose every launch waits for the host.

# %% [markdown]
# ## Context sweep
# Long contexts are reached with `DecodeEngine.seek(position)`: it sets the device position (and
# the host mirror) without computing the positions before it. A step at a sought position does
# the work of a step at that context length — same plan (attention splits), same bytes read —
# so **seek is valid for timing**. The decode at context `c` runs positions `c .. c + tokens - 1`;
# `c + tokens` must stay below `max_seq`, else the sweep refuses with a clear error.

# %%
sweep = bench.run_sweep(model, {"eager": EAGER, "graph": GRAPH}, [64, 256, 512, 1000],
                        reps=3, tokens=8)
show(report.format_sweep(sweep))
report.plot(sweep)
plt.show()
print("simulated, us/token:")
for arm in sweep["arms"]:
    rows = [r for r in sweep["rows"] if r["arm"] == arm]
    ms = [r["mean_ms"] for r in rows]
    print(f"  {arm:<6} last - first context {1000 * (ms[-1] - ms[0]):+7.2f}; max - min "
          f"{1000 * (max(ms) - min(ms)):6.2f}; median sem of a point "
          f"{1000 * float(np.median([r['sem_ms'] for r in rows])):5.2f}")

# %% [markdown]
# The graph arm grows steadily with the context: once the host is out of the way, the
# attention kernels' work (more KV rows per token) is what the step costs. Eager has no such
# reason to grow — its time is the host's, launch by launch, and the attention hides behind it
# (on the H200 it is flat; the recorded sweep is at the end). Its simulated points still move
# between context lengths, by more than their own error bars (compare max − min with the sem
# printed above): each context's reps run back to back, within one stretch of the simulated
# host's slow drift (the measured spread of whole reps, redrawn every `drift_us` of model time),
# so a point's standard error says nothing about the drift *between* points. A sweep's points
# are not paired with each other; only the arms at one context are.

# %% [markdown]
# ## The seek A/A trap
# Seek is **invalid for byte-compares**: attention reads KV rows that were never written, i.e.
# whatever the cache memory held. Two eager engines (the same config: an A/A) at context 900:
# with uninitialised caches (`kv_init="empty"`, memory recycled from earlier tensors) each reads
# *different* garbage, and the A/A byte-compare FAILS — not because anything is wrong with eager
# decoding. With zero-initialised caches both read zeros and the A/A PASSES. (The zeroed outputs
# are still not what a real 900-token context would produce: timing only.)

# %%
def sought(kv_init, position=900, steps=6):
    eng = DecodeEngine(model, EAGER, kv_init=kv_init)
    eng.reset(eng.encode("ROMEO.\n"), 0)
    eng.seek(position)
    for _ in range(steps):
        eng.step()
    return eng.tokens(position + steps + 1)[position + 1:], eng.logits()

for kv_init in ("empty", "zeros"):
    a, b = sought(kv_init), sought(kv_init)
    why = stats.outputs_differ([a], [b])
    show(f"kv_init={kv_init!r:8} A/A at context 900: {'FAIL — ' + why if why else 'PASS'}; "
         f"ids {a[0].tolist()} vs {b[0].tolist()}")

# %% [markdown]
# ## Leave-one-out
# With several optimisations, "what is each one worth?" depends on what else is on. Leave-one-out
# runs all-on, all-off and each-factor-off arms interleaved; a factor's worth is (its-off arm) −
# (all-on), paired by rep. The interaction row is the total minus the sum of the single worths
# (0 if the factors simply add). The all-off arm is checked against a plain baseline — a fresh
# engine with the same config, its reps run back to back — and flagged if the gap is outside
# the noise (interleaving must not change what an arm measures).

# %%
loo = bench.run_loo(model, "GRAPH,SPLIT_COMBINE", base=SIM, reps=4, tokens=16)
show(report.format_loo(narrow(loo)))
report.plot(loo)
plt.show()

# %% [markdown]
# The bars are each factor's worth (± sem): switching the graph off costs by far the most; the
# split combine, switched off with the graph on, next to nothing. The `interaction` bar is not
# zero: the split combine's extra launches cost a host submit each when the step is eager (the
# `-GRAPH` arm above `all-off`), but next to nothing captured, so the two factors do not simply
# add.

# %% [markdown]
# ## Recorded GPU figures
# `scripts/record_gpu_bench.py --out data/gpu` records the same three measurements on a GPU
# (`bench_ab.json`, `bench_sweep.json`, `bench_loo.json`, each with its GPU, versions and date).
# They are shown here next to the simulated ones when present.

# %%
FORMAT = {"bench_ab": lambda r: report.format_ab(narrow(r)), "bench_sweep": report.format_sweep,
          "bench_loo": lambda r: report.format_loo(narrow(r))}
SIMULATED = {"bench_ab": ab, "bench_sweep": sweep, "bench_loo": loo}
recorded = sorted(glob.glob("../data/gpu/bench_*.json"))
if not recorded:
    print("no recorded GPU figures yet (run scripts/record_gpu_bench.py on a GPU)")
for path in recorded:
    name = Path(path).stem
    try:
        rec = json.loads(Path(path).read_text())
        show(f"=== {name}: {rec['source']} — {rec.get('date', '?')}")
        show(FORMAT[name](rec) if name in FORMAT else json.dumps(rec, indent=1)[:2000])
    except Exception as exc:  # a file from another version of the lab: show, do not fail
        show(f"=== {name}: unreadable here ({exc.__class__.__name__}: {exc})")
        continue
    if name in SIMULATED:
        fig = plt.figure(figsize=(11, 3.2))
        if name == "bench_ab":
            fig.set_size_inches(10, 6)
            axes = fig.subplots(2, 2)
            report.plot(rec, ax=axes[0])
            report.plot(SIMULATED[name], ax=axes[1])
        else:
            axes = fig.subplots(1, 2)
            report.plot(rec, ax=axes[0])
            report.plot(SIMULATED[name], ax=axes[1])
        fig.tight_layout()
        plt.show()

# %% [markdown]
# Each figure puts the H200's panels (their titles name the GPU) first, the simulator's after
# them (in the A/B figure: the H200's row above the simulator's). Compare shapes, not only
# levels: on both, the graph arm sits well below eager with a standard error more than an
# order of magnitude smaller; the graph arm grows with the context while the H200's eager arm
# stays flat; the graph factor dominates the leave-one-out. Read the A/A gate line of each A/B table
# too: one slow rep in an A/A arm shows up as that arm's large standard error, and the gate
# judges the paired difference, not the arms' levels. The simulator ran fewer reps and tokens
# than the recordings; the levels it predicts are checked row by row in the last section.

# %% [markdown]
# ## Why arms share one engine
# Identical graph engines — same config, same weights — run interleaved on the H200, each one's
# ms/token with its standard error (`scripts/record_gpu_instances.py`). If instances differ by
# more than their noise, an A/B between two engines would report that difference as an effect
# of the toggle; one engine run twice shows the run-to-run part alone.

# %%
rec = Path("../data/gpu/engine_instances.json")
if rec.exists():
    r = json.loads(rec.read_text())
    show(f"{r['source']} - {r['date']}")
    for e in r["engines"]:
        print(f"  engine {e['engine']}: {e['mean_us']:.2f} ± {e['sem_us']:.2f} us/token (x at {e['x_ptr']})")
    t = r["same_engine_twice"]
    print(f"  spread between instances: {r['spread_us']:.2f} us/token; one engine twice: "
          f"{t['first_mean_us']:.2f} ± {t['first_sem_us']:.2f} then {t['second_mean_us']:.2f} ± {t['second_sem_us']:.2f}")
else:
    print("no recorded instance measurement yet")

# %% [markdown]
# The spread between instances is the steady offset one engine's buffer placement gives its
# steps; one engine run twice reproduces itself far more closely. That is the offset two
# separate engines would carry into an A/B.
#
# ## Does the simulator predict the GPU?
# Every lesson with a recorded GPU figure, re-run on the simulator with the recording's own
# settings (`decode-lab conformance`, `lab.conformance`): the ladder's rungs, the launch and
# node counts, the PDL gain, the overlap cost, fission eager and captured, how much the graph
# step grows from the shortest to the longest context, and each kernel's node time against the
# fit the simulator uses. Since the simulator is built from component costs only, every
# whole-step row is a prediction. A row passes when the sign agrees and the simulated value is
# within 25% of the GPU's — or within 1 us where the GPU effect itself is under 2 us, since an
# effect that small moves, sign included, between processes on the same GPU (notebook 06) —
# and counts agree exactly.

# %%
table = conformance.run(model)
show(conformance.format_report(table))
failed = [r for r in table["rows"] if not r.ok]
print()
print("rows that fail:" if failed else "every row passes")
for r in failed:
    show(f"  {r.lesson}: simulated {r.sim:.4g} vs GPU {r.gpu:.4g} {r.unit} "
         f"(ratio {r.ratio:.2f}; GPU figure from {r.note})")

# %% [markdown]
# Read the table as a list of claims the simulator makes about the H200, each checked against a
# measurement it was not fitted to. The per-kernel node rows check only the fit (the measured
# points it was built from), the whole-step rows check the composition: kernel nodes plus
# switches plus floors for a graph, host costs per launch for eager. A failing row says which
# lesson the simulator's numbers should not be trusted for, and by how much (the ratio). The
# eager rows rest on the host's cost per launch, the least stable figure the recorder measures
# (numba's dispatcher cost about 30 us per launch in one process on the H200 host, over 55 in
# another), so they are the rows to re-check first after a new recording.
