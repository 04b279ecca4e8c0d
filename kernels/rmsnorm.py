"""RMSNorm over the residual stream, one block.

Owns `rmsnorm`: out = x / sqrt(mean(x*x) + eps) * w. One block of RMSNORM_THREADS = 256
threads: thread t sums x[i]^2 for i = t, t + 256, ... with fma in increasing i (from +0.0), then
the 256 partial sums are added by kernels/reduce.py's `block_sum`, the fixed tree t += t + s for
s = 128, 64, ..., 1 (lab/measure/precision.py's `rmsnorm_order` mirrors the whole kernel bit
for bit).
No atomics, so the result is bit-reproducible run to run. On a GPU the tree costs ONE block
barrier (each warp folds the strides 128, 64, 32 from shared memory itself, then a shuffle
butterfly: every thread gets the total); under numba's CUDA simulator it is the shared-memory
tree with a barrier per stride.
"""
import math

import numba
import numpy as np
from numba import cuda

from kernels.registry import kernel
from kernels.pdl import pdl_launch_dependents, pdl_wait
from kernels.reduce import BLOCK_THREADS, block_sum, strided_dot

RMSNORM_THREADS = BLOCK_THREADS  # 256: block_sum's tree is written for exactly this many
RMSNORM_GRID = (1,)
RMSNORM_BLOCK = (RMSNORM_THREADS,)


def rmsnorm_twin(grid, block, x, w, out, eps):
    x = np.asarray(x, dtype=np.float32)
    ms = np.float32(np.sum(x * x, dtype=np.float32) / np.float32(x.shape[0]))
    inv = np.float32(1.0) / np.sqrt(ms + np.float32(eps), dtype=np.float32)
    out[:] = (x * inv) * w


def rmsnorm_order(x, w, eps, fused: bool = True) -> np.ndarray:
    """kernels/rmsnorm.py's `rmsnorm` in its own order: 256 strided sums of squares (fma), a
    tree over the threads, then x * (1 / sqrt(sum / n + eps)) * w, every step in float32."""
    x = np.asarray(x, dtype=np.float32)
    ss = strided_dot(x, x, RMSNORM_THREADS, fused)
    inv = np.float32(1.0) / np.sqrt(ss / np.float32(x.shape[-1]) + np.float32(eps), dtype=np.float32)
    return (x * inv) * np.asarray(w, dtype=np.float32)


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
    """Sum the block's partial sums (block_sum's fixed tree), then write out = x * inv_rms * w.

    Every thread of the 256-thread block must call it; red: shared [256] scratch, to be reused
    only after a barrier.
    """
    tid = cuda.threadIdx.x
    n = x.shape[0]
    total = block_sum(acc, tid, red)
    inv = numba.float32(1.0) / math.sqrt(total / numba.float32(n) + eps)
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


# ---- deliberate-bug variant (lab/engine/bugs.py, LAB_BUG_LATE_WAIT) ------------------------------
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


# ---- the cases kernels/check.py runs (c: the dims of one of its tiny models)
CASES = {
    "sizes": lambda c: (c["D"], 300),   # 300 > 256 threads: the strided partial sums
    "eps": 1e-5,
    "tol": (1e-6, 16),
    "why": "D squares summed in another order than NumPy's pairwise sum, then rsqrt and two "
           "products: relative error ~ (log2(D) + 4) eps; k = 16 covers D <= 4096",
}
