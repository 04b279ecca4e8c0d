"""LAB_BUG_STEP_KEY: case study 004 on the lab's own ground. The graph cache is keyed on the
plan AND the engine's step count, so every capture succeeds, the tokens are right, and no graph is ever
replayed: the "graph" arm runs a capture per token. Nothing fails; only the ledger, the replay
gate and the audit's key check show it (tests/measure/test_replay_gate.py: this bug and its other forms)."""
import numpy as np
import pytest

from _bug_checks import PROMPT, clean_tokens
from lab.config import LabConfig
from lab.engine.runner import DecodeEngine
from lab.errors import LabError
from lab.measure import bench
from lab.model import ModelConfig, random_model
from lab.measure.audit import audit, detect_lazy_init
from lab.measure.replay_check import never_repeating, replay_check

VOCAB = "\n !$&',-.3:;?" + "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def check_position_key(model, cfg):
    bcfg = cfg.replace(bugs=frozenset({"step_key"}))
    eng = DecodeEngine(model, bcfg)
    gen = eng.generate(PROMPT, 40)
    np.testing.assert_array_equal(gen.tokens, clean_tokens(model, cfg))     # the text is right
    steps = len(PROMPT) - 1 + 40
    assert eng.ledger_summary() == {"capture": steps}                     # ... and never replayed
    assert len({e.plan_key for e in eng.ledger}) == steps                     # a new key every step
    assert not eng.capture_failures and not eng.warnings                  # nothing failed
    assert bench.replay_fraction(eng.ledger_summary()) == 0.0
    clean = DecodeEngine(model, cfg)
    clean.generate(PROMPT, 40)
    assert clean.ledger_summary()["replay"] == steps - len(clean.graphs)  # the clean cache hits
    assert never_repeating(clean.ledger) == set()
    # the tools for frozen values and illegal operations see nothing wrong
    assert not audit(DecodeEngine(model, bcfg)).unhandled
    assert not detect_lazy_init(model, bcfg).illegal
    assert replay_check(DecodeEngine(model, bcfg), [PROMPT], replays=3).ok


def test_sim(model):
    check_position_key(model, LabConfig(backend="sim"))


def test_the_replay_gate_refuses_the_graph_label():
    """Timed as a "graph" arm, the bug's step is a capture per token: the A/B's replay gate
    refuses to call it a graph arm and its reason shows the ledger, all captures."""
    small = random_model(ModelConfig(vocab=VOCAB, d_model=32, n_layer=1, n_head=2, d_ff=64,
                                     max_seq=128, rope_theta=10000.0, norm_eps=1e-5))
    sim = LabConfig(backend="sim")
    res = bench.run_ab(small, sim.replace(graph=False), sim.replace(bugs={"step_key"}),
                       reps=2, tokens=4, per_token=0)
    steps = 2 * (len(bench.BENCH_PROMPT) - 1 + 4)
    assert res["meaningful"] is False and res["arms"][1]["ledger"] == {"capture": steps}
    assert "arm B is not a graph arm: 0.0%" in res["reason"]
    assert f"ledger {{'capture': {steps}}}" in res["reason"]
    # ... and its keys: one plan, a graph key per step, the part that changed named
    assert "arm B keyed its graphs on more than its plans" in res["reason"]
    assert "'step' took" in res["reason"]


def test_the_device_loop_refuses_it():
    with pytest.raises(LabError, match="LAB_BUG_STEP_KEY=1 keys the host loop's graph cache"):
        LabConfig(backend="sim", loop="device", bugs={"step_key"})


@pytest.mark.gpu
def test_gpu(model):
    check_position_key(model, LabConfig(backend="cuda"))


def test_the_bug_table_shows_it_in_the_ledger_column(model):
    from lab.measure.audit import bug_row
    cfg = LabConfig(backend="sim")
    clean, bug = bug_row(model, cfg, None), bug_row(model, cfg, "step_key")
    assert clean["graph_ledger"]["replay"] > 0 and set(bug["graph_ledger"]) == {"capture"}
    assert bug["capture"] == "ok" and bug["replay_3"] == "pass" and not bug["audit_flags"]
