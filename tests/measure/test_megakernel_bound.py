"""megakernel_bound: the bound a body that leaves work out sets, from a sweep's rows; the
experiment is the GPU's only (a probe has no twin for the simulator to run); the probe script
names probes only on request."""
import pytest

from kernels import persistent
from lab.measure.experiment import REGISTRY
from lab.measure.experiments.megakernel_bound import bound

PROBE = "tails-noproj/arrive"


def _rows(ms: dict) -> list[dict]:
    return [{"context": c, "arm": a, "mean_ms": v} for (c, a), v in ms.items()]


def test_each_ratio_is_to_the_faster_multi_node_arm_at_its_context():
    rows = _rows({(64, "fused+pdl graph"): 0.060, (64, "fused+split+pdl graph"): 0.050,
                  (64, "persistent graph"): 0.065, (64, f"persistent {PROBE}"): 0.055,
                  (900, "fused+pdl graph"): 0.070, (900, "fused+split+pdl graph"): 0.080,
                  (900, "persistent graph"): 0.084, (900, f"persistent {PROBE}"): 0.063})
    got = bound(rows, [PROBE])
    assert got["64"]["best_multi_node"] == "fused+split+pdl graph" and got["64"]["best_ms"] == 0.050
    assert got["64"]["persistent graph"] == pytest.approx(1.3)
    assert got["64"][f"persistent {PROBE}"] == pytest.approx(1.1)
    assert got["64"]["gate_reachable"] is False          # even the probe is behind the arm
    assert got["900"]["best_multi_node"] == "fused+pdl graph"
    assert got["900"][f"persistent {PROBE}"] == pytest.approx(0.9)
    assert got["900"]["gate_reachable"] is True


def test_a_tie_is_not_ahead():
    rows = _rows({(64, "fused+pdl graph"): 0.05, (64, "fused+split+pdl graph"): 0.06,
                  (64, "persistent graph"): 0.06, (64, f"persistent {PROBE}"): 0.05})
    assert bound(rows, [PROBE])["64"]["gate_reachable"] is False


def test_the_experiment_times_every_probe_on_a_gpu_only():
    exp = REGISTRY["megakernel_bound"]
    assert exp.files == ("megakernel_bound.json",) and tuple(exp.backends) == ("cuda",)
    assert PROBE in persistent.PROBES


def test_the_probe_script_times_probes_only_when_named():
    """scripts/megakernel_probe.py: --variants all is every VARIANT (the step's bits); a probe
    is timed only when named; an unknown body is refused with every name it could have been."""
    from scripts import megakernel_probe
    assert megakernel_probe._variants("all") == tuple(persistent.VARIANTS)
    assert megakernel_probe._variants(f"tails/arrive,{PROBE}") == ("tails/arrive", PROBE)
    with pytest.raises(SystemExit, match=f"no 'nope'; use all or some of .*tails/arrive,{PROBE}"):
        megakernel_probe._variants("nope")
