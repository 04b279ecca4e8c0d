"""Reductions the kernels share, each in ONE fixed order whichever way it runs.

Owns the device functions
- `warp_sum(v, tid, red)`: the sum of v over the 32 lanes of thread tid's warp; every lane
  returns it (matvec's `row_dot`, attention);
- `warp_sums(vals, tid, red)`: the same for each of the WARP_SUMS values of a local array, in
  place (attention: one score per timestep a warp holds);
- `block_sum(v, tid, red)`: the sum over a block of BLOCK_THREADS = 256 threads (rmsnorm);
- `block_argmax(v, i, tid, red_v, red_i)`: the index of the largest value over such a block,
  ties to the lowest index (argmax_next);
and NumPy twins of both dataflows (`*_tree_twin`, `*_shuffle_twin`), which tests/test_kernels.py
holds bit for bit against each other and against lab/measure/precision.py's order mirrors.

The orders. A warp's sum is the tree "lane l += lane l + s for s = 16, 8, 4, 2, 1", read from
lane 0. A block's sum is the same tree over 256 threads, s = 128, 64, ..., 1: the strides 128,
64 and 32 cross warps, the last five are a warp's sum. argmax keeps (value, index) pairs:
another pair wins if its value is larger, or equal with a lower index. That is a total order on
the pairs (values are never NaN; -0.0 == +0.0 ties go to the lower index), so the winning index
does not depend on the order the pairs meet in: the simulator keeps the 256-thread tree, the GPU
path folds a lane's 8 values in turn, then a butterfly.

Two implementations of each, chosen at import (`SHUFFLES`), with the same order and so the same
bits:
- shuffles (a GPU). `shfl_xor_sync` butterfly: at stride s lane l adds lane l ^ s's value, v + w
  in that operand order. Lane 0 adds exactly the operands the tree's thread 0 adds; lane l ^ s
  adds the same two values the other way round, and float addition is commutative bit for bit
  (a + b == b + a in IEEE arithmetic), so after stride s lanes l and l ^ s hold the same bits,
  and after s = 1 every lane holds lane 0's total: no broadcast, and no block barrier. A block's
  sum: every thread stores its value, ONE barrier, then every warp reads the 8 values of its lane
  (t, t + 32, ..., t + 224) and adds them in the tree's pairing, strides 128, 64, 32, before its
  own butterfly: each warp computes the block's total (same bits everywhere), no second barrier
  (the tree took 9). argmax likewise, on pairs.
  Masks are 0xFFFFFFFF: every caller keeps whole warps converged at each call.
- shared-memory trees with block barriers (numba's CUDA simulator, which has no shfl_*_sync):
  the kernels' original trees. Their barriers are block-wide, so EVERY thread of the block must
  make the same calls, the same number of times (all callers are written so, also on the GPU).
A simulator given lane-exact warp shuffles (kernels/cudasim.py's install_warp_shuffles;
tests/_cudasim_kernels.py --shuffles installs them)
takes the shuffle path: that is how the GPU path's logic is run, and its bits checked against
the tree's, on a machine without a GPU.

`red` is a shared scratch array the tree needs ([blockDim.x] floats; [WARP_SUMS, blockDim.x] for
`warp_sums`); the shuffle path does not touch it. Both paths leave it free for reuse on return
except `block_sum` / `block_argmax` on the shuffle path: a second call needs a barrier first.
"""
import numba
import numpy as np
from numba import config, cuda

WARP = 32
FULL_MASK = 0xFFFFFFFF     # every lane of the warp takes part
BLOCK_THREADS = 256        # block_sum / block_argmax: blocks of exactly this many threads
BLOCK_WARPS = BLOCK_THREADS // WARP
WARP_SUMS = 8              # values per warp_sums call (attention: timesteps a warp holds)


def _has_shuffles() -> bool:
    """A GPU has shfl_*_sync; numba's CUDA simulator only if a test installed them."""
    if not config.ENABLE_CUDASIM:
        return True
    from numba.cuda.simulator.kernelapi import FakeCUDAModule
    return hasattr(FakeCUDAModule, "shfl_xor_sync")


SHUFFLES = _has_shuffles()


@cuda.jit(device=True)
def better(ov, oi, v, i):
    """Does (ov, oi) beat (v, i)? Larger value, or equal value and lower index. Values are
    never NaN here (the scan skips NaN), so this is a total order."""
    return ov > v or (ov == v and oi < i)


if SHUFFLES:
    @cuda.jit(device=True)
    def warp_sum(v, tid, red):
        """Sum of v over tid's warp (tree order s = 16..1); every lane returns it."""
        s = WARP // 2
        while s > 0:
            v = v + cuda.shfl_xor_sync(FULL_MASK, v, s)
            s //= 2
        return v

    @cuda.jit(device=True)
    def warp_sums(vals, tid, red):
        """vals[i] <- its sum over tid's warp, for i < WARP_SUMS; the sums interleave."""
        s = WARP // 2
        while s > 0:
            for i in range(WARP_SUMS):  # independent butterflies, issued together
                vals[i] = vals[i] + cuda.shfl_xor_sync(FULL_MASK, vals[i], s)
            s //= 2

    @cuda.jit(device=True)
    def block_sum(v, tid, red):
        """Sum of v over the block's 256 threads (tree order s = 128..1); every thread returns it."""
        red[tid] = v
        cuda.syncthreads()
        lane = tid % WARP
        a0 = red[lane] + red[lane + 128]         # stride 128
        a1 = red[lane + 32] + red[lane + 160]
        a2 = red[lane + 64] + red[lane + 192]
        a3 = red[lane + 96] + red[lane + 224]
        b0 = a0 + a2                             # stride 64
        b1 = a1 + a3
        return warp_sum(b0 + b1, tid, red)       # stride 32, then the warp's own tree

    @cuda.jit(device=True)
    def block_argmax(v, i, tid, red_v, red_i):
        """Index of the best (value, index) pair over the block's 256 threads; every thread
        returns it. i must be int32."""
        red_v[tid] = v
        red_i[tid] = i
        cuda.syncthreads()
        lane = tid % WARP
        bv = red_v[lane]
        bi = red_i[lane]
        for j in range(1, BLOCK_WARPS):  # a total order: the pairing cannot change the winner
            ov = red_v[lane + WARP * j]
            oi = red_i[lane + WARP * j]
            if better(ov, oi, bv, bi):
                bv = ov
                bi = oi
        s = WARP // 2
        while s > 0:
            ov = cuda.shfl_xor_sync(FULL_MASK, bv, s)
            oi = cuda.shfl_xor_sync(FULL_MASK, bi, s)
            if better(ov, oi, bv, bi):
                bv = ov
                bi = oi
            s //= 2
        return bi

else:
    @cuda.jit(device=True)
    def warp_sum(v, tid, red):
        """Sum of v over tid's warp (tree order s = 16..1); every lane returns it.
        red: shared [blockDim.x]; every thread of the block must call."""
        lane = tid % WARP
        red[tid] = v
        cuda.syncthreads()
        s = WARP // 2
        while s > 0:
            if lane < s:
                red[tid] = red[tid] + red[tid + s]
            cuda.syncthreads()
            s //= 2
        total = red[tid - lane]
        cuda.syncthreads()  # everyone has read: red is free again
        return total

    @cuda.jit(device=True)
    def warp_sums(vals, tid, red):
        """vals[i] <- its sum over tid's warp, for i < WARP_SUMS (one tree per value, all at
        once). red: shared [WARP_SUMS, blockDim.x]; every thread of the block must call."""
        lane = tid % WARP
        for i in range(WARP_SUMS):
            red[i, tid] = vals[i]
        cuda.syncthreads()
        s = WARP // 2
        while s > 0:
            if lane < s:
                for i in range(WARP_SUMS):
                    red[i, tid] = red[i, tid] + red[i, tid + s]
            cuda.syncthreads()
            s //= 2
        for i in range(WARP_SUMS):
            vals[i] = red[i, tid - lane]
        cuda.syncthreads()

    @cuda.jit(device=True)
    def block_sum(v, tid, red):
        """Sum of v over the block's 256 threads (tree order s = 128..1); every thread returns it."""
        red[tid] = v
        cuda.syncthreads()
        s = BLOCK_THREADS // 2
        while s > 0:  # fixed pairing: the sum order never depends on timing
            if tid < s:
                red[tid] = red[tid] + red[tid + s]
            cuda.syncthreads()
            s //= 2
        return red[0]

    @cuda.jit(device=True)
    def block_argmax(v, i, tid, red_v, red_i):
        """Index of the best (value, index) pair over the block's 256 threads; every thread
        returns it."""
        red_v[tid] = v
        red_i[tid] = i
        cuda.syncthreads()
        s = BLOCK_THREADS // 2
        while s > 0:
            if tid < s:
                ov = red_v[tid + s]
                oi = red_i[tid + s]
                if better(ov, oi, red_v[tid], red_i[tid]):
                    red_v[tid] = ov
                    red_i[tid] = oi
            cuda.syncthreads()
            s //= 2
        return red_i[0]


# ---- NumPy twins of both dataflows (tests/test_kernels.py holds them against each other) ------

def _tree_twin(v, n: int) -> np.ndarray:
    """A shared-memory tree's dataflow on v [..., n] float32: element 0's total after the
    strides n/2, n/4, ..., 1 (element i += element i + s), [...]."""
    red = np.array(v, dtype=np.float32)
    s = n // 2
    while s > 0:
        red[..., :s] = red[..., :s] + red[..., s:2 * s]
        s //= 2
    return red[..., 0]


def warp_sum_tree_twin(v) -> np.ndarray:
    """The tree's dataflow on v [..., 32] float32: lane 0's total after s = 16..1, [...]."""
    return _tree_twin(v, WARP)


def warp_sum_shuffle_twin(v) -> np.ndarray:
    """The xor butterfly's dataflow on v [..., 32] float32: EVERY lane's result, [..., 32]."""
    v = np.array(v, dtype=np.float32)
    lane = np.arange(WARP)
    s = WARP // 2
    while s > 0:
        v = v + v[..., lane ^ s]  # own value first, as in the kernel: v + shfl_xor(v, s)
        s //= 2
    return v


def block_sum_tree_twin(v) -> np.ndarray:
    """The 256-thread tree on v [..., 256] float32: thread 0's total, [...]."""
    return _tree_twin(v, BLOCK_THREADS)


def block_sum_shuffle_twin(v) -> np.ndarray:
    """The shuffle path on v [..., 256] float32: every thread's result, [..., 256] (each warp
    reads its lane's 8 values, adds them in the tree's pairing, then its butterfly)."""
    v = np.array(v, dtype=np.float32)
    col = [v[..., WARP * j:WARP * (j + 1)] for j in range(BLOCK_WARPS)]   # 8 x [..., 32]
    a = [col[j] + col[j + 4] for j in range(4)]                            # stride 128
    b = [a[0] + a[2], a[1] + a[3]]                                         # stride 64
    lanes = warp_sum_shuffle_twin(b[0] + b[1])                             # stride 32, 16..1
    return np.concatenate([lanes] * BLOCK_WARPS, axis=-1)                  # every warp alike


def _better(ov, oi, v, i):
    return (ov > v) | ((ov == v) & (oi < i))


def block_argmax_tree_twin(v, i) -> np.ndarray:
    """The 256-thread argmax tree on pairs v, i [..., 256]: thread 0's index, [...]."""
    v, i = np.array(v, dtype=np.float32), np.array(i, dtype=np.int32)
    s = BLOCK_THREADS // 2
    while s > 0:
        take = _better(v[..., s:2 * s], i[..., s:2 * s], v[..., :s], i[..., :s])
        v[..., :s] = np.where(take, v[..., s:2 * s], v[..., :s])
        i[..., :s] = np.where(take, i[..., s:2 * s], i[..., :s])
        s //= 2
    return i[..., 0]


def block_argmax_shuffle_twin(v, i) -> np.ndarray:
    """The shuffle path's argmax on pairs v, i [..., 256]: every thread's index, [..., 256]."""
    v, i = np.array(v, dtype=np.float32), np.array(i, dtype=np.int32)
    bv, bi = v[..., :WARP].copy(), i[..., :WARP].copy()
    for j in range(1, BLOCK_WARPS):
        ov, oi = v[..., WARP * j:WARP * (j + 1)], i[..., WARP * j:WARP * (j + 1)]
        take = _better(ov, oi, bv, bi)
        bv, bi = np.where(take, ov, bv), np.where(take, oi, bi)
    lane = np.arange(WARP)
    s = WARP // 2
    while s > 0:
        ov, oi = bv[..., lane ^ s], bi[..., lane ^ s]
        take = _better(ov, oi, bv, bi)
        bv, bi = np.where(take, ov, bv), np.where(take, oi, bi)
        s //= 2
    return np.concatenate([bi] * BLOCK_WARPS, axis=-1)
