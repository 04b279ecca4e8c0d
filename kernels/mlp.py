"""The MLP's up projection with SwiGLU fused.

Owns `swiglu_up`: act[r] = silu(W_gate[r] . h) * (W_up[r] . h), silu(g) = g / (1 + exp(-g)).
Warp per row like `matvec`, through `row_dot2`: both dot products in `row_dot`'s order (the same
bits as two `row_dot` calls), the loads of the gate row and the up row in flight together. The
down projection and its residual add is `matvec_residual`.
"""
import math

import numba
import numpy as np
from numba import cuda

from kernels.registry import kernel
from kernels.matvec import MATVEC_ROWS_PER_BLOCK, MATVEC_THREADS, WARP, grid_for, row_dot2
from kernels.pdl import pdl_launch_dependents, pdl_wait

__all__ = ["swiglu_up", "grid_for"]   # grid_for: matvec's warp-per-row geometry


def swiglu_up_twin(grid, block, W_gate, W_up, h, act):
    g = W_gate @ h
    u = W_up @ h
    with np.errstate(over="ignore"):  # exp(-g) -> inf for very negative g: silu -> -0, fine
        act[:] = (g / (np.float32(1.0) + np.exp(-g))) * u


@kernel("void(float32[:, ::1], float32[:, ::1], float32[::1], float32[::1])",
        twin=swiglu_up_twin, reads=(0, 1, 2), writes=(3,))
def swiglu_up(W_gate, W_up, h, act):
    """act[r] = silu(W_gate[r] . h) * (W_up[r] . h); W_* [F, D], h [D], act [F]; grid ceil(F/4)."""
    pdl_wait()
    pdl_launch_dependents()  # the next kernel may launch now; it waits in its pdl_wait
    red = cuda.shared.array(MATVEC_THREADS, numba.float32)  # [threads] (simulator's tree)
    tid = cuda.threadIdx.x
    r = cuda.blockIdx.x * MATVEC_ROWS_PER_BLOCK + tid // WARP
    g, u = row_dot2(W_gate, W_up, r, h, tid, red)
    if tid % WARP == 0 and r < act.shape[0]:
        act[r] = (g / (numba.float32(1.0) + math.exp(-g))) * u


# ---- the cases kernels/check.py runs (c: the dims of one of its tiny models)
CASES = {
    "tol": (1e-5, 16),
    "why": "two dots as matvec's (kernels/matvec.py's CASES), then exp and a divide: ~3 eps more",
}
