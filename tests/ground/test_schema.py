"""Every file the lab reads is checked against its schema (lab/schema.py) when it is loaded: a
corrupt copy of a real data file -- NaN, a negative time, a string or null for a number, an
object for a list, an empty table, a missing key, another recording in its place -- is a
one-line LabError naming the file and the field, never a traceback or a placeholder. And the
model: sizes past the lab's bounds or the machine's memory are refused before anything is
allocated, weights that overflow float32 are refused at load, and a decode whose logits are not
finite is refused where the host reads them. Device-free and fast."""
from __future__ import annotations

import json
import re
import shutil
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from lab import schema
from lab.backend.costmodel import COSTS_FILE, SUPPLEMENT, CostModel
from lab.errors import LabError
from lab.measure import conformance
from lab.model import DEFAULT_WEIGHTS, Model, load_model, sha256_of

DATA_GPU = COSTS_FILE.parent
NAN = float("nan")


def _real(name: str) -> dict:
    return json.loads((DATA_GPU / name).read_text())


def _set(data, path: str, value):
    """data with the field at `path` ("a.b.3.c") set to `value`, or deleted (value is _DEL)."""
    parts = path.split(".")
    cur = data
    for p in parts[:-1]:
        cur = cur[int(p)] if isinstance(cur, list) else cur[p]
    last = int(parts[-1]) if isinstance(cur, list) else parts[-1]
    if value is _DEL:
        del cur[last]
    else:
        cur[last] = value
    return data


_DEL = object()


def _write(folder: Path, name: str, data) -> Path:
    path = folder / name
    path.write_text(json.dumps(data))     # json writes NaN as NaN, which json.loads reads back
    return path


def _one_line(exc) -> str:
    text = str(exc.value)
    assert "\n" not in text and "Traceback" not in text
    return text


# ---- the real files load ------------------------------------------------------------------------
def test_the_committed_files_follow_their_schemas():
    for name, rule in schema.RECORDINGS.items():
        schema.load(DATA_GPU / name, rule)
    schema.load(DATA_GPU / SUPPLEMENT, schema.SPEC_COSTS)
    schema.load(DATA_GPU / "ranks.json", schema.RANKS)
    assert CostModel.load().kernels
    assert load_model().cfg.max_seq >= 2


# ---- kernel_costs.json and its supplement -------------------------------------------------------
KERNEL_COSTS_CASES = [
    ("kernels.3.node_us", NAN, "kernels[3].node_us: must be a finite number >= 0, got nan"),
    ("kernels.0.node_pdl_us", -1.5, "kernels[0].node_pdl_us: must be a finite number >= 0, got -1.5"),
    ("kernels.2.context", "5", "kernels[2].context: must be an integer >= 1, got a string '5'"),
    ("kernels.1.bytes", None, "kernels[1].bytes: must be an integer > 0, got null"),
    ("kernels", [], "kernels: must be a non-empty list, got []"),
    ("kernels", {"a": 1}, "kernels: must be a list, got an object"),
    ("switches", {}, "switches: must be a list, got an object"),
    ("switches.4.extra_us", "1.0", "switches[4].extra_us: must be a finite number, got a string"),
    ("floors.graph_submit_us", None, "floors.graph_submit_us: must be a finite number > 0, got null"),
    ("floors.empty.per_node_us", float("inf"), "floors.empty.per_node_us: must be a finite number > 0"),
    ("kernels.3.node_us", 10 ** 400, "kernels[3].node_us: must be a finite number >= 0, got 1000"),
    ("floors.empty", _DEL, "missing key 'floors.empty.per_node_us'"),
    ("host.prebound", "fast", "host.prebound: must be an object, got a string 'fast'"),
    ("host.dispatcher", {"matvec grid=(1,) [8:float32]": -2.0},
     "host.dispatcher['matvec grid=(1,) [8:float32]']: must be a finite number >= 0, got -2.0"),
    ("noise.graph.rep_cv", -0.1, "noise.graph.rep_cv: must be a finite number >= 0 and <= 10, "
                                 "got -0.1"),
    ("noise.prebound.rep_cv", 1e300,    # a CV that would overflow the simulator's noise
     "noise.prebound.rep_cv: must be a finite number >= 0 and <= 10, got 1e+300"),
    ("engine_host_us", _DEL, "missing key 'engine_host_us.eager'"),
    ("kernels.5.key", "matvec", "kernels[5].key: must be a string containing ' ['"),
]


@pytest.mark.parametrize("path, value, needle", KERNEL_COSTS_CASES,
                         ids=[c[0] + "=" + repr(c[1])[:12] for c in KERNEL_COSTS_CASES])
def test_a_corrupt_cost_file_names_its_field(tmp_path, path, value, needle):
    bad = _write(tmp_path, "kernel_costs.json", _set(_real("kernel_costs.json"), path, value))
    with pytest.raises(LabError) as exc:
        CostModel.load(bad)
    text = _one_line(exc)
    assert text.startswith(f"kernel_costs.json: {needle}"), text


@pytest.mark.parametrize("content, needle", [
    ([], "kernel_costs.json: the file: must be an object, got a list []"),
    ("ladder.json", "kernel_costs.json: "),              # another recording in its place
    ("spec_costs.json", "kernel_costs.json: missing key 'launches_per_token'"),
])
def test_another_file_in_the_cost_files_place(tmp_path, content, needle):
    data = _real(content) if isinstance(content, str) else content
    with pytest.raises(LabError) as exc:
        CostModel.load(_write(tmp_path, "kernel_costs.json", data))
    assert needle in _one_line(exc)


@pytest.mark.parametrize("change, needle", [
    (("kernels.1.node_pdl_us", "1.0"), "spec_costs.json: kernels[1].node_pdl_us: must be a "
                                      "finite number >= 0, got a string '1.0'"),
    (("switches", {}), "spec_costs.json: switches: must be a list, got an object"),
    ([], "spec_costs.json: the file: must be an object, got a list []"),
    ("ladder.json", "spec_costs.json: missing key 'kernels'"),
])
def test_a_corrupt_supplement_names_itself(tmp_path, change, needle):
    shutil.copy(COSTS_FILE, tmp_path / "kernel_costs.json")
    if isinstance(change, tuple):
        data = _set(_real(SUPPLEMENT), *change)
    else:
        data = _real(change) if isinstance(change, str) else change
    _write(tmp_path, SUPPLEMENT, data)
    with pytest.raises(LabError) as exc:
        CostModel.load(tmp_path / "kernel_costs.json")
    assert needle in _one_line(exc)


def test_a_cost_dict_is_checked_too():
    with pytest.raises(LabError, match=r"<dict>: kernels: must be a non-empty list"):
        CostModel.from_dict(_set(_real("kernel_costs.json"), "kernels", []))


def test_a_corrupt_ranks_file_names_its_field(tmp_path):
    from lab.backend.costmodel import CollectiveCosts
    data = _set(_real("ranks.json"), "collectives.graph_us", [17.5])
    with pytest.raises(LabError) as exc:
        CollectiveCosts.load(_write(tmp_path, "ranks.json", data))
    assert "ranks.json: collectives.graph_us: must be an object, got a list" in _one_line(exc)


# ---- the recordings conformance judges ----------------------------------------------------------
RECORDING_CASES = [
    ("ladder.json", "arms.1.mean_ms", NAN, "arms[1].mean_ms: must be a finite number > 0, got nan"),
    ("ladder.json", "arms.0.mean_ms", -0.4, "arms[0].mean_ms: must be a finite number > 0, got -0.4"),
    ("ladder.json", "arms.2.mean_ms", "0.1", "arms[2].mean_ms: must be a finite number > 0, got a string"),
    ("ladder.json", "arms.2.launches_per_token", "37", "arms[2].launches_per_token: must be an integer >= 0"),
    ("ladder.json", "arms", {"graph": {}}, "arms: must be a list, got an object"),
    ("ladder.json", "tokens", None, "tokens: must be an integer >= 1, got null"),
    ("overlap.json", "diff_b_minus_a_ms", None, "diff_b_minus_a_ms: must be a finite number, got null"),
    ("overlap.json", "diff_sem_ms", -0.01, "diff_sem_ms: must be a finite number >= 0, got -0.01"),
    ("fission.json", "graph.tokens", "16", "graph.tokens: must be an integer >= 1, got a string '16'"),
    ("fission.json", "fused.eager", [], "fused.eager: must be an object, got a list []"),
    ("device_loop.json", "plain.diff_b_minus_a_ms", "x", "plain.diff_b_minus_a_ms: must be a finite number"),
    ("bench_sweep.json", "rows", {}, "rows: must be a list, got an object"),
    ("bench_sweep.json", "rows.3.mean_ms", NAN, "rows[3].mean_ms: must be a finite number > 0, got nan"),
    ("pdl_context.json", "contexts.0.rows.0.arm", "graph?", "contexts[0].rows: must hold a row whose arm is 'graph'"),
    ("pdl_context.json", "contexts.1.rows.0.minus_pdl_us", None, "contexts[1].rows[0].minus_pdl_us: must be a finite number, got null"),
    ("spec.json", "curve.rows.0.replay_fraction", 2, "curve.rows[0].replay_fraction: must be a finite number >= 0 and <= 1, got 2"),
    ("spec.json", "curve", _DEL, "no field 'curve.new_tokens' (recorded by another version"),
    ("conformance_findings.json", "findings", "none", "findings: must be a list, got a string 'none'"),
    ("megakernel_bound.json", "sweep.rows.2.mean_ms", NAN, "sweep.rows[2].mean_ms: must be a finite number > 0, got nan"),
    ("megakernel_bound.json", "ratio_to_best_multi_node.64.gate_reachable", "no", "ratio_to_best_multi_node['64'].gate_reachable: must be true or false, got a string 'no'"),
]


@pytest.mark.parametrize("name, path, value, needle", RECORDING_CASES,
                         ids=[f"{c[0]}:{c[1]}" for c in RECORDING_CASES])
def test_a_corrupt_recording_names_its_field(tmp_path, name, path, value, needle):
    _write(tmp_path, name, _set(_real(name), path, value))
    with pytest.raises(LabError) as exc:
        conformance._load(tmp_path, name)
    text = _one_line(exc)
    assert text.startswith(f"{name}: {needle}"), text


def test_conformance_refuses_a_corrupt_recording_before_judging_it(tmp_path, model):
    """The wiring: `decode-lab conformance --data DIR` loads through the schema (no simulation
    runs: the nodes lesson alone)."""
    for path in DATA_GPU.glob("*.json"):
        shutil.copy(path, tmp_path / path.name)
    _write(tmp_path, "ladder.json", _set(_real("ladder.json"), "arms.3.mean_ms", NAN))
    with pytest.raises(LabError, match=r"^ladder.json: arms\[3\].mean_ms: must be a finite number > 0, got nan$"):
        conformance.run(model, tmp_path, only=("nodes",))
    _write(tmp_path, "ladder.json", _real("ladder.json"))
    _write(tmp_path, "kernel_costs.json", _set(_real("kernel_costs.json"), "kernels", []))
    with pytest.raises(LabError, match=r"^kernel_costs.json: kernels: must be a non-empty list"):
        conformance.run(model, tmp_path, only=("nodes",))


# ---- the model ---------------------------------------------------------------------------------
def _model_copy(tmp_path, scale: float = 1.0, **meta_changes) -> Path:
    """data/tiny_model.* copied to tmp_path as m.npz / m.json: weights times `scale` (with the
    description's sha256 made to match) and the description's fields changed."""
    npz = tmp_path / "m.npz"
    if scale == 1.0:
        shutil.copy(DEFAULT_WEIGHTS, npz)
    else:
        with np.load(DEFAULT_WEIGHTS) as f:
            np.savez(npz, **{k: (f[k] * np.float32(scale)).astype(np.float32) for k in f.files})
    meta = json.loads(DEFAULT_WEIGHTS.with_suffix(".json").read_text())
    meta.update(meta_changes, sha256=sha256_of(npz))
    npz.with_suffix(".json").write_text(json.dumps(meta))
    return npz


def test_weights_that_overflow_float32_are_refused_at_load(tmp_path):
    with pytest.raises(LabError) as exc:
        load_model(_model_copy(tmp_path, scale=1e30))
    text = _one_line(exc)
    assert text.startswith("m.npz: ") and "layer 0" in text and "past float32's range" in text


def test_an_oversized_max_seq_is_refused_before_allocating(tmp_path):
    npz = _model_copy(tmp_path, max_seq=10 ** 9)
    tracemalloc.start()
    try:
        with pytest.raises(LabError) as exc:
            load_model(npz)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert _one_line(exc) == ("m.json: max_seq = 1000000000, past the lab's bound 1048576 for "
                              "it (a model of the lab's size: data/tiny_model.json)")
    assert peak < 16 << 20, peak          # nothing of its size was allocated


def test_a_model_past_the_machines_memory_is_refused(tmp_path, monkeypatch):
    import lab.model as lm
    monkeypatch.setattr(lm, "available_bytes", lambda: 1 << 20)
    with pytest.raises(LabError, match=r"^m.json: a model of max_seq 1024, d_model 256, n_layer "
                                       r"4 needs about 0.\d GiB of memory .* more than the 0.0 GiB"):
        load_model(_model_copy(tmp_path))


@pytest.mark.parametrize("field, value", [("d_model", 1 << 15), ("n_layer", 300), ("d_ff", 1 << 17)])
def test_sizes_past_their_bounds(tmp_path, field, value):
    with pytest.raises(LabError, match=rf"m.json: {field} = {value}, past the lab's bound"):
        load_model(_model_copy(tmp_path, **{field: value}))


def test_a_decode_whose_logits_are_not_finite_names_its_step(model):
    """An LM head past float32 (built in code: no load probe) decodes inf and NaN logits:
    generate refuses its tokens, naming the last step's position, and its float32 re-run on the
    host names the first step and the part where a value left the finite range."""
    from lab import DecodeEngine, LabConfig
    from lab.engine.requests import check_finite
    w = dict(model.weights, lm_head=model.weights["lm_head"] * np.float32(1e30),
             final_norm=model.weights["final_norm"] * np.float32(1e30))
    eng = DecodeEngine(Model(model.cfg, w, model.tokenizer, "scaled"), LabConfig(backend="sim"))
    with np.errstate(all="ignore"), pytest.raises(LabError) as exc:
        eng.generate("ROMEO.\n", 2)
    assert re.match(r"the last decode step's \(position 7\) logits hold \d+ NaN and \d+ "
                    r"infinite value\(s\) of 71: its tokens are no result; a float32 re-run of "
                    r"the same tokens on the host first leaves the finite range at the step at "
                    r"position 0, lm_head \(logits\)$", _one_line(exc))
    assert check_finite(np.zeros(3), "x") is not None


def _loud_values(model, factor: float) -> Model:
    """The model with every layer's V rows of wqkv times `factor` and wo divided by it: the same
    function in exact arithmetic (attention is linear in V), V values `factor` times larger."""
    D, w = model.cfg.d_model, dict(model.weights)
    for i in range(model.cfg.n_layer):
        qkv = w[f"layers.{i}.wqkv"].copy()
        qkv[2 * D:] *= np.float32(factor)
        w[f"layers.{i}.wqkv"] = qkv
        w[f"layers.{i}.wo"] = (w[f"layers.{i}.wo"] / np.float32(factor)).astype(np.float32)
    return Model(model.cfg, w, model.tokenizer, "loud values")


def test_a_float16_cache_that_overflows_is_named_by_layer_and_step(model):
    """V values past float16's 65504 but far inside float32's range: the load probe (float32's
    range) passes them and the float32 cache decodes text; the float16 cache stores inf and the
    decode turns NaN. The diagnosis names the step at position 0 and the layer whose V cache
    overflowed, the first place a value is not finite."""
    from lab import DecodeEngine, LabConfig
    from lab.model import probe
    loud = _loud_values(model, 3e4)
    assert probe(loud) is None
    assert DecodeEngine(loud, LabConfig(backend="sim")).generate("ROMEO.\n", 3).text
    eng = DecodeEngine(loud, LabConfig(backend="sim", kv_dtype="float16"))
    with np.errstate(all="ignore"), pytest.raises(LabError) as exc:
        eng.generate("ROMEO.\n", 3)
    assert _one_line(exc).endswith("first leaves the finite range at the step at position 0, "
                                   "layer 1 V cache (float16)")


def test_non_finite_logits_the_re_run_does_not_reproduce_blame_a_kernel(model, monkeypatch):
    """Logits that turn NaN where float32 NumPy stays finite (a kernel's fault, injected here at
    the read) are not blamed on the arithmetic: the diagnosis says the re-run stayed finite."""
    from lab import DecodeEngine, LabConfig
    from lab.engine import requests
    real = requests.logits
    monkeypatch.setattr(requests, "logits", lambda eng: real(eng) * np.float32(np.nan))
    with pytest.raises(LabError) as exc:
        DecodeEngine(model, LabConfig(backend="sim")).generate("ROMEO.\n", 2)
    assert _one_line(exc).endswith("stays finite through all 8 steps: the non-finite values come "
                                   "from a kernel, not from float32's range (`python -m "
                                   "kernels.check` holds each kernel to its NumPy twin)")


def test_spec_break_even_fields_are_checked_when_present():
    """spec.json's break_even (the two texts' E and V) is optional for older recordings and
    checked field by field when present: a V of zero or a text without its corpus offsets is
    refused naming the field."""
    rec = _real("spec.json")
    rec.pop("break_even", None)
    schema.check(rec, schema.SPEC, "spec.json")                 # older recordings: absent
    row = {"text": "prose", "draft": 4, "tokens_per_step": 1.4, "verify_steps": 46,
           "verify_step_cost": 1.3, "verify_step_cost_se": 0.01, "verify_step_us": 100.0,
           "one_step_us": 77.0, "ms_per_token": 0.07, "se": 0.001, "ms_per_token_one": 0.08,
           "se_one": 0.001, "speedup": 1.1, "predicted_speedup": 1.08, "pays": True,
           "generated": "abc"}
    text = {"offset": 794165, "length": 172, "primed": 0, "what": "four lines",
            "source": "data/corpus.txt[794165:794337]", "prompt_chars": 172}
    rec["break_even"] = {"texts": {"prose": text}, "new_tokens": 64, "reps": 5, "step_reps": 32,
                         "source": "measured on a GPU", "rows": [row]}
    schema.check(rec, schema.SPEC, "spec.json")
    rec["break_even"]["rows"][0]["verify_step_cost"] = 0.0
    with pytest.raises(LabError, match=r"break_even.rows\[0\].verify_step_cost: must be a finite number > 0"):
        schema.check(rec, schema.SPEC, "spec.json")
    rec["break_even"]["rows"][0]["verify_step_cost"] = 1.3
    del rec["break_even"]["texts"]["prose"]["offset"]
    with pytest.raises(LabError, match="offset"):
        schema.check(rec, schema.SPEC, "spec.json")
