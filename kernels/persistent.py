"""The megakernel rung (LAB_PERSISTENT=1): the whole decode step of one token in ONE persistent,
cooperative kernel, `step_persistent`. The lecture's "logical endpoint" of fusion: no launch
and no graph node boundary inside a token, only grid-wide barriers.

Owns `step_persistent` and its launch geometry (`persistent_geometry`). Everything it computes
comes from the fused step's device functions (kernels/fused.py, fused_device.py, matvec.py,
attention.py, sample.py), in the fused step's arithmetic, so it writes the FUSED step's bits
(LAB_FUSION=1 with LAB_ATTN_TAIL=heads: attn_fused, the tail on one block per head): the same
tokens, logits, KV rows and residual, on the simulator and on a GPU.
Its twin is the fused step's twins, composed.

The grid and the virtual-block loop. One block size for the whole kernel, T =
`fused.attention_threads(head_dim)` (512 for the model: what `slice_partial` needs for a
(head, split) item; ptxas is told so through `launch_bounds`, which caps a thread at 128
registers, so a block fits one SM's register file). The grid is persistent: as many blocks as
the device has SMs, capped by how many the device can hold at once for this kernel
(`max_cooperative_grid_blocks`), because every block must be resident for a grid barrier to
return. The simulator backend has no occupancy API; it uses SIM_GRID = 132 (the H200's SMs),
which changes no bits (no result depends on which block does an item). Every phase walks its
work items with a loop over virtual blocks -- `for base in range(blockIdx.x * warps, n, gridDim.x
* warps)`, each thread's warp taking item base + warp -- so any grid, down to one block (numba's
CUDA simulator runs cooperative grids of one block only), does all the work. The loop bounds
are the same for every thread of a block (the reduction trees' block barriers under numba's
simulator need that; on a GPU the warp shuffles need only whole warps).

One token, phase by phase (n_layer layers; "| sync" is a grid barrier, cg.this_grid().sync()):
  embed       x = wte[tokens[pos]]: written by the grid during layer 0's first phase, while
              that phase reads the embedding row itself (no barrier of its own)
  per layer
    qkv       norm_qkv_rope's warps: a warp per rotate-half pair of q, k or v; the norm folded
              (xw_dot2), RoPE, q and the KV row at pos                                  | sync
    attention attn_fused's blocks: an item per (head, split), slice_partial; the last item of
              each head to finish (arrive_last) merges that head and projects it through its
              columns of Wo into head_out[h]; the last head adds the heads in head order and
              the residual to x (attn_fused's tail, the same counters)                   | sync
    mlp up    norm_swiglu's warps: a warp per row of gate/up, the norm folded           | sync
    down      matvec_residual's warps: x[r] += W_down[r] . act                          | sync
  lm head     norm_lm_head_argmax's warps; the last block to finish (arrive_last) picks the
              next id (pick_next) and advances pos
Barriers per token: 4 per layer, 16 for the model; the last one is the LM head's wait for x.
The dependencies that are not all-to-all never wait at a barrier: a head's merge waits for its
splits and the heads' sum for the heads through attn_fused's "last block done" counters
(an election, never a spin), and the argmax for the logits likewise. The counters are reset by
their last arriver, so a graph replay starts clean; the same slots serve every layer (a grid
barrier separates two layers' uses). A grid-wide barrier (numba's grid sync) costs about 1.6 us
at 132 blocks of 512 threads on the H200 (data/gpu/grid_barrier.json), more than a graph node
boundary (kernel_costs.json: floors.empty, about 0.5 us; less under PDL); the
fused graph has 18 nodes, this kernel 16 barriers, so what it can win is the launch of each
node (the kernels' launch latency and tails), not the barriers themselves.

Choices, and why:
- Splits from the plan, not from the device: the kernel reads `splits` from the scratch's shape
  (part_o [n_head, splits, head_dim], the plan's view, as the fused step passes it). The graph
  cache then works as for the fused step (one graph per plan key), and every position uses the
  fused step's split count, which the bits depend on (the partials' slicing). Reading the
  context on the device and choosing splits there would give one graph for every context, but
  the merge reads its slices from the scratch's shape: a runtime split count means a view of
  another shape per position or a second copy of the merge.
- arrive_last, not a per-dependency spin: an election needs no co-residency and never waits;
  the block elected does the follow-on work while the others go on to the barrier. A counter
  WAIT (qkv -> a head's attention, say) could remove the qkv barrier, at the price of a spin
  whose safety rests on the cooperative launch; not built here.
- The heads' sum stays in the elected last head (attn_fused's tail), so x is materialised before
  the MLP's barrier: computing x + heads on the fly in every MLP warp would save nothing (the
  MLP needs the barrier after the heads anyway) and load the heads' rows F times.
- No double buffer of x: every phase that writes x (the heads' sum, down's rows) writes rows
  that no other warp reads in that phase, exactly as the fused kernels do.

Limits: T >= 256 (pick_next's block argmax reads 256 slots: `persistent_geometry` refuses
less), head_dim <= MAX_HEAD_DIM, and the grid co-resident (a cooperative launch refuses more).
"""
import math

import numba
from numba import cuda

from kernels._spec import kernel
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
