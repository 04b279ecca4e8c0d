"""The fused decode step's kernels (LAB_FUSION=1): 18 launches per token instead of 37.

Owns
- `norm_qkv_rope`: RMSNorm of x folded into the qkv projection, RoPE and the KV append in its
  epilogue. Block b owns one head of q, k or v (64 rows of W for the tiny model): it normalises
  x itself (kernels/rmsnorm.py's `sum_squares` + `normalise` on its 256 threads, so h has the
  bits `rmsnorm` writes), computes its rows (`row_dot4`: `row_dot`'s order, four rows at a
  time) into shared memory, then rotates them (rows j and j + hd/2 of a head are needed
  together: `rope_elem`) and writes q, k_cache[pos] or v_cache[pos]. `part0` says which of
  q (0), k (1), v (2) its first block owns, so the q part and the k/v part can be two launches
  on two streams (LAB_OVERLAP=1).
- `attn_fused`: split-K attention partials, the merge, the output projection Wo and the
  residual add in ONE launch, by the "last block done" pattern below.
- `norm_swiglu`: RMSNorm folded into the gate/up projections (`row_dot2`) + SwiGLU: swiglu_up's
  arithmetic on rmsnorm's h; each block normalises x itself.
- `norm_lm_head_argmax`: the final RMSNorm folded into the LM head; the last block to finish
  picks the next token (argmax_next's policy: its scan, then kernels/reduce.py's
  `block_argmax`, through `pick_next`) and advances the device position.
The down projection + residual stays `kernels.matvec.matvec_residual`. Every block of the three
norm kernels computes the norm of x [D] again: D = 256 squares and one block_sum, cheaper than
a launch and a round trip of h through global memory.

Last block done (`arrive_last`): a kernel whose follow-on work needs every block's output (the
merge needs every split of every head; the argmax needs every logit) does not end the launch
there. Each block writes its part, fences (`threadfence`: its writes are visible device-wide
before it counts itself), and one thread adds 1 to a counter in device memory (an int32 slot
the engine allocates once at start-up, zeroed; one slot per launch site). The block that sees
count == blocks - 1 arrived last: every other block's part is written, so it fences again (the
acquire side) and does the follow-on work, and it resets the counter to 0 (no other block
touches it any more in this launch), so the next launch -- the next replay of a graph --
starts clean. The counter only ELECTS the block that does the follow-on work; the follow-on
reads every part in a fixed order, so the result never depends on which block finished last:
the kernels stay bit-reproducible, replay after replay. No block ever waits for another (no
spin), so nothing depends on how many blocks are resident. (The counter's atomic is the only
one in kernels/; it lives in `arrive_last`, not in a kernel's own source.)

attn_fused: the GLOBALLY last block merges every head and projects all of D. Chosen over "the
last block per head merges its head and writes a per-head partial projection, the globally
last one sums the heads in fixed order", because
  - its result is, by construction, `attn_combine` on the same partials bit for bit: the same
    merge (`merge_elem`, which kernels/attention.py keeps bit-identical to attn_combine's
    `merge_weights` + `merge_elem_sh`), o rounded to float32 in shared memory, the same
    `row_dot` order per row of Wo over all of D (tests/_cudasim_fused.py checks it). Per-head
    partial projections would add the heads' 64-term dots instead: another summation order,
    and its twin could no longer be the existing twins composed;
  - the tail's cost is rounds of `row_dot4` (a round: four rows per warp with all their loads
    in flight, then four warp reductions), and the per-head variant needs as many rounds per
    block (all D rows each, shorter dots), plus a second fence-and-count and a [n_head, D]
    scratch;
  - the tail runs on one block, so that block is large (ATTN_THREADS = 512 threads for
    head_dim 64: 16 warps, D / 64 = 4 rounds), and the partials use all of its threads too.
    Not 1024: the kernel takes 118 registers per thread on sm_90 (measured on the H200 with
    numba-cuda 0.30.4), and a block may hold 64K registers.
  The price: the tail is serial work on one SM after the last partial. Whether the launch it
  saves pays for it is a measurement (scripts/record_gpu_costs.py records attn_fused at every
  plan's contexts), not a given.

The context length L = pos[0] + 1 is read from device memory; `splits` = gridDim.y is part of
the launch (the plan). The partials are kernels/fused_device.py's `slice_partial` (the block's
threads split each score and each slice's weighted sum of V into groups, summed in group
order), not kernels/attention.py's `attn_partial` (whose 128-thread layout a 512-thread block
cannot call): the same math, another summation order. `row_dot4` lives there too.
"""
import math

import numba
import numpy as np
from numba import cuda

from kernels._spec import kernel
from kernels.attention import (attn_combine_twin, attn_partial_twin, combine_grid, merge_elem,
                               partial_grid)
from kernels.fused_device import row_dot4, slice_partial
from kernels.matvec import matvec_twin, row_dot, row_dot2
from kernels.mlp import swiglu_up_twin
from kernels.pdl import pdl_launch_dependents, pdl_wait
from kernels.position import advance_twin
from kernels.reduce import BLOCK_THREADS, WARP
from kernels.rmsnorm import RMSNORM_THREADS, normalise, rmsnorm_twin, sum_squares
from kernels.rope import _rope_rows, rope_elem
from kernels.sample import ARGMAX_THREADS, argmax_next_twin, pick_next

# the norm-folding kernels run the norm's own block: normalise's block_sum (and block_argmax)
# are written for exactly BLOCK_THREADS = 256 threads; a warp per output row, so a block
# computes NORM_ROWS rows per round
NORM_THREADS = RMSNORM_THREADS
NORM_ROWS = NORM_THREADS // WARP
assert NORM_THREADS == BLOCK_THREADS == ARGMAX_THREADS
MAX_D = 1024          # a block keeps the whole normalised x (or the merged o) in shared memory
MAX_HEAD_DIM = 128    # a head's rows, a tile of scores: shared arrays of this size
MAX_THREADS = 1024    # CUDA's limit per block: attn_fused's scratch is sized for it
ATTN_THREADS = 512    # attn_fused's block, when head_dim allows (attention_grid): at ~100
                      # registers per thread, 1024 threads would exceed a block's 64K registers


def _pow2_at_least(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


# ---- launch geometry --------------------------------------------------------------------------
def qkv_grid(n_head: int, parts: int = 3):
    """(grid, block) for `norm_qkv_rope` over `parts` of q, k, v: one block per head per part."""
    return (parts * n_head,), (NORM_THREADS,)


def rows_grid(n_rows: int):
    """(grid, block) for `norm_swiglu` and `norm_lm_head_argmax`: NORM_ROWS rows per block."""
    return ((n_rows + NORM_ROWS - 1) // NORM_ROWS,), (NORM_THREADS,)


def attention_threads(head_dim: int, target: int = ATTN_THREADS) -> int:
    """attn_fused's block size: the largest multiple of lcm(32, head_dim) up to `target` (the
    block's threads are groups of head_dim lanes, and whole warps for row_dot), and at least
    the power of two at or above head_dim (the tile's max tree). A head_dim that needs a larger
    block is refused: more threads than ATTN_THREADS would not have the registers."""
    if not 2 <= head_dim <= MAX_HEAD_DIM or head_dim % 2:
        raise ValueError(f"head_dim {head_dim}: attn_fused needs an even head_dim <= {MAX_HEAD_DIM}")
    step = WARP * head_dim // math.gcd(WARP, head_dim)
    threads = target // step * step
    if threads < max(step, _pow2_at_least(head_dim)):
        raise ValueError(f"head_dim {head_dim}: attn_fused's block would need more than {target} "
                         f"threads (a multiple of lcm(32, head_dim) = {step})")
    return threads


def attention_grid(n_head: int, splits: int, head_dim: int, threads: int | None = None):
    """(grid, block) for `attn_fused`: one block per (head, split), `attention_threads` each
    (`threads` overrides it: a multiple of 32 and of head_dim, the kernel tests use small ones)."""
    t = attention_threads(head_dim) if threads is None else threads
    if t % WARP or t % head_dim or t < _pow2_at_least(head_dim) or t > MAX_THREADS:
        raise ValueError(f"{t} threads: attn_fused needs a multiple of {WARP} and of head_dim "
                         f"{head_dim}, at least {_pow2_at_least(head_dim)}, at most {MAX_THREADS}")
    return (n_head, splits), (t,)


# ---- device functions -------------------------------------------------------------------------
@cuda.jit(device=True)
def arrive_last(counter, flag):
    """True, in every thread of the block, for the block that arrives last of the whole grid.

    Every thread calls it once its writes of the block's part are done. counter [1] int32: 0
    when the launch starts, 0 again when it ends (the last block resets it). flag: shared [1]
    int32 scratch. The last block's later reads see every other block's part (fence, count,
    fence: release and acquire at device scope).
    """
    cuda.threadfence()                  # this thread's writes are visible device-wide ...
    cuda.syncthreads()                  # ... and every thread of the block has fenced
    if cuda.threadIdx.x == 0:
        blocks = cuda.gridDim.x * cuda.gridDim.y
        arrived = cuda.atomic.add(counter, 0, numba.int32(1))
        flag[0] = 1 if arrived == blocks - 1 else 0
        if arrived == blocks - 1:
            counter[0] = 0              # every other block has counted: clean for the next launch
    cuda.syncthreads()
    last = flag[0] == 1
    if last:
        cuda.threadfence()              # acquire: read the others' parts only after the count
    return last


# ---- norm_qkv_rope ----------------------------------------------------------------------------
def norm_qkv_rope_twin(grid, block, x, w_norm, eps, W, part0, pos, cos, sin, q, k_cache, v_cache):
    D = x.shape[0]
    hd = 2 * cos.shape[1]
    n_head = D // hd
    parts = range(int(part0), int(part0) + grid[0] // n_head)
    h = np.empty(D, np.float32)
    rmsnorm_twin((1,), (RMSNORM_THREADS,), x, w_norm, h, eps)
    y = np.empty(W.shape[0], np.float32)                            # [len(parts) * D]
    matvec_twin(None, None, W, h, y)
    p = int(pos[0])
    for j, part in enumerate(parts):
        rows = y[j * D:(j + 1) * D]
        if part == 2:
            v_cache[p] = rows                                       # casts to the cache dtype
            continue
        rotated = _rope_rows(rows.reshape(n_head, hd), cos[p], sin[p]).reshape(D)
        if part == 0:
            q[:] = rotated
        else:
            k_cache[p] = rotated


_QKV_SIG = ("void(float32[::1], float32[::1], float32, float32[:, ::1], int32, int32[::1], "
            "float32[:, ::1], float32[:, ::1], float32[::1], {kv}[:, ::1], {kv}[:, ::1])")


@kernel(_QKV_SIG.format(kv="float32"), _QKV_SIG.format(kv="float16"),
        twin=norm_qkv_rope_twin, reads=(0, 1, 3, 5, 6, 7), writes=(8, 9, 10))
def norm_qkv_rope(x, w_norm, eps, W, part0, pos, cos, sin, q, k_cache, v_cache):
    """h = rmsnorm(x, w_norm); (q | k | v) = W @ h, q and k rotated; k and v to row pos[0].

    x, w_norm [D]; W [parts*D, D]: rows of wqkv from part `part0` (0 q, 1 k, 2 v) on; pos [1];
    cos/sin [max_seq, hd/2]; q [D]; k_cache/v_cache [max_seq, D]. Grid (parts * n_head,),
    block (NORM_THREADS,): block b owns head b % n_head of part part0 + b // n_head.
    """
    pdl_wait()
    pdl_launch_dependents()  # the next kernel may launch now; it waits in its pdl_wait
    h_sh = cuda.shared.array(MAX_D, numba.float32)          # [D] the normalised x
    y_sh = cuda.shared.array(MAX_HEAD_DIM, numba.float32)   # [hd] this block's rows of W @ h
    red = cuda.shared.array(NORM_THREADS, numba.float32)    # [threads]
    tid = cuda.threadIdx.x
    D = x.shape[0]
    half = cos.shape[1]
    hd = 2 * half
    n_head = D // hd
    head = cuda.blockIdx.x % n_head
    part = part0 + cuda.blockIdx.x // n_head
    row0 = (cuda.blockIdx.x // n_head) * D + head * hd      # this block's first row of W
    normalise(x, w_norm, h_sh, eps, sum_squares(x, tid), red)
    cuda.syncthreads()
    dots = cuda.local.array(4, numba.float32)
    for j0 in range(0, hd, 4 * NORM_ROWS):                  # a warp per row, 4 rows at a time
        j = j0 + tid // WARP
        row_dot4(W, row0 + j if j < hd else W.shape[0], NORM_ROWS, h_sh, tid, red, dots)
        for i in range(4):
            if tid % WARP == 0 and j + i * NORM_ROWS < hd:
                y_sh[j + i * NORM_ROWS] = dots[i]
    cuda.syncthreads()
    if tid < hd:                                            # the epilogue: RoPE, KV append
        p = pos[0]
        i = head * hd + tid
        if part == 2:
            v_cache[p, i] = y_sh[tid]                       # setitem casts to the cache dtype
        else:
            val = rope_elem(y_sh, tid, tid, half, cos[p, tid % half], sin[p, tid % half])
            if part == 0:
                q[i] = val
            else:
                k_cache[p, i] = val


# ---- attn_fused -------------------------------------------------------------------------------
def attn_fused_twin(grid, block, q, k_cache, v_cache, pos, part_o, part_ml, scale, Wo, x, counter):
    # the two-kernel path it replaces: partials, then combine (merge + Wo + residual); the
    # counter is 0 before and after, as on the device
    n_head, splits = grid[0], grid[1]
    attn_partial_twin(*partial_grid(n_head, splits, part_o.shape[2]), q, k_cache, v_cache, pos,
                      part_o, part_ml, scale)
    attn_combine_twin(*combine_grid(x.shape[0]), part_o, part_ml, Wo, x)


_ATTN_SIG = ("void(float32[::1], {kv}[:, ::1], {kv}[:, ::1], int32[::1], float32[:, :, ::1], "
             "float32[:, :, ::1], float32, float32[:, ::1], float32[::1], int32[::1])")


@kernel(_ATTN_SIG.format(kv="float32"), _ATTN_SIG.format(kv="float16"),
        twin=attn_fused_twin, reads=(0, 1, 2, 3, 4, 5, 7, 8, 9), writes=(4, 5, 8, 9))
def attn_fused(q, k_cache, v_cache, pos, part_o, part_ml, scale, Wo, x, counter):
    """x += Wo @ attention(q, cache[:pos[0] + 1]): partials, merge, projection, residual.

    q [D], k_cache/v_cache [max_seq, D], pos [1], part_o [n_head, splits, hd],
    part_ml [n_head, splits, 2], Wo [D, D], x [D], counter [1] int32 (0 between launches).
    Grid (n_head, splits), block attention_threads(hd). Every block writes its slice's partials;
    the last block to arrive merges them (merge_elem, splits in order) into o [D] in shared
    memory and adds Wo @ o to x (row_dot per row): bit for bit attn_combine on the partials.
    Limits: D <= MAX_D, hd <= MAX_HEAD_DIM.
    """
    pdl_wait()
    pdl_launch_dependents()  # the next kernel may launch now; it waits in its pdl_wait
    q_sh = cuda.shared.array(MAX_HEAD_DIM, numba.float32)   # [hd] this head's query
    sc = cuda.shared.array(MAX_HEAD_DIM, numba.float32)     # [tile] scores, then exp weights
    red = cuda.shared.array(MAX_THREADS, numba.float32)     # [threads]
    o_sh = cuda.shared.array(MAX_D, numba.float32)          # [D] merged attention output
    flag = cuda.shared.array(1, numba.int32)
    slice_partial(q, k_cache, v_cache, pos[0] + 1, part_o, part_ml, scale, q_sh, sc, red)
    if arrive_last(counter, flag):
        tid = cuda.threadIdx.x
        T = cuda.blockDim.x
        hd = part_o.shape[2]
        D = x.shape[0]
        for i in range(tid, D, T):                          # attn_combine's merge, its bits
            o_sh[i] = merge_elem(part_o, part_ml, i // hd, i % hd)  # rounded to f32, as there
        cuda.syncthreads()
        warps = T // WARP
        dots = cuda.local.array(4, numba.float32)
        for r0 in range(0, D, 4 * warps):                   # a warp per row of Wo, 4 at a time
            r = r0 + tid // WARP
            row_dot4(Wo, r, warps, o_sh, tid, red, dots)
            for i in range(4):
                if tid % WARP == 0 and r + i * warps < D:
                    x[r + i * warps] = x[r + i * warps] + dots[i]


# ---- norm_swiglu ------------------------------------------------------------------------------
def norm_swiglu_twin(grid, block, x, w_norm, eps, W_gate, W_up, act):
    h = np.empty(x.shape[0], np.float32)
    rmsnorm_twin((1,), (RMSNORM_THREADS,), x, w_norm, h, eps)
    swiglu_up_twin(None, None, W_gate, W_up, h, act)


@kernel("void(float32[::1], float32[::1], float32, float32[:, ::1], float32[:, ::1], float32[::1])",
        twin=norm_swiglu_twin, reads=(0, 1, 3, 4), writes=(5,))
def norm_swiglu(x, w_norm, eps, W_gate, W_up, act):
    """h = rmsnorm(x, w_norm); act[r] = silu(W_gate[r] . h) * (W_up[r] . h).

    x, w_norm [D], W_gate/W_up [F, D], act [F]; grid rows_grid(F), block (NORM_THREADS,).
    """
    pdl_wait()
    pdl_launch_dependents()  # the next kernel may launch now; it waits in its pdl_wait
    h_sh = cuda.shared.array(MAX_D, numba.float32)          # [D] the normalised x
    red = cuda.shared.array(NORM_THREADS, numba.float32)    # [threads]
    tid = cuda.threadIdx.x
    normalise(x, w_norm, h_sh, eps, sum_squares(x, tid), red)
    cuda.syncthreads()
    r = cuda.blockIdx.x * NORM_ROWS + tid // WARP
    g, u = row_dot2(W_gate, W_up, r, h_sh, tid, red)      # swiglu_up's order: its bits
    if tid % WARP == 0 and r < act.shape[0]:
        act[r] = (g / (numba.float32(1.0) + math.exp(-g))) * u


# ---- norm_lm_head_argmax ----------------------------------------------------------------------
def norm_lm_head_argmax_twin(grid, block, x, w_norm, eps, W, logits, pos, n_prompt, tokens,
                             counter):
    h = np.empty(x.shape[0], np.float32)
    rmsnorm_twin((1,), (RMSNORM_THREADS,), x, w_norm, h, eps)
    matvec_twin(None, None, W, h, logits)
    argmax_next_twin(None, None, logits, pos, n_prompt, tokens)
    advance_twin(None, None, pos)


@kernel("void(float32[::1], float32[::1], float32, float32[:, ::1], float32[::1], int32[::1], "
        "int32[::1], int32[::1], int32[::1])",
        twin=norm_lm_head_argmax_twin, reads=(0, 1, 3, 4, 5, 6, 8), writes=(4, 5, 7, 8))
def norm_lm_head_argmax(x, w_norm, eps, W, logits, pos, n_prompt, tokens, counter):
    """logits = W @ rmsnorm(x, w_norm); then, in the last block: tokens[pos[0] + 1] =
    argmax(logits) (unless that slot is the prompt's or past the end) and pos[0] += 1.

    x, w_norm [D], W [V, D], logits [V], pos [1], n_prompt [1], tokens [max_seq],
    counter [1] int32 (0 between launches); grid rows_grid(V), block (NORM_THREADS,).
    """
    pdl_wait()
    pdl_launch_dependents()  # the next kernel may launch now; it waits in its pdl_wait
    h_sh = cuda.shared.array(MAX_D, numba.float32)          # [D] the normalised x
    red = cuda.shared.array(NORM_THREADS, numba.float32)    # [threads]
    best_i = cuda.shared.array(NORM_THREADS, numba.int32)   # [threads]
    flag = cuda.shared.array(1, numba.int32)
    tid = cuda.threadIdx.x
    normalise(x, w_norm, h_sh, eps, sum_squares(x, tid), red)
    cuda.syncthreads()
    r = cuda.blockIdx.x * NORM_ROWS + tid // WARP
    dot = row_dot(W, r, h_sh, tid, red)
    if tid % WARP == 0 and r < logits.shape[0]:
        logits[r] = dot
    if arrive_last(counter, flag):
        nxt = pos[0] + 1
        cuda.syncthreads()       # every thread has read pos before thread 0 advances it
        if nxt < tokens.shape[0] and nxt >= n_prompt[0]:    # uniform over the block
            pick_next(logits, tokens, nxt, tid, red, best_i)   # argmax_next's policy
        if tid == 0:
            pos[0] = nxt
