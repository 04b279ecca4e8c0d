"""LAB_BUG_LAZY_SCRATCH: attention scratch grown on demand. The first plan fits, so the first
capture succeeds; at the first plan change the growth allocates inside the capture."""
import pytest

from _bug_checks import check_illegal
from lab.config import LabConfig


def _check(model, cfg):
    lazy = check_illegal(model, cfg, "lazy_scratch", "scratch allocation",
                         "allocation of 'part_o'", first_step_fails=False)
    keys = {f.plan_key for f in lazy.illegal}
    assert all(k[1] > 1 for k in keys) and len(keys) >= 2   # splits 1 fits; every growth allocates
    assert all("grow_scratch" in f.site for f in lazy.illegal)


def test_sim(model):
    _check(model, LabConfig(backend="sim"))


@pytest.mark.gpu
def test_gpu(model):
    _check(model, LabConfig(backend="cuda"))
