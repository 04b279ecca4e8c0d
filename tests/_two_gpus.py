"""The two-GPU check of tests/engine/test_ranks.py, run in a child process (so that a hang at exit, a
known hazard of NCCL communicators, can only time the child out): 2-rank eager and graph decode
on GPUs 0 and 1, the rank-skew refusal, then every graph and communicator destroyed. Prints one
JSON line and leaves with os._exit."""
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lab.config import LabConfig  # noqa: E402
from lab.engine.runner import DecodeEngine  # noqa: E402
from lab.errors import CollectiveError  # noqa: E402
from lab.model import load_model  # noqa: E402
from lab.reference import generate as oracle_generate  # noqa: E402

PROMPT = "First Citizen:\nBefore we"


def main():
    model = load_model()
    n = 70 - len(PROMPT)                       # crosses the plan boundaries at 32 and 64
    out, report = {}, {}
    for graph in (False, True):
        eng = DecodeEngine(model, LabConfig(backend="cuda", ranks=2, graph=graph))
        gen = eng.generate(PROMPT, n)
        out[graph] = (gen.tokens, eng.logits(0), eng.logits(1))
        if graph:
            report["node_types"] = [g.node_types() for g in eng.graphs[eng.plan(0).key]]
            report["ledger"] = eng.ledger_summary()
        eng.close()
    oracle = np.asarray(oracle_generate(model, model.tokenizer.encode(PROMPT), n))
    report["oracle"] = bool(np.array_equal(out[True][0], oracle))
    report["graph_eq_eager"] = all(bool(np.array_equal(a, b)) for a, b in zip(out[False], out[True]))
    report["ranks_agree"] = bool(np.array_equal(out[True][1], out[True][2]))
    eng = DecodeEngine(model, LabConfig(backend="cuda", ranks=2, bugs={"rank_skew"}))
    try:
        eng.generate("ROMEO.\n", 70)
        report["skew"] = "not refused"
    except CollectiveError as exc:
        report["skew"] = str(exc)
    report["skew_position"] = eng.position
    eng.close()
    print(json.dumps(report), flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
