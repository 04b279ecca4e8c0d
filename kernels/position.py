"""The step's last kernel: advance the device-resident position.

Owns `advance`: pos[0] += 1. The host never writes the position during generation, so the next
replay of the captured graph reads the new one. Advancing it inside the graph is this lab's
design, not the only correct one: a host write of `pos` between graph launches works too
(notebook 02); what breaks is a host write that ran only at capture (LAB_BUG_POS_OUTSIDE_GRAPH).
"""
from numba import cuda

from kernels.registry import kernel
from kernels.pdl import pdl_launch_dependents, pdl_wait

ADVANCE_GRID = (1,)
ADVANCE_BLOCK = (1,)


def advance_twin(grid, block, pos):
    pos[0] += 1


@kernel("void(int32[::1])", twin=advance_twin, reads=(0,), writes=(0,))
def advance(pos):
    """pos[0] += 1; grid (1,), block (1,)."""
    pdl_wait()
    pdl_launch_dependents()  # the next kernel may launch now; it waits in its pdl_wait
    if cuda.threadIdx.x == 0 and cuda.blockIdx.x == 0:  # robust to a wider launch
        pos[0] += 1


# ---- the cases kernels/check.py runs
CASES = {
    "tol": (0.0, 0),
    "why": "an integer: exact",
}
