"""The sim engine against the float64 oracle, and the engine's refusals of bad requests."""
import numpy as np
import pytest
from _oracle import logit_tol, stepped_logits

from lab import reference
from lab.engine.runner import DecodeEngine
from lab.errors import LabError
from lab.plan import plan_boundaries

PROMPT = "ROMEO.\n"          # 7 characters: 64+ generated tokens cross the plans at 32 and 64
N_TOKENS = 72


@pytest.fixture(scope="module")
def oracle(model):
    ids = model.tokenizer.encode(PROMPT)
    return reference.generate(model, ids, N_TOKENS, return_logits=True)


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_sim_tokens_equal_reference_across_plan_boundaries(model, sim_cfg, oracle, graph):
    ref_tokens, _ = oracle
    crossed = [b for b in plan_boundaries(model.cfg.max_seq) if len(PROMPT) <= b < len(ref_tokens) - 1]
    assert len(crossed) >= 2, "the test must cross at least two plan boundaries"
    eng = DecodeEngine(model, sim_cfg.replace(graph=graph))
    gen = eng.generate(PROMPT, N_TOKENS)
    assert N_TOKENS >= 64
    np.testing.assert_array_equal(gen.tokens, ref_tokens)
    assert gen.text == model.tokenizer.decode(ref_tokens[len(PROMPT):])


def test_sim_logits_within_dtype_tolerance_of_float64(model, sim_cfg, oracle):
    ref_tokens, ref_logits = oracle
    got = stepped_logits(DecodeEngine(model, sim_cfg.replace(graph=False)), ref_tokens,
                         len(PROMPT), N_TOKENS)
    assert np.all(np.abs(got - ref_logits) <= logit_tol(ref_logits))


def test_logit_error_is_far_inside_tolerance(model, sim_cfg, oracle):
    """Keeps the tolerance honest: if the error grew 10x, this fails before the one above."""
    ref_tokens, ref_logits = oracle
    eng = DecodeEngine(model, sim_cfg.replace(graph=False))
    eng.reset(ref_tokens[:len(PROMPT)], 8)
    for _ in range(len(PROMPT)):
        eng.step()
    err = np.abs(eng.logits().astype(np.float64) - ref_logits[0])
    assert np.all(err <= logit_tol(ref_logits[0]) / 10)


def test_float16_kv_cache_stays_close(model, sim_cfg, oracle):
    ref_tokens, ref_logits = oracle
    eng = DecodeEngine(model, sim_cfg.replace(kv_dtype="float16"))
    eng.reset(ref_tokens[:len(PROMPT)], 16)
    for _ in range(len(PROMPT) + 15):
        eng.step()
    # a float16 cache rounds every stored k/v to 11 significant bits (eps 9.8e-4); through
    # softmax and 4 layers that moves logits by a few 1e-3 relative, so compare at 1e-2.
    got = eng.logits().astype(np.float64)
    np.testing.assert_allclose(got, ref_logits[15], rtol=1e-2, atol=2e-2)


def test_prompt_plus_tokens_beyond_max_seq_is_refused(model, sim_cfg):
    eng = DecodeEngine(model, sim_cfg)
    with pytest.raises(LabError, match="exceeds the model's max_seq 1024"):
        eng.generate("ROMEO:", model.cfg.max_seq)


def test_prompt_outside_vocabulary_is_refused(model, sim_cfg):
    eng = DecodeEngine(model, sim_cfg)
    with pytest.raises(LabError, match="outside the model's vocabulary"):
        eng.generate("caf\u00e9 \u2603", 4)


def test_negative_token_count_is_refused(model, sim_cfg):
    with pytest.raises(LabError, match=">= 0"):
        DecodeEngine(model, sim_cfg).generate("ROMEO:", -1)


def test_position_and_tokens_live_on_the_device(model, sim_cfg):
    eng = DecodeEngine(model, sim_cfg)
    gen = eng.generate(PROMPT, 5)
    assert eng.device_position() == len(PROMPT) - 1 + 5 == eng.position
    np.testing.assert_array_equal(eng.tokens(), gen.tokens)


@pytest.mark.parametrize("toggles, switch", [({}, {"split_combine": True}),
                                             ({"fusion": True}, {"split_combine": True}),
                                             ({"draft": 2}, {"graph": False})],
                         ids=["step", "fused", "draft"])
def test_warm_up_compiles_only_the_kernels_the_step_launches(model, sim_cfg, monkeypatch, toggles,
                                                            switch):
    """The configured step's kernels at every plan, no more: a decode after it compiles nothing
    (no "compilation" op), and a kernel of another mode is never compiled."""
    import kernels
    from lab.backend.sim import SimBackend
    warmed: list[str] = []
    real = SimBackend.warm_up
    monkeypatch.setattr(SimBackend, "warm_up",
                        lambda be, ks: (warmed.extend(k.name for k in ks), real(be, ks))[1])
    eng = DecodeEngine(model, sim_cfg.replace(**toggles))
    plans = [eng.plan(p) for p in [0] + plan_boundaries(model.cfg.max_seq)]
    launched = {x.name for p in plans for x in eng.step_launches(p)}
    assert set(warmed) == launched and len(launched) < len(kernels.REGISTRY) / 2
    eng.generate(PROMPT, 40)
    assert [op.detail for op in eng.backend.ops if op.kind == "compilation"] == []
    eng.cfg = eng.cfg.replace(**switch)                # a live switch warms up what it adds
    eng.generate(PROMPT, 4)
    assert [op.detail for op in eng.backend.ops if op.kind == "compilation"] == []
