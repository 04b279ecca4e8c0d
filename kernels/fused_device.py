"""The fused kernels' wide-block device functions: kernels/fused.py builds its kernels from them.

Owns
- `row_dot4`: `row_dot`'s order (kernels/matvec.py), four rows at a time with all their loads in
  flight; norm_qkv_rope's rows of W @ h and attn_fused's rows of Wo @ o.
- `slice_partial`: one block's split-K partials on a block of any number of groups of head_dim
  lanes (kernels/attention.py's `attn_partial` keeps a 128-thread layout that a 512-thread block
  cannot call); attn_fused's first phase. The same math, another summation order.
Device functions only: no kernel is registered here. They sit apart from kernels/fused.py so the
kernels there read as the step they replace; the "last block done" counter (`arrive_last`) stays
with them.
"""
import math

import numba
from numba import cuda

from kernels.reduce import WARP, warp_sum

ROWS4_UNROLL = 8   # row_dot4's loads per lane per row before their fmas (4 rows: 32 in flight)


@cuda.jit(device=True)
def row_dot4(W, r, step, vec, tid, red, out):
    """out[i] = W[r + i * step] . vec for i < 4, each bit for bit what `row_dot` returns for its
    row (lane l sums k = l, l + 32, ... with fma in increasing k, then the warp's tree), with the
    loads of all four rows in flight together: a serial loop of rows pays one round trip per
    four rows instead of one per row. Rows >= W.shape[0] give 0. out: local [4]; every thread
    of the block must call it."""
    lane = tid % WARP
    N = W.shape[0]
    K = W.shape[1]
    acc = cuda.local.array(4, numba.float32)
    wk = cuda.local.array((4, ROWS4_UNROLL), numba.float32)   # [rows, unroll] W[row, k]
    xk = cuda.local.array(ROWS4_UNROLL, numba.float32)        # [unroll] vec[k]
    for i in range(4):
        acc[i] = numba.float32(0.0)
    for k0 in range(lane, K, ROWS4_UNROLL * WARP):
        for j in range(ROWS4_UNROLL):        # every load of the group first ...
            k = k0 + j * WARP
            if k < K:
                ku = numba.uint64(k)
                xk[j] = vec[ku]
                for i in range(4):
                    if r + i * step < N:
                        wk[i, j] = W[r + i * step, ku]
        for j in range(ROWS4_UNROLL):        # ... then each row's fmas, in increasing k
            if k0 + j * WARP < K:
                for i in range(4):
                    if r + i * step < N:
                        acc[i] = cuda.fma(wk[i, j], xk[j], acc[i])
    for i in range(4):
        out[i] = warp_sum(acc[i], tid, red)


@cuda.jit(device=True)
def slice_partial(q, k_cache, v_cache, L, part_o, part_ml, scale, q_sh, sc, red):
    """Block (h, s): online softmax over its slice of a context of L timesteps (the slicing of
    kernels/attention.py: chunk = ceil(L / splits)); writes part_o[h, s] and part_ml[h, s].

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
    h = cuda.blockIdx.x
    s = cuda.blockIdx.y
    splits = cuda.gridDim.y
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
