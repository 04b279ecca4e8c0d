"""Reduction order and precision (lab/measure/precision.py): the order mirrors, the fma that rounds
once, which reorderings keep bits, the sampler's argmax policy, KL's asymmetry, and the float16 KV
cache's distance to the float64 oracle."""
import itertools
from fractions import Fraction

import numpy as np
import pytest

from lab.config import LabConfig
from lab.measure import precision as P
from lab.measure.compare import kv_dtype_study

F32 = np.float32


def _fma_exact(a, b, c) -> np.float32:
    """round_to_nearest_even(a * b + c) to float32, from exact rationals."""
    exact = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))
    near = np.float32(float(exact))
    cands = [near, np.nextafter(near, F32(np.inf)), np.nextafter(near, F32(-np.inf))]
    dist = [abs(Fraction(float(v)) - exact) for v in cands]
    best = min(dist)
    ties = [v for v, d in zip(cands, dist) if d == best]
    return min(ties, key=lambda v: int(np.array(v).view(np.uint32)) & 1)   # ties to even


def test_fma32_rounds_once_where_float64_rounds_twice():
    # a*b = 2**-24 + 4688 * 2**-70: 1 + a*b lies just above the float32 midpoint between 1 and
    # 1 + 2**-23, but rounds onto that midpoint in float64 (and then, ties to even, to 1.0)
    a = F32(2.0**-12 * (1 + 2896 * 2.0**-23))
    b = F32(2.0**-12 * (1 - 2895 * 2.0**-23))
    c = F32(1.0)
    assert F32(np.float64(a) * np.float64(b) + np.float64(c)) == F32(1.0)     # twice: wrong
    assert P.fma32(a, b, c) == F32(1 + 2.0**-23) == _fma_exact(a, b, c)


def test_fma32_matches_exact_rounding_on_random_inputs():
    rng = np.random.default_rng(3)
    a, b, c = (rng.standard_normal(400).astype(F32) * F32(s) for s in (1, 1e-3, 10))
    got = P.fma32(a, b, c)
    want = np.array([_fma_exact(*t) for t in zip(a, b, c)], F32)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_chain_and_tree_sum_follow_their_orders_exactly():
    x = np.array([1e8, 1.0, -1e8, 1.0, 3.0], F32)
    chain = F32(0)
    for v in x:
        chain = F32(chain + v)
    assert P.chain_sum(x) == chain
    # n = 5, padded to 8: (x0+x4, x1, x2, x3), then ((x0+x4)+x2, x1+x3), then their sum
    tree = F32(F32(F32(x[0] + x[4]) + x[2]) + F32(x[1] + x[3]))
    assert P.tree_sum(x) == tree
    assert P.chain_sum(x) != P.tree_sum(x)       # the example is one where the orders disagree


@pytest.mark.parametrize("fused", [False, True])
def test_strided_dot_is_lane_chains_then_a_tree(fused):
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal(10).astype(F32), rng.standard_normal(10).astype(F32)
    lanes = 4
    acc = [F32(0)] * lanes
    for k in range(10):                           # lane k % 4 takes k, in increasing k
        l_ = k % lanes
        acc[l_] = P.fma32(a[k], b[k], acc[l_]) if fused else F32(F32(a[k] * b[k]) + acc[l_])
    acc = [F32(acc[0] + acc[2]), F32(acc[1] + acc[3])]   # stride 2, then 1
    assert P.strided_dot(a, b, lanes, fused) == F32(acc[0] + acc[1])


def test_rmsnorm_order_is_the_kernels_formula():
    rng = np.random.default_rng(5)
    x, w = rng.standard_normal(300).astype(F32), rng.standard_normal(300).astype(F32)
    ss = P.strided_dot(x, x, 256)
    inv = F32(1) / np.sqrt(F32(ss / F32(300)) + F32(1e-5), dtype=F32)
    assert np.array_equal(P.rmsnorm_order(x, w, 1e-5), (x * inv) * w)


def test_ulps_and_bounds():
    one = F32(1)
    assert P.ulps_apart(one, np.nextafter(one, F32(2))) == 1
    assert P.ulps_apart(F32(-0.0), F32(0.0)) == 0
    assert P.ulps_apart(np.nextafter(F32(0), F32(-1)), np.nextafter(F32(0), F32(1))) == 2
    b = P.sum_bounds(1024)
    assert b["chain"] == 1023 * 2.0**-24 and b["tree"] == 10 * 2.0**-24
    assert b["kernel"] == (1024 // 32 - 1 + 5) * 2.0**-24


def test_measured_errors_stay_under_their_bounds_and_the_tree_wins_on_average():
    errs = P.order_errors(sizes=(64, 4096), vectors=50)
    for n, e in errs.items():
        for order in ("chain", "tree", "kernel"):
            assert e[order].max() <= e["bounds"][order]
    e = errs[4096]
    assert e["tree"].mean() < e["chain"].mean() / 5
    assert 0 < np.mean(e["tree"] < e["chain"])


def test_which_reorderings_keep_the_bits():
    table = {row["operator"]: row["differ"] for row in P.reorder_table(n=64, vectors=40)}
    assert table["float32 sum (+)"] > 0 and table["float32 product (x)"] > 0
    assert table["argmax, first scanned wins"] > 0
    for op in ("max of |x| (finite)", "bitwise OR (uint32)", "argmax, ties to the lowest index",
               "a + b against b + a"):
        assert table[op] == 0, op


def test_argmax_policy_on_crafted_logits():
    want = {"tie at 1 and 2": 1, "tie at 7, 100, 263 (7 and 263: one thread)": 7,
            "NaN first, then a maximum": 2, "all NaN": 0, "+inf twice after a NaN": 2,
            "-inf only, and a NaN": 0, "-0.0 then +0.0": 0, "+0.0 then -0.0": 1}
    assert {name: P.argmax_index(v) for name, v in P.ARGMAX_CASES} == want
    assert np.argmax(dict(P.ARGMAX_CASES)["NaN first, then a maximum"]) == 0   # numpy picks NaN


def test_lowest_index_ties_make_every_scan_order_agree():
    v = np.array([2, 5, np.nan, 5, -0.0, 5], F32)
    lowest = {P.scan_argmax(v, order) for order in itertools.permutations(range(6))}
    first = {P.scan_argmax(v, order, "first") for order in itertools.permutations(range(6))}
    assert lowest == {1} and first == {1, 3, 5}


def test_kernels_run_alone_match_the_mirror_bit_for_bit():
    """matvec, rmsnorm and argmax_next under numba's CUDA simulator (a child process)."""
    r = P.kernel_order_check("cudasim")
    assert not r["fused"] and "simulator" in r["where"]
    for kern in ("matvec", "rmsnorm"):
        assert r[kern]["same_as_mirror"] == r[kern]["elements"], kern
    assert r["matvec"]["same_as_other_fma"] < r["matvec"]["elements"]   # the fma rounding shows
    assert all(c["kernel"] == c["rule"] for c in r["argmax"])


def test_kld_is_not_symmetric_and_vanishes_only_on_equal_logits():
    p, q = np.array([[4.0, 0.0, 0.0]]), np.array([[0.0, 0.0, 0.0]])
    soft = np.exp([4.0, 0.0, 0.0]) / (np.exp(4.0) + 2)
    assert P.kld(p, q)[0] == pytest.approx(np.sum(soft * np.log(3 * soft)), rel=1e-12)
    assert abs(P.kld(p, q)[0] - P.kld(q, p)[0]) > 0.5
    rng = np.random.default_rng(6)
    a, b = rng.standard_normal((5, 9)), rng.standard_normal((5, 9))
    assert np.all(P.kld(a, b) > 0) and np.all(P.kld(a, a) == 0)
    assert np.allclose(P.kld(a, a + 3.0), 0, atol=1e-12)       # a common shift is no change


def test_step_metrics_per_step():
    a = np.array([[0.0, 1.0, 0.5], [2.0, 1.0, 0.0]])
    b = np.array([[0.0, 1.0, 0.5], [1.0, 1.5, 0.0]])
    m = P.step_metrics(a, b)
    assert m["agree"].tolist() == [True, False]
    assert m["max_dlogit"].tolist() == [0.0, 1.0]
    assert m["margin_a"].tolist() == [0.5, 1.0]
    assert m["kld_ab"][0] == 0 and m["kld_ab"][1] > 0
    with pytest.raises(ValueError):
        P.step_metrics(a, b[:1])


def test_float16_cache_is_farther_from_the_oracle_than_float32(model):
    study = kv_dtype_study(model, tokens=6, base=LabConfig(backend="sim"))
    o32, o16 = (study["pairs"][k]["summary"] for k in ("oracle-float32", "oracle-float16"))
    assert o16["mean_kld_ab"] > 100 * o32["mean_kld_ab"]
    assert o16["mean_max_dlogit"] > 100 * o32["mean_max_dlogit"]
    assert o32["top1_agreement"] == 1.0
