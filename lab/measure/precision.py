"""Reduction order and precision: NumPy functions of numbers (no engine), and one check that runs
three kernels by themselves.

Reduction order (lecture §8):
  chain_sum        left to right, one float32 rounding per element
  tree_sum         a balanced tree (element t with t + n/2, then halve: the kernels' pairing)
  tree_reduce      the same tree for any operator (products, max, OR, ...)
  fma32            float32 fused multiply-add, rounded once (what the GPU's `cuda.fma` computes)
  strided_dot      the kernels' own order: `lanes` strided fma chains, then a fixed tree over lanes
  row_dot_order    kernels/matvec.py's `row_dot` (32 lanes) for every row of W
  rmsnorm_order    kernels/rmsnorm.py's `rmsnorm` (256 threads), the whole normalisation
  sum_bounds       the textbook worst-case bounds of a chain, a tree and the kernels' order
  ulps_apart       how many float32 steps two results are apart
Greedy sampling's policy: `argmax_index` is kernels/sample.py's rule (ties to the lowest index,
NaN never wins, all-NaN gives 0); `scan_argmax` scans in any order with an explicit tie rule.
Distances between two sides' logits (lecture §9): `log_softmax`, `kld` (KL(P||Q), per step),
`margin` (top-1 minus top-2 logit), `step_metrics` (everything compare reports per step).
Measurements (notebook 09, the tests, `decode-lab record precision`): `order_errors` (error
against the exact sum per order and length), `reorder_table` (which reorderings change bits),
`ARGMAX_CASES` (crafted logits), `kernel_order_check` (matvec, rmsnorm and argmax_next run by
themselves through lab/measure/kernel_run.py, on numba's CUDA simulator or a GPU, against the
mirrors).

`fused=True` in the kernel-order functions rounds each fma once, as the GPU does; `fused=False`
rounds the product and then the sum, as numba's CUDA simulator does (its `cuda.fma` is
`a * b + c` on float32 scalars). One fma can differ by the last bit; a sum carries it on.
"""
from __future__ import annotations

import math

import numpy as np

from kernels.matvec import WARP, row_dot_order
from kernels.reduce import fma32, mul_add as _mul_add, strided_dot
from kernels.rmsnorm import RMSNORM_THREADS, rmsnorm_order
from kernels.sample import argmax_twin_index

F32 = np.float32
U32 = float(np.finfo(np.float32).eps) / 2   # unit roundoff of float32 (2**-24)


# ---- sums in three orders ----------------------------------------------------------------------
def chain_sum(x) -> np.ndarray:
    """Sum over the last axis, left to right in float32 (one rounding per added element)."""
    x = np.asarray(x, dtype=F32)
    return np.add.accumulate(x, axis=-1, dtype=F32)[..., -1]   # accumulate is strictly sequential


def tree_reduce(x, op=np.add, identity=0) -> np.ndarray:
    """Reduce the last axis by a balanced tree, in x's dtype: element t is combined with element
    t + n/2, then the first half is reduced the same way (padded with `identity` to a power of
    two: adding +0.0 to a nonzero partial sum, or multiplying by 1.0, changes no bit)."""
    x = np.asarray(x)
    n = x.shape[-1]
    width = 1 << max(n - 1, 0).bit_length()
    if width != n:
        x = np.concatenate([x, np.full(x.shape[:-1] + (width - n,), identity, x.dtype)], axis=-1)
    while width > 1:
        width //= 2
        x = op(x[..., :width], x[..., width:2 * width])
    return x[..., 0]


def tree_sum(x) -> np.ndarray:
    """Sum over the last axis by the kernels' balanced tree (see tree_reduce)."""
    return tree_reduce(np.asarray(x, dtype=F32), np.add, 0.0)


def ulps_apart(a, b) -> np.ndarray:
    """How many float32 steps separate a and b (0: the same bits, or +0 and -0)."""
    def ordered(v):  # float32 bits as integers that sort like the floats
        i = np.asarray(v, dtype=F32).view(np.int32).astype(np.int64)
        return np.where(i < 0, -(i & 0x7FFFFFFF), i)
    return np.abs(ordered(a) - ordered(b))


def sum_bounds(n: int, lanes: int = WARP) -> dict[str, float]:
    """Worst-case |computed - exact| / sum|x| for a float32 sum of n terms, to first order in the
    unit roundoff u = 2**-24 (Higham, ch. 4): a chain rounds n - 1 times in a row, a tree
    ceil(log2 n) times along any path, the kernels' order ceil(n / lanes) - 1 + log2(lanes)."""
    depth = {"chain": n - 1, "tree": math.ceil(math.log2(n)) if n > 1 else 0,
             "kernel": math.ceil(n / lanes) - 1 + int(math.log2(lanes))}
    return {k: d * U32 for k, d in depth.items()}


# ---- argmax: the sampler's policy --------------------------------------------------------------
def argmax_index(logits) -> int:
    """The greedy sampler's rule (kernels/sample.py): lowest index of the largest non-NaN
    logit; 0 when every logit is NaN."""
    return argmax_twin_index(np.asarray(logits))


def scan_argmax(logits, order, ties: str = "lowest") -> int:
    """Scan the logits in `order` keeping the best (value, index) seen. ties="lowest": an equal
    value wins only with a lower index (the kernel's rule, so the order cannot matter);
    ties="first": the first one scanned stays (a rule whose answer depends on the order). NaN
    never wins; with no non-NaN logit the answer is 0, as in the kernel."""
    best_v, best_i = -math.inf, None
    for i in order:
        v = float(logits[i])
        if math.isnan(v):
            continue
        if best_i is None or v > best_v or (ties == "lowest" and v == best_v and i < best_i):
            best_v, best_i = v, int(i)
    return 0 if best_i is None else best_i


# ---- distances between two sides' logits --------------------------------------------------------
def log_softmax(logits) -> np.ndarray:
    """log softmax over the last axis, in float64."""
    z = np.asarray(logits, dtype=np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def kld(p_logits, q_logits) -> np.ndarray:
    """KL(P || Q) = sum_i P_i (log P_i - log Q_i), P = softmax(p_logits), per row (nats)."""
    lp, lq = log_softmax(p_logits), log_softmax(q_logits)
    return np.sum(np.exp(lp) * (lp - lq), axis=-1)


def margin(logits) -> np.ndarray:
    """Top-1 minus top-2 logit per row: how far the greedy pick is from a tie."""
    top2 = np.sort(np.asarray(logits, dtype=np.float64), axis=-1)[..., -2:]
    return top2[..., 1] - top2[..., 0]


def step_metrics(a_logits, b_logits) -> dict[str, np.ndarray]:
    """Per step (row) of two sides' logits [steps, vocab]: KL both ways, each side's top-1
    (the sampler's rule) and whether they agree, max |Δlogit|, and each side's margin."""
    a = np.asarray(a_logits, dtype=np.float64)
    b = np.asarray(b_logits, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 2:
        raise ValueError(f"logits must be two [steps, vocab] arrays of one shape, got {a.shape} "
                         f"and {b.shape}")
    top_a = np.array([argmax_index(r) for r in a], dtype=np.int64)
    top_b = np.array([argmax_index(r) for r in b], dtype=np.int64)
    return {"kld_ab": kld(a, b), "kld_ba": kld(b, a), "top1_a": top_a, "top1_b": top_b,
            "agree": top_a == top_b, "max_dlogit": np.abs(a - b).max(axis=-1),
            "margin_a": margin(a), "margin_b": margin(b)}


# ---- measurements (notebook 09, tests, `decode-lab record precision`) --------------------------
def order_errors(sizes=(64, 256, 1024, 4096, 16384), vectors: int = 200, seed: int = 0) -> dict:
    """|computed - exact| / sum|x| of float32 sums of `vectors` uniform [0, 1) vectors per size,
    in three orders: chain, tree, and the kernels' 32-lane order. `exact` is math.fsum (the
    correctly rounded sum). {n: {"chain": errors [vectors], "tree": ..., "kernel": ...,
    "bounds": sum_bounds(n)}}."""
    rng = np.random.default_rng(seed)
    out = {}
    for n in sizes:
        x = rng.random((vectors, n), dtype=np.float32)
        exact = np.array([math.fsum(row.tolist()) for row in x])
        ones = np.ones(n, F32)   # x * 1 is exact, so fused or not gives the same sum
        got = {"chain": chain_sum(x), "tree": tree_sum(x),
               "kernel": strided_dot(x, ones, WARP, fused=False)}
        out[n] = {k: np.abs(v.astype(np.float64) - exact) / exact for k, v in got.items()}
        out[n]["bounds"] = sum_bounds(n)
    return out


def _bits(v) -> np.ndarray:
    v = np.asarray(v)
    return v.view(np.uint32) if v.dtype == F32 else v


def _differ(results: list) -> tuple[int, int]:
    """(vectors whose results are not all the same bits, max float32 ulps between them)."""
    first = results[0]
    differ = np.zeros(np.shape(first), bool)
    ulps = np.zeros(np.shape(first), np.int64)
    for r in results[1:]:
        differ |= _bits(r) != _bits(first)
        if np.asarray(r).dtype == F32:
            ulps = np.maximum(ulps, ulps_apart(r, first))
    return int(differ.sum()), int(ulps.max())


def reorder_table(n: int = 256, vectors: int = 100, seed: int = 0) -> list[dict]:
    """Which reorderings change bits: each operator reduced over `vectors` random vectors of n
    elements in several orders (forward, reversed, a balanced tree, a shuffle, and for the sum
    the kernels' 32-lane order); per operator, how many vectors got results that are not all
    the same bits."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((vectors, n)).astype(F32)
    perm = rng.permutation(n)
    flip = slice(None, None, -1)

    def orders(v, chain, tree):
        return [chain(v), chain(v[:, flip]), tree(v), chain(v[:, perm])]

    near1 = (1 + 0.01 * x).astype(F32)
    mags = np.abs(x)
    words = x.view(np.uint32)
    tied = np.round(x * 2) / 2                       # many exact ties
    half = n // 2
    rows = [
        ("float32 sum (+)",
         orders(x, chain_sum, tree_sum) + [strided_dot(x, np.ones(n, F32), WARP)],
         "forward, reversed, tree, shuffled, 32-lane kernel order"),
        ("float32 product (x)", orders(near1, lambda v: np.multiply.accumulate(v, axis=-1)[:, -1],
                                       lambda v: tree_reduce(v, np.multiply, 1.0)),
         "forward, reversed, tree, shuffled"),
        ("max of |x| (finite)", orders(mags, lambda v: np.maximum.accumulate(v, axis=-1)[:, -1],
                                       lambda v: tree_reduce(v, np.maximum, 0.0)),
         "forward, reversed, tree, shuffled"),
        ("bitwise OR (uint32)", orders(words, lambda v: np.bitwise_or.accumulate(v, axis=-1)[:, -1],
                                       lambda v: tree_reduce(v, np.bitwise_or, 0)),
         "forward, reversed, tree, shuffled"),
        ("argmax, ties to the lowest index", [np.array([scan_argmax(r, o) for r in tied])
                                              for o in (range(n), range(n)[::-1], perm)],
         "forward, reversed, shuffled scans"),
        ("argmax, first scanned wins", [np.array([scan_argmax(r, o, "first") for r in tied])
                                        for o in (range(n), range(n)[::-1], perm)],
         "forward, reversed, shuffled scans"),
        ("a + b against b + a", [x[:, :half] + x[:, half:], x[:, half:] + x[:, :half]],
         f"{half} pairs per vector, both operand orders"),
    ]
    table = []
    for op, results, how in rows:
        differ, ulps = _differ(results)
        table.append({"operator": op, "orders": how, "vectors": vectors, "differ": differ,
                      "max_ulps": ulps if np.asarray(results[0]).dtype == F32 else None})
    return table


# crafted logits for the sampler's policy: (what the case tests, logits)
_NAN, _INF = float("nan"), float("inf")
ARGMAX_CASES: list[tuple[str, np.ndarray]] = [
    (name, np.array(v, F32)) for name, v in [
        ("tie at 1 and 2", [1, 3, 3, 2]),
        ("tie at 7, 100, 263 (7 and 263: one thread)", [5 if i in (7, 100, 263) else 0
                                                         for i in range(300)]),
        ("NaN first, then a maximum", [_NAN, 2, 5, _NAN]),
        ("all NaN", [_NAN] * 4),
        ("+inf twice after a NaN", [_NAN, 1, _INF, _INF]),
        ("-inf only, and a NaN", [-_INF, _NAN, -_INF]),
        ("-0.0 then +0.0", [-0.0, 0.0, -1]),
        ("+0.0 then -0.0", [-1, 0.0, -0.0]),
    ]]


def kernel_order_check(device: str = "cudasim", seed: int = 0, rows: int = 8, k: int = 256) -> dict:
    """Run matvec, rmsnorm and argmax_next by themselves on `device` (lab/measure/kernel_run.py) and
    hold their bits against the order mirrors above (with this device's fma: unfused on numba's
    simulator, fused on a GPU), against the mirrors with the other fma, and against the NumPy
    twins that the sim backend runs. JSON-ready."""
    from kernels.matvec import matvec_twin
    from kernels.rmsnorm import rmsnorm_twin

    from .kernel_run import run_kernels
    rng = np.random.default_rng(seed)
    W, x = rng.standard_normal((rows, k)).astype(F32), rng.standard_normal(k).astype(F32)
    xr = (3 * rng.standard_normal(k)).astype(F32)
    wr = (1 + 0.1 * rng.standard_normal(k)).astype(F32)
    eps = F32(1e-5)
    inputs = {"matvec_W": W, "matvec_x": x, "rmsnorm_x": xr, "rmsnorm_w": wr, "rmsnorm_eps": eps,
              **{f"argmax_{i}": v for i, (_, v) in enumerate(ARGMAX_CASES)}}
    out, where = run_kernels(inputs, device)
    fused = device == "gpu"
    twin_mv, twin_rn = np.zeros(rows, F32), np.zeros(k, F32)
    matvec_twin(None, None, W, x, twin_mv)
    rmsnorm_twin(None, None, xr, wr, twin_rn, eps)
    exact_mv = (W.astype(np.float64) @ x.astype(np.float64)).astype(F32)

    def versus(got, mirror, other, twin, exact=None) -> dict:
        row = {"elements": int(got.size),
               "same_as_mirror": int(np.sum(_bits(got) == _bits(mirror))),
               "same_as_other_fma": int(np.sum(_bits(got) == _bits(other))),
               "same_as_twin": int(np.sum(_bits(got) == _bits(twin))),
               "max_ulps_twin": int(ulps_apart(got, twin).max())}
        if exact is not None:   # float64 result rounded to float32: which one is closer?
            row.update(max_ulps_kernel_float64=int(ulps_apart(got, exact).max()),
                       max_ulps_twin_float64=int(ulps_apart(twin, exact).max()))
        return row

    picks = [int(out[f"argmax_{i}"][0]) for i in range(len(ARGMAX_CASES))]
    return {"where": where, "fused": fused, "seed": seed,
            "matvec": versus(out["matvec_out"], row_dot_order(W, x, fused),
                             row_dot_order(W, x, not fused), twin_mv, exact_mv),
            "rmsnorm": versus(out["rmsnorm_out"], rmsnorm_order(xr, wr, eps, fused),
                              rmsnorm_order(xr, wr, eps, not fused), twin_rn),
            "argmax": [{"case": name, "kernel": pick, "rule": argmax_index(v),
                        "np_argmax": int(np.argmax(v))}
                       for (name, v), pick in zip(ARGMAX_CASES, picks)]}
