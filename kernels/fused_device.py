"""The fused kernels' device functions: kernels/fused.py and kernels/persistent.py build on them.

Contents
  inv_rms                 rmsnorm's scale from a sum of squares
  _make_xw_chains         one lane's chains of a folded-norm row dot (the one body of both:)
  xw_dot2, xw_dot         W[r] . (x * w) and x . x for two rows or one: RMSNorm without a
                          normalised vector
  xw_load, xw_dot2_loaded, xw_dot_loaded  the same dots with their weights' first loads issued
                          before the vector exists (kernels/persistent.py loads them before
                          it waits)
  head_dots, heads_dots   rows of one head's slice of a matrix; one row against several heads
  slice_partial, slice_partial_at  one block's split-K partials on a block of any size

Device functions only: no kernel is registered here, so kernels/fused.py reads as the step it
replaces.
"""
import math

import numba
from numba import cuda

from kernels.reduce import WARP, warp_sum

XW_UNROLL = 8      # xw_dot*'s loads per lane before their fmas (8 x 32 lanes: K <= 256 at once)
HEAD_ROWS = 8      # head_dots' rows per call: their loads in flight together
HEAD_LANE_DIMS = 4  # columns of one head a lane holds: head_dim <= 4 * 32 = 128 (MAX_HEAD_DIM)
PROJ_HEADS = 4     # heads_dots' heads per call (one row): their loads in flight together


@cuda.jit(device=True)
def inv_rms(ss, n, eps):
    """1 / sqrt(ss / n + eps): rmsnorm's scale from a sum of squares (kernels/rmsnorm.py's
    `normalise` computes it in the same expression)."""
    return numba.float32(1.0) / math.sqrt(ss / numba.float32(n) + eps)


def _make_xw_chains(pair: bool, preloaded: bool = False):
    """This lane's chains of a folded-norm row dot: the one body of `xw_dot`, `xw_dot2` and
    their `_loaded` forms; pair: a second row (Wb[rb], bk) beside the first, its loads in
    flight with them; preloaded: the first group of the rows and of w is already in ak, bk and
    wk (`xw_load`), so only x is loaded for it.

    The fold: a row of a normalised projection is W[r] . ((x * inv) * w) = inv * (W[r] . (x *
    w)), inv = 1 / sqrt(mean(x*x) + eps). The warp computing the row loads every x[k] for its
    dot anyway, so it sums x[k]^2 from the same registers (one more fma per element), reduces it
    with its own warp tree and scales the dot by inv: no block reduction, no barrier, no
    normalised copy in memory. The dot is `row_dot`'s order on x * w, the sum of squares
    `row_dot`'s order on x . x (kernels/check.py holds both bit for bit against
    kernels/matvec.py's `row_dot_order`). Why not normalise first: a block reduction and two
    barriers before any dot can start (norm_swiglu done so took 2.71 us per node on the H200
    against swiglu_up's 1.82 on the same rows, data/gpu/kernel_costs.json); the producer of x
    writing inv needs every one of its blocks done. The price: every warp sums all D squares,
    and (W . (x w)) inv is not W . ((x inv) w) bit for bit, so the fused step does not write
    the unfused step's bits (lab/reference.py's oracle judges both). Every warp sums the
    squares in one order, so every row of a launch is scaled by the same bits of inv."""

    @cuda.jit(device=True)
    def chains(Wa, ra, Wb, rb, x, w, tid, ak, bk, xk, wk):
        """(acc_a, acc_b, ss): lane l's sums over k = l, l + 32, ... in increasing k with fma
        from +0.0: acc += W[r, k] * xw[k] with xw[k] = x[k] * w[k] rounded once, ss += x[k] *
        x[k]. A row >= its matrix's rows gives 0 (and loads nothing). ak, bk, xk, wk: local
        [XW_UNROLL] for the loads in flight (the caller's, allocated in the order ptxas
        assigns their registers in)."""
        lane = tid % WARP
        K = x.shape[0]
        in_a = ra < Wa.shape[0]
        in_b = rb < Wb.shape[0]
        acc_a = numba.float32(0.0)
        acc_b = numba.float32(0.0)
        ss = numba.float32(0.0)
        for k0 in range(lane, K, XW_UNROLL * WARP):
            for j in range(XW_UNROLL):          # every load of the group first ...
                k = k0 + j * WARP
                if k < K:
                    ku = numba.uint64(k)         # unsigned: no negative-index wraparound code
                    xk[j] = x[ku]
                    if not preloaded or k0 != lane:
                        wk[j] = w[ku]
                        ak[j] = Wa[ra, ku] if in_a else numba.float32(0.0)
                        if pair:
                            bk[j] = Wb[rb, ku] if in_b else numba.float32(0.0)
            for j in range(XW_UNROLL):          # ... then the chains, in increasing k
                if k0 + j * WARP < K:
                    xw = xk[j] * wk[j]
                    acc_a = cuda.fma(ak[j], xw, acc_a)
                    if pair:
                        acc_b = cuda.fma(bk[j], xw, acc_b)
                    ss = cuda.fma(xk[j], xk[j], ss)
        return acc_a, acc_b, ss

    return chains


_xw_chains = _make_xw_chains(pair=False)
_xw_chains2 = _make_xw_chains(pair=True)
_xw_chains_loaded = _make_xw_chains(pair=False, preloaded=True)
_xw_chains2_loaded = _make_xw_chains(pair=True, preloaded=True)


@cuda.jit(device=True)
def xw_dot2(Wa, ra, Wb, rb, x, w, tid, red):
    """(Wa[ra] . (x * w), Wb[rb] . (x * w), x . x) for the warp of thread `tid`, every lane
    returning all three: the lane's chains (`_make_xw_chains`), then each by the warp's tree.
    The sum of squares is computed whether or not the rows exist. Every thread of the block
    must call it; red: shared [blockDim.x] (the simulator's tree)."""
    ak = cuda.local.array(XW_UNROLL, numba.float32)   # [unroll] Wa[ra, k]
    bk = cuda.local.array(XW_UNROLL, numba.float32)   # [unroll] Wb[rb, k]
    xk = cuda.local.array(XW_UNROLL, numba.float32)   # [unroll] x[k]
    wk = cuda.local.array(XW_UNROLL, numba.float32)   # [unroll] w[k]
    acc_a, acc_b, ss = _xw_chains2(Wa, ra, Wb, rb, x, w, tid, ak, bk, xk, wk)
    a = warp_sum(acc_a, tid, red)
    b = warp_sum(acc_b, tid, red)
    return a, b, warp_sum(ss, tid, red)


@cuda.jit(device=True)
def xw_dot(W, r, x, w, tid, red):
    """(W[r] . (x * w), x . x): `xw_dot2`'s arithmetic for one row (norm_lm_head_argmax)."""
    rk = cuda.local.array(XW_UNROLL, numba.float32)   # [unroll] W[r, k]
    xk = cuda.local.array(XW_UNROLL, numba.float32)   # [unroll] x[k]
    wk = cuda.local.array(XW_UNROLL, numba.float32)   # [unroll] w[k]
    acc, _, ss = _xw_chains(W, r, W, r, x, w, tid, rk, rk, xk, wk)
    d = warp_sum(acc, tid, red)
    return d, warp_sum(ss, tid, red)


def _make_xw_load(pair: bool):
    """The one body of `xw_load` for one row or two."""

    @cuda.jit(device=True)
    def load(Wa, ra, Wb, rb, w, tid, ak, bk, wk):
        """ak[j] = Wa[ra, k], bk[j] = Wb[rb, k] (pair), wk[j] = w[k] for k = lane + 32 j,
        j < XW_UNROLL, k < K: the first group of the chains' loads (0 for a row past its
        matrix's). Nothing here depends on x."""
        lane = tid % WARP
        K = w.shape[0]
        in_a = ra < Wa.shape[0]
        in_b = rb < Wb.shape[0]
        for j in range(XW_UNROLL):
            k = lane + j * WARP
            if k < K:
                ku = numba.uint64(k)
                wk[j] = w[ku]
                ak[j] = Wa[ra, ku] if in_a else numba.float32(0.0)
                if pair:
                    bk[j] = Wb[rb, ku] if in_b else numba.float32(0.0)

    return load


xw_load = _make_xw_load(pair=True)
xw_load1 = _make_xw_load(pair=False)


@cuda.jit(device=True)
def xw_dot2_loaded(Wa, ra, Wb, rb, x, w, tid, red, ak, bk, wk):
    """`xw_dot2` with the rows' and w's first group already in ak, bk, wk (`xw_load`): the
    same fmas in the same order, so the same bits. Every thread of the block must call it."""
    xk = cuda.local.array(XW_UNROLL, numba.float32)   # [unroll] x[k]
    acc_a, acc_b, ss = _xw_chains2_loaded(Wa, ra, Wb, rb, x, w, tid, ak, bk, xk, wk)
    a = warp_sum(acc_a, tid, red)
    b = warp_sum(acc_b, tid, red)
    return a, b, warp_sum(ss, tid, red)


@cuda.jit(device=True)
def xw_dot_loaded(W, r, x, w, tid, red, rk, wk):
    """`xw_dot` with the row's and w's first group already in rk, wk (`xw_load1`): the same
    bits. Every thread of the block must call it."""
    xk = cuda.local.array(XW_UNROLL, numba.float32)   # [unroll] x[k]
    acc, _, ss = _xw_chains_loaded(W, r, W, r, x, w, tid, rk, rk, xk, wk)
    d = warp_sum(acc, tid, red)
    return d, warp_sum(ss, tid, red)


@cuda.jit(device=True)
def head_dots(W, r, step, c0, n, vec, tid, red, out):
    """out[i] = W[r + i * step, c0 : c0 + n] . vec[0 : n] for i < HEAD_ROWS, with every load of
    the HEAD_ROWS rows in flight together. Lane l sums k = l, l + 32, ... < n with fma in
    increasing k from +0.0, then the warp's tree: `heads_dots`' bits, row for row. Rows >=
    W.shape[0] give 0. n <= 32 * HEAD_LANE_DIMS; out: local [HEAD_ROWS]; every thread of the
    block must call it."""
    lane = tid % WARP
    N = W.shape[0]
    wk = cuda.local.array((HEAD_ROWS, HEAD_LANE_DIMS), numba.float32)   # [rows, dims] W[row, c0 + k]
    vk = cuda.local.array(HEAD_LANE_DIMS, numba.float32)                # [dims] vec[k]
    for j in range(HEAD_LANE_DIMS):
        k = lane + j * WARP
        if k < n:
            vk[j] = vec[k]
            for i in range(HEAD_ROWS):
                if r + i * step < N:
                    wk[i, j] = W[r + i * step, c0 + k]
    for i in range(HEAD_ROWS):
        acc = numba.float32(0.0)
        if r + i * step < N:
            for j in range(HEAD_LANE_DIMS):
                if lane + j * WARP < n:
                    acc = cuda.fma(wk[i, j], vk[j], acc)
        out[i] = warp_sum(acc, tid, red)


@cuda.jit(device=True)
def heads_dots(W, r, h0, H, hd, vec, tid, red, out):
    """out[i] = W[r, c0 : c0 + hd] . vec[c0 : c0 + hd], c0 = (h0 + i) * hd, for i < PROJ_HEADS:
    one row's dots with heads h0, h0 + 1, ... (those < H; the others give 0), every load of them
    in flight together. Each head's dot is `head_dots`' arithmetic for that row and head, so the
    same bits. Rows >= W.shape[0] give 0. out: local [PROJ_HEADS]; every thread must call it."""
    lane = tid % WARP
    in_w = r < W.shape[0]
    wk = cuda.local.array((PROJ_HEADS, HEAD_LANE_DIMS), numba.float32)   # [heads, dims] W[r, c]
    vk = cuda.local.array((PROJ_HEADS, HEAD_LANE_DIMS), numba.float32)   # [heads, dims] vec[c]
    for i in range(PROJ_HEADS):
        for j in range(HEAD_LANE_DIMS):
            k = lane + j * WARP
            if in_w and h0 + i < H and k < hd:
                c = (h0 + i) * hd + k
                wk[i, j] = W[r, c]
                vk[i, j] = vec[c]
    for i in range(PROJ_HEADS):
        acc = numba.float32(0.0)
        if in_w and h0 + i < H:
            for j in range(HEAD_LANE_DIMS):
                if lane + j * WARP < hd:
                    acc = cuda.fma(wk[i, j], vk[i, j], acc)
        out[i] = warp_sum(acc, tid, red)


@cuda.jit(device=True)
def slice_partial(q, k_cache, v_cache, L, part_o, part_ml, scale, q_sh, sc, red):
    """Block (h, s) = (blockIdx.x, blockIdx.y) of a grid (n_head, splits): `slice_partial_at`
    for that block's item (attn_fused, attn_partial_wide)."""
    slice_partial_at(q, k_cache, v_cache, L, part_o, part_ml, scale, q_sh, sc, red,
                     cuda.blockIdx.x, cuda.blockIdx.y, cuda.gridDim.y)


@cuda.jit(device=True)
def slice_partial_at(q, k_cache, v_cache, L, part_o, part_ml, scale, q_sh, sc, red, h, s, splits):
    """Item (h, s) of `splits` slices, done by one block: online softmax over its slice of a
    context of L timesteps (the slicing of kernels/attention.py: chunk = ceil(L / splits));
    writes part_o[h, s] and part_ml[h, s]. Which block does the item does not change its bits
    (kernels/persistent.py walks the items in a loop over a persistent grid).

    The block's T threads are G = T / hd groups of hd lanes: thread (g, d). A tile holds up to
    hd timesteps; the score of timestep i is the sum over groups, in group order, of group g's
    dims [g*kw, (g+1)*kw) of q . k (lane d = i computes it); the tile's max comes from a tree
    (max is exact: any order gives the same bits); group g sums the weighted v of timesteps
    i = g, g + G, ... for dimension d; at the end the groups' o and l are added in group order.
    q_sh, sc: shared [>= hd]; red: shared [>= T]. Every thread must call it.
    """
    tid = cuda.threadIdx.x
    T = cuda.blockDim.x
    hd = part_o.shape[2]
    G = T // hd
    g = tid // hd
    d = tid % hd
    kw = (hd + G - 1) // G
    k0 = min(g * kw, hd)
    k1 = min(k0 + kw, hd)
    P = 1
    while P < hd:
        P *= 2
    base = h * hd
    chunk = (L + splits - 1) // splits
    t0 = min(s * chunk, L)
    t1 = min(t0 + chunk, L)
    neg_inf = numba.float32(-math.inf)

    if tid < hd:
        q_sh[tid] = q[base + tid]
    m = neg_inf
    l = numba.float32(0.0)
    o = numba.float32(0.0)
    cuda.syncthreads()
    for ts in range(t0, t1, hd):  # tiles of hd timesteps
        n = min(hd, t1 - ts)
        acc = numba.float32(0.0)
        if d < n:                 # group g's share of timestep ts + d's score
            for k in range(k0, k1):
                acc = cuda.fma(q_sh[k], numba.float32(k_cache[ts + d, base + k]), acc)
        red[tid] = acc
        cuda.syncthreads()
        if tid < n:
            dot = red[tid]
            for gg in range(1, G):
                dot = dot + red[gg * hd + tid]
            sc[tid] = scale * dot
        cuda.syncthreads()
        if tid < P:
            red[tid] = sc[tid] if tid < n else neg_inf
        cuda.syncthreads()
        stride = P // 2
        while stride > 0:         # the tile's max
            if tid < stride:
                red[tid] = max(red[tid], red[tid + stride])
            cuda.syncthreads()
            stride //= 2
        m_new = max(m, red[0])
        if tid < n:
            sc[tid] = math.exp(sc[tid] - m_new)
        cuda.syncthreads()
        alpha = math.exp(m - m_new)  # rescale the old sums; exp(-inf) = 0 on the first tile
        l = l * alpha
        o = o * alpha
        for i in range(g, n, G):
            p = sc[i]
            l = l + p
            o = cuda.fma(p, numba.float32(v_cache[ts + i, base + d]), o)
        m = m_new
        cuda.syncthreads()        # sc and red are reused by the next tile
    red[tid] = o
    cuda.syncthreads()
    if tid < hd:
        acc_o = red[tid]
        for gg in range(1, G):
            acc_o = acc_o + red[gg * hd + tid]
        part_o[h, s, tid] = acc_o
    cuda.syncthreads()
    red[tid] = l
    cuda.syncthreads()
    if tid == 0:
        acc_l = red[0]
        for gg in range(1, G):
            acc_l = acc_l + red[gg * hd]
        part_ml[h, s, 0] = m      # -inf, l = 0, o = 0 for an empty slice
        part_ml[h, s, 1] = acc_l
    cuda.syncthreads()            # red is free again
