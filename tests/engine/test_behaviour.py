"""Behaviour held still while the house is rebuilt: every arm's tokens, logits bytes, ledger and
launch bill, and the simulator's clock, equal to a recorded set (tests/data/behaviour.json).

The record was made by this module's `observe()` (`python tests/engine/test_behaviour.py
--record`) and is rewritten only when a change is MEANT to change what an arm computes or what the simulator
predicts: a refactor must leave every field equal, bit for bit. The simulator's clock
(`seconds`) follows the cost file, data/gpu/kernel_costs.json: a new recording moves it, and
only it.
"""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest

RECORD = Path(__file__).resolve().parents[1] / "data" / "behaviour.json"
PROMPT = "ROMEO.\n"
TOKENS = 6
# arm name -> LAB_* toggles on the simulator (every step variant, launch toggle and mode once,
# and the deliberate bugs that still decode)
ARMS = {
    "eager": {"LAB_GRAPH": "0"},
    "graph": {},
    "graph+pdl": {"LAB_PDL": "1"},
    "overlap": {"LAB_OVERLAP": "1"},
    "split_combine": {"LAB_SPLIT_COMBINE": "1"},
    "fusion": {"LAB_FUSION": "1", "LAB_PDL": "1"},
    "fusion+split": {"LAB_FUSION": "1", "LAB_SPLIT_COMBINE": "1"},
    "fusion heads": {"LAB_FUSION": "1", "LAB_ATTN_TAIL": "heads"},
    "fusion heads split": {"LAB_FUSION": "1", "LAB_ATTN_TAIL": "heads", "LAB_SPLIT_COMBINE": "1"},
    "persistent": {"LAB_PERSISTENT": "1"},
    "persistent eager": {"LAB_PERSISTENT": "1", "LAB_GRAPH": "0"},
    "dispatcher": {"LAB_LAUNCH": "dispatcher"},
    "kv float16": {"LAB_KV_DTYPE": "float16"},
    "plan switch update": {"LAB_PLAN_SWITCH": "update"},
    "device loop": {"LAB_LOOP": "device"},
    "ranks 2": {"LAB_RANKS": "2"},
    "ranks 2 eager": {"LAB_RANKS": "2", "LAB_GRAPH": "0"},
    "draft 4": {"LAB_DRAFT": "4"},
    "draft 2 eager": {"LAB_DRAFT": "2", "LAB_GRAPH": "0"},
    "bug frozen_kv_row": {"LAB_BUG_FROZEN_KV_ROW": "1"},
    "bug pos_outside_graph": {"LAB_BUG_POS_OUTSIDE_GRAPH": "1"},
    "bug ctx_by_value": {"LAB_BUG_CTX_BY_VALUE": "1"},
    "bug step_key": {"LAB_BUG_STEP_KEY": "1"},
}


def _digest(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()[:16]


def observe_arm(model, toggles: dict) -> dict:
    from lab import DecodeEngine, LabConfig
    cfg = LabConfig(backend="sim").with_toggles(toggles)
    eng = DecodeEngine(model, cfg)
    gen = eng.generate(PROMPT, TOKENS)
    bill = [[r.step, r.kind, r.kernel, r.layer, list(r.grid), list(r.block), r.stream, r.nodes]
            for log in eng.logs for r in log.records]
    return {"tokens": [int(t) for t in gen.tokens], "text": gen.text,
            "seconds": repr(float(gen.seconds)), "steps": gen.steps,
            "logits": _digest(eng.logits()),
            "ledger": [[e.step, e.position, repr(e.plan_key), e.outcome, e.reason, repr(e.plan)] for e in eng.ledger],
            "records": len(bill), "bill": hashlib.sha256(json.dumps(bill).encode()).hexdigest()[:16],
            "draft": gen.draft}


def observe() -> dict:
    from lab import load_model
    model = load_model()
    return {name: observe_arm(model, toggles) for name, toggles in ARMS.items()}


@pytest.mark.parametrize("name", list(ARMS))
def test_arm_behaves_as_recorded(name):
    from lab import load_model
    recorded = json.loads(RECORD.read_text())
    assert name in recorded, f"{name} is not in {RECORD.name}: record it"
    got = json.loads(json.dumps(observe_arm(load_model(), ARMS[name])))
    want = recorded[name]
    diff = [k for k in want if got.get(k) != want[k]]
    assert not diff, f"{name}: {diff} differ from the record: {[(got.get(k), want[k]) for k in diff]}"


if __name__ == "__main__" and "--record" in sys.argv:
    RECORD.write_text(json.dumps(observe(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {RECORD}")
