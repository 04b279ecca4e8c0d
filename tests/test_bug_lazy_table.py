"""LAB_BUG_LAZY_TABLE: the RoPE tables are uploaded on first use, "best effort". Inside the
first capture the upload fails, the failure is swallowed, and the sticky capture error shows
only at end_capture -- later than the launch at fault; the detector still names the upload."""
import pytest

from _bug_checks import check_illegal
from lab.config import LabConfig


def _check(model, cfg):
    lazy = check_illegal(model, cfg, "lazy_table", "table upload",
                         "synchronous host-to-device copy into rope_cos", first_step_fails=True)
    (f,) = [f for f in lazy.illegal if f.kind == "table upload"]
    assert f.kernel == "rope_kv_append" and "upload_tables_on_first_use" in f.site
    assert f.surfaced_at == "end_capture" and f.shows_later


def test_sim(model):
    _check(model, LabConfig(backend="sim"))


@pytest.mark.gpu
def test_gpu(model):
    _check(model, LabConfig(backend="cuda"))
