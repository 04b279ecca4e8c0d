"""LAB_BUG_FROZEN_KV_ROW: pointer: the KV-cache row k_cache[pos] (buffer + offset)."""
import pytest

from _bug_checks import check_frozen
from lab.config import LabConfig


def test_sim(model):
    check_frozen(model, LabConfig(backend="sim"), "frozen_kv_row", "rope_kv_append_row", {'v_row', 'k_row'})


@pytest.mark.gpu
def test_gpu(model):
    check_frozen(model, LabConfig(backend="cuda"), "frozen_kv_row", "rope_kv_append_row", {'v_row', 'k_row'})
