"""The PyTorch peer recorder (scripts/record_gpu_peer.py, on scripts/peer_torch.py,
peer_worker.py and peer_result.py), device-free.

Without torch: the script's help, its one-line refusal (torch missing, or present but broken),
its pure pieces (attention buckets, the tokens check and the ratios, the table), the optional
extra and the gpu_run.sh step. With torch importable (the `peer` extra; CI does not install it),
the torch model on the CPU against the float64 oracle, eagerly and traced whole by
torch.compile, and a dry run of the whole recorder (simulator against eager torch on the CPU).
What only a GPU shows (torch.cuda.CUDAGraph, torch.compile's CUDA graphs, the times) is not here.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lab import reference
from lab.measure import report
from scripts import peer_result, peer_torch
from scripts import record_gpu_peer as peer

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "record_gpu_peer.py"
HAS_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="torch is not importable (the peer extra)")


def _run(args, tmp_path, shadow: str | None = None, timeout: float = 300, **env_extra):
    """The script in a subprocess; shadow="missing": torch cannot be found at all (a
    sitecustomize puts None in sys.modules); shadow="broken": a torch package whose import
    raises (found, but not importable)."""
    env = {**os.environ, **env_extra}
    paths = [str(ROOT)]
    if shadow is not None:
        site = tmp_path / f"shadow_{shadow}"
        if shadow == "missing":
            site.mkdir()
            (site / "sitecustomize.py").write_text("import sys\nsys.modules['torch'] = None\n")
        else:
            (site / "torch").mkdir(parents=True)
            (site / "torch" / "__init__.py").write_text(
                "raise ImportError('libtorch_cpu.so: cannot open shared object file:\\n"
                "No such file or directory')\n")
        paths.insert(0, str(site))
    env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in [env.get("PYTHONPATH")] if p])
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=str(ROOT))


# ---- without torch ---------------------------------------------------------------------------
def test_importing_the_recorder_imports_no_torch_numba_or_cupy():
    """The worker re-runs the recorder's script: its modules (the torch model, the worker
    protocol, the result) must load without torch, and the lab's side without numba or CuPy."""
    code = ("import sys; sys.path.insert(0, %r); import scripts.record_gpu_peer; "
            "print(sorted(m for m in ('torch', 'numba', 'cupy') if m in sys.modules))" % str(ROOT))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_help_works_without_torch(tmp_path):
    res = _run(["--help"], tmp_path, shadow="missing")
    assert res.returncode == 0, res.stderr
    assert "--out" in res.stdout and "peer" in res.stdout and "--torch-worker" not in res.stdout


@pytest.mark.parametrize("shadow", ["missing", "broken"])
def test_without_torch_one_clear_line_and_no_traceback(tmp_path, shadow):
    res = _run(["--out", str(tmp_path / "out")], tmp_path, shadow=shadow, timeout=120)
    assert res.returncode == 2
    lines = [ln for ln in (res.stdout + res.stderr).splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    assert 'pip install -e ".[peer]"' in lines[0] and "PyTorch" in lines[0]
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "out" / "peer.json").exists()
    if shadow == "broken":              # found, then refused by the worker's import
        assert "libtorch_cpu.so" in lines[0]


def test_main_refuses_bad_arguments_in_one_line(tmp_path, capsys):
    assert peer.main(["--out", str(tmp_path), "--torch-arms", "eager,nope"]) == 2
    assert peer.main(["--out", str(tmp_path), "--contexts", "64,x"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and all(line.startswith("record_gpu_peer: ") for line in err)
    assert "--torch-arms" in err[0] and "--contexts" in err[1]


def test_attention_length_buckets():
    L = peer_torch.attention_length
    assert [L(p, 1024, "pow2") for p in (0, 127, 128, 255, 256, 900, 1023)] == \
        [128, 128, 256, 256, 512, 1024, 1024]
    assert L(5, 1000, "pow2") == 128 and L(999, 1000, "pow2") == 1000     # capped at max_seq
    assert all(L(p, 1024, "full") == 1024 for p in (0, 500, 1023))
    assert peer_torch.window_lengths([64, 900], 64, 1024, "pow2") == {64: [128], 900: [1024]}
    assert peer_torch.window_lengths([64], 100, 1024, "pow2") == {64: [128, 256]}
    with pytest.raises(ValueError):
        L(0, 1024, "exact")


def _data(ms, tokens):
    return {"ms": list(ms), "tokens": [list(t) for t in tokens]}


ARMS = ["lab graph", "lab graph+pdl", "torch eager", "torch.compile"]


def test_summarize_same_tokens_gives_stats_and_ratios():
    ids = [1, 2, 3, 4]
    data = {a: {"64": _data([m, m * 1.01, m * 0.99], [ids] * 3)}
            for a, m in zip(ARMS, (0.12, 0.11, 1.2, 0.3))}
    s = peer_result.summarize([64], ARMS, data, oracle={"64": ids})
    assert s["ok"] and s["tokens_check"]["ok"] and not s["tokens_check"]["mismatches"]
    row = s["results"]["64"]["lab graph"]
    assert row["mean_ms"] == pytest.approx(0.12) and row["sem_ms"] > 0
    assert row["matches_oracle"] and row["reps_identical"]
    assert row["ratio_to_torch_compile"] == pytest.approx(0.4)
    r = s["ratios"]["64"]["lab graph+pdl"]["torch.compile"]
    assert r["ratio"] == pytest.approx(0.11 / 0.3) and r["sem"] > 0
    assert "torch eager" not in s["ratios"]["64"]                 # ratios are lab / torch
    assert s["tokens_check"]["reference"]["64"] == {"arm": "lab graph", "ids": ids}


def test_summarize_reports_a_mismatch_and_a_failed_arm():
    ids, other = [1, 2, 3, 4], [1, 2, 9, 4]
    data = {"lab graph": {"64": _data([0.1, 0.1], [ids, ids])},
            "lab graph+pdl": {"64": _data([0.1, 0.1], [ids, ids])},
            "torch eager": {"64": _data([1.0, 1.0], [ids, other])}}
    s = peer_result.summarize([64], ARMS, data, oracle={"64": ids},
                       failed={"torch.compile": "RuntimeError: boom"})
    assert not s["ok"] and not s["tokens_check"]["ok"]
    (mm,) = s["tokens_check"]["mismatches"]
    assert mm == {"context": 64, "arm": "torch eager", "reference_arm": "lab graph",
                  "reps_differing": [1], "rep": 1, "token_index": 2}
    row = s["results"]["64"]["torch eager"]
    assert not row["tokens_match_reference"] and not row["reps_identical"]
    assert s["results"]["64"]["torch.compile"] == {"error": "RuntimeError: boom"}
    assert "ratio_to_torch_compile" not in s["results"]["64"]["lab graph"]
    res = {**s, "method": {"reps": 2, "tokens_per_rep": 4, "contexts": [64],
                           "process_separation": "torch arms ran in a separate process"},
           "weights": {"file": "tiny_model.npz"}, "arm_order": ARMS, "source": "simulated"}
    table = report.format_peer(res)
    assert "TOKENS MISMATCH: torch eager at context 64 differs from lab graph from generated " \
           "token 2" in table
    assert "ARM FAILED: torch.compile: RuntimeError: boom" in table
    assert "FAILED: RuntimeError: boom" in table and "DIFFER" in table


def test_fusion_arm_follows_lab_config(monkeypatch):
    from lab.config import LabConfig
    base = LabConfig(backend="sim", pdl=True)
    has = "fusion" in {f.name for f in dataclasses.fields(LabConfig)}
    fused = peer.lab_fusion_config(base)
    assert (fused is not None) == has
    if has:
        assert fused.fusion and fused.pdl and fused.graph
    assert list(peer.lab_configs("sim"))[:2] == ["lab graph", "lab graph+pdl"]

    @dataclasses.dataclass(frozen=True)
    class NoFusion:
        graph: bool = True
    monkeypatch.setattr("lab.config.LabConfig", NoFusion)
    assert peer.lab_fusion_config(base) is None


def test_gpu_run_records_the_peer_after_every_judged_figure():
    """The peer (torch, an optional extra) runs right after the conformance check: whatever it
    does, every lab figure conformance judges is already recorded. After it come only the
    checks no lesson is judged on (PDL without triggers, racecheck, the two-GPU recorder)."""
    lines = [ln.strip() for ln in (ROOT / "scripts" / "gpu_run.sh").read_text().splitlines()
             if ln.strip().startswith(("step ", "LIMIT="))]
    lines = [ln.split(" ", 1)[1] if ln.startswith("LIMIT=") else ln for ln in lines]
    peer = [i for i, ln in enumerate(lines)
            if ln.startswith('step python3 scripts/record_gpu_peer.py --out "$out/gpu"')]
    assert len(peer) == 1
    assert lines[peer[0] - 1].startswith("step python3 -m lab conformance")
    after = ("step python3 scripts/record_gpu_pdl_context.py", "step bash scripts/sanitize_loop.sh",
             "step python3 scripts/record_gpu_ranks.py", "step python3 -m pytest")
    assert all(ln.startswith(after) for ln in lines[peer[0] + 1:]), lines[peer[0] + 1:]


def test_torch_is_only_the_peer_extra():
    tomllib = pytest.importorskip("tomllib")
    proj = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = proj["optional-dependencies"]
    assert any(d.replace(" ", "").startswith("torch") for d in extras["peer"])
    others = proj["dependencies"] + [d for k, v in extras.items() if k != "peer" for d in v]
    assert not any(d.replace(" ", "").lower().startswith("torch") for d in others)


# ---- with torch (CPU) ------------------------------------------------------------------------
PROMPTS = ["ROMEO.\n", "HAMLET.\nTo be, or not to be", None]   # None: 140 corpus characters


@pytest.fixture
def one_thread():
    """torch on one CPU thread: its OpenMP threads spinning beside NumPy's BLAS threads (the
    oracle) slow both tenfold on a small machine."""
    import torch
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _prompt(model, text):
    if text is None:
        text = peer.CORPUS.read_text()[:140]          # crosses the 128 -> 256 bucket
    return model.tokenizer.encode(text)


@needs_torch
@pytest.mark.parametrize("buckets", ["pow2", "full"])
def test_torch_decoder_matches_the_float64_oracle(model, buckets, one_thread):
    dec = peer_torch.build_torch_decoder(model, "cpu", buckets)
    for text in PROMPTS:
        ids = _prompt(model, text)
        want = reference.generate(model, ids, 20)
        dec.reset(ids)
        dec.run(ids.size - 1 + 20)
        np.testing.assert_array_equal(dec.all_tokens(ids.size + 20), want)
        dec.rewind()                     # the same window again, from the kept prompt rows
        dec.run(20)
        assert dec.generated(20) == [int(t) for t in want[ids.size:]]


@needs_torch
def test_compiled_step_traces_whole_and_matches(model, one_thread):
    """The step torch.compile gets: one graph per bucket (fullgraph: a graph break fails),
    its mutations of the device state (KV rows, token ids, position) traced."""
    dec = peer_torch.build_torch_decoder(model, "cpu", "pow2")
    run = peer_torch.CompileRunner(dec, backend="aot_eager", mode=None)
    ids = _prompt(model, None)
    want = reference.generate(model, ids, 12)
    dec.reset(ids)
    run.run(ids.size - 1 + 12)
    np.testing.assert_array_equal(dec.all_tokens(ids.size + 12), want)
    assert peer_torch.compile_counters()["graph_breaks"] == 0


@needs_torch
def test_graph_runner_needs_cuda(model):
    dec = peer_torch.build_torch_decoder(model, "cpu")
    with pytest.raises(ValueError, match="CUDA"):
        peer_torch.GraphRunner(dec, [128])


def _lab_sim_usable() -> bool:
    try:
        import numba  # noqa: F401
        return True
    except Exception:
        return False


@needs_torch
@pytest.mark.skipif(not _lab_sim_usable(), reason="the lab's simulator needs numba")
def test_dry_run_writes_peer_json(tmp_path):
    out = tmp_path / "gpu"
    res = _run(["--out", str(out), "--backend", "sim", "--torch-device", "cpu",
                "--torch-arms", "eager", "--contexts", "8,30", "--tokens", "5", "--reps", "2"],
               tmp_path, OMP_NUM_THREADS="1")
    assert res.returncode == 0, res.stdout + res.stderr
    d = json.loads((out / "peer.json").read_text())
    assert d["recorded_by"] == "scripts/record_gpu_peer.py" and d["date"] and d["source"]
    assert "torch arms ran in a separate process" in d["method"]["process_separation"]
    assert d["method"]["tf32"]["matmul_allow_tf32"] is False
    assert d["method"]["contexts"] == [8, 30] and d["method"]["reps"] == 2
    assert d["tokens_check"]["ok"] and d["ok"]
    for c in ("8", "30"):
        for arm in ("lab graph", "lab graph+pdl", "torch eager"):
            row = d["results"][c][arm]
            assert len(row["ms_per_token"]) == 2 and row["tokens_match_reference"]
    assert [r[0].split(":")[0] for r in d["run_order"]] == ["lab", "torch"]
    assert "== peer ==" in res.stdout and "wrote" in res.stdout


@needs_torch
@pytest.mark.skipif(not _lab_sim_usable(), reason="the lab's simulator needs numba")
def test_a_token_mismatch_is_loud_and_still_recorded(tmp_path, monkeypatch, capsys):
    """One arm's ids perturbed (the PDL arm's third token): exit 1, the file still written with
    the mismatch in it, a TOKENS MISMATCH line printed."""
    real = peer.lab_run

    def perturbed(ids, tokens):
        run = real(ids, tokens)

        def wrapped(engine):
            ms, toks = run(engine)
            if engine.cfg.pdl:
                toks = toks[:2] + [(toks[2] + 1) % 71] + toks[3:]
            return ms, toks
        return wrapped
    monkeypatch.setattr(peer, "lab_run", perturbed)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = tmp_path / "gpu"
    rc = peer.main(["--out", str(out), "--backend", "sim", "--torch-device", "cpu",
                    "--torch-arms", "eager", "--contexts", "8", "--tokens", "4", "--reps", "2"])
    assert rc == 1
    d = json.loads((out / "peer.json").read_text())
    assert not d["ok"] and not d["tokens_check"]["ok"]
    assert {m["arm"] for m in d["tokens_check"]["mismatches"]} >= {"lab graph+pdl"}
    assert all(m["token_index"] == 2 for m in d["tokens_check"]["mismatches"])
    assert d["results"]["8"]["torch eager"]["tokens_match_reference"]
    assert "TOKENS MISMATCH: lab graph+pdl at context 8" in capsys.readouterr().out
