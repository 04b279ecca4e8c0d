"""Record the bug table (every deliberate bug: audit flags, lazy-init flags, 1- and 3-replay
checks, capture outcome) on the GPU, next to the same table on the simulator.

  python scripts/record_gpu_bugs.py --out DIR      -> DIR/bugs_table.json
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lab.config import LabConfig  # noqa: E402
from lab.teach.audit import bug_table  # noqa: E402
from scripts import recorder  # noqa: E402

KEYS = ("audit_flags", "lazy_init_flags", "replay_1", "replay_3")


def main(argv=None) -> int:
    args = recorder.arguments(__doc__).parse_args(argv)
    out = recorder.out_dir(args.out)
    model = recorder.load(args)
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
    recorder.write_json(out / "bugs_table.json", {
        "what": "deliberate bugs on the GPU; sim rows alongside", "date": recorder.today(),
        "source": gpu[0]["source"], "rows": gpu, "sim_rows": list(sim.values()),
        "disagree_with_sim": disagree})
    print("disagree with sim:", disagree or "none")
    return 0


if __name__ == "__main__":
    sys.exit(recorder.run(main))
