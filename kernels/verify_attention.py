"""The verify step's attention: split-K over the cache plus the causal block, then the merge.

Contents
  check_cols, verify_grid, merge_cols_grid, workspace_bytes  geometry and the partials' workspace
  _make_halve, lane_sums16, lane_sums32  the column reductions: a warp's slots summed, each
                                lane left with one slot's total (matmat's and the scores')
  verify_rows                   the rows block s covers
  _make_column_walk (walk_cols_64, walk_cols_128)  one warp's online softmax of one column
  verify_partial                the T queries of a verify step against the cache, in S + 1 slices
  verify_merge                  each (head, column)'s slices merged into o [T, D] (attention.py's
                                merge: attn_merge's bits per column)
  causal_attention64            the float64 oracle of both, together
  CASES                         kernels/check.py's cases

The reductions over a warp's lanes (`lane_sums16`, `lane_sums32`) run in kernels/reduce.py's
order: the sum over the 32 lanes is warp_sum's tree (lane l takes lane l + s, s = 16 .. 1). On a
GPU they are a transposed butterfly (a reduce-scatter): at stride s a lane keeps half of the
slots it holds and adds the partner lane's values of those, so n slots cost n - 1 + (5 - log2 n)
shuffles in all, not n warp_sums of 5 each; every value a lane keeps is, bit for bit, the one
warp_sum's butterfly holds in that lane (an IEEE add is commutative), so each slot's total is the
tree's. Under numba's simulator (no shuffles) one shared-memory tree sums every slot at once, in
the same pairing. The rest is no atomics and no timing: the bits never depend on the path.

The softmax here is not attn_partial's order (its slices and passes differ; the scores are its
scores bit for bit), so a verify column matches the one-token step to rounding, not bit for bit.
The rest of the verify step is kernels/verify.py.
"""
import math

import numba
import numpy as np
from numba import cuda

from kernels.registry import kernel
from kernels.attention import DIMS_PER_LANE, MAX_HEAD_DIM, MERGE_MAX_PAIRS, merge_elem_sh, merge_weights
from kernels.draft import MAX_COLS
from kernels.pdl import pdl_launch_dependents, pdl_wait
from kernels.reduce import FULL_MASK, SHUFFLES, WARP

VERIFY_TILE = 32          # rows a warp scores at once: lane l is left with row l's score
# the simulator's trees sum every slot of a warp at once in shared memory [slots, threads]; a
# GPU's shuffles need none of it (a 1 x 1 array keeps the kernels' shared memory small)
TREE_SLOTS = (1, 1) if SHUFFLES else (VERIFY_TILE, WARP * MAX_COLS)


def check_cols(cols: int) -> int:
    """T, if a verify step may have that many columns."""
    if not 1 <= cols <= MAX_COLS:
        raise ValueError(f"{cols} columns: a verify step has 1 .. MAX_COLS = {MAX_COLS}")
    return cols


def verify_grid(n_head: int, splits: int, head_dim: int, cols: int):
    """(grid, block) for `verify_partial`: S = splits cache slices plus the causal block, one
    warp per column."""
    if not 1 <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"head_dim {head_dim}: verify_partial needs 1 <= head_dim <= {MAX_HEAD_DIM}")
    if not 1 <= splits < MERGE_MAX_PAIRS:
        raise ValueError(f"splits {splits}: verify needs 1 <= splits < {MERGE_MAX_PAIRS}")
    return (n_head, splits + 1), (WARP * check_cols(cols),)


def merge_cols_grid(n_head: int, head_dim: int, cols: int):
    """(grid, block) for `verify_merge`: attn_merge's block per head, one per column."""
    return (n_head, check_cols(cols)), (head_dim,)


def workspace_bytes(n_head: int, cols: int, splits: int, head_dim: int) -> int:
    """Bytes of part_o [H, T, S+1, hd] and part_ml [H, T, S+1, 2] (float32)."""
    return 4 * n_head * cols * (splits + 1) * (head_dim + 2)


# ---------------------------------------------------------------- the column reductions

def _make_halve(half: int):
    """One stage of the reduce-scatter over 2 * half slots held in v[0 : 2 half]."""

    @cuda.jit(device=True)
    def halve(v, lane, s):
        """Lanes whose bit s is clear keep slots v[0:half], the others v[half:2 half] (moved to
        v[0:half]); each kept slot adds the value lane ^ s holds of it (own value first, as
        warp_sum's butterfly adds)."""
        upper = (lane & s) != 0
        for i in range(half):
            lo = v[i]
            hi = v[i + half]
            keep = hi if upper else lo
            send = lo if upper else hi
            v[i] = keep + cuda.shfl_xor_sync(FULL_MASK, send, s)

    return halve


_halve16, _halve8, _halve4, _halve2, _halve1 = (_make_halve(n) for n in (16, 8, 4, 2, 1))


@cuda.jit(device=True)
def _tree_slots(v, n, shift, tid, red):
    """The simulator's path: every slot's tree over the warp in shared memory at once (strides
    16 .. 1, lane l taking lane l + s: warp_sum's tree); lane l gets slot l >> shift's total.
    red: shared [>= n, blockDim.x]; every thread of the block must call it."""
    lane = tid % WARP
    for i in range(n):
        red[i, tid] = v[i]
    cuda.syncthreads()
    s = WARP // 2
    while s > 0:
        if lane < s:
            for i in range(n):
                red[i, tid] = red[i, tid] + red[i, tid + s]
        cuda.syncthreads()
        s //= 2
    total = red[lane >> shift, tid - lane]
    cuda.syncthreads()                # everyone has read: red is free again
    return total


if SHUFFLES:
    @cuda.jit(device=True)
    def lane_sums16(v, tid, red):
        """Each of the 16 slots v[0:16] summed over tid's warp in warp_sum's order; lane l
        returns slot l >> 1's total (lanes 2c and 2c + 1 hold slot c). v is overwritten.
        4 halving stages (8 + 4 + 2 + 1 shuffles), then a butterfly at stride 1: 16 shuffles."""
        lane = tid % WARP
        _halve8(v, lane, 16)
        _halve4(v, lane, 8)
        _halve2(v, lane, 4)
        _halve1(v, lane, 2)
        return v[0] + cuda.shfl_xor_sync(FULL_MASK, v[0], 1)

    @cuda.jit(device=True)
    def lane_sums32(v, tid, red):
        """Each of the 32 slots v[0:32] summed over tid's warp in warp_sum's order; lane l
        returns slot l's total. v is overwritten. 16 + 8 + 4 + 2 + 1 = 31 shuffles."""
        lane = tid % WARP
        _halve16(v, lane, 16)
        _halve8(v, lane, 8)
        _halve4(v, lane, 4)
        _halve2(v, lane, 2)
        _halve1(v, lane, 1)
        return v[0]
else:
    @cuda.jit(device=True)
    def lane_sums16(v, tid, red):
        """Each of the 16 slots summed over tid's warp (warp_sum's tree); lane l returns slot
        l >> 1's total. red: shared [16, blockDim.x]; every thread must call it."""
        return _tree_slots(v, 16, 1, tid, red)

    @cuda.jit(device=True)
    def lane_sums32(v, tid, red):
        """Each of the 32 slots summed over tid's warp (warp_sum's tree); lane l returns slot
        l's total. red: shared [32, blockDim.x]; every thread must call it."""
        return _tree_slots(v, 32, 0, tid, red)


def lane_sums_twin(v) -> np.ndarray:
    """What `lane_sums16` / `lane_sums32` leave in each lane, from v [32 lanes, n slots]
    float32: [32], lane l holding slot l // (32 // n)'s total in warp_sum's tree order."""
    from kernels.reduce import warp_sum_tree_twin
    v = np.asarray(v, np.float32)
    totals = warp_sum_tree_twin(v.T)                     # [n] each slot over the 32 lanes
    return totals[np.arange(WARP) // (WARP // v.shape[1])]


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
    assert tuple(block) == (WARP * T,), "block must be one warp per column"
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


def _make_column_walk(dims: int):
    """The walk of one warp over a block's rows for one query column, for heads of head_dim
    <= 32 * dims (lane l holds d = l + 32 j, j < dims; one function per dims, as attention.py's
    walks). It reads each K and V row of the head once, coalesced (consecutive lanes on
    consecutive d), VERIFY_TILE = 32 rows at a time, every load of a tile issued first:
      1. lane l's part of each row's q . k (fma over its dims in increasing d, from +0.0: the
         parts attn_partial's walk makes), then `lane_sums32`: lane l is left with row l's
         score, scale * (the tree's sum), attn_partial's score bit for bit;
      2. the 32 scores go to shared memory (one barrier; two buffers by tile parity, so one
         barrier a tile), and every lane walks the column's rows of the tile in increasing
         order: m_new = max(m, scores), then l = l * alpha + p per row and o[d] = o[d] * alpha,
         then fma(p, v[d], o[d]) per row (alpha = exp(m - m_new), p = exp(score - m_new)).
    No cross-warp merge: the warp owns its column's (m, l, o) for the block's rows."""

    @cuda.jit(device=True)
    def walk(q, k_cache, v_cache, base, hd, t, r0, r1, last, scale, red, sc_sh, od):
        """Warp t's online softmax of query column t over rows [r0, r1), of which it counts
        [r0, last) (causal); o[d] left in od[j] (d = lane + 32 j), returns (m, l). Every thread
        of the block must call it with the same r0, r1 (the barriers)."""
        tid = cuda.threadIdx.x
        lane = tid % WARP
        qd = cuda.local.array(dims, numba.float32)                   # [dims] q[t, d]
        kt = cuda.local.array((VERIFY_TILE, dims), numba.float32)    # [tile, dims] k rows
        vt = cuda.local.array((VERIFY_TILE, dims), numba.float32)    # [tile, dims] v rows
        sc = cuda.local.array(VERIFY_TILE, numba.float32)            # [tile] the lane's parts
        tu = numba.uint64(t)
        for j in range(dims):
            d = lane + j * WARP
            qd[j] = q[tu, numba.uint64(base + d)] if d < hd else numba.float32(0.0)
            od[j] = numba.float32(0.0)
        m = numba.float32(-math.inf)
        l = numba.float32(0.0)
        buf = 0
        for tb in range(r0, r1, VERIFY_TILE):    # the same tiles in every warp (barriers)
            for i in range(VERIFY_TILE):         # every load of the tile first
                for j in range(dims):
                    d = lane + j * WARP
                    if tb + i < r1 and d < hd:
                        ru = numba.uint64(tb + i)   # unsigned: no negative-index wraparound code
                        du = numba.uint64(base + d)
                        kt[i, j] = numba.float32(k_cache[ru, du])
                        vt[i, j] = numba.float32(v_cache[ru, du])
                    else:
                        kt[i, j] = numba.float32(0.0)
                        vt[i, j] = numba.float32(0.0)
            for i in range(VERIFY_TILE):         # this lane's part of each q . k
                dot = numba.float32(0.0)
                for j in range(dims):
                    dot = cuda.fma(qd[j], kt[i, j], dot)
                sc[i] = dot
            score = lane_sums32(sc, tid, red)    # lane l: row tb + l's q . k
            sc_sh[buf, t, lane] = scale * score
            cuda.syncthreads()
            ne = min(last - tb, VERIFY_TILE)     # the column's rows in this tile (<= 0: none)
            if ne > 0:                           # uniform in the warp
                m_new = m
                for i in range(VERIFY_TILE):
                    if i < ne:
                        m_new = max(m_new, sc_sh[buf, t, i])
                alpha = math.exp(m - m_new)      # exp(-inf) = 0 at the first rows
                l = l * alpha
                for j in range(dims):
                    od[j] = od[j] * alpha
                for i in range(VERIFY_TILE):     # rows in increasing order
                    if i < ne:
                        pr = math.exp(sc_sh[buf, t, i] - m_new)
                        l = l + pr
                        for j in range(dims):
                            od[j] = cuda.fma(pr, vt[i, j], od[j])
                m = m_new
            buf = 1 - buf
        return m, l

    return walk


walk_cols_64 = _make_column_walk(2)                 # head_dim <= 64 (the model's)
walk_cols_128 = _make_column_walk(DIMS_PER_LANE)    # head_dim <= 128


_VERIFY_SIG = ("void(float32[:, ::1], {kv}[:, ::1], {kv}[:, ::1], int32[::1], "
               "float32[:, :, :, ::1], float32[:, :, :, ::1], float32)")


@kernel(_VERIFY_SIG.format(kv="float32"), _VERIFY_SIG.format(kv="float16"),
        twin=verify_partial_twin, reads=(0, 1, 2, 3), writes=(4, 5))
def verify_partial(q, k_cache, v_cache, pos, part_o, part_ml, scale):
    """Online softmax of the T queries of head h over block s's rows; grid (n_head, S+1),
    block (32 T,): warp t owns query column t.

    q [T, D], k_cache/v_cache [max_seq, D], pos [1], part_o [n_head, T, S+1, hd],
    part_ml [n_head, T, S+1, 2] = (running max m, sum l of exp(score - m)) per column.

    Column t's keys are rows 0 .. p+t (causal). Blocks (h, s < S) cover the cache written
    before this step, rows [0, p): slice s = [s*chunk, min((s+1)*chunk, p)), chunk = ceil(p /
    S) read at run time (p = 0: every slice empty); block (h, S) is the causal block over the
    rows this step writes: column t attends rows p .. min(p+t, max_seq-1). Each warp walks the
    block's rows (`walk_cols_64`: a tile of 32 rows loaded at once, scores by `lane_sums32`,
    the online softmax per lane) and writes its column's partial: no shared memory but the
    tile's 32 scores, one barrier a tile, no merge across warps. The K/V rows each warp reads
    are the other warps' too: the block's first reader brings them into L1, the rest hit it.
    A column with no row writes m = -inf, l = 0, o = 0 exactly, which the merge weighs by
    exp(-inf - M) = 0; the causal slice always holds row p, so M is finite.
    """
    pdl_wait()
    pdl_launch_dependents()  # the next kernel may launch now; it waits in its pdl_wait
    red = cuda.shared.array(TREE_SLOTS, numba.float32)                      # (simulator's trees)
    sc_sh = cuda.shared.array((2, MAX_COLS, VERIFY_TILE), numba.float32)    # [2, T, tile] scores
    od = cuda.local.array(DIMS_PER_LANE, numba.float32)                     # [dims] this lane's o[d]
    tid = cuda.threadIdx.x
    lane = tid % WARP
    T = q.shape[0]
    t = min(tid // WARP, T - 1)   # (a warp past T, never launched so, reads column T - 1)
    h = cuda.blockIdx.x
    s = cuda.blockIdx.y
    S = cuda.gridDim.y - 1
    hd = part_o.shape[3]
    p = pos[0]
    if s < S:  # a slice of the rows written before this step
        chunk = (p + S - 1) // S
        r0 = min(s * chunk, p)
        r1 = min(r0 + chunk, p)
    else:      # the causal block: this step's rows
        r0 = p
        r1 = min(p + T, k_cache.shape[0])
    last = min(r1, p + t + 1)     # the rows column t sees: [r0, last)
    if hd <= 64:  # uniform over the block
        m, l = walk_cols_64(q, k_cache, v_cache, h * hd, hd, t, r0, r1, last, scale, red, sc_sh, od)
    else:
        m, l = walk_cols_128(q, k_cache, v_cache, h * hd, hd, t, r0, r1, last, scale, red, sc_sh, od)
    if tid // WARP < T:
        for j in range(DIMS_PER_LANE):
            d = lane + j * WARP
            if d < hd:
                part_o[h, t, s, d] = od[j]
        if lane == 0:
            part_ml[h, t, s, 0] = m
            part_ml[h, t, s, 1] = l


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
    # (n_head, head_dim, max_seq, cases): a slice of more than one tile of 32 rows (the
    # rescale across tiles); head_dim 96 (the walk of 4 dims a lane, 3 of them live)
    "wide": (1, 96, 40, [(np.float32, 37, 1)]),
    # --quick (the shuffle path): p = 0 (the causal block alone) and a float16 cache at p = 9
    "quick": (0, 3),
    "tol": {"verify_partial": (1e-5, 64), "verify_merge": (1e-6, 16), "causal64": (1e-5, 64)},
    "why": "attn_partial's and attn_merge's (kernels/attention.py's CASES): the same sums per "
           "column; against float64 causal attention the partial's",
}
