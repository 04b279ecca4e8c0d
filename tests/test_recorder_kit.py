"""The recorders' kit (scripts/recorder.py): shared arguments, the output folder checked before
the run, atomic JSON writes, the engine-pool key lab/measure/bench.py shares engines by, the
rotating order, and one-line refusals. Device-free: no recorder measures anything here."""
from __future__ import annotations

import importlib
import json
import os
import pathlib
import stat

import numpy as np
import pytest

from lab.config import LabConfig
from lab.errors import LabError
from lab.measure import bench
from scripts import recorder

RECORDERS = ["record_gpu", "record_gpu_bench", "record_gpu_bugs", "record_gpu_costs",
             "record_gpu_device_loop", "record_gpu_instances", "record_gpu_overlap",
             "record_gpu_peer", "record_gpu_plan_switch", "record_gpu_precision",
             "record_gpu_ranks", "record_gpu_spec", "record_gpu_pdl_context"]
DOC = """Record a thing on the GPU,
as JSON.

  python scripts/record_gpu_thing.py --out DIR
"""


# ---- shared arguments ---------------------------------------------------------------------------
def test_shared_arguments_take_each_recorders_defaults():
    ap = recorder.arguments(DOC, backends=("cuda", "sim"), weights=True, reps=5, tokens=64)
    args = ap.parse_args(["--out", "d"])
    assert (args.out, args.backend, args.reps, args.tokens) == ("d", "cuda", 5, 64)
    assert args.weights.endswith("tiny_model.npz")
    assert ap.description == "Record a thing on the GPU, as JSON."
    args = ap.parse_args(["--out", "d", "--backend", "sim", "--reps", "9", "--tokens", "3"])
    assert (args.backend, args.reps, args.tokens) == ("sim", 9, 3)
    bare = recorder.arguments(DOC).parse_args(["--out", "d"])
    assert vars(bare) == {"out": "d"}                     # only the flags a recorder asks for


@pytest.mark.parametrize("argv", [[], ["--out", "d", "--backend", "rocm"],
                                  ["--out", "d", "--reps", "x"]])
def test_shared_arguments_refuse_bad_input(argv, capsys):
    ap = recorder.arguments(DOC, backends=("cuda", "sim"), reps=5)
    with pytest.raises(SystemExit) as exc:
        ap.parse_args(argv)
    assert exc.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_help_override_and_optional_out(capsys):
    ap = recorder.arguments(DOC, reps=7, out_required=False, out_help="folder for x.json",
                            helps={"--reps": "interleaved reps (>= 2)"})
    assert ap.parse_args([]).out is None
    ap.print_help()
    text = capsys.readouterr().out
    assert "folder for x.json" in text and "interleaved reps (>= 2)" in text


@pytest.mark.parametrize("name", RECORDERS)
def test_every_recorder_prints_its_help(name, capsys):
    """Each recorder imports here (no GPU, no torch) and its --help lists --out."""
    mod = importlib.import_module(f"scripts.{name}")
    with pytest.raises(SystemExit) as exc:
        mod.main(["--help"])
    assert exc.value.code == 0
    assert "--out" in capsys.readouterr().out


# ---- the output folder and atomic writes --------------------------------------------------------
def test_out_dir_creates_the_folder_and_leaves_nothing_in_it(tmp_path):
    out = recorder.out_dir(tmp_path / "a" / "b")
    assert out.is_dir() and list(out.iterdir()) == []


def test_out_dir_refuses_in_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(LabError, match="is a file"):
        recorder.out_dir(blocker)
    with pytest.raises(LabError, match="cannot write there") as exc:
        recorder.out_dir(blocker / "sub")              # a folder under a file: never creatable
    assert "\n" not in str(exc.value)


def test_a_bad_out_is_refused_before_the_run(tmp_path, capsys, monkeypatch):
    """record_gpu_bugs needs a GPU to measure anything; with a bad --out it never gets there."""
    from scripts import record_gpu_bugs
    monkeypatch.setattr("sys.argv", ["scripts/record_gpu_bugs.py"])
    (tmp_path / "file").write_text("x")
    monkeypatch.setattr(recorder, "load", lambda args: pytest.fail("the model was loaded"))
    rc = recorder.run(lambda: record_gpu_bugs.main(["--out", str(tmp_path / "file")]))
    err = capsys.readouterr().err.splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("record_gpu_bugs: --out ")


def test_write_json_converts_numpy_and_ends_with_a_newline(tmp_path):
    path = recorder.write_json(tmp_path / "r.json", {"ms": np.float64(0.25), "n": np.int32(3),
                                                     "v": np.arange(3)}, indent=1)
    text = path.read_text()
    assert text.endswith("}\n") and text.startswith("{\n \"ms\"")
    assert json.loads(text) == {"ms": 0.25, "n": 3, "v": [0, 1, 2]}


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temp_file(tmp_path, monkeypatch):
    path = tmp_path / "r.json"
    recorder.write_json(path, {"old": 1})
    real = pathlib.Path.write_text

    def half_then_fail(self, text, *a, **k):
        real(self, text[:len(text) // 2])
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(pathlib.Path, "write_text", half_then_fail)
    with pytest.raises(OSError, match="No space left"):
        recorder.write_json(path, {"new": list(range(100))})
    monkeypatch.undo()
    assert json.loads(path.read_text()) == {"old": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_a_recording_gets_the_mode_a_plain_write_gives(tmp_path):
    """Not the temporary file's 0600: a new file gets 0666 less the umask, an old one keeps its
    mode."""
    old_umask = os.umask(0o022)
    try:
        fresh = recorder.write_json(tmp_path / "new.json", {"a": 1})
        assert stat.S_IMODE(fresh.stat().st_mode) == 0o644
        kept = tmp_path / "old.json"
        kept.write_text("{}")
        kept.chmod(0o640)
        recorder.write_text(kept, "{}\n")
        assert stat.S_IMODE(kept.stat().st_mode) == 0o640
    finally:
        os.umask(old_umask)


def test_write_json_refuses_what_json_cannot_hold(tmp_path):
    with pytest.raises(TypeError, match="not JSON serialisable: object"):
        recorder.write_json(tmp_path / "r.json", {"x": object()})
    assert list(tmp_path.iterdir()) == []


# ---- the engine pool ----------------------------------------------------------------------------
def test_pool_key_is_the_key_bench_shares_engines_by():
    """An arm whose config differs only in launch toggles finds the pooled engine (make_arm
    returns it without building one: model=None would fail if it tried)."""
    base = LabConfig(backend="sim")
    engine = object()
    pool = recorder.engine_pool(engine, base)
    for cfg in (base, base.replace(graph=True), base.replace(pdl=True, overlap=True),
                base.replace(launch="prebound")):
        assert bench.make_arm(None, "arm", cfg, 0, pool=pool).engine is engine


@pytest.mark.parametrize("change", [dict(kv_dtype="float16"), dict(bugs={"frozen_kv_row"}),
                                    dict(backend="cuda")])
def test_pool_key_separates_what_allocates_differently(change):
    base = LabConfig(backend="sim")
    assert recorder.pool_key(base.replace(**change)) != recorder.pool_key(base)
    assert recorder.pool_key(base, "empty") != recorder.pool_key(base, "zeros")


# ---- order, progress, refusals ------------------------------------------------------------------
def test_rotated_order():
    assert [recorder.rotated(["a", "b", "c"], r) for r in range(4)] == \
        [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]
    assert recorder.rotated(range(2), 1) == [1, 0] and recorder.rotated([], 3) == []


def test_stopwatch_stamps_seconds(capsys):
    recorder.stopwatch(7)("hello")
    line = capsys.readouterr().out
    assert line.startswith("[    0.0s] hello")


def test_run_turns_lab_errors_and_ctrl_c_into_one_line(capsys, monkeypatch):
    monkeypatch.setattr("sys.argv", ["scripts/record_gpu_thing.py"])

    def bad():
        raise LabError("--lengths 'x': must be integers\n(see --help)")

    def interrupted():
        raise KeyboardInterrupt
    assert recorder.run(bad) == 2 and recorder.run(interrupted) == 130
    assert recorder.run(lambda: 0) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == ["record_gpu_thing: --lengths 'x': must be integers (see --help)",
                   "record_gpu_thing: interrupted"]


def test_record_writes_the_file_then_prints_the_table(tmp_path, capsys):
    path = recorder.record(tmp_path, "pdl", {"arms": [1, 2]}, "graph 0.07 ms/token")
    assert path == tmp_path / "pdl.json" and json.loads(path.read_text()) == {"arms": [1, 2]}
    assert capsys.readouterr().out == "\n== pdl ==\ngraph 0.07 ms/token\n"
    assert [p.name for p in tmp_path.iterdir()] == ["pdl.json"]       # no plot unless asked


def test_versions_stamp_the_simulator_without_gpu_libraries():
    class Sim:
        name = "sim"

        def describe(self):
            return "simulated (CPU simulator)"
    v = recorder.versions(Sim())
    assert v["describe"] == "simulated (CPU simulator)"
    assert not {"cupy", "driver", "runtime"} & set(v)
