"""Matrix-vector products, one warp per output row.

Contents
  grid_for                              (grid, block) of a warp-per-row kernel
  _make_row_chains                      a lane's fma chains: the one body of the row dots
  row_dot, row_dot_loaded, row_dot2     W[r] . vec (its first loads given; two rows at once)
  _make_group_load (load_group), row_load  a lane's group of a row's loads
  row_dot_order                         the order twin: row_dot's arithmetic in NumPy
  matvec, matvec_residual               out = W @ x; out += W @ x
  CASES                                 kernels/check.py's cases

MATVEC_THREADS = 128 threads per block = 4 warps, warp w of block b owns row 4b + w. A row's
order: lane l sums k = l, l+32, l+64, ... with fma in increasing k (from +0.0), its loads
ROW_UNROLL at a time before their fmas, then kernels/reduce.py's `warp_sum` over the 32 lanes.
Every row-wise kernel shares it (`swiglu_up`, `attn_combine`, the fused and verify kernels):
same order, same bits.
"""
import numba
import numpy as np
from numba import cuda

from kernels.registry import kernel
from kernels.pdl import pdl_launch_dependents, pdl_wait
from kernels.reduce import WARP, strided_dot, warp_sum

MATVEC_THREADS = 128
MATVEC_ROWS_PER_BLOCK = MATVEC_THREADS // WARP  # 4: one warp per row
ROW_UNROLL = 16   # loads a lane issues before their fmas: K <= 512 in one round trip


def grid_for(n_rows: int) -> tuple[tuple[int], tuple[int]]:
    """(grid, block) for a warp-per-row kernel over n_rows output rows."""
    return ((n_rows + MATVEC_ROWS_PER_BLOCK - 1) // MATVEC_ROWS_PER_BLOCK,), (MATVEC_THREADS,)


def _make_row_chains(pair: bool, preloaded: bool):
    """This lane's fma chains of a row dot: the one body of `row_dot`, `row_dot_loaded` and
    `row_dot2`. pair: a second matrix's row too (Wb, bk), its loads beside the first's;
    preloaded: the first group of Wa's row is already in ak (`row_load`)."""

    @cuda.jit(device=True)
    def chains(Wa, Wb, r, vec, tid, ak, bk, xk):
        """(acc_a, acc_b): lane l's sums over k = l, l+32, ... of Wa[r, k] * vec[k] (and of
        Wb[r, k] * vec[k]), fma in increasing k from +0.0; 0 for r >= N. ak, bk, xk: local
        [ROW_UNROLL] for the loads in flight (the caller's, allocated in the order of its
        loads: the order ptxas assigns their registers in)."""
        lane = tid % WARP
        acc_a = numba.float32(0.0)
        acc_b = numba.float32(0.0)
        if r < Wa.shape[0]:
            K = Wa.shape[1]
            Ar = Wa[r]                                        # [K] the rows
            Br = Wb[r]
            for k0 in range(lane, K, ROW_UNROLL * WARP):
                for j in range(ROW_UNROLL):  # every load of the group first ...
                    k = k0 + j * WARP
                    if k < K:
                        ku = numba.uint64(k)  # unsigned: no negative-index wraparound code
                        if not preloaded or k0 != lane:
                            ak[j] = Ar[ku]
                            if pair:
                                bk[j] = Br[ku]
                        xk[j] = vec[ku]
                for j in range(ROW_UNROLL):  # ... then the fmas, in increasing k
                    if k0 + j * WARP < K:
                        acc_a = cuda.fma(ak[j], xk[j], acc_a)
                        if pair:
                            acc_b = cuda.fma(bk[j], xk[j], acc_b)
        return acc_a, acc_b

    return chains


_row_chains = _make_row_chains(pair=False, preloaded=False)
_row_chains_loaded = _make_row_chains(pair=False, preloaded=True)
_row_chains2 = _make_row_chains(pair=True, preloaded=False)


@cuda.jit(device=True)
def row_dot(W, r, vec, tid, red):
    """W[r] . vec for the warp of thread `tid`; every thread of the block must call it.

    W [N, K], vec [K] (global or shared), red: shared [blockDim.x] scratch (the simulator's
    tree). Lane l sums k = l, l+32, ... with fma in increasing k, its loads ROW_UNROLL at a
    time before their fmas; then the warp's 32 partials are summed by the tree (stride 16, 8,
    4, 2, 1). Rows r >= N contribute nothing but still take part in the reduction. All lanes
    return the row's sum; `red` is free again on return.
    """
    wk = cuda.local.array(ROW_UNROLL, numba.float32)  # [unroll] this lane's W[r, k]
    xk = cuda.local.array(ROW_UNROLL, numba.float32)  # [unroll] and vec[k]
    acc, _ = _row_chains(W, W, r, vec, tid, wk, wk, xk)
    return warp_sum(acc, tid, red)


def _make_group_load(fill: bool):
    """The one body of `row_load` and `load_group`: a lane's group of ROW_UNROLL loads of a
    row, all in flight together. fill: 0 in the slots past the row's end (or for a row past
    the matrix's), else those slots are left as they are."""

    @cuda.jit(device=True)
    def group_load(W, r, k0, wk):
        """wk[j] = W[r, k0 + 32j] for j < ROW_UNROLL (those k < K, r < N)."""
        inside = r < W.shape[0]
        if fill or inside:
            K = W.shape[1]
            for j in range(ROW_UNROLL):
                k = k0 + j * WARP
                if fill or k < K:
                    ku = numba.uint64(k)  # unsigned: no negative-index wraparound code
                    wk[j] = W[r, ku] if inside and k < K else numba.float32(0.0)

    return group_load


load_group = _make_group_load(fill=False)
_group_fill = _make_group_load(fill=True)


@cuda.jit(device=True)
def row_load(W, r, tid, wk):
    """wk[j] = W[r, lane + 32 j] for j < ROW_UNROLL (the first group of `row_dot`'s loads for
    the warp of thread `tid`; 0 past the row's end or for r >= W.shape[0]). A kernel that must
    wait for its vector issues these first (kernels/fused.py's attn_fused_grid loads its row of
    Wo while the partials it waits for are being computed); `row_dot_loaded` finishes the dot.
    row_dot itself does not go through these two: built on them, every matvec node measured
    1.1 to 2.4 us slower on the H200 (data/gpu/kernel_costs.json)."""
    _group_fill(W, r, tid % WARP, wk)


@cuda.jit(device=True)
def row_dot_loaded(W, r, vec, tid, red, wk):
    """`row_dot`(W, r, vec) with its first group of loads already in wk (`row_load`): the same
    fmas in the same order, so the same bits. Every thread of the block must call it."""
    xk = cuda.local.array(ROW_UNROLL, numba.float32)  # [unroll] vec[k]
    acc, _ = _row_chains_loaded(W, W, r, vec, tid, wk, wk, xk)
    return warp_sum(acc, tid, red)


@cuda.jit(device=True)
def row_dot2(Wa, Wb, r, vec, tid, red):
    """(Wa[r] . vec, Wb[r] . vec), each bit for bit what `row_dot` returns, with the loads of
    both rows in flight together. Wa, Wb [N, K] of one shape; every thread must call it."""
    ak = cuda.local.array(ROW_UNROLL, numba.float32)  # [unroll] Wa[r, k]
    bk = cuda.local.array(ROW_UNROLL, numba.float32)  # [unroll] Wb[r, k]
    xk = cuda.local.array(ROW_UNROLL, numba.float32)  # [unroll] vec[k]
    acc_a, acc_b = _row_chains2(Wa, Wb, r, vec, tid, ak, bk, xk)
    a = warp_sum(acc_a, tid, red)
    return a, warp_sum(acc_b, tid, red)


def row_dot_order(W, x, fused: bool = True) -> np.ndarray:
    """W @ x in the order of kernels/matvec.py's `row_dot`: one warp (32 lanes) per row."""
    return strided_dot(W, x, WARP, fused)


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


# ---- the cases kernels/check.py runs (c: the dims of one of its tiny models)
CASES = {
    # (N, K): V rows end in a part block; 40 > 32 lanes: two k per lane; 600 > ROW_UNROLL * 32
    # = 512: two load groups
    "shapes": lambda c: ((c["V"], c["D"]), (c["D"], c["F"]), (5, 40), (3, 600)),
    "tol": (1e-5, 8),
    "why": "K-term dots in another order (fma, lane strides, tree): the error is relative to "
           "sum |W x|, not |ref|; weights scaled by 1/sqrt(K) (as a trained model's) keep the "
           "outputs O(1) and that sum ~sqrt(K): atol 1e-5 (> 2 sqrt(512) eps) guards "
           "cancellation, k = 8 the rest",
}
