"""The registry's GPU experiments (lab/measure/experiments/) on the simulator, `--quick`: each
one that means something there runs its whole path but the CUDA calls and writes its file with
the keys the committed recording has (the notebooks read them); those that mean something on a
GPU only are skipped with one line; the device loop's sanitizer pieces run on the simulator."""
import json
from pathlib import Path

import pytest

from lab.measure import registry

ROOT = Path(__file__).resolve().parents[2]
GPU_DATA = ROOT / "data" / "gpu"


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    """One quick simulator context for the module: the model loaded once, as in a recording."""
    registry.load()
    c = registry.Context("sim", tmp_path_factory.mktemp("record"), quick=True)
    c.stamp = {"commit": "test", "dirty": None}
    return c


GPU_ONLY_KEYS = {"persistent.json": {"kernel_checks", "phases", "phases_long"}}   # written on a GPU only


def _recorded(ctx, name: str) -> dict:
    """Run experiment `name` in `ctx`; its one JSON file, checked to hold every key of the
    committed recording of that name (and the stamp) but the GPU-only ones."""
    exp = registry.REGISTRY[name]
    exp.run(ctx)
    (file,) = exp.files
    res = json.loads((ctx.out / file).read_text())
    committed = GPU_DATA / file
    if committed.is_file():
        missing = (set(json.loads(committed.read_text())) - set(res) - {"provenance"}
                   - GPU_ONLY_KEYS.get(file, set()))
        assert not missing, f"{file}: keys the committed recording has, not written: {missing}"
    assert res["provenance"] == ctx.stamp and "simulated" in json.dumps(res["source"])
    return res


def test_plan_switch(ctx):
    res = _recorded(ctx, "plan_switch")
    assert res["tokens_identical_update_vs_recapture"] and res["reps"] == 2
    assert res["node_params_step_identical_to_update"] is None       # the GPU's own API
    assert {"capture + instantiate", "update only"} <= set(res["rows"])


def test_device_loop(ctx):
    """Every A/B arm, the lengths (the loops' tokens agree), a fresh device-loop engine's
    first generate building the loop graph once."""
    res = _recorded(ctx, "device_loop")
    for k in ("plain", "pdl", "fused", "fused+pdl"):
        assert [a["name"] for a in res[k]["arms"]] == ["host loop", "device loop"]
    arms = res["lengths"]["arms"]
    assert set(arms) == {"host loop", "device loop", "host loop +pdl", "device loop +pdl",
                         "tokens identical"} and all(arms["tokens identical"].values())
    assert len(arms["device loop +pdl"]["4"]["ms_per_token"]) == 2
    first = res["first"]["loops"]
    assert first["device loop"]["build_ms"] > 0 and first["host loop"]["build_ms"] is None
    assert first["host loop"]["graphs"] == 1 and first["device loop"]["ledger"]["device"] > 0
    assert res["launches"]["device loop"] == 1


def test_spec(ctx):
    res = _recorded(ctx, "spec")
    assert res["same_tokens"]["ok"]
    assert {r["arm"] for r in res["curve"]["rows"]} == {
        "draft 0", "draft 2", "draft 4", "draft 8", "draft 4 + LAB_BUG_SPEC_KEY"}
    even = res["break_even"]        # the two fixed texts, their corpus offsets, E and V per k
    assert set(even["texts"]) == {"repeating", "prose"}
    assert even["texts"]["prose"]["source"] == "data/corpus.txt[794165:794337]"
    assert {(r["text"], r["draft"]) for r in even["rows"]} == {
        (t, k) for t in ("repeating", "prose") for k in (2, 4, 8)}
    for r in even["rows"]:
        assert 1.0 <= r["tokens_per_step"] <= r["draft"] + 1 and r["verify_step_cost"] > 0
        assert r["pays"] == (r["tokens_per_step"] > r["verify_step_cost"])
        assert r["predicted_speedup"] == r["tokens_per_step"] / r["verify_step_cost"]
    reach = even["copy_reach"]      # E's ceiling: how far the model itself copies the repeat
    assert reach["text"] == "repeating" and 0 <= reach["reach"] <= reach["tokens"]
    assert reach["generated"][:reach["reach"]] == reach["copy"][:reach["reach"]]


def test_pdl_context(ctx):
    res = _recorded(ctx, "pdl_context")
    assert [c["context"] for c in res["contexts"]] == [64, 900]
    assert res["method"]["rounds"] == 2 and res["trigger"].startswith("the lab's kernels")
    assert [r["arm"] for r in res["contexts"][1]["rows"]] == ["graph", "graph+pdl"]   # quick


def test_compare_judges_each_arm_against_the_oracle(ctx):
    res = _recorded(ctx, "compare")
    assert list(res["arms"]) == ["graph", "graph+pdl", "graph+pdl+fusion",
                                 "graph+pdl+fusion+split", "graph+pdl+fusion (heads tail)",
                                 "persistent"] and res["verdict"]["ok"]
    for arm in res["arms"].values():
        (row,) = arm["prompts"]
        assert row["prompt"] == "ROMEO.\n" and row["summary"]["steps"] == 2
        assert row["greedy"]["identical"] and row["ok"]


def test_persistent_bits_and_sweep(ctx):
    """Bits (fused vs persistent, eager vs graph, 5 prompts x 8 tokens) and the interleaved
    sweep; the peer reads `held` from it."""
    from lab.measure.experiments.persistent import held
    res = _recorded(ctx, "persistent")
    assert res["bits"]["ok"] and not res["bits"]["mismatches"] and "kernel_checks" not in res
    from kernels import persistent
    assert {r["arm"] for r in res["sweep"]["rows"]} == {
        "graph", "graph+pdl", "fused graph", "fused+pdl graph", "fused+split+pdl graph",
        "persistent graph"} | {f"persistent {n}" for n in persistent.VARIANTS
                               if n != persistent.DEFAULT_VARIANT}
    assert "persistent plain/arrive" in {r["arm"] for r in res["sweep"]["rows"]}  # no choice
    assert res["default_variant"] == "tails/arrive" and "phases" not in res   # a GPU's only
    for c, r in res["ratio_to_best_multi_node"].items():
        ms = {row["arm"]: row["mean_ms"] for row in res["sweep"]["rows"] if row["context"] == int(c)}
        assert r["best_ms"] == min(ms[a] for a in ms if not a.startswith("persistent"))
        assert r["persistent graph"] == pytest.approx(ms["persistent graph"] / r["best_ms"])
    assert res["barriers_per_token"] == 0 and res["waits_per_token"] == 20 and held(ctx.out)
    assert res["bits_tail"] == "grid"
    res["bits"]["ok"] = False
    (ctx.out / "persistent.json").write_text(json.dumps(res))
    assert not held(ctx.out) and not held(ctx.out / "nowhere")


def test_ranks_on_simulated_devices(ctx):
    """The collective chains, the four interleaved arms (warmed up over the timed length: no
    capture inside a timed rep), the bill; the collectives' figures are the cost model's."""
    from lab.backend.costmodel import CollectiveCosts
    res = _recorded(ctx, "ranks")
    assert res["oracle_tokens_equal"] and res["bill"]["collectives_per_token"] == 9
    assert [a["captures_in_timed_reps"] for a in res["arms"].values()] == [0, 0, 0, 0]
    assert res["collectives"]["graph_us"]["all_reduce"] == pytest.approx(
        CollectiveCosts.load().graph_us["all_reduce"], rel=0.01)


def test_gpu_only_experiments_are_skipped_on_the_simulator_in_one_line(tmp_path, capsys):
    """Where a kernel triggers is compiled into it, racecheck and the GPU tests need a GPU: on
    the simulator each is one `skipped` line, and nothing is written."""
    names = ["gpu_tests", "pdl_context_early", "pdl_context_none", "sanitize_loop", "handson_gpu"]
    assert registry.record(names, "sim", tmp_path, quick=True) == 0
    err = capsys.readouterr().err
    for name in names:
        (line,) = [ln for ln in err.splitlines() if f"] {name}: " in ln]
        assert "skipped: means something on cuda only" in line
        assert not any((tmp_path / f).exists() for f in registry.REGISTRY[name].files)


# ---- the device loop's sanitizer pieces, on the simulator ------------------------------------
@pytest.mark.parametrize("mode,extra,needle", [
    ("minimal", (), "pos 8 after one launch of a 8-iteration loop"),
    ("shared", (), "pos 8 after one launch"),
    ("kernel", ("--kernel", "attn_combine"), "attn_combine and advance as the loop's body"),
    ("kernels", ("--kernels", "rmsnorm,embed"), "rmsnorm + embed and advance as the loop's body"),
    ("prefix", ("--count", "2", "--warm"),
     "the step's first 2 launches and advance as the loop's body (run once eagerly first)"),
])
def test_sanitize_loop_pieces_run_on_the_simulator(mode, extra, needle, capsys):
    from lab.measure.experiments import sanitize_loop
    assert sanitize_loop.main(["--mode", mode, "--backend", "sim", *extra]) == 0
    out = capsys.readouterr().out
    assert f"sanitize_loop {mode}: ok" in out and needle in out


@pytest.mark.parametrize("argv,code,needle", [
    (("--mode", "kernel"), 2, "--mode kernel needs --kernel NAME"),
    (("--mode", "kernel", "--kernel", "no_such_kernel"), 1, "the step has no launch of"),
    (("--mode", "kernels"), 2, "--mode kernels needs --kernels A,B,..."),
    (("--mode", "kernels", "--kernels", "embed,no_such_kernel"), 1,
     "the step has no launch of ['no_such_kernel']"),
    (("--mode", "minimal", "--tokens", "0"), 2, "--tokens must be at least 1"),
    (("--mode", "loop", "--warm"), 2, "--warm applies to the modes one-body, kernel, kernels"),
])
def test_sanitize_loop_refuses_bad_input_in_one_line(argv, code, needle, capsys):
    from lab.measure.experiments import sanitize_loop
    try:
        got = sanitize_loop.main(["--backend", "sim", *argv])
    except SystemExit as exc:          # a piece that fails names what failed and exits 1
        got, text = 1, str(exc.code)
    else:
        text = capsys.readouterr().err
    assert got == code and needle in text and text.strip().count("\n") == 0


def test_sanitize_loop_runs_every_piece_once_each_in_a_process(tmp_path, monkeypatch):
    """A piece as the experiment runs it (_piece: its own process, output to its log), here
    without the sanitizer in front (the simulator's host has none)."""
    from lab.measure.experiments import sanitize_loop as s
    monkeypatch.setattr(s, "TOOL", ())
    log = tmp_path / "minimal.log"
    code = s._piece(log, ["--mode", "minimal", "--backend", "sim"], {"CUDA_MODULE_LOADING": "EAGER"})
    assert code == 0 and "sanitize_loop minimal: ok" in log.read_text(), log.read_text()
    pieces = s.pieces()
    assert len(pieces) == 5 + len(s.KERNELS) + len(s.PREFIXES) + len(s.KERNEL_SETS) + 2
    assert pieces["prefix-2-eager"] == (["--mode", "prefix", "--count", "2"],
                                        {"CUDA_MODULE_LOADING": "EAGER"})
    assert pieces["kernels-rmsnorm-matvec-swiglu_up"][0][-1] == "rmsnorm,matvec,swiglu_up"


# ---- pieces of the costs and tails experiments -----------------------------------------------
def test_the_relay_floor_chains_relays_that_read_what_the_node_before_wrote():
    """costs.relay_floor on the simulator (wall-clock figures, a dry run): chains of
    [relay(a, b), relay(b, a)] at each length, with and without PDL (it checks that each relay
    read the one before's output, and raises if not)."""
    from lab.backend import make_backend
    from lab.config import LabConfig
    from lab.measure import costfile as costs
    be = make_backend(LabConfig(backend="sim"))
    fits = costs.relay_floor(be, lambda msg: None, lengths=(1, 2))
    assert set(fits) == {"relay", "relay_pdl"}
    for fit in fits.values():
        assert set(fit["replay_us"]) == {"1", "2"} and fit["per_node_us"] == fit["per_node_us"]


def test_a_host_round_times_the_launch_sequences_and_the_engine_and_leaves_it_whole(model):
    """costs.host_round on the simulator (wall-clock figures, a dry run): per mechanism, host us
    per launch of the step's sequence; per mode, the engine's own us per step with its launches
    stubbed, the stubs gone afterwards (sequence_us and engine_host_us, which
    scripts/eager_host_probe.py calls too)."""
    from lab.backend.instrument import LaunchLog
    from lab.config import LabConfig
    from lab.engine.runner import DecodeEngine
    from lab.measure import costfile as costs
    from lab.measure.chains import main_stream
    base = LabConfig(backend="sim", graph=False)
    eng = DecodeEngine(model, base)
    eng.log = LaunchLog()
    eng.bind()
    eng.reset(eng.encode(costs.PROMPT), 0)
    step = [main_stream(x) for x in eng.step_launches(eng.plan(costs.BASE_POSITION))]
    rounds: dict = {}
    costs.host_round(eng, base, step, rounds)
    assert set(rounds) == {"dispatcher_step_sequence_us", "prebound_step_sequence_us",
                           "engine_eager_us", "engine_graph_us"}
    assert all(len(v) == 1 and v[0] > 0 for v in rounds.values())
    assert eng.graphs and eng.cfg == base
    for obj in (eng.backend, *eng.graphs.values()):
        assert "launch" not in vars(obj)            # the stubs are gone: launches run again
    launched = len(eng.log.records)
    eng.step()
    assert len(eng.log.records) > launched


def test_a_chain_batch_is_200_replays_or_fewer_where_one_replay_is_long(monkeypatch):
    """chains.batch_replays: 200 replays a batch where they fit in BATCH_S, else as many as fill
    it, never fewer than MIN_REPLAYS (and never more than asked)."""
    from lab.measure import chains

    class Clocked:                                   # a graph whose replay takes `s` seconds
        def __init__(self, s):
            self.s = s

        def launch(self):
            clock[0] += self.s

    clock = [0.0]
    monkeypatch.setattr(chains.time, "perf_counter", lambda: clock[0])
    be = type("Be", (), {"synchronize": lambda self: None})()
    assert chains.batch_replays(be, Clocked(1e-6)) == chains.REPLAYS
    assert chains.batch_replays(be, Clocked(chains.BATCH_S / 50)) == 50
    assert chains.batch_replays(be, Clocked(0.03)) == chains.MIN_REPLAYS
    assert chains.batch_replays(be, Clocked(1e-6), reps=2) == 2
    assert chains.batch_replays(be, Clocked(0.03), reps=5) == 5


def test_the_relay_floor_refuses_relays_that_do_not_chain(monkeypatch):
    from dataclasses import replace

    from lab.backend import make_backend
    from lab.config import LabConfig
    from lab.measure import costfile as costs
    monkeypatch.setitem(costs.REGISTRY, "relay", replace(costs.REGISTRY["relay"],
                                                         twin=lambda grid, block, src, dst: None))
    be = make_backend(LabConfig(backend="sim"))
    with pytest.raises(RuntimeError, match="not a chain of relays"):
        costs.relay_floor(be, lambda msg: None, lengths=(1, 2))


def test_the_tails_experiment_times_each_attention_form_per_context(ctx):
    """Every arm at every context, all replayed, with its launch count (the fused step 18 per
    token, its grid split 22, the unfused step 37)."""
    res = _recorded(ctx, "tails")
    assert res["meaningful"] and res["source"].startswith("simulated")
    launches = {(r["arm"], r["context"]): r["launches_per_token"] for r in res["rows"]}
    assert all(r["replay_fraction"] == 1.0 for r in res["rows"])
    c0, c1 = res["contexts"][0], res["contexts"][-1]
    assert launches[("graph", c0)] == 37 and launches[("fused grid graph+pdl", c1)] == 18
    assert launches[("fused grid split graph+pdl", c0)] == 22


def test_a_check_runs_in_its_own_process_its_output_a_file_stopped_at_its_limit(tmp_path):
    """What the GPU tests, the demo and the hands-on checks run through: the command's output
    in OUT/<log>, its status; past its limit it is stopped, status 124."""
    import sys

    from lab.measure.experiments.checks import logged, test_file
    ctx = registry.Context("sim", tmp_path)
    assert logged(ctx, [sys.executable, "-c", "print('checked'); raise SystemExit(3)"], 30,
                  "a.log") == 3
    text = (tmp_path / "a.log").read_text()
    assert "checked" in text and "== exit 3" in text
    assert logged(ctx, [sys.executable, "-c", "import time; time.sleep(30)"], 1, "b.log") == 124
    assert "== exit 124" in (tmp_path / "b.log").read_text()
    assert test_file("test_handson.py").name == "test_handson.py"


def test_gpu_tests_leave_out_only_the_kernel_checks_persistent_runs():
    """The recorder's GPU tests deselect two tests by name: each must exist, be marked gpu and
    run kernels.check on the device (what the persistent experiment runs on every op), so a
    renamed test fails here instead of running twice, or a different test being left out."""
    import ast

    from lab.measure.experiments.checks import IN_KERNEL_CHECKS, test_file
    assert IN_KERNEL_CHECKS
    for file, name in IN_KERNEL_CHECKS:
        tree = ast.parse(test_file(file).read_text())
        fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name),
                  None)
        assert fn is not None, f"{file} has no test {name}"
        assert any(ast.unparse(d) == "pytest.mark.gpu" for d in fn.decorator_list), name
        assert 'check.run(' in ast.unparse(fn) and '"gpu"' in ast.unparse(fn).replace("'", '"')
