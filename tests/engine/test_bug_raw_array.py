"""LAB_BUG_RAW_ARRAY: a raw CuPy array reaches a numba launch; numba synchronises through the
array interface, which a global-mode capture refuses."""
import pytest

from _bug_checks import check_illegal
from lab.config import LabConfig


def _check(model, cfg):
    lazy = check_illegal(model, cfg, "raw_array", "array-interface synchronisation",
                         "raw", first_step_fails=True)
    assert {f.kernel for f in lazy.illegal} == {"rmsnorm"}


def test_sim(model):
    _check(model, LabConfig(backend="sim"))


@pytest.mark.gpu
def test_gpu(model):
    _check(model, LabConfig(backend="cuda"))
