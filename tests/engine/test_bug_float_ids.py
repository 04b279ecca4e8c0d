"""LAB_BUG_FLOAT_IDS: the lecture's misattributed error (section 3, self-check q5). The sampler
gets the int32 token buffer viewed as float32 and stores each id as a float; the next step's
embedding reads the float's bits as an id near 1.1e9 and faults far outside its table. Kernels
run asynchronously, so the fault is reported by a later call that waits for the device -- not
by the sampler's launch, nor by the embedding's -- and it is sticky. LAB_LAUNCH_BLOCKING=1
makes each launch wait: the launch of the kernel that faulted reports it, and the launch log
names the kernel that wrote its bad input."""
import os
import subprocess
import sys
import traceback
from pathlib import Path

import numpy as np
import pytest

from _bug_checks import PROMPT, clean_tokens
from lab.config import LabConfig
from lab.engine.runner import DecodeEngine
from lab.errors import DeviceFault, LabError
from lab.measure.audit import bug_row

ROOT = Path(__file__).resolve().parents[2]
SIM = LabConfig(backend="sim")


def _fault(engine):
    with pytest.raises(DeviceFault) as info:
        engine.generate(PROMPT, 20)
    frames = [f.name for f in traceback.extract_tb(info.value.__traceback__)]
    return str(info.value), frames


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_the_fault_is_reported_by_a_later_call_and_is_sticky(model, graph):
    eng = DecodeEngine(model, SIM.replace(graph=graph, bugs={"float_ids"}))
    text, frames = _fault(eng)
    assert "illegal memory access" in text and "not the one at fault" in text
    assert "synchronize" in frames and "launch" not in frames      # reported by a wait, later
    with pytest.raises(DeviceFault, match="sticky"):                 # ... and every call after it
        eng.tokens()


def test_launch_blocking_reports_it_at_the_launch_of_the_kernel_that_faulted(model):
    eng = DecodeEngine(model, SIM.replace(graph=False, launch_blocking=True, bugs={"float_ids"}))
    text, frames = _fault(eng)
    assert "LAB_LAUNCH_BLOCKING=1: reported by the launch of embed" in text and "launch" in frames
    # the launch log: embed faulted on the token the step before wrote; the writer is named
    prev = [r.kernel for r in eng.log.records if r.step == eng.log.step - 1]
    assert prev[-2:] == ["argmax_next_float", "advance"], prev[-4:]


def test_launch_blocking_changes_nothing_but_the_time(model):
    plain = DecodeEngine(model, SIM).generate(PROMPT, 20)
    blocking = DecodeEngine(model, SIM.replace(launch_blocking=True)).generate(PROMPT, 20)
    np.testing.assert_array_equal(blocking.tokens, plain.tokens)
    np.testing.assert_array_equal(plain.tokens, clean_tokens(model, SIM, 20))
    assert blocking.ms_per_token > plain.ms_per_token


def test_the_bug_table_row_says_where_it_was_reported(model):
    row = bug_row(model, SIM, "float_ids")
    assert "not the one at fault" in row["fault"] and "launch of embed" in row["fault_blocking"]


def test_refused_where_the_sampler_is_another_kernel():
    with pytest.raises(LabError, match="LAB_BUG_FLOAT_IDS=1 cannot exist in the fused step"):
        LabConfig(backend="sim", fusion=True, bugs={"float_ids"})


@pytest.mark.gpu
def test_gpu_the_fault_is_reported_later_and_blocking_finds_it():
    """On a GPU the fault corrupts the context for the rest of the process, so each run is a
    process of its own: without blocking the error comes from a later call, with it from the
    launch of embed."""
    code = ("import sys; from lab.config import LabConfig; "
            "from lab.engine.runner import DecodeEngine; "
            "from lab.model import load_model; "
            "e = DecodeEngine(load_model(), LabConfig(backend='cuda', graph=False, "
            "launch_blocking=sys.argv[1] == '1', bugs={'float_ids'})); e.generate('ROMEO.\\n', 20)")
    out = {}
    for blocking in ("0", "1"):
        run = subprocess.run([sys.executable, "-c", code, blocking], cwd=ROOT, capture_output=True,
                             text=True, timeout=300, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                 [str(ROOT), os.environ.get("PYTHONPATH", "")])})
        assert run.returncode != 0 and "DeviceFault" in run.stderr, run.stderr[-2000:]
        out[blocking] = run.stderr
    assert "illegal memory access" in out["0"] and "reported by the launch of embed" not in out["0"]
    assert "reported by the launch of embed" in out["1"]
