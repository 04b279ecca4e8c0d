"""The fused step's attention split into launches of its own (LAB_FUSION=1 with
LAB_SPLIT_COMBINE=1): attn_partial_wide, kernels/attention.py's attn_merge, attn_project_heads --
attn_fused's three phases as three graph nodes, with attn_fused's bits (kernels/check.py
checks it). Lecture §6's case: eagerly the two extra launches cost more host time than the
serial tail they remove; under capture a node costs about half a microsecond and the split wins
(data/gpu/fission.json's fused arms, notebook 06).

  attn_partial_wide   attn_fused's first phase alone (kernels/fused_device.py's slice_partial)
  attn_project_heads  attn_fused's tail for every row: each head's Wo columns dotted with the
                      merged o, the heads summed in head order, plus the residual
"""
import numba
import numpy as np
from numba import cuda

from kernels.registry import kernel
from kernels.attention import attn_partial_twin
from kernels.fused import MAX_HEAD_DIM, MAX_THREADS, project_heads
from kernels.fused_device import PROJ_HEADS, heads_dots, slice_partial
from kernels.matvec import MATVEC_ROWS_PER_BLOCK, MATVEC_THREADS
from kernels.pdl import pdl_launch_dependents, pdl_wait
from kernels.reduce import WARP

__all__ = ["attn_partial_wide", "attn_project_heads"]


_PARTIAL_SIG = ("void(float32[::1], {kv}[:, ::1], {kv}[:, ::1], int32[::1], "
                "float32[:, :, ::1], float32[:, :, ::1], float32)")


@kernel(_PARTIAL_SIG.format(kv="float32"), _PARTIAL_SIG.format(kv="float16"),
        twin=attn_partial_twin, reads=(0, 1, 2, 3), writes=(4, 5))
def attn_partial_wide(q, k_cache, v_cache, pos, part_o, part_ml, scale):
    """attn_fused's first phase alone: block (h, s) writes its slice's partials, the bits
    attn_fused writes. Grid and block: attention_grid (the same block size as attn_fused)."""
    pdl_wait()
    q_sh = cuda.shared.array(MAX_HEAD_DIM, numba.float32)   # [hd] this head's query
    sc = cuda.shared.array(MAX_HEAD_DIM, numba.float32)     # [tile] scores, then exp weights
    red = cuda.shared.array(MAX_THREADS, numba.float32)     # [threads]
    slice_partial(q, k_cache, v_cache, pos[0] + 1, part_o, part_ml, scale, q_sh, sc, red)
    pdl_launch_dependents()  # after the partials, as attn_partial (kernels/attention.py: why)


def attn_project_heads_twin(grid, block, Wo, o, x, head_dim):
    hd = int(head_dim)
    head_out = np.empty((o.shape[0] // hd, x.shape[0]), np.float32)   # [n_head, D]
    x[:] = x + project_heads(Wo, o, hd, head_out)


@kernel("void(float32[:, ::1], float32[::1], float32[::1], int32)",
        twin=attn_project_heads_twin, reads=(0, 1, 2), writes=(2,))
def attn_project_heads(Wo, o, x, head_dim):
    """x[r] += sum over heads h, in order, of Wo[r, head h] . o[head h]: attn_fused's tail
    (its head_out rows and their sum) for every row, a warp per row.

    Wo [D, D], o [D] (attn_merge's), x [D]; grid project_grid(D), block (MATVEC_THREADS,).
    """
    pdl_wait()
    pdl_launch_dependents()  # the next kernel may launch now; it waits in its pdl_wait
    red = cuda.shared.array(MATVEC_THREADS, numba.float32)  # [threads] (simulator's tree)
    tid = cuda.threadIdx.x
    r = cuda.blockIdx.x * MATVEC_ROWS_PER_BLOCK + tid // WARP
    H = o.shape[0] // head_dim
    dots = cuda.local.array(PROJ_HEADS, numba.float32)
    s = numba.float32(0.0)
    for h0 in range(0, H, PROJ_HEADS):                      # PROJ_HEADS heads' loads at once
        heads_dots(Wo, r, h0, H, head_dim, o, tid, red, dots)
        for i in range(PROJ_HEADS):                         # summed in head order, as attn_fused
            if h0 + i < H:
                s = dots[i] if h0 + i == 0 else s + dots[i]   # (not 0 + dots[0]: -0.0 stays)
    if tid % WARP == 0 and r < x.shape[0]:
        x[r] = x[r] + s
