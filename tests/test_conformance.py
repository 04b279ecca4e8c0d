"""Conformance: the simulator, built from component costs only, predicts every recorded GPU
lesson (same sign, within 25%; within 1 us for effects under 2 us; counts exact)."""
import json
import shutil

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
def test_every_recorded_lesson_passes(report):
    failed = [r for r in report["rows"] if not r.ok]
    assert not failed, conformance.format_report(report)


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
    if (conformance.DATA_GPU / "pdl_sweep.json").is_file():
        assert "PDL (context 900): graph+pdl - graph" in lessons
    assert report["gpu_source"].startswith("measured on NVIDIA")


def test_pdl_rows_judge_pdl_at_each_recorded_context():
    def sweep(g64, p64, g900, p900, sem=0.0001):
        rows = [{"context": c, "arm": a, "mean_ms": ms, "sem_ms": sem}
                for c, a, ms in ((64, "graph", g64), (64, "graph+pdl", p64),
                                 (900, "graph", g900), (900, "graph+pdl", p900))]
        return {"contexts": [64, 900], "rows": rows}
    rows = []
    # pdl_rows(recorded, simulated, ...): PDL saving 10 us at both contexts, predicted 9 and 11
    conformance.pdl_rows(sweep(0.075, 0.065, 0.085, 0.075), sweep(0.07, 0.061, 0.08, 0.069), rows)
    assert [r.lesson for r in rows] == ["PDL (context 64): graph+pdl - graph",
                                        "PDL (context 900): graph+pdl - graph"]
    assert rows[1].gpu == pytest.approx(-10.0) and rows[1].sim == pytest.approx(-11.0)
    assert rows[1].gpu_sem == pytest.approx(0.1 * 2 ** 0.5)
    assert all(r.ok for r in rows)
    rows = []      # the GPU's PDL LOSING at context 900 while the simulator predicts a gain
    conformance.pdl_rows(sweep(0.075, 0.065, 0.085, 0.091), sweep(0.07, 0.061, 0.08, 0.069), rows)
    assert [r.ok for r in rows] == [True, False]
    with pytest.raises(LabError, match="no row for 'graph' at context 900"):
        bad = sweep(0.075, 0.065, 0.085, 0.075)
        bad["rows"] = [r for r in bad["rows"] if not (r["context"] == 900 and r["arm"] == "graph")]
        conformance.pdl_rows(bad, bad, [])


def test_spec_rows_judge_the_saving_the_tokens_per_step_and_the_bug_arm():
    def curve(d0, d4, tps, bug_replays):
        rows = []
        for ctx in (64, 900):
            rows += [{"context": ctx, "arm": "draft 0", "ms_per_token": d0, "tokens_per_step": 1.0,
                      "replay_fraction": 1.0},
                     {"context": ctx, "arm": "draft 4", "ms_per_token": d4, "tokens_per_step": tps,
                      "replay_fraction": 1.0},
                     {"context": ctx, "arm": "draft 4 + LAB_BUG_SPEC_KEY", "ms_per_token": 0.5,
                      "tokens_per_step": tps, "replay_fraction": bug_replays}]
        return {"rows": rows}
    rows = []
    # spec_rows(recorded, simulated, ...)
    conformance.spec_rows(curve(0.08, 0.06, 1.5, 0.0), curve(0.08, 0.062, 1.6, 0.0), (64, 900), rows)
    assert [r.lesson for r in rows[:3]] == ["spec (context 64): draft 4 - draft 0",
                                            "spec (context 64): tokens per verify step",
                                            "spec (context 64): bug arm's replays"]
    assert rows[0].sim == pytest.approx(-18.0) and rows[0].gpu == pytest.approx(-20.0)
    assert all(r.ok for r in rows)
    rows = []      # the simulator's bug arm replaying what the GPU's never did: an exact miss
    conformance.spec_rows(curve(0.08, 0.06, 1.5, 0.0), curve(0.08, 0.062, 1.6, 0.5), (64,), rows)
    assert [r.ok for r in rows] == [True, True, False]


def test_ladder_rows_only_for_the_rungs_the_recording_has():
    """The simulated ladder runs every rung of bench.LADDER, the persistent one too; a recording
    made before that rung existed (the committed ladder.json) gets no row for it, one that has
    it gets its ms/token row."""
    lad = json.loads((conformance.DATA_GPU / "ladder.json").read_text())
    graph = next(a for a in lad["arms"] if a["name"] == "graph")
    persistent = {**graph, "name": "persistent", "mean_ms": 0.05, "launches_per_token": 1,
                  "nodes_per_graph": 1}
    sim = {**lad, "arms": lad["arms"] + [persistent]}
    rows = []
    conformance.ladder_rows(lad, sim, rows)
    names = [r.lesson for r in rows]
    assert not [n for n in names if n.startswith("persistent")]
    assert names[:4] == [f"{n}: ms/token" for n in ("dispatcher", "prebound", "graph", "graph+pdl")]
    rows = []
    conformance.ladder_rows(sim, sim, rows)
    row = next(r for r in rows if r.lesson == "persistent: ms/token")
    assert row.gpu == row.sim == 0.05 and len(rows) == len(names) + 1


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


@pytest.mark.slow
def test_a_subset_of_lessons_gives_the_same_rows_as_the_whole_table(model, report):
    """`only=` re-runs a subset (notebooks 06 and 07 show theirs); its rows are the whole
    table's rows for those lessons, and an unknown lesson is a clear error."""
    part = conformance.run(model, only=("fission", "nodes"))
    want = [r for r in report["rows"] if r.lesson.startswith(("fission", "fused fission", "node:"))]
    assert [(r.lesson, r.sim, r.gpu) for r in part["rows"]] == [(r.lesson, r.sim, r.gpu) for r in want]
    with pytest.raises(LabError, match="unknown conformance lesson"):
        conformance.run(model, only=("fision",))


@pytest.mark.parametrize("name, content, needle", [
    ("ladder.json", {}, "ladder.json: no field 'tokens'"),
    ("ladder.json", [], "ladder.json: expected a JSON object, got list"),
    ("overlap.json", {}, "overlap.json: no field 'tokens'"),
    ("bench_sweep.json", {"rows": [{"arm": "x"}]}, "bench_sweep.json: no field 'rows.0.toggles'"),
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
