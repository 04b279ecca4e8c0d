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
