"""LAB_BUG_POS_OUTSIDE_GRAPH: the position, uploaded by the host before the step."""
import pytest

from _bug_checks import check_frozen
from lab.config import LabConfig


def test_sim(model):
    check_frozen(model, LabConfig(backend="sim"), "pos_outside_graph", "(host)", {'host write 0'})


@pytest.mark.gpu
def test_gpu(model):
    check_frozen(model, LabConfig(backend="cuda"), "pos_outside_graph", "(host)", {'host write 0'})
