"""bugs_table.json: every deliberate bug on the device, beside the simulator's table (notebook 04)."""
from __future__ import annotations

from lab.config import LabConfig
from lab.measure.experiment import experiment, today

KEYS = ("audit_flags", "lazy_init_flags", "replay_1", "replay_3")


@experiment("bugs", ("bugs_table.json",), priority=30)
def bugs(ctx) -> None:
    """The bug table (audit flags, lazy-init flags, 1- and 3-replay checks, capture outcome) on
    the device and on the simulator, and the bugs where they disagree (notebook 04)."""
    from lab.measure.audit import bug_table
    rows = bug_table(ctx.model, LabConfig(backend=ctx.backend))
    sim = {r["bug"]: r for r in bug_table(ctx.model, LabConfig(backend="sim"))}
    disagree = []
    for r in rows:
        s = sim[r["bug"]]
        if ((r["capture"] == "ok") != (s["capture"] == "ok")) or any(r[k] != s[k] for k in KEYS):
            disagree.append(r["bug"])
        print(f"{r['bug']:<18} audit {r['audit_flags']} lazy {r['lazy_init_flags']} "
              f"1:{r['replay_1']} 3:{r['replay_3']} capture: {r['capture'][:70]}")
    ctx.write_json("bugs_table.json", {
        "what": "deliberate bugs on the GPU; sim rows alongside", "date": today(),
        "source": rows[0]["source"], "rows": rows, "sim_rows": list(sim.values()),
        "disagree_with_sim": disagree})
    print("disagree with sim:", disagree or "none")
