"""The simulator's cost model: built only from the recorded component costs, with a clear error
for a missing or malformed file, and every figure traceable to the key it came from."""
import json

import numpy as np
import pytest

from lab.backend import Launch
from lab.backend.costmodel import COSTS_FILE, CostModel, cost_key, launch_bytes
from lab.backend.sim import SimBackend
from lab.config import LabConfig
from lab.engine.runner import DecodeEngine
from lab.errors import LabError

SIM = LabConfig(backend="sim")


@pytest.fixture(scope="module")
def recorded():
    return json.loads(COSTS_FILE.read_text())


def test_the_committed_file_is_a_gpu_measurement(recorded):
    assert recorded["source"].startswith("measured on NVIDIA")
    assert recorded["date"]
    cost = CostModel.load()
    assert cost.describe().startswith("component costs from kernel_costs.json, measured on")


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(LabError, match=r"cost file .*nope\.json is missing.*decode-lab record costs"):
        CostModel.load(tmp_path / "nope.json")


def test_malformed_file_is_a_clear_error(tmp_path, recorded):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(LabError, match="bad.json is unreadable"):
        CostModel.load(bad)
    broken = dict(recorded)
    broken["floors"] = {k: v for k, v in recorded["floors"].items() if k != "empty_pdl"}
    bad.write_text(json.dumps(broken))
    with pytest.raises(LabError, match="bad.json: missing key 'floors.empty_pdl.per_node_us'"):
        CostModel.load(bad)
    broken = json.loads(json.dumps(recorded))
    broken["floors"]["graph_submit_us"] = -1
    bad.write_text(json.dumps(broken))
    with pytest.raises(LabError, match=r"bad.json: floors.graph_submit_us: must be a finite number > 0, got -1"):
        CostModel.load(bad)


def test_a_file_is_read_once_per_content_and_each_load_is_a_new_model(tmp_path, recorded):
    """CostModel.load keeps what it read per content of the file (and its supplement): the same
    bytes again give an equal model with its own list of misses; other bytes at the same path,
    even written within the same clock tick, are read again; a bad file is refused every time."""
    path = tmp_path / "kernel_costs.json"
    path.write_text(json.dumps(recorded))
    a, b = CostModel.load(path), CostModel.load(path)
    assert a == b and a is not b and a.misses is not b.misses
    a.misses.add("a launch")
    assert not b.misses
    changed = json.loads(json.dumps(recorded))
    changed["floors"]["graph_submit_us"] = recorded["floors"]["graph_submit_us"] + 1
    path.write_text(json.dumps(changed))
    assert CostModel.load(path).graph_submit_us == pytest.approx(a.graph_submit_us + 1)
    (tmp_path / "spec_costs.json").write_text("{not json")   # the supplement is part of the key
    with pytest.raises(LabError, match="spec_costs.json is unreadable"):
        CostModel.load(path)
    (tmp_path / "spec_costs.json").unlink()
    path.write_text("{not json")
    for _ in range(2):
        with pytest.raises(LabError, match="is unreadable"):
            CostModel.load(path)


def test_the_simulator_refuses_to_run_without_its_costs(monkeypatch, tmp_path):
    import lab.backend.costmodel as cm
    monkeypatch.setattr(cm, "COSTS_FILE", tmp_path / "missing.json")
    with pytest.raises(LabError, match="missing.json is missing"):
        SimBackend()


def test_every_figure_names_its_source_key():
    cost = CostModel.load()
    fields = {f for f in cost.__dataclass_fields__ if f not in
              ("source", "path", "date", "host_scale", "misses")}
    assert fields <= set(cost.sources), fields - set(cost.sources)


def test_node_times_are_the_measured_ones_at_measured_contexts(model, recorded):
    cost = CostModel.load()
    eng = DecodeEngine(model, SIM.replace(graph=False))
    launches = {cost_key(x): x for x in eng.step_launches(eng.plan(64))}
    rows = [r for r in recorded["kernels"] if r["position"] == 64 and r["key"] in launches]
    assert len(rows) >= 9
    for r in rows:
        got = cost.node_us(launches[r["key"]], r["context"], False)
        assert got == pytest.approx(r["node_us"], rel=0.05, abs=0.05), r["key"]
        assert launch_bytes(launches[r["key"]], r["context"]) == r["bytes"]
    assert not cost.misses


def test_attention_grows_with_context_within_a_plan(model):
    cost = CostModel.load()
    eng = DecodeEngine(model, SIM.replace(graph=False))
    partial = next(x for x in eng.step_launches(eng.plan(600)) if x.name == "attn_partial")
    assert cost.node_us(partial, 1000, False) > cost.node_us(partial, 520, False)


def test_unmeasured_launches_take_their_twin_or_the_floor_and_are_listed(model):
    cost = CostModel.load().replace()
    eng = DecodeEngine(model, SIM.replace(graph=False, bugs={"late_wait"}))
    late = next(x for x in eng.step_launches(eng.plan(64)) if x.name == "rmsnorm_late_wait")
    clean = next(x for x in DecodeEngine(model, SIM.replace(graph=False)).step_launches(
        eng.plan(64)) if x.name == "rmsnorm")
    assert cost.node_us(late, 65, False) == cost.node_us(clean, 65, False)
    assert cost_key(late) in cost.misses


def test_the_ngram_drafter_stands_in_as_prompt_lookup_until_recorded_and_reads_a_few_bytes(
        model):
    """draft_ngram, under a cost file without its rows, costs a recorded draft_lookup launch
    (the kernel that does its job) and is listed as a miss; its bytes count one table entry
    per column, not the table (25 MB), so a recorded row of it cannot skew the bandwidth fit."""
    whole = CostModel.load()
    cost = whole.replace(kernels={k: f for k, f in whole.kernels.items()
                                  if not k.startswith("draft_ngram ")})
    eng = DecodeEngine(model, SIM.replace(graph=False, draft=4, drafter="ngram"))
    ngram = eng.step_launches(eng.plan(64))[0]
    assert ngram.name == "draft_ngram"
    lookups = [f for k, f in cost.kernels.items() if k.startswith("draft_lookup ")]
    assert lookups and cost._fit_for(ngram) in lookups
    assert cost.misses == {cost_key(ngram)}
    table = eng.devices[0].draft.table
    assert table.nbytes > 20e6
    others = sum(b.nbytes for n, b in zip(ngram.kernel.arg_names, ngram.args) if n != "table")
    assert launch_bytes(ngram, 65) == others + 5          # T = 5 columns, one byte each


def test_a_launch_whose_geometry_changed_takes_the_same_work_recorded_and_is_listed(model):
    """A kernel relaunched with another grid/block on the SAME argument shapes (its geometry
    changed since the recording) costs what that work was recorded at, and is listed as a miss
    until it is recorded again -- not the nearest-bytes guess, which can be another plan's."""
    cost = CostModel.load().replace()
    eng = DecodeEngine(model, SIM.replace(graph=False))
    mv = next(x for x in eng.step_launches(eng.plan(64)) if x.name == "matvec")
    assert cost_key(mv) in cost.kernels
    moved = Launch(mv.kernel, (mv.grid[0] * 2,), (mv.block[0] // 2,), mv.args, mv.layer, mv.stream)
    assert cost.node_us(moved, 65, False) == cost.node_us(mv, 65, False)
    assert cost.misses == {cost_key(moved)}


def test_same_seed_same_time_other_seed_other_noise(model):
    def ms(seed):
        eng = DecodeEngine(model, SIM.replace(graph=False), backend=SimBackend(seed=seed))
        return eng.generate("ROMEO.\n", 8).ms_per_token
    assert ms(3) == ms(3) and ms(3) != ms(4)


def test_pipeline_eager_is_host_bound_and_graph_device_bound(model):
    cost = CostModel.load()
    eng = DecodeEngine(model, SIM.replace(graph=False))
    steps = eng.step_launches(eng.plan(64))
    host = sum(cost.host_launch_us["prebound"].get(cost_key(x), 0) for x in steps)
    device = sum(cost.node_us(x, 65, False) for x in steps)
    assert host > device                  # pre-bound eager still waits for the host
    assert cost.graph_submit_us + cost.engine_host_us["graph"] < device / 4
    assert np.isfinite([cost.launch_jitter, cost.drift, cost.node_jitter]).all()


def test_a_capture_costs_the_host_what_was_measured(model, recorded, tmp_path):
    """floors.capture (the costs experiment's capture_floor): the simulator charges a capture
    and an instantiation on the host, per graph and per node, so a step that captures every
    time (LAB_BUG_SPEC_KEY) costs what it would; a file without the recording charges 0."""
    data = json.loads(json.dumps(recorded))
    data["floors"].pop("capture", None)
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps(data))
    data["floors"]["capture"] = {"capture": {"per_node_us": 5.0, "intercept_us": 150.0},
                                 "instantiate": {"per_node_us": 4.0, "intercept_us": 50.0}}
    timed = tmp_path / "capture.json"
    timed.write_text(json.dumps(data))
    none, cap = CostModel.load(plain), CostModel.load(timed)
    assert none.capture_host_us(42) == 0.0 and none.instantiate_host_us(42) == 0.0
    assert cap.capture_host_us(42) == pytest.approx(150 + 5 * 42)
    assert cap.instantiate_host_us(42) == pytest.approx(50 + 4 * 42)
    ms = {}
    for name, cost in (("none", none), ("capture", cap)):
        for bugs in ((), ("spec_key",)):
            eng = DecodeEngine(model, LabConfig(backend="sim", draft=4, bugs=set(bugs)),
                               backend=SimBackend(cost.replace(launch_jitter=0.0, drift=0.0,
                                                               node_jitter=0.0)))
            ms[name, bugs] = eng.generate("ROMEO.\n", 24).ms_per_token
    # the clean arm captures once; the bug arm every step: only it pays, about 0.57 ms a step
    assert ms["capture", ()] - ms["none", ()] < 0.05
    assert ms["capture", ("spec_key",)] - ms["none", ("spec_key",)] > 0.3


def test_a_key_measured_at_many_contexts_is_interpolated_between_them():
    from lab.backend.costmodel import _fit
    rows = [{"context": c, "node_us": u, "node_pdl_us": u - 0.5, "bytes": 1}
            for c, u in ((1, 9.0), (64, 21.0), (256, 75.0), (1000, 300.0))]
    fit = _fit(rows)
    for c, u in ((1, 9.0), (64, 21.0), (256, 75.0), (1000, 300.0)):
        assert fit.node(c, False) == pytest.approx(u) and fit.node(c, True) == pytest.approx(u - 0.5)
    assert fit.node(160, False) == pytest.approx(48.0)              # halfway between 64 and 256
    assert fit.node(1024, False) > 300.0                             # extended by the last slope
    two = _fit(rows[:2])                                             # two contexts: the line
    assert not two.knots and two.node(127, False) == pytest.approx(33.0)


def test_the_supplement_adds_what_the_cost_file_lacks(recorded, tmp_path):
    from lab.backend.costmodel import SUPPLEMENT, with_supplement
    row = {"key": "verify_partial grid=(4, 17) block=(128,) [x]", "kernel": "verify_partial",
           "context": 65, "node_us": 10.0, "node_pdl_us": 9.5, "bytes": 100}
    old = dict(recorded["kernels"][0], node_us=99.0)           # a key the file has: the file wins
    extra = {"source": "measured on NVIDIA X, v", "date": "d", "kernels": [row, old],
             "switches": [], "floors": {"capture": {"capture": {"per_node_us": 4.0, "intercept_us": 19.0},
                                                    "instantiate": {"per_node_us": 3.0, "intercept_us": 26.0}}}}
    merged = with_supplement({k: v for k, v in recorded.items()}, extra)
    assert row["key"] in {r["key"] for r in merged["kernels"]}
    assert ([r for r in merged["kernels"] if r["key"] == old["key"]]
            == [r for r in recorded["kernels"] if r["key"] == old["key"]])
    base = tmp_path / "kernel_costs.json"
    base.write_text(json.dumps({**recorded, "floors": {k: v for k, v in recorded["floors"].items()
                                                       if k != "capture"}}))
    (tmp_path / SUPPLEMENT).write_text(json.dumps(extra))
    cost = CostModel.load(base)
    assert cost.kernels[row["key"]].node(65, False) == pytest.approx(10.0)
    assert cost.capture_host_us(10) == pytest.approx(59.0)
    assert "spec_costs.json: measured on NVIDIA X" in cost.describe()


# ---- the persistent step (LAB_PERSISTENT=1): recorded rows, or the documented stand-in ------------
PERSIST = SIM.replace(persistent=True)


def _persistent_rows(model, node_us):
    """Synthetic kernel_costs rows for step_persistent, as the costs experiment's
    measure_persistent (lab/measure/costfile.py) writes them: one key per plan (part_o's shape is in the key), at the
    plan's first and last position; node_us(context) the recorded time, no PDL of its own."""
    from lab.plan import plan_boundaries
    eng = DecodeEngine(model, PERSIST.replace(graph=False))
    starts = [0, *plan_boundaries(model.cfg.max_seq)]
    rows = []
    for lo, hi in zip(starts, [*starts[1:], model.cfg.max_seq]):
        for position in (lo, hi - 2):
            (launch,) = eng.step_launches(eng.plan(position))
            us = node_us(position + 1)
            rows.append({"key": cost_key(launch), "kernel": "step_persistent", "position": position,
                         "context": position + 1, "grid": list(launch.grid),
                         "block": list(launch.block), "bytes": launch_bytes(launch, position + 1),
                         "instances": 1, "splits": eng.plan(position).splits, "node_us": us,
                         "node_pdl_us": us, "intercept_us": 1.0, "intercept_pdl_us": 1.0})
    return rows


def test_the_persistent_step_is_priced_from_its_recorded_rows_or_a_stand_in(model, recorded):
    """Without step_persistent rows (the committed file predates them) the kernel costs the
    documented stand-in -- the empty-node floor plus its bytes (weights, and the KV rows it
    reads in every layer) over the fitted bandwidth -- and is listed as a miss; with them, the
    recorded time per plan's key, linear in the context between its two rows, and the
    simulated graph step moves by what the rows say. The rows leave the stand-ins' bandwidth
    alone (a whole step's bytes would swamp the per-kernel fit)."""
    before = json.loads(json.dumps(recorded))       # a file recorded before measure_persistent
    before["kernels"] = [r for r in before["kernels"] if r["kernel"] != "step_persistent"]
    plain = CostModel.from_dict(before).replace()
    eng = DecodeEngine(model, PERSIST.replace(graph=False))
    (launch,) = eng.step_launches(eng.plan(64))
    assert cost_key(launch) not in plain.kernels
    stand_in = plain.empty_node_us + launch_bytes(launch, 65) / (plain.bandwidth_gbs * 1e3)
    assert plain.node_us(launch, 65, False) == pytest.approx(stand_in)
    assert plain.misses == {cost_key(launch)}
    kv_row = 2 * model.cfg.n_layer * model.cfg.d_model * 4      # K and V, every layer, float32
    assert launch_bytes(launch, 101) - launch_bytes(launch, 1) == 100 * kv_row

    ms = {}
    for extra in (0.0, 50.0):
        data = json.loads(json.dumps(before))
        data["kernels"] += _persistent_rows(model, lambda c: 30.0 + extra + 0.01 * c)
        cost = CostModel.from_dict(data).replace(launch_jitter=0.0, drift=0.0, node_jitter=0.0)
        assert cost.bandwidth_gbs == plain.bandwidth_gbs
        assert cost.node_us(launch, 65, False) == pytest.approx(30.0 + extra + 0.65)
        assert cost.node_us(launch, 100, False) == pytest.approx(30.0 + extra + 1.0)
        sim = DecodeEngine(model, PERSIST.replace(graph=True), backend=SimBackend(cost))
        ms[extra] = sim.generate("ROMEO.\n", 24).ms_per_token
        assert not {k for k in cost.misses if k.startswith("step_persistent")}, cost.misses
    # one node per token: 50 us more per node is 0.05 ms more per token (device-bound replays)
    assert ms[50.0] - ms[0.0] == pytest.approx(0.05, rel=0.02)


def test_a_launch_at_an_unmeasured_geometry_costs_the_host_its_own_kernels_launch(model):
    """Host costs are measured at one position; before position 64 the attention kernels run
    other grids and partials shapes. Such a launch costs the host what its own kernel's launches
    cost (the argument list, not the grid, sets the host's work), not the mean of all kernels:
    that fallback once priced the fused heads tail's split 30% above the H200's eager A/B."""
    cost = CostModel.load().replace(launch_jitter=0.0)
    rng = np.random.default_rng(0)
    eng = DecodeEngine(model, SIM.replace(graph=False, fusion=True, attn_tail="heads"))
    eng.reset(eng.encode("ROMEO.\n"), 0)
    at = {p: next(x for x in eng.step_launches(eng.plan(p)) if x.name == "attn_fused")
          for p in (10, 64)}
    measured = cost.host_launch_us["prebound"]
    assert cost_key(at[64]) in measured and cost_key(at[10]) not in measured
    own = [us for k, us in measured.items() if k.startswith("attn_fused ")]
    mean_all = float(np.mean(list(measured.values())))
    assert cost.host_launch(at[10], "prebound", rng) == pytest.approx(float(np.mean(own)))
    assert abs(float(np.mean(own)) - mean_all) > 1.0       # the two fallbacks differ measurably
    # a kernel no step launches eagerly (the cost recorder's relay probe): the mechanism's mean
    from kernels import REGISTRY, probe
    buf = np.zeros(256, np.float32)
    unknown = Launch(REGISTRY["relay"], probe.RELAY_GRID, probe.RELAY_BLOCK, (buf, buf))
    assert not any(k.startswith("relay ") for k in measured)
    assert cost.host_launch(unknown, "prebound", rng) == pytest.approx(mean_all)
