"""The replay gate sees every graph key: case study 004 in each of its forms -- the step count
(LAB_BUG_STEP_KEY), the position the drafting device reached (LAB_BUG_SPEC_KEY), position // 2,
position + 1, a counter with no name, a key that repeats once before it changes, a clock tick --
is NOT MEANINGFUL in `bench`, flagged by `audit`'s key check and visible in the ledger, whatever
its replay share (a warm-up that visits the timed positions captures every per-position graph
before timing starts). Clean arms -- eager, graph, graph + PDL, drafting, LAB_PLAN_SWITCH=update,
crossing plan boundaries -- stay meaningful. Everything runs on a one-layer model with a handful
of tokens: the gate reads ledgers, not weights."""
import dataclasses
import json
import string

import numpy as np
import pytest

from lab.__main__ import main
from lab.backend.costmodel import CostModel
from lab.backend.sim import SimBackend
from lab.config import LabConfig
from lab.engine.bugs import KEY_VARIANTS, key_variant_step
from lab.engine.runner import DecodeEngine
from lab.engine.draft import DraftStep
from lab.ledger import LedgerEntry, key_changes, key_parts, key_text, recaptures
from lab.measure import bench, report
from lab.model import ModelConfig, random_model, sha256_of
from lab.plan import plan_boundaries
from lab.measure.audit import run_checks
from lab.measure.replay_check import key_parts_beyond_plan, never_repeating

VOCAB = "\n !$&',-.3:;?" + string.ascii_letters
SMALL = ModelConfig(vocab=VOCAB, d_model=32, n_layer=1, n_head=2, d_ff=64, max_seq=128,
                    rope_theta=10000.0, norm_eps=1e-5)
SIM = LabConfig(backend="sim")
PLAN_A = ("splits", 1, "pdl", False)
PLAN_B = ("splits", 2, "pdl", False)


@pytest.fixture(scope="module")
def small():
    return random_model(SMALL)


def entry(step, plan, key, outcome="replay"):
    return LedgerEntry(step, step, key, outcome, "", plan)


# ---- the ledger's key reading, on hand-made entries ----------------------------------------
def test_key_parts_name_what_has_a_name_and_number_what_has_none():
    assert key_parts(PLAN_A + ("pos", 7)) == [("splits", 1), ("pdl", False), ("pos", 7)]
    assert key_parts(PLAN_A + (12,)) == [("splits", 1), ("pdl", False), ("part 4 (no name)", 12)]
    assert key_parts((3,) + PLAN_A) == [("part 0 (no name)", 3), ("splits", 1), ("pdl", False)]
    assert key_parts(PLAN_A + ("pos", 1, "pos", 2))[-1] == ("pos#2", 2)
    assert key_text(PLAN_A + (12,)) == "splits=1 pdl=0 [4]=12"
    # an entry built without its plan (older callers) takes its key as the plan
    assert LedgerEntry(0, 0, PLAN_A, "eager").plan == PLAN_A


def test_key_changes_finds_each_part_that_moves_under_one_plan():
    clean = [entry(0, PLAN_A, PLAN_A, "capture"), entry(1, PLAN_A, PLAN_A),
             entry(2, PLAN_B, PLAN_B, "capture"), entry(3, PLAN_B, PLAN_B)]
    assert key_changes(clean) == {}                         # a plan change is the design
    moved = [entry(i, PLAN_A, PLAN_A + (i // 2,), "capture" if i % 2 == 0 else "replay")
             for i in range(4)]
    assert key_changes(moved) == {PLAN_A: {"part 4 (no name)": [0, 1]}}
    extra = [entry(0, PLAN_A, PLAN_A, "capture"), entry(1, PLAN_A, PLAN_A + ("t", 9), "capture")]
    assert key_changes(extra) == {PLAN_A: {"t": ["(absent)", 9]}}
    # eager steps and fallbacks look no graph up: their keys do not count
    assert key_changes([entry(0, PLAN_A, PLAN_A + (1,), "eager"),
                        entry(1, PLAN_A, PLAN_A + (2,), "fallback")]) == {}


def test_recaptures_count_a_capture_of_a_plan_already_run():
    warm = [entry(0, PLAN_A, PLAN_A, "capture"), entry(1, PLAN_B, PLAN_B, "capture")]
    assert recaptures(warm, [entry(2, PLAN_A, PLAN_A), entry(3, PLAN_B, PLAN_B)]) == {}
    assert recaptures(warm, [entry(2, PLAN_A, PLAN_A + (1,), "capture")]) == {PLAN_A: 1}
    # a plan met for the first time in the timed runs is captured there once, then replayed
    first = [entry(0, PLAN_A, PLAN_A, "capture"), entry(1, PLAN_A, PLAN_A, "capture")]
    assert recaptures([], first) == {PLAN_A: 1}


def test_key_gate_names_the_plan_and_the_parts():
    warm = [entry(i, PLAN_A, PLAN_A + ("pos", i), "capture") for i in range(3)]
    timed = [entry(3 + i, PLAN_A, PLAN_A + ("pos", i)) for i in range(3)]
    (why,) = bench.key_gate(warm, timed)
    assert "plan (splits=1 pdl=0) met 3 graph keys" in why
    assert "'pos' took 3 values: 0, 1, 2" in why
    summary = {"name": "B", "mode": "graph", "key_faults": [why]}
    assert bench.replay_gate([summary]) == f"arm B keyed its graphs on more than its plans: {why}"
    assert bench.replay_gate([{**summary, "key_faults": []}]) == ""
    assert bench.replay_gate([{"name": "old", "mode": "graph"}]) == ""   # a recorded result


# ---- each form of the bug: bench, audit and the ledger -------------------------------------
# (name, the config, the step variant or None, the key part that changes)
FORMS = [("step_key", SIM.replace(bugs={"step_key"}), None, "step"),
         ("spec_key", SIM.replace(draft=4, bugs={"spec_key"}), None, "pos"),
         ("half_position", SIM, "half_position", "half"),
         ("next_position", SIM, "next_position", "ctx"),
         ("unnamed_counter", SIM, "unnamed_counter", "part 10 (no name)"),
         ("pair", SIM, "pair", "pair"),
         ("clock", SIM, "clock", "tick"),
         ("half_position, drafting", SIM.replace(draft=4), "half_position", "half")]


def test_the_forms_cover_every_key_variant():
    assert set(KEY_VARIANTS) <= {variant for _, _, variant, _ in FORMS}


def _step(cfg, variant):
    if variant is None:
        return None
    return key_variant_step(variant, DraftStep) if cfg.draft else key_variant_step(variant)


def _engine(small, cfg, step):
    kw = {} if step is None else {"step": step}
    return DecodeEngine(small, cfg, backend=SimBackend(CostModel.load(), seed=1000), **kw)


@pytest.mark.parametrize("name, cfg, variant, part", FORMS, ids=[f[0] for f in FORMS])
def test_every_form_is_caught_by_bench_audit_and_the_ledger(small, name, cfg, variant, part):
    step = _step(cfg, variant)
    eng = _engine(small, cfg, step)
    # bench: the eager and the graph arm share the variant's engine (the pool, pre-filled)
    res = bench.run_ab(small, cfg.replace(graph=False), cfg, reps=2, tokens=4, per_token=0,
                       aa=False, pool={bench.pool_key(cfg): eng})
    b = res["arms"][1]
    assert res["meaningful"] is False, res
    assert "arm B keyed its graphs on more than its plans" in res["reason"]
    assert f"plan ({key_text(eng.plan().key)})" in res["reason"] and repr(part) in res["reason"]
    assert b["graph_keys"] > b["plans"] == 1
    assert "NOT MEANINGFUL: " in report.format_ab(res) and repr(part) in report.format_ab(res)
    # the ledger: the engine's own, read with key_changes, names the part under the plan
    assert part in key_changes(eng.ledger)[eng.plan().key]
    # audit: the key check of `decode-lab audit`, on a run of its own
    found = run_checks(small, cfg, step=step)
    assert [f for f in found if f.startswith(f"[BUG] graph key: its {part!r} ")], found
    assert list(key_parts_beyond_plan(eng.ledger)) == [part]


def test_the_replay_share_alone_passes_the_forms_a_warm_up_hides(small):
    """Why the gate counts keys: the warm-up visits the timed positions, so a key per position
    (or per half position) is captured before timing starts and every timed step replays."""
    for variant in ("half_position", "next_position"):
        eng = _engine(small, SIM, key_variant_step(variant))
        res = bench.run_ab(small, SIM.replace(graph=False), SIM, reps=2, tokens=4, per_token=0,
                           aa=False, pool={bench.pool_key(SIM): eng})
        b = res["arms"][1]
        assert (b["mode"], b["replay_fraction"], b["ledger"]) == ("graph", 1.0, {"replay": 20})
        assert res["meaningful"] is False
    # and the named, never-repeating check misses the forms with no name or with repeats
    for variant in ("unnamed_counter", "pair", "half_position"):
        eng = _engine(small, SIM, key_variant_step(variant))
        eng.generate("ROMEO.\n", 12)
        assert never_repeating(eng.ledger) == set() and key_parts_beyond_plan(eng.ledger)


def test_the_cli_refuses_the_speculative_form(small, tmp_path, monkeypatch, capsys):
    """The issue's command: LAB_DRAFT=4 LAB_BUG_SPEC_KEY=1 decode-lab bench ab --a LAB_GRAPH=0
    --b LAB_GRAPH=1: B replays 100% of its timed steps and is NOT MEANINGFUL, naming 'pos'."""
    npz = tmp_path / "small.npz"
    np.savez(npz, **small.weights)
    (tmp_path / "small.json").write_text(json.dumps({**dataclasses.asdict(SMALL),
                                                     "sha256": sha256_of(npz)}))
    monkeypatch.setenv("LAB_DRAFT", "4")
    monkeypatch.setenv("LAB_BUG_SPEC_KEY", "1")
    assert main(["bench", "ab", "--a", "LAB_GRAPH=0", "--b", "LAB_GRAPH=1", "--backend", "sim",
                 "--reps", "2", "--tokens", "4", "--per-token", "0", "--weights", str(npz)]) == 0
    out = capsys.readouterr().out
    row_b = next(line for line in out.splitlines() if line.startswith("B "))
    assert row_b.split()[-1] == "100.0%"
    assert "NOT MEANINGFUL: arm B keyed its graphs on more than its plans: plan (" in out
    assert "draft=4) met" in out and "'pos' took" in out


# ---- clean arms stay meaningful ------------------------------------------------------------
def test_clean_arms_crossing_a_plan_boundary_stay_meaningful(small):
    """Eager against graph across the first plan boundary, behind the A/A gate on the shared
    engine (A' captures nothing: A's warm-up did), and graph against graph + PDL."""
    tokens = plan_boundaries(SMALL.max_seq)[0] + 2 - (len(bench.BENCH_PROMPT) - 1)
    pool = {}
    res = bench.run_ab(small, SIM.replace(graph=False), SIM, reps=3, tokens=tokens, per_token=0,
                       pool=pool)
    assert res["meaningful"] is True and res["reason"] == "", res["reason"]
    graph = res["arms"][1]
    assert (graph["plans"], graph["graph_keys"], graph["key_faults"]) == (2, 2, [])
    pdl = bench.run_ab(small, SIM, SIM.replace(pdl=True), reps=2, tokens=tokens, per_token=0,
                       aa=False, pool=pool)
    assert pdl["meaningful"] is None and pdl["reason"] == "", pdl["reason"]
    assert [a["plans"] for a in pdl["arms"]] == [2, 2]


@pytest.mark.parametrize("cfg", [SIM.replace(draft=4), SIM.replace(plan_switch="update")],
                         ids=["drafting", "plan-switch-update"])
def test_other_clean_arms_stay_meaningful(small, cfg):
    tokens = 4 if cfg.draft else plan_boundaries(SMALL.max_seq)[0] + 2 - (len(bench.BENCH_PROMPT) - 1)
    res = bench.run_ab(small, cfg.replace(graph=False), cfg, reps=2, tokens=tokens, per_token=0,
                       aa=False)
    assert res["meaningful"] is None and res["reason"] == "", res["reason"]
    assert res["arms"][1]["replay_fraction"] == 1.0 and not res["arms"][1]["key_faults"]
    assert run_checks(small, cfg) == []                  # audit's key check: nothing either


def test_the_gate_counts_only_the_arms_own_entries(small):
    """The engine's earlier history is not the arm's: a clean engine that ran a request, then
    dropped its graphs, captures again in the arm's warm-up, and passes."""
    eng = _engine(small, SIM, None)
    eng.generate("ROMEO.\n", 6)
    eng.drop_graphs()
    history = len(eng.ledger)
    res = bench.run_ab(small, SIM.replace(graph=False), SIM, reps=2, tokens=4, per_token=0,
                       aa=False, pool={bench.pool_key(SIM): eng})
    assert res["meaningful"] is None and res["reason"] == "", res["reason"]
    # read from the engine's whole ledger, the warm-up's capture would be a plan captured again
    assert recaptures(eng.ledger[:history], eng.ledger[history:])


def test_a_sweep_gates_the_keys_at_each_context(small):
    eng = _engine(small, SIM, key_variant_step("half_position"))
    res = bench.sweep_arms([bench.Arm("half", SIM, eng)], [16], reps=2, tokens=4,
                           prompt=bench.BENCH_PROMPT)
    assert res["meaningful"] is False and res["rows"][0]["replay_fraction"] == 1.0
    assert res["reason"].startswith("arm half at context 16 keyed its graphs on more than its "
                                    "plans: plan (") and "'half' took 2 values: 8, 9" in res["reason"]
