"""Any exception during a capture leaves the engine usable: the capture is ended, the garbage
collector is on, the host state is restored, and the next tokens equal a clean run's. Capture
problems fall back to eager; any other error is raised after the cleanup."""
import gc

import numpy as np
import pytest

from lab.config import LabConfig
from lab.engine.runner import DecodeEngine

PROMPT = "ROMEO.\n"
N_LAUNCHES = 37


class Boom(RuntimeError):
    pass


@pytest.fixture(scope="module")
def clean(model):
    return DecodeEngine(model, LabConfig(backend="sim", graph=False)).generate(PROMPT, 20).tokens


def _arm_fault(eng, at: int | None, where: str = "launch"):
    """Make the backend raise Boom at the `at`-th launch issued into a capture (or in
    end_capture); returns a function that disarms it."""
    be = eng.backend
    count = {"n": 0}
    orig_launch, orig_end = be.launch, be.end_capture

    def launch(item):
        if where == "launch" and be.is_capturing():
            count["n"] += 1
            if count["n"] == at:
                raise Boom(f"injected at capture launch {at}")
        return orig_launch(item)

    def end_capture(stream="main", **kwargs):
        if where == "end":
            raise Boom("injected in end_capture")
        return orig_end(stream, **kwargs)

    be.launch, be.end_capture = launch, end_capture
    return lambda: (delattr(be, "launch"), delattr(be, "end_capture"))


def _check_fault_at(model, backend: str, at: int, clean) -> None:
    """Boom at capture launch `at`: it propagates; then no capture is open, the collector is on,
    no half-captured graph was kept, and the next 20 tokens equal the clean run's."""
    eng = DecodeEngine(model, LabConfig(backend=backend))
    disarm = _arm_fault(eng, at)
    with pytest.raises(Boom):
        eng.generate(PROMPT, 20)
    disarm()
    assert not eng.backend.is_capturing() and gc.isenabled()
    assert not eng.graphs
    np.testing.assert_array_equal(eng.generate(PROMPT, 20).tokens, clean)


@pytest.mark.parametrize("at", [1, 2, 10, 20, N_LAUNCHES])
def test_error_at_a_capture_launch_leaves_the_engine_usable(model, clean, at):
    _check_fault_at(model, "sim", at, clean)


def test_error_inside_end_capture_leaves_the_engine_usable(model, clean):
    eng = DecodeEngine(model, LabConfig(backend="sim"))
    disarm = _arm_fault(eng, None, "end")
    with pytest.raises(Boom):
        eng.generate(PROMPT, 20)
    disarm()
    assert not eng.backend.is_capturing() and gc.isenabled()
    np.testing.assert_array_equal(eng.generate(PROMPT, 20).tokens, clean)


def test_lazy_state_is_restored_after_a_failed_capture(model):
    eng = DecodeEngine(model, LabConfig(backend="sim", bugs={"lazy_table"}))
    before = dict(eng.pieces.lazy)
    disarm = _arm_fault(eng, 5)
    with pytest.raises(Boom):
        eng.generate(PROMPT, 4)
    disarm()
    assert eng.pieces.lazy == before


@pytest.mark.gpu
@pytest.mark.parametrize("at", [1, 19, N_LAUNCHES])
def test_gpu_error_at_a_capture_launch_leaves_the_engine_usable(model, at):
    clean = DecodeEngine(model, LabConfig(backend="cuda", graph=False)).generate(PROMPT, 20).tokens
    _check_fault_at(model, "cuda", at, clean)


@pytest.mark.parametrize("backend", ["sim", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_an_invalidated_capture_still_counts_as_capturing_until_ended(model, backend):
    """After an illegal operation the runtime's status is INVALIDATED, not NONE: the capture
    must still be ended (the cuda backend reads the status, it does not match messages)."""
    from lab.errors import CaptureError

    eng = DecodeEngine(model, LabConfig(backend=backend))
    be = eng.backend
    be.begin_capture()
    with pytest.raises(CaptureError):
        be.upload(eng.buf.pos, np.zeros(1, np.int32))        # a synchronous copy: illegal here
    assert be.is_capturing()
    with pytest.raises(CaptureError):
        be.end_capture()
    assert not be.is_capturing() and gc.isenabled()
    eng.reset(eng.encode(PROMPT), 4)                          # the stream is usable again
    assert eng.step().outcome == "capture"
