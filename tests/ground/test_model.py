"""Weight loading refuses anything that does not match, with a message that says what."""
import json
import shutil

import numpy as np
import pytest

from lab import reference
from lab.errors import LabError
from lab.model import DEFAULT_WEIGHTS, load_model, sha256_of


def _copy(tmp_path, arrays=None):
    """A copy of the shipped model in tmp_path, optionally with replaced arrays (re-checksummed)."""
    npz, meta = tmp_path / "m.npz", tmp_path / "m.json"
    if arrays is None:
        shutil.copy(DEFAULT_WEIGHTS, npz)
    else:
        np.savez(npz, **arrays)
    info = json.loads(DEFAULT_WEIGHTS.with_suffix(".json").read_text())
    info["sha256"] = sha256_of(npz)
    meta.write_text(json.dumps(info))
    return npz


def test_shipped_model_loads_and_matches_its_checksum(model):
    assert model.cfg.max_seq >= 1024
    n_params = sum(a.size for a in model.weights.values())
    assert 1_000_000 <= n_params <= 4_000_000  # "a few million", <= 16 MB of float32
    assert DEFAULT_WEIGHTS.stat().st_size <= 16 * 2 ** 20


def test_missing_file(tmp_path):
    with pytest.raises(LabError, match="not found"):
        load_model(tmp_path / "nope.npz")


def test_corrupt_file_fails_the_checksum(tmp_path):
    npz = _copy(tmp_path)
    data = bytearray(npz.read_bytes())
    data[len(data) // 2] ^= 0xFF
    npz.write_bytes(bytes(data))
    with pytest.raises(LabError, match="corrupt: sha256"):
        load_model(npz)


def test_wrong_shape(tmp_path, model):
    arrays = dict(model.weights)
    arrays["layers.0.wo"] = np.zeros((3, 3), np.float32)
    with pytest.raises(LabError, match=r"layers.0.wo has shape \(3, 3\); expected \(256, 256\)"):
        load_model(_copy(tmp_path, arrays))


def test_wrong_dtype(tmp_path, model):
    arrays = dict(model.weights)
    arrays["final_norm"] = arrays["final_norm"].astype(np.float64)
    with pytest.raises(LabError, match="final_norm has dtype float64; expected float32"):
        load_model(_copy(tmp_path, arrays))


def test_missing_array(tmp_path, model):
    arrays = dict(model.weights)
    del arrays["lm_head"]
    with pytest.raises(LabError, match="missing \\['lm_head'\\]"):
        load_model(_copy(tmp_path, arrays))


def test_non_finite_weights(tmp_path, model):
    arrays = dict(model.weights)
    arrays["tok_emb"] = arrays["tok_emb"].copy()
    arrays["tok_emb"][0, 0] = np.nan
    with pytest.raises(LabError, match="NaN"):
        load_model(_copy(tmp_path, arrays))


def test_tokenizer_round_trip_and_refusal(model):
    tok = model.tokenizer
    text = "ROMEO.\nO, she doth teach the torches to burn bright!"
    assert tok.decode(tok.encode(text)) == text
    with pytest.raises(LabError, match="outside the model's vocabulary: '\u2603'"):
        tok.encode("snow \u2603")
    with pytest.raises(LabError, match="empty"):
        tok.encode("")


def test_reference_kv_decode_equals_full_recompute(model):
    """The oracle's incremental KV-cache step equals a from-scratch causal forward pass."""
    ids = model.tokenizer.encode("To be, or not")
    ref = reference.Reference(model)
    for pos, t in enumerate(ids):
        last = ref.step(int(t), pos)
    # recompute: fresh caches, but run the whole prefix again and compare the final logits
    again = reference.Reference(model)
    for pos, t in enumerate(ids):
        full = again.step(int(t), pos)
    np.testing.assert_array_equal(last, full)
    # and a causal check: the logits at a position do not depend on later tokens
    r1, r2 = reference.Reference(model), reference.Reference(model)
    a = [r1.step(int(t), p) for p, t in enumerate(ids[:5])]
    b = [r2.step(int(t), p) for p, t in enumerate(np.r_[ids[:5], ids[::-1]])]
    np.testing.assert_array_equal(a[4], b[4])


def test_reference_greedy_text_is_fluent(model):
    """A broken decode must be visible to a reader: the oracle writes words, not noise."""
    ids = reference.generate(model, model.tokenizer.encode("ROMEO.\n"), 120)
    text = model.tokenizer.decode(ids)
    words = [w.strip(".,;:!?'\"") for w in text.split()]
    common = {"the", "and", "to", "of", "i", "my", "you", "that", "a", "is", "in", "not", "me",
              "it", "with", "be", "your", "his", "this", "for", "will", "what", "he", "so", "have"}
    assert sum(w.lower() in common for w in words) >= 5, text


def _described(tmp_path, **changes):
    """The shipped weights beside a description with `changes` (None: the key removed)."""
    npz = _copy(tmp_path)
    meta = npz.with_suffix(".json")
    info = json.loads(meta.read_text())
    for k, v in changes.items():
        if v is None:
            info.pop(k)
        else:
            info[k] = v
    meta.write_text(json.dumps(info))
    return npz


@pytest.mark.parametrize("changes, needle", [
    ({"d_model": "256"}, "d_model must be an integer, got '256' (str)"),
    ({"n_layer": 4.0}, "n_layer must be an integer, got 4.0 (float)"),
    ({"n_head": True}, "n_head must be an integer"),
    ({"max_seq": 0}, "max_seq = 0 must be at least 2"),
    ({"d_ff": -1}, "d_ff = -1 must be at least 1"),
    ({"norm_eps": "1e-5"}, "norm_eps must be a number"),
    ({"rope_theta": 0}, "rope_theta = 0 must be a finite number > 0"),
    ({"vocab": 7}, "vocab must be a string"),
    ({"d_ff": None}, "m.json lacks d_ff"),
])
def test_description_types_and_ranges_are_refused_at_load(tmp_path, changes, needle):
    """A wrong type or an impossible size is refused when the model loads, naming the field,
    not as a TypeError in the engine or a failure at the first step."""
    with pytest.raises(LabError) as exc:
        load_model(_described(tmp_path, **changes))
    assert needle in str(exc.value) and "m.json" in str(exc.value)


def test_description_that_is_not_an_object(tmp_path):
    npz = _copy(tmp_path)
    npz.with_suffix(".json").write_text("[1, 2]")
    with pytest.raises(LabError, match="m.json: expected a JSON object, got list"):
        load_model(npz)


def test_messages_that_say_what_is_wrong(tmp_path):
    """A folder as weights, a description without a checksum, a text file named .npz: each
    refusal says what the file is, not "not found", "the recorded None" or numpy's advice
    about allow_pickle (which the lab must never set for a weights file)."""
    with pytest.raises(LabError, match="is a folder; give the .npz file"):
        load_model(tmp_path)
    with pytest.raises(LabError, match="records no sha256 of m.npz") as exc:
        load_model(_described(tmp_path, sha256=None))
    assert "None" not in str(exc.value)
    text = tmp_path / "t.npz"
    text.write_text("not weights\n")
    info = json.loads(DEFAULT_WEIGHTS.with_suffix(".json").read_text())
    info["sha256"] = sha256_of(text)
    (tmp_path / "t.json").write_text(json.dumps(info))
    with pytest.raises(LabError, match="t.npz is unreadable: not an .npz archive") as exc:
        load_model(text)
    assert "allow_pickle" not in str(exc.value)
