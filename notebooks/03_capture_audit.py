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
# # 03 — What a capture freezes
#
# A CUDA graph records each launch with its arguments **by value**: pointers, sizes, loop
# bounds, grid and block dimensions, and the kernel itself. Anything the host computes *per
# token* and passes to a launch is frozen at its capture-time value.
#
# The **capture audit** finds those values before they bite: it runs eager steps at different
# positions and tokens and lists every host-computed value that reaches a launch and differs
# between steps. Each gets a verdict:
#
# - **promote to device memory** — pointers (buffer + offset), by-value sizes and loop bounds,
#   host writes before a step: the kernel must read them from device memory at run time;
# - **capture key** — grid and block dimensions, kernel choice: legitimate per-plan decisions,
#   *handled* when they are constant within each `decode_plan` key (one graph per key).

# %%
from lab.audit import audit, detect_lazy_init
from lab.bugs import BUGS
from lab.config import LabConfig
from lab.engine import DecodeEngine
from lab.model import load_model

model = load_model()
cfg = LabConfig()
report = audit(DecodeEngine(model, cfg))
print(report.summary())

# %% [markdown]
# The clean engine: the only values that change between steps are the attention grids, and
# they change exactly at plan boundaries — the capture key handles them.
#
# ## Three frozen-value bugs, and what the audit says
# Each deliberate bug (`lab/bugs.py`, one `LAB_BUG_*` switch each) smuggles a per-token host
# value into a launch.

# %%
for name in ("frozen_kv_row", "ctx_by_value", "pos_outside_graph"):
    bug = BUGS[name]
    rep = audit(DecodeEngine(model, cfg.replace(bugs={name})))
    print(f"{bug.env}: {bug.what}")
    for v in rep.unhandled[:3]:
        r = v.row()
        print(f"   flagged: launch #{r['launch']} {r['kernel']}.{r['value']} ({r['kind']}), "
              f"{r['distinct']} distinct values, e.g. {r['sample']}")
    print(f"   -> {rep.unhandled[0].verdict}; fix: {bug.fix}\n")

# %% [markdown]
# ## Lazy initialisation: the other way a capture breaks
# Code that initialises on first use (uploads a table, allocates scratch, compiles a kernel)
# works eagerly and fails inside a capture: in global mode those are illegal stream-capture
# operations. The **lazy-init detector** captures from a fresh engine with warm-up skipped, one
# capture per plan key, and reports each initialisation that fired inside a capture: what, where
# (caller site), for which launch, and where the error *showed* — which need not be the launch at
# fault: a swallowed failure shows only at `end_capture`, since capture errors are sticky.

# %%
print(detect_lazy_init(model, cfg).summary().split("\n")[0])
print("(compilation inside a capture is legal; warm-up moves it out of timed regions)\n")
for name in ("lazy_table", "lazy_scratch", "raw_array"):
    rep = detect_lazy_init(model, cfg.replace(bugs={name}))
    f = rep.illegal[0]
    print(f"{BUGS[name].env}:")
    print(f"   {f.kind} of {f.detail} at {f.site}, needed by launch {f.launch_index} ({f.kernel});")
    print(f"   error showed at: {f.surfaced_at}; plan keys hit: {len({g.plan_key for g in rep.illegal})}")
    print(f"   fix: {BUGS[name].fix}\n")
