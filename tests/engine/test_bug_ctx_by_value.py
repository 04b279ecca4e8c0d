"""LAB_BUG_CTX_BY_VALUE: loop bound: the context length passed by value."""
import pytest

from _bug_checks import check_frozen
from lab.config import LabConfig


def test_sim(model):
    check_frozen(model, LabConfig(backend="sim"), "ctx_by_value", "attn_partial_len", {'ctx_len'})


@pytest.mark.gpu
def test_gpu(model):
    check_frozen(model, LabConfig(backend="cuda"), "ctx_by_value", "attn_partial_len", {'ctx_len'})
