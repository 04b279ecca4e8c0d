"""Reductions the kernels share, each in ONE fixed order whichever way it runs.

Contents
  better                          the argmax's order on (value, index) pairs
  warp_sum, warp_sums             the sum over a warp's 32 lanes (of each of WARP_SUMS values)
  block_sum, block_argmax         the sum, the argmax over a block of BLOCK_THREADS = 256
  *_tree_twin, *_shuffle_twin     NumPy twins of both dataflows
  fma32, mul_add, strided_dot     the order twins' arithmetic: fma chains over lanes, then a tree

Two implementations of each, chosen at import (`SHUFFLES`): warp shuffles on a GPU, shared-memory
trees with block barriers under numba's CUDA simulator (which has no shfl_*_sync). They keep one
order, so one set of bits; the comments above each branch say why. A simulator given lane-exact
shuffles (kernels/cudasim.py; `python -m kernels.check --shuffles`) runs the GPU path on a
machine without a GPU.
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


# The orders. A warp's sum is the tree "lane l += lane l + s for s = 16, 8, 4, 2, 1", read from
# lane 0. A block's sum is the same tree over 256 threads, s = 128, 64, ..., 1: the strides 128,
# 64 and 32 cross warps, the last five are a warp's sum. argmax keeps (value, index) pairs
# (`better`): a total order (values are never NaN; -0.0 == +0.0 ties go to the lower index), so
# the winning index does not depend on the order the pairs meet in.
#
# `red` is the shared scratch the trees need ([blockDim.x] floats; [WARP_SUMS, blockDim.x] for
# warp_sums); the shuffle path does not touch it. Both paths leave it free on return, except
# block_sum / block_argmax on the shuffle path: a second call needs a barrier first.

if SHUFFLES:
    # shfl_xor_sync butterfly: at stride s lane l adds lane l ^ s's value, v + w in that operand
    # order. Lane 0 adds exactly the operands the tree's thread 0 adds; lane l ^ s adds the same
    # two values the other way round, and a + b == b + a bit for bit in IEEE arithmetic, so after
    # s = 1 every lane holds lane 0's total: no broadcast, no block barrier. A block's sum: every
    # thread stores its value, ONE barrier, then every warp reads the 8 values of its lane (t,
    # t + 32, ..., t + 224) and adds them in the tree's pairing (strides 128, 64, 32) before its
    # own butterfly: each warp computes the block's total, no second barrier (the tree takes 9).
    # argmax likewise, on pairs. Masks are FULL_MASK: every caller keeps whole warps converged.
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
        return warp_argmax(bv, bi)

    @cuda.jit(device=True)
    def warp_argmax(bv, bi):
        """Index of the best (value, index) pair over the warp (butterfly s = 16..1 with
        `better`: the pairing cannot change the winner); every lane returns it. bi int32."""
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
    # shared-memory trees with block barriers: the barriers are block-wide, so EVERY thread of the
    # block must make the same calls, the same number of times (all callers are written so, also
    # for the GPU)
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


# ---- NumPy twins of both dataflows (tests/kernels/test_kernels.py holds them against each other) ------

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


# ---- the order twins' arithmetic: fma chains over strided lanes, then a tree -------------
def fma32(a, b, c) -> np.ndarray:
    """round_to_float32(a * b + c) with ONE rounding, elementwise, for finite float32 inputs.

    a * b is exact in float64 (24 + 24 significant bits fit in 53). The float64 sum is rounded
    to odd (TwoSum gives its exact error; an inexact even result steps one ulp towards the exact
    value), and a round-to-odd result with more than 2 extra bits rounds correctly to float32
    (Boldo & Melquiond, 2008). A plain float64 sum would round twice and can miss by one ulp."""
    a, b, c = (np.asarray(v, dtype=np.float32).astype(np.float64) for v in (a, b, c))
    p = a * b
    s = p + c
    bb = s - p
    err = (p - (s - bb)) + (c - bb)                     # exact: s + err == p + c
    even = (np.asarray(s).view(np.int64) & 1) == 0
    toward = np.where(err > 0, np.inf, -np.inf)
    s = np.where((err != 0) & even, np.nextafter(s, toward), s)
    return s.astype(np.float32)


def mul_add(a, b, c, fused: bool):
    """a * b + c in float32: one rounding (fused, a GPU's fma) or two (numba's simulator)."""
    return fma32(a, b, c) if fused else (a * b).astype(np.float32) + c


def strided_dot(a, b, lanes: int, fused: bool = True) -> np.ndarray:
    """a . b over the last axis in a kernel's order: lane l accumulates k = l, l + lanes, ...
    by fma in increasing k (from +0.0), then the lanes are added by a tree, stride lanes/2 down
    to 1, lane l taking lane l + stride. `lanes` must be a power of two. a [..., K], b [K]."""
    a = np.asarray(a, dtype=np.float32)
    b = np.asarray(b, dtype=np.float32)
    K = a.shape[-1]
    acc = np.zeros(a.shape[:-1] + (lanes,), np.float32)         # [..., lanes]
    for start in range(0, K, lanes):
        stop = min(start + lanes, K)
        m = stop - start
        acc[..., :m] = mul_add(a[..., start:stop], b[start:stop], acc[..., :m], fused)
    stride = lanes // 2
    while stride > 0:
        acc[..., :stride] = acc[..., :stride] + acc[..., stride:2 * stride]
        stride //= 2
    return acc[..., 0]
