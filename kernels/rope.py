"""Rotary embedding of q and k, fused with the KV-cache append.

Owns `rope_kv_append`: from qkv [3D] it writes q = rope(q), k_cache[pos] = rope(k) and
v_cache[pos] = v, reading the position from device memory. Rotate-half convention, with
host-precomputed float32 tables cos, sin [max_seq, head_dim/2]:
  j < hd/2:  out[j]      = x[j] * cos[pos, j] - x[j + hd/2] * sin[pos, j]
             out[j+hd/2] = x[j + hd/2] * cos[pos, j] + x[j] * sin[pos, j]
Grid (n_head,), block (head_dim,): thread j of block h produces element h*hd + j of q, k and v.
"""
import numpy as np
from numba import cuda

from kernels.registry import kernel
from kernels.pdl import pdl_launch_dependents, pdl_wait


def grid_for(n_head: int, head_dim: int) -> tuple[tuple[int], tuple[int]]:
    """(grid, block) for `rope_kv_append`."""
    return (n_head,), (head_dim,)


def rope_rows(x, c, s):
    """Rotate-half on x [n_head, hd] with c, s [hd/2], float32."""
    half = c.shape[0]
    lo, hi = x[:, :half], x[:, half:]
    return np.concatenate([lo * c - hi * s, hi * c + lo * s], axis=1)


def rope_kv_append_twin(grid, block, qkv, pos, cos, sin, q, k_cache, v_cache):
    n_head, hd = grid[0], block[0]
    D = n_head * hd
    assert hd == 2 * cos.shape[1] and q.shape[0] == D, "block must be (head_dim,)"
    p = int(pos[0])
    c, s = cos[p], sin[p]  # [hd/2]
    q[:] = rope_rows(qkv[0:D].reshape(n_head, hd), c, s).reshape(D)
    k_cache[p] = rope_rows(qkv[D:2 * D].reshape(n_head, hd), c, s).reshape(D)  # casts to cache dtype
    v_cache[p] = qkv[2 * D:3 * D]


_SIG = "void(float32[::1], int32[::1], float32[:, ::1], float32[:, ::1], float32[::1], {kv}[:, ::1], {kv}[:, ::1])"


@cuda.jit(device=True)
def rope_elem(x, i, j, half, c, s):
    """Element i of rope(x) for a head starting at i - j: the rotate-half pair of j < hd."""
    if j < half:  # out[j] = x[j] cos - x[j + half] sin
        return x[i] * c - x[i + half] * s
    return x[i] * c + x[i - half] * s  # out[j] = x[j] cos + x[j - half] sin


@kernel(_SIG.format(kv="float32"), _SIG.format(kv="float16"),
        twin=rope_kv_append_twin, reads=(0, 1, 2, 3), writes=(4, 5, 6))
def rope_kv_append(qkv, pos, cos, sin, q, k_cache, v_cache):
    """q = rope(qkv[0:D]); k_cache[pos] = rope(qkv[D:2D]); v_cache[pos] = qkv[2D:3D].

    qkv [3D], pos [1], cos/sin [max_seq, hd/2], q [D], k_cache/v_cache [max_seq, D] (f32 or f16).
    """
    pdl_wait()
    pdl_launch_dependents()  # the next kernel may launch now; it waits in its pdl_wait
    j = cuda.threadIdx.x
    hd = cuda.blockDim.x
    half = hd // 2
    D = q.shape[0]
    i = cuda.blockIdx.x * hd + j  # this thread's element of q, k and v
    p = pos[0]
    c = cos[p, j % half]
    s = sin[p, j % half]
    q[i] = rope_elem(qkv, i, j, half, c, s)
    k_cache[p, i] = rope_elem(qkv, D + i, j, half, c, s)  # setitem casts to the cache dtype
    v_cache[p, i] = qkv[2 * D + i]


# ---- deliberate-bug variant (lab/engine/bugs.py, LAB_BUG_FROZEN_KV_ROW) --------------------------
# The host computes the destination row itself and passes a row VIEW of the cache: a pointer
# that a captured graph freezes, so every replay writes the row of the capture's position.

def rope_kv_append_row_twin(grid, block, qkv, pos, cos, sin, q, k_row, v_row):
    n_head, hd = grid[0], block[0]
    D = n_head * hd
    p = int(pos[0])
    c, s = cos[p], sin[p]
    q[:] = rope_rows(qkv[0:D].reshape(n_head, hd), c, s).reshape(D)
    k_row[:] = rope_rows(qkv[D:2 * D].reshape(n_head, hd), c, s).reshape(D)
    v_row[:] = qkv[2 * D:3 * D]


_ROW_SIG = "void(float32[::1], int32[::1], float32[:, ::1], float32[:, ::1], float32[::1], {kv}[::1], {kv}[::1])"


@kernel(_ROW_SIG.format(kv="float32"), _ROW_SIG.format(kv="float16"),
        twin=rope_kv_append_row_twin, reads=(0, 1, 2, 3), writes=(4, 5, 6))
def rope_kv_append_row(qkv, pos, cos, sin, q, k_row, v_row):
    """Like rope_kv_append, but k and v go to the row views k_row/v_row [D] the host chose."""
    pdl_wait()
    pdl_launch_dependents()  # the next kernel may launch now; it waits in its pdl_wait
    j = cuda.threadIdx.x
    hd = cuda.blockDim.x
    half = hd // 2
    D = q.shape[0]
    i = cuda.blockIdx.x * hd + j
    p = pos[0]
    c = cos[p, j % half]
    s = sin[p, j % half]
    q[i] = rope_elem(qkv, i, j, half, c, s)
    k_row[i] = rope_elem(qkv, D + i, j, half, c, s)
    v_row[i] = qkv[2 * D + i]


# ---- the cases kernels/check.py runs (c: the dims of one of its tiny models)
CASES = {
    "positions": lambda c: (0, 3, c["max_seq"] - 1),
    "caches": (np.float32, np.float16),
    "tol": (1e-6, 4),
    "why": "two products and a sum per element, ~2 eps; a float16 cache gets k eps(float16): at "
           "most one float16 rounding flip from that float32 difference",
}
