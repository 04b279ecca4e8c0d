"""The registry of experiments (lab/measure/registry.py) and `decode-lab record`: the listing,
a recording on the simulator with its stamp and archive, refusals, the stamp's parts, and the
recording docs' table. Device-free."""
from __future__ import annotations

import json
import re
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

from lab.__main__ import main
from lab.config import LabConfig
from lab.errors import LabError
from lab.measure import registry
from lab.measure.arms import make_arm, pool_key
from lab.measure.stats import rotated

ROOT = Path(__file__).resolve().parents[2]
HAND_WRITTEN = {"conformance_findings.json"}   # data/gpu files no experiment records


@pytest.fixture(scope="module")
def listing():
    return registry.load()


def test_the_listing_names_each_file_once_in_a_priority_order(listing):
    files = [f for e in listing.values() for f in e.files]
    assert len(files) == len(set(files)), sorted(f for f in files if files.count(f) > 1)
    priorities = [e.priority for e in listing.values()]
    assert len(priorities) == len(set(priorities)), "two experiments share a priority"
    for e in listing.values():
        assert e.doc and e.files and e.gpus >= 1 and set(e.backends) <= {"cuda", "sim"}, e.name


def test_every_recording_a_notebook_reads_is_written_by_an_experiment(listing):
    named = set()
    for nb in (ROOT / "notebooks").glob("*.py"):
        named |= set(re.findall(r"[\w.-]+\.(?:json|txt|png)", nb.read_text()))
    read = {n for n in named if (ROOT / "data" / "gpu" / n).is_file()} - HAND_WRITTEN
    written = {f for e in listing.values() for f in e.files}
    assert read - written == set()


def test_record_on_the_simulator_writes_stamped_files_and_the_archive(tmp_path, capsys):
    out, archive = tmp_path / "gpu", tmp_path / "rec.tar.gz"
    assert main(["record", "instances", "--backend", "sim", "--out", str(out), "--quick",
                 "--archive", str(archive)]) == 0
    rec = json.loads((out / "engine_instances.json").read_text())
    stamp = rec["provenance"]
    assert set(stamp) >= {"commit", "dirty", "date", "versions", "host_probe"}
    assert stamp["commit"] and stamp["versions"]["describe"].startswith("simulated")
    probe = json.loads((out / registry.PROBE_FILE).read_text())
    assert probe["us_per_launch"] > 0 and probe["clock"] == "simulated"
    assert stamp["host_probe"]["us_per_launch"] == probe["us_per_launch"]
    log = (out / registry.LOG_FILE).read_text()
    assert "instances" in log and re.search(r"instances\s+1\s+\d+\s+ok", log)
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
    assert {"gpu/engine_instances.json", "gpu/host_probe.json", "gpu/record.log"} <= names


def test_resume_keeps_what_this_commit_finished_and_runs_the_rest(tmp_path, monkeypatch):
    """--resume after a pass cut short: an experiment the same commit (clean tree), backend and
    settings finished is kept, not run again; the rest run. Another commit, a dirty tree or no
    --resume keeps nothing."""
    out, ran = tmp_path / "gpu", []
    monkeypatch.setattr(registry, "revision", lambda: {"commit": "c1", "dirty": False})
    for name in ("alpha", "beta"):
        monkeypatch.setitem(registry.REGISTRY, name, registry.Experiment(
            name, (f"{name}.json",), 900, lambda ctx, n=name: (ran.append(n),
                                                              ctx.write_json(f"{n}.json", {}))))
    rec = lambda *a: registry.record(list(a[0]), "sim", out, quick=True, **a[1])  # noqa: E731
    assert rec(["alpha"], {}) == 0 and ran == ["alpha"]
    assert rec(["alpha", "beta"], {"resume": True}) == 0 and ran == ["alpha", "beta"]
    assert "kept: done earlier" in (out / registry.LOG_FILE).read_text()
    assert rec(["alpha", "beta"], {"resume": True}) == 0 and ran == ["alpha", "beta"]
    with pytest.raises(LabError, match="not empty; give --replace"):      # refused, before work
        rec(["alpha"], {})
    assert ran == ["alpha", "beta"]
    assert rec(["alpha"], {"replace": True}) == 0 and ran[-1] == "alpha"  # --replace: runs
    monkeypatch.setattr(registry, "revision", lambda: {"commit": "c2", "dirty": False})
    assert rec(["beta"], {"resume": True}) == 0 and ran[-1] == "beta"     # another commit
    monkeypatch.setattr(registry, "revision", lambda: {"commit": "c2", "dirty": True})
    n = len(ran)
    assert rec(["beta"], {"resume": True}) == 0 and len(ran) == n + 1      # a dirty tree


def test_the_checks_run_side_by_side_before_every_timed_experiment(tmp_path, monkeypatch):
    """Experiment.check: the checks start together (each waits at a barrier the other must
    reach: run one after the other, the first would time out) and all end before the first
    timed experiment starts, whatever the priorities."""
    import threading
    meet, seen = threading.Barrier(2, timeout=10), []

    def check(name):
        def run(ctx):
            meet.wait()
            seen.append(name)
            ctx.write_json(f"{name}.json", {})
        return run

    def timed(ctx):
        seen.append(("timed", sorted(seen)))
        ctx.write_json("timed.json", {})
    for name, run, prio, chk in (("chk_a", check("chk_a"), 900, True), ("timed", timed, 1, False),
                                 ("chk_b", check("chk_b"), 950, True)):
        monkeypatch.setitem(registry.REGISTRY, name, registry.Experiment(
            name, (f"{name}.json",), prio, run, check=chk))
    assert registry.record(["timed", "chk_b", "chk_a"], "sim", tmp_path, quick=True) == 0
    assert seen[-1] == ("timed", ["chk_a", "chk_b"])
    log = (tmp_path / registry.LOG_FILE).read_text()
    assert "checks side by side (untimed): chk_a, chk_b" in log
    assert [e.name for e in registry.ordered(registry.REGISTRY[n] for n in
                                             ("timed", "chk_b", "chk_a"))] == ["chk_a", "chk_b",
                                                                               "timed"]


def test_an_unknown_name_is_one_line_naming_the_choices(tmp_path, capsys, listing):
    assert main(["record", "nope", "--backend", "sim", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown experiment nope" in err[0]
    assert all(name in err[0] for name in listing)
    assert not (tmp_path / registry.LOG_FILE).exists()      # refused before any work


def _fake(name, run, **kw):
    return registry.Experiment(name, (f"{name}.json",), 999, run, **kw)


def test_a_failure_a_missing_file_and_too_few_gpus_are_statuses(tmp_path):
    ctx = registry.Context("sim", tmp_path)

    def boom(ctx):
        raise RuntimeError("broken\nin two lines")
    assert registry._run_one(_fake("boom", boom), ctx, "sim", 1, False).startswith(
        "failed: RuntimeError: broken in two lines")
    wide = _fake("wide", lambda c: None, gpus=2)
    assert registry._run_one(wide, ctx, "cuda", 1, True) == "skipped: needs 2 GPUs, this host has 1"
    assert registry._run_one(wide, ctx, "cuda", 1, False).startswith("failed: needs 2 GPUs")
    gpu_only = _fake("gpu_only", lambda c: None, backends=("cuda",))
    assert registry._run_one(gpu_only, ctx, "sim", 1, True).startswith("skipped")
    rows = [("a", 1, 2.0, "ok"), ("b", 0, 1.0, "failed: x"), ("c", 0, 0.0, "skipped: y"),
            ("d", 1, 0.0, "kept: done earlier in this pass")]
    assert registry.summary(rows).endswith("4 experiments, 1 failed, 3 s")
    # the checks side by side: the run's wall time beside the experiments' sum
    assert registry.summary(rows, 2.4).endswith(
        "4 experiments, 1 failed, 2 s of wall time (3 s summed over the experiments)")


def test_a_child_past_its_limit_is_stopped(capsys):
    assert registry.run_child([sys.executable, "-c", "print('hi', flush=True); "
                               "import time; time.sleep(30)"], limit_s=2) == 124
    assert "hi" in capsys.readouterr().out


def test_revision_from_git_from_a_revision_file_or_unknown(tmp_path):
    here = registry.revision()
    assert re.fullmatch(r"[0-9a-f]{40}", here["commit"]) and isinstance(here["dirty"], bool)
    assert registry.revision(tmp_path) == {"commit": "unknown", "dirty": None}
    (tmp_path / "REVISION").write_text("abc123 dirty\n")
    assert registry.revision(tmp_path) == {"commit": "abc123", "dirty": True}
    (tmp_path / ".git").mkdir()     # a copy with a stale .git: the REVISION written for it wins
    assert registry.revision(tmp_path) == {"commit": "abc123", "dirty": True}


def test_write_json_stamps_converts_numpy_and_keeps_a_given_stamp(tmp_path):
    ctx = registry.Context("sim", tmp_path, stamp={"commit": "c"})
    path = ctx.write_json("r.json", {"ms": np.float64(0.25), "v": np.arange(3)})
    assert path.read_text().endswith("}\n")
    assert json.loads(path.read_text()) == {"ms": 0.25, "v": [0, 1, 2], "provenance": {"commit": "c"}}
    ctx.write_json("s.json", {"provenance": {"commit": "own"}})
    assert json.loads((tmp_path / "s.json").read_text())["provenance"] == {"commit": "own"}
    with pytest.raises(TypeError):
        ctx.write_json("t.json", {"x": object()})
    assert not (tmp_path / "t.json").exists()


def test_out_dir_refuses_in_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(LabError, match="is a file"):
        registry.out_dir(blocker)
    with pytest.raises(LabError, match="cannot write there") as exc:
        registry.out_dir(blocker / "sub")
    assert "\n" not in str(exc.value)


def test_engines_are_shared_by_pool_key():
    """An arm whose config differs only in launch toggles finds the pooled engine (make_arm
    returns it without building one: model=None would fail if it tried)."""
    base = LabConfig(backend="sim")
    engine = object()
    pool = {pool_key(base): engine}
    for cfg in (base, base.replace(graph=False), base.replace(pdl=True, overlap=True)):
        assert make_arm(None, "arm", cfg, 0, pool=pool).engine is engine
    for change in (dict(kv_dtype="float16"), dict(bugs={"frozen_kv_row"}), dict(backend="cuda")):
        assert pool_key(base.replace(**change)) != pool_key(base)
    assert pool_key(base, "empty") != pool_key(base, "zeros")
    assert [rotated("abc", r) for r in range(4)] == [list("abc"), list("bca"), list("cab"), list("abc")]


def test_the_recording_docs_table_is_the_registry(listing):
    text = (ROOT / "docs" / "recording.md").read_text()
    assert registry.docs_table(listing.values()) in text
