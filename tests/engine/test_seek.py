"""DecodeEngine.seek: long contexts without filling the KV cache -- valid for timing, invalid for
byte-compares. An eager-vs-eager A/A at a sought context FAILS with uninitialised caches (each
engine reads different garbage) and PASSES with zero-initialised ones."""
import string

import numpy as np
import pytest

from lab.config import LabConfig
from lab.engine.runner import DecodeEngine
from lab.errors import LabError
from lab.measure.stats import outputs_differ
from lab.model import ModelConfig, random_model

VOCAB = "\n !$&',-.3:;?" + string.ascii_letters
SMALL = ModelConfig(vocab=VOCAB, d_model=32, n_layer=1, n_head=2, d_ff=64, max_seq=128,
                    rope_theta=10000.0, norm_eps=1e-5)
EAGER = LabConfig(backend="sim", graph=False)


@pytest.fixture(scope="module")
def small():
    return random_model(SMALL)


def _sought_run(model, kv_init, position=100, steps=4, cfg=EAGER):
    eng = DecodeEngine(model, cfg, kv_init=kv_init)
    eng.reset(eng.encode("ROMEO.\n"), 0)
    eng.seek(position)
    for _ in range(steps):
        eng.step()
    return eng.tokens(position + steps + 1)[position + 1:], eng.logits()


def test_seek_aa_fails_with_uninitialised_caches(small):
    a, b = _sought_run(small, "empty"), _sought_run(small, "empty")
    why = outputs_differ([a], [b])
    assert why, "two engines with uninitialised caches agreed: the trap did not spring"
    assert np.isfinite(a[1]).all() and np.isfinite(b[1]).all()   # garbage, but finite garbage


def test_seek_aa_passes_with_zeroed_caches(small):
    assert outputs_differ([_sought_run(small, "zeros")], [_sought_run(small, "zeros")]) == ""


def test_seek_sets_device_and_host_position(small):
    eng = DecodeEngine(small, LabConfig(backend="sim"))
    eng.reset(eng.encode("ROMEO.\n"), 0)
    eng.seek(90)
    assert eng.position == 90 and eng.device_position() == 90
    assert eng.plan().splits == eng.plan(90).splits
    eng.step()                                   # a graph step at the sought position
    assert eng.position == eng.device_position() == 91
    assert eng.ledger[-1].position == 90 and eng.ledger[-1].outcome == "capture"
    assert 0 <= eng.tokens(92)[91] < SMALL.vocab_size


def test_seek_errors(small):
    eng = DecodeEngine(small, EAGER)
    with pytest.raises(LabError, match="call reset"):
        eng.seek(10)
    eng.reset(eng.encode("ROMEO.\n"), 0)
    for bad in (-1, SMALL.max_seq - 1, SMALL.max_seq, 10_000):
        with pytest.raises(LabError, match="max_seq"):
            eng.seek(bad)
    eng.seek(SMALL.max_seq - 2)                  # the last position a step can decode
    eng.step()
    with pytest.raises(LabError, match="exceed max_seq"):
        eng.step()
