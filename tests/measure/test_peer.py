"""The PyTorch peer experiment (lab/measure/experiments/peer.py, on lab/measure/peer_torch.py,
peer_worker.py and peer_result.py), device-free.

Without torch: importing it loads no torch, numba or CuPy; `decode-lab record peer` refuses in
one line (torch missing, or present but broken); its pure pieces (attention buckets, the tokens
check and the ratios, the table); its place in the registry; the optional extra. With torch
importable (the `peer` extra; CI does not install it), the torch model on the CPU against the
float64 oracle, eagerly and traced whole by torch.compile, and a dry run of the whole experiment
(simulator against eager torch on the CPU). What only a GPU shows (torch.cuda.CUDAGraph,
torch.compile's CUDA graphs, the times) is not here.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lab import reference
from lab.errors import LabError
from lab.measure import peer_result, peer_torch, registry, report
from lab.measure.experiments import peer

ROOT = Path(__file__).resolve().parents[2]
HAS_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="torch is not importable (the peer extra)")


# ---- without torch ---------------------------------------------------------------------------
@pytest.mark.parametrize("modules, absent", [
    ("lab.measure.peer_worker", ("torch", "numba", "cupy")),   # the torch process: no numba, no CuPy
    ("lab.measure.experiments", ("torch", "cupy")),            # the listing: no torch, no CuPy
])
def test_importing_the_experiment_imports_no_torch_numba_or_cupy(modules, absent):
    """The worker's modules (the torch model, the protocol, the result) load without torch (it
    imports torch when it runs), numba or CuPy; the registry's listing without torch or CuPy."""
    code = (f"import sys; import {modules}; "
            f"print(sorted(m for m in {absent!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=str(ROOT))
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("shadow", ["missing", "broken"])
def test_without_torch_one_clear_line(tmp_path, monkeypatch, shadow):
    """Torch missing (not found), or found but broken (its import raises in the worker): the
    experiment refuses in one line naming the extra, before it measures or writes anything."""
    found = shadow == "broken"
    monkeypatch.setattr(peer.importlib.util, "find_spec",
                        lambda name, *a: object() if found else None)
    if found:   # the worker's interpreter finds a torch package whose import raises
        site = tmp_path / "shadow" / "torch"
        site.mkdir(parents=True)
        (site / "__init__.py").write_text(
            "raise ImportError('libtorch_cpu.so: cannot open shared object file:\\n"
            "No such file or directory')\n")
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site.parent), str(ROOT)]))
    ctx = registry.Context("sim", tmp_path / "out")
    with pytest.raises(LabError) as exc:
        peer.measure(ctx, peer.Settings(weights=str(ctx.weights), torch_device="cpu",
                                        torch_arms=("eager",)))
    msg = str(exc.value)
    assert "\n" not in msg and 'pip install -e ".[peer]"' in msg and "PyTorch" in msg
    assert ("libtorch_cpu.so" in msg) == found
    assert not (tmp_path / "out" / "peer.json").exists()


def test_every_torch_runner_runs_steps():
    """The worker calls `run(steps)` on every arm it builds (the eager decoder, the graph
    runners, inductor's, torch.compile's): each runner class has one (importing needs no torch)."""
    for runner in (peer_torch.GraphRunner, peer_torch.CompileRunner):
        assert callable(getattr(runner, "run", None)), runner
    assert peer_torch.inductor_graph_runner.__code__.co_varnames[:3] == ("dec", "lengths",
                                                                         "warmup_steps")


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


def test_a_torch_arms_host_time_names_a_host_bound_arm():
    """host_ms (the host done issuing the window, before the closing synchronize) against the
    step's ms: reduce-overhead's Python at 95% of its step is host-bound, the one-graph arm at 20%
    is not; the table says so, with the strongest arm's ratios beside torch.compile's and each
    compiled arm's compile seconds."""
    ids = [1, 2, 3]
    data = {"lab graph": {"64": _data([0.05, 0.05], [ids, ids])},
            "torch.compile": {"64": {**_data([0.16, 0.15], [ids, ids]), "host_ms": [0.15, 0.145]}},
            "torch inductor in one graph": {"64": {**_data([0.11, 0.11], [ids, ids]),
                                                   "host_ms": [0.02, 0.024]}}}
    arms = list(data)
    s = peer_result.summarize([64], arms, data)
    compiled = s["results"]["64"]["torch.compile"]
    assert compiled["mean_host_ms"] == pytest.approx(0.1475)
    assert compiled["host_share"] == pytest.approx(0.1475 / 0.155) and compiled["host_bound"]
    one_graph = s["results"]["64"]["torch inductor in one graph"]
    assert one_graph["host_share"] == pytest.approx(0.2) and not one_graph["host_bound"]
    assert "host_ms" not in s["results"]["64"]["lab graph"]
    r = s["ratios"]["64"]["lab graph"]["torch inductor in one graph"]
    assert r["ratio"] == pytest.approx(0.05 / 0.11)
    res = {**s, "method": {"reps": 2, "tokens_per_rep": 3, "contexts": [64],
                           "process_separation": "each torch arm ran in a process of its own",
                           "strongest_arm": "torch inductor in one graph"},
           "weights": {"file": "tiny_model.npz"}, "arm_order": arms, "source": "simulated",
           "torch_worker": {"compile_s": {"torch inductor in one graph": 41.5}}}
    table = report.format_peer(res)
    assert "lab / torch inductor in one graph ms/token at context 64: lab graph 0.455" in table
    assert "torch.compile at context 64: the host issues a step in 0.1475 ms of its 0.1550 " \
           "(95%): host-bound" in table
    assert "torch inductor in one graph at context 64: the host issues a step in 0.0220 ms of " \
           "its 0.1100 (20%)\n" in table
    assert "torch inductor in one graph: 41.5 s compiling (and first runs)" in table


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


def test_the_persistent_arm_only_where_its_check_held(tmp_path):
    from lab.config import LabConfig
    base = LabConfig(backend="sim", graph=True)
    fused = base.replace(pdl=True, fusion=True)
    assert peer.lab_configs("sim") == {
        "lab graph": base, "lab graph+pdl": base.replace(pdl=True), "lab graph+pdl+fusion": fused,
        "lab graph+pdl+fusion+split": fused.replace(split_combine=True),
        "lab persistent": base.replace(persistent=True)}
    assert "lab persistent" not in peer.lab_configs("sim", persistent=False)
    ctx = registry.Context("sim", tmp_path)
    assert not peer.settings_for(ctx).persistent                 # no persistent.json
    (tmp_path / "persistent.json").write_text(json.dumps({"bits": {"ok": True}}))
    s = peer.settings_for(ctx)
    assert s.persistent and s.torch_device == "cpu" and s.torch_arms == ("eager",)


def test_the_peer_runs_after_every_judged_figure():
    """The peer (torch, an optional extra) runs after the persistent check it reads and every
    figure conformance judges; after it come only the figures no lesson is judged on (the
    checks run before everything, side by side)."""
    reg = registry.load()
    order = [e.name for e in registry.ordered(reg.values())]
    later = set(order[order.index("peer") + 1:])
    assert later == {"pdl_context_none", "ranks", "peer_reps"}
    assert reg["peer"].isolated and reg["persistent"].priority < reg["peer"].priority


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


def _dry(tmp_path, monkeypatch, contexts=(8, 30), tokens=5):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    ctx = registry.Context("sim", tmp_path / "gpu")
    ctx.out.mkdir()
    ctx.stamp = {"commit": "test"}
    settings = peer.Settings(weights=str(ctx.weights), reps=2, tokens=tokens, contexts=contexts,
                             torch_arms=("eager",), torch_device="cpu", persistent=False)
    return ctx, settings


@needs_torch
@pytest.mark.skipif(not _lab_sim_usable(), reason="the lab's simulator needs numba")
def test_dry_run_writes_peer_json(tmp_path, monkeypatch, capsys):
    ctx, settings = _dry(tmp_path, monkeypatch)
    peer.measure(ctx, settings)
    d = json.loads((ctx.out / "peer.json").read_text())
    assert d["recorded_by"] == "decode-lab record peer" and d["date"] and d["source"]
    assert d["provenance"] == {"commit": "test"}
    assert "each torch arm ran in a process of its own" in d["method"]["process_separation"]
    row = d["results"]["8"]["torch eager"]
    assert len(row["host_ms"]) == 2 and 0 < row["host_share"] <= 1.0 + 1e-9
    assert d["method"]["tf32"]["matmul_allow_tf32"] is False
    assert d["method"]["contexts"] == [8, 30] and d["method"]["reps"] == 2
    assert d["tokens_check"]["ok"] and d["ok"]
    for c in ("8", "30"):
        for arm in ("lab graph", "lab graph+pdl", "torch eager"):
            row = d["results"][c][arm]
            assert len(row["ms_per_token"]) == 2 and row["tokens_match_reference"]
    assert [r[0].split(":")[0] for r in d["run_order"]] == ["lab", "torch"]
    assert "== peer ==" in capsys.readouterr().err


@needs_torch
@pytest.mark.skipif(not _lab_sim_usable(), reason="the lab's simulator needs numba")
def test_a_token_mismatch_is_loud_and_still_recorded(tmp_path, monkeypatch):
    """One arm's ids perturbed (the PDL arm's third token): the experiment fails naming the
    mismatch, the file still written with the mismatch in it."""
    def perturbed(ids, tokens):
        run = peer.lab_run(ids, tokens)

        def wrapped(engine):
            ms, toks = run(engine)
            if engine.cfg.pdl:
                toks = toks[:2] + [(toks[2] + 1) % 71] + toks[3:]
            return ms, toks
        return wrapped
    ctx, settings = _dry(tmp_path, monkeypatch, contexts=(8,), tokens=4)
    with pytest.raises(LabError, match="TOKENS MISMATCH"):
        peer.measure(ctx, settings, run=perturbed)
    d = json.loads((ctx.out / "peer.json").read_text())
    assert not d["ok"] and not d["tokens_check"]["ok"]
    assert {m["arm"] for m in d["tokens_check"]["mismatches"]} >= {"lab graph+pdl"}
    assert all(m["token_index"] == 2 for m in d["tokens_check"]["mismatches"])
    assert d["results"]["8"]["torch eager"]["tokens_match_reference"]
