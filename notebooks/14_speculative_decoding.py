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
# # 14 — Speculative decoding under capture
#
# A decode step reads every weight to make ONE token. Speculative decoding makes the same read
# count several times: **draft** k tokens cheaply, **verify** them with one step of the model
# over k + 1 positions, and **accept** the longest prefix the model agrees with, plus the
# model's own next token. The lecture's case studies 003 and 004 are about exactly this step:
# 003 made its verify attention capture-safe, 004 found that the runtime was not replaying
# the captured graph.
#
# In this lab `LAB_DRAFT=k` (k = 2, 4 or 8) runs it with everything on the device: the drafter
# is a kernel (prompt lookup), the acceptance is a kernel, the position moves by however many
# tokens were accepted — and the host does not know by how many. So one graph must serve every
# step, whatever the position. This notebook takes it apart, on the simulator:
#
# 1. the drafter; 2. the verify step; 3. the acceptance — which you write; 4. the same tokens
# as one token per step; 5. no host sync between steps; 6. when drafting pays; 7. case study 004
# on the lab's own ground.

# %%
import os

# The simulator runs each kernel's NumPy twin; the verify step's twins multiply [k+1, d] by
# [d, n] matrices, products so small that BLAS threads only contend for the cores (10x slower on
# a busy 2-core machine). One thread, set before NumPy loads its BLAS:
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import json
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from kernels import draft, verify_attention
from lab import DecodeEngine, LabConfig, load_model
from lab.backend.costmodel import cost_key, launch_bytes
from lab.measure import bench, report, spec
from lab.measure.arms import replay_fraction
from lab.measure.report import show
from lab.teach import handson
from lab.measure.replay_check import key_parts_beyond_plan

model = load_model()
tok = model.tokenizer
SIM = LabConfig(backend="sim")
GPU = Path("../data/gpu")
PROMPT, K = "ROMEO.\n", 4


def recorded(name):
    path = GPU / name
    return json.loads(path.read_text()) if path.is_file() else None


def check(name, solution, backend="sim"):
    """The exercise's check, its verdict wrapped to this page (the command line prints one line).
    backend="cuda" runs it on the GPU, in a fresh process: give the solution as a .py file."""
    return handson.check(name, solution, backend=backend, width=100)


# %% [markdown]
# ## 1. The drafter: prompt lookup
# The drafts cost nothing to make if they come from the text itself: find the latest earlier
# place where the text's last n tokens occurred (n = 3, then 2, then 1) and guess that what
# followed then follows now. `kernels/draft.py`'s `draft_lookup` does it on the device (128
# threads scan the candidate ends, a max tree keeps the latest); its NumPy twin runs on any host
# array. Here on a real text, the list of persons of *Hamlet* from the model's training corpus,
# cut in the middle of a word (each token is a character):

# %%
corpus = spec.CORPUS.read_text(encoding="utf-8")
start = corpus.index("Voltimand")
text = spec.corpus_prompt(model, corpus.index("Osric, Cour") + 11 - start, start)


def drafts(text, k=K):
    """The columns the drafter would feed the verify step after `text`: [last token, k drafts]."""
    ids = tok.encode(text)
    tokens = np.zeros(model.cfg.max_seq, np.int32)
    tokens[:ids.size] = ids
    cols = np.zeros(k + 1, np.int32)
    p = ids.size - 1                                  # the current position: its token is known
    draft.draft_lookup_twin(draft.DRAFT_GRID, draft.DRAFT_BLOCK, tokens, np.array([p], np.int32),
                            np.array([ids.size], np.int32),
                            np.array([model.cfg.max_seq - 1], np.int32), cols)
    return tokens, p, cols


tokens, p, cols = drafts(text)
n, j = draft.latest_match(tokens, p)
print(f"the text ends ...{tok.decode(tokens[p - 14:p + 1])!r} (position {p})")
print(f"its last {n} tokens {tok.decode(tokens[p - n + 1:p + 1])!r} last occurred ending at {j}: "
      f"...{tok.decode(tokens[j - 12:j + 1])!r}, followed by "
      f"{tok.decode(tokens[j + 1:j + 1 + K])!r}")
print(f"columns of the verify step: {tok.decode(cols)!r} = the current token, then {K} drafts")

# %% [markdown]
# When nothing matches — the current token never occurred before — the drafter falls back to
# repeating it (a guess the model will mostly reject: the step then yields one token, as a
# one-token step would, at the price of a wider step). And when the occurrence is close, its
# continuation runs into the drafts themselves: the drafter continues the loop.

# %%
for t in ("ROMEO.\nZ", "Ha, ha, ha"):
    tokens, p, cols = drafts(t, 8)
    n, j = draft.latest_match(tokens, p)
    why = "no match: the fallback" if n == 0 else f"{n}-gram match ending at {j}, period {p - j}"
    print(f"{t!r:<14} -> columns {tok.decode(cols)!r:<13} ({why})")

# %% [markdown]
# **Try it.** Change `text` above (cut the list at another name, or use a line of your own) and
# predict the four drafts before you run the cell. Where the drafts are right, the verify step
# will accept them; that is all prompt lookup knows how to do.
#
# ## 2. The verify step: one step of the model over k + 1 columns
# The verify step feeds the k + 1 columns through the model at once. Every kernel of the
# one-token step has a column version that loads each weight row ONCE for all columns (the
# weights are the bytes of a decode step), and two bookkeeping kernels frame it:

# %%
one = DecodeEngine(model, SIM)
ver = DecodeEngine(model, SIM.replace(draft=K))
names_one = [x.name for x in one.step_launches(one.plan(0))]
names_ver = [x.name for x in ver.step_launches(ver.plan(0))]
L = model.cfg.n_layer
print(f"one-token step: {len(names_one)} launches = 1 + 8 x {L} layers + 4")
print(f"verify step:    {len(names_ver)} launches = 2 + 9 x {L} layers + 4 (k = {K}, whatever k)")
show("  before the layers: " + ", ".join(names_ver[:2]))
show("  each layer:        " + ", ".join(x.name for x in ver.step_launches(ver.plan(0))
                                       if x.layer == 0))
show("  after the layers:  " + ", ".join(names_ver[2 + 9 * L:]))

# %% [markdown]
# The extra launch per layer is the attention's split: `verify_partial`, then `verify_merge`
# (the one-token step fuses its merge with the Wo projection). The design is case study 003's:
#
# - **split-K over the cache** with a FIXED count NSPLIT (`LAB_DRAFT_SPLITS`, default 16): block
#   (head, s) for s < NSPLIT covers slice s of the rows written before this step, [0, p);
# - **the causal block** (head, NSPLIT) covers the k + 1 rows this step appends: column t sees
#   rows p .. p + t only;
# - **the merge** weighs the NSPLIT + 1 partials of each (head, column) by their running maxima.
#
# The host does not know p between its reads (the acceptance moves it by 1 to k + 1 tokens, on
# the device), so it cannot pick a split count per position the way the one-token step's plan
# does. The count is fixed and every slice's LENGTH is read on the device: one plan, one graph
# for the whole generation.

# %%
for pos in (0, 700):
    print(f"position {pos:>3}: one-token plan splits={one.plan(pos).splits:<2} | verify plan "
          f"splits={ver.plan(pos).splits}, key {ver.plan(pos).key[-4:]}")
S, T = ver.cfg.draft_splits, K + 1
print(f"\nthe verify attention's rows at three positions (NSPLIT = {S}, T = {T}):")
for pos in (40, 300, 900):
    rows = [verify_attention.verify_rows(pos, S, s, T, model.cfg.max_seq) for s in range(S + 1)]
    print(f"  p = {pos:>3}: slice 0 rows {rows[0]}, slice {S - 1} rows {rows[S - 1]}, causal block "
          f"rows {rows[S]}")

# %% [markdown]
# The price of a fixed count is paid twice. At a short context most slices are tiny or empty
# (blocks launched for nothing); at a long one each slice is long and only NSPLIT blocks per
# head share the work. 003 weighed it against the **workspace**: the partials of every
# (head, column, slice), whose size grows with NSPLIT. An allocation inside a capture is not
# illegal as such: 003 allocated its workspace per call with `torch.empty`, during the
# capture, from PyTorch's graph-private memory pool, and a stream-ordered allocation
# (`cudaMallocAsync`) is captured as a graph memory node (lecture 001, section 3). What a
# capture cannot contain is a synchronous allocator growing its pool (`cudaMalloc`:
# `LAB_BUG_LAZY_SCRATCH`). This lab allocates the workspace once, before any capture, so no
# allocation is left to happen in one:

# %%
c = model.cfg
for s in (1, 4, 16, 64):
    kib = verify_attention.workspace_bytes(c.n_head, T, s, c.head_dim) / 1024
    print(f"NSPLIT {s:>2}: workspace {kib:>6.1f} KiB for this model (part_o [{c.n_head}, {T}, "
          f"{s + 1}, {c.head_dim}] + part_ml)")

# %% [markdown]
# ## 3. Acceptance
# After the columns, `pred[t]` is the model's greedy choice after column t: the token for
# position p + t + 1. Draft i (at position p + i) is right exactly when `cols[i] == pred[i-1]`.
# Acceptance keeps the longest agreeing prefix, a drafts, and then takes `pred[a]`, the model's
# own next token, as a **bonus**: it was computed on a context that is now all confirmed. So a
# step yields a + 1 tokens, between 1 and k + 1. Two real verify steps on the text of section 1,
# one step at a time (the limit set k + 1 positions on, one step, then a read):


# %%
def counts(eng):
    """The device's counts (`draft_stats()`, one read), in a line."""
    st = eng.draft_stats()
    return (f"{st['verify steps']} steps that generated, {st['tokens generated']} tokens, "
            f"{st['tokens per step']:.2f} per step")


def one_verify_step(eng):
    """One verify step by hand: (p, its columns, the model's predictions, the new position)."""
    p = eng.device_position()
    eng.backend.upload(eng.bufs[0].limit, np.array([p + eng.cfg.draft + 1], np.int32))
    eng.step()
    eng.track_position(eng.device_position(), 0)    # the host's mirror, set from the read
    d = eng.draft_buffers
    return p, eng.backend.download(d.cols), eng.backend.download(d.pred), eng.position


ids = ver.encode(text)
ver.reset(ids)
ver.decode(ids.size - 1)                              # the prompt: forced columns, 5 a step
for _ in range(2):
    p, cols, pred, new = one_verify_step(ver)
    print(f"p = {p}: cols {tok.decode(cols)!r}, pred {tok.decode(pred)!r}")
    a = 0
    while a < K and cols[a + 1] == pred[a]:
        print(f"  draft {a + 1} {tok.decode(cols[a + 1:a + 2])!r} == pred[{a}]: accepted")
        a += 1
    if a < K:
        print(f"  draft {a + 1} {tok.decode(cols[a + 1:a + 2])!r} != pred[{a}] "
              f"{tok.decode(pred[a:a + 1])!r}: stop")
    print(f"  a = {a}, bonus pred[{a}] = {tok.decode(pred[a:a + 1])!r}: pos {p} -> {new} "
          f"(+{new - p}), the text now ends ...{tok.decode(ver.tokens(new + 1)[-12:])!r}")

# %% [markdown]
# In the second step the model wanted `W` where the list had `Osric`: draft 2 and everything
# after it are thrown away (they were verified on a context that is now wrong), and `W` itself
# is the bonus. Two more rules complete it, both about where the step must NOT go:
#
# - inside the prompt, a column is the prompt's own token: accepted whatever `pred` says, and
#   never written over;
# - `limit` is the last position the generation may reach: a step at the limit does nothing.
#   The host issues whole rounds of steps (section 5), so the last steps of a round may find the
#   work done.
#
# ### Exercise `accept`: write it
# Write the acceptance kernel (its NumPy twin and its numba.cuda source) and the verify step's
# piece that launches it. The check runs your launch on hand-made device buffers first — each
# case built so that one common mistake shows, and is named — then generates with LAB_DRAFT=4 in
# the real engine: LAB_DRAFT=0's tokens, one capture then replays, eager == graph byte for byte.

# %%
handson.show("accept", stub=False)

# %%
import numpy as np
from numba import cuda

from lab import DraftStep, launch
from lab.teach.handson import kernel


def accept_twin(grid, block, cols, pred, pos, n_prompt, limit, tokens, stats):
    """Keep the longest prefix of drafts the model confirms, add the bonus token, advance pos."""
    # FILL ME IN
    pass


@kernel("void(int32[::1], int32[::1], int32[::1], int32[::1], int32[::1], int32[::1], int32[::1])",
        twin=accept_twin, reads=(0, 1, 2, 3, 4, 5, 6), writes=(2, 5, 6))
def accept_kernel(cols, pred, pos, n_prompt, limit, tokens, stats):
    # FILL ME IN (numba.cuda: one thread, cuda.threadIdx.x == 0 and cuda.blockIdx.x == 0)
    pass


class AcceptStep(DraftStep):
    def accept(self, plan):
        """The launch of accept_kernel after the verify step's columns."""
        # FILL ME IN: return launch(accept_kernel, ((1,), (1,)), (the seven buffers, in order))
        return None

# %%
result = check("accept", globals())

# %% [markdown]
# The committed notebook shows the stub failing. Fill it in and re-run the two cells; on a GPU,
# put it in a file and run `decode-lab exercise check accept --solution FILE --backend cuda`.
# (`lab.teach.handson.EXERCISES["accept"].reference` is the lab's answer — after your attempt.)
#
# ## 4. The same tokens as one token per step
# Every accepted column equals the model's greedy choice given the columns before it, so a
# speculative decode writes exactly the sequence one token per step writes — up to rounding:
# the verify attention sums the context in other slices than the one-token attention does.
# Its logits can differ in the last bits, and a token can flip only where the two best logits
# are that close. `lab.measure.spec.same_tokens` holds the two runs against each other and, where
# they part, asks the float64 oracle for the margin (top-1 minus top-2) at that position: below
# `TIE_MARGIN` it is a near-tie, which rounding may break either way; above it, a bug.

# %%
same = spec.same_tokens(model, K, prompts=(PROMPT, "First Citizen:\nBefore we"), tokens=40,
                        base=SIM)
show(spec.format_same(same))
ids = tok.encode(PROMPT)
show(f"the oracle's margin at the first generated token of {PROMPT!r}: "
     f"{spec.oracle_margin(model, ids, ids.size - 1):.3f} (a near-tie is below "
     f"{spec.TIE_MARGIN:g})")

# %% [markdown]
# Both prompts decode identically here. The near-tie rule is there for the GPU (and for longer
# runs), where a different summation order is not a bug but a FAIL without the margin would say
# so. The check that must hold to the BIT is a different one: the same speculative decode,
# eager and replayed from the graph.

# %%
runs = {}
for mode in ("eager", "graph"):
    eng = DecodeEngine(model, SIM.replace(draft=K, graph=mode == "graph"))
    runs[mode] = (eng, eng.generate(PROMPT, 40))
for mode, (eng, gen) in runs.items():
    print(f"{mode}: {len(eng.ledger)} verify steps, ledger {eng.ledger_summary()}")
(e_eng, e_gen), (g_eng, g_gen) = runs["eager"], runs["graph"]
same_bytes = {name: e_eng.backend.download(getattr(e_eng.draft_buffers, name)).tobytes()
              == g_eng.backend.download(getattr(g_eng.draft_buffers, name)).tobytes()
              for name in ("logits", "pred", "cols", "stats")}
print("tokens identical:", np.array_equal(e_gen.tokens, g_gen.tokens))
print("the verify step's buffers identical:", same_bytes)

# %% [markdown]
# One capture, then replays only — across the positions where the one-token step changes its
# plan (32 and 64) — and the same bytes as the eager steps.
#
# ## 5. No host sync between steps
# The host cannot know how far a step got without reading `pos`, and a read is a sync: the
# device drains, the host waits. So `decode` works in **rounds**: it sets the device's `limit`
# to the target position, issues the fewest steps that could reach it — ceil(remaining / (k+1)),
# so no step of a round can find the work done — and reads `pos` once. A round falls short by
# the drafts its steps rejected, and the next one is shorter: each round covers at least
# 1/(k + 1) of what remains, so the rounds grow with the log of the length, and the last ones
# are single steps. Written out (the engine's `_decode_spec` does exactly this):

# %%
eng = DecodeEngine(model, SIM.replace(draft=K))
ids = eng.encode(PROMPT)
eng.reset(ids)
target = ids.size - 1 + 40
eng.backend.upload(eng.bufs[0].limit, np.array([target], np.int32))
pos, rounds = 0, 0
while pos < target:
    steps = -(-(target - pos) // (K + 1))             # the fewest steps that could reach it
    for _ in range(steps):
        eng.step()                                   # a replay: no read, no wait
    new = eng.device_position()                      # the round's one read
    rounds += 1
    print(f"round {rounds:>2}: {steps:>2} step{'s' if steps > 1 else ' '}, position {pos:>2} -> "
          f"{new:>2} (+{new - pos})")
    eng.track_position(new, 0)                       # the host's mirror of pos
    pos = new
print(f"{len(eng.ledger)} verify steps, {rounds} reads of pos")
print(f"the counts, read once at the end: {counts(eng)}")

# %% [markdown]
# The first round ingests the prompt (prompt columns are always accepted, k + 1 a step) and runs
# on; the later ones mop up what the rejected drafts left. The engine's own `decode`, counted
# from the simulator's record of the host's device operations: one upload (the limit), one read
# of `pos` to start and one per round, and nothing else.

# %%
eng = DecodeEngine(model, SIM.replace(draft=K))
ids = eng.encode(PROMPT)
eng.reset(ids)
first = len(eng.backend.ops)
eng.decode(ids.size - 1 + 40)
ops = eng.backend.ops[first:]
reads = [o.detail for o in ops if o.kind == "download"]
print(f"{len(eng.ledger)} steps; host operations: {len(reads)} downloads ({', '.join(set(reads))}),"
      f" {sum(o.kind == 'upload' for o in ops)} upload")
print("draft_stats(), one read at the end:", counts(eng))

# %% [markdown]
# `draft_stats()` is the device's own count, kept by the acceptance kernel and read once; the host
# never needed it to run. It counts the steps that generated: the first step, all prompt
# columns, made no token.
#
# ## 6. When does drafting pay?
# A verify step costs more than a one-token step (wider launches, an extra one per layer) and
# yields 1 to k + 1 tokens. Drafting pays when the tokens per verify step exceed the cost of a
# (k + 1)-wide step over a one-token step. `lab.measure.spec.curve` times both, arms interleaved
# rep by rep, each drafting engine fed the same real text of the given context (the acceptance
# depends on the text; the one-token engine seeks over it: its work does not). Small here:
# contexts 64 and 300, 24 tokens, 2 reps.

# %%
curve = spec.curve(model, drafts=(0, 2, 4, 8), contexts=(64, 300), new_tokens=24, reps=2,
                   base=SIM, bug=None, progress=False)
show(spec.format_curve(curve))
stand_ins = sorted({key.split(" ")[0] for key in ver.backend.cost.misses})
show("launches the H200's recording lacks, costed by a stand-in (the same kernel's recorded "
     "launch on the same shapes under another geometry, else its bytes at the bandwidth fitted to "
     "the recorded kernels + the empty node): " + (", ".join(stand_ins) or "none"))

# %% [markdown]
# Before reading the curve, look at what the simulator charges for one step of each kind at
# context 300, and for the one projection both steps share (the same weight bytes):

# %%
cost = ver.backend.cost


def priced(x):
    return "a stand-in" if cost_key(x) in cost.misses else "its recorded fit"


for eng in (one, ver):
    launches = eng.step_launches(eng.plan(299))
    print(f"{'verify' if eng.cfg.draft else 'one-token'} step: {len(launches)} kernels, "
          f"{sum(cost.node_us(x, 300, False) for x in launches):6.1f} us of device time, "
          f"{sum(priced(x) == 'a stand-in' for x in launches)} priced by a stand-in")
for eng, name in ((one, "matvec"), (ver, "matmat")):
    x = next(x for x in eng.step_launches(eng.plan(299)) if x.name == name and x.layer == 0)
    print(f"  the qkv projection as {name}: {launch_bytes(x, 300) / 1024:.0f} KiB, "
          f"{cost.node_us(x, 300, False):5.2f} us ({priced(x)})")
print(f"(simulated; stand-ins at the fitted {cost.bandwidth_gbs:.0f} GB/s)")

# %% [markdown]
# The simulator prices each kernel by its recording on the H200 (the verify step's are in
# `data/gpu/spec_costs.json`); a launch whose geometry changed since that recording is priced by a
# stand-in, its kernel's recorded launch on the same shapes, until `decode-lab record spec_costs`
# measures it again (the lines above say which). At this model's size every kernel is bound by
# latency, not by the bytes it reads, so what a column costs is the work it adds to the critical
# path, not its bytes. The verify products (`kernels/verify.py`) are built to add little: one warp
# per row as in matvec, each weight loaded once for every column, the columns read straight from
# global memory (L1 serves every warp after the first), no shared memory and no barrier, and the
# T sums over the lanes done as ONE reduce-scatter (`lane_sums16`: each stride of the butterfly
# keeps half the columns, 16 shuffles for any T where a warp sum per column costs 5 T) that keeps
# matvec's summation order, so each column has matvec's bits. The verify attention gives each
# column a warp that reads each K/V row once per tile of 32 rows and reduces the 32 scores the
# same way (`lane_sums32`). How close that comes to one token's cost is for the GPU to say
# (`scripts/verify_probe.py` times each pair); the recorded costs above are what the simulator
# knows until then.


# %%
def pays(res):
    """Per context and k: tokens per verify step against the verify step's cost in one-token
    steps (drafting pays where the first is larger)."""
    rows = {(r["context"], r["draft"]): r for r in res["rows"] if not r["bug"]}
    out = []
    for (ctx, k), r in sorted(rows.items()):
        if k:
            step_ms = r["ms_per_token"] * r["tokens_per_step"]        # one verify step
            cost = step_ms / rows[(ctx, 0)]["ms_per_token"]            # in one-token steps
            out.append((ctx, k, r["tokens_per_step"], cost))
    return out


def plot_curve(res, label):
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(9, 3))
    for ctx in sorted({r["context"] for r in res["rows"]}):
        rows = sorted((r for r in res["rows"] if r["context"] == ctx and not r["bug"]),
                      key=lambda r: r["draft"])
        ks = [r["draft"] for r in rows]
        ax.errorbar(ks, [r["ms_per_token"] for r in rows], [r["se"] for r in rows], marker="o",
                    label=f"context {ctx}")
        bx.plot(ks, [r["tokens_per_step"] for r in rows], "o-", label=f"context {ctx}")
    ax.set_xlabel("k (tokens drafted per step; 0: one token per step)")
    ax.set_ylabel("ms per generated token")
    bx.set_xlabel("k")
    bx.set_ylabel("tokens per verify step")
    for a in (ax, bx):
        a.set_xticks([0, 2, 4, 8])
        a.legend(fontsize=8)
    fig.suptitle(f"speculative decoding [{label}]", fontsize=9)
    fig.tight_layout()
    plt.show()


def print_pays(res, label):
    print(f"tokens per verify step against its cost in one-token steps [{label}]:")
    for ctx, k, tps, cost in pays(res):
        print(f"  context {ctx:>3}, k = {k}: {tps:.2f} tokens per step, the step costs {cost:.2f} "
              f"-> {'pays' if tps > cost else 'does not pay'}")


plot_curve(curve, "simulated")
print_pays(curve, "simulated")

# %% [markdown]
# Read the right panel first: prompt lookup finds little to copy in 64 characters of text
# (1.09 tokens per step, whatever k) and more in 300 (the list of persons repeats
# `Courtier.`): 1.50 at k = 2, 1.71 at k = 4 and at k = 8, still under two tokens per step.
# Past k = 4 a larger k adds nothing: most drafts are rejected, and a draft past the first
# wrong one is never used. The left panel prices it, and the lines under it do the arithmetic:
# at 64 a verify step costs more one-token steps than the tokens it yields, so drafting does not
# pay; at 300 the repeated list lifts the tokens per step just past the step's cost, and it pays,
# narrowly. The rule: drafting pays when the tokens per step exceed the step's cost in one-token
# steps — text with many repeated n-grams (code, quoted context, long lists), on a step whose
# extra columns are nearly free (each weight row and each cache row read once for all of them,
# and the per-column work kept off the critical path).
#
# On the H200, recorded (`decode-lab record spec`, the same curve at contexts 64 and 900):

# %%
rec = recorded("spec.json")
if rec is None:
    print("data/gpu/spec.json is not recorded yet: run decode-lab record spec on a GPU")
else:
    show(spec.format_curve(rec["curve"]))
    label = report.source_label(rec["source"])
    plot_curve(rec["curve"], label)
    print_pays(rec["curve"], label)
    show(f"source: {rec['source']}, {rec['date']}")

# %% [markdown]
# The H200 measured contexts 64 and 900, where the text repeats less: there a drafting round
# costs 1.4 to 1.6 one-token steps and yields fewer than 1.2 tokens (the lines above); drafting
# loses at every k. (The round's cost includes the host's read of the device position once per
# round; the verify step alone, timed back to back in the next section, costs about 1.35.) The
# tokens per step depend on the text and the model only, not on the machine (here 24 tokens were
# generated, there 64: other counts); `decode-lab conformance --only spec` re-runs the recording's own
# settings on the simulator, finds the same tokens per step, and puts each ms/token difference
# beside the H200's.

# %% [markdown]
# ### The break-even line, on two texts fixed in advance
# Whether drafting pays is one comparison: E, the tokens a verify step yields (the device's own
# counts), against V, what a verify step costs in one-token steps (the two steps timed back to
# back from the same position, interleaved). Drafting pays where E > V, and its speed-up is about
# E / V. `lab.measure.spec.break_even` measures both on two texts chosen BEFORE any measurement
# (`spec.TEXTS`, passages of the training corpus by offset): "repeating", a passage the prompt
# holds once and then starts again, so every n-gram the generation should continue is in the
# prompt; and "prose", a passage whose continuation the prompt does not hold.

# %%
for name, t in spec.TEXTS.items():
    p = spec.text_prompt(model, name)
    show(f"{name}: data/corpus.txt[{t['offset']}:{t['offset'] + t['length']}] ({t['what']}); "
         f"the prompt ends ...{p[-40:]!r}")
even = spec.break_even(model, drafts=(2, 4, 8), new_tokens=32, reps=2, step_reps=8, base=SIM,
                       progress=False)
show(spec.format_break_even(even))


# %%
def plot_even(res, label):
    """V against E per text, drafter and k, with the break-even line E = V: below it drafting
    pays. Filled markers: prompt lookup; hollow: the n-gram table (a recording made before it
    has only the filled ones)."""
    fig, ax = plt.subplots(figsize=(5.6, 3.9))
    drafters = list(dict.fromkeys(r.get("drafter", "lookup") for r in res["rows"]))
    for (name, marker), color in zip(zip(res["texts"], "os"), ("tab:blue", "tab:orange")):
        for d in drafters:
            rows = [r for r in res["rows"]
                    if r["text"] == name and r.get("drafter", "lookup") == d]
            ax.errorbar([r["tokens_per_step"] for r in rows],
                        [r["verify_step_cost"] for r in rows],
                        [r["verify_step_cost_se"] for r in rows], fmt=marker, color=color,
                        mfc=color if d == "lookup" else "none", label=f"{name}, {d}")
            for r in rows:
                ax.annotate(f"{r['draft']}", (r["tokens_per_step"], r["verify_step_cost"]),
                            fontsize=7, xytext=(0, 5 if d == "lookup" else -10),
                            textcoords="offset points", ha="center")
    right = max(max(r["verify_step_cost"], r["tokens_per_step"]) for r in res["rows"]) * 1.1
    top = max(r["verify_step_cost"] for r in res["rows"]) * 1.3
    ax.plot([1, right], [1, right], "k--", lw=1, label="break-even E = V")
    ax.plot([1.5, right], [1, right / 1.5], ":", color="gray", lw=1, label="E / V = 1.5")
    ax.fill_between([1, right], [1, 1], [1, right], color="tab:green", alpha=0.08)
    ax.set_xlabel("E: tokens per verify step (measured acceptance); numbers: k")
    ax.set_ylabel("V: verify step / one-token step")
    ax.set_xlim(0.9, right)
    ax.set_ylim(0.9, top)
    ax.legend(fontsize=8)
    ax.set_title(f"when drafting pays (below the line) [{label}]", fontsize=9)
    fig.tight_layout()
    plt.show()


plot_even(even, "simulated")

# %% [markdown]
# Why E stays low on the repeating text: drafting keeps only what the model's own argmax agrees
# with, so E can never beat how far the model itself copies. Ask the float64 oracle directly:
# its greedy continuation of the repeating prompt, beside the text the prompt repeats.

# %%
reach = spec.copy_reach(model, "repeating", 48)
show(f"the model writes {reach['generated']!r}\nthe repeat is   {reach['copy']!r}\n"
     f"they agree for {reach['reach']} of {reach['tokens']} characters ({reach['source']})")

# %% [markdown]
# ### A drafter that predicts the model, not the text
# The model does not copy, so the copy is the wrong thing to draft. What does it write? Text
# like its training corpus: after "ROMEO" comes ".", after " th" comes "e", mostly. The second
# drafter (`LAB_DRAFTER=ngram`, `kernels/draft.py`'s `draft_ngram`) asks a table built once
# from the corpus (`lab.engine.draft.corpus_table`): for every context of the last 4 tokens,
# the token the corpus most often writes next (a context the corpus never holds backs off to
# its last 3, 2, 1 tokens). Each draft joins the context of the next, so k drafts are k
# lookups in a row, one thread, no scan. The table is an input of the kernel, uploaded with the
# verify step's buffers; at this model's 71 characters it is 71^4 bytes (25 MB), of which a step
# reads k.
#
# The two drafters on the repeating prompt, beside the model's own continuation (the float64
# oracle's, as above):

# %%
from lab.engine.draft import corpus_table

table = corpus_table(model.cfg.vocab)
prompt = spec.text_prompt(model, "repeating")
ids = tok.encode(prompt)
buf = np.zeros(model.cfg.max_seq, np.int32)
buf[:ids.size] = ids
one = lambda v: np.array([v], np.int32)
look = np.zeros(9, np.int32)
draft.draft_lookup_twin(draft.DRAFT_GRID, draft.DRAFT_BLOCK, buf, one(ids.size - 1),
                        one(ids.size), one(model.cfg.max_seq - 1), look)
gram = draft.ngram_drafts(buf, ids.size - 1, ids.size, model.cfg.max_seq - 1, table, 9)
show(f"table {table.shape} {table.dtype}, {table.nbytes / 1e6:.1f} MB\n"
     f"the prompt ends     ...{prompt[-24:]!r}\n"
     f"the model writes    {reach['generated'][:8]!r}\n"
     f"prompt lookup says  {tok.decode(look[1:])!r}\n"
     f"the n-gram table    {tok.decode(gram[1:])!r}")

# %% [markdown]
# Drafting never changes the tokens, whichever drafter (the verify step keeps only what the
# model's argmax agrees with): only E, and through it the speed. The break-even measurement
# above ran both; E per drafter at k = 4, from the same run:

# %%
for name in even["texts"]:
    e = {r["drafter"]: r["tokens_per_step"] for r in even["rows"]
         if r["text"] == name and r["draft"] == 4}
    show(f"{name:<10} E at k = 4: prompt lookup {e['lookup']:.2f}, n-gram table {e['ngram']:.2f} "
         f"tokens a verify step (simulated: the model's own tokens)")

# %% [markdown]
# Each point of the plot is one (text, drafter, k); the shaded side of the line is where a verify
# step yields more tokens than it costs. On the simulator, V comes from the recorded component
# costs (and their stand-ins), E from the model itself, which is why E is the GPU's too (ties
# aside) and V is only as good as the costs behind it. The same measurement on the H200, when the
# recording has it (`decode-lab record spec` writes `break_even` into `data/gpu/spec.json`):

# %%
if rec is None or "break_even" not in rec:
    print("data/gpu/spec.json has no break_even yet: run decode-lab record spec on a GPU")
else:
    show(spec.format_break_even(rec["break_even"]))
    rows = rec["break_even"]["rows"]
    for name in rec["break_even"]["texts"]:
        best = {}
        for r in rows:
            d = r.get("drafter", "lookup")
            if r["text"] == name and r["speedup"] > best.get(d, {"speedup": 0})["speedup"]:
                best[d] = r
        show(f"{name:<10} " + "; ".join(
            f"{d}: best k = {r['draft']}, E {r['tokens_per_step']:.2f}, V "
            f"{r['verify_step_cost']:.2f}, {r['speedup']:.2f}x measured ({r['predicted_speedup']:.2f}"
            f" by E / V)" for d, r in best.items()))
    plot_even(rec["break_even"], report.source_label(rec["break_even"]["source"]))

# %% [markdown]
# Read the plot and the lines above it as the lecture's rule says: the verify step itself is
# cheap (V, a verify step timed back to back against a one-token step), so what decides is E.
# Prompt lookup's E is capped by how far the model copies the text (the oracle's line above);
# the n-gram table's is not, because it drafts what the model tends to write, copy or not. Where E / V is barely
# above 1 the measured speed-up can still fall below it: V times the step alone, while each
# drafting round also waits for the host's read of the device position (`decode-lab
# conformance` records that per-round cost where it shows). A drafter pays as far as it predicts
# the model: that is the whole of speculative decoding's bargain, whatever drafts.

# %% [markdown]
# ## 7. Case study 004 on the lab's own ground: `LAB_BUG_SPEC_KEY`
# Here is a speculative decode configured for graphs. Its label says `graph`, its tokens are
# right. Timed, beside the clean run:

# %%
mystery = DecodeEngine(model, SIM.replace(draft=K, bugs={"spec_key"}))
clean = DecodeEngine(model, SIM.replace(draft=K))
g_bug, g_clean = mystery.generate(PROMPT, 40), clean.generate(PROMPT, 40)
label = "graph" if mystery.cfg.graph else "eager"
tokens_are = "= the clean run's" if np.array_equal(g_bug.tokens, g_clean.tokens) else "DIFFER"
print(f"mode {label}: {g_bug.ms_per_token * 1000:.1f} us/token, tokens {tokens_are} (simulated)")
print(f"the clean run, mode graph too: {g_clean.ms_per_token * 1000:.1f} us/token (simulated)")
nodes = len(mystery.step_launches(mystery.plan()))
if cost.capture_us is None:
    show("this simulator's cost file predates the capture costs (floors.capture, recorded by "
         "decode-lab record costs): a capture costs it nothing, so here the two runs cost "
         "about the same. On a GPU they do not (below).")
else:
    show(f"the simulator charges a capture and an instantiation what the H200 measured "
         f"(floors.capture): {cost.capture_host_us(nodes) + cost.instantiate_host_us(nodes):.0f} "
         f"us of host time for the verify step's {nodes} nodes")

# %% [markdown]
# Nothing in the output gives it away. **Find out why from the ledger alone** — one entry per
# step, its outcome and the key its graph was filed under. Look at a few entries; which part of
# the key never repeats? Then count what the run did:

# %%
print("ledger:", mystery.ledger_summary())
for e in mystery.ledger[:4]:
    print(f"  step {e.step}: {e.outcome:<8} key (..., {', '.join(map(repr, e.plan_key[-4:]))})")
print(f"replay share: {replay_fraction(mystery.ledger_summary()):.0%}; the key parts that take "
      f"more values than the plan: {sorted(key_parts_beyond_plan(mystery.ledger))}")
print(f"the clean run: ledger {clean.ledger_summary()}, replay share "
      f"{replay_fraction(clean.ledger_summary()):.0%},\n  key parts beyond the plan: "
      f"{sorted(key_parts_beyond_plan(clean.ledger)) or 'none'}")

# %% [markdown]
# Every step captured a graph, successfully, and no graph was ever looked up again: the key
# holds `pos`, the position the device reached, read back after every step (a host sync the
# clean step never makes). With drafting the position moves by the accepted count, so the
# same position is never a key twice. What it cost on the H200 (the curve's bug arm, recorded
# beside the clean arms):

# %%
if rec is None:
    print("data/gpu/spec.json is not recorded yet: run decode-lab record spec on a GPU")
else:
    for ctx in sorted({r["context"] for r in rec["curve"]["rows"]}):
        arm = {r["arm"]: r for r in rec["curve"]["rows"] if r["context"] == ctx}
        bug, ok = arm[f"draft {K} + LAB_BUG_SPEC_KEY"], arm[f"draft {K}"]
        print(f"context {ctx}: the bug arm {bug['ms_per_token']:.4f} ms/token, {bug['replay_fraction']:.0%} "
              f"replays; the clean arm {ok['ms_per_token']:.4f}, {ok['replay_fraction']:.0%}: "
              f"{bug['ms_per_token'] / ok['ms_per_token']:.1f}x slower")
    show(f"source: {report.source_label(rec['source'])}")

# %% [markdown]
# 004 counted one `cuda graph: True` and 36 `cuda graph: False` in a server's log and read the
# 36 as decode steps that ran eagerly. Notebook 04 shows that the count does not establish it
# (the pattern's first alternative swallows every decode line's flag, and a log line is not a
# step), so 004's run may have replayed its graph after all. What 004 asked is the right
# question, and the ledger is the count it needed: one entry per step, whether it replayed,
# captured or ran eagerly. Here it shows, without a log's ambiguity, a run that captures
# successfully at every step and replays nothing. The fix is the bug's own (`lab/bugspec.py`):
# **key the graph on what changes the captured work** — the plan key and the draft length —
# and nothing else; the accepted count and the position stay in device memory, read by the
# kernels, and the host reads them once per round. That is the clean run above: one capture,
# replays only.
#
# Would a benchmark have been fooled? A replay share alone would: `decode-lab bench ab` warms
# each arm up with an untimed run of the same prompt, so the warm-up captures a graph for every
# position the timed reps reach, and each timed step then replays one: 100% replays, a speed no
# real decode sees. So the replay gate counts more than replays, from each arm's own ledger
# entries (the arms share one engine): an arm one of whose plans met more than one graph key
# over its warm-up and timed runs, or whose timed runs captured a graph for a plan it had
# already run, is NOT MEANINGFUL, and the reason names the arm, the plan and the key part
# that changed. The bug's engine above, timed as bench times an arm (`lab/measure/arms.py`: an
# untimed warm-up, then two timed reps of the same prompt), and put through the gate:

# %%
arm = bench.make_arm(model, "graph?", mystery.cfg, 0, pool={bench.pool_key(mystery.cfg): mystery})
bench.interleave([arm], 2, bench.decode_run(PROMPT, 8))
summary = arm.summary()
show(f"{summary['name']}: ledger {summary['ledger']} (timed), replays "
     f"{summary['replay_fraction']:.0%}; {summary['plans']} plan, {summary['graph_keys']} graph "
     f"keys over the warm-up and the timed reps")
show(f"NOT MEANINGFUL: {bench.replay_gate([summary])}")

# %% [markdown]
# Every timed step replayed a graph, and the arm is still refused: its one plan met a graph key
# per position its steps started at, the part `pos`. `decode-lab bench ab` gates each of its
# arms this way. `decode-lab audit` finds the same part from one run's ledger (any key part,
# named or not, that takes more values than the plan does), so the bug does not need a
# benchmark to show.
#
# ## What you should now be able to do
# - Say what prompt lookup drafts from a text, and when it falls back to repeating the token;
#   say why a drafter that predicts the model (an n-gram table of its corpus) beats one that
#   predicts the text when the model does not copy.
# - Describe the verify step (42 launches against 37, the split-K attention over the cache with
#   a fixed NSPLIT plus the causal block, then the merge) and why the split count must be fixed
#   when the position lives on the device: one graph for the whole generation.
# - Write the acceptance — longest agreeing prefix, the bonus token, the prompt and the limit —
#   and have it checked in the real engine.
# - Check that drafting keeps the greedy tokens (with the near-tie rule) and that eager and
#   graph agree to the bit; count the host's reads: one per round, never between steps.
# - Decide when drafting pays: tokens per verify step (E) against the verify step's cost in
#   one-token steps (V), on texts fixed before measuring; the break-even line E = V.
# - Find from the ledger a graph that is captured every step and never replayed, and fix its key.
# - Say why a replay share alone passes that bug when a warm-up visits the timed positions, and
#   what the replay gate counts instead: graph keys per plan, and captures of a plan already run.
