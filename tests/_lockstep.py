"""Two engines in lockstep, a GPU's and the simulator's: every launch of the step runs on both,
each output is compared, then the GPU's output is copied into the simulator so that the next
kernel sees equal inputs. Kernel by kernel at the real model's dims, across a plan boundary
(tests/backend/test_gpu.py for the one-op-per-kernel step, tests/engine/test_fusion.py for the fused one)."""
import numpy as np

from lab.backend.sim import SimBackend
from lab.engine.runner import DecodeEngine

PROMPT = "To be, or not to be, that is the question"


def assert_outputs_close(a, b, where: str) -> None:
    """Integer outputs exactly; float32 outputs, whose sums run in another order on the GPU
    (warp trees vs NumPy's pairwise sums), within 64 eps of the output's largest magnitude
    (dots of length <= 512) plus 1e-6 absolute for outputs near zero."""
    if a.dtype.kind in "iu":
        np.testing.assert_array_equal(a, b, err_msg=where)
    else:
        scale = np.abs(b.astype(np.float64)).max() + 1.0
        tol = 1e-6 + 64 * np.finfo(np.float32).eps * scale
        np.testing.assert_allclose(a, b, rtol=0, atol=tol, err_msg=where)


def run_lockstep(model, cfg, generated: int = 40, compare=None):
    """Engines for cfg on "cuda" and on "sim", stepped in lockstep through PROMPT and `generated`
    tokens (crossing the plan boundary at 32). `compare(pos, launch, i, gpu_out, sim_out, gpu)`
    replaces the default comparison of output i where it returns True. Returns (the names of
    the kernels checked, the GPU engine)."""
    gpu = DecodeEngine(model, cfg.replace(backend="cuda"))
    sim = DecodeEngine(model, cfg.replace(backend="sim"), backend=SimBackend())
    ids = model.tokenizer.encode(PROMPT)
    for eng in (gpu, sim):
        eng.reset(ids, generated + 20)
    checked = set()
    for pos in range(len(ids) - 1 + generated):
        plan = gpu.plan()
        for lg, ls in zip(gpu.step_launches(plan), sim.step_launches(plan)):
            gpu.backend.launch(lg)
            sim.backend.launch(ls)
            for i in lg.kernel.writes:
                a, b = gpu.backend.download(lg.args[i]), sim.backend.download(ls.args[i])
                if compare is None or not compare(pos, lg, i, a, b, gpu):
                    assert_outputs_close(a, b, f"{lg.name} pos {pos}")
                sim.backend.upload(ls.args[i], a)
            checked.add(lg.name)
        for eng in (gpu, sim):   # the step's launches advanced pos on each device
            eng.track_position(eng.position + 1, steps=0)
    return checked, gpu
