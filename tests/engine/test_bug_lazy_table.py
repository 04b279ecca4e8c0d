"""LAB_BUG_LAZY_TABLE: the RoPE tables are uploaded on first use, "best effort". Inside the
first capture the upload fails, the failure is swallowed, and the invalidated capture shows
only at end_capture -- later than the launch at fault; the detector still names the upload."""
import pytest

from _bug_checks import check_lazy_table
from lab.config import LabConfig


def test_sim(model):
    check_lazy_table(model, LabConfig(backend="sim"), "rope_kv_append")


@pytest.mark.gpu
def test_gpu(model):
    check_lazy_table(model, LabConfig(backend="cuda"), "rope_kv_append")
