"""The fused decode step's kernels (LAB_FUSION=1): 18 launches per token instead of 37.

Contents
  geometry                qkv_grid, lm_head_grid, project_grid, attention_grid, grid_tail_grid
  last block done         head_tail (its counts and elections: kernels/sync.py's
                          arrive_last, count_arrival, wait_arrivals)
  twins' helpers          _normed_rows, project_heads
  norm_qkv_rope           RMSNorm folded into the qkv projection; RoPE and the KV append after
  attn_fused              partials, merge, Wo and residual in one launch, the tail over heads
                          (LAB_ATTN_TAIL=heads)
  attn_fused_grid         attn_partial and attn_combine as two kinds of block of one launch
                          (LAB_ATTN_TAIL=grid, the default)
  norm_swiglu             RMSNorm folded into the gate/up projections + SwiGLU
  norm_lm_head_argmax     the final RMSNorm folded into the LM head; the last block picks the
                          token and advances the position
  CASES                   kernels/check.py's cases

The norm is folded into each row's dot (kernels/fused_device.py's `xw_dot2`: why and its
price there). The down projection + residual stays kernels/matvec.py's `matvec_residual`;
attn_fused's split form (LAB_SPLIT_COMBINE=1) is kernels/fused_split.py.
"""
import math

import numba
import numpy as np
from numba import cuda

from kernels.registry import kernel
from kernels.attention import (ATTN_STEPS, ATTN_WARPS, MAX_D, MERGE_MAX_PAIRS, attn_combine_twin,
                               attn_merge_twin, attn_partial_twin, merge_elem, merge_elem_sh,
                               merge_weights, partial_slice_at, udivmod)
from kernels.attention import ATTN_THREADS as PARTIAL_THREADS
from kernels.fused_device import HEAD_ROWS, head_dots, inv_rms, slice_partial, xw_dot, xw_dot2
from kernels.matvec import (MATVEC_ROWS_PER_BLOCK, MATVEC_THREADS, ROW_UNROLL, row_dot_loaded,
                            row_load)
from kernels.matvec import grid_for as rows_grid
from kernels.pdl import pdl_launch_dependents, pdl_wait
from kernels.position import advance_twin
from kernels.reduce import BLOCK_THREADS, WARP
from kernels.rope import rope_rows
from kernels.sample import ARGMAX_THREADS, argmax_next_twin, pick_next
from kernels.sync import arrive_last, count_arrival, wait_arrivals

__all__ = ["norm_qkv_rope", "attn_fused", "attn_fused_grid", "norm_swiglu", "norm_lm_head_argmax",
           "rows_grid"]

QKV_THREADS = 128                 # norm_qkv_rope: a warp per rotate-half pair, 4 per block
QKV_WARPS = QKV_THREADS // WARP
LM_THREADS = ARGMAX_THREADS       # norm_lm_head_argmax: pick_next's block_argmax needs 256
LM_ROWS = LM_THREADS // WARP      # a warp per logit: 8 per block
assert LM_THREADS == BLOCK_THREADS
MAX_HEAD_DIM = 128    # a head's rows, a tile of scores: shared arrays of this size
MAX_THREADS = 1024    # CUDA's limit per block: attn_fused's scratch is sized for it
ATTN_THREADS = 512    # attn_fused's block, when head_dim allows (attention_grid): ptxas (CUDA
                      # 13.0, sm_90, numba-cuda 0.30.4) gives attn_fused 122 registers per thread
                      # and attn_partial_wide 118, so 512 threads fit a block's 64K registers
                      # (128 per thread after rounding: none to spare); 1024 would not


def _pow2_at_least(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


# ---- launch geometry --------------------------------------------------------------------------
def qkv_grid(d_model: int, parts: int = 3):
    """(grid, block) for `norm_qkv_rope` over `parts` of q, k, v: a warp per rotate-half pair
    of rows (d_model / 2 pairs per part), QKV_WARPS pairs per block."""
    pairs = parts * d_model // 2
    return ((pairs + QKV_WARPS - 1) // QKV_WARPS,), (QKV_THREADS,)


def lm_head_grid(vocab: int):
    """(grid, block) for `norm_lm_head_argmax`: a warp per logit, LM_ROWS per block."""
    return ((vocab + LM_ROWS - 1) // LM_ROWS,), (LM_THREADS,)


def project_grid(d_model: int):
    """(grid, block) for `attn_project_heads`: a warp per row of Wo (matvec's geometry)."""
    return rows_grid(d_model)


def attention_threads(head_dim: int, target: int = ATTN_THREADS) -> int:
    """attn_fused's block size: the largest multiple of lcm(32, head_dim) up to `target` (the
    block's threads are groups of head_dim lanes, and whole warps for the tail's rows), and at
    least the power of two at or above head_dim (the tile's max tree). A head_dim that needs a
    larger block is refused: more threads than ATTN_THREADS would not have the registers."""
    if not 2 <= head_dim <= MAX_HEAD_DIM or head_dim % 2:
        raise ValueError(f"head_dim {head_dim}: attn_fused needs an even head_dim <= {MAX_HEAD_DIM}")
    step = WARP * head_dim // math.gcd(WARP, head_dim)
    threads = target // step * step
    if threads < max(step, _pow2_at_least(head_dim)):
        raise ValueError(f"head_dim {head_dim}: attn_fused's block would need more than {target} "
                         f"threads (a multiple of lcm(32, head_dim) = {step})")
    return threads


def attention_grid(n_head: int, splits: int, head_dim: int, threads: int | None = None):
    """(grid, block) for `attn_fused` and `attn_partial_wide`: one block per (head, split),
    `attention_threads` each (`threads` overrides it: a multiple of 32 and of head_dim, the
    kernel tests use small ones)."""
    t = attention_threads(head_dim) if threads is None else threads
    if t % WARP or t % head_dim or t < _pow2_at_least(head_dim) or t > MAX_THREADS:
        raise ValueError(f"{t} threads: attn_fused needs a multiple of {WARP} and of head_dim "
                         f"{head_dim}, at least {_pow2_at_least(head_dim)}, at most {MAX_THREADS}")
    return (n_head, splits), (t,)


TAIL_ROWS = PARTIAL_THREADS // WARP   # attn_fused_grid: rows of Wo per tail block, a warp each


def grid_tail_grid(n_head: int, splits: int, d_model: int):
    """(grid, block) for `attn_fused_grid`: n_head * splits partial blocks, then
    ceil(d_model / TAIL_ROWS) tail blocks, in one 1-D grid of attn_partial's block size."""
    return (n_head * splits + (d_model + TAIL_ROWS - 1) // TAIL_ROWS,), (PARTIAL_THREADS,)


def counter_slots(n_head: int) -> int:
    """attn_fused's counter slots per launch site: one per head, one for the heads."""
    return n_head + 1


# ---- device functions -------------------------------------------------------------------------
@cuda.jit(device=True)
def head_tail(part_o, part_ml, Wo, x, head_out, counter, h, o_sh, red, flag):
    """The heads tail of head h, in the block elected last of its partials (every thread of it
    calls): merge the head (attn_merge's bits), write head_out[h] = Wo[:, head h] @ o_h, and, in
    the last head's block to get here (counter[n_head]), add the heads in head order to x.
    attn_fused's tail and the persistent step's. o_sh: shared [hd]; red: shared [threads];
    flag: shared [1] int32.

    Slots 0 .. n_head - 1 count the blocks of each head (splits arrivals each), slot n_head the
    heads. The projection is `head_dots` (HEAD_ROWS rows per warp in flight, hd terms per dot);
    the sum is x[r] + (((head_out[0, r] + head_out[1, r]) + ...) + head_out[H-1, r]). Why over
    heads: the whole tail (every head's merge and all of Wo) in the one last block runs on one
    SM, measured 17.3-23.6 us per node on the H200 against 5.6-8.1 us for attn_partial +
    attn_combine; here n_head blocks project a quarter of Wo each (at 4 heads), for a second
    count and election and a [n_head, D] scratch. Projecting each slice's unnormalised o_s would
    cost splits times the projection work and Wo traffic."""
    tid = cuda.threadIdx.x
    T = cuda.blockDim.x
    hd = part_o.shape[2]
    H = part_o.shape[0]
    D = x.shape[0]
    for d in range(tid, hd, T):                         # the head's merge: attn_merge's bits
        o_sh[d] = merge_elem(part_o, part_ml, h, d)     # rounded to f32, as there
    cuda.syncthreads()
    warps = T // WARP
    dots = cuda.local.array(HEAD_ROWS, numba.float32)
    for r0 in range(0, D, HEAD_ROWS * warps):           # warp w: rows r0 + w + i * warps
        r = r0 + tid // WARP
        head_dots(Wo, r, warps, h * hd, hd, o_sh, tid, red, dots)
        for i in range(HEAD_ROWS):
            if tid % WARP == 0 and r + i * warps < D:
                head_out[h, r + i * warps] = dots[i]
    if arrive_last(counter, H, H, flag, True):         # the last head: sum in head order
        for r in range(tid, D, T):
            s = head_out[0, r]
            for hh in range(1, H):
                s = s + head_out[hh, r]
            x[r] = x[r] + s


# ---- the twins' shared pieces -----------------------------------------------------------------
def _normed_rows(W, x, w, eps):
    """W @ rmsnorm(x, w) as the fused kernels fold it: (W @ (x * w)) * inv, float32."""
    x = np.asarray(x, np.float32)
    ss = np.sum(x * x, dtype=np.float32)
    inv = np.float32(1.0) / np.sqrt(ss / np.float32(x.shape[0]) + np.float32(eps), dtype=np.float32)
    return (W @ (x * w)) * inv


def project_heads(Wo, o, hd, head_out):
    """head_out[h] = Wo[:, h*hd:(h+1)*hd] @ o[h*hd:(h+1)*hd]; returns their sum in head order."""
    for h in range(head_out.shape[0]):
        head_out[h] = Wo[:, h * hd:(h + 1) * hd] @ o[h * hd:(h + 1) * hd]
    s = head_out[0].copy()
    for h in range(1, head_out.shape[0]):
        s = s + head_out[h]
    return s


# ---- norm_qkv_rope ----------------------------------------------------------------------------
def norm_qkv_rope_twin(grid, block, x, w_norm, eps, W, part0, pos, cos, sin, q, k_cache, v_cache):
    D = x.shape[0]
    hd = 2 * cos.shape[1]
    n_head = D // hd
    y = _normed_rows(W, x, w_norm, eps)                             # [parts * D]
    p = int(pos[0])
    for j in range(W.shape[0] // D):
        part = int(part0) + j
        rows = y[j * D:(j + 1) * D]
        if part == 2:
            v_cache[p] = rows                                       # casts to the cache dtype
            continue
        rotated = rope_rows(rows.reshape(n_head, hd), cos[p], sin[p]).reshape(D)
        if part == 0:
            q[:] = rotated
        else:
            k_cache[p] = rotated


_QKV_SIG = ("void(float32[::1], float32[::1], float32, float32[:, ::1], int32, int32[::1], "
            "float32[:, ::1], float32[:, ::1], float32[::1], {kv}[:, ::1], {kv}[:, ::1])")


@kernel(_QKV_SIG.format(kv="float32"), _QKV_SIG.format(kv="float16"),
        twin=norm_qkv_rope_twin, reads=(0, 1, 3, 5, 6, 7), writes=(8, 9, 10))
def norm_qkv_rope(x, w_norm, eps, W, part0, pos, cos, sin, q, k_cache, v_cache):
    """(q | k | v) = W @ rmsnorm(x, w_norm), q and k rotated; k and v to row pos[0].

    x, w_norm [D]; W [parts*D, D]: rows of wqkv from part `part0` (0 q, 1 k, 2 v) on; pos [1];
    cos/sin [max_seq, hd/2]; q [D]; k_cache/v_cache [max_seq, D]. Grid qkv_grid(D, parts),
    block (QKV_THREADS,): warp g owns pair g % (D/2) of part part0 + g // (D/2): in head
    (g % (D/2)) // (hd/2), rows j and j + hd/2, j = g % (hd/2).

    A warp owns one rotate-half pair (rows j and j + hd/2, which RoPE needs together), so the
    rotation happens in the warp's registers (no shared memory, no barrier). `part0` lets the
    q part and the k/v part be two launches on two streams (LAB_OVERLAP=1).
    """
    pdl_wait()
    pdl_launch_dependents()  # the next kernel may launch now; it waits in its pdl_wait
    red = cuda.shared.array(QKV_THREADS, numba.float32)     # [threads] (simulator's tree)
    tid = cuda.threadIdx.x
    lane = tid % WARP
    D = x.shape[0]
    half = cos.shape[1]
    hd = 2 * half
    pair = cuda.blockIdx.x * QKV_WARPS + tid // WARP
    own = pair // (D // 2)                                  # this launch's part: 0 .. parts-1
    head = (pair % (D // 2)) // half
    j = pair % half
    lo_row = own * D + head * hd + j                        # rows lo_row and lo_row + half of W
    valid = own < W.shape[0] // D
    if not valid:
        lo_row = W.shape[0]                                 # no rows: the warp still reduces
    lo, hi, ss = xw_dot2(W, lo_row, W, lo_row + half, x, w_norm, tid, red)
    inv = inv_rms(ss, D, eps)
    lo = lo * inv
    hi = hi * inv
    if valid and lane < 2:                                  # lane 0 writes row j, lane 1 j + half
        p = pos[0]
        part = part0 + own
        i = head * hd + j + lane * half
        if part == 2:
            v_cache[p, i] = lo if lane == 0 else hi         # setitem casts to the cache dtype
        else:
            c = cos[p, j]
            s = sin[p, j]
            val = lo * c - hi * s if lane == 0 else hi * c + lo * s   # rope.py's rotate-half
            if part == 0:
                q[i] = val
            else:
                k_cache[p, i] = val


# ---- attn_fused -------------------------------------------------------------------------------
def attn_fused_twin(grid, block, q, k_cache, v_cache, pos, part_o, part_ml, scale, Wo, x,
                    head_out, counter):
    # the split form's three twins, composed: partials, merge, per-head projections summed in
    # head order + the residual; the counter is 0 before and after, as on the device
    n_head, splits, hd = part_o.shape
    attn_partial_twin(grid, block, q, k_cache, v_cache, pos, part_o, part_ml, scale)
    o = np.empty(n_head * hd, np.float32)                    # [D]
    attn_merge_twin((n_head,), (hd,), part_o, part_ml, o)
    x[:] = x + project_heads(Wo, o, hd, head_out)


_ATTN_SIG = ("void(float32[::1], {kv}[:, ::1], {kv}[:, ::1], int32[::1], float32[:, :, ::1], "
             "float32[:, :, ::1], float32, float32[:, ::1], float32[::1], float32[:, ::1], "
             "int32[::1])")


@kernel(_ATTN_SIG.format(kv="float32"), _ATTN_SIG.format(kv="float16"),
        twin=attn_fused_twin, reads=(0, 1, 2, 3, 4, 5, 7, 8, 9, 10), writes=(4, 5, 8, 9, 10))
def attn_fused(q, k_cache, v_cache, pos, part_o, part_ml, scale, Wo, x, head_out, counter):
    """x += Wo @ attention(q, cache[:pos[0] + 1]): partials, merge, projection, residual.

    q [D], k_cache/v_cache [max_seq, D], pos [1], part_o [n_head, splits, hd],
    part_ml [n_head, splits, 2], Wo [D, D], x [D], head_out [n_head, D] (scratch),
    counter [n_head + 1] int32 (0 between launches). Grid (n_head, splits), block
    attention_threads(hd). Every block writes its slice's partials; the last block of each head
    merges the head and writes its projection head_out[h] = Wo[:, head h] @ o_h; the last of
    those adds the heads in head order to x (`head_tail`). Limit: hd <= MAX_HEAD_DIM.

    The partials are kernels/fused_device.py's `slice_partial` (kernels/attention.py's
    attn_partial keeps a 128-thread layout a 512-thread block cannot call): the same math,
    another summation order. ATTN_THREADS = 512 for head_dim 64: 16 warps for the tail's rows;
    not 1024, whose registers a block cannot hold. Its split form (kernels/fused_split.py)
    gives the same bits in three launches, which beat this one under capture (notebook 06,
    data/gpu/fission.json's fused arms).
    """
    pdl_wait()
    q_sh = cuda.shared.array(MAX_HEAD_DIM, numba.float32)   # [hd] this head's query
    sc = cuda.shared.array(MAX_HEAD_DIM, numba.float32)     # [tile] scores, then exp weights
    red = cuda.shared.array(MAX_THREADS, numba.float32)     # [threads]
    o_sh = cuda.shared.array(MAX_HEAD_DIM, numba.float32)   # [hd] this head's merged output
    flag = cuda.shared.array(1, numba.int32)
    slice_partial(q, k_cache, v_cache, pos[0] + 1, part_o, part_ml, scale, q_sh, sc, red)
    pdl_launch_dependents()  # after the partials, as attn_partial (kernels/attention.py: why)
    h = cuda.blockIdx.x
    if arrive_last(counter, h, cuda.gridDim.y, flag, True):  # the last of head h's blocks
        head_tail(part_o, part_ml, Wo, x, head_out, counter, h, o_sh, red, flag)


# ---- attn_fused_grid -----------------------------------------------------------------------
def attn_fused_grid_twin(grid, block, q, k_cache, v_cache, pos, part_o, part_ml, scale, Wo, x,
                         counter):
    # attn_partial then attn_combine, the unfused attention's twins: the kernel's contract
    n_head, splits, _ = part_o.shape
    attn_partial_twin((n_head, splits), (PARTIAL_THREADS,), q, k_cache, v_cache, pos, part_o,
                      part_ml, scale)
    attn_combine_twin(None, None, part_o, part_ml, Wo, x)


_GRID_SIG = ("void(float32[::1], {kv}[:, ::1], {kv}[:, ::1], int32[::1], float32[:, :, ::1], "
             "float32[:, :, ::1], float32, float32[:, ::1], float32[::1], int32[::1])")


@kernel(_GRID_SIG.format(kv="float32"), _GRID_SIG.format(kv="float16"),
        twin=attn_fused_grid_twin, reads=(0, 1, 2, 3, 4, 5, 7, 8, 9), writes=(4, 5, 8, 9))
def attn_fused_grid(q, k_cache, v_cache, pos, part_o, part_ml, scale, Wo, x, counter):
    """x += Wo @ attention(q, cache[:pos[0] + 1]) in ONE launch that fills the grid: the
    unfused attention's two kernels (attn_partial, attn_combine) as two kinds of block.

    q [D], k_cache/v_cache [max_seq, D], pos [1], part_o [n_head, splits, hd],
    part_ml [n_head, splits, 2], Wo [D, D], x [D], counter [>= 2] int32 (0 between launches).
    Grid grid_tail_grid(n_head, splits, D), block (PARTIAL_THREADS,):
    - blocks b < n_head * splits: item (b // splits, b % splits), attn_partial's partial_slice
      (the same bits); then each counts itself in counter[0] (`count_arrival`);
    - the tail blocks after them: each loads its TAIL_ROWS rows of Wo (a weight: nothing it
      waits for writes it), waits until counter[0] says every partial is written, merges all
      of o as attn_combine does and adds its rows' dots to x (attn_combine's bits: the same
      device functions in the same order); the last tail block to finish resets the counter.
    Why a wait is safe here: the tail blocks come after every partial block in the grid's
    order, and a GPU starts a grid's blocks in increasing index order (what NVIDIA hardware
    does; CUDA does not promise it), so every partial block has started, and waits on nothing,
    before the first tail block spins. Nothing here checks that the grid fits on the device at
    once; for the model it is at most n_head * 32 + D / 4 = 192 blocks of 128 threads on the
    H200's 132 SMs. Under numba's simulator blocks run one after another in the grid's order:
    the count is complete when a tail block looks.

    Its bits are the unfused attention's. On the H200 it measured 7.93 us as a graph node at
    context 65 against 2.77 + 3.53 for the two kernels it merges (data/gpu/kernel_costs.json):
    the wait inside a kernel costs more than the node boundary under capture, so its split
    (LAB_SPLIT_COMBINE=1: attn_partial + attn_combine) is the faster fused step.
    """
    pdl_wait()
    red = cuda.shared.array((ATTN_STEPS, PARTIAL_THREADS), numba.float32)  # partial: the trees
    o_w = cuda.shared.array((ATTN_WARPS, MAX_HEAD_DIM), numba.float32)     # partial: o per warp
    ml_w = cuda.shared.array((ATTN_WARPS, 2), numba.float32)               # partial: (m, l) per warp
    o_sh = cuda.shared.array(MAX_D, numba.float32)                  # tail: the merged o [D]
    ml_sh = cuda.shared.array((MERGE_MAX_PAIRS, 2), numba.float32)  # tail: [n_head * splits, 2]
    w_sh = cuda.shared.array(MERGE_MAX_PAIRS, numba.float32)        # tail: merge weights
    red1 = cuda.shared.array(PARTIAL_THREADS, numba.float32)        # tail: row_dot's tree
    flag = cuda.shared.array(1, numba.int32)
    tid = cuda.threadIdx.x
    n_head = part_o.shape[0]
    splits = part_o.shape[1]
    hd = part_o.shape[2]
    n_part = n_head * splits
    b = cuda.blockIdx.x
    if b < n_part:                     # a partial block (uniform over the block)
        h, s = udivmod(b, splits)
        partial_slice_at(q, k_cache, v_cache, pos[0] + 1, part_o, part_ml, scale, red, o_w,
                         ml_w, h, s, splits)
        count_arrival(counter, 0)      # its partials written, the block counts itself
        pdl_launch_dependents()        # after the partials, as attn_partial (LATE_TRIGGER: why)
    else:                              # a tail block
        r = (b - n_part) * TAIL_ROWS + tid // WARP
        wk = cuda.local.array(ROW_UNROLL, numba.float32)
        row_load(Wo, r, tid, wk)       # its row of Wo in flight while the partials run
        wait_arrivals(counter, 0, n_part)   # every partial written
        pdl_launch_dependents()
        merge_weights(part_ml, 0, n_head, ml_sh, w_sh)
        i = tid
        while i < n_head * hd:
            hh, d = udivmod(i, hd)
            o_sh[i] = merge_elem_sh(part_o, ml_sh, w_sh, hh * splits, hh, d)  # attn_combine's o
            i += cuda.blockDim.x
        cuda.syncthreads()
        dot = row_dot_loaded(Wo, r, o_sh, tid, red1, wk)
        if tid % WARP == 0 and r < x.shape[0]:
            x[r] = x[r] + dot
        # the last tail block to finish resets the partials' count (every tail block is past
        # its wait then); arrive_last resets its own slot
        if arrive_last(counter, 1, cuda.gridDim.x - n_part, flag, True) and tid == 0:
            counter[0] = 0


# ---- norm_swiglu ------------------------------------------------------------------------------
def norm_swiglu_twin(grid, block, x, w_norm, eps, W_gate, W_up, act):
    g = _normed_rows(W_gate, x, w_norm, eps)
    u = _normed_rows(W_up, x, w_norm, eps)
    with np.errstate(over="ignore"):  # exp(-g) -> inf for very negative g: silu -> -0, fine
        act[:] = (g / (np.float32(1.0) + np.exp(-g))) * u


@kernel("void(float32[::1], float32[::1], float32, float32[:, ::1], float32[:, ::1], float32[::1])",
        twin=norm_swiglu_twin, reads=(0, 1, 3, 4), writes=(5,))
def norm_swiglu(x, w_norm, eps, W_gate, W_up, act):
    """h = rmsnorm(x, w_norm); act[r] = silu(W_gate[r] . h) * (W_up[r] . h), the norm folded.

    x, w_norm [D], W_gate/W_up [F, D], act [F]; grid rows_grid(F), block (MATVEC_THREADS,).
    """
    pdl_wait()
    pdl_launch_dependents()  # the next kernel may launch now; it waits in its pdl_wait
    red = cuda.shared.array(MATVEC_THREADS, numba.float32)  # [threads] (simulator's tree)
    tid = cuda.threadIdx.x
    r = cuda.blockIdx.x * MATVEC_ROWS_PER_BLOCK + tid // WARP
    g, u, ss = xw_dot2(W_gate, r, W_up, r, x, w_norm, tid, red)
    inv = inv_rms(ss, x.shape[0], eps)
    g = g * inv
    u = u * inv
    if tid % WARP == 0 and r < act.shape[0]:
        act[r] = (g / (numba.float32(1.0) + math.exp(-g))) * u


# ---- norm_lm_head_argmax ----------------------------------------------------------------------
def norm_lm_head_argmax_twin(grid, block, x, w_norm, eps, W, logits, pos, n_prompt, tokens,
                             counter):
    logits[:] = _normed_rows(W, x, w_norm, eps)
    argmax_next_twin(None, None, logits, pos, n_prompt, tokens)
    advance_twin(None, None, pos)


@kernel("void(float32[::1], float32[::1], float32, float32[:, ::1], float32[::1], int32[::1], "
        "int32[::1], int32[::1], int32[::1])",
        twin=norm_lm_head_argmax_twin, reads=(0, 1, 3, 4, 5, 6, 8), writes=(4, 5, 7, 8))
def norm_lm_head_argmax(x, w_norm, eps, W, logits, pos, n_prompt, tokens, counter):
    """logits = W @ rmsnorm(x, w_norm) (the norm folded); then, in the last block:
    tokens[pos[0] + 1] = argmax(logits) (unless that slot is the prompt's or past the end) and
    pos[0] += 1.

    x, w_norm [D], W [V, D], logits [V], pos [1], n_prompt [1], tokens [max_seq],
    counter [1] int32 (0 between launches); grid lm_head_grid(V), block (LM_THREADS,).
    """
    pdl_wait()
    pdl_launch_dependents()  # the next kernel may launch now; it waits in its pdl_wait
    red = cuda.shared.array(LM_THREADS, numba.float32)      # [threads]
    best_i = cuda.shared.array(LM_THREADS, numba.int32)     # [threads]
    flag = cuda.shared.array(1, numba.int32)
    tid = cuda.threadIdx.x
    r = cuda.blockIdx.x * LM_ROWS + tid // WARP
    dot, ss = xw_dot(W, r, x, w_norm, tid, red)
    if tid % WARP == 0 and r < logits.shape[0]:
        logits[r] = dot * inv_rms(ss, x.shape[0], eps)
    if arrive_last(counter, 0, cuda.gridDim.x, flag, True):
        nxt = pos[0] + 1
        cuda.syncthreads()       # every thread has read pos before thread 0 advances it
        if nxt < tokens.shape[0] and nxt >= n_prompt[0]:    # uniform over the block
            pick_next(logits, tokens, nxt, tid, red, best_i)   # argmax_next's policy
        if tid == 0:
            pos[0] = nxt


# ---- the cases kernels/check.py runs
CASES = {
    # n_head 2 (head indexing), hd 8 (a 2-tile context at max_seq 16), F and V not multiples of
    # the rows a block computes; attention blocks of 32 or 64 threads (4 or 8 groups of hd
    # lanes, 1 or 2 warps for the tail's rows)
    "configs": [dict(D=16, n_head=2, hd=8, F=24, V=11, max_seq=16, attn_threads=(32, 64))],
    # on a GPU also the real model's dims, attn_fused at its own block size (max_seq cut to 128)
    "gpu_config": dict(D=256, n_head=4, hd=64, F=512, V=71, max_seq=128, attn_threads=(None,)),
    # attn_fused (cache dtype, pos, splits): 2 tiles; 3 slices; L = 1 with an empty slice; on a
    # GPU also longer slices and 32 of them
    "attn_fused": lambda c: [(np.float32, c["max_seq"] - 1, 1), (np.float32, 9, 3), (np.float16, 0, 2)],
    "attn_fused_gpu": lambda c: [(np.float32, c["max_seq"] - 1, 4), (np.float16, c["max_seq"] - 1, 32)],
    # attn_fused_grid: 2 slices of a 10-step context; L = 1 over 2 slices (an empty slice), the
    # float16 signature
    "attn_fused_grid": [(np.float32, 9, 2), (np.float16, 0, 2)],
    "attn_fused_grid_gpu": lambda c: [(np.float32, c["max_seq"] - 1, 1), (np.float32, c["max_seq"] - 1, 4),
                                      (np.float16, c["max_seq"] - 1, 32)],
    "row_dot_loaded_k": (600, 1100),   # K past one group of loads (simulator, GPU)
    "tol": {"norm_qkv_rope": (1e-5, 16), "attn_fused": (1e-5, 64), "attn_fused_grid": (1e-5, 64),
            "attn_project_heads": (1e-5, 16), "norm_swiglu": (1e-5, 16),
            "norm_lm_head_argmax": (1e-5, 16)},
    "why": "the unfused kernels' tolerances for the same arithmetic: rmsnorm (~(log2 D + 4) "
           "eps) then a D-term dot (error relative to sum |W h|: atol) is k = 16, plus RoPE's "
           "two products, swiglu's exp and divide; attention (hd-term dots, exp, online "
           "rescale, merge, hd-term projections summed over heads) is k = 64",
}
