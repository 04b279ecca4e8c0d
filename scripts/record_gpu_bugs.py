"""Record the bug table (every deliberate bug: audit flags, lazy-init flags, 1- and 3-replay
checks, capture outcome) on the GPU, next to the same table on the simulator.

  python scripts/record_gpu_bugs.py --out DIR      -> DIR/bugs_table.json
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lab.audit import bug_table  # noqa: E402
from lab.config import LabConfig  # noqa: E402
from lab.model import load_model  # noqa: E402

KEYS = ("audit_flags", "lazy_init_flags", "replay_1", "replay_3")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    model = load_model()
    gpu = bug_table(model, LabConfig(backend="cuda"))
    sim = {r["bug"]: r for r in bug_table(model, LabConfig(backend="sim"))}
    disagree = []
    for r in gpu:
        s = sim[r["bug"]]
        cap_same = (r["capture"] == "ok") == (s["capture"] == "ok")
        if not cap_same or any(r[k] != s[k] for k in KEYS):
            disagree.append(r["bug"])
        print(f"{r['bug']:<18} audit {r['audit_flags']} lazy {r['lazy_init_flags']} "
              f"1:{r['replay_1']} 3:{r['replay_3']} capture: {r['capture'][:70]}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bugs_table.json").write_text(json.dumps({
        "what": "deliberate bugs on the GPU; sim rows alongside", "date": dt.date.today().isoformat(),
        "source": gpu[0]["source"], "rows": gpu, "sim_rows": list(sim.values()),
        "disagree_with_sim": disagree}, indent=2))
    print("disagree with sim:", disagree or "none")
    return 0


if __name__ == "__main__":
    sys.exit(main())
