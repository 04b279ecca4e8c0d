"""Every toggle combination is byte-identical to the all-off arm; LAB_OVERLAP captures the
k/v projection as a parallel branch and the simulated timeline overlaps it."""
import itertools

import pytest

from lab.backend.sim import SimBackend
from lab.config import LabConfig
from lab.engine.runner import DecodeEngine
from lab.errors import CaptureError
from lab.measure.replay_check import decode_after_prompt

FACTORS = ("graph", "pdl", "overlap", "split_combine")
COMBOS = [dict(zip(FACTORS, bits)) for bits in itertools.product((False, True), repeat=4)]


def _run(model, cfg):
    eng = DecodeEngine(model, cfg)
    return decode_after_prompt(eng, model.tokenizer.encode("ROMEO.\n"), 40, graph=cfg.graph)[0]


def _check_all_combos(model, backend):
    base = _run(model, LabConfig(backend=backend, graph=False))
    for combo in COMBOS:
        arm = _run(model, LabConfig(backend=backend, **combo))
        assert arm.tokens.tobytes() == base.tokens.tobytes(), combo
        assert arm.logits.tobytes() == base.logits.tobytes(), combo


def test_every_toggle_combination_is_byte_identical_on_sim(model):
    _check_all_combos(model, "sim")


@pytest.mark.gpu
def test_every_toggle_combination_is_byte_identical_on_gpu(model):
    _check_all_combos(model, "cuda")


def test_overlap_is_a_parallel_branch_in_the_graph(model):
    eng = DecodeEngine(model, LabConfig(backend="sim", overlap=True))
    eng.generate("ROMEO.\n", 2)
    graph = next(iter(eng.graphs.values()))
    names = [n.name for n in graph.nodes]
    kv, q = 2, 3                                   # layer 0: embed, rmsnorm, kv matvec, q matvec
    assert names[kv] == names[q] == "matvec" and graph.nodes[kv].stream == "side"
    assert graph.deps[kv] == (1,) and graph.deps[q] == (1,)      # both wait only for the norm
    assert set(graph.deps[4]) == {kv, q}                          # rope joins the branches
    assert graph.node_count == len(eng.step_launches(eng.plan(0))) == 37 + model.cfg.n_layer


def test_sim_timeline_shows_the_overlap(model):
    eng = DecodeEngine(model, LabConfig(backend="sim", overlap=True), backend=SimBackend(seed=1))
    eng.generate("ROMEO.\n", 4)
    eng.backend.timeline.clear()
    eng.step()
    ev = [e for e in eng.backend.timeline if e.layer == 0 and e.kernel == "matvec"]
    side, main = sorted(ev, key=lambda e: e.stream != "side")
    assert side.stream == "side" and main.stream == "main"
    assert side.dev_start < main.dev_end and main.dev_start < side.dev_end


def test_unjoined_side_stream_fails_the_capture(model):
    be = SimBackend()
    eng = DecodeEngine(model, LabConfig(backend="sim"), backend=be)
    launch = eng.step_launches(eng.plan(0))[0]
    be.begin_capture()
    be.record_wait("main", "side")
    be.launch(type(launch)(launch.kernel, launch.grid, launch.block, launch.args, None, "side"))
    with pytest.raises(CaptureError, match="not joined back"):
        be.end_capture()
