"""Token embedding: the step's first kernel reads the CURRENT token from device memory.

Owns `embed`: x = wte[tokens[pos[0]]]. The token id is never a host value, so a captured graph
replays correctly at every position.
"""
import numpy as np
from numba import cuda

from kernels.registry import kernel
from kernels.pdl import pdl_launch_dependents, pdl_wait

EMBED_THREADS = 128


def grid_for(d_model: int) -> tuple[tuple[int], tuple[int]]:
    """(grid, block) for `embed` over a residual stream of d_model floats."""
    return ((d_model + EMBED_THREADS - 1) // EMBED_THREADS,), (EMBED_THREADS,)


def embed_twin(grid, block, tokens, pos, wte, x):
    x[:] = wte[int(tokens[int(pos[0])])]


@kernel("void(int32[::1], int32[::1], float32[:, ::1], float32[::1])",
        twin=embed_twin, reads=(0, 1, 2), writes=(3,))
def embed(tokens, pos, wte, x):
    """x[i] = wte[tokens[pos[0]], i]; tokens [max_seq], pos [1], wte [V, D], x [D]."""
    pdl_wait()
    pdl_launch_dependents()  # the next kernel may launch now; it waits in its pdl_wait
    i = cuda.grid(1)
    if i < x.shape[0]:
        x[i] = wte[tokens[pos[0]], i]


# ---- the cases kernels/check.py runs (c: the dims of one of its tiny models)
CASES = {
    "positions": lambda c: (0, 5, c["max_seq"] - 1),   # the first, a middle and the last slot
    "tol": (0.0, 0),
    "why": "a gather: exact",
}
