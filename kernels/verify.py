"""The model over T columns at once: the kernels of a speculative-decoding VERIFY step.

Contents
  embed_cols_grid, cols_grid, matmat_grid, rope_cols_grid  geometry
  embed_cols              X[t] = wte[cols[t]] (embed's gather)
  rmsnorm_cols            row t normalised by rmsnorm's device functions: rmsnorm(X[t])'s bits
  _make_col_dots (col_dots, col_dots2)  a lane's fma chains, one per column: the matmat body
  matmat, matmat_residual out[t] (+)= W @ Xc[t]: matvec(W, Xc[t])'s bits
  swiglu_cols             swiglu_up's formula per column: swiglu_up(Xc[t])'s bits
  rope_kv_append_cols     rope_kv_append at position p + t per column
  argmax_cols             pred[t] = argmax(logits[t]) by sample.py's pick_next
  CASES                   kernels/check.py's cases

A verify step feeds T = k + 1 <= MAX_COLS columns (column t at position p + t: the current
token, then k drafted ones, kernels/draft.py) through the model in one pass. Each kernel is a
one-token kernel's work over the T columns, in that kernel's order per column. Its attention
(verify_partial, verify_merge) and the column reductions (lane_sums16) are
kernels/verify_attention.py.

The products keep matvec's order, so matvec's bits: one warp per row of W, lane l's fma chain
over k = l, l + 32, ... in increasing k (one chain per column), then the tree over the 32
lanes. Each W[r, k] is loaded once for all columns; the columns are read straight from global
memory (each warp reads the same T x K values: L1 serves all but the first), and the T sums
over the lanes are ONE reduce-scatter (`lane_sums16`: 16 shuffles for any T <= 9, where a
warp_sum per column costs 5 T), after which lane 2t holds column t's total and writes it. A
lane computes all MAX_COLS chains whatever T (column t >= T re-reads column T - 1 and is never
written): straight-line code with every load of a group in flight together, no branch per
column, no shared memory, no barrier.
"""
import math

import numba
import numpy as np
from numba import cuda

from kernels.registry import kernel
from kernels.draft import MAX_COLS
from kernels.matvec import MATVEC_ROWS_PER_BLOCK, WARP
from kernels.matvec import grid_for as rows_grid
from kernels.pdl import pdl_launch_dependents, pdl_wait
from kernels.reduce import SHUFFLES
from kernels.rmsnorm import RMSNORM_THREADS, normalise, rmsnorm_twin, sum_squares
from kernels.rope import rope_rows, rope_elem
from kernels.sample import ARGMAX_THREADS, argmax_twin_index, pick_next
from kernels.verify_attention import check_cols, lane_sums16

EMBED_COLS_THREADS = 128
COL_SLOTS = 16            # MAX_COLS rounded up to a power of two: lane_sums16's slots
COL_UNROLL = 8            # k a lane takes per pass (K = 256 in one): W's and the columns' loads
                          # of a pass in flight together before its fmas
# the simulator's trees sum the 16 slots in shared memory [slots, threads]; a GPU needs none
COL_TREE = (1, 1) if SHUFFLES else (COL_SLOTS, 128)
assert MAX_COLS <= COL_SLOTS


# ---------------------------------------------------------------- geometry

def embed_cols_grid(d_model: int, cols: int):
    """(grid, block) for `embed_cols`: blocks of 128 elements of a row, one row of blocks per column."""
    return ((d_model + EMBED_COLS_THREADS - 1) // EMBED_COLS_THREADS, check_cols(cols)), (EMBED_COLS_THREADS,)


def cols_grid(cols: int):
    """(grid, block) for `rmsnorm_cols` and `argmax_cols`: one 256-thread block per column."""
    return (check_cols(cols),), (RMSNORM_THREADS,)


def matmat_grid(n_rows: int):
    """(grid, block) for `matmat`, `matmat_residual`, `swiglu_cols` over n_rows rows: matvec's
    warp per row (4 rows a block of 128)."""
    return rows_grid(n_rows)


def rope_cols_grid(n_head: int, head_dim: int, cols: int):
    """(grid, block) for `rope_kv_append_cols`: block (h, t) is rope_kv_append's block h at p + t."""
    return (n_head, check_cols(cols)), (head_dim,)


# ---------------------------------------------------------------- embed_cols

def embed_cols_twin(grid, block, cols, wte, X):
    X[:] = wte[cols]


@kernel("void(int32[::1], float32[:, ::1], float32[:, ::1])",
        twin=embed_cols_twin, reads=(0, 1), writes=(2,))
def embed_cols(cols, wte, X):
    """X[t, i] = wte[cols[t], i]; cols [T], wte [V, D], X [T, D]; grid (ceil(D/128), T), block 128."""
    pdl_wait()
    pdl_launch_dependents()  # the next kernel may launch now; it waits in its pdl_wait
    i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    t = cuda.blockIdx.y
    if i < X.shape[1]:
        X[t, i] = wte[cols[t], i]


# ---------------------------------------------------------------- rmsnorm_cols

def rmsnorm_cols_twin(grid, block, X, w, out, eps):
    for t in range(X.shape[0]):  # row by row: what rmsnorm does to each
        rmsnorm_twin((1,), block, X[t], w, out[t], eps)


@kernel("void(float32[:, ::1], float32[::1], float32[:, ::1], float32)",
        twin=rmsnorm_cols_twin, reads=(0, 1), writes=(2,))
def rmsnorm_cols(X, w, out, eps):
    """out[t] = rmsnorm(X[t]); X, out [T, D] (not aliased), w [D]; grid (T,), block 256."""
    pdl_wait()
    pdl_launch_dependents()  # the next kernel may launch now; it waits in its pdl_wait
    red = cuda.shared.array(RMSNORM_THREADS, numba.float32)  # [threads]
    tid = cuda.threadIdx.x
    x = X[cuda.blockIdx.x]                                    # [D] this block's row
    normalise(x, w, out[cuda.blockIdx.x], eps, sum_squares(x, tid), red)


# ---------------------------------------------------------------- matmat, swiglu_cols

def _make_col_dots(pair: bool):
    """The one body of `col_dots` and `col_dots2`; pair: a second matrix's chains beside the
    first's (swiglu's gate and up rows), its loads in flight with them."""

    @cuda.jit(device=True)
    def col_dots2(Wa, Wb, r, Xc, lane, acc_a, acc_b, wa, wb, xk):
        """acc_a[t] = lane's part of Wa[r] . Xc[t] for t < MAX_COLS (and acc_b[t] of Wb[r] .
        Xc[t]): fma over k = lane, lane + 32, ... in increasing k from +0.0 (row_dot's chain),
        each W[r, k] loaded once for every column. Column t >= T reads column T - 1 (straight
        code, no branch per column); slots past MAX_COLS and every slot of a row r >= N are 0.
        acc_*: local [COL_SLOTS]; wa, wb: [COL_UNROLL]; xk: [MAX_COLS, COL_UNROLL]."""
        for t in range(COL_SLOTS):
            acc_a[t] = numba.float32(0.0)
            if pair:
                acc_b[t] = numba.float32(0.0)
        if r < Wa.shape[0]:
            K = Wa.shape[1]
            T = Xc.shape[0]
            for k0 in range(lane, K, COL_UNROLL * WARP):
                for j in range(COL_UNROLL):        # the pass's loads first: W's ...
                    k = k0 + j * WARP
                    if k < K:
                        ku = numba.uint64(k)       # unsigned: no negative-index wraparound code
                        wa[j] = Wa[r, ku]
                        if pair:
                            wb[j] = Wb[r, ku]
                for t in range(MAX_COLS):          # ... and every column's
                    tu = numba.uint64(min(t, T - 1))
                    for j in range(COL_UNROLL):
                        k = k0 + j * WARP
                        if k < K:
                            xk[t, j] = Xc[tu, numba.uint64(k)]
                for t in range(MAX_COLS):          # then the fmas, each column in increasing k
                    for j in range(COL_UNROLL):
                        if k0 + j * WARP < K:
                            acc_a[t] = cuda.fma(wa[j], xk[t, j], acc_a[t])
                            if pair:
                                acc_b[t] = cuda.fma(wb[j], xk[t, j], acc_b[t])

    return col_dots2


_col_dots1 = _make_col_dots(pair=False)
col_dots2 = _make_col_dots(pair=True)


@cuda.jit(device=True)
def col_dots(W, r, Xc, lane, acc, wk, xk):
    """`col_dots2` for one matrix: acc[t] = lane's part of W[r] . Xc[t]."""
    _col_dots1(W, W, r, Xc, lane, acc, acc, wk, wk, xk)


def matmat_twin(grid, block, W, Xc, out):
    out[:] = (W @ Xc.T).T     # [T, N]; W @ Xc.T: NumPy's fast orientation for a C-order W


def matmat_residual_twin(grid, block, W, Xc, out):
    out[:] = out + (W @ Xc.T).T


_MATMAT_SIG = "void(float32[:, ::1], float32[:, ::1], float32[:, ::1])"


@cuda.jit(device=True)
def matmat_rows(W, Xc, out, add, red, acc, wk, xk):
    """The body of `matmat` (add False: out = ...) and `matmat_residual` (add True: out += ...)
    for this thread's warp's row of W; every thread of the block calls it. red: the simulator's
    shared [COL_TREE]; acc, wk, xk: local [COL_SLOTS], [COL_UNROLL], [MAX_COLS, COL_UNROLL]."""
    tid = cuda.threadIdx.x
    lane = tid % WARP
    r = cuda.blockIdx.x * MATMAT_ROWS + tid // WARP
    c = lane >> 1                        # the column this lane's slot holds after lane_sums16
    cu = numba.uint64(min(c, Xc.shape[0] - 1))
    ru = numba.uint64(min(r, out.shape[1] - 1))
    res = out[cu, ru] if add else numba.float32(0.0)   # the residual in flight from the start
    col_dots(W, r, Xc, lane, acc, wk, xk)
    dot = lane_sums16(acc, tid, red)
    if lane % 2 == 0 and c < Xc.shape[0] and r < out.shape[1]:
        out[cu, ru] = (res + dot) if add else dot


MATMAT_ROWS = MATVEC_ROWS_PER_BLOCK   # 4: one warp per row of a 128-thread block


@kernel(_MATMAT_SIG, twin=matmat_twin, reads=(0, 1), writes=(2,))
def matmat(W, Xc, out):
    """out[t, r] = W[r] . Xc[t]; W [N, K], Xc [T, K], out [T, N]; grid ceil(N/4), block 128.

    One warp per row of W as in matvec: the warp loads each W[r, k] once and uses it for all T
    columns (the weights are the bytes of a decode step, so T columns cost about one). Lane l
    keeps one fma chain per column (`col_dots`), the columns read from global memory beside
    the weights, COL_UNROLL = 8 k a pass; `lane_sums16` sums the chains over the lanes in
    warp_sum's order (row_dot's: matvec's bits per column) and leaves column t in lane 2t."""
    pdl_wait()
    pdl_launch_dependents()  # the next kernel may launch now; it waits in its pdl_wait
    red = cuda.shared.array(COL_TREE, numba.float32)                  # (simulator's tree)
    acc = cuda.local.array(COL_SLOTS, numba.float32)                  # [slots] this lane's chains
    wk = cuda.local.array(COL_UNROLL, numba.float32)                  # [unroll] W[r, k]
    xk = cuda.local.array((MAX_COLS, COL_UNROLL), numba.float32)      # [cols, unroll] Xc[t, k]
    matmat_rows(W, Xc, out, False, red, acc, wk, xk)


@kernel(_MATMAT_SIG, twin=matmat_residual_twin, reads=(0, 1, 2), writes=(2,))
def matmat_residual(W, Xc, out):
    """out[t, r] += W[r] . Xc[t] (the residual streams updated in place); Xc never aliases out."""
    pdl_wait()
    pdl_launch_dependents()  # the next kernel may launch now; it waits in its pdl_wait
    red = cuda.shared.array(COL_TREE, numba.float32)                  # (simulator's tree)
    acc = cuda.local.array(COL_SLOTS, numba.float32)                  # [slots] this lane's chains
    wk = cuda.local.array(COL_UNROLL, numba.float32)                  # [unroll] W[r, k]
    xk = cuda.local.array((MAX_COLS, COL_UNROLL), numba.float32)      # [cols, unroll] Xc[t, k]
    matmat_rows(W, Xc, out, True, red, acc, wk, xk)


def swiglu_cols_twin(grid, block, W_gate, W_up, Xc, act):
    g = (W_gate @ Xc.T).T                                  # [T, F]
    u = (W_up @ Xc.T).T                                    # [T, F]
    with np.errstate(over="ignore"):  # exp(-g) -> inf for very negative g: silu -> -0, fine
        act[:] = (g / (np.float32(1.0) + np.exp(-g))) * u


@kernel("void(float32[:, ::1], float32[:, ::1], float32[:, ::1], float32[:, ::1])",
        twin=swiglu_cols_twin, reads=(0, 1, 2), writes=(3,))
def swiglu_cols(W_gate, W_up, Xc, act):
    """act[t, r] = silu(W_gate[r] . Xc[t]) * (W_up[r] . Xc[t]); W_* [F, D], Xc [T, D], act [T, F];
    grid ceil(F/4), block 128. matmat's body over both rows at once (`col_dots2`), the two
    reduce-scatters side by side."""
    pdl_wait()
    pdl_launch_dependents()  # the next kernel may launch now; it waits in its pdl_wait
    red = cuda.shared.array(COL_TREE, numba.float32)                  # (simulator's tree)
    acc_g = cuda.local.array(COL_SLOTS, numba.float32)                # [slots] gate chains
    acc_u = cuda.local.array(COL_SLOTS, numba.float32)                # [slots] up chains
    gk = cuda.local.array(COL_UNROLL, numba.float32)                  # [unroll] W_gate[r, k]
    uk = cuda.local.array(COL_UNROLL, numba.float32)                  # [unroll] W_up[r, k]
    xk = cuda.local.array((MAX_COLS, COL_UNROLL), numba.float32)      # [cols, unroll] Xc[t, k]
    tid = cuda.threadIdx.x
    lane = tid % WARP
    r = cuda.blockIdx.x * MATMAT_ROWS + tid // WARP
    col_dots2(W_gate, W_up, r, Xc, lane, acc_g, acc_u, gk, uk, xk)
    g = lane_sums16(acc_g, tid, red)
    u = lane_sums16(acc_u, tid, red)
    c = lane >> 1
    if lane % 2 == 0 and c < Xc.shape[0] and r < act.shape[1]:
        act[c, r] = (g / (numba.float32(1.0) + math.exp(-g))) * u


# ---------------------------------------------------------------- rope_kv_append_cols

def rope_kv_append_cols_twin(grid, block, qkv, pos, cos, sin, q, k_cache, v_cache):
    n_head, hd = grid[0], block[0]
    D = n_head * hd
    assert hd == 2 * cos.shape[1] and q.shape[1] == D, "block must be (head_dim,)"
    p = int(pos[0])
    for t in range(qkv.shape[0]):
        pt = p + t                                  # column t's position
        if pt >= k_cache.shape[0]:                  # past the cache: no row, q = 0
            q[t] = 0.0
            continue
        c, s = cos[pt], sin[pt]                     # [hd/2]
        q[t] = rope_rows(qkv[t, 0:D].reshape(n_head, hd), c, s).reshape(D)
        k_cache[pt] = rope_rows(qkv[t, D:2 * D].reshape(n_head, hd), c, s).reshape(D)
        v_cache[pt] = qkv[t, 2 * D:3 * D]


_ROPE_SIG = ("void(float32[:, ::1], int32[::1], float32[:, ::1], float32[:, ::1], float32[:, ::1], "
             "{kv}[:, ::1], {kv}[:, ::1])")


@kernel(_ROPE_SIG.format(kv="float32"), _ROPE_SIG.format(kv="float16"),
        twin=rope_kv_append_cols_twin, reads=(0, 1, 2, 3), writes=(4, 5, 6))
def rope_kv_append_cols(qkv, pos, cos, sin, q, k_cache, v_cache):
    """Column t: q[t] = rope(qkv[t, 0:D]), k_cache[p+t] = rope(qkv[t, D:2D]), v_cache[p+t] =
    qkv[t, 2D:3D] at position p + t; p + t >= max_seq: q[t] = 0, no cache row.

    qkv [T, 3D], pos [1], cos/sin [max_seq, hd/2], q [T, D], k_cache/v_cache [max_seq, D] (f32
    or f16); grid (n_head, T), block (head_dim,).
    """
    pdl_wait()
    pdl_launch_dependents()  # the next kernel may launch now; it waits in its pdl_wait
    j = cuda.threadIdx.x
    hd = cuda.blockDim.x
    half = hd // 2
    D = q.shape[1]
    t = cuda.blockIdx.y
    i = cuda.blockIdx.x * hd + j  # this thread's element of q, k and v
    pt = pos[0] + t
    if pt >= k_cache.shape[0]:    # never past the cache
        q[t, i] = numba.float32(0.0)
        return
    x = qkv[t]                    # [3D] column t
    c = cos[pt, j % half]
    s = sin[pt, j % half]
    q[t, i] = rope_elem(x, i, j, half, c, s)
    k_cache[pt, i] = rope_elem(x, D + i, j, half, c, s)  # setitem casts to the cache dtype
    v_cache[pt, i] = x[2 * D + i]


# ---------------------------------------------------------------- argmax_cols

def argmax_cols_twin(grid, block, logits, pred):
    for t in range(logits.shape[0]):
        pred[t] = argmax_twin_index(logits[t])


@kernel("void(float32[:, ::1], int32[::1])", twin=argmax_cols_twin, reads=(0,), writes=(1,))
def argmax_cols(logits, pred):
    """pred[t] = lowest index of the largest non-NaN logits[t] (0 if all NaN); logits [T, V],
    pred [T]; grid (T,), block 256."""
    pdl_wait()
    pdl_launch_dependents()  # the next kernel may launch now; it waits in its pdl_wait
    best_v = cuda.shared.array(ARGMAX_THREADS, numba.float32)  # [threads]
    best_i = cuda.shared.array(ARGMAX_THREADS, numba.int32)    # [threads]
    t = cuda.blockIdx.x
    pick_next(logits[t], pred, t, cuda.threadIdx.x, best_v, best_i)


# ---- the cases kernels/check.py runs (c: the dims of one of its tiny models)
CASES = {
    "cols": 3,   # T = k + 1 with k = 2 drafted tokens
    "rope_positions": lambda c: (0, 5, c["max_seq"] - 2),   # max_seq - 2: column 2 is past max_seq
    "rmsnorm_sizes": lambda c: (c["D"], 300),               # 300 > 256 threads
    # (N, K): V rows end in a part block of the 4 rows per block; 40 > 32 lanes; 300 > COL_UNROLL
    # * 32 = 256: two passes, the second a part one
    "matmat_shapes": lambda c: ((c["V"], c["D"]), (5, 40), (3, 300)),
    "argmax_wide": 300,   # logits past the 256 threads' first stride
    "tol": {"embed_cols": (0.0, 0), "rope_kv_append_cols": (1e-6, 4), "rmsnorm_cols": (1e-6, 16),
            "matmat": (1e-5, 8), "matmat_residual": (1e-5, 8), "swiglu_cols": (1e-5, 16),
            "argmax_cols": (0.0, 0)},
    "why": "each column is its one-token kernel's arithmetic: that kernel's tolerance "
           "(the CASES of kernels/embed.py, rope.py, rmsnorm.py, matvec.py, mlp.py, sample.py)",
}
