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
from lab.audit import bug_table
from lab.bugs import BUGS
from lab.config import LabConfig
from lab.engine import DecodeEngine
from lab.model import load_model
from lab.verify import replay_check

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
    print(f"{BUGS[name].env} (graph replays):\n{PROMPT}{broken!r}\n")

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
    print(f"{bug.env:<26} [{bug.kind}] caught by the {bug.caught_by}\n    fix: {bug.fix}")

# %% [markdown]
# ## The whole table
# Every bug on this notebook's backend: what the audit and the lazy-init detector flag, the
# 1-replay and 3-replay checks, and what happened to the capture.

# %%
rows = bug_table(model, cfg, PROMPT)
print(rows[0]["source"])
print(f"{'bug':<18} {'audit flags':<34} {'lazy-init flags':<34} {'1 replay':<9} {'3 replays':<18} capture")
for r in rows:
    print(f"{r['bug']:<18} {', '.join(r['audit_flags'])[:33]:<34} {', '.join(r['lazy_init_flags'])[:33]:<34} "
          f"{r['replay_1']:<9} {r['replay_3']:<18} {r['capture'][:60]}")

# %% [markdown]
# ## The same table, recorded on the H200
# Recorded by `scripts/record_gpu_bugs.py`; any row where the simulator and the GPU disagree
# would be a simulator bug.

# %%
import json
from pathlib import Path
rec = Path("../data/gpu/bugs_table.json")
if rec.exists():
    gpu = json.loads(rec.read_text())
    print(gpu["source"], "-", gpu["date"])
    sim_rows = {r["bug"]: r for r in rows}
    for r in gpu["rows"]:
        s = sim_rows.get(r["bug"], {})
        same = all(r[k] == s.get(k) for k in ("audit_flags", "lazy_init_flags", "replay_1", "replay_3"))
        print(f"{r['bug']:<18} 1 replay {r['replay_1']:<5} 3 replays {r['replay_3']:<18} "
              f"capture {r['capture'][:40]:<40} {'= sim' if same else 'DIFFERS from sim'}")
else:
    print("no recorded GPU table yet")
