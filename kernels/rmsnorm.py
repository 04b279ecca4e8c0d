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
from kernels.pdl import pdl_wait

RMSNORM_THREADS = 256  # power of two: the tree halves it
RMSNORM_GRID = (1,)
RMSNORM_BLOCK = (RMSNORM_THREADS,)


def rmsnorm_twin(grid, block, x, w, out, eps):
    x = np.asarray(x, dtype=np.float32)
    ms = np.float32(np.sum(x * x, dtype=np.float32) / np.float32(x.shape[0]))
    inv = np.float32(1.0) / np.sqrt(ms + np.float32(eps), dtype=np.float32)
    out[:] = (x * inv) * w


@kernel("void(float32[::1], float32[::1], float32[::1], float32)",
        twin=rmsnorm_twin, reads=(0, 1), writes=(2,))
def rmsnorm(x, w, out, eps):
    """out = x / sqrt(mean(x*x) + eps) * w; x, w, out [D]; x and out must not alias."""
    pdl_wait()
    red = cuda.shared.array(RMSNORM_THREADS, numba.float32)  # [threads]
    tid = cuda.threadIdx.x
    n = x.shape[0]
    acc = numba.float32(0.0)
    for i in range(tid, n, RMSNORM_THREADS):
        v = x[i]
        acc = cuda.fma(v, v, acc)
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
