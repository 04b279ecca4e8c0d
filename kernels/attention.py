"""Split-K decode attention: a partial softmax per slice of the context, then a merge.

Contents
  partial_grid, merge_grid, combine_grid  launch geometry; slice_bounds: the slicing
  attn_partial_twin, _make_walk           the twin; one warp's online softmax (walk_64, walk_128)
  partial_slice, partial_slice_at         one block's slice: its warps' walks, then their merge
  attn_partial                            block (h, s) writes the (m, l, o) of its slice
  attn_partial_len                        bug variant: the context length by value
  merge_elem, merge_weights, merge_elem_sh  the merge's device functions (udivmod beside them)
  attn_merge                              every head's slices merged into o [D]
  attn_combine                            merge + Wo projection + residual add in one kernel
  CASES                                   kernels/check.py's cases

The context length L = pos[0] + 1 is read from device memory when the kernel runs; `splits` =
gridDim.y is fixed in a captured node, so the slice length chunk = ceil(L / splits) grows with L.
An empty slice (s * chunk >= L) writes m = -inf, l = 0, o = 0; the merge weighs it by
exp(-inf - M) = 0 (slice 0 is never empty, so M is finite and no NaN appears).
"""
import math

import numba
import numpy as np
from numba import cuda

from kernels.registry import kernel
from kernels.matvec import WARP, matvec_residual_twin, row_dot
from kernels.pdl import pdl_launch_dependents, pdl_wait
from kernels.reduce import WARP_SUMS, warp_sums

MAX_HEAD_DIM = 128
DIMS_PER_LANE = MAX_HEAD_DIM // WARP      # 4: dims d = lane + 32j a lane holds
ATTN_WARPS = 4
ATTN_THREADS = ATTN_WARPS * WARP          # 128
ATTN_STEPS = WARP_SUMS                    # 8 timesteps per warp per pass (one warp_sums call)
ATTN_PASS = ATTN_WARPS * ATTN_STEPS       # 32 timesteps per block per pass
MAX_D = 1024            # attn_combine keeps the whole merged o [D] in shared memory
MERGE_MAX_PAIRS = 1024  # n_head * splits (head, slice) weights a block's merge holds in shared
MERGE_GROUP = 8         # slices whose loads an element's merge issues together
COMBINE_THREADS = 256
COMBINE_ROWS_PER_BLOCK = COMBINE_THREADS // WARP  # 8: one warp per row of Wo


def partial_grid(n_head: int, splits: int, head_dim: int):
    """(grid, block) for `attn_partial`: one block of ATTN_THREADS per (head, slice)."""
    if not 1 <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"head_dim {head_dim}: attn_partial needs 1 <= head_dim <= {MAX_HEAD_DIM}")
    return (n_head, splits), (ATTN_THREADS,)


def merge_grid(n_head: int, head_dim: int):
    """(grid, block) for `attn_merge`."""
    return (n_head,), (head_dim,)


def combine_grid(d_model: int):
    """(grid, block) for `attn_combine`: one warp per output row of Wo, 8 rows per block."""
    return ((d_model + COMBINE_ROWS_PER_BLOCK - 1) // COMBINE_ROWS_PER_BLOCK,), (COMBINE_THREADS,)


def slice_bounds(L: int, splits: int, s: int) -> tuple[int, int]:
    """Timesteps [t0, t1) of slice s when a context of L is cut into `splits` slices."""
    chunk = (L + splits - 1) // splits
    return min(s * chunk, L), min((s + 1) * chunk, L)


# ---------------------------------------------------------------- attn_partial

def _partial_twin(grid, block, q, k_cache, v_cache, L, part_o, part_ml, scale):
    n_head, splits, hd = part_o.shape                     # the geometry does not carry hd
    assert grid == (n_head, splits) and hd <= MAX_HEAD_DIM, "grid must be (n_head, splits)"
    scale = np.float32(scale)
    bounds = [slice_bounds(L, splits, s) for s in range(splits)]
    for h in range(n_head):
        cols = slice(h * hd, (h + 1) * hd)
        qh, ml, po = q[cols], part_ml[h], part_o[h]                          # [hd], [splits, ..]
        for s, (t0, t1) in enumerate(bounds):
            if t0 >= t1:  # empty slice
                ml[s] = (-np.inf, 0.0)
                po[s] = 0.0
                continue
            k = k_cache[t0:t1, cols].astype(np.float32)                      # [n, hd]
            v = v_cache[t0:t1, cols].astype(np.float32)                      # [n, hd]
            sc = k @ qh
            sc *= scale                                                      # [n] scale * (k @ q)
            m = sc.max()
            sc -= m
            p = np.exp(sc)                                                   # [n] exp(score - m)
            ml[s, 0] = m
            ml[s, 1] = p.sum(dtype=np.float32)
            po[s] = p @ v


def attn_partial_twin(grid, block, q, k_cache, v_cache, pos, part_o, part_ml, scale):
    _partial_twin(tuple(grid), block, q, k_cache, v_cache, int(pos[0]) + 1, part_o, part_ml, scale)


def _make_walk(dims: int):
    """The walk of one warp over its timesteps of a slice, for heads of head_dim <= 32 * dims
    (lane l holds d = l + 32j, j < dims). One function per dims, so a head of 64 runs code with
    2 dims per lane, not 4 of which 2 are masked (half the instructions to issue and fetch).

    A warp reads one timestep's K or V row of the head with consecutive lanes on consecutive d
    (coalesced). The block walks its slice in passes of ATTN_PASS = 32 timesteps; in a pass
    warp w owns timesteps tb + w + 4i, i < ATTN_STEPS = 8:
      1. it issues the loads of its 8 K rows and 8 V rows first;
      2. score_t = scale * (q . k_t): each lane's partial dot (fma over its dims in increasing
         d, from +0.0), then kernels/reduce.py's `warp_sums` (on a GPU 8 shuffle butterflies
         interleaved), so every lane holds all 8 scores;
      3. the pass's max is taken once over those 8 registers; the warp's (m, l, o[d]) is
         rescaled once by exp(m - m_new), then each timestep, in increasing t, adds
         p = exp(score - m_new): l += p, o[d] = fma(p, v_t[d], o[d]).
    """

    @cuda.jit(device=True)
    def walk(q, k_cache, v_cache, base, hd, t0, t1, scale, red, o_sh, ml_sh):
        """Warp w's online softmax over timesteps t0 + w + 4i, i >= 0, below t1; leaves its
        (m, l) in ml_sh[w] and its o[d] in o_sh[w, d]. Every thread of the block must call it."""
        tid = cuda.threadIdx.x
        lane = tid % WARP
        w = tid // WARP
        qd = cuda.local.array(dims, numba.float32)                  # [dims] q[d]
        od = cuda.local.array(dims, numba.float32)                  # [dims] this warp's o[d]
        kt = cuda.local.array((ATTN_STEPS, dims), numba.float32)    # [steps, dims] k_t[d]
        vt = cuda.local.array((ATTN_STEPS, dims), numba.float32)    # [steps, dims] v_t[d]
        sc = cuda.local.array(ATTN_STEPS, numba.float32)            # [steps] scores
        for j in range(dims):
            d = lane + j * WARP
            qd[j] = q[base + d] if d < hd else numba.float32(0.0)
            od[j] = numba.float32(0.0)
        m = numba.float32(-math.inf)
        l = numba.float32(0.0)
        for tb in range(t0, t1, ATTN_PASS):  # the same passes in every warp (block-wide trees)
            for i in range(ATTN_STEPS):      # every load of the pass first
                t = tb + w + i * ATTN_WARPS
                for j in range(dims):
                    d = lane + j * WARP
                    if t < t1 and d < hd:
                        tu = numba.uint64(t)     # unsigned: no negative-index wraparound code
                        du = numba.uint64(base + d)
                        kt[i, j] = numba.float32(k_cache[tu, du])
                        vt[i, j] = numba.float32(v_cache[tu, du])
                    else:
                        kt[i, j] = numba.float32(0.0)
                        vt[i, j] = numba.float32(0.0)
            for i in range(ATTN_STEPS):      # this lane's part of each q . k_t
                dot = numba.float32(0.0)
                for j in range(dims):
                    dot = cuda.fma(qd[j], kt[i, j], dot)
                sc[i] = dot
            warp_sums(sc, tid, red)          # every lane now holds all 8 dot products
            m_new = m
            for i in range(ATTN_STEPS):      # the pass's max, once, over registers
                if tb + w + i * ATTN_WARPS < t1:
                    sc[i] = scale * sc[i]
                    m_new = max(m_new, sc[i])
            if m_new != -math.inf:           # the warp has seen a timestep (uniform in the warp)
                alpha = math.exp(m - m_new)  # rescale the old sums; exp(-inf) = 0 at the first
                l = l * alpha
                for j in range(dims):
                    od[j] = od[j] * alpha
                for i in range(ATTN_STEPS):  # timesteps in increasing t
                    if tb + w + i * ATTN_WARPS < t1:
                        p = math.exp(sc[i] - m_new)
                        l = l + p
                        for j in range(dims):
                            od[j] = cuda.fma(p, vt[i, j], od[j])
                m = m_new
        if lane == 0:
            ml_sh[w, 0] = m
            ml_sh[w, 1] = l
        for j in range(dims):
            d = lane + j * WARP
            if d < hd:
                o_sh[w, d] = od[j]

    return walk


walk_64 = _make_walk(2)                       # head_dim <= 64 (the model's)
walk_128 = _make_walk(DIMS_PER_LANE)          # head_dim <= 128


@cuda.jit(device=True)
def partial_slice(q, k_cache, v_cache, L, part_o, part_ml, scale, red, o_sh, ml_sh):
    """Block (h, s): online softmax over its slice of a context of L timesteps.

    red: shared [ATTN_STEPS, ATTN_THREADS] (the simulator's trees), o_sh: shared
    [ATTN_WARPS, MAX_HEAD_DIM], ml_sh: shared [ATTN_WARPS, 2]. Every thread must call it.
    """
    partial_slice_at(q, k_cache, v_cache, L, part_o, part_ml, scale, red, o_sh, ml_sh,
                     cuda.blockIdx.x, cuda.blockIdx.y, cuda.gridDim.y)


@cuda.jit(device=True)
def partial_slice_at(q, k_cache, v_cache, L, part_o, part_ml, scale, red, o_sh, ml_sh, h, s, splits):
    """`partial_slice` for the item (head h, slice s of `splits`) named by the caller, not by
    the block's index (kernels/fused.py's attn_fused_grid runs its partials on the first
    n_head * splits blocks of a 1-D grid). The same arithmetic, so the same bits.

    The 4 warps' states are merged in warp order 0..3 through shared memory (one barrier):
    M = max_w m_w, c_w = exp(m_w - M), o[d] = fma chain of o_w[d] * c_w, l = fma chain of
    l_w * c_w, all from +0.0. Nothing depends on timing, so the bits are the same every run. A
    warp that saw no timestep keeps m = -inf, l = 0, o = 0 and weighs c_w = 0; an empty slice
    writes m = -inf, l = 0, o = 0 exactly."""
    tid = cuda.threadIdx.x
    hd = part_o.shape[2]
    chunk = (L + splits - 1) // splits
    t0 = min(s * chunk, L)
    t1 = min(t0 + chunk, L)
    if hd <= 64:  # uniform over the block
        walk_64(q, k_cache, v_cache, h * hd, hd, t0, t1, scale, red, o_sh, ml_sh)
    else:
        walk_128(q, k_cache, v_cache, h * hd, hd, t0, t1, scale, red, o_sh, ml_sh)
    cuda.syncthreads()
    # merge the warps' states, in warp order
    M = ml_sh[0, 0]
    for ww in range(1, ATTN_WARPS):
        M = max(M, ml_sh[ww, 0])
    cw = cuda.local.array(ATTN_WARPS, numba.float32)                     # [warps] exp(m_w - M)
    for ww in range(ATTN_WARPS):
        cw[ww] = math.exp(ml_sh[ww, 0] - M) if M != -math.inf else numba.float32(0.0)
    for d in range(tid, hd, ATTN_THREADS):
        acc = numba.float32(0.0)
        for ww in range(ATTN_WARPS):
            acc = cuda.fma(o_sh[ww, d], cw[ww], acc)
        part_o[h, s, d] = acc
    if tid == 0:
        lsum = numba.float32(0.0)
        for ww in range(ATTN_WARPS):
            lsum = cuda.fma(ml_sh[ww, 1], cw[ww], lsum)
        part_ml[h, s, 0] = M
        part_ml[h, s, 1] = lsum


_PARTIAL_SIG = ("void(float32[::1], {kv}[:, ::1], {kv}[:, ::1], int32[::1], "
                "float32[:, :, ::1], float32[:, :, ::1], float32)")


@kernel(_PARTIAL_SIG.format(kv="float32"), _PARTIAL_SIG.format(kv="float16"),
        twin=attn_partial_twin, reads=(0, 1, 2, 3), writes=(4, 5))
def attn_partial(q, k_cache, v_cache, pos, part_o, part_ml, scale):
    """Online softmax of head h over slice s; grid (n_head, splits), block (ATTN_THREADS,).

    q [D], k_cache/v_cache [max_seq, D], pos [1], part_o [n_head, splits, hd],
    part_ml [n_head, splits, 2] = (running max m, sum l of exp(score - m)).
    The context length L = pos[0] + 1 is read from device memory at run time.

    PDL: its dependents are triggered at the END, not right after the wait as the other kernels
    here do (kernels/pdl.py, LATE_TRIGGER). At long context the grid (n_head, splits) fills
    nearly every SM (128 blocks of 132 on the H200 at splits 32) and runs long; triggered first,
    attn_combine was launched while only the few SMs it left free had room, and the edge into
    attn_combine cost 15.1 us per step at context 900 where it saved 1.2 at 64
    (data/gpu/pdl_context_early.json against pdl_context.json: the step's chain with every launch
    programmatic but one kernel's; `decode-lab record pdl_context`).
    """
    pdl_wait()
    red = cuda.shared.array((ATTN_STEPS, ATTN_THREADS), numba.float32)  # the simulator's trees
    o_sh = cuda.shared.array((ATTN_WARPS, MAX_HEAD_DIM), numba.float32)  # [warps, hd] o per warp
    ml_sh = cuda.shared.array((ATTN_WARPS, 2), numba.float32)            # [warps, 2] (m, l)
    partial_slice(q, k_cache, v_cache, pos[0] + 1, part_o, part_ml, scale, red, o_sh, ml_sh)
    pdl_launch_dependents()  # the next kernel may launch once every block has its partials


# ---- deliberate-bug variant (lab/engine/bugs.py, LAB_BUG_CTX_BY_VALUE) ---------------------------
# The context length arrives BY VALUE from the host: a captured graph freezes it, so every
# replay attends over the capture-time context and ignores the newest keys.

def attn_partial_len_twin(grid, block, q, k_cache, v_cache, ctx_len, part_o, part_ml, scale):
    _partial_twin(tuple(grid), block, q, k_cache, v_cache, int(ctx_len), part_o, part_ml, scale)


_PARTIAL_LEN_SIG = ("void(float32[::1], {kv}[:, ::1], {kv}[:, ::1], int32, "
                    "float32[:, :, ::1], float32[:, :, ::1], float32)")


@kernel(_PARTIAL_LEN_SIG.format(kv="float32"), _PARTIAL_LEN_SIG.format(kv="float16"),
        twin=attn_partial_len_twin, reads=(0, 1, 2), writes=(4, 5))
def attn_partial_len(q, k_cache, v_cache, ctx_len, part_o, part_ml, scale):
    """attn_partial with the context length passed by value (a loop bound a graph freezes)."""
    pdl_wait()
    pdl_launch_dependents()  # the next kernel may launch now; it waits in its pdl_wait
    red = cuda.shared.array((ATTN_STEPS, ATTN_THREADS), numba.float32)
    o_sh = cuda.shared.array((ATTN_WARPS, MAX_HEAD_DIM), numba.float32)
    ml_sh = cuda.shared.array((ATTN_WARPS, 2), numba.float32)
    partial_slice(q, k_cache, v_cache, ctx_len, part_o, part_ml, scale, red, o_sh, ml_sh)


# ---------------------------------------------------------------- merge

@cuda.jit(device=True)
def merge_elem(part_o, part_ml, h, d):
    """Merged, normalised o[h*hd + d] from the splits of head h, s in order 0..splits-1, read
    straight from global memory (one element, no shared memory, no barrier).

    part_o [n_head, splits, hd], part_ml [n_head, splits, 2]. The same arithmetic in the same
    order as merge_weights + merge_elem_sh, so the same bits (kernels/fused.py relies on it).
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


MERGE_BATCH = 32   # merge_elem_batch: the slices whose (m, l, o) loads are in flight together


@cuda.jit(device=True)
def merge_elem_batch(part_o, part_ml, h, d):
    """`merge_elem` (merge_weights + merge_elem_sh's bits) with its loads batched: m, l and o of
    the first MERGE_BATCH slices are loaded together, one round trip to memory for the whole
    merge where splits <= MERGE_BATCH (the plan's MAX_SPLITS); further slices cost a round
    for their maxima and one for their terms. No shared memory, no barrier.

    The same operations in the same order: M = max over s in order, w_s = exp(m_s - M), then
    L and acc as fma chains over s = 0..splits-1 from +0.0, o = acc / L. Used by the persistent
    step's merge1 variants (kernels/persistent.py), where merge_weights' two barriers and a
    round trip for the weights before the elements' loads sat on every layer's path."""
    splits = part_ml.shape[1]
    hu = numba.uint64(h)   # unsigned indices: no negative-index wraparound code
    du = numba.uint64(d)
    mv = cuda.local.array(MERGE_BATCH, numba.float32)   # [batch] m_s
    lv = cuda.local.array(MERGE_BATCH, numba.float32)   # [batch] l_s
    ov = cuda.local.array(MERGE_BATCH, numba.float32)   # [batch] o_s[d]
    for j in range(MERGE_BATCH):                        # every load of the batch first
        if j < splits:
            su = numba.uint64(j)
            mv[j] = part_ml[hu, su, 0]
            lv[j] = part_ml[hu, su, 1]
            ov[j] = part_o[hu, su, du]
    M = mv[0]
    for j in range(1, MERGE_BATCH):
        if j < splits:
            M = max(M, mv[j])
    s = MERGE_BATCH
    while s < splits:                                   # slices past the batch: their maxima
        M = max(M, part_ml[hu, numba.uint64(s), 0])
        s += 1
    L = numba.float32(0.0)
    acc = numba.float32(0.0)
    for j in range(MERGE_BATCH):
        if j < splits:
            w = math.exp(mv[j] - M)                     # 0 for an empty slice (m = -inf)
            L = cuda.fma(lv[j], w, L)
            acc = cuda.fma(ov[j], w, acc)
    s = MERGE_BATCH
    while s < splits:
        su = numba.uint64(s)
        w = math.exp(part_ml[hu, su, 0] - M)
        L = cuda.fma(part_ml[hu, su, 1], w, L)
        acc = cuda.fma(part_o[hu, su, du], w, acc)
        s += 1
    return acc / L


@cuda.jit(device=True)
def udivmod(a, b):
    """(a // b, a % b) for a >= 0, b > 0 by ONE unsigned division: Python's signed floor
    division costs a 64-bit division and sign fix-ups each, // and % one each."""
    q = numba.int64(numba.uint64(a) // numba.uint64(b))
    return q, a - q * b


@cuda.jit(device=True)
def merge_weights(part_ml, h0, nh, ml_sh, w_sh):
    """The merge weights of heads h0 .. h0+nh-1 into shared memory, once per block: for pair
    p = (h - h0) * splits + s, ml_sh[p] = (m, l) of slice s and w_sh[p] = exp(m - M_h),
    M_h = max_s m (0 for an empty slice). ml_sh [>= nh*splits, 2], w_sh [>= nh*splits].
    Every thread of the block must call it (two barriers; both arrays are ready on return).
    """
    nt = cuda.blockDim.x
    splits = part_ml.shape[1]
    n = nh * splits
    p = cuda.threadIdx.x
    while p < n:  # (while, not range: a runtime step costs range a 64-bit division)
        hh, s = udivmod(p, splits)
        ml_sh[p, 0] = part_ml[h0 + hh, s, 0]
        ml_sh[p, 1] = part_ml[h0 + hh, s, 1]
        p += nt
    cuda.syncthreads()
    p = cuda.threadIdx.x
    while p < n:
        hh, s = udivmod(p, splits)
        first = p - s                          # the head's slice 0
        M = ml_sh[first, 0]
        for s in range(1, splits):             # max is exact: any order gives these bits
            M = max(M, ml_sh[first + s, 0])
        w_sh[p] = math.exp(ml_sh[p, 0] - M)
        p += nt
    cuda.syncthreads()


@cuda.jit(device=True)
def merge_elem_sh(part_o, ml_sh, w_sh, p0, h, d):
    """Merged, normalised o[h*hd + d] from the weights `merge_weights` left in shared memory;
    p0: the pair index of head h's slice 0. L = fma chain of l_s * w_s and acc = fma chain of
    o_s[d] * w_s over s = 0..splits-1 (from +0.0), o = acc / L; the loads of MERGE_GROUP = 8
    slices are issued together.

    Instruction count matters as much as loads here: the merge unrolled 32 slices deep (masked
    past `splits`), with signed 64-bit index and division arithmetic, compiles to 2808 SASS
    instructions and measured 4.1 us per attn_merge node at context 64 on the H200, against 1.5
    for a plain loop. Hence groups of 8, unsigned indices in the hot loads (no negative-index
    wraparound code), `udivmod` (one unsigned division for // and %), and `while` loops where
    `range` would divide by a runtime step."""
    splits = part_o.shape[1]
    hu = numba.uint64(h)   # unsigned indices: no negative-index wraparound code
    du = numba.uint64(d)
    L = numba.float32(0.0)
    acc = numba.float32(0.0)
    ov = cuda.local.array(MERGE_GROUP, numba.float32)  # [group] part_o[h, s, d]
    for s0 in range(0, splits, MERGE_GROUP):
        for j in range(MERGE_GROUP):                   # the group's loads first ...
            if s0 + j < splits:
                ov[j] = part_o[hu, numba.uint64(s0 + j), du]
        for j in range(MERGE_GROUP):                   # ... then the chains, s in order
            if s0 + j < splits:
                pu = numba.uint64(p0 + s0 + j)
                w = w_sh[pu]
                L = cuda.fma(ml_sh[pu, 1], w, L)
                acc = cuda.fma(ov[j], w, acc)
    return acc / L


def attn_merge_twin(grid, block, part_o, part_ml, o):
    assert part_ml.shape[1] <= MERGE_MAX_PAIRS, "attn_merge holds at most MERGE_MAX_PAIRS slices"
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
    ml_sh = cuda.shared.array((MERGE_MAX_PAIRS, 2), numba.float32)  # [splits, 2] (m, l)
    w_sh = cuda.shared.array(MERGE_MAX_PAIRS, numba.float32)        # [splits] weights
    h = cuda.blockIdx.x
    hd = part_o.shape[2]
    merge_weights(part_ml, h, 1, ml_sh, w_sh)
    d = cuda.threadIdx.x
    while d < hd:
        o[h * hd + d] = merge_elem_sh(part_o, ml_sh, w_sh, 0, h, d)
        d += cuda.blockDim.x


# ---------------------------------------------------------------- combine

def attn_combine_twin(grid, block, part_o, part_ml, Wo, x):
    # literally the two-kernel path: the contract is bitwise equality with it
    n_head, splits, hd = part_o.shape
    assert n_head * hd <= MAX_D and n_head * splits <= MERGE_MAX_PAIRS, "attn_combine's shared limits"
    o = np.empty(n_head * hd, dtype=np.float32)              # [D]
    attn_merge_twin((n_head,), (hd,), part_o, part_ml, o)
    matvec_residual_twin(grid, block, Wo, o, x)


@kernel("void(float32[:, :, ::1], float32[:, :, ::1], float32[:, ::1], float32[::1])",
        twin=attn_combine_twin, reads=(0, 1, 2, 3), writes=(3,))
def attn_combine(part_o, part_ml, Wo, x):
    """x[r] += Wo[r] . merge(part_o, part_ml); Wo [D, D], x [D]; grid ceil(D/8), block 256.

    Contract: bit-identical to `attn_merge` then `matvec_residual(Wo, o, x)`: it calls the same
    device functions (`merge_weights`, `merge_elem_sh`, `row_dot`) in the same order and rounds
    o to float32 at the same point. Warp w of block b owns row 8b + w of Wo (COMBINE_THREADS =
    256 = 8 warps). Every block merges all D values into shared memory (redundant across
    blocks, but it saves a launch and a round trip of o through global memory); wider blocks
    halve the blocks that pay it, and the weights cost n_head * splits exps per block.
    Limits: D <= MAX_D, n_head * splits <= MERGE_MAX_PAIRS.
    """
    pdl_wait()
    pdl_launch_dependents()  # the next kernel may launch now; it waits in its pdl_wait
    o_sh = cuda.shared.array(MAX_D, numba.float32)                  # [D] merged attention output
    ml_sh = cuda.shared.array((MERGE_MAX_PAIRS, 2), numba.float32)  # [n_head * splits, 2] (m, l)
    w_sh = cuda.shared.array(MERGE_MAX_PAIRS, numba.float32)        # [n_head * splits] weights
    red = cuda.shared.array(COMBINE_THREADS, numba.float32)         # [threads] (simulator's tree)
    tid = cuda.threadIdx.x
    n_head = part_o.shape[0]
    splits = part_o.shape[1]
    hd = part_o.shape[2]
    merge_weights(part_ml, 0, n_head, ml_sh, w_sh)
    for i in range(tid, n_head * hd, COMBINE_THREADS):
        h, d = udivmod(i, hd)
        o_sh[i] = merge_elem_sh(part_o, ml_sh, w_sh, h * splits, h, d)  # f32, like attn_merge's o
    cuda.syncthreads()
    r = cuda.blockIdx.x * COMBINE_ROWS_PER_BLOCK + tid // WARP
    dot = row_dot(Wo, r, o_sh, tid, red)
    if tid % WARP == 0 and r < x.shape[0]:
        x[r] = x[r] + dot


# ---- the cases kernels/check.py runs (c: the dims of one of its tiny models)
CASES = {
    # (cache dtype, pos, splits). The first tiny model: L = 1 and L = max_seq at every splits,
    # and float16 caches; the others: one long context, several slices, a float16 cache
    "first": lambda c: ([(np.float32, p, s) for p in (0, c["max_seq"] - 1) for s in (1, 2, 3, 5)]
                        + [(np.float16, c["max_seq"] - 1, 1), (np.float16, 6, 2)]),
    "other": lambda c: [(np.float32, c["max_seq"] - 1, 1), (np.float32, 7, 3),
                        (np.float16, c["max_seq"] - 1, 2)],
    "empty": (np.float32, 1, 5),   # splits > L: empty slices (pos 0 above has them too)
    # merge and combine on made-up partials: more slices than MERGE_GROUP (two load groups),
    # the slices from the second number on empty (attn_partial at 40 splits is slow to simulate)
    "made_up": (40, 30),
    # attn_partial only, at shapes the tiny models miss: slices longer than one pass of
    # ATTN_PASS = 32 timesteps (the online rescale across passes), head_dim 40 (lanes past hd
    # in a lane's second dim) and 128 (every dim of every lane). (dtype, pos, splits) per case.
    "extra": (dict(n_head=2, hd=40, max_seq=72, cases=[(np.float32, 71, 1), (np.float16, 66, 2)]),
              dict(n_head=1, hd=128, max_seq=40, cases=[(np.float32, 39, 1)])),
    # --quick (the shuffle path): one case per code path, per tiny model: several slices, a
    # float16 cache, empty slices (splits > L); the extra shapes' first cases; the second
    # model's one case (an odd head count, D not a multiple of the rows per block: the merge
    # and combine's row tail)
    "quick": ([(np.float32, 15, 3), (np.float16, 6, 2), (np.float32, 1, 5)],
              [(np.float32, 11, 1)]),
    "tol": {"attn_partial": (1e-5, 64), "attn_merge": (1e-6, 16), "attn_combine": (1e-5, 16)},
    "why": "partial: hd-term dots, exp, sums of <= L terms with an online rescale; values O(1) "
           "and L <= 128 keep the relative error below ~(hd + L + 8) eps: k = 64, atol 1e-5 "
           "for cancelling o entries. merge: <= splits terms and a divide: k = 16. combine: the "
           "merge and a D-term dot (kernels/matvec.py's CASES): atol 1e-5",
}
