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
# # 08 — Self-check: five exercises with automatic checkers
#
# Each exercise is a spec, a stub to fill in (`# FILL ME IN`) and a checker. The checker runs
# your function against the project's own code — the NumPy twin of a kernel, the engine's launch
# log, `lab.stats`, the capture audit, the replay check — on the CPU simulator, on several cases
# including the edge cases, and prints one line: `PASS`, or `not yet` with the failing case, what
# came back, what was expected and a hint. A wrong or unfinished answer never raises.
#
# Executed as shipped, the stubs are empty and every verdict below is `not yet`. Fill in a stub,
# re-run its two cells. Notebooks 01 (launch bill), 03 (capture audit), 04 (replay bugs) and
# 05 (measurement) hold everything the exercises need.

# %%
import math          # for your solutions: math.inf, math.sqrt, math.copysign

import numpy as np    # for your solutions

from lab.selfcheck import (check_launch_bill, check_merge_partials, check_paired_t,
                           check_replays_needed, check_verdict)

# %% [markdown]
# ## 1. The split-K merge
# Split-K attention cuts a head's context into `splits` slices; block (h, s) runs an online
# softmax over its slice and writes the unnormalised partials. Each slice's `part_o` and `l` are
# relative to **its own** maximum score `m_s`, so the merge rescales them to a common maximum:
#
# - `part_o [n_head, splits, hd]`, `part_ml [n_head, splits, 2]` = (`m_s`, `l_s`)
# - per head: `M = max_s m_s`, `L = sum_s l_s exp(m_s - M)`,
#   `o[h*hd:(h+1)*hd] = sum_s part_o[h, s] exp(m_s - M) / L`
# - returns `o [n_head * hd]`. An empty slice (more splits than context) has `m_s = -inf`,
#   `l_s = 0` and must weigh nothing; slice 0 is never empty.
#
# Checked against `kernels.attention.attn_merge_twin` on partials written by `attn_partial_twin`.

# %%
def merge_partials(part_o, part_ml):
    # FILL ME IN
    return None


# %%
r1 = check_merge_partials(merge_partials)

# %% [markdown]
# ## 2. The launch bill
# Launches per token = kernels/layer × layers (× ranks, for tensor parallelism) + the launches
# outside the layer stack; the per-launch budget is the token time divided by that count — in
# **microseconds** when the token time is in milliseconds.
#
# Checked against `lab.instrument.launch_bill` over the launch log of simulator engines (eager
# and graph, `split_combine` off and on), then with `ranks=2` and `ranks=8`.

# %%
def launches_per_token(kernels_per_layer, layers, other, ranks=1):
    # FILL ME IN
    return None


def per_launch_budget_us(ms_per_token, launches):
    # FILL ME IN
    return None


# %%
r2 = check_launch_bill(launches_per_token, per_launch_budget_us)

# %% [markdown]
# ## 3. The paired t
# A and B measured in interleaved reps: rep i of A and rep i of B share the machine's state, so
# compare them pair by pair. With `d = b - a`: `mean_diff = mean(d)`,
# `sem = sd(d, ddof=1) / sqrt(n)` (the **sample** sd), `t = mean_diff / sem`. When every
# difference is identical (`sem = 0`): `t = 0.0` if `mean_diff == 0`, else `±inf` with its sign.
#
# Checked against `lab.stats.paired_t`.

# %%
def paired_t(a, b):
    # FILL ME IN
    return None


# %%
r3 = check_paired_t(paired_t)

# %% [markdown]
# ## 4. What would a capture freeze?
# The capture audit runs eager steps at many positions and records every host-computed value
# that reaches a launch. Classify one, given its `kind` (`"pointer"`, `"by value"`,
# `"host write"`, `"grid"`, `"block"`, `"kernel"`), its values `{position: value}` and the plan
# keys `{position: key}` (values compare by `str()`):
#
# - `"fine"`: the same value at every step;
# - `"promote to device memory"`: a pointer or by-value argument that changes — judged by its
#   kind, even if it changes only with the plan key — or any host write (a replay never re-runs it);
# - `"capture key"`: a grid, block or kernel that changes, but is constant within every plan key;
# - `"unhandled capture key"`: a grid, block or kernel that changes within one plan key.
#
# Checked against `lab.audit.audit` reports of the clean engine and of `LAB_BUG_FROZEN_KV_ROW`,
# `LAB_BUG_CTX_BY_VALUE`, `LAB_BUG_POS_OUTSIDE_GRAPH`, plus a few synthetic cases.

# %%
def verdict(kind, values_by_step, plan_keys_by_step):
    # FILL ME IN
    return None


# %%
r4 = check_verdict(verdict)

# %% [markdown]
# ## 5. How many replays?
# `lab.verify.replay_check(engine, prompts, replays=n)` byte-compares n graph replays with n
# eager steps. What is the smallest `n` that exposes every frozen-value bug of `lab/bugs.py`?
# The checker runs the replay check with your `n` (it must fail for every frozen bug) and with
# `n - 1` (it must pass for at least one).

# %%
def replays_needed():
    # FILL ME IN
    return None


# %%
r5 = check_replays_needed(replays_needed)

# %% [markdown]
# ## Score

# %%
results = [r1, r2, r3, r4, r5]
print(f"{sum(r.passed for r in results)} of {len(results)} exercises pass")
