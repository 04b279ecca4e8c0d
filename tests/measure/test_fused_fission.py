"""Lecture §6 on the fused step: attn_fused split into its phases (LAB_SPLIT_COMBINE=1 under
LAB_FUSION=1: attn_partial_wide, attn_merge, attn_project_heads; the same bits, 8 more launches
per token).

Device-free: the cost recorder (decode-lab record costs) measures every launch of both arms
at every plan; on the simulator, from the recorded component costs, eagerly the split LOSES (more
host launches on a host-bound step) and captured it WINS, each A/B behind a passing A/A gate --
skipped, naming the launches, while data/gpu/kernel_costs.json has no recorded cost for some
launch of the two arms (the cost model would stand in another kernel's time: see
lab/backend/costmodel.py); the conformance rows of the two arms, held against a fission.json
that records them. (The split's bits: tests/engine/test_fusion.py.)
"""
import json
import shutil

import pytest

from lab.backend.costmodel import COSTS_FILE, CostModel, cost_key
from lab.backend.sim import SimBackend
from lab.config import LabConfig
from lab.engine.runner import DecodeEngine
from lab.measure import bench, conformance
from lab.plan import plan_boundaries

SIM = LabConfig(backend="sim")
FUSED = SIM.replace(fusion=True, attn_tail="heads")   # lecture §6's case: the heads tail


def _keys(model, cfgs) -> set:
    """The cost keys of every launch of the steps of `cfgs` at every plan (each plan's first
    position)."""
    eng = DecodeEngine(model, SIM)
    keys = set()
    for cfg in cfgs:
        eng.cfg = cfg
        for pos in [0, *plan_boundaries(model.cfg.max_seq)]:
            keys |= {cost_key(x) for x in eng.step_launches(eng.plan(pos))}
    return keys


def test_the_cost_recorder_measures_every_launch_of_both_arms(model):
    from lab.measure.costfile import kernel_launches, step_configs
    base = SIM.replace(graph=False)
    recorded = {key for _, key, _ in kernel_launches(DecodeEngine(model, base), step_configs(base))}
    grid = FUSED.replace(attn_tail="grid")
    needed = _keys(model, [FUSED, FUSED.replace(split_combine=True), grid,
                           grid.replace(split_combine=True)])
    assert needed <= recorded, sorted(needed - recorded)


def test_the_simulator_shows_the_sign_flip_from_the_recorded_costs(model):
    """Eagerly the split's 8 extra launches cost the host more than the device saves; captured
    the launches are graph nodes and the split's grids beat attn_fused's per-head tail."""
    cost = CostModel.load()
    missing = sorted(_keys(model, [FUSED, FUSED.replace(split_combine=True)]) - set(cost.kernels))
    if missing:
        pytest.skip(f"{COSTS_FILE.name} has no recorded cost for {len(missing)} launch(es) of the "
                    f"fused arms ({', '.join(sorted({k.split(' ')[0] for k in missing}))}): "
                    f"record them with decode-lab record costs on a GPU")
    diffs = {}
    for mode in ("eager", "graph"):
        a = FUSED.replace(graph=(mode == "graph"))
        res = bench.run_ab(model, a, a.replace(split_combine=True), reps=5, tokens=32,
                           names=("fused", "split"), per_token=0)
        assert res["aa"]["ok"] and res["meaningful"], res.get("reason")
        assert res["outputs_identical_ab"]                   # the split is the fused bits
        diffs[mode] = res["diff_b_minus_a_ms"]
    assert diffs["eager"] > 0 > diffs["graph"], diffs


@pytest.mark.slow
@pytest.mark.xdist_group("conformance")   # re-uses the conformance tests' simulation
def test_conformance_holds_the_fused_fission_rows_against_a_recording(model, tmp_path):
    """The two rows appear when fission.json records the fused arms (here: a recording made the
    way decode-lab record costs makes one, on the simulator with its noise) and pass when
    the prediction matches it; a fission.json without them gives no such row."""
    data = tmp_path / "gpu"
    shutil.copytree(COSTS_FILE.parent, data)
    rec = json.loads((data / "fission.json").read_text())
    rec.pop("fused", None)                       # a recording made before the fused split
    (data / "fission.json").write_text(json.dumps(rec))
    before = conformance.run(model, data, only=("fission",))
    assert not [r for r in before["rows"] if r.lesson.startswith("fused fission")]
    rec = json.loads((data / "fission.json").read_text())
    cost = CostModel.load(data / "kernel_costs.json")
    pool = {bench.pool_key(FUSED): DecodeEngine(model, FUSED, backend=SimBackend(cost, seed=7))}
    rec["fused"] = {mode: bench.run_ab(model, FUSED.replace(graph=(mode == "graph")),
                                       FUSED.replace(graph=(mode == "graph"), split_combine=True),
                                       reps=5, tokens=32, names=("fused", "split"), per_token=0,
                                       pool=pool)
                    for mode in ("eager", "graph")}
    (data / "fission.json").write_text(json.dumps(rec))
    report = conformance.run(model, data, only=("fission",))
    rows = {r.lesson: r for r in report["rows"]}
    for mode in ("eager", "graph"):
        row = rows[f"fused fission ({mode}): split - fused"]
        assert row.ok, conformance.format_report(report)
