"""Run three kernels by themselves, outside any engine: on numba's CUDA simulator or on a GPU.

The engine on the `sim` backend runs each kernel's NumPy twin; a twin has the kernel's semantics,
not necessarily its summation order. To see the kernel's own bits, `run_kernels()` starts a
child process (`python -m lab.measure.kernel_run IN.npz OUT.npz`) that compiles `matvec`, `rmsnorm`
and `argmax_next` from their source with `numba.cuda.jit` and launches them at the shapes given:
under numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1, which must be set before numba is
imported, hence the child; kernels/cudasim.py's patches installed) or, with device="gpu", on the
GPU. The simulator runs every thread in Python (tens of ms per 32-thread block): keep the inputs
tiny.

Inputs (any subset; float32 unless noted):
  matvec_W [N, K], matvec_x [K]              -> matvec_out [N]      (out = W @ x)
  rmsnorm_x [D], rmsnorm_w [D], rmsnorm_eps  -> rmsnorm_out [D]
  argmax_<name> [V] (one key per case)       -> argmax_<name> [1] int32 (the id it picks)
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from lab.config import child_env
from lab.errors import LabError

ROOT = Path(__file__).resolve().parent.parent


def run_kernels(inputs: dict[str, np.ndarray], device: str = "cudasim",
                timeout: float = 300) -> tuple[dict[str, np.ndarray], str]:
    """Launch the kernels on `inputs` in a child process; (outputs, where they ran).
    device: "cudasim" (numba's CUDA simulator, any machine) or "gpu" (a real GPU)."""
    if device not in ("cudasim", "gpu"):
        raise LabError(f"device {device!r}: use cudasim or gpu")
    env = child_env(NUMBA_ENABLE_CUDASIM="1" if device == "cudasim" else "0")
    with tempfile.TemporaryDirectory(prefix="kernel_run.") as tmp:
        src, dst = Path(tmp) / "in.npz", Path(tmp) / "out.npz"
        np.savez(src, **inputs)
        proc = subprocess.run([sys.executable, "-m", "lab.measure.kernel_run", str(src), str(dst)],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["(no output)"]
            raise LabError(f"kernels on {device} failed (exit {proc.returncode}): {tail[0]}")
        with np.load(dst, allow_pickle=False) as out:
            outputs = {k: out[k] for k in out.files if k != "where"}
            where = str(out["where"])
    return outputs, where


# ---- the child: runs with numba imported in the mode its environment chose ----------------------
def _where() -> str:
    from importlib.metadata import version

    from numba import config, cuda
    if config.ENABLE_CUDASIM:
        return f"numba's CUDA simulator (numba-cuda {version('numba-cuda')}, fma unfused)"
    dev = cuda.get_current_device()
    name = dev.name.decode() if isinstance(dev.name, bytes) else dev.name
    cc = dev.compute_capability
    return f"{name} (sm_{cc[0]}{cc[1]}), numba-cuda {version('numba-cuda')}"


def _launch(name: str, grid, block, *args):
    """Compile `name` for the dtypes of `args` and launch it; the numpy arrays get the results."""
    from numba import cuda

    from kernels import REGISTRY
    spec = REGISTRY[name]
    (sig,) = [s for s in spec.signatures if "float16" not in s]   # these three: float32 only
    kern = cuda.jit(sig)(spec.py_func)
    dev = [cuda.to_device(a) if isinstance(a, np.ndarray) else a for a in args]
    kern[grid, block](*dev)
    cuda.synchronize()
    for host, d in zip(args, dev):
        if isinstance(host, np.ndarray):
            host[...] = d.copy_to_host()


def _child(src: str, dst: str) -> None:
    from numba import config

    from kernels import cudasim, matvec, rmsnorm, sample
    if config.ENABLE_CUDASIM:
        cudasim.install()     # the simulator as kernels/cudasim.py makes it run kernels/
    with np.load(src, allow_pickle=False) as f:
        inp = {k: f[k] for k in f.files}
    out = {"where": np.array(_where())}
    if "matvec_W" in inp:
        W = np.ascontiguousarray(inp["matvec_W"], dtype=np.float32)
        o = np.zeros(W.shape[0], np.float32)
        _launch("matvec", *matvec.grid_for(W.shape[0]), W,
                np.ascontiguousarray(inp["matvec_x"], dtype=np.float32), o)
        out["matvec_out"] = o
    if "rmsnorm_x" in inp:
        o = np.zeros_like(inp["rmsnorm_x"], dtype=np.float32)
        _launch("rmsnorm", rmsnorm.RMSNORM_GRID, rmsnorm.RMSNORM_BLOCK,
                inp["rmsnorm_x"].astype(np.float32), inp["rmsnorm_w"].astype(np.float32), o,
                np.float32(inp["rmsnorm_eps"]))
        out["rmsnorm_out"] = o
    for key in [k for k in inp if k.startswith("argmax_")]:
        tokens = np.zeros(2, np.int32)   # pos 0, no prompt left: the kernel writes tokens[1]
        _launch("argmax_next", sample.ARGMAX_GRID, sample.ARGMAX_BLOCK,
                np.ascontiguousarray(inp[key], dtype=np.float32), np.zeros(1, np.int32),
                np.zeros(1, np.int32), tokens)
        out[key] = tokens[1:]
    np.savez(dst, **out)


if __name__ == "__main__":
    _child(*sys.argv[1:3])
