"""Probe kernels for the cost recorder (decode-lab record costs): no part of a decode step.

Owns `empty` (does nothing but its PDL wait: a graph of N of them measures the per-node floor
and the inter-node gap, with and without PDL), `spin` (one thread runs a dependent loop of
`iters` steps: queued first on a stream, it holds the device while the host enqueues eager
launches behind it, so CUDA events then time those launches' DEVICE side alone) and `pos_set`
(one thread writes pos[0] = value: chained after a launch that advances the position, the
persistent step's, it puts the position back, so every link of a chain runs at the same
context instead of walking it and past max_seq) and `relay` (dst = src + 1 over 256 floats,
one block: a chain of relays, each reading what the node before it wrote, measures the floor of a
node that depends on data, the empty node's floor plus one round trip through memory).
"""
import numba
import numpy as np
from numba import cuda

from kernels.registry import kernel
from kernels.pdl import pdl_launch_dependents, pdl_wait

EMPTY_GRID = (1,)
EMPTY_BLOCK = (32,)
SPIN_GRID = (1,)
SPIN_BLOCK = (1,)
POS_SET_GRID = (1,)
POS_SET_BLOCK = (32,)
RELAY_GRID = (1,)
RELAY_BLOCK = (256,)


def empty_twin(grid, block, flag):
    pass


@kernel("void(int32[::1])", twin=empty_twin, reads=(), writes=())
def empty(flag):
    """Nothing; grid (1,), block (32,). `flag` is unused (a launch needs an argument to flatten)."""
    pdl_wait()
    pdl_launch_dependents()


def spin_twin(grid, block, iters, out):
    acc, r, one = np.float32(0.0), np.float32(0.999999), np.float32(1.0)
    for _ in range(int(iters)):
        acc = acc * r + one
    out[0] = acc


@kernel("void(int32, float32[::1])", twin=spin_twin, reads=(), writes=(1,))
def spin(iters, out):
    """out[0] = the result of `iters` dependent multiply-adds; grid (1,), block (1,)."""
    pdl_wait()
    if cuda.threadIdx.x == 0 and cuda.blockIdx.x == 0:
        acc = numba.float32(0.0)
        for i in range(iters):
            acc = acc * numba.float32(0.999999) + numba.float32(1.0)
        out[0] = acc


def pos_set_twin(grid, block, pos, value):
    pos[0] = value


@kernel("void(int32[::1], int32)", twin=pos_set_twin, reads=(), writes=(0,))
def pos_set(pos, value):
    """pos[0] = value; grid (1,), block (32,). The cost recorder's chains of the persistent step
    ([step_persistent, pos_set(p)] repeated) run every step at position p."""
    pdl_wait()
    if cuda.threadIdx.x == 0 and cuda.blockIdx.x == 0:
        pos[0] = value


def relay_twin(grid, block, src, dst):
    dst[:] = src + np.float32(1.0)


@kernel("void(float32[::1], float32[::1])", twin=relay_twin, reads=(0,), writes=(1,))
def relay(src, dst):
    """dst[i] = src[i] + 1 for i < len(dst); grid (1,), block (256,), one element a thread (the
    shape of rmsnorm's vector without its reduction). Chained relay(a, b), relay(b, a): each
    node reads what the one before it wrote."""
    pdl_wait()
    pdl_launch_dependents()
    i = cuda.threadIdx.x
    if i < dst.shape[0]:
        dst[i] = src[i] + numba.float32(1.0)


# ---- the cases kernels/check.py runs
CASES = {
    "tol": (0.0, 0),
    "why": "integers and copies: exact",
    "spin_tol": (0.0, 4),
    "spin_why": "spin's float32 loop against the twin's: a few eps",
}
