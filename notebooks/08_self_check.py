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
# # 08 — Self-check: five exercises and the lecture's ten questions
#
# Each exercise is a spec, a stub to fill in (`# FILL ME IN`) and a checker. The checker runs
# your function against the project's own code — the NumPy twin of a kernel, the engine's launch
# log, `lab.measure.stats`, the capture audit, the replay check — on the CPU simulator, on several
# cases including the edge cases, and prints one line: `PASS`, or `not yet` with the failing case,
# what came back, what was expected and a hint. A wrong or unfinished answer never raises. Calling
# the project's own implementation from your function (`lab.measure.stats.paired_t`,
# `attn_merge_twin`, ...) is noticed, and fails the check.
#
# Executed as shipped, the stubs are empty and every verdict below is `not yet`. Fill in a stub,
# re-run its two cells. Notebooks 01 (launch bill), 03 (capture audit), 04 (replay bugs) and
# 05 (measurement) hold everything the exercises need.
#
# The second half asks the lecture's ten self-check questions, each with an answer you can check
# (a letter, a list of letters, or for q4 a number and letters). An answer and why come only
# after you have attempted that question. `decode-lab selfcheck` checks all fifteen from files.
#
# A local self-check is for self-assessment, not an exam. Your attempts are kept in a file on
# your own machine, and the key ships with the lab (sealed, but the program must open it to grade
# you): a student who makes up a second name and answers anything under it can read that
# question's answer, and then pass under their own. Nothing stops that but the point of the
# exercise: a first attempt of your own tells you what you know.

# %%
import functools      # for the demonstrations below
import math          # for your solutions: math.inf, math.sqrt, math.copysign
import operator

import numpy as np    # for your solutions

from lab import DecodeEngine, LabConfig, load_model
from lab import reference
from lab.bugspec import BUGS
from lab.measure import stats
from lab.measure.audit import audit, detect_lazy_init
from lab.teach.selfcheck import (answer, ask, check_launch_bill, check_merge_partials,
                                 check_paired_t, check_replays_needed, check_verdict, reveal,
                                 score, start)
from lab.measure.replay_check import replay_check

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
# Launches per token = kernels/layer × layers + the launches outside the layer stack, on each
# rank. With tensor parallelism every rank issues its whole step on its own GPU, so the bill
# counts every rank's launches. The per-launch budget is the token time divided by that count —
# in **microseconds** when the token time is in milliseconds.
#
# Checked against `lab.backend.instrument.launch_bill` over the launch log of simulator engines
# (eager and graph, `split_combine` off and on), then against a two-rank engine's own bill
# (`DecodeEngine.bill`) with `ranks=2`, and with `ranks=8`.

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
# Checked against `lab.measure.stats.paired_t`.

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
# Checked against `lab.measure.audit.audit` reports of the clean engine and of
# `LAB_BUG_FROZEN_KV_ROW`, `LAB_BUG_CTX_BY_VALUE`, `LAB_BUG_POS_OUTSIDE_GRAPH`, plus a few synthetic
# cases.

# %%
def verdict(kind, values_by_step, plan_keys_by_step):
    # FILL ME IN
    return None


# %%
r4 = check_verdict(verdict)

# %% [markdown]
# ## 5. How many replays?
# `lab.measure.replay_check.replay_check(engine, prompts, replays=n)` byte-compares n graph replays with n
# eager steps. How many consecutive replays should such a test run, at the least, to expose a
# host value frozen at capture? Replay 1 is the captured step itself, and a plan change can
# re-capture along the way. The checker runs the replay check with your `n` on every frozen-value
# bug of `lab/engine/bugs.py`, from a prompt that ends mid-plan and from one that ends one token
# before a plan boundary: it must expose every one. A floor, not a proof: a real test runs many
# more.

# %%
def replays_needed():
    # FILL ME IN
    return None


# %%
r5 = check_replays_needed(replays_needed)

# %% [markdown]
# ## The lecture's ten questions
# Put your name or id in `STUDENT` below, once: it is remembered in `~/.decode-lab` (so
# `decode-lab selfcheck` knows you too), and in a later session `None` means that name. The
# options come in an order of your own, so a letter or a position says nothing, and your attempts
# are kept in a small file (`me.path`), apart from any other name's. `ask("qN")` prints a
# question, its options and the form of its answer. Put your answer in the `answer("qN", ...)`
# call below it (`None` means not answered yet) and run the cell: it records the attempt and says
# right or not right, with a hint. The answer and why — and what your wrong picks miss — come
# only after your attempt at that question; `reveal("qN")` shows them again later, and before an
# attempt it refuses.
#
# Where the lab can show the answer on the engine, a cell after the question does, on the
# simulator. Such a cell gives the answer away, so it ships without output: run it after you
# answer.

# %%
STUDENT = None   # FILL ME IN: your name or id, e.g. "ada" (once; None: the name remembered)
me = start(STUDENT)
print(f"answering as {me.student!r}; attempts kept in {me.path.name}")

# %%
model = load_model()
SIM = LabConfig(backend="sim")
PROMPT = "ROMEO.\n"


def decode(cfg, n, host_writes_position=False):
    """n tokens after PROMPT, step by step: (their ids, their logits [n, vocab], ledger summary).
    host_writes_position: the host writes the device position before every step (seek)."""
    eng = DecodeEngine(model, cfg)
    ids = eng.encode(PROMPT)
    eng.reset(ids, n)
    logits = []
    for _ in range(ids.size - 1 + n):
        if host_writes_position:
            eng.seek(eng.position)
        eng.step()
        logits.append(eng.logits())
    return eng.tokens()[ids.size:], np.array(logits[ids.size - 1:]), eng.ledger_summary()

# %% [markdown]
# ### q1 — Right first, wrong later (lecture §4)

# %%
ask("q1")

# %%
a1 = answer("q1", None)   # FILL ME IN: a list of letters

# %% [markdown]
# After your answer: the replay check with one replay and with three, on each frozen-value bug of
# `lab/engine/bugs.py`.

# %% tags=["after-attempt"]
for name, bug in BUGS.items():
    if bug.kind == "frozen":
        seen = []
        for n in (1, 3):
            first = replay_check(DecodeEngine(model, SIM.replace(bugs={name})), [PROMPT],
                                 replays=n).checks[0].first_mismatch
            seen.append(f"{n} replay(s): " + ("identical" if first is None else
                                              f"mismatch from replay {first}"))
        print(f"{bug.env:<26} {'; '.join(seen)}")

# %% [markdown]
# ### q2 — Where the position lives (lecture §2)

# %%
ask("q2")

# %%
a2 = answer("q2", None)   # FILL ME IN: one letter

# %% [markdown]
# After your answer: twelve tokens decoded as graph replays, three ways: the clean engine (a
# kernel in the graph advances the device position); `LAB_BUG_POS_OUTSIDE_GRAPH` (the host
# uploads the position in code that runs at capture only); and the same bug with the host writing
# the device position before every launch (`engine.seek(engine.position)`: a host write between
# launches).

# %% tags=["after-attempt"]
for label, bugs, writes in (("clean engine", set(), False),
                            ("pos_outside_graph", {"pos_outside_graph"}, False),
                            ("pos_outside_graph + host writes", {"pos_outside_graph"}, True)):
    new_ids, _, ledger = decode(SIM.replace(bugs=bugs), 12, host_writes_position=writes)
    print(f"{label:<32} {model.tokenizer.decode(new_ids)!r:<18} {ledger}")

# %% [markdown]
# ### q3 — A loop bound and a grid size (lecture §2)

# %%
ask("q3")

# %%
a3 = answer("q3", None)   # FILL ME IN: one letter

# %% [markdown]
# After your answer: the capture audit of `LAB_BUG_CTX_BY_VALUE` (the context length passed by
# value), layer 0; then where a clean engine captures while it decodes 40 tokens.

# %% tags=["after-attempt"]
for v in audit(DecodeEngine(model, SIM.replace(bugs={"ctx_by_value"}))).varying:
    if v.layer == 0:
        distinct = len(set(map(str, v.values.values())))
        print(f"{v.kernel}.{v.what} ({v.kind}): {distinct} values over {len(v.values)} steps\n"
              f"    -> {v.verdict}{' (one value per plan key: handled)' if v.handled else ''}")
eng = DecodeEngine(model, SIM)
eng.generate(PROMPT, 40)
print("clean engine, 40 tokens: captures at", [f"position {e.position} (splits "
      f"{eng.plan(e.position).splits})" for e in eng.ledger if e.outcome == "capture"])
print("ledger:", eng.ledger_summary())

# %% [markdown]
# ### q4 — What a smaller standard error buys (lecture §1)
# Notebook 05 measures the noise of both arms with paired, interleaved reps.

# %%
ask("q4")

# %%
a4 = answer("q4", None)   # FILL ME IN: {"number": ..., "choices": [letters]}

# %% [markdown]
# ### q5 — The error names the wrong kernel (lecture §3)

# %%
ask("q5")

# %%
a5 = answer("q5", None)   # FILL ME IN: one letter

# %% [markdown]
# On the word "sticky", as the question says: this lab uses it in CUDA's sense, an error that
# corrupts the context, so that every later call fails until the process ends (notebook 03 says
# which errors a capture raises). The lecture's §3, "CUDA errors are sticky, so the failure was
# attributed to whatever ran next", uses it for an error that surfaces at a later call. One word,
# two meanings: read each text in its own.
#
# After your answer: the lazy-init detector on `LAB_BUG_LAZY_TABLE` (the RoPE tables uploaded on
# first use): which launch needed the upload, and where the capture error showed.

# %% tags=["after-attempt"]
for f in detect_lazy_init(model, SIM.replace(bugs={"lazy_table"})).illegal:
    print(f"{f.kind} ({f.detail}) needed by launch {f.launch_index} ({f.kernel}); "
          f"the capture error shows at: {f.surfaced_at}")

# %% [markdown]
# ### q6 — Two runs of one build differ (lecture §5)

# %%
ask("q6")

# %%
a6 = answer("q6", None)   # FILL ME IN: one letter

# %% [markdown]
# After your answer: an A/A at a sought context: two fresh eager engines of one configuration
# jump to position 200 with `seek` (the rows before it never written) and decode two tokens;
# their outputs compared.

# %% tags=["volatile", "after-attempt"]
def aa_after_seek(kv_init, position=200):
    """Why two identical engines' outputs differ after a seek ("" when they are identical)."""
    runs = []
    for _ in range(2):
        eng = DecodeEngine(model, SIM.replace(graph=False), kv_init=kv_init)
        eng.reset(eng.encode(PROMPT), 0)
        eng.seek(position)
        eng.step()
        eng.step()
        runs.append((eng.tokens()[position + 1:], eng.logits()))
    return stats.outputs_differ(runs[:1], runs[1:])


for kv_init in ("empty", "zeros"):
    why = aa_after_seek(kv_init)
    print(f"kv_init={kv_init!r:<8} A/A after seek: {'FAIL, ' + why if why else 'PASS (identical)'}")

# %% [markdown]
# ### q7 — What capture makes worth doing (lecture §6)
# Notebook 06 measures the split combine eagerly and captured.

# %%
ask("q7")

# %%
a7 = answer("q7", None)   # FILL ME IN: a list of letters

# %% [markdown]
# ### q8 — Reductions you may reorder (lecture §8)

# %%
ask("q8")

# %%
a8 = answer("q8", None)   # FILL ME IN: a list of letters

# %% [markdown]
# After your answer: each reduction over 4096 values, element by element in three orders; how
# many different bit patterns come out.

# %% tags=["after-attempt"]
rng = np.random.default_rng(0)
x = rng.standard_normal(4096).astype(np.float32)                      # [4096]
reductions = {"sum of float32": (operator.add, x),
              "max of |x|": (max, np.abs(x)),
              "product of float32": (operator.mul, (1 + x / 64).astype(np.float32)),
              "bitwise OR of int64": (operator.or_, rng.integers(0, 2**40, 4096))}
orders = (np.arange(x.size), np.arange(x.size)[::-1], rng.permutation(x.size))
for name, (op, values) in reductions.items():
    results = [functools.reduce(op, values[order]) for order in orders]
    patterns = {r.tobytes() for r in results}
    print(f"{name:<20} {len(patterns)} bit pattern(s): {', '.join(str(r) for r in results)}")

# %% [markdown]
# ### q9 — More precision, worse parity (lecture §9)

# %%
ask("q9")

# %%
a9 = answer("q9", None)   # FILL ME IN: one letter

# %% [markdown]
# After your answer: two measurements of a float32 and a float16 KV cache over 16 generated
# tokens: the error against the float64 oracle (`lab/reference.py`), and the distance between
# the two engines (parity with an implementation that keeps its cache in float16).

# %% tags=["after-attempt"]
oracle_ids, oracle_logits = reference.generate(model, model.tokenizer.encode(PROMPT), 16,
                                               return_logits=True)
runs = {kv: decode(SIM.replace(graph=False, kv_dtype=kv), 16) for kv in ("float32", "float16")}
for kv, (new_ids, logits, _) in runs.items():
    print(f"{kv} cache: max |logit - float64 oracle| = {np.abs(logits - oracle_logits).max():.3g}"
          f" (the oracle's tokens: {bool((new_ids == oracle_ids[-16:]).all())})")
print(f"float32 cache vs float16 cache: max |logit difference| = "
      f"{np.abs(runs['float32'][1] - runs['float16'][1]).max():.3g}")

# %% [markdown]
# ### q10 — The comparator fails the reference against itself (lecture §9)

# %%
ask("q10")

# %%
a10 = answer("q10", None)   # FILL ME IN: one letter

# %% [markdown]
# ## Score
# The five exercises and the ten questions.

# %%
print(score([r1, r2, r3, r4, r5, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10]))

# %% [markdown]
# ## What you should now be able to do
# - Merge split-K attention partials, count a launch bill with ranks, compute a paired t, give
#   an audit verdict and choose a replay count, each checked against the engine's own code.
# - Answer the lecture's ten questions from the lab's evidence, each after your own attempt.
