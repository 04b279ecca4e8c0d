"""`decode-lab compare` (lab/measure/compare.py): run specs, verdicts, the weight hashes, the
dead-fast-path check, bad input, and the CLI's exit codes. Simulator only, a few tokens per run."""
import json
import shutil

import numpy as np
import pytest

from lab.__main__ import main
from lab.config import LabConfig
from lab.engine.runner import DecodeEngine
from lab.errors import LabError
from lab.measure import compare as C
from lab.model import DEFAULT_WEIGHTS, ModelConfig, random_model, sha256_of

SIM = LabConfig(backend="sim")


def _weights(tmp_path, arrays, cfg=None, name="m"):
    """A weights file (+ its .json, checksummed) in tmp_path."""
    npz, meta = tmp_path / f"{name}.npz", tmp_path / f"{name}.json"
    np.savez(npz, **arrays)
    info = json.loads(DEFAULT_WEIGHTS.with_suffix(".json").read_text())
    if cfg is not None:
        info.update({k: getattr(cfg, k) for k in ModelConfig.__dataclass_fields__})
    info["sha256"] = sha256_of(npz)
    meta.write_text(json.dumps(info))
    return npz


# ---- run specs ---------------------------------------------------------------------------------
def test_specs_parse_like_bench_arms():
    assert C.parse_spec("reference", SIM).is_reference
    assert C.parse_spec(" Reference ", SIM).is_reference
    assert C.parse_spec("", SIM).cfg == SIM
    assert C.parse_spec("KV_DTYPE=float16,LAB_GRAPH=0", SIM).cfg == SIM.replace(kv_dtype="float16",
                                                                                 graph=False)
    assert C.parse_spec("cuda,PDL=1", SIM).cfg == SIM.replace(backend="cuda", pdl=True)


@pytest.mark.parametrize("spec, needle", [
    ("fast", "unknown item 'fast'"),
    ("KV_DTYPE=bf16", "LAB_KV_DTYPE='bf16' is not allowed; use one of float32, float16"),
    ("GRAPH=2", "LAB_GRAPH='2' is not allowed"),
    ("NOPE=1", "unknown variable LAB_NOPE"),
    ("reference,GRAPH=0", "'reference' is the float64 oracle and takes no backend or toggles"),
])
def test_bad_specs_are_one_line_errors(spec, needle):
    with pytest.raises(LabError, match="run spec") as exc:
        C.parse_spec(spec, SIM)
    assert needle in str(exc.value) and "\n" not in str(exc.value)


# ---- verdicts ----------------------------------------------------------------------------------
def test_reference_against_itself_is_exactly_zero_and_passes():
    res = C.compare("reference", "reference", tokens=4)
    s = res["summary"]
    assert s["max_kld_ab"] == s["max_kld_ba"] == s["max_dlogit"] == 0.0
    assert res["verdict"] == {"ok": True, "reasons": []}


def test_float32_engine_passes_against_the_oracle_with_its_evidence():
    res = C.compare("reference", "GRAPH=1", tokens=8, base=SIM)
    assert res["verdict"]["ok"], res["verdict"]
    assert res["weights_identical"] and res["input"]["identical"]
    checks = {c["claim"]: c for c in res["checks"] if c["side"] == "B"}
    assert checks["LAB_GRAPH=1"]["ok"] and "replay" in checks["LAB_GRAPH=1"]["evidence"]
    assert checks["LAB_KV_DTYPE=float32"]["ok"]
    assert all(c["ok"] in (True, None) for c in checks.values())
    assert sum(c["ok"] is True for c in checks.values()) >= 7
    assert 0 < res["summary"]["max_dlogit"] < C.Thresholds().max_dlogit
    assert len(res["steps"]) == 8 and res["summary"]["top1_agreement"] == 1.0


def test_eager_and_graph_are_byte_identical():
    res = C.compare("GRAPH=0", "GRAPH=1", tokens=6, base=SIM)
    assert res["verdict"]["ok"] and res["summary"]["max_dlogit"] == 0.0


def test_float16_fails_the_float32_bar_and_passes_a_float16_bar():
    res = C.compare("reference", "KV_DTYPE=float16", tokens=12, base=SIM)
    assert not res["verdict"]["ok"]
    assert [r for r in res["verdict"]["reasons"] if r.startswith("max |Δlogit|")]
    assert res["summary"]["top1_agreement"] == 1.0           # nothing else is wrong
    loose = C.Thresholds(max_kld=1e-6, min_top1=1.0, max_dlogit=2e-2)
    assert C.compare("reference", "KV_DTYPE=float16", tokens=12, base=SIM,
                     thresholds=loose)["verdict"]["ok"]


def test_disagreeing_picks_fail_on_top1_and_name_the_first_step():
    a = C.Run("A", C.RunSpec("reference", None), "w", "h", "x", np.arange(5, dtype=np.int32), 3,
              np.array([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]))
    b = C.Run("B", C.RunSpec("reference", None), "w", "h", "x", a.ids, 3,
              np.array([[0.0, 1.0, 0.0], [0.0, 1.0, 0.0]]))
    res = C.compare_runs(a, b)
    d = res["summary"]["first_divergence"]
    assert d["step"] == 1 and d["position"] == 3 and d["top1_a"] == 0 and d["top1_b"] == 1
    assert any(r.startswith("top-1 agreement 0.5000 < 1") for r in res["verdict"]["reasons"])


def test_weights_with_different_hashes_fail_naming_the_cause(tmp_path, model):
    arrays = dict(model.weights)
    arrays["final_norm"] = arrays["final_norm"] * np.float32(1.001)
    other = _weights(tmp_path, arrays)
    res = C.compare("reference", "reference", tokens=3, weights_b=other)
    assert not res["weights_identical"]
    assert res["verdict"]["reasons"][0].startswith("weights differ: A ")
    assert sha256_of(other)[:16] in res["verdict"]["reasons"][0]
    same = tmp_path / "same.npz"                     # a copy with the same bytes: same hash
    shutil.copy(DEFAULT_WEIGHTS, same)
    shutil.copy(DEFAULT_WEIGHTS.with_suffix(".json"), same.with_suffix(".json"))
    assert C.compare("reference", "reference", tokens=3, weights_b=same)["weights_identical"]


# ---- dead fast paths ---------------------------------------------------------------------------
def test_a_graph_run_that_fell_back_to_eager_is_a_dead_fast_path():
    res = C.compare("reference", "GRAPH=1,BUG_RAW_ARRAY=1", tokens=4, base=SIM)
    graph = next(c for c in res["checks"] if c["claim"] == "LAB_GRAPH=1")
    assert graph["ok"] is False and "fallback" in graph["evidence"]
    assert res["summary"]["top1_agreement"] == 1.0        # the numbers alone would not show it
    reasons = res["verdict"]["reasons"]
    assert any(r.startswith("dead fast path: B claims LAB_GRAPH=1") for r in reasons)


@pytest.mark.parametrize("spec, ignored, tokens", [
    ("KV_DTYPE=float16", {"kv_dtype": "float32"}, 3),
    ("SPLIT_COMBINE=1", {"split_combine": False}, 3),
    ("OVERLAP=1", {"overlap": False}, 3),
    ("GRAPH=0", {"graph": True}, 3),
    ("PDL=1", {"pdl": False}, 3),
    ("LAUNCH=dispatcher", {"launch": "prebound"}, 3),
    ("PLAN_SWITCH=update", {"plan_switch": "recapture"}, 30),   # crosses the plan at 32
])
def test_an_engine_that_ignores_a_toggle_is_caught(spec, ignored, tokens):
    """The engine factory drops the toggle: the run claims a path that did not run."""
    def deaf(model, cfg):
        return DecodeEngine(model, cfg.replace(**ignored))

    res = C.compare("reference", spec, tokens=tokens, base=SIM, engine_factory=deaf)
    claim = "LAB_" + spec
    check = next(c for c in res["checks"] if c["claim"] == claim)
    assert check["ok"] is False, check
    assert not res["verdict"]["ok"]
    honest = C.compare("reference", spec, tokens=tokens, base=SIM)
    assert next(c for c in honest["checks"] if c["claim"] == claim)["ok"] is True


# ---- bad input ---------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, needle", [
    (dict(spec_b="KV_DTYPE=bf16"), "LAB_KV_DTYPE='bf16' is not allowed"),
    (dict(prompt=""), "the prompt is empty"),
    (dict(prompt="café"), "outside the model's vocabulary"),
    (dict(tokens=0), "tokens 0: give at least 1"),
    (dict(tokens=2000), "exceeds the model's max_seq"),
])
def test_bad_input_fails_before_any_decoding(kwargs, needle, monkeypatch):
    monkeypatch.setattr(C, "run_side", lambda *a, **k: pytest.fail("decoding started"))
    with pytest.raises(LabError, match=needle):
        C.compare(**(dict(spec_a="reference", spec_b="sim", base=SIM) | kwargs))


def _tie_runs(margin: float):
    """A whose second step's top-1 leads its top-2 by `margin`, B picking the top-2 there."""
    a = C.Run("A", C.RunSpec("reference", None), "w", "h", "x", np.arange(5, dtype=np.int32), 3,
              np.array([[0.0, 1.0, 0.0], [1.0, 1.0 - margin, 0.0]]))
    b = C.Run("B", C.RunSpec("reference", None), "w", "h", "x", a.ids, 3,
              np.array([[0.0, 1.0, 0.0], [1.0 - margin, 1.0, 0.0]]))
    return a, b


def test_a_near_tie_is_listed_and_excused_only_below_the_tie_margin():
    a, b = _tie_runs(1e-4)
    loose = C.Thresholds(max_kld=1.0, max_dlogit=1.0, tie_margin=1e-3)
    res = C.compare_runs(a, b, loose)
    assert res["verdict"]["ok"], res["verdict"]
    assert [t["step"] for t in res["summary"]["near_ties"]] == [1]
    assert res["summary"]["top1_agreement"] == 0.5
    assert res["summary"]["top1_agreement_beyond_ties"] == 1.0
    assert "near-ties (A's margin < 0.001, not counted): step 1" in C.format_compare(res)
    strict = C.compare_runs(a, b, C.Thresholds(max_kld=1.0, max_dlogit=1.0))   # no tie margin
    assert not strict["verdict"]["ok"] and strict["summary"]["near_ties"] == []
    wide = C.compare_runs(*_tie_runs(0.5), loose)                # a real disagreement
    assert not wide["verdict"]["ok"] and wide["summary"]["near_ties"] == []


def test_greedy_check_passes_identical_ids_and_a_first_divergence_at_a_near_tie():
    a, _ = _tie_runs(1e-4)
    same = C.greedy_check(a, a, 1e-3)
    assert same["ok"] and same["identical"] and same["first_divergence"] is None
    other = C.Run("B", a.spec, "w", "h", "x", np.array([0, 1, 2, 3, 9], np.int32), 3, a.logits)
    tie = C.greedy_check(a, other, 1e-3)        # leaves A at step 1, where A's margin is 1e-4
    assert tie["ok"] and tie["first_divergence"]["step"] == 1 and tie["first_divergence"]["near_tie"]
    assert not C.greedy_check(a, other, 1e-5)["ok"]


def test_cli_prompts_runs_each_prompt_and_b_alone(capsys):
    assert main(["compare", "--a", "reference", "--b", "FUSION=1", "--backend", "sim", "--tokens",
                 "4", "--prompts", "ROMEO.\\n;To be", "--tie-margin", "1e-3"]) == 0
    text = capsys.readouterr().out
    assert "'ROMEO.\\n'" in text and "'To be'" in text and text.count("identical") >= 2
    assert "verdict: PASS" in text
    assert C._prompt_set("standard") == C.STANDARD_PROMPTS and len(C.STANDARD_PROMPTS) == 5


@pytest.mark.parametrize("kwargs", [dict(min_top1=1.5), dict(min_top1=-0.1), dict(max_kld=-1.0),
                                    dict(max_dlogit=float("nan")), dict(tie_margin=-1.0)])
def test_thresholds_out_of_range_are_refused(kwargs):
    with pytest.raises(LabError, match="min-top1|give a threshold >= 0"):
        C.Thresholds(**kwargs)


def test_models_of_different_shapes_cannot_be_compared(tmp_path, model):
    small = ModelConfig(**{**{k: getattr(model.cfg, k) for k in ModelConfig.__dataclass_fields__},
                           "d_model": 64, "d_ff": 128})
    other = _weights(tmp_path, random_model(small).weights, small, "small")
    with pytest.raises(LabError, match="differ in shape or vocabulary"):
        C.compare("reference", "reference", tokens=2, weights_b=other)


# ---- the command line --------------------------------------------------------------------------
def test_cli_pass_writes_json_atomically_and_announces_it(tmp_path, capsys):
    out = tmp_path / "cmp.json"
    assert main(["compare", "--a", "reference", "--b", "GRAPH=1", "--tokens", "4",
                 "--backend", "sim", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "verdict: PASS" in text and f"wrote {out}" in text and "path evidence:" in text
    res = json.loads(out.read_text())
    assert res["verdict"]["ok"] and len(res["steps"]) == 4
    assert [p.name for p in tmp_path.iterdir()] == ["cmp.json"]      # no temporary left behind


def test_cli_fail_exits_1(capsys):
    assert main(["compare", "--a", "reference", "--b", "KV_DTYPE=float16", "--tokens", "12",
                 "--backend", "sim"]) == 1
    assert "verdict: FAIL: max |Δlogit|" in capsys.readouterr().out


@pytest.mark.parametrize("extra, needle", [
    (["--b", "turbo"], "run spec 'turbo': unknown item"),
    (["--b", "KV_DTYPE=int8"], "LAB_KV_DTYPE='int8' is not allowed"),
    (["--b", "sim", "--prompt", ""], "the prompt is empty"),
    (["--b", "sim", "--tokens", "0"], "tokens 0: give at least 1"),
    (["--b", "sim", "--min-top1", "2"], "min-top1 2.0: give a fraction in [0, 1]"),
    (["--b", "sim", "--max-kld", "-1"], "--max-kld -1.0: give a threshold >= 0"),
    (["--b", "sim", "--json", "no/such/dir/x.json"], "folder no/such/dir does not exist"),
])
def test_cli_bad_input_is_one_line_and_exit_2(extra, needle, capsys, monkeypatch):
    monkeypatch.setattr(C, "run_side", lambda *a, **k: pytest.fail("decoding started"))
    assert main(["compare", "--a", "reference", "--backend", "sim", *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("decode-lab: error:") and needle in err and err.count("\n") == 1


def test_one_prompt_judges_the_device_loop_on_b_decoding_alone():
    """compare feeds side B one id per step, so the host loop runs whatever LAB_LOOP says: a
    LAB_LOOP=device claim is judged on B decoding the whole generation alone (one launch of the
    device loop), where a working loop passes; an engine that ran the host loop instead is a
    dead fast path."""
    res = C.compare("reference", "LOOP=device", tokens=3, base=SIM)
    checks = {c["claim"]: c for c in res["checks"]}
    assert checks["LAB_LOOP=device"]["ok"] is True, checks["LAB_LOOP=device"]
    assert checks["LAB_LOOP=device"]["side"] == "B (B alone)" and checks["LAB_GRAPH=1"]["ok"]
    assert res["verdict"]["ok"]

    def host_loop(model, cfg):              # an engine that ignores the claim
        return DecodeEngine(model, cfg.replace(loop="host"))
    res = C.compare("reference", "LOOP=device", tokens=3, base=SIM, engine_factory=host_loop)
    assert not res["verdict"]["ok"]
    assert any("B (B alone) claims LAB_LOOP=device" in r for r in res["verdict"]["reasons"])


def test_several_prompts_judge_the_device_loop_on_b_decoding_alone():
    """compare_prompts: B decoding alone runs the whole generation as `generate` does, so its
    LAB_LOOP=device claim is judged there (every step in the device loop), not on the fed side;
    an engine that ran the host loop instead is still a dead fast path."""
    res = C.compare_prompts("reference", "LOOP=device", ("ROMEO.\n",), 4, base=SIM)
    row = res["prompts"][0]
    check = next(c for c in row["compare"]["checks"] if c["claim"] == "LAB_LOOP=device")
    assert check["ok"] is True and check["side"] == "B (B alone)", check
    assert check["evidence"].startswith("10 of 10 steps in the device loop"), check
    assert res["verdict"]["ok"] and row["greedy"]["identical"]

    def host_loop(model, cfg):              # an engine that ignores the claim
        return DecodeEngine(model, cfg.replace(loop="host"))
    res = C.compare_prompts("reference", "LOOP=device", ("ROMEO.\n",), 4, base=SIM,
                            engine_factory=host_loop)
    reasons = res["prompts"][0]["compare"]["verdict"]["reasons"]
    assert not res["verdict"]["ok"] and any("B (B alone) claims LAB_LOOP=device" in r for r in reasons)


def test_with_ranks_the_split_combine_claim_is_not_read_from_the_kernels():
    """The rank step always merges, then projects each rank's shard (the all-reduce sums them):
    its attn_merge says nothing about LAB_SPLIT_COMBINE, so the claim is not checked there."""
    res = C.compare("reference", "RANKS=2", tokens=3, base=SIM)
    checks = {c["claim"]: c for c in res["checks"]}
    assert checks["LAB_SPLIT_COMBINE=0"]["ok"] is None
    assert "always merges" in checks["LAB_SPLIT_COMBINE=0"]["evidence"]
    assert res["verdict"]["ok"], res["verdict"]


def test_non_finite_logits_are_a_fail_that_says_so():
    """A side whose logits hold NaN (its float32 arithmetic overflowed) is no result: the verdict
    FAILs naming the side and the first such step, beyond the disagreement it causes."""
    def nan_engine(model, cfg):
        eng = DecodeEngine(model, cfg)
        real = eng.logits
        eng.logits = lambda *a, **k: np.full_like(real(*a, **k), np.nan)
        return eng
    res = C.compare("reference", "GRAPH=1", tokens=3, base=SIM, engine_factory=nan_engine)
    assert not res["verdict"]["ok"]
    assert res["verdict"]["reasons"][0] == ("B's logits hold NaN or infinite values at 3 of 3 "
                                            "steps (first at step 0): no result")
    assert not any("NaN" in r for r in C.compare("reference", "GRAPH=1", tokens=3,
                                                 base=SIM)["verdict"]["reasons"])
