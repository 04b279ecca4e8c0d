"""LAB_LOOP=device: the whole generation in ONE graph launch -- a WHILE node (continue while
pos < limit) over a SWITCH node (the plan body plan_of[pos]) -- byte-identical to the host loop;
refused with a message (and the host loop run) where it cannot work."""
import dataclasses

import numpy as np
import pytest

from lab.backend.sim import SimBackend
from lab.config import LabConfig
from lab.engine.runner import DecodeEngine
from lab.errors import LabError
from lab.model import random_model
from lab.plan import plan_boundaries

PROMPT = "ROMEO.\n"
N = 70                     # crosses the first two plan boundaries (32, 64)


def _gen(model, cfg, n=N, backend=None):
    eng = DecodeEngine(model, cfg, backend=backend)
    return eng.generate(PROMPT, n), eng


def _check_device_loop(model, backend, **toggles):
    host, h_eng = _gen(model, LabConfig(backend=backend, **toggles))
    dev, d_eng = _gen(model, LabConfig(backend=backend, loop="device", **toggles))
    assert not d_eng.warnings, d_eng.warnings
    np.testing.assert_array_equal(dev.tokens, host.tokens)
    assert d_eng.logits().tobytes() == h_eng.logits().tobytes()
    steps = len(PROMPT) - 1 + N
    assert d_eng.ledger_summary() == {"device": steps}
    launches = [r for r in d_eng.log.records if r.kind == "replay"]
    assert len(launches) == 1 and launches[0].kernel == "graph('device loop',)"   # ONE launch
    loop = d_eng.device_loop()
    assert loop.body_node_counts() == [len(d_eng.step_launches(d_eng.plan(p)))
                                       for p in [0] + plan_boundaries(model.cfg.max_seq)]
    return d_eng, loop, steps


@pytest.mark.parametrize("toggles", [{}, {"pdl": True}, {"overlap": True}, {"split_combine": True}],
                         ids=["plain", "pdl", "overlap", "split_combine"])
def test_device_loop_is_byte_identical_to_the_host_loop(model, toggles):
    _, loop, steps = _check_device_loop(model, "sim", **toggles)
    assert loop.iterations == steps                      # one body per step, chosen on the device


@pytest.mark.gpu
def test_gpu_device_loop_is_byte_identical_to_the_host_loop(model):
    _check_device_loop(model, "cuda")


def test_the_loop_is_built_once_and_reused_by_the_next_request(model):
    eng, loop, _ = _check_device_loop(model, "sim")
    captured = sum(r.kind == "capture" for r in eng.log.records)
    gen = eng.generate("To be, or not", 20)
    assert sum(r.kind == "capture" for r in eng.log.records) == captured
    host = DecodeEngine(model, LabConfig(backend="sim")).generate("To be, or not", 20)
    np.testing.assert_array_equal(gen.tokens, host.tokens)


def test_the_device_reads_the_plan_table(model):
    """The SWITCH value comes from device memory: each body runs for its plan's positions; a
    table of zeros runs the one-split body everywhere; a value with no body is an error."""
    eng = DecodeEngine(model, LabConfig(backend="sim", loop="device"))
    eng.generate(PROMPT, N)
    loop = eng.device_loop()
    b = plan_boundaries(model.cfg.max_seq)
    steps = len(PROMPT) - 1 + N
    assert loop.runs[:3] == [b[0], b[1] - b[0], steps - b[1]] and not any(loop.runs[3:])
    eng.backend.upload(eng.buf.plan_of, np.zeros(model.cfg.max_seq, np.int32))
    eng.generate(PROMPT, N)
    assert loop.runs[0] == b[0] + steps
    eng.backend.upload(eng.buf.plan_of, np.full(model.cfg.max_seq, 99, np.int32))
    with pytest.raises(LabError, match="names no body"):
        eng.generate(PROMPT, 4)


class _NoConditionals(SimBackend):
    def loop_support(self):
        return "conditional SWITCH nodes need CUDA 12.8 or newer (runtime 12.2)"


@pytest.mark.parametrize("cfg, backend, why", [
    (LabConfig(backend="sim", loop="device", graph=False), None, "needs LAB_GRAPH=1"),
    (LabConfig(backend="sim", loop="device", bugs={"ctx_by_value"}), None, "clean step only"),
    (LabConfig(backend="sim", loop="device"), _NoConditionals, "need CUDA 12.8"),
], ids=["eager", "bug", "old-cuda"])
def test_refused_with_a_message_and_the_host_loop_runs(model, cfg, backend, why):
    with pytest.warns(UserWarning, match="LAB_LOOP=device refused: .*" + why):
        gen, eng = _gen(model, cfg, n=8, backend=backend() if backend else None)
    assert "device" not in eng.ledger_summary() and len(eng.ledger) == gen.steps
    clean = DecodeEngine(model, cfg.replace(loop="host"), backend=backend() if backend else None)
    np.testing.assert_array_equal(gen.tokens, clean.generate(PROMPT, 8).tokens)


def test_a_capture_problem_in_a_body_refuses_the_loop(model, monkeypatch):
    from lab.errors import CaptureError
    eng = DecodeEngine(model, LabConfig(backend="sim", loop="device"))
    real = eng.backend.launch

    def launch(item):
        if eng.backend.is_capturing() and item.name == "attn_partial":
            raise CaptureError("operation not permitted when stream is capturing: test", "test")
        return real(item)
    monkeypatch.setattr(eng.backend, "launch", launch)
    with pytest.warns(UserWarning, match="could not be built"):
        eng.generate(PROMPT, 4)
    assert not eng.backend.is_capturing()


def test_unknown_loop_value_is_a_clear_error():
    from lab.config import from_env
    with pytest.raises(LabError, match="LAB_LOOP='gpu' is not allowed"):
        from_env({"LAB_LOOP": "gpu"})


def test_the_audit_reads_a_conditional_graph(model):
    from lab.measure.audit import loop_report
    eng = DecodeEngine(model, LabConfig(backend="sim", loop="device"))
    text = loop_report(eng)
    bodies = [line for line in text.splitlines() if line.strip().startswith("body ")]
    assert len(bodies) == len(plan_boundaries(model.cfg.max_seq)) + 1
    assert "pos[0] < limit[0]" in text and "plan_of[pos[0]]" in text
    assert "attention grid (4, 1)" in bodies[0] and "attention grid (4, 32)" in bodies[-1]
    with pytest.raises(ValueError, match="LAB_LOOP=device"):
        loop_report(DecodeEngine(model, LabConfig(backend="sim")))
    refused = DecodeEngine(model, LabConfig(backend="sim", loop="device", graph=False))
    with pytest.warns(UserWarning):
        assert loop_report(refused).startswith("no device loop: it needs LAB_GRAPH=1")


def test_every_plan_boundary_on_the_device(model):
    """A generation to the end of the context: the device crosses every plan boundary itself
    (another prompt, crossing the first ones, is the reuse test's). On a one-layer model of tiny
    widths with the shipped model's max_seq: the plan boundaries, the plan table the device
    reads and the loop's bodies depend on max_seq alone (plan_boundaries(max_seq)), and one
    layer runs every kernel of the step, at a small part of the shipped model's cost."""
    small = random_model(dataclasses.replace(model.cfg, d_model=32, n_layer=1, n_head=2, d_ff=64))
    assert plan_boundaries(small.cfg.max_seq) == plan_boundaries(model.cfg.max_seq)
    prompt = "To be, or not to be"
    n = small.cfg.max_seq - len(prompt) - 1
    host = DecodeEngine(small, LabConfig(backend="sim")).generate(prompt, n)
    eng = DecodeEngine(small, LabConfig(backend="sim", loop="device"))
    dev = eng.generate(prompt, n)
    np.testing.assert_array_equal(dev.tokens, host.tokens)
    assert all(eng.device_loop().runs)                     # every plan's body ran


@pytest.mark.gpu
def test_gpu_every_plan_boundary_on_the_device(model):
    n = model.cfg.max_seq - len(PROMPT) - 1
    host = DecodeEngine(model, LabConfig(backend="cuda")).generate(PROMPT, n)
    dev = DecodeEngine(model, LabConfig(backend="cuda", loop="device")).generate(PROMPT, n)
    np.testing.assert_array_equal(dev.tokens, host.tokens)


@pytest.mark.parametrize("loop", ["host", "device"])
def test_too_many_tokens_is_the_same_clear_error_for_both_loops(model, loop):
    eng = DecodeEngine(model, LabConfig(backend="sim", loop=loop))
    with pytest.raises(LabError, match="max_seq"):
        eng.generate(PROMPT, model.cfg.max_seq)
    eng.reset(eng.encode(PROMPT), 4)
    with pytest.raises(LabError, match="would exceed max_seq"):
        eng.decode(model.cfg.max_seq)


def test_save_dot_draws_the_device_loop(tmp_path, capsys, monkeypatch):
    from lab.__main__ import main
    path = tmp_path / "loop.dot"
    monkeypatch.setenv("LAB_LOOP", "device")
    assert main(["generate", "--prompt", "ROMEO.", "--tokens", "4", "--backend", "sim",
                 "--save-dot", str(path), "--no-progress"]) == 0
    dots = sorted(tmp_path.glob("loop*.dot"))
    assert any("WHILE pos < limit" in p.read_text() for p in dots), dots
