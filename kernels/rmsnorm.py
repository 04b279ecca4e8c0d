"""RMSNorm over the residual stream, one block.

Owns `rmsnorm`: out = x / sqrt(mean(x*x) + eps) * w. One block of RMSNORM_THREADS threads:
thread-strided partial sums of squares, then a fixed-order shared-memory tree, so the result
is bit-reproducible run to run (no atomics).
"""
import math

import numba
import numpy as np
from numba import cuda

from kernels._spec import kernel
from kernels.pdl import pdl_launch_dependents, pdl_wait

RMSNORM_THREADS = 256  # power of two: the tree halves it
RMSNORM_GRID = (1,)
RMSNORM_BLOCK = (RMSNORM_THREADS,)


def rmsnorm_twin(grid, block, x, w, out, eps):
    x = np.asarray(x, dtype=np.float32)
    ms = np.float32(np.sum(x * x, dtype=np.float32) / np.float32(x.shape[0]))
    inv = np.float32(1.0) / np.sqrt(ms + np.float32(eps), dtype=np.float32)
    out[:] = (x * inv) * w


@cuda.jit(device=True)
def sum_squares(x, tid):
    """This thread's strided partial sum of x*x."""
    acc = numba.float32(0.0)
    for i in range(tid, x.shape[0], RMSNORM_THREADS):
        v = x[i]
        acc = cuda.fma(v, v, acc)
    return acc


@cuda.jit(device=True)
def normalise(x, w, out, eps, acc, red):
    """Reduce the partial sums in a fixed-order tree, then write out = x * inv_rms * w."""
    tid = cuda.threadIdx.x
    n = x.shape[0]
    red[tid] = acc
    cuda.syncthreads()
    stride = RMSNORM_THREADS // 2
    while stride > 0:  # fixed pairing: the sum order never depends on timing
        if tid < stride:
            red[tid] = red[tid] + red[tid + stride]
        cuda.syncthreads()
        stride //= 2
    inv = numba.float32(1.0) / math.sqrt(red[0] / numba.float32(n) + eps)
    for i in range(tid, n, RMSNORM_THREADS):
        out[i] = (x[i] * inv) * w[i]


_SIG = "void(float32[::1], float32[::1], float32[::1], float32)"


@kernel(_SIG, twin=rmsnorm_twin, reads=(0, 1), writes=(2,))
def rmsnorm(x, w, out, eps):
    """out = x / sqrt(mean(x*x) + eps) * w; x, w, out [D]; x and out must not alias."""
    pdl_wait()
    pdl_launch_dependents()  # the next kernel may launch now; it waits in its pdl_wait
    red = cuda.shared.array(RMSNORM_THREADS, numba.float32)  # [threads]
    tid = cuda.threadIdx.x
    normalise(x, w, out, eps, sum_squares(x, tid), red)


# ---- deliberate-bug variant (lab/bugs.py, LAB_BUG_LATE_WAIT) ------------------------------------
# The wait is misplaced: x -- written by the previous kernel -- is read BEFORE pdl_wait. Under
# programmatic dependent launch this kernel may start while its predecessor still writes x.

@kernel(_SIG, twin=rmsnorm_twin, reads=(0, 1), writes=(2,))
def rmsnorm_late_wait(x, w, out, eps):
    """rmsnorm with its PDL wait after the first read of x (a race under PDL)."""
    red = cuda.shared.array(RMSNORM_THREADS, numba.float32)
    tid = cuda.threadIdx.x
    acc = sum_squares(x, tid)    # BUG: reads x before the wait
    pdl_wait()
    pdl_launch_dependents()
    normalise(x, w, out, eps, acc, red)
