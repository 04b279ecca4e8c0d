"""PDL: byte-identical to LAB_PDL=0, refused with a message below sm_90, programmatic edges in
a captured graph (GPU), and the simulator's timing model."""
import numpy as np
import pytest

from lab.backend.sim import SimBackend
from lab.config import LabConfig
from lab.engine.runner import DecodeEngine
from lab.measure.replay_check import decode_after_prompt


def _arm(model, cfg, steps=40, backend=None):
    eng = DecodeEngine(model, cfg, backend=backend)
    return decode_after_prompt(eng, model.tokenizer.encode("ROMEO.\n"), steps, graph=cfg.graph)[0]


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_pdl_is_byte_identical_on_sim(model, graph):
    base = _arm(model, LabConfig(backend="sim", graph=graph))
    pdl = _arm(model, LabConfig(backend="sim", graph=graph, pdl=True))
    assert base.tokens.tobytes() == pdl.tokens.tobytes()
    assert base.logits.tobytes() == pdl.logits.tobytes()


class _OldGpu(SimBackend):
    def compute_capability(self):
        return (8, 0)


def test_pdl_below_sm90_is_refused_with_a_message_and_the_run_goes_on(model):
    with pytest.warns(UserWarning, match="needs sm_90 or newer, this GPU is sm_80"):
        eng = DecodeEngine(model, LabConfig(backend="sim", pdl=True), backend=_OldGpu())
    assert eng.backend.pdl is False and "refused" in eng.warnings[0]
    gen = eng.generate("ROMEO.\n", 10)
    ref = DecodeEngine(model, LabConfig(backend="sim")).generate("ROMEO.\n", 10)
    np.testing.assert_array_equal(gen.tokens, ref.tokens)


def test_sim_pdl_hides_part_of_the_per_node_gap(model):
    times = {}
    for pdl in (False, True):
        eng = DecodeEngine(model, LabConfig(backend="sim", pdl=pdl), backend=SimBackend(seed=3))
        times[pdl] = eng.generate("ROMEO.\n", 64).ms_per_token
    assert times[True] < times[False]


@pytest.mark.gpu
def test_gpu_pdl_byte_identical_and_programmatic_edges(model):
    base = _arm(model, LabConfig(backend="cuda"))
    eng = DecodeEngine(model, LabConfig(backend="cuda", pdl=True))
    pdl = decode_after_prompt(eng, model.tokenizer.encode("ROMEO.\n"), 40, graph=True)[0]
    assert base.tokens.tobytes() == pdl.tokens.tobytes()
    assert base.logits.tobytes() == pdl.logits.tobytes()
    edges = next(iter(eng.graphs.values())).edge_types()
    assert edges.get("programmatic", 0) >= len(eng.step_launches(eng.plan(0))) - 1, edges


def test_the_attention_partials_trigger_their_dependents_after_their_work():
    """kernels/pdl.py's LATE_TRIGGER (measured on the H200: an early trigger in attn_partial
    made PDL lose at context 900) is held statically; a kernel that triggers first is caught."""
    from kernels.pdl import LATE_TRIGGER
    from lab.pdl_check import late_trigger_violations
    assert set(LATE_TRIGGER) >= {"attn_partial", "attn_partial_wide", "attn_fused"}
    assert late_trigger_violations() == {}
    caught = late_trigger_violations(late=("attn_combine", "no_such_kernel"))
    assert "before its work" in caught["attn_combine"]
    assert "not a registered kernel" in caught["no_such_kernel"]
