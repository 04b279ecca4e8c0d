"""LAB_PLAN_SWITCH=update: at a plan change the engine captures the new plan's step and updates
the live executable graph in place (cudaGraphExecUpdate) instead of instantiating a new one;
the runtime refuses when the topology differs, and then the engine instantiates, as recapture
does. Tokens stay byte-identical to recapture."""
import numpy as np
import pytest

from lab.backend.sim import SimBackend, SimGraph
from lab.config import LabConfig
from lab.engine.runner import DecodeEngine
from lab.errors import LabError
from lab.plan import plan_boundaries

PROMPT = "ROMEO.\n"


def _run(model, backend, n=80, **toggles):
    eng = DecodeEngine(model, LabConfig(backend=backend, **toggles))
    return eng.generate(PROMPT, n), eng


def _non_replays(eng):
    return [(e.position, e.outcome, e.reason) for e in eng.ledger if e.outcome != "replay"]


def _check_update_matches_recapture(model, backend):
    rec, r_eng = _run(model, backend)
    upd, u_eng = _run(model, backend, plan_switch="update")
    np.testing.assert_array_equal(upd.tokens, rec.tokens)
    np.testing.assert_array_equal(u_eng.logits(), r_eng.logits())
    crossed = [b for b in plan_boundaries(model.cfg.max_seq) if b < len(PROMPT) - 1 + 80]
    assert _non_replays(u_eng) == [(0, "capture", "")] + [(b, "update", "") for b in crossed]
    assert len(u_eng.graphs) == 1 and len(r_eng.graphs) == len(crossed) + 1
    return u_eng


def test_update_is_byte_identical_to_recapture_with_one_graph(model):
    _check_update_matches_recapture(model, "sim")


@pytest.mark.gpu
def test_gpu_update_is_byte_identical_to_recapture_with_one_graph(model):
    _check_update_matches_recapture(model, "cuda")


def test_a_new_request_updates_back_without_capturing_again(model):
    eng = _check_update_matches_recapture(model, "sim")
    captured = sum(r.kind == "capture" for r in eng.log.records)
    start = len(eng.ledger)
    gen = eng.generate("To be, or not", 40)
    new = [(e.position, e.outcome) for e in eng.ledger[start:] if e.outcome != "replay"]
    assert new == [(0, "update"), (32, "update")]          # back to splits 1, then 2: defs kept
    assert sum(r.kind == "capture" for r in eng.log.records) == captured
    clean = DecodeEngine(model, LabConfig(backend="sim")).generate("To be, or not", 40)
    np.testing.assert_array_equal(gen.tokens, clean.tokens)


def test_a_different_topology_is_refused_and_instantiated(model):
    eng = DecodeEngine(model, LabConfig(backend="sim", plan_switch="update"))
    eng.generate(PROMPT, 4)
    eng.cfg = eng.cfg.replace(split_combine=True)          # 4 more nodes: not updatable
    eng.generate(PROMPT, 4)
    refused = [e for e in eng.ledger if e.reason.startswith("update-refused")]
    assert [e.outcome for e in refused] == ["capture"]
    assert "topology changed: 41 nodes for 37" in refused[0].reason
    assert len(eng.graphs) == 2


def test_a_frozen_bug_stays_wrong_and_an_illegal_one_falls_back_under_update(model):
    clean, _ = _run(model, "sim", n=40)
    frozen, _ = _run(model, "sim", n=40, plan_switch="update", bugs={"ctx_by_value"})
    assert not np.array_equal(frozen.tokens, clean.tokens)
    lazy, eng = _run(model, "sim", n=40, plan_switch="update", bugs={"lazy_scratch"})
    np.testing.assert_array_equal(lazy.tokens, clean.tokens)
    fallbacks = [e for e in eng.ledger if e.outcome == "fallback"]
    assert fallbacks and all("allocation of 'part_o'" in e.reason for e in fallbacks)


def test_sim_exec_update_rules():
    be = SimBackend()
    a = be.alloc("a", (4,), np.float32)
    from kernels import position
    from lab.backend import Launch
    adv = Launch(position.advance, (1,), (1,), (a,))
    two = SimGraph(be, [adv, adv])
    assert two.update(SimGraph(be, [adv])).startswith("topology changed: 1 nodes for 2")
    assert two.update(SimGraph(be, [adv, adv], deps=[(), ()])).startswith("topology changed: other edges")
    assert two.update(SimGraph(be, [adv, adv], pdl=True)).startswith("edge types changed")
    other = Launch(position.advance, (2,), (1,), (a,))
    assert two.update(SimGraph(be, [adv, other], executable=False)) is None
    assert two.nodes[1] is other                            # parameters replaced in place
    with pytest.raises(LabError, match="not instantiated"):
        SimGraph(be, [adv], executable=False).launch()


def test_unknown_plan_switch_is_a_clear_error():
    from lab.config import from_env
    with pytest.raises(LabError, match="LAB_PLAN_SWITCH='patch' is not allowed"):
        from_env({"LAB_PLAN_SWITCH": "patch"})
