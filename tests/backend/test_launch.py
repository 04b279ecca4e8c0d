"""LAB_LAUNCH (numba's dispatcher or pre-bound cuda.core launches), the step built once per plan
key, and the launch log that records off the clock. Device-free except the `gpu` tests."""
import numpy as np
import pytest

from lab.backend import Launch
from lab.backend.base import Buffer
from lab.backend.instrument import LaunchLog, instrumentation_overhead_us
from lab.config import LabConfig, from_env
from lab.engine.runner import DecodeEngine
from lab.errors import LabError
from lab.measure.replay_check import decode_after_prompt

PROMPT = "ROMEO.\n"


# ---- the toggle ------------------------------------------------------------------------------
def test_unknown_launch_mechanism_names_the_variable_and_the_values():
    with pytest.raises(LabError, match="LAB_LAUNCH") as err:
        from_env({"LAB_LAUNCH": "fast"})
    assert "dispatcher" in str(err.value) and "prebound" in str(err.value)


def test_launch_defaults_to_prebound_and_parses():
    assert LabConfig().launch == "prebound"
    cfg = from_env({"LAB_LAUNCH": "dispatcher"})
    assert cfg.launch == "dispatcher" and cfg.toggles()["LAB_LAUNCH"] == "dispatcher"


def test_switching_the_mechanism_on_one_engine(model, sim_cfg):
    eng = DecodeEngine(model, sim_cfg)
    assert eng.backend.mechanism == "prebound"
    eng.cfg = eng.cfg.replace(launch="dispatcher")
    assert eng.backend.mechanism == "dispatcher"
    eng.generate(PROMPT, 4)
    eng.cfg = eng.cfg.replace(launch="prebound")
    assert eng.backend.mechanism == "prebound"
    eng.generate(PROMPT, 4)


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_sim_mechanisms_are_byte_identical(model, sim_cfg, graph):
    eng = DecodeEngine(model, sim_cfg)
    ids = eng.encode(PROMPT)
    arms = []
    for mechanism in ("dispatcher", "prebound"):
        eng.cfg = sim_cfg.replace(launch=mechanism)
        arms.append(decode_after_prompt(eng, ids, 40, graph)[0])
    assert np.array_equal(arms[0].tokens, arms[1].tokens)
    assert arms[0].logits.tobytes() == arms[1].logits.tobytes()


# ---- the step, built once per plan key --------------------------------------------------------
def _issued(eng):
    """Record every Launch object the engine hands its backend."""
    seen, real = [], eng.backend.launch
    eng.backend.launch = lambda launch: (seen.append(launch), real(launch))[1]
    return seen


def test_clean_engine_issues_the_same_launch_objects(model, sim_cfg):
    eng = DecodeEngine(model, sim_cfg.replace(graph=False))
    eng.reset(eng.encode(PROMPT), 4)
    seen = _issued(eng)
    eng.step()
    first = list(seen)
    eng.step()                                   # position 1: the same plan key as position 0
    assert eng.plan(0).key == eng.plan(1).key
    assert all(a is b for a, b in zip(first, seen[len(first):])) and len(seen) == 2 * len(first)
    assert all(a is b for a, b in zip(first, eng.step_launches(eng.plan(2))))


def test_a_capture_issues_the_eager_steps_launch_objects(model, sim_cfg):
    eng = DecodeEngine(model, sim_cfg.replace(graph=False))
    eng.reset(eng.encode(PROMPT), 4)
    seen = _issued(eng)
    eng.step()
    eng.cfg = eng.cfg.replace(graph=True)
    assert eng.step().outcome == "capture"
    n = len(seen) // 2
    assert len(seen) == 2 * n and all(a is b for a, b in zip(seen[:n], seen[n:]))


def test_step_launches_has_no_side_effects(model, sim_cfg):
    eng = DecodeEngine(model, sim_cfg)
    eng.generate(PROMPT, 3)
    device_pos = eng.device_position()

    def state():
        return (eng.position, len(eng.ledger), len(eng.log.records), len(eng.backend.ops),
                len(eng.graphs), eng.log.step)
    before = state()
    for position in (0, eng.position, 40, 100):  # a cached plan key and new ones
        assert eng.step_launches(eng.plan(position))
    assert state() == before                     # backend.ops: no allocation, copy, compilation
    assert eng.device_position() == device_pos


def test_a_bug_rebuilds_the_step_at_each_position(model, sim_cfg):
    """With a deliberate bug on, the step is built per step: frozen_kv_row's row view follows
    the position, and the eager tokens stay right."""
    bcfg = sim_cfg.replace(graph=False, bugs=frozenset({"frozen_kv_row"}))
    eng = DecodeEngine(model, bcfg)
    eng.reset(eng.encode(PROMPT), 4)

    def k_row(position):
        launch = next(x for x in eng.step_launches(eng.plan(position)) if x.name == "rope_kv_append_row")
        return launch.args[5]

    assert eng.plan(3).key == eng.plan(5).key
    row3, row5 = k_row(3), k_row(5)
    assert row5.offset - row3.offset == 2 * row3.nbytes and row5.name == row3.name == "k_cache.0"
    clean = DecodeEngine(model, sim_cfg.replace(graph=False)).generate(PROMPT, 12)
    assert np.array_equal(DecodeEngine(model, bcfg).generate(PROMPT, 12).tokens, clean.tokens)


# ---- the log, recorded off the clock ----------------------------------------------------------
def test_log_records_cheaply_and_labels_on_read(model, sim_cfg):
    eng = DecodeEngine(model, sim_cfg.replace(graph=False))
    attn = next(x for x in eng.step_launches(eng.plan(0)) if x.name == "attn_partial")
    log = LaunchLog()
    log.step = 7
    log.record(attn, "eager")
    [rec] = log.records
    args = dict(rec.args)
    assert (rec.seq, rec.step, rec.kind, rec.kernel, rec.layer) == (0, 7, "eager", "attn_partial", 0)
    assert args["k_cache"] == "k_cache.0" and args["pos"] == "pos" and args["scale"].startswith("value ")
    log.record_replay(("splits", 1), 37)          # entries after a read show at the next read
    log.record(attn, "capture")
    assert [r.kind for r in log.records] == ["eager", "replay", "capture"]
    assert log.records[1].kernel == "graph('splits', 1)" and log.records[1].nodes == 37
    assert log.records[2].args == rec.args and log.records[2].seq == 2


def test_log_labels_views_by_offset():
    from kernels import position
    log = LaunchLog()
    view = Buffer("pos", 0x1000, (1,), np.dtype(np.int32), offset=16)
    log.record(Launch(position.advance, (1,), (1,), (view,)), "eager")
    assert log.records[0].args == (("pos", "pos+16B"),)


def test_instrumentation_overhead_is_measured():
    us = instrumentation_overhead_us(n=2000)
    assert isinstance(us, float) and us > 0


# ---- on a GPU ---------------------------------------------------------------------------------
def _arm(eng, cfg, steps=40, graph=False):
    eng.cfg = cfg
    return decode_after_prompt(eng, eng.encode(PROMPT), steps, graph)[0]


def _identical(a, b) -> bool:
    return np.array_equal(a.tokens, b.tokens) and a.logits.tobytes() == b.logits.tobytes()


@pytest.mark.gpu
def test_cuda_mechanisms_are_byte_identical_eager(model):
    cfg = LabConfig(backend="cuda", graph=False)
    eng = DecodeEngine(model, cfg)
    dispatcher = _arm(eng, cfg.replace(launch="dispatcher"))
    prebound = _arm(eng, cfg.replace(launch="prebound"))
    assert _identical(dispatcher, prebound)
    launches = eng.step_launches(eng.plan(0))
    assert all(launch.prepared for launch in launches)   # the prebound arm really prepared them


@pytest.mark.gpu
def test_cuda_prebound_graph_is_byte_identical_to_eager(model):
    cfg = LabConfig(backend="cuda", launch="prebound")
    eng = DecodeEngine(model, cfg)
    eager = _arm(eng, cfg.replace(launch="dispatcher"), graph=False)
    graph = _arm(eng, cfg, graph=True)
    assert _identical(eager, graph)
    assert any(e.outcome == "capture" for e in eng.ledger)
    assert not any(e.outcome == "fallback" for e in eng.ledger)


@pytest.mark.gpu
def test_cuda_prebound_with_pdl_is_byte_identical(model):
    cfg = LabConfig(backend="cuda", graph=False)
    eng = DecodeEngine(model, cfg)
    plain = _arm(eng, cfg.replace(launch="dispatcher"))
    for pdl_graph in (False, True):
        pdl = _arm(eng, cfg.replace(launch="prebound", pdl=True), graph=pdl_graph)
        assert _identical(plain, pdl), f"graph={pdl_graph}"
    assert eng.backend.pdl and not eng.warnings
