"""scripts/eager_host_probe.py: its steps run on the simulator (the model's own figures then: the
simulated wall per step within a few percent of host + engine, since the step is host-paced), it
reads every host-paced fission lesson from a recorded fission.json, and it refuses bad counts."""
import pytest

from lab.measure.arms import FISSION
from lab.measure.conformance import DATA_GPU
from scripts import eager_host_probe as probe


def test_steps_on_the_simulator_are_host_paced_at_the_models_figures():
    rows = probe.steps("sim", 1)
    assert set(rows) == set(probe.CONFIGS)
    for name, s in rows.items():
        model = s["model_host_us"] + s["model_engine_us"]
        assert s["device_step_us"] is None            # CUDA events only
        assert s["model_device_us"] < model, name      # host-paced: the host's sum paces it
        assert 0.85 < s["wall_us"] / model < 1.2, (name, s["wall_us"], model)
    fused, unfused = rows["fused heads"], rows["unfused"]
    assert fused["launches"] < unfused["launches"] and fused["wall_us"] < unfused["wall_us"]
    lines = probe.format_steps(rows)
    assert all(len(line) <= 100 for line in lines)
    assert any(line.startswith("fused grid split") for line in lines)


def test_a_recorded_fission_file_gives_every_host_paced_lesson():
    runs = {"costs": probe._fission_file(DATA_GPU / "fission.json")}
    lessons = [p.lesson for p in FISSION if p.host_paced]
    assert lessons and list(runs["costs"]) == lessons
    for r in runs["costs"].values():
        assert len(r["aa_ms"]) == 2 and len(r["ab_ms"]) == 2
        assert all(0 < v < 10 for v in [*r["aa_ms"], *r["ab_ms"].values()])
    lines = probe.format_fission({**runs, "empty": {}})
    assert lines[0] == "costs:" and all(len(line) <= 100 for line in lines)
    assert lines[-1].startswith("empty: no fission.json")


@pytest.mark.parametrize("argv", [["steps", "--rounds", "0"], ["fission", "--reps", "1"],
                                  ["nope"]])
def test_bad_arguments_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as e:
        probe.main(argv)
    assert e.value.code == 2


@pytest.mark.gpu
def test_gpu_launches_queued_behind_the_spin_are_timed_alone(model, cuda_cfg):
    """costfile.behind_spin: the empty kernel's eager device time (the cost file's eager floor)
    and an eager step's device time, each queued behind the spinning kernel, land where the
    H200 put them (1.37 us a launch; an unfused step's launches about 113 us)."""
    import numpy as np

    from kernels import REGISTRY, probe as kprobe
    from lab import DecodeEngine
    from lab.backend import Launch
    from lab.measure.chains import main_stream
    from lab.measure.costfile import BASE_POSITION, PROMPT, eager_device_floor

    eng = DecodeEngine(model, cuda_cfg.replace(graph=False))
    flag = eng.backend.alloc("probe_flag", (1,), np.int32)
    empty = Launch(REGISTRY["empty"], kprobe.EMPTY_GRID, kprobe.EMPTY_BLOCK, (flag,))
    floor = eager_device_floor(eng, empty, lambda *_: None)
    assert any(r["queued_behind"] for r in floor["runs"])
    assert 0.3 < floor["per_launch_us"] < 10
    eng.reset(eng.encode(PROMPT), 0)
    eng.seek(BASE_POSITION)
    eng.decode(4)
    step = [main_stream(x) for x in eng.step_launches(eng.plan(BASE_POSITION))]
    dev = probe._device_step_us(eng, step)
    assert dev is not None and 10 * floor["per_launch_us"] < dev < 2000
