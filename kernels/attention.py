"""Split-K decode attention: partial softmax per slice of the context, then a merge.

Owns
- `attn_partial`: block (h, s) runs an online softmax over its slice of timesteps and writes the
  unnormalised (m, l, o) of that slice;
- `attn_merge`: merges the slices of every head into o [D] (device function `merge_elem`);
- `attn_combine`: merge + output projection + residual add in ONE kernel. Contract: bit-identical
  to `attn_merge` then `matvec_residual(Wo, o, x)`, because it calls the same device functions
  (`merge_elem`, `row_dot`) in the same order and rounds o to float32 at the same point.

The context length L = pos[0] + 1 is read from device memory (a loop bound can be: the kernel
reads it when it runs); `splits` = gridDim.y is part of the launch, fixed in a captured graph's
node until the graph is recaptured (the engine's default at a plan change) or the node's
parameters are updated, so the slice length chunk = ceil(L / splits) grows with L at run time.
An empty slice (s * chunk >= L) writes m = -inf, l = 0, o = 0; the merge then weighs it by
exp(-inf - M) = 0 (slice 0 is never empty, so M is finite and no NaN appears).
"""
import math

import numba
import numpy as np
from numba import cuda

from kernels._spec import kernel
from kernels.matvec import (MATVEC_ROWS_PER_BLOCK, MATVEC_THREADS, WARP, matvec_residual_twin,
                            row_dot)
from kernels.pdl import pdl_launch_dependents, pdl_wait

ATTN_TILE = 128   # shared score tile; a tile is blockDim.x = head_dim timesteps, so hd <= 128
MAX_HEAD_DIM = 128
MAX_D = 1024      # attn_combine keeps the whole merged o [D] in shared memory
COMBINE_THREADS = MATVEC_THREADS
COMBINE_ROWS_PER_BLOCK = MATVEC_ROWS_PER_BLOCK


def partial_grid(n_head: int, splits: int, head_dim: int):
    """(grid, block) for `attn_partial`."""
    return (n_head, splits), (head_dim,)


def merge_grid(n_head: int, head_dim: int):
    """(grid, block) for `attn_merge`."""
    return (n_head,), (head_dim,)


def combine_grid(d_model: int):
    """(grid, block) for `attn_combine`: one warp per output row of Wo, like matvec."""
    return ((d_model + COMBINE_ROWS_PER_BLOCK - 1) // COMBINE_ROWS_PER_BLOCK,), (COMBINE_THREADS,)


def slice_bounds(L: int, splits: int, s: int) -> tuple[int, int]:
    """Timesteps [t0, t1) of slice s when a context of L is cut into `splits` slices."""
    chunk = (L + splits - 1) // splits
    return min(s * chunk, L), min((s + 1) * chunk, L)


# ---------------------------------------------------------------- attn_partial

def _partial_twin(grid, block, q, k_cache, v_cache, L, part_o, part_ml, scale):
    n_head, splits = grid[0], grid[1]
    hd = block[0]
    scale = np.float32(scale)
    for h in range(n_head):
        qh = q[h * hd:(h + 1) * hd]                                          # [hd]
        for s in range(splits):
            t0, t1 = slice_bounds(L, splits, s)
            if t0 >= t1:  # empty slice
                part_ml[h, s] = (-np.inf, 0.0)
                part_o[h, s] = 0.0
                continue
            k = k_cache[t0:t1, h * hd:(h + 1) * hd].astype(np.float32)       # [n, hd]
            v = v_cache[t0:t1, h * hd:(h + 1) * hd].astype(np.float32)       # [n, hd]
            sc = scale * (k @ qh)                                            # [n]
            m = sc.max()
            p = np.exp(sc - m)                                               # [n]
            part_ml[h, s] = (m, p.sum(dtype=np.float32))
            part_o[h, s] = p @ v


def attn_partial_twin(grid, block, q, k_cache, v_cache, pos, part_o, part_ml, scale):
    _partial_twin(grid, block, q, k_cache, v_cache, int(pos[0]) + 1, part_o, part_ml, scale)


@cuda.jit(device=True)
def partial_slice(q, k_cache, v_cache, L, part_o, part_ml, scale, q_sh, sc):
    """Block (h, s): online softmax over its slice of a context of L timesteps."""
    tid = cuda.threadIdx.x
    hd = cuda.blockDim.x
    h = cuda.blockIdx.x
    s = cuda.blockIdx.y
    splits = cuda.gridDim.y
    base = h * hd
    chunk = (L + splits - 1) // splits
    t0 = min(s * chunk, L)
    t1 = min(t0 + chunk, L)

    q_sh[tid] = q[base + tid]
    m = numba.float32(-math.inf)
    l = numba.float32(0.0)
    o = numba.float32(0.0)  # this thread's head dimension d = tid
    cuda.syncthreads()
    for ts in range(t0, t1, hd):  # tiles of hd timesteps: thread i scores timestep ts + i
        n = min(hd, t1 - ts)
        if tid < n:
            dot = numba.float32(0.0)
            for d in range(hd):  # whole dot product per thread, fixed order
                dot = cuda.fma(q_sh[d], numba.float32(k_cache[ts + tid, base + d]), dot)
            sc[tid] = scale * dot
        cuda.syncthreads()
        m_new = m
        for i in range(n):  # every thread finds the same max (same reads, same order)
            m_new = max(m_new, sc[i])
        cuda.syncthreads()  # all maxima taken before sc is overwritten
        if tid < n:
            sc[tid] = math.exp(sc[tid] - m_new)
        cuda.syncthreads()
        alpha = math.exp(m - m_new)  # rescale the old sums; exp(-inf) = 0 on the first tile
        l = l * alpha
        o = o * alpha
        for i in range(n):
            p = sc[i]
            l = l + p
            o = cuda.fma(p, numba.float32(v_cache[ts + i, base + tid]), o)
        m = m_new
        cuda.syncthreads()  # sc is reused by the next tile
    part_o[h, s, tid] = o
    if tid == 0:
        part_ml[h, s, 0] = m
        part_ml[h, s, 1] = l


_PARTIAL_SIG = ("void(float32[::1], {kv}[:, ::1], {kv}[:, ::1], int32[::1], "
                "float32[:, :, ::1], float32[:, :, ::1], float32)")


@kernel(_PARTIAL_SIG.format(kv="float32"), _PARTIAL_SIG.format(kv="float16"),
        twin=attn_partial_twin, reads=(0, 1, 2, 3), writes=(4, 5))
def attn_partial(q, k_cache, v_cache, pos, part_o, part_ml, scale):
    """Online softmax of head h over slice s; grid (n_head, splits), block (head_dim,).

    q [D], k_cache/v_cache [max_seq, D], pos [1], part_o [n_head, splits, hd],
    part_ml [n_head, splits, 2] = (running max m, sum l of exp(score - m)).
    The context length L = pos[0] + 1 is read from device memory at run time.
    """
    pdl_wait()
    pdl_launch_dependents()  # the next kernel may launch now; it waits in its pdl_wait
    q_sh = cuda.shared.array(MAX_HEAD_DIM, numba.float32)  # [hd] this head's query
    sc = cuda.shared.array(ATTN_TILE, numba.float32)       # [tile] scores, then exp weights
    partial_slice(q, k_cache, v_cache, pos[0] + 1, part_o, part_ml, scale, q_sh, sc)


# ---- deliberate-bug variant (lab/bugs.py, LAB_BUG_CTX_BY_VALUE) --------------------------------
# The context length arrives BY VALUE from the host: a captured graph freezes it, so every
# replay attends over the capture-time context and ignores the newest keys.

def attn_partial_len_twin(grid, block, q, k_cache, v_cache, ctx_len, part_o, part_ml, scale):
    _partial_twin(grid, block, q, k_cache, v_cache, int(ctx_len), part_o, part_ml, scale)


_PARTIAL_LEN_SIG = ("void(float32[::1], {kv}[:, ::1], {kv}[:, ::1], int32, "
                    "float32[:, :, ::1], float32[:, :, ::1], float32)")


@kernel(_PARTIAL_LEN_SIG.format(kv="float32"), _PARTIAL_LEN_SIG.format(kv="float16"),
        twin=attn_partial_len_twin, reads=(0, 1, 2), writes=(4, 5))
def attn_partial_len(q, k_cache, v_cache, ctx_len, part_o, part_ml, scale):
    """attn_partial with the context length passed by value (a loop bound a graph freezes)."""
    pdl_wait()
    pdl_launch_dependents()  # the next kernel may launch now; it waits in its pdl_wait
    q_sh = cuda.shared.array(MAX_HEAD_DIM, numba.float32)
    sc = cuda.shared.array(ATTN_TILE, numba.float32)
    partial_slice(q, k_cache, v_cache, ctx_len, part_o, part_ml, scale, q_sh, sc)


# ---------------------------------------------------------------- merge

@cuda.jit(device=True)
def merge_elem(part_o, part_ml, h, d):
    """Merged, normalised o[h*hd + d] from the splits of head h, s in order 0..splits-1.

    part_o [n_head, splits, hd], part_ml [n_head, splits, 2]. The shared order is the contract
    between attn_merge and attn_combine.
    """
    splits = part_ml.shape[1]
    M = part_ml[h, 0, 0]
    for s in range(1, splits):
        M = max(M, part_ml[h, s, 0])
    L = numba.float32(0.0)
    acc = numba.float32(0.0)
    for s in range(splits):
        w = math.exp(part_ml[h, s, 0] - M)  # 0 for an empty slice (m = -inf)
        L = cuda.fma(part_ml[h, s, 1], w, L)
        acc = cuda.fma(part_o[h, s, d], w, acc)
    return acc / L


def attn_merge_twin(grid, block, part_o, part_ml, o):
    m = part_ml[:, :, 0]                                     # [n_head, splits]
    l = part_ml[:, :, 1]                                     # [n_head, splits]
    M = m.max(axis=1, keepdims=True)                         # [n_head, 1]
    w = np.exp(m - M)                                        # [n_head, splits]
    L = (l * w).sum(axis=1, dtype=np.float32)                # [n_head]
    acc = (part_o * w[:, :, None]).sum(axis=1, dtype=np.float32)  # [n_head, hd]
    o[:] = (acc / L[:, None]).reshape(-1)


@kernel("void(float32[:, :, ::1], float32[:, :, ::1], float32[::1])",
        twin=attn_merge_twin, reads=(0, 1), writes=(2,))
def attn_merge(part_o, part_ml, o):
    """o[h*hd + d] = merged slices of head h; grid (n_head,), block (head_dim,)."""
    pdl_wait()
    pdl_launch_dependents()  # the next kernel may launch now; it waits in its pdl_wait
    h = cuda.blockIdx.x
    d = cuda.threadIdx.x
    o[h * cuda.blockDim.x + d] = merge_elem(part_o, part_ml, h, d)


# ---------------------------------------------------------------- combine

def attn_combine_twin(grid, block, part_o, part_ml, Wo, x):
    # literally the two-kernel path: the contract is bitwise equality with it
    n_head, _, hd = part_o.shape
    o = np.empty(n_head * hd, dtype=np.float32)              # [D]
    attn_merge_twin((n_head,), (hd,), part_o, part_ml, o)
    matvec_residual_twin(grid, block, Wo, o, x)


@kernel("void(float32[:, :, ::1], float32[:, :, ::1], float32[:, ::1], float32[::1])",
        twin=attn_combine_twin, reads=(0, 1, 2, 3), writes=(3,))
def attn_combine(part_o, part_ml, Wo, x):
    """x[r] += Wo[r] . merge(part_o, part_ml); Wo [D, D], x [D]; grid ceil(D/4), block 128.

    Every block merges all D values into shared memory (redundant across blocks, but it saves a
    launch and a round trip of o through global memory), then does its 4 rows like matvec.
    """
    pdl_wait()
    pdl_launch_dependents()  # the next kernel may launch now; it waits in its pdl_wait
    o_sh = cuda.shared.array(MAX_D, numba.float32)            # [D] merged attention output
    red = cuda.shared.array(MATVEC_THREADS, numba.float32)    # [threads]
    tid = cuda.threadIdx.x
    hd = part_o.shape[2]
    D = part_o.shape[0] * hd
    for i in range(tid, D, MATVEC_THREADS):
        o_sh[i] = merge_elem(part_o, part_ml, i // hd, i % hd)  # rounded to f32 like attn_merge's o
    cuda.syncthreads()
    r = cuda.blockIdx.x * MATVEC_ROWS_PER_BLOCK + tid // WARP
    dot = row_dot(Wo, r, o_sh, tid, red)
    if tid % WARP == 0 and r < x.shape[0]:
        x[r] = x[r] + dot
