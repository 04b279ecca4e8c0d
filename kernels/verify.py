"""The model over T columns at once: the kernels of a speculative-decoding VERIFY step.

Contents
  embed_cols_grid, cols_grid, matmat_grid, rope_cols_grid  geometry
  embed_cols              X[t] = wte[cols[t]] (embed's gather)
  rmsnorm_cols            row t normalised by rmsnorm's device functions: rmsnorm(X[t])'s bits
  stage_cols, _make_lane_dots (lane_dots, lane_dots2), matmat_rows  the matmat body
  matmat, matmat_residual out[t] (+)= W @ Xc[t]: matvec(W, Xc[t])'s bits
  swiglu_cols             swiglu_up's formula per column: swiglu_up(Xc[t])'s bits
  rope_kv_append_cols     rope_kv_append at position p + t per column
  argmax_cols             pred[t] = argmax(logits[t]) by sample.py's pick_next
  CASES                   kernels/check.py's cases

A verify step feeds T = k + 1 <= MAX_COLS columns (column t at position p + t: the current
token, then k drafted ones, kernels/draft.py) through the model in one pass. Each kernel is a
one-token kernel's work over the T columns, in that kernel's order per column. Its attention
(verify_partial, verify_merge) is kernels/verify_attention.py.
"""
import math

import numba
import numpy as np
from numba import cuda

from kernels.registry import kernel
from kernels.attention import udivmod
from kernels.draft import MAX_COLS
from kernels.matvec import MATVEC_ROWS_PER_BLOCK, MATVEC_THREADS, ROW_UNROLL, WARP, load_group
from kernels.matvec import grid_for as rows_grid
from kernels.pdl import pdl_launch_dependents, pdl_wait
from kernels.reduce import warp_sum
from kernels.rmsnorm import RMSNORM_THREADS, normalise, rmsnorm_twin, sum_squares
from kernels.rope import rope_rows, rope_elem
from kernels.sample import ARGMAX_THREADS, argmax_twin_index, pick_next
from kernels.verify_attention import check_cols, step_elem

EMBED_COLS_THREADS = 128
MATMAT_MAX_K = 1024       # matmat / swiglu_cols stage the T columns [T, K <= this] in shared memory
STAGE_GROUP = 8           # column elements a thread loads before storing them (in flight together)


# ---------------------------------------------------------------- geometry

def embed_cols_grid(d_model: int, cols: int):
    """(grid, block) for `embed_cols`: blocks of 128 elements of a row, one row of blocks per column."""
    return ((d_model + EMBED_COLS_THREADS - 1) // EMBED_COLS_THREADS, check_cols(cols)), (EMBED_COLS_THREADS,)


def cols_grid(cols: int):
    """(grid, block) for `rmsnorm_cols` and `argmax_cols`: one 256-thread block per column."""
    return (check_cols(cols),), (RMSNORM_THREADS,)


def matmat_grid(n_rows: int, k: int = 0):
    """(grid, block) for `matmat`, `matmat_residual`, `swiglu_cols` over n_rows rows of length k:
    matvec's warp per row."""
    if k > MATMAT_MAX_K:
        raise ValueError(f"rows of {k}: matmat stages columns of at most MATMAT_MAX_K = {MATMAT_MAX_K}")
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

@cuda.jit(device=True)
def stage_cols(Xc, x_sh):
    """x_sh[t, k] = Xc[t, k] (t < T, k < K) by the whole block, each thread's STAGE_GROUP loads
    in flight before their stores; ends with a barrier (every thread must call it)."""
    T = Xc.shape[0]
    K = Xc.shape[1]
    t, k = udivmod(cuda.threadIdx.x, K)           # this thread's first element
    dt, dk = udivmod(cuda.blockDim.x, K)          # and the step to its next one
    xr = cuda.local.array(STAGE_GROUP, numba.float32)  # [group] loads in flight
    while t < T:
        tt = t
        kk = k
        for j in range(STAGE_GROUP):              # the group's loads first ...
            if tt < T:
                xr[j] = Xc[tt, kk]
            tt, kk = step_elem(tt, kk, dt, dk, K)
        for j in range(STAGE_GROUP):              # ... then its stores
            if t < T:
                x_sh[t, k] = xr[j]
            t, k = step_elem(t, k, dt, dk, K)
    cuda.syncthreads()


def _make_lane_dots(pair: bool):
    """The one body of `lane_dots` and `lane_dots2`; pair: a second matrix's chains beside the
    first's, its loads in flight with them."""

    @cuda.jit(device=True)
    def lane_dots2(Wa, Wb, r, x_sh, T, acc_a, acc_b, ak, bk):
        """acc_a[t] = this lane's part of Wa[r] . x[t] for t < T (and acc_b[t] of Wb[r] . x[t]);
        x_sh: shared [MAX_COLS, K], the columns `stage_cols` staged. Fma chains over k = lane,
        lane + 32, ... in increasing k from +0.0 (row_dot's), each W[r, k] loaded once for all
        T columns. acc_*: local [MAX_COLS]; entries past T (and every entry when r >= N) are 0.
        ak, bk: local [ROW_UNROLL] holding the lane's first group of each row (`load_group(W,
        r, lane, wk)`, issued before the staging, so the two overlap)."""
        lane = cuda.threadIdx.x % WARP
        for t in range(MAX_COLS):
            acc_a[t] = numba.float32(0.0)
            if pair:
                acc_b[t] = numba.float32(0.0)
        if r < Wa.shape[0]:
            K = Wa.shape[1]
            for k0 in range(lane, K, ROW_UNROLL * WARP):
                if k0 != lane:               # every load of a later group first ...
                    load_group(Wa, r, k0, ak)
                    if pair:
                        load_group(Wb, r, k0, bk)
                for j in range(ROW_UNROLL):  # ... then the fmas, in increasing k, each column's own
                    k = k0 + j * WARP
                    if k < K:
                        ku = numba.uint64(k)
                        for t in range(MAX_COLS):
                            if t < T:
                                x = x_sh[t, ku]
                                acc_a[t] = cuda.fma(ak[j], x, acc_a[t])
                                if pair:
                                    acc_b[t] = cuda.fma(bk[j], x, acc_b[t])

    return lane_dots2


_lane_dots1 = _make_lane_dots(pair=False)
lane_dots2 = _make_lane_dots(pair=True)


@cuda.jit(device=True)
def lane_dots(W, r, x_sh, T, acc, wk):
    """`lane_dots2` for one matrix: acc[t] = this lane's part of W[r] . x[t]; wk: its first
    group (`load_group`)."""
    _lane_dots1(W, W, r, x_sh, T, acc, acc, wk, wk)


def matmat_twin(grid, block, W, Xc, out):
    assert Xc.shape[1] <= MATMAT_MAX_K, "matmat stages columns of at most MATMAT_MAX_K"
    out[:] = (W @ Xc.T).T     # [T, N]; W @ Xc.T: NumPy's fast orientation for a C-order W


def matmat_residual_twin(grid, block, W, Xc, out):
    assert Xc.shape[1] <= MATMAT_MAX_K, "matmat stages columns of at most MATMAT_MAX_K"
    out[:] = out + (W @ Xc.T).T


_MATMAT_SIG = "void(float32[:, ::1], float32[:, ::1], float32[:, ::1])"


@cuda.jit(device=True)
def matmat_rows(W, Xc, out, add, red, x_sh, acc, wk):
    """The body of `matmat` (add False: out = ...) and `matmat_residual` (add True: out += ...)
    for this thread's warp's row of W; every thread of the block calls it. red, x_sh, acc, wk:
    the kernel's shared [threads] and [MAX_COLS, MATMAT_MAX_K], local [MAX_COLS] and
    [ROW_UNROLL] scratch."""
    if Xc.shape[1] > MATMAT_MAX_K:                                   # (uniform) no room: the
        return                                                       # grid helper refuses it
    tid = cuda.threadIdx.x
    lane = tid % WARP
    r = cuda.blockIdx.x * MATVEC_ROWS_PER_BLOCK + tid // WARP
    T = Xc.shape[0]
    load_group(W, r, lane, wk)           # the first weights in flight while the columns stage
    stage_cols(Xc, x_sh)
    lane_dots(W, r, x_sh, T, acc, wk)
    for t in range(MAX_COLS):
        if t < T:                       # uniform over the block: every thread sums every column
            dot = warp_sum(acc[t], tid, red)
            if lane == t and r < out.shape[1]:
                out[t, r] = (out[t, r] + dot) if add else dot


@kernel(_MATMAT_SIG, twin=matmat_twin, reads=(0, 1), writes=(2,))
def matmat(W, Xc, out):
    """out[t, r] = W[r] . Xc[t]; W [N, K], Xc [T, K], out [T, N]; grid ceil(N/4), block 128.

    One warp per row of W as in matvec: the warp loads each W[r, k] once and uses it for all T
    columns (the weights are the bytes of a decode step, so T columns cost about one). The
    block first stages the T columns in shared memory (`stage_cols`; K <= MATMAT_MAX_K), so
    the inner loop's column reads wait on no global load; lane l keeps one fma chain per
    column (`lane_dots`), then `warp_sum` per column: row_dot's order."""
    pdl_wait()
    pdl_launch_dependents()  # the next kernel may launch now; it waits in its pdl_wait
    red = cuda.shared.array(MATVEC_THREADS, numba.float32)           # [threads] (simulator's tree)
    x_sh = cuda.shared.array((MAX_COLS, MATMAT_MAX_K), numba.float32)  # [T, K] the columns
    acc = cuda.local.array(MAX_COLS, numba.float32)                  # [cols] this lane's chains
    wk = cuda.local.array(ROW_UNROLL, numba.float32)                 # [unroll] this lane's W[r, k]
    matmat_rows(W, Xc, out, False, red, x_sh, acc, wk)


@kernel(_MATMAT_SIG, twin=matmat_residual_twin, reads=(0, 1, 2), writes=(2,))
def matmat_residual(W, Xc, out):
    """out[t, r] += W[r] . Xc[t] (the residual streams updated in place); Xc never aliases out."""
    pdl_wait()
    pdl_launch_dependents()  # the next kernel may launch now; it waits in its pdl_wait
    red = cuda.shared.array(MATVEC_THREADS, numba.float32)           # [threads] (simulator's tree)
    x_sh = cuda.shared.array((MAX_COLS, MATMAT_MAX_K), numba.float32)  # [T, K] the columns
    acc = cuda.local.array(MAX_COLS, numba.float32)                  # [cols] this lane's chains
    wk = cuda.local.array(ROW_UNROLL, numba.float32)                 # [unroll] this lane's W[r, k]
    matmat_rows(W, Xc, out, True, red, x_sh, acc, wk)


def swiglu_cols_twin(grid, block, W_gate, W_up, Xc, act):
    assert Xc.shape[1] <= MATMAT_MAX_K, "swiglu_cols stages columns of at most MATMAT_MAX_K"
    g = (W_gate @ Xc.T).T                                  # [T, F]
    u = (W_up @ Xc.T).T                                    # [T, F]
    with np.errstate(over="ignore"):  # exp(-g) -> inf for very negative g: silu -> -0, fine
        act[:] = (g / (np.float32(1.0) + np.exp(-g))) * u


@kernel("void(float32[:, ::1], float32[:, ::1], float32[:, ::1], float32[:, ::1])",
        twin=swiglu_cols_twin, reads=(0, 1, 2), writes=(3,))
def swiglu_cols(W_gate, W_up, Xc, act):
    """act[t, r] = silu(W_gate[r] . Xc[t]) * (W_up[r] . Xc[t]); W_* [F, D], Xc [T, D], act [T, F];
    grid ceil(F/4), block 128."""
    pdl_wait()
    pdl_launch_dependents()  # the next kernel may launch now; it waits in its pdl_wait
    red = cuda.shared.array(MATVEC_THREADS, numba.float32)           # [threads] (simulator's tree)
    x_sh = cuda.shared.array((MAX_COLS, MATMAT_MAX_K), numba.float32)  # [T, D] the columns
    acc_g = cuda.local.array(MAX_COLS, numba.float32)                # [cols] gate chains
    acc_u = cuda.local.array(MAX_COLS, numba.float32)                # [cols] up chains
    gk = cuda.local.array(ROW_UNROLL, numba.float32)                 # [unroll] W_gate[r, k]
    uk = cuda.local.array(ROW_UNROLL, numba.float32)                 # [unroll] W_up[r, k]
    if Xc.shape[1] > MATMAT_MAX_K:                                   # (uniform) no room: the
        return                                                       # grid helper refuses it
    tid = cuda.threadIdx.x
    lane = tid % WARP
    r = cuda.blockIdx.x * MATVEC_ROWS_PER_BLOCK + tid // WARP
    T = Xc.shape[0]
    load_group(W_gate, r, lane, gk)      # the first weights in flight while the columns stage
    load_group(W_up, r, lane, uk)
    stage_cols(Xc, x_sh)
    lane_dots2(W_gate, W_up, r, x_sh, T, acc_g, acc_u, gk, uk)
    for t in range(MAX_COLS):
        if t < T:
            g = warp_sum(acc_g[t], tid, red)
            u = warp_sum(acc_u[t], tid, red)
            if lane == t and r < act.shape[1]:
                act[t, r] = (g / (numba.float32(1.0) + math.exp(-g))) * u


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
    # (N, K): V rows end in a part block of the 4 rows per block; 40 > 32 lanes
    "matmat_shapes": lambda c: ((c["V"], c["D"]), (5, 40)),
    "argmax_wide": 300,   # logits past the 256 threads' first stride
    "tol": {"embed_cols": (0.0, 0), "rope_kv_append_cols": (1e-6, 4), "rmsnorm_cols": (1e-6, 16),
            "matmat": (1e-5, 8), "matmat_residual": (1e-5, 8), "swiglu_cols": (1e-5, 16),
            "argmax_cols": (0.0, 0)},
    "why": "each column is its one-token kernel's arithmetic: that kernel's tolerance "
           "(the CASES of kernels/embed.py, rope.py, rmsnorm.py, matvec.py, mlp.py, sample.py)",
}
