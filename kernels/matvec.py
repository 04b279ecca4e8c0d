"""Matrix-vector products, one warp per output row.

Owns `matvec` (out = W @ x), `matvec_residual` (out += W @ x, the residual add fused) and the
device functions `row_dot` and `row_dot2`, whose summation order is the contract every row-wise
kernel shares (`swiglu_up`, `attn_combine`): same order, same bits.

Layout: MATVEC_THREADS = 128 threads per block = 4 warps, warp w of block b owns row 4*b + w.
The order of a row's dot product: lane l sums k = l, l+32, l+64, ... with fma in increasing k
(from +0.0), then the warp's 32 partial sums are added by the tree of kernels/reduce.py's
`warp_sum` (lane l += lane l + s, s = 16, 8, 4, 2, 1). lab/measure/precision.py's `row_dot_order`
mirrors it bit for bit. Each lane issues the loads of ROW_UNROLL consecutive k of its own
(k, k+32, ..., k+480) before their fmas, which then run in increasing k: more loads in flight,
the same order. On a GPU the warp's tree is a shuffle butterfly, no block barrier; under numba's
CUDA simulator a shared-memory tree with barriers (kernels/reduce.py).
"""
import numba
import numpy as np
from numba import cuda

from kernels._spec import kernel
from kernels.pdl import pdl_launch_dependents, pdl_wait
from kernels.reduce import WARP, warp_sum

MATVEC_THREADS = 128
MATVEC_ROWS_PER_BLOCK = MATVEC_THREADS // WARP  # 4: one warp per row
ROW_UNROLL = 16   # loads a lane issues before their fmas: K <= 512 in one round trip


def grid_for(n_rows: int) -> tuple[tuple[int], tuple[int]]:
    """(grid, block) for a warp-per-row kernel over n_rows output rows."""
    return ((n_rows + MATVEC_ROWS_PER_BLOCK - 1) // MATVEC_ROWS_PER_BLOCK,), (MATVEC_THREADS,)


@cuda.jit(device=True)
def row_dot(W, r, vec, tid, red):
    """W[r] . vec for the warp of thread `tid`; every thread of the block must call it.

    W [N, K], vec [K] (global or shared), red: shared [blockDim.x] scratch (the simulator's
    tree). Lane l sums k = l, l+32, ... with fma in increasing k; then the warp's 32 partials
    are summed by the tree (stride 16, 8, 4, 2, 1). Rows r >= N contribute nothing but still
    take part in the reduction. All lanes return the row's sum; `red` is free again on return.
    """
    lane = tid % WARP
    acc = numba.float32(0.0)
    if r < W.shape[0]:
        K = W.shape[1]
        Wr = W[r]                                         # [K] the row
        wk = cuda.local.array(ROW_UNROLL, numba.float32)  # [unroll] this lane's W[r, k]
        xk = cuda.local.array(ROW_UNROLL, numba.float32)  # [unroll] and vec[k]
        for k0 in range(lane, K, ROW_UNROLL * WARP):
            for j in range(ROW_UNROLL):  # every load of the group first ...
                k = k0 + j * WARP
                if k < K:
                    ku = numba.uint64(k)  # unsigned: no negative-index wraparound code
                    wk[j] = Wr[ku]
                    xk[j] = vec[ku]
            for j in range(ROW_UNROLL):  # ... then the fmas, in increasing k
                if k0 + j * WARP < K:
                    acc = cuda.fma(wk[j], xk[j], acc)
    return warp_sum(acc, tid, red)


@cuda.jit(device=True)
def row_load(W, r, tid, wk):
    """wk[j] = W[r, lane + 32 j] for j < ROW_UNROLL (the first group of `row_dot`'s loads for
    the warp of thread `tid`; 0 past the row's end or for r >= W.shape[0]). A kernel that must
    wait for its vector issues these first (kernels/fused.py's attn_fused_grid loads its row of
    Wo while the partials it waits for are being computed); `row_dot_loaded` finishes the dot.
    row_dot itself does not go through these two: built on them, every matvec node measured
    1.1 to 2.4 us slower on the H200 (data/gpu/kernel_costs.json, the pass of commit 4cfbf7a,
    against the pass before it)."""
    lane = tid % WARP
    for j in range(ROW_UNROLL):
        k = lane + j * WARP
        wk[j] = W[r, numba.uint64(k)] if r < W.shape[0] and k < W.shape[1] else numba.float32(0.0)


@cuda.jit(device=True)
def row_dot_loaded(W, r, vec, tid, red, wk):
    """`row_dot`(W, r, vec) with its first group of loads already in wk (`row_load`): the same
    fmas in the same order, so the same bits. Every thread of the block must call it."""
    lane = tid % WARP
    acc = numba.float32(0.0)
    if r < W.shape[0]:
        K = W.shape[1]
        Wr = W[r]                                         # [K] the row
        xk = cuda.local.array(ROW_UNROLL, numba.float32)  # [unroll] vec[k]
        for k0 in range(lane, K, ROW_UNROLL * WARP):
            for j in range(ROW_UNROLL):  # every load of the group first ...
                k = k0 + j * WARP
                if k < K:
                    ku = numba.uint64(k)
                    if k0 != lane:        # the first group's row is in wk already
                        wk[j] = Wr[ku]
                    xk[j] = vec[ku]
            for j in range(ROW_UNROLL):  # ... then the fmas, in increasing k
                if k0 + j * WARP < K:
                    acc = cuda.fma(wk[j], xk[j], acc)
    return warp_sum(acc, tid, red)


@cuda.jit(device=True)
def row_dot2(Wa, Wb, r, vec, tid, red):
    """(Wa[r] . vec, Wb[r] . vec), each bit for bit what `row_dot` returns, with the loads of
    both rows in flight together. Wa, Wb [N, K] of one shape; every thread must call it."""
    lane = tid % WARP
    acc_a = numba.float32(0.0)
    acc_b = numba.float32(0.0)
    if r < Wa.shape[0]:
        K = Wa.shape[1]
        Ar = Wa[r]                                        # [K] the rows
        Br = Wb[r]
        ak = cuda.local.array(ROW_UNROLL, numba.float32)  # [unroll] Wa[r, k]
        bk = cuda.local.array(ROW_UNROLL, numba.float32)  # [unroll] Wb[r, k]
        xk = cuda.local.array(ROW_UNROLL, numba.float32)  # [unroll] vec[k]
        for k0 in range(lane, K, ROW_UNROLL * WARP):
            for j in range(ROW_UNROLL):
                k = k0 + j * WARP
                if k < K:
                    ku = numba.uint64(k)
                    ak[j] = Ar[ku]
                    bk[j] = Br[ku]
                    xk[j] = vec[ku]
            for j in range(ROW_UNROLL):
                if k0 + j * WARP < K:
                    acc_a = cuda.fma(ak[j], xk[j], acc_a)
                    acc_b = cuda.fma(bk[j], xk[j], acc_b)
    a = warp_sum(acc_a, tid, red)
    return a, warp_sum(acc_b, tid, red)


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
    red = cuda.shared.array(MATVEC_THREADS, numba.float32)  # [threads] (simulator's tree)
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
    red = cuda.shared.array(MATVEC_THREADS, numba.float32)  # [threads] (simulator's tree)
    tid = cuda.threadIdx.x
    r = cuda.blockIdx.x * MATVEC_ROWS_PER_BLOCK + tid // WARP
    dot = row_dot(W, r, x, tid, red)
    if tid % WARP == 0 and r < out.shape[0]:
        out[r] = out[r] + dot
