"""LAB_BUG_LATE_WAIT: rmsnorm_late_wait reads x before its PDL wait. The static wait-first
check flags the kernel; under PDL the simulator reports the race (on a GPU it is a real,
timing-dependent race that no byte-compare is sure to see)."""
import pytest

from lab.config import LabConfig
from lab.engine.runner import DecodeEngine
from lab.pdl_check import wait_first_violations


def test_static_check_flags_exactly_the_late_wait_kernel():
    assert set(wait_first_violations()) == {"rmsnorm_late_wait"}


def test_sim_reports_the_race_only_under_pdl(model):
    cfg = LabConfig(backend="sim", bugs={"late_wait"})
    for pdl, expect in ((False, 0), (True, 1)):
        eng = DecodeEngine(model, cfg.replace(pdl=pdl))
        eng.generate("ROMEO.\n", 3)
        races = eng.backend.races
        assert (len(races) > 0) == bool(expect)
        assert all("rmsnorm_late_wait reads x before its pdl_wait" in r for r in races)
    clean = DecodeEngine(model, cfg.replace(pdl=True, bugs=frozenset()))
    clean.generate("ROMEO.\n", 3)
    assert clean.backend.races == []


@pytest.mark.gpu
def test_gpu(model):
    eng = DecodeEngine(model, LabConfig(backend="cuda", pdl=True, bugs={"late_wait"}))
    eng.generate("ROMEO.\n", 3)   # runs (the race may or may not strike); the check flags it
    used = {launch.name for launch in eng.step_launches(eng.plan(0))}
    assert "rmsnorm_late_wait" in used & set(wait_first_violations())
