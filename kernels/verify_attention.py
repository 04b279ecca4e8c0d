"""The verify step's attention: split-K over the cache plus the causal block, then the merge.

Contents
  check_cols, verify_grid, merge_cols_grid, workspace_bytes  geometry and the partials' workspace
  step_elem, verify_rows        a thread's next staged element; the rows block s covers
  verify_partial                the T queries of a verify step against the cache, in S + 1 slices
  verify_merge                  each (head, column)'s slices merged into o [T, D] (attention.py's
                                merge: attn_merge's bits per column)
  causal_attention64            the float64 oracle of both, together
  CASES                         kernels/check.py's cases

No warp shuffle and no atomics: the bits never depend on timing (nor on kernels/reduce.py's
path). The order is not attn_partial's (its slices differ), so a verify column matches the
one-token step to rounding, not bit for bit. The rest of the verify step is kernels/verify.py.
"""
import math

import numba
import numpy as np
from numba import cuda

from kernels.registry import kernel
from kernels.attention import MAX_HEAD_DIM, MERGE_MAX_PAIRS, merge_elem_sh, merge_weights, udivmod
from kernels.draft import MAX_COLS
from kernels.pdl import pdl_launch_dependents, pdl_wait

VERIFY_THREADS = 128      # verify_partial's block: 4 warps
VERIFY_TILE = 32          # K/V rows a verify_partial block stages in shared memory at once
K_PITCH = MAX_HEAD_DIM + 1   # k_sh row pitch: a column of rows spreads over the 32 banks
STAGE_SLOTS = 16          # K (and V) elements a thread stages per tile: 32 rows of hd <= 64, 16 of 128
SCORE_GROUPS = VERIFY_THREADS // VERIFY_TILE  # 4: threads per tile row in the scores
SCORE_COLS = (MAX_COLS + SCORE_GROUPS - 1) // SCORE_GROUPS  # 3: columns a scoring thread holds
O_SLOTS = (MAX_COLS * MAX_HEAD_DIM + VERIFY_THREADS - 1) // VERIFY_THREADS  # 9: o elements per thread


def check_cols(cols: int) -> int:
    """T, if a verify step may have that many columns."""
    if not 1 <= cols <= MAX_COLS:
        raise ValueError(f"{cols} columns: a verify step has 1 .. MAX_COLS = {MAX_COLS}")
    return cols


def verify_grid(n_head: int, splits: int, head_dim: int = MAX_HEAD_DIM):
    """(grid, block) for `verify_partial`: S = splits cache slices plus the causal block."""
    if not 1 <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"head_dim {head_dim}: verify_partial needs 1 <= head_dim <= {MAX_HEAD_DIM}")
    if not 1 <= splits < MERGE_MAX_PAIRS:
        raise ValueError(f"splits {splits}: verify needs 1 <= splits < {MERGE_MAX_PAIRS}")
    return (n_head, splits + 1), (VERIFY_THREADS,)


def merge_cols_grid(n_head: int, head_dim: int, cols: int):
    """(grid, block) for `verify_merge`: attn_merge's block per head, one per column."""
    return (n_head, check_cols(cols)), (head_dim,)


def workspace_bytes(n_head: int, cols: int, splits: int, head_dim: int) -> int:
    """Bytes of part_o [H, T, S+1, hd] and part_ml [H, T, S+1, 2] (float32)."""
    return 4 * n_head * cols * (splits + 1) * (head_dim + 2)


@cuda.jit(device=True)
def step_elem(row, d, drow, dd, hd):
    """(row, d) of element e + n of a C-contiguous [rows, hd] array from (row, d) of element e
    and (drow, dd) = divmod(n, hd): a thread's next element at a block stride n, no division."""
    row += drow
    d += dd
    if d >= hd:
        d -= hd
        row += 1
    return row, d


# ---------------------------------------------------------------- verify_partial

def verify_rows(p: int, splits: int, s: int, cols: int, max_seq: int) -> tuple[int, int]:
    """Rows [r0, r1) of block s (s == splits: the causal block); column t's rows within it are
    [r0, min(r1, p + t + 1))."""
    if s < splits:
        chunk = (p + splits - 1) // splits
        r0 = min(s * chunk, p)
        return r0, min(r0 + chunk, p)
    return p, min(p + cols, max_seq)


def verify_partial_twin(grid, block, q, k_cache, v_cache, pos, part_o, part_ml, scale):
    n_head, T, nblk, hd = part_o.shape                   # nblk = S + 1
    assert tuple(grid) == (n_head, nblk) and hd <= MAX_HEAD_DIM, "grid must be (n_head, S + 1)"
    p, S, scale = int(pos[0]), nblk - 1, np.float32(scale)
    qh = q.reshape(T, n_head, hd)                              # [T, H, hd]
    for s in range(nblk):
        r0, r1 = verify_rows(p, S, s, T, k_cache.shape[0])
        # causal: column t sees rows <= p + t (every row of a cache slice, a prefix of the block's)
        seen = np.arange(r0, r1)[None, :] <= p + np.arange(T)[:, None]       # [T, n]
        live = seen.any(axis=1)                                # [T] columns with a row here
        k = k_cache[r0:r1].astype(np.float32).reshape(-1, n_head, hd)     # [n, H, hd]
        v = v_cache[r0:r1].astype(np.float32).reshape(-1, n_head, hd)     # [n, H, hd]
        sc = np.where(seen, scale * np.einsum("thd,nhd->htn", qh, k), -np.inf)  # [H, T, n]
        m = sc.max(axis=2, initial=-np.inf)                    # [H, T]: -inf where no row
        e = np.exp(sc - np.where(live, m, 0.0)[..., None])     # [H, T, n]: 0 where not seen
        part_ml[:, :, s, 0] = m                                # an empty partial: m = -inf,
        part_ml[:, :, s, 1] = e.sum(axis=2, dtype=np.float32)  # l = 0, o = 0
        part_o[:, :, s] = np.einsum("htn,nhd->htd", e, v)


_VERIFY_SIG = ("void(float32[:, ::1], {kv}[:, ::1], {kv}[:, ::1], int32[::1], "
               "float32[:, :, :, ::1], float32[:, :, :, ::1], float32)")


@kernel(_VERIFY_SIG.format(kv="float32"), _VERIFY_SIG.format(kv="float16"),
        twin=verify_partial_twin, reads=(0, 1, 2, 3), writes=(4, 5))
def verify_partial(q, k_cache, v_cache, pos, part_o, part_ml, scale):
    """Online softmax of the T queries of head h over block s's rows; grid (n_head, S+1),
    block (VERIFY_THREADS,) = (128,).

    q [T, D], k_cache/v_cache [max_seq, D], pos [1], part_o [n_head, T, S+1, hd],
    part_ml [n_head, T, S+1, 2] = (running max m, sum l of exp(score - m)) per column.

    Column t's keys are rows 0 .. p+t (causal). Blocks (h, s < S) cover the cache written
    before this step, rows [0, p): slice s = [s*chunk, min((s+1)*chunk, p)), chunk = ceil(p /
    S) read at run time (p = 0: every slice empty); block (h, S) is the causal block over the
    rows this step writes: column t attends rows p .. min(p+t, max_seq-1). A block walks its
    rows in tiles of VERIFY_TILE = 32, five phases a tile, a barrier after each:
      1. stage the tile's K and V rows of head h in shared memory, each row read once for all
         T queries, coalesced, a thread's loads issued before its stores (STAGE_SLOTS = 16 of
         each per thread: a tile is min(32, 2048 // head_dim) rows);
      2. scores: thread x takes row x % 32 against columns x // 32 + 4j: score = scale * (fma
         chain of q[d] * k[d], increasing d, from +0.0);
      3. thread t < T: column t's m_new = max(m, the tile's scores), alpha = exp(m - m_new);
      4. every (column, row): p = exp(score - m_new), in place of the score;
      5. thread t < T: l = l * alpha, then l += p per row in increasing order; each (column, d)
         element of o (a thread's O_SLOTS elements e = tid + 128k of [T, hd]): o = o * alpha,
         then o = fma(p, v[d], o) per row in increasing order.
    A block (or column) with no row writes m = -inf, l = 0, o = 0 exactly, which the merge
    weighs by exp(-inf - M) = 0; the causal slice always holds row p, so M is finite.
    """
    pdl_wait()
    pdl_launch_dependents()  # the next kernel may launch now; it waits in its pdl_wait
    k_sh = cuda.shared.array((VERIFY_TILE, K_PITCH), numba.float32)           # [tile, hd] K rows
    v_sh = cuda.shared.array((VERIFY_TILE, MAX_HEAD_DIM), numba.float32)      # [tile, hd] V rows
    q_sh = cuda.shared.array((MAX_COLS, MAX_HEAD_DIM), numba.float32)         # [T, hd] the head's queries
    sc_sh = cuda.shared.array((MAX_COLS, VERIFY_TILE), numba.float32)         # [T, tile] scores, then p
    m_sh = cuda.shared.array(MAX_COLS, numba.float32)                         # [T] running max
    l_sh = cuda.shared.array(MAX_COLS, numba.float32)                         # [T] running sum
    a_sh = cuda.shared.array(MAX_COLS, numba.float32)                         # [T] the tile's rescale
    n_sh = cuda.shared.array(MAX_COLS, numba.int32)                           # [T] rows the tile adds
    kt = cuda.local.array(STAGE_SLOTS, numba.float32)                         # [slots] K loads in flight
    vt = cuda.local.array(STAGE_SLOTS, numba.float32)                         # [slots] V loads in flight
    dots = cuda.local.array(SCORE_COLS, numba.float32)                        # [cols] one row's scores
    od = cuda.local.array(O_SLOTS, numba.float32)                             # [slots] this thread's o elements
    ot = cuda.local.array(O_SLOTS, numba.int32)                               # [slots] ... their column t
    odd = cuda.local.array(O_SLOTS, numba.int32)                              # [slots] ... and dim d
    tid = cuda.threadIdx.x
    h = cuda.blockIdx.x
    s = cuda.blockIdx.y
    S = cuda.gridDim.y - 1
    T = q.shape[0]
    hd = part_o.shape[3]
    base = h * hd
    p = pos[0]
    if s < S:  # a slice of the rows written before this step
        chunk = (p + S - 1) // S
        r0 = min(s * chunk, p)
        r1 = min(r0 + chunk, p)
    else:      # the causal block: this step's rows
        r0 = p
        r1 = min(p + T, k_cache.shape[0])
    tile = min(VERIFY_TILE, STAGE_SLOTS * VERIFY_THREADS // hd)  # rows staged at once: 32 (hd <= 64)
    row0, d0 = udivmod(tid, hd)                   # thread tid's first element of a [rows, hd]
    drow, dd = udivmod(VERIFY_THREADS, hd)        # array; its next one is 128 further on
    srow = tid % VERIFY_TILE                      # scores: this thread's row of the tile ...
    scol = tid // VERIFY_TILE                     # ... and columns scol + 4j
    t = row0
    d = d0
    for k in range(O_SLOTS):                      # this thread's elements of a [T, hd] array
        ot[k] = t                                 # (t >= T: an unused slot)
        odd[k] = d
        t, d = step_elem(t, d, drow, dd, hd)
    for k in range(O_SLOTS):                      # the queries, once: loads first ...
        if ot[k] < T:
            od[k] = q[ot[k], base + odd[k]]
    for k in range(O_SLOTS):                      # ... then the stores
        if ot[k] < T:
            q_sh[ot[k], odd[k]] = od[k]
        od[k] = numba.float32(0.0)
    if tid < T:
        m_sh[tid] = -math.inf
        l_sh[tid] = numba.float32(0.0)
    cuda.syncthreads()
    for tb in range(r0, r1, tile):                # the same tiles in every thread
        n = min(tile, r1 - tb)
        # 1. stage the tile's K and V rows: every load first, then the stores
        row = row0
        d = d0
        for i in range(STAGE_SLOTS):
            if row < n:
                ru = numba.uint64(tb + row)       # unsigned: no negative-index wraparound code
                du = numba.uint64(base + d)
                kt[i] = numba.float32(k_cache[ru, du])
                vt[i] = numba.float32(v_cache[ru, du])
            row, d = step_elem(row, d, drow, dd, hd)
        row = row0
        d = d0
        for i in range(STAGE_SLOTS):
            if row < n:
                k_sh[row, d] = kt[i]
                v_sh[row, d] = vt[i]
            row, d = step_elem(row, d, drow, dd, hd)
        cuda.syncthreads()
        # 2. scores: row srow against columns scol, scol + 4, scol + 8 (independent chains)
        if srow < n:
            for j in range(SCORE_COLS):
                dots[j] = numba.float32(0.0)
            for d in range(hd):
                kd = k_sh[srow, d]
                for j in range(SCORE_COLS):
                    t = scol + j * SCORE_GROUPS
                    if t < T:
                        dots[j] = cuda.fma(q_sh[t, d], kd, dots[j])
            for j in range(SCORE_COLS):
                t = scol + j * SCORE_GROUPS
                if t < T and tb + srow < min(r1, p + t + 1):
                    sc_sh[t, srow] = scale * dots[j]
        cuda.syncthreads()
        # 3. column tid's new max and rescale
        if tid < T:
            ne = min(min(r1, p + tid + 1) - tb, n)  # its rows in this tile (<= 0: none)
            m = m_sh[tid]
            m_new = m
            for r in range(ne):
                m_new = max(m_new, sc_sh[tid, r])
            if ne > 0 and m_new != -math.inf:
                a_sh[tid] = math.exp(m - m_new)     # exp(-inf) = 0 at the first rows
                m_sh[tid] = m_new
                n_sh[tid] = ne
            else:
                n_sh[tid] = 0
        cuda.syncthreads()
        # 4. p = exp(score - m_new) of each (column, row), in place
        if srow < n:
            for j in range(SCORE_COLS):
                t = scol + j * SCORE_GROUPS
                if t < T and srow < n_sh[t]:
                    sc_sh[t, srow] = math.exp(sc_sh[t, srow] - m_sh[t])
        cuda.syncthreads()
        # 5. l of column tid, o of this thread's (column, d) elements: rows in increasing order
        if tid < T and n_sh[tid] > 0:
            l = l_sh[tid] * a_sh[tid]
            for r in range(n_sh[tid]):
                l = l + sc_sh[tid, r]
            l_sh[tid] = l
        for k in range(O_SLOTS):
            t = ot[k]
            if t < T:
                ne = n_sh[t]
                if ne > 0:
                    o = od[k] * a_sh[t]
                    for r in range(ne):
                        o = cuda.fma(sc_sh[t, r], v_sh[r, odd[k]], o)
                    od[k] = o
        cuda.syncthreads()                          # the tile's shared arrays are free again
    for k in range(O_SLOTS):
        if ot[k] < T:
            part_o[h, ot[k], s, odd[k]] = od[k]
    if tid < T:
        part_ml[h, tid, s, 0] = m_sh[tid]
        part_ml[h, tid, s, 1] = l_sh[tid]


# ---------------------------------------------------------------- verify_merge

def verify_merge_twin(grid, block, part_o, part_ml, o):
    n_head, T, _, hd = part_o.shape
    m = part_ml[..., 0]                                      # [n_head, T, S+1]
    l = part_ml[..., 1]                                      # [n_head, T, S+1]
    M = m.max(axis=2, keepdims=True)                         # [n_head, T, 1]
    w = np.exp(m - M)                                        # [n_head, T, S+1]
    L = (l * w).sum(axis=2, dtype=np.float32)                # [n_head, T]
    acc = (part_o * w[..., None]).sum(axis=2, dtype=np.float32)  # [n_head, T, hd]
    o[:] = (acc / L[..., None]).transpose(1, 0, 2).reshape(T, n_head * hd)


@kernel("void(float32[:, :, :, ::1], float32[:, :, :, ::1], float32[:, ::1])",
        twin=verify_merge_twin, reads=(0, 1), writes=(2,))
def verify_merge(part_o, part_ml, o):
    """o[t, h*hd + d] = merged slices of (head h, column t); part_o [n_head, T, S+1, hd],
    part_ml [n_head, T, S+1, 2], o [T, D]; grid (n_head, T), block (head_dim,)."""
    pdl_wait()
    pdl_launch_dependents()  # the next kernel may launch now; it waits in its pdl_wait
    ml_sh = cuda.shared.array((MERGE_MAX_PAIRS, 2), numba.float32)  # [S+1, 2] (m, l)
    w_sh = cuda.shared.array(MERGE_MAX_PAIRS, numba.float32)        # [S+1] weights
    h = cuda.blockIdx.x
    t = cuda.blockIdx.y
    hd = part_o.shape[3]
    # head h's partials as attn_merge sees a head's: [T, S+1, ...] indexed by t, not by head
    merge_weights(part_ml[h], t, 1, ml_sh, w_sh)
    d = cuda.threadIdx.x
    while d < hd:
        o[t, h * hd + d] = merge_elem_sh(part_o[h], ml_sh, w_sh, 0, t, d)
        d += cuda.blockDim.x


def causal_attention64(q, kc, vc, p, H, hd, scale):
    """float64 softmax attention of a verify step's T queries q [T, H * hd] over a cache
    kc, vc [max_seq, H * hd]: column t over rows 0 .. min(p + t, max_seq - 1)."""
    T, S = q.shape[0], kc.shape[0]
    o = np.empty((T, H * hd))
    for t in range(T):
        L = min(p + t, S - 1) + 1
        for h in range(H):
            sl = slice(h * hd, (h + 1) * hd)
            s = scale * (kc[:L, sl].astype(np.float64) @ q[t, sl].astype(np.float64))
            e = np.exp(s - s.max())
            o[t, sl] = (e / e.sum()) @ vc[:L, sl].astype(np.float64)
    return o


# ---- the cases kernels/check.py runs (c: the dims of one of its tiny models)
CASES = {
    # (cache dtype, pos, splits): p = 0 (every cache slice empty), p on a slice boundary (6 =
    # 2 x 3) and inside one (7), a float16 cache, more slices than rows (p = 3, S = 4), a column
    # past max_seq
    "cases": lambda c: [(np.float32, 0, 2), (np.float32, 6, 2), (np.float32, 7, 2),
                        (np.float16, 9, 2), (np.float32, 3, 4), (np.float16, c["max_seq"] - 2, 1)],
    # (n_head, head_dim, max_seq, cases): slices of more than one tile of rows (the rescale
    # across tiles); head_dim 96 (tiles of 21 rows; T * hd > 256: three o slots per thread)
    "wide": (1, 96, 40, [(np.float32, 37, 1)]),
    "tol": {"verify_partial": (1e-5, 64), "verify_merge": (1e-6, 16), "causal64": (1e-5, 64)},
    "why": "attn_partial's and attn_merge's (kernels/attention.py's CASES): the same sums per "
           "column; against float64 causal attention the partial's",
}
