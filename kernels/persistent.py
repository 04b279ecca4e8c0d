"""The megakernel rung (LAB_PERSISTENT=1): the whole decode step of one token in ONE persistent,
cooperative kernel. No launch and no graph node boundary inside a token, only grid barriers.

Contents
  barriers_per_token, counter_slots  what one token costs in barriers and counter slots
  persistent_geometry                the grid: one block per SM, at most the co-resident count
  step_persistent_twin               the fused step's twins, composed
  step_persistent                    the kernel: the fused step's kernels as phases
  CASES                              kernels/check.py's cases

Everything it computes comes from the fused step's device functions (kernels/fused.py,
fused_device.py, matvec.py, attention.py, sample.py) in their arithmetic, so it writes the
fused step's bits (LAB_FUSION=1, LAB_ATTN_TAIL=heads) on the simulator and on a GPU.
"""
import math

import numba
import numpy as np
from numba import cuda

from kernels.registry import kernel
from kernels.embed import embed_twin
from kernels.fused import (MAX_HEAD_DIM, MAX_THREADS, arrive_last, attention_threads,
                           attn_fused_twin, head_tail, norm_lm_head_argmax_twin,
                           norm_qkv_rope_twin, norm_swiglu_twin)
from kernels.fused_device import inv_rms, slice_partial_at, xw_dot, xw_dot2
from kernels.matvec import matvec_residual_twin, row_dot
from kernels.pdl import pdl_wait
from kernels.reduce import WARP
from kernels.sample import ARGMAX_THREADS, pick_next

__all__ = ["step_persistent", "persistent_geometry", "counter_slots", "SIM_GRID"]

SIM_GRID = 132           # the simulator's grid: the H200's SM count (it has no occupancy API)
PERSISTENT_THREADS = 512  # the model's block (attention_threads(64)); launch_bounds says so
BARRIERS_PER_LAYER = 4    # grid barriers per layer (qkv, attention, mlp up, down)


def barriers_per_token(n_layer: int) -> int:
    """Grid barriers in one token's step."""
    return BARRIERS_PER_LAYER * n_layer


def counter_slots(n_head: int) -> int:
    """The kernel's counter slots: one per head, one for the heads, one for the LM head."""
    return n_head + 2


def persistent_geometry(head_dim: int, sms: int, co_resident: int, threads: int | None = None):
    """(grid, block) for `step_persistent`: a block of attention_threads(head_dim) threads
    (`threads` overrides it, for tests), as many blocks as SMs, capped by the blocks the device
    can hold at once (`co_resident`, a cooperative launch's limit). ValueError with the reason
    where the block cannot run the kernel or no block fits."""
    t = attention_threads(head_dim) if threads is None else threads
    if t < ARGMAX_THREADS or t % WARP or t % head_dim or t > MAX_THREADS:
        raise ValueError(f"step_persistent needs a block of {ARGMAX_THREADS} to {MAX_THREADS} "
                         f"threads, a multiple of {WARP} and of head_dim {head_dim}; got {t}")
    if co_resident < 1:
        raise ValueError(f"the device cannot hold one block of {t} threads of step_persistent "
                         f"at once (max_cooperative_grid_blocks = {co_resident})")
    return (min(sms, co_resident),), (t,)


# ---- the twin: the fused step's twins, composed ------------------------------------------------
def step_persistent_twin(grid, block, tokens, pos, n_prompt, wte, norms, wqkv, wo, w_gu, w_down,
                         final_norm, lm_head, eps, scale, cos, sin, k_cache, v_cache, x, q,
                         part_o, part_ml, head_out, act, logits, counter):
    n_head, splits, _ = part_o.shape
    embed_twin(None, None, tokens, pos, wte, x)
    for layer in range(wqkv.shape[0]):
        norm_qkv_rope_twin(None, None, x, norms[layer, 0], eps, wqkv[layer], 0, pos, cos, sin,
                           q, k_cache[layer], v_cache[layer])
        attn_fused_twin((n_head, splits), None, q, k_cache[layer], v_cache[layer], pos, part_o,
                        part_ml, scale, wo[layer], x, head_out, counter)
        norm_swiglu_twin(None, None, x, norms[layer, 1], eps, w_gu[layer, 0], w_gu[layer, 1], act)
        matvec_residual_twin(None, None, w_down[layer], act, x)
    norm_lm_head_argmax_twin(None, None, x, final_norm, eps, lm_head, logits, pos, n_prompt,
                             tokens, counter)


_SIG = ("void(int32[::1], int32[::1], int32[::1], float32[:, ::1], float32[:, :, ::1], "
        "float32[:, :, ::1], float32[:, :, ::1], float32[:, :, :, ::1], float32[:, :, ::1], "
        "float32[::1], float32[:, ::1], float32, float32, float32[:, ::1], float32[:, ::1], "
        "{kv}[:, :, ::1], {kv}[:, :, ::1], float32[::1], float32[::1], float32[:, :, ::1], "
        "float32[:, :, ::1], float32[:, ::1], float32[::1], float32[::1], int32[::1])")


@kernel(_SIG.format(kv="float32"), _SIG.format(kv="float16"), twin=step_persistent_twin,
        reads=(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 13, 14, 15, 16, 24),
        writes=(0, 1, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24),
        jit_options={"launch_bounds": (PERSISTENT_THREADS,)})
def step_persistent(tokens, pos, n_prompt, wte, norms, wqkv, wo, w_gu, w_down, final_norm,
                    lm_head, eps, scale, cos, sin, k_cache, v_cache, x, q, part_o, part_ml,
                    head_out, act, logits, counter):
    """One decode step: the fused step's 18 kernels as phases of one cooperative kernel.

    tokens [max_seq], pos [1], n_prompt [1] int32; wte [V, D]; norms [L, 2, D] (attention's,
    the MLP's); wqkv [L, 3D, D]; wo [L, D, D]; w_gu [L, 2, F, D] (gate, up); w_down [L, D, F];
    final_norm [D]; lm_head [V, D]; cos/sin [max_seq, hd/2]; k_cache/v_cache [L, max_seq, D];
    x, q [D]; part_o [n_head, splits, hd], part_ml [n_head, splits, 2] (the plan's view);
    head_out [n_head, D]; act [F]; logits [V]; counter [n_head + 2] int32 (0 between launches).
    Grid persistent_geometry (any number of co-resident blocks), block T >= 256.

    One block size for the whole kernel, T = `fused.attention_threads(head_dim)` (512 for the
    model: what `slice_partial` needs; `launch_bounds` caps a thread at 128 registers so a block
    fits one SM). Every block must be resident for a grid barrier to return, hence the
    persistent grid; the simulator backend uses SIM_GRID = 132 (no bits depend on which block
    does an item). Each phase walks its items over virtual blocks, `for base in
    range(blockIdx.x * warps, n, gridDim.x * warps)`, so any grid down to one block (numba's
    simulator runs cooperative grids of one block only) does all the work; the loop bounds are
    the same in every thread of a block (the simulator's block barriers need that).

    One token ("| sync": a grid barrier, cg.this_grid().sync()):
      embed       x = wte[tokens[pos]], written during layer 0's first phase, which reads the
                  embedding row itself
      per layer
        qkv       norm_qkv_rope's warps: the norm folded (xw_dot2), RoPE, q and the KV row | sync
        attention attn_fused's blocks: an item per (head, split), slice_partial; the last item
                  of each head merges and projects it, the last head adds the heads and the
                  residual to x (`head_tail`, the same counters)                        | sync
        mlp up    norm_swiglu's warps, the norm folded                                 | sync
        down      matvec_residual's warps: x[r] += W_down[r] . act                     | sync
      lm head     norm_lm_head_argmax's warps; the last block (arrive_last) picks the id and
                  advances pos
    4 barriers per layer. Dependencies that are not all-to-all never wait at a barrier: they go
    through `arrive_last` elections (never a spin), reset by their last arriver, so a replay
    starts clean; the same slots serve every layer. A grid barrier costs about 1.6 us at 132
    blocks of 512 threads on the H200 (data/gpu/grid_barrier.json), more than a graph node
    boundary (kernel_costs.json: floors.empty, about 0.5 us): what the kernel can win is each
    node's launch and tail, not the barriers.

    Choices: splits come from the plan (part_o's shape), so the graph cache works as for the
    fused step and every position keeps the fused step's slicing, which its bits depend on. An
    election, not a per-dependency spin: it needs no co-residency and never waits. The heads'
    sum stays in the elected last head, so x exists before the MLP's barrier. No double buffer
    of x: a phase that writes x writes rows no other warp reads in that phase. Limits: T >= 256
    (pick_next's block argmax), head_dim <= MAX_HEAD_DIM, the grid co-resident.
    """
    pdl_wait()
    grid = cuda.cg.this_grid()
    q_sh = cuda.shared.array(MAX_HEAD_DIM, numba.float32)   # [hd] a head's query
    sc = cuda.shared.array(MAX_HEAD_DIM, numba.float32)     # [tile] scores, then exp weights
    red = cuda.shared.array(MAX_THREADS, numba.float32)     # [threads] trees; argmax values
    best_i = cuda.shared.array(MAX_THREADS, numba.int32)    # [threads] argmax indices
    o_sh = cuda.shared.array(MAX_HEAD_DIM, numba.float32)   # [hd] a head's merged output
    flag = cuda.shared.array(1, numba.int32)
    tid = cuda.threadIdx.x
    lane = tid % WARP
    T = cuda.blockDim.x
    warps = T // WARP
    blk = cuda.blockIdx.x
    G = cuda.gridDim.x
    D = x.shape[0]
    F = act.shape[0]
    V = logits.shape[0]
    half = cos.shape[1]
    hd = 2 * half
    H = part_o.shape[0]
    splits = part_o.shape[1]
    p = pos[0]                      # every block reads it here; only the last block advances it
    emb = wte[tokens[p]]            # [D] the embedding row: layer 0's input
    for i in range(blk * T + tid, D, G * T):
        x[i] = emb[i]               # embed's x, read by layer 0's attention tail after a barrier

    for layer in range(wqkv.shape[0]):
        xin = emb if layer == 0 else x
        W = wqkv[layer]
        # ---- qkv: norm_qkv_rope, a warp per rotate-half pair of q, k or v
        n_pairs = 3 * (D // 2)
        for base in range(blk * warps, n_pairs, G * warps):
            pair = base + tid // WARP
            own = pair // (D // 2)                          # 0 q, 1 k, 2 v
            head = (pair % (D // 2)) // half
            j = pair % half
            lo_row = own * D + head * hd + j
            valid = pair < n_pairs
            if not valid:
                lo_row = W.shape[0]                         # no rows: the warp still reduces
            lo, hi, ss = xw_dot2(W, lo_row, W, lo_row + half, xin, norms[layer, 0], tid, red)
            inv = inv_rms(ss, D, eps)
            lo = lo * inv
            hi = hi * inv
            if valid and lane < 2:
                i = head * hd + j + lane * half
                if own == 2:
                    v_cache[layer, p, i] = lo if lane == 0 else hi
                else:
                    c = cos[p, j]
                    s = sin[p, j]
                    val = lo * c - hi * s if lane == 0 else hi * c + lo * s
                    if own == 0:
                        q[i] = val
                    else:
                        k_cache[layer, p, i] = val
        grid.sync()

        # ---- attention: attn_fused, an item per (head, split); elected tails
        Wo = wo[layer]
        for item in range(blk, H * splits, G):
            h = item // splits
            slice_partial_at(q, k_cache[layer], v_cache[layer], p + 1, part_o, part_ml, scale,
                             q_sh, sc, red, h, item % splits, splits)
            if arrive_last(counter, h, splits, flag):       # the last of head h's items
                head_tail(part_o, part_ml, Wo, x, head_out, counter, h, o_sh, red, flag)
        grid.sync()

        # ---- mlp up: norm_swiglu, a warp per row
        for base in range(blk * warps, F, G * warps):
            r = base + tid // WARP
            g, u, ss = xw_dot2(w_gu[layer, 0], r, w_gu[layer, 1], r, x, norms[layer, 1], tid, red)
            inv = inv_rms(ss, D, eps)
            g = g * inv
            u = u * inv
            if lane == 0 and r < F:
                act[r] = (g / (numba.float32(1.0) + math.exp(-g))) * u
        grid.sync()

        # ---- down + residual: matvec_residual, a warp per row
        for base in range(blk * warps, D, G * warps):
            r = base + tid // WARP
            dot = row_dot(w_down[layer], r, act, tid, red)
            if lane == 0 and r < D:
                x[r] = x[r] + dot
        grid.sync()

    # ---- lm head: norm_lm_head_argmax; the last block picks the next id and advances pos
    for base in range(blk * warps, V, G * warps):
        r = base + tid // WARP
        dot, ss = xw_dot(lm_head, r, x, final_norm, tid, red)
        if lane == 0 and r < V:
            logits[r] = dot * inv_rms(ss, D, eps)
    n_vb = (V + warps - 1) // warps                         # blocks' worth of logits
    if blk < n_vb:                                          # the blocks that wrote some
        if arrive_last(counter, H + 1, min(G, n_vb), flag):
            nxt = p + 1
            if nxt < tokens.shape[0] and nxt >= n_prompt[0]:    # uniform over the block
                pick_next(logits, tokens, nxt, tid, red, best_i)  # (threads >= 256 ignored)
            if tid == 0:
                pos[0] = nxt


# ---- the cases kernels/check.py runs
CASES = {
    # numba's simulator runs a cooperative grid of ONE block only (its grid sync is the block's
    # barrier): the kernel runs at grid (1,) there, its virtual-block loops doing all the work.
    # One layer under the simulator (every phase and barrier of a layer, the LM head; the
    # layer loop's second pass costs another ~10 s of simulated threads there), two on a GPU
    "tiny": dict(L=1, D=8, H=2, hd=4, F=8, V=11, S=16, T=256),
    "gpu_layers": 2,
    "gpu_grids": ((1,), (2,), (7,)),
    # (KV dtype, position, splits, n_prompt): a generated slot; a prompt slot (no token
    # written), an empty slice (L = 10 over 4 slices of 3) and a float16 cache. The simulator
    # runs the first
    "cases": [(np.float32, 5, 2, 3), (np.float16, 9, 4, 12)],
    "eps": 1e-5,
    "tol": (4e-5, 64),
    "why": "the fused kernels' widest tolerance (attention: atol 1e-5, k = 64, per kernel); a "
           "step chains 2 layers: atol 4x that",
}
