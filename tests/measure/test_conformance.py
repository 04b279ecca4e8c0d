"""Conformance: the simulator, built from component costs only, predicts every recorded GPU
lesson (same sign, within 25%; within 1 us for effects under 2 us; counts exact)."""
import json
import shutil

import numpy as np
import pytest

from lab.__main__ import main
from lab.errors import LabError
from lab.measure import conformance
from lab.measure.conformance import Row


# Every test here judges one simulation: conformance.run re-uses a process's simulated runs for
# the same model, costs and settings (the CLI test's copied data holds the same), so the module
# runs in one worker (xdist_group) and simulates once.
pytestmark = pytest.mark.xdist_group("conformance")


@pytest.fixture(scope="module")
def report(model):
    """The whole table, simulated (the slow tier: tests that use it are marked slow)."""
    return conformance.run(model)


@pytest.mark.slow
def test_every_recorded_lesson_passes_or_is_a_recorded_finding(report):
    """A row that fails must be a finding the data folder records with its reason, and every
    recorded finding's row must still fail (a stale finding is a failure too)."""
    assert conformance.findings_problems(report) == [], conformance.format_report(report)


def test_findings_problems_name_unrecorded_failures_and_stale_findings():
    bad, good = Row("a", "us/token", 9.0, -10.0), Row("b", "us/token", -9.0, -10.0)
    known = Row("c", "us/token", 1.0, 5.0, finding="measured: placement")
    report = {"rows": [bad, good, known], "findings": {"c": "measured: placement"}}
    assert conformance.findings_problems(report) == ["a: fails (FAIL)"]
    assert known.verdict == "FAIL (finding)" and not known.ok
    stale = {"rows": [good], "findings": {"b": "x", "gone": "y"}}
    problems = conformance.findings_problems(stale)
    assert any(p.startswith("b: a recorded finding") and "passes" in p for p in problems)
    assert any(p.startswith("gone: a recorded finding") for p in problems)
    # a subset of the lessons: a finding for a lesson not run is not stale
    assert conformance.findings_problems({**stale, "only_all": False}) == [problems[0]]


@pytest.mark.slow
def test_rows_that_echo_their_recording_are_labelled_consistency_checks(report):
    """A node row (a fit against its own measured points) and the persistent rung (one kernel
    priced from its own recorded node time) are consistency checks, not predictions; the
    whole-step A/B rows are predictions. The table says which, and counts them."""
    rows = {r.lesson: r for r in report["rows"]}
    nodes = [r for name, r in rows.items() if name.startswith("node: ")]
    assert nodes and all(r.consistency for r in nodes)
    assert rows["persistent: ms/token"].consistency
    for name in ("graph: ms/token", "graph+pdl: ms/token", "launches per token"):
        assert not rows[name].consistency, name
    table = conformance.format_report(report)
    assert "PASS [consistency check]" in table
    assert f"; {sum(r.consistency for r in report['rows'])} of the rows are consistency " \
           f"checks, not predictions" in table


@pytest.mark.slow
def test_the_table_covers_the_lessons(report):
    lessons = " ".join(r.lesson for r in report["rows"])
    for needle in ("dispatcher", "prebound", "graph: ms/token", "graph+pdl", "PDL: share", "overlap:",
                   "fission (eager)", "fission (graph)", "context", "launches per token",
                   "nodes per graph", "node: attn_partial", "device loop"):
        assert needle in lessons, needle
    if "fused" in json.loads((conformance.DATA_GPU / "fission.json").read_text()):
        assert "fused fission (eager)" in lessons and "fused fission (graph)" in lessons
    if (conformance.DATA_GPU / "spec.json").is_file():
        assert "spec (context 900): draft 4 - draft 0" in lessons and "bug arm's replays" in lessons
    if (conformance.DATA_GPU / "pdl_context.json").is_file():
        assert "PDL (context 900, chained step): graph+pdl - graph" in lessons
    assert report["gpu_source"].startswith("measured on NVIDIA")


def test_pdl_rows_judge_pdl_at_each_recorded_context():
    def chains(g64, p64, g900, p900, sem=0.1):
        def ctx(pos, g, p):
            return {"position": pos, "context": pos + 1, "rows": [
                {"arm": "graph", "us_per_step": g, "minus_pdl_us": g - p, "minus_pdl_sem_us": sem},
                {"arm": "graph+pdl", "us_per_step": p, "minus_pdl_us": 0.0, "minus_pdl_sem_us": 0.0}]}
        return {"contexts": [ctx(63, g64, p64), ctx(899, g900, p900)]}
    rows = []
    # pdl_rows(recorded, simulated, ...): PDL saving 10.5 us per step at both contexts
    conformance.pdl_rows(chains(72.5, 62.0, 82.6, 72.1), chains(71.6, 62.7, 79.0, 70.4), rows)
    assert [r.lesson for r in rows] == [
        "PDL (context 64, chained step): graph+pdl - graph",
        "PDL (context 900, chained step): graph+pdl - graph"]
    assert rows[1].gpu == pytest.approx(-10.5) and rows[1].sim == pytest.approx(-8.6)
    assert rows[1].gpu_sem == pytest.approx(0.1)
    assert all(r.ok for r in rows)
    rows = []      # the GPU's PDL LOSING at context 900 (the early trigger) against a gain
    conformance.pdl_rows(chains(72.5, 62.0, 82.6, 88.3), chains(71.6, 62.7, 79.0, 70.4), rows)
    assert [r.ok for r in rows] == [True, False]
    with pytest.raises(LabError, match="no simulated context 900"):
        sim = chains(71.6, 62.7, 79.0, 70.4)
        sim["contexts"] = sim["contexts"][:1]
        conformance.pdl_rows(chains(72.5, 62.0, 82.6, 72.1), sim, [])


def test_the_pdl_lesson_simulates_the_recorded_chains(model):
    """The simulator runs the recording's own protocol (lab/measure/pdl_edges.py) on its
    clock; on the committed costs its PDL saving per chained step has the H200's sign, and lies
    within conformance's band of it unless the data folder records that row as a finding (then
    it lies outside: a finding whose row passes is stale)."""
    from lab.backend.costmodel import CostModel
    from lab.backend.sim import SimBackend
    from lab.engine.runner import DecodeEngine
    from lab.config import LabConfig
    from lab.measure import pdl_edges
    cost = CostModel.load(conformance.DATA_GPU / "kernel_costs.json").replace(
        launch_jitter=0.0, drift=0.0, node_jitter=0.0)
    eng = DecodeEngine(model, LabConfig(backend="sim"), backend=SimBackend(cost, seed=1000))
    res = pdl_edges.measure(eng, 63, edges=True, rounds=2, replays=2)
    arms = {r["arm"]: r for r in res["rows"]}
    assert set(arms) == {"graph", "graph+pdl"} | {f"pdl - {k}" for k in res["kernels"]}
    saving, _ = pdl_edges.pdl_saving_us(res)
    recorded = json.loads((conformance.DATA_GPU / "pdl_context.json").read_text())
    h200 = next(c for c in recorded["contexts"] if int(c["position"]) == 63)
    gpu, _ = pdl_edges.pdl_saving_us(h200)       # the H200's saving per chained step there
    lesson = f"PDL (context {h200['context']}, chained step): graph+pdl - graph"
    finding = lesson in conformance._findings(conformance.DATA_GPU)
    near = abs(saving - gpu) <= conformance.REL_TOL * abs(gpu)
    assert saving < 0 and gpu < 0 and near != finding, (saving, gpu, finding)
    # leaving one kernel's launches plain gives back part of the saving, never more than all
    assert all(0.0 <= arms[f"pdl - {k}"]["minus_pdl_us"] <= -saving for k in res["kernels"])


@pytest.mark.parametrize("row,ok", [
    (Row("x", "us/token", -9.0, -10.0), True),          # within 25%
    (Row("x", "us/token", -7.0, -10.0), False),         # 30% off
    (Row("x", "us/token", 9.0, -10.0), False),          # wrong sign
    (Row("x", "us/token", 0.3, -0.5), True),            # small effect: within 1 us
    (Row("x", "us/token", 0.7, -0.5), False),           # small effect: 1.2 us off
    (Row("x", "ms", 0.12, 0.1), True),
    (Row("x", "count", 37, 37, True), True),
    (Row("x", "count", 41, 37, True), False),
    (Row("x", "ms", float("nan"), 0.1), False),
    (Row("x", "us/token", 27.0, 37.9, gpu_sem=9.4), True),    # 29% off, within 2 sem
    (Row("x", "us/token", 27.0, 37.9, gpu_sem=4.0), False),   # 29% off, 2.7 sem
    (Row("x", "us/token", -27.0, 37.9, gpu_sem=40.0), False),  # wrong sign: never noise
])
def test_verdict_rule(row, ok):
    assert row.ok is ok


@pytest.mark.slow
def test_cli_exits_nonzero_when_a_row_fails(tmp_path, capsys):
    data = tmp_path / "gpu"
    shutil.copytree(conformance.DATA_GPU, data)
    lad = json.loads((data / "ladder.json").read_text())
    for arm in lad["arms"]:
        if arm["name"] == "graph":
            arm["mean_ms"] *= 2                       # a GPU twice as slow as the model says
    (data / "ladder.json").write_text(json.dumps(lad))
    # the ladder's lesson alone (--only): the exit code and the row are what is checked here;
    # the whole table's rows are checked against a run of every lesson above
    assert main(["conformance", "--data", str(data), "--only", "ladder"]) == 1
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("graph: ms/token"))
    assert row.endswith("FAIL") and "rows pass" in out
    assert not any(line.startswith("fission") for line in out.splitlines())


def test_cli_only_an_unknown_lesson_is_a_clear_error(capsys):
    assert main(["conformance", "--only", "ladder,fision"]) == 2
    assert "unknown conformance lesson(s) ['fision']" in capsys.readouterr().err


def test_cli_missing_recording_is_a_clear_error(tmp_path, capsys):
    data = tmp_path / "gpu"
    shutil.copytree(conformance.DATA_GPU, data)
    (data / "overlap.json").unlink()
    assert main(["conformance", "--data", str(data)]) == 2
    assert "overlap.json is missing" in capsys.readouterr().err


@pytest.mark.parametrize("data, needle", [
    (".", "--data .: holds no kernel_costs.json"),          # a folder of something else
    ("README.md", "--data README.md: not a folder"),
])
def test_cli_data_that_is_no_recordings_folder_names_the_argument(capsys, data, needle):
    assert main(["conformance", "--data", data]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_a_subset_of_lessons_gives_the_same_rows_as_the_whole_table(model, report):
    """`only=` re-runs a subset (notebooks 06 and 07 show theirs); its rows are the whole
    table's rows for those lessons, and an unknown lesson is a clear error."""
    part = conformance.run(model, only=("fission", "nodes"))
    want = [r for r in report["rows"]
            if r.lesson.startswith(("fission", "fused fission", "fused grid fission", "node:"))]
    assert [(r.lesson, r.sim, r.gpu) for r in part["rows"]] == [(r.lesson, r.sim, r.gpu) for r in want]
    with pytest.raises(LabError, match="unknown conformance lesson"):
        conformance.run(model, only=("fision",))


@pytest.mark.parametrize("name, content, needle", [
    ("ladder.json", {}, "ladder.json: no field 'tokens'"),
    ("ladder.json", [], "ladder.json: expected a JSON object, got list"),
    ("overlap.json", {}, "overlap.json: no field 'tokens'"),
    ("bench_sweep.json", {"rows": [{"arm": "x"}]}, "bench_sweep.json: no field 'rows[0].toggles'"),
])
def test_a_recording_of_the_wrong_shape_is_a_clear_error(tmp_path, capsys, name, content, needle):
    """Valid JSON of the wrong shape (`{}` for ladder.json): one line naming the file and the
    field it lacks, exit 2, no KeyError."""
    data = tmp_path / "gpu"
    shutil.copytree(conformance.DATA_GPU, data)
    (data / name).write_text(json.dumps(content))
    assert main(["conformance", "--data", str(data)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("decode-lab: error:") and needle in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_a_kept_simulation_is_found_only_by_the_same_key_code_and_toggles(tmp_path, monkeypatch):
    """CACHE_ENV: a result another process simulated is re-used only under the same key, the
    same code (lab/, kernels/) and the same LAB_* environment; a torn file is simulated again."""
    monkeypatch.setenv(conformance.CACHE_ENV, str(tmp_path))
    calls = []

    def simulate(value):
        return lambda: calls.append(value) or {"value": value}
    assert conformance._kept(("k", 1), simulate(1)) == {"value": 1}
    assert conformance._kept(("k", 1), simulate(2)) == {"value": 1}      # kept: not simulated
    assert conformance._kept(("k", 2), simulate(3)) == {"value": 3}      # another key
    monkeypatch.setenv("LAB_PDL", "1")
    assert conformance._kept(("k", 1), simulate(4)) == {"value": 4}      # another toggle
    monkeypatch.delenv("LAB_PDL")
    monkeypatch.setattr(conformance, "_code_digest", lambda: "other code")
    assert conformance._kept(("k", 1), simulate(5)) == {"value": 5}      # other code
    for kept in tmp_path.glob("*.pickle"):
        kept.write_bytes(b"\x80")                                         # torn
    assert conformance._kept(("k", 1), simulate(6)) == {"value": 6}
    assert calls == [1, 3, 4, 5, 6]
    monkeypatch.delenv(conformance.CACHE_ENV)
    assert conformance._kept(("k", 1), simulate(7)) == {"value": 7}      # unset: nothing kept


def _stamp(path, us):
    data = json.loads(path.read_text())
    data["provenance"] = {"commit": "c", "host_probe": {"us_per_launch": us}}
    path.write_text(json.dumps(data))


@pytest.mark.slow
def test_a_slower_host_scales_host_paced_predictions_only_and_boundedly(model, report, tmp_path):
    """The committed data's probe is its cost file's (one pass): nothing scaled, and the report
    says so. A recording whose
    host probe is twice the cost file's doubles the eager (host-paced) predictions, a graph
    (device-paced) row never moves, and a probe 4x slower is bounded to 2x."""
    assert all(r.scale == 1.0 for r in report["rows"])
    assert "host-paced rows x1.00" in conformance.format_report(report)
    data = tmp_path / "gpu"
    shutil.copytree(conformance.DATA_GPU, data)
    _stamp(data / "kernel_costs.json", 3.0)
    _stamp(data / "fission.json", 6.0)
    _stamp(data / "ladder.json", 12.0)
    scaled = conformance.run(model, data_dir=data, only=("ladder", "fission"))
    before = {r.lesson: r for r in report["rows"]}
    paced = {r.lesson: r.host_paced for r in scaled["rows"]}
    assert paced["fission (eager): split - combine"] and paced["prebound: ms/token"]
    assert not paced["fission (graph): split - combine"] and not paced["graph: ms/token"]
    for r in scaled["rows"]:
        want = 2.0 if r.host_paced else 1.0
        assert r.scale == want and r.sim == pytest.approx(want * before[r.lesson].sim), r.lesson
    text = conformance.format_report(scaled)
    assert "host-paced rows x2.00" in text and "(ratio 4.00, bounded to [0.5, 2])" in text
    assert conformance.host_scale({}, {"provenance": {"host_probe": {"us_per_launch": 1}}},
                                  "x.json") == (1.0, "x.json has no host probe: not scaled")


def test_break_even_rows_predict_v_and_the_saving_and_check_e_per_text():
    """spec.json's break_even: per recorded text at k = SPEC_DRAFT, V (predicted from the
    component costs), what drafting saves per token, and E (the model's, recomputed: no row
    echoes its recording, so none is a consistency check)."""
    def even(v, e, msk, ms0):
        return {"texts": {"repeating": {}, "prose": {}}, "rows": [
            {"text": t, "draft": k, "verify_step_cost": v, "verify_step_cost_se": 0.01,
             "tokens_per_step": e, "ms_per_token": msk, "ms_per_token_one": ms0}
            for t in ("repeating", "prose") for k in (2, conformance.SPEC_DRAFT)]}
    rows = []
    conformance.break_even_rows(even(1.30, 2.6, 0.040, 0.080), even(1.25, 2.6, 0.041, 0.081), rows)
    assert [r.lesson for r in rows] == [
        f"spec {t}: {w}" for t in ("repeating", "prose") for w in (
            "verify step (k = 4) in one-token steps", "draft 4 - draft 0",
            "tokens per verify step")]
    assert rows[0].gpu == pytest.approx(1.30) and rows[0].sim == pytest.approx(1.25)
    assert rows[1].gpu == pytest.approx(-40.0) and all(r.ok for r in rows)
    assert not any(r.consistency for r in rows)
    with pytest.raises(LabError, match="no row for text 'prose', drafter 'lookup'"):
        conformance.break_even_rows({"texts": {"prose": {}}, "rows": []}, even(1, 1, 1, 1), [])
    # a recording with both drafters: prompt lookup's rows keep their names, the n-gram
    # drafter's are named; each recorded row is matched with the simulation's of its drafter
    def both(v, e_ngram):
        res = even(v, 1.6, 0.05, 0.08)
        res["rows"] += [{**r, "drafter": "ngram", "tokens_per_step": e_ngram}
                        for r in even(v, e_ngram, 0.04, 0.08)["rows"]]
        return res
    assert conformance.recorded_drafters(both(1.3, 2.7)) == ("lookup", "ngram")
    assert conformance.recorded_drafters(even(1, 1, 1, 1)) == ("lookup",)
    rows = []
    conformance.break_even_rows(both(1.3, 2.7), both(1.3, 2.2), rows)
    assert len(rows) == 12 and rows[6].lesson == (
        "spec repeating (ngram drafter): verify step (k = 4) in one-token steps")
    e = {r.lesson: r for r in rows if "tokens per verify step" in r.lesson}
    assert e["spec prose (ngram drafter): tokens per verify step"].gpu == pytest.approx(2.7)
    assert e["spec prose (ngram drafter): tokens per verify step"].sim == pytest.approx(2.2)
    assert e["spec prose: tokens per verify step"].gpu == pytest.approx(1.6)
    with pytest.raises(LabError, match="drafter 'ngram'"):
        conformance.break_even_rows(both(1.3, 2.7), even(1, 1, 1, 1), [])


# ---- the megakernel's row: its graph step predicted from parts measured apart ------------------
def test_the_predicted_step_chains_each_phases_work_and_a_hand_off_plus_the_floor():
    """lab/measure/megakernel.py predicted_step_us on hand-made phases: each kind's work (the
    mean over layers) times its count, plus one hand-off per phase (the shortest kind's mean
    wait), plus the floor; the timeline's own span plays no part."""
    from lab.measure.megakernel import predicted_step_us
    names = [f"L{layer} {p}" for layer in range(2)
             for p in ("qkv", "attention", "out proj", "mlp up", "down")] + ["LM head", "exit"]
    work = [1.0, 2.0, 3.0, 1.5, 1.2, 1.4, 2.0, 3.2, 1.5, 1.2, 0.7, 2.4]
    wait = [0.0, 0.6, 2.7, 0.6, 0.4, 0.5, 0.6, 2.5, 0.6, 0.4, 0.5, 1.2]
    rows = [{"phase": n, "start": 100.0 * i, "end": 100.0 * i + 50, "wait": wt, "work": wk}
            for i, (n, wt, wk) in enumerate(zip(names, wait, work))]
    got = predicted_step_us({"rows": rows}, 1.75)
    assert got["kinds"]["qkv"] == (2, pytest.approx(1.2))          # (1.0 + 1.4) / 2
    assert got["kinds"]["out proj"] == (2, pytest.approx(3.1))
    assert got["kinds"]["head"] == (1, pytest.approx(0.7))
    assert got["work_us"] == pytest.approx(sum(work))
    assert got["handoff_us"] == pytest.approx(0.4) and got["handoffs"] == 12   # down's; not
    #                                                       # layer 0's qkv, which waits for nothing
    assert got["phases_us"] == pytest.approx(sum(work) + 12 * 0.4)
    assert got["step_us"] == pytest.approx(sum(work) + 12 * 0.4 + 1.75)
    rows[3]["end"] += 1000.0                     # the timeline moves: the prediction does not
    assert predicted_step_us({"rows": rows}, 1.75)["step_us"] == pytest.approx(got["step_us"])


def _persistent():
    return json.loads((conformance.DATA_GPU / "persistent.json").read_text())


def _megakernel_rows(per):
    from lab.backend.costmodel import CostModel
    rows = []
    conformance.megakernel_rows(per, CostModel.load(conformance.DATA_GPU / "kernel_costs.json"),
                                rows)
    return rows


def test_the_megakernel_row_predicts_the_persistent_graph_arm_from_its_parts():
    """The committed recordings: each phase's work and a counter hand-off per phase (the stamped
    kernel's clocks, persistent.json, whose recorded kinds the test sums itself) plus one graph
    node's floor (kernel_costs.json floors.empty) against the persistent graph arm the sweep
    measured at the phases' context. A prediction, not a consistency check; it passes unless
    the data folder records it as a finding. The same parts against an arm 1.5x slower fail;
    a file without phases has no row; phases at a context the sweep lacks are a clear error."""
    from lab.backend.costmodel import CostModel
    per = _persistent()
    ctx = per["phases"]["context"]
    (row,) = _megakernel_rows(per)
    arm = next(r for r in per["sweep"]["rows"]
               if r["context"] == ctx and r["arm"] == "persistent graph")
    cost = CostModel.load(conformance.DATA_GPU / "kernel_costs.json")
    floor = cost.graph_launch_us + cost.empty_node_us
    assert row.lesson == f"persistent graph (context {ctx}): phase work + hand-offs + one node"
    assert row.unit == "ms" and not row.consistency and not row.exact and not row.host_paced
    assert row.gpu == arm["mean_ms"] and row.gpu_sem == arm["sem_ms"]
    kinds = per["phases"]["kinds"]
    n = len(per["phases"]["rows"])
    work = sum(k["work"] * sum(r["phase"].endswith(name) or (name == "head" and r["phase"] ==
                                                              "LM head")
                               for r in per["phases"]["rows"]) for name, k in kinds.items())
    rows = per["phases"]["rows"]
    handoff = min(np.mean([r["wait"] for r in rows[1:] if r["phase"].endswith(name)])
                  for name in ("qkv", "attention", "out proj", "mlp up", "down", "head", "exit"))
    assert row.sim == pytest.approx((work + n * handoff + floor) / 1000.0, rel=1e-6)
    assert "persistent.json" in row.note and "kernel_costs.json floors.empty" in row.note
    assert row.ok != (row.lesson in conformance._findings(conformance.DATA_GPU)), row
    arm["mean_ms"] *= 1.5
    (slow,) = _megakernel_rows(per)
    assert not slow.ok and slow.verdict == "FAIL"
    assert _megakernel_rows({k: v for k, v in _persistent().items() if k != "phases"}) == []
    per = _persistent()
    per["phases"]["context"] = 65
    with pytest.raises(LabError, match="no 'persistent graph' row at context 65"):
        _megakernel_rows(per)


def _bound():
    return json.loads((conformance.DATA_GPU / "megakernel_bound.json").read_text())


def test_the_bound_row_predicts_the_body_without_the_output_projection():
    """megakernel_bound.json's probe (no output projection phase) against the same chain as the
    default's row over persistent.json's phases less the output projection's (their work and
    their hand-offs): a prediction, never a consistency check. A bound without that context's
    arm is a clear error; no bound, no row."""
    from lab.backend.costmodel import CostModel
    from lab.measure.megakernel import predicted_step_us
    per, bound = _persistent(), _bound()
    ctx = per["phases"]["context"]
    cost = CostModel.load(conformance.DATA_GPU / "kernel_costs.json")
    rows = []
    conformance.megakernel_rows(per, cost, rows, bound)
    default, *probes = rows
    assert [r.lesson for r in probes] == [
        f"persistent {n} (context {ctx}): less out proj" for n in bound["probes"]]
    (row,) = probes
    kept = [r for r in per["phases"]["rows"] if not r["phase"].endswith("out proj")]
    assert len(kept) == len(per["phases"]["rows"]) - 4        # one a layer, four layers
    floor = cost.graph_launch_us + cost.empty_node_us
    want = predicted_step_us({"rows": kept}, floor)["step_us"] / 1000.0
    assert row.sim == pytest.approx(want, rel=1e-9) and row.sim < default.sim
    arm = next(r for r in bound["sweep"]["rows"]
               if r["context"] == ctx and r["arm"] == f"persistent {next(iter(bound['probes']))}")
    assert row.gpu == arm["mean_ms"] and row.gpu_sem == arm["sem_ms"]
    assert not row.consistency and "megakernel_bound.json" in row.note
    bound["sweep"]["rows"] = [r for r in bound["sweep"]["rows"] if r["context"] != ctx]
    with pytest.raises(LabError, match=f"megakernel_bound.json: sweep.rows has no 'persistent "
                                       f"tails-noproj/arrive' row at context {ctx}"):
        conformance.megakernel_rows(per, cost, [], bound)
    assert len(_megakernel_rows(per)) == 1


def test_the_megakernel_lesson_runs_alone_without_a_simulation(model):
    """`only=("megakernel",)`: its rows, in the table (their predictions need no simulated run):
    the default's and, with megakernel_bound.json recorded, each probe's."""
    from lab.backend.costmodel import CostModel
    part = conformance.run(model, only=("megakernel",))
    want = []
    conformance.megakernel_rows(_persistent(), CostModel.load(
        conformance.DATA_GPU / "kernel_costs.json"), want, _bound())
    assert [r.lesson for r in part["rows"]] == [r.lesson for r in want] and len(want) == 2
    assert "phase work + hand-offs + one node" in conformance.format_report(part)
