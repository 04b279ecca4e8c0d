"""Matrix-vector products, one warp per output row.

Owns `matvec` (out = W @ x), `matvec_residual` (out += W @ x, the residual add fused) and the
device function `row_dot`, whose summation order is the contract every row-wise kernel shares
(`swiglu_up`, `attn_combine`): same function, same order, same bits.

Layout: MATVEC_THREADS = 128 threads per block = 4 warps, warp w of block b owns row 4*b + w.
The simulator has no warp shuffles, so the warp's reduction is a fixed-order shared-memory tree.
"""
import numba
import numpy as np
from numba import cuda

from kernels._spec import kernel
from kernels.pdl import pdl_launch_dependents, pdl_wait

WARP = 32
MATVEC_THREADS = 128
MATVEC_ROWS_PER_BLOCK = MATVEC_THREADS // WARP  # 4: one warp per row


def grid_for(n_rows: int) -> tuple[tuple[int], tuple[int]]:
    """(grid, block) for a warp-per-row kernel over n_rows output rows."""
    return ((n_rows + MATVEC_ROWS_PER_BLOCK - 1) // MATVEC_ROWS_PER_BLOCK,), (MATVEC_THREADS,)


@cuda.jit(device=True)
def row_dot(W, r, vec, tid, red):
    """W[r] . vec for the warp of thread `tid`; every thread of the block must call it.

    W [N, K], vec [K] (global or shared), red: shared [MATVEC_THREADS] scratch. Lane l sums
    k = l, l+32, ... with fma in increasing k; then the warp's 32 partials are summed by a tree
    (stride 16, 8, 4, 2, 1). Rows r >= N contribute nothing but still take part in the barriers.
    All lanes return the row's sum; `red` is free again on return.
    """
    lane = tid % WARP
    acc = numba.float32(0.0)
    if r < W.shape[0]:
        for k in range(lane, W.shape[1], WARP):
            acc = cuda.fma(W[r, k], vec[k], acc)
    red[tid] = acc
    cuda.syncthreads()
    stride = WARP // 2
    while stride > 0:
        if lane < stride:
            red[tid] = red[tid] + red[tid + stride]
        cuda.syncthreads()
        stride //= 2
    total = red[tid - lane]
    cuda.syncthreads()  # everyone has read: the caller may reuse `red`
    return total


def matvec_twin(grid, block, W, x, out):
    out[:] = W @ x


def matvec_residual_twin(grid, block, W, x, out):
    out[:] = out + (W @ x)


@kernel("void(float32[:, ::1], float32[::1], float32[::1])",
        twin=matvec_twin, reads=(0, 1), writes=(2,))
def matvec(W, x, out):
    """out = W @ x; W [N, K], x [K], out [N]; grid ceil(N/4), block 128."""
    pdl_wait()
    pdl_launch_dependents()  # the next kernel may launch now; it waits in its pdl_wait
    red = cuda.shared.array(MATVEC_THREADS, numba.float32)  # [threads]
    tid = cuda.threadIdx.x
    r = cuda.blockIdx.x * MATVEC_ROWS_PER_BLOCK + tid // WARP
    dot = row_dot(W, r, x, tid, red)
    if tid % WARP == 0 and r < out.shape[0]:
        out[r] = dot


@kernel("void(float32[:, ::1], float32[::1], float32[::1])",
        twin=matvec_residual_twin, reads=(0, 1, 2), writes=(2,))
def matvec_residual(W, x, out):
    """out[r] += W[r] . x (residual stream updated in place); x never aliases out."""
    pdl_wait()
    pdl_launch_dependents()  # the next kernel may launch now; it waits in its pdl_wait
    red = cuda.shared.array(MATVEC_THREADS, numba.float32)  # [threads]
    tid = cuda.threadIdx.x
    r = cuda.blockIdx.x * MATVEC_ROWS_PER_BLOCK + tid // WARP
    dot = row_dot(W, r, x, tid, red)
    if tid % WARP == 0 and r < out.shape[0]:
        out[r] = out[r] + dot
