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
# # 04 — Replay bugs: right on replay 1, wrong from replay 2
#
# A value frozen at capture is, by construction, right for the step that was captured. The
# first replay (the captured step itself) passes every check. The second replay runs the same
# frozen value at the *next* position — and goes wrong. So a replay check with **one** replay
# proves nothing; three or more catch it.
#
# Illegal operations are the other class: the capture itself fails. The engine then ends the
# capture, restores host state, re-issues the step eagerly, and writes the reason in its ledger:
# the output stays right, and the ledger says why the graph is not being used.

# %%
from lab import DecodeEngine, LabConfig, load_model
from lab.bugspec import BUGS
from lab.measure.report import wrapped
from lab.measure.audit import bug_table
from lab.measure.replay_check import replay_check

model = load_model()
cfg = LabConfig()
PROMPT = "ROMEO.\n"

# %% [markdown]
# ## One replay passes, three fail

# %%
for name in ("frozen_kv_row", "ctx_by_value", "pos_outside_graph"):
    one = replay_check(DecodeEngine(model, cfg.replace(bugs={name})), [PROMPT], replays=1)
    three = replay_check(DecodeEngine(model, cfg.replace(bugs={name})), [PROMPT], replays=3)
    print(f"{BUGS[name].env:<26} 1 replay: {'pass' if one.ok else 'FAIL'};  3 replays: "
          f"{'pass' if three.ok else 'FAIL from replay %d' % three.checks[0].first_mismatch}")

# %% [markdown]
# ## Wrong — and not always visibly
# Correct (eager) and broken (graph replays) side by side. On a fresh engine the broken
# replays degrade fast: the frozen position repeats one step forever, the frozen context length
# hides the newest keys (the current token's included), and the frozen KV row leaves every other
# row empty.

# %%
correct = DecodeEngine(model, cfg.replace(graph=False)).generate(PROMPT, 160).text
print("correct:\n" + PROMPT + correct + "\n")
for name in ("frozen_kv_row", "ctx_by_value", "pos_outside_graph"):
    broken = DecodeEngine(model, cfg.replace(bugs={name})).generate(PROMPT, 160).text
    text = repr(PROMPT + broken)                  # cut, not wrapped: every character kept
    lines = "\n".join(text[i:i + 100] for i in range(0, len(text), 100))
    print(f"{BUGS[name].env} (graph replays), as a repr:\n{lines}\n")

# %% [markdown]
# Do not count on noise to give a bug away. A server reuses its engine across requests, so the
# rows a frozen KV pointer never writes still hold an *earlier request's* keys and values —
# valid ones. The broken replays then attend over that stale context and, after a stumble,
# write fluent play-text that continues the wrong request. Only the byte-compare says so at once.

# %%
eng = DecodeEngine(model, cfg.replace(bugs={"frozen_kv_row"}, graph=False))
eng.generate("HAMLET.\nTo be, or not to be", 300)     # an earlier request, decoded eagerly
eng.cfg = eng.cfg.replace(graph=True)
stale = eng.generate(PROMPT, 160).text
print("LAB_BUG_FROZEN_KV_ROW after an earlier request (graph replays):\n" + PROMPT + stale)

# %% [markdown]
# ## The fixes
# Each fix moves the per-token value into device memory (or into the capture key) — which is
# exactly how the clean engine is written:

# %%
for name, bug in BUGS.items():
    print(wrapped(f"{bug.env:<26} [{bug.kind}] caught by the {bug.caught_by}\n    fix: {bug.fix}"))

# %% [markdown]
# ## The whole table
# Every bug on this notebook's backend: what the audit and the lazy-init detector flag, the
# 1-replay and 3-replay checks, the graph ledger of a 40-token generation (steps that captured,
# replayed, fell back) and what happened to the capture.

# %%
rows = bug_table(model, cfg, PROMPT)
print(wrapped(rows[0]["source"]))
print(f"{'bug':<18} {'audit flags':<40} lazy-init flags")
for r in rows:
    print(f"{r['bug']:<18} {', '.join(r['audit_flags'])[:39]:<40} "
          f"{', '.join(r['lazy_init_flags'])[:40]}")
print(f"\n{'bug':<18} {'1 replay':<9} {'3 replays':<18} {'capt':>5} {'repl':>5} {'fallb':>5}  "
      f"capture")
for r in rows:
    led = r.get("graph_ledger", {})               # the 40-token generation's ledger
    print(f"{r['bug']:<18} {r['replay_1']:<9} {r['replay_3']:<18} {led.get('capture', 0):>5} "
          f"{led.get('replay', 0):>5} {led.get('fallback', 0):>5}  {r['capture'][:33]}")

# %% [markdown]
# ## The same table, recorded on the H200
# Recorded by `decode-lab record bugs`; any row where the simulator and the GPU disagree
# would be a simulator bug.

# %%
import json
from pathlib import Path
rec = Path("../data/gpu/bugs_table.json")
if rec.exists():
    gpu = json.loads(rec.read_text())
    print(wrapped(f"{gpu['source']} - {gpu['date']}"))
    sim_rows = {r["bug"]: r for r in rows}
    print(f"{'bug':<18} {'1 replay':<9} {'3 replays':<18} {'capture':<35} vs sim")
    for r in gpu["rows"]:
        s = sim_rows.get(r["bug"], {})
        same = all(r[k] == s.get(k)
                   for k in ("audit_flags", "lazy_init_flags", "replay_1", "replay_3"))
        print(f"{r['bug']:<18} {r['replay_1']:<9} {r['replay_3']:<18} {r['capture'][:35]:<35} "
              f"{'= sim' if same else 'DIFFERS from sim'}")
    for r in gpu["rows"]:
        s = sim_rows.get(r["bug"], {})
        if s and (r["capture"] == "ok") != (s.get("capture") == "ok"):
            print(wrapped(f"capture outcome of {r['bug']}: {r['capture'][:60]} on the GPU, "
                          f"{s.get('capture', '?')[:60]} on the simulator"))
else:
    print("no recorded GPU table yet")

# %% [markdown]
# The verdicts compared above (audit, lazy-initialisation flags, replay checks) are the lab's
# own. A capture's outcome is the device's, and a lazy allocation's outcome depends on the
# allocator: the simulator refuses every allocation during a capture, as `cudaMalloc` in a
# capture is refused; CuPy's memory pool serves a request from a block it already holds without
# calling `cudaMalloc`, and then the capture succeeds, with that block's address frozen in it.
# Where a line above reports such a difference, the detector's flag (notebook 03) is what to
# trust: it reports the operation, whatever its outcome on this run.

# %% [markdown]
# ## Did the runtime replay the graph? (the lecture's case studies 003 and 004)
# In case study 003 a custom verify kernel was made capture-safe, graph capture succeeded and
# the server's output was right. In 004 decode was still slow, and the assistant counted the
# server's log with
# `grep -oE "Decode batch.*cuda graph: (True|False)|cuda graph: (True|False)" | sort | uniq -c`,
# which printed one `Decode batch, ..., cuda graph: True` line and 36 bare `cuda graph: False`.
# 004 reads the 36 as decode steps that ran eagerly. The count does not say so:
#
# - On a line that contains `Decode batch`, the first alternative matches first and `grep -o`
#   prints the whole `Decode batch ...` prefix. So the 36 bare matches come from lines with no
#   `Decode batch` in them — in 003's own reading, prefill lines, which use no graph by design.
# - SGLang writes one decode line every `decode_log_interval` steps, so a line is not a step.
#
# What the log shows is one logged decode line, and it says `True`. The next cell runs the same
# pattern over two lines: the decode line as 004 printed it, and a stand-in for any other log
# line that carries the flag.

# %%
import re

PATTERN = r"Decode batch.*cuda graph: (?:True|False)|cuda graph: (?:True|False)"
log = ["Decode batch, #running-req: 1, #token: 63974, token usage: 0.49, accept len: 3.27, "
       "accept rate: 0.33, cuda graph: True",               # as printed in case study 004
       "(any other log line) ..., cuda graph: False"]       # a stand-in, not SGLang's format
for line in log:
    print(f"{re.search(PATTERN, line).group(0)[:60]!r}")

# %% [markdown]
# What 004 does teach holds all the same: **a capture that succeeded is worth nothing until you
# have checked that the runtime replays it** — and the check must count the right thing: decode
# steps, not log lines, and not prefill. In this lab that check is the engine's **ledger**: one
# entry per step, with its outcome (`capture`, `replay`, `eager`, `fallback`) and its plan key.
#
# Two deliberate bugs put a "graph" run on eager-like time with right output: one whose capture
# *fails* and falls back to eager without a sound, and one whose captures all succeed and are
# never replayed (the next section). `LAB_BUG_LAZY_TABLE` uploads the RoPE tables on first
# use, so the first capture (plan key `splits=1`, contexts 1 to 32) meets a synchronous copy,
# which a capture cannot contain, and fails. The engine ends the capture, runs the step eagerly —
# which uploads the tables — and remembers the failure: every later step with that key runs as
# an eager **fallback**. The next plan key (`splits=2`) then captures cleanly, so the run is
# partly graph, mostly eager, and its output is right. First, the number a benchmark that only
# times the run would report:

# %%
TOKENS = 40                      # 6 prompt steps + 40 tokens: positions 0 .. 45
runs = {"eager": cfg.replace(graph=False), "graph": cfg,
        "graph (LAB_BUG_LAZY_TABLE)": cfg.replace(bugs={"lazy_table"})}
engines, gens = {}, {}
for name, c in runs.items():
    engines[name] = DecodeEngine(model, c)
    gens[name] = engines[name].generate(PROMPT, TOKENS)
print(wrapped(gens["graph"].source))
speedup = {name: gens["eager"].ms_per_token / g.ms_per_token for name, g in gens.items()}
for name, g in gens.items():
    print(f"{name:<27} {g.ms_per_token:.4f} ms/token  ({speedup[name]:.2f}x eager's speed)  "
          f"text {'= eager' if g.text == gens['eager'].text else 'DIFFERS from eager'}")
print(f"the naive claim: graphs are worth {speedup['graph (LAB_BUG_LAZY_TABLE)']:.2f}x here; "
      f"replaying graphs are worth {speedup['graph']:.2f}x (simulated)")

# %% [markdown]
# Timed naively, the buggy run reports a modest, plausible gain for graphs — and a wrong one:
# the clean graph run is far faster. Nothing in the output gives it away (the text is right).
# The ledger does: one entry per step (not one line per N steps), saying what the step was.
# Counted by plan key:

# %%
buggy = engines["graph (LAB_BUG_LAZY_TABLE)"]
print("ledger:", buggy.ledger_summary())
by_key = {}                                       # splits -> {outcome: steps}
for e in buggy.ledger:
    outcomes = by_key.setdefault(e.plan_key[1], {})
    outcomes[e.outcome] = outcomes.get(e.outcome, 0) + 1
for splits, outcomes in by_key.items():
    print(f"  splits={splits:<3} {outcomes}")
for key, failure in buggy.capture_failures.items():
    print(f"capture failed for splits={key[1]}: {failure.reason} (shown at {failure.shown_at})")
replays = buggy.ledger_summary().get("replay", 0)
print(f"replays: {replays} of {len(buggy.ledger)} steps ({replays / len(buggy.ledger):.0%})")

# %% [markdown]
# The harness reads the same ledger. Every arm of `decode-lab bench` (A/B, sweep, ladder,
# leave-one-out) reports its **replay share** — replays over graph-mode steps in its timed runs
# (the warm-up, which pays one capture per plan key, is not timed) — and an arm configured for
# graphs with fewer than 99% replays is not labelled a graph arm: the result is marked NOT
# MEANINGFUL, naming the arm, its share and the fallback reasons. (The gate also counts each
# arm's graph keys, one per plan: the next section's bug is why.) The healthy graph arm passes.

# %%
from lab.measure import bench, report

naive = bench.run_ab(model, runs["eager"], runs["graph (LAB_BUG_LAZY_TABLE)"], reps=4,
                     tokens=TOKENS, per_token=0, names=("eager", "graph?"))
print(report.wrapped(report.format_ab(naive)))
print()
healthy = bench.run_ab(model, runs["eager"], runs["graph"], reps=4, tokens=TOKENS, per_token=0,
                       names=("eager", "graph"))
print(report.wrapped(report.format_ab(healthy)))
print()
for res in (naive, healthy):
    arm = res["arms"][1]
    print(f"{arm['name']:<7} mode {arm['mode']!r:<11} replays {arm['replay_fraction']:.1%}  "
          f"meaningful: {res['meaningful']}")

# %% [markdown]
# ## Captured every step, replayed never: the lab's own case 004
# `LAB_BUG_STEP_KEY` is the case 004 asks about. Every capture succeeds and the text is right;
# the tools for frozen values and illegal operations find nothing (its row in the bug table
# above: no audit flag, no lazy-init flag, 3 replays pass, capture ok). Yet its "graph" run
# captures a new graph at every step.
#
# **Exercise.** The engine `mystery` below has it switched on. From its ledger alone, find the
# part of the graph key whose value changes at every step: the reason no graph is looked up
# twice. A key is a flat tuple of names and values, `('splits', 1, 'split_combine', False, ...)`.
# Write `never_repeating(ledger)`: the names whose value is different at every step. The check
# runs it on this ledger and on the healthy graph run's, where nothing should be found.

# %%
mystery = DecodeEngine(model, cfg.replace(bugs={"step_key"}))
mystery.generate(PROMPT, TOKENS)
print("ledger:", mystery.ledger_summary())
for e in mystery.ledger[:3]:
    print(f"  step {e.step}: {e.outcome:<8} key (..., {', '.join(map(repr, e.plan_key[-6:]))})")


def never_repeating(ledger):
    """The names in the entries' keys whose value differs at every step."""
    return set()                                   # FILL ME IN


def check_never_repeating(fn):
    """PASS, or what is wrong, for a student's never_repeating (the lab's own tool:
    lab.measure.replay_check.never_repeating)."""
    from lab.measure.replay_check import never_repeating as lab_tool
    got, clean = fn(mystery.ledger), fn(engines["graph"].ledger)
    want = lab_tool(mystery.ledger)
    if got == want and not clean:
        return f"PASS: {sorted(got)} changes at every step; the healthy run's keys repeat"
    if not got:
        return "FAIL: nothing found; compare one key's values across the ledger's entries"
    if "splits" in got | clean:
        return ("FAIL: 'splits' changes only at plan boundaries -- a graph per plan is the "
                "design; look for a value that never repeats")
    return f"FAIL: {sorted(got)} on the bug's ledger, {sorted(clean)} on the healthy one"


print(check_never_repeating(never_repeating))

# %% [markdown]
# The committed run shows the stub failing: fill it in and re-run the cell. Once you have the
# name, the fix is the bug's `fix` (`lab/bugspec.py`): key the cache on what changes the
# captured work and nothing else. `never_repeating` finds this bug's key; it would miss a part
# with no name, or one that repeats once before it changes (`step // 2`): the lab's own check,
# `lab.measure.replay_check.key_parts_beyond_plan` (run by `decode-lab audit`), flags any part that
# takes more values over a run than the plan does. The replay gate catches the arm even if
# nobody reads the ledger: every timed step of it is a capture, none a replay, and its one
# plan met a graph key per step. The keys matter on their own: a key that holds the position
# is captured in the warm-up at every position the timed reps visit again, so those reps
# replay 100% (notebook 14 shows it), and only the count of keys per plan refuses the arm.

# %%
caught = bench.run_ab(model, runs["eager"], cfg.replace(bugs={"step_key"}), reps=2,
                      tokens=TOKENS, per_token=0, names=("eager", "graph?"))
arm = caught["arms"][1]
print(f"{arm['name']}: ledger {arm['ledger']}, replays {arm['replay_fraction']:.1%}, "
      f"meaningful: {caught['meaningful']}")

# %% [markdown]
# The `replays` column is the lesson of the case study turned into a check: the buggy arm's
# ms/token is real, but it measures a capture per step (and `LAB_BUG_LAZY_TABLE`'s, eager
# fallbacks), not graph replays, so the harness will not call its A/B a graph-vs-eager verdict.
# Two things to take from it:
#
# - **Verify the optimised path is the executed path**, every run: a capture that succeeded once
#   proves nothing about the steps after it (the same lesson as "one replay proves nothing").
# - **Make the fallback loud**: the engine falls back so that a capture failure costs speed,
#   never correctness — which is exactly why it goes unnoticed unless something counts it.
#
# ## What you should now be able to do
# - Show that a one-replay check passes a frozen-value bug and a three-replay check catches it,
#   and say from which replay each bug goes wrong.
# - Tell a frozen-value bug (the capture succeeds, replays go wrong) from an illegal operation
#   (the capture fails, the engine falls back), and name the fix of each.
# - Check from the ledger that a "graph" run really replayed its graphs — counting steps, not
#   log lines — and read a benchmark's replay share before believing its graph-vs-eager verdict.
# - Find, from the ledger's keys, a capture key that never repeats (a graph captured every step
#   and replayed never), and say what the key should hold instead.
# - Read a log count the way case study 004's should have been read: what each grep match is,
#   and whether a line is a step.
