"""Kernel tests, no GPU needed.

(a) NumPy only: the twins against straightforward float64 math, the combine contract on the
    twins (bitwise), the house rules every registered kernel must follow, and kernels/reduce.py's
    two dataflows (GPU shuffles, simulator trees) giving the same bits as each other and as
    lab/measure/precision.py's order mirrors.
(b) The kernels themselves under numba's CUDA simulator through kernels.check (one child process
    per reduction path): on the simulator's shared-memory trees and with emulated warp shuffles
    (the GPU path), the two runs' outputs held against each other bit for bit.
"""
import ast
import inspect
import os
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

import kernels
import pytest

from kernels import REGISTRY, check
from kernels import reduce as R
from kernels.attention import (ATTN_THREADS, MAX_HEAD_DIM, attn_combine_twin, attn_merge_twin,
                               attn_partial_twin, partial_grid, slice_bounds)
from kernels.embed import embed_twin
from kernels.matvec import matvec_residual_twin, matvec_twin, row_dot_order
from kernels.mlp import swiglu_up_twin
from kernels.position import advance_twin
from kernels.rmsnorm import rmsnorm_twin
from kernels.rope import rope_kv_append_twin
from kernels.sample import argmax_next_twin
from lab.measure import precision as P

ROOT = Path(__file__).resolve().parents[2]
EPS32 = float(np.finfo(np.float32).eps)
EPS16 = float(np.finfo(np.float16).eps)


def rng():
    return np.random.default_rng(20240607)


def f32(r, *shape, scale=1.0):
    return (r.standard_normal(shape) * scale).astype(np.float32)


def assert_close(got, ref, atol, k, eps=EPS32):
    got = np.asarray(got, np.float64)
    ref = np.asarray(ref, np.float64)
    err = np.abs(got - ref)
    bound = atol + k * eps * np.abs(ref)
    assert np.all(err <= bound), f"max err {err.max():.3g}, worst bound {bound[np.argmax(err - bound)]:.3g}"


# ------------------------------------------------------------------ house rules


def test_atomics_only_count_blocks():
    """No kernel sums with atomics: the atomics in kernels/ are block counters, all in
    kernels/sync.py (release_add / acquire_load / acq_rel_add: atomics on the simulator, inline
    PTX on a GPU, under the counts and elections every kernel uses), and the megakernel's error
    word (kernels/persistent.py `record_give_up`: a compare-and-swap loop keeping the smallest
    wait code). What any block computes after a count reads every part in a fixed order."""
    where = []
    for path in sorted(Path(kernels.__file__).parent.glob("*.py")):
        tree = ast.parse(path.read_text())
        for fn in ast.walk(tree):
            if isinstance(fn, ast.FunctionDef):
                for node in ast.walk(fn):
                    if isinstance(node, ast.Attribute) and node.attr == "atomic":
                        where.append((path.name, fn.name))
    assert set(where) == {("sync.py", "release_add"), ("sync.py", "acquire_load"),
                          ("sync.py", "acq_rel_add"), ("persistent.py", "record_give_up")}, where


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_kernel_rules(name):
    """pdl_wait() first, no atomics, signatures parse and match the arity, KV kernels have f16."""
    from numba.core import sigutils

    spec = REGISTRY[name]
    src = textwrap.dedent(inspect.getsource(spec.py_func))
    fn = ast.parse(src).body[0]
    body = fn.body
    if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    first = body[0]
    waits_first = (isinstance(first, ast.Expr) and isinstance(first.value, ast.Call)
                   and getattr(first.value.func, "id", None) == "pdl_wait")
    # the one deliberate exception is the LAB_BUG_LATE_WAIT kernel (see tests/backend/test_pdl.py)
    assert waits_first == (name != "rmsnorm_late_wait"), f"{name}: first statement must be pdl_wait()"
    assert "atomic" not in src, f"{name}: no atomics (results must be bit-reproducible)"
    n_args = len(fn.args.args)
    for sig in spec.signatures:
        args, ret = sigutils.normalize_signature(sig)
        assert len(args) == n_args and str(ret) == "none", f"{name}: bad signature {sig}"
    kv = [s for s in spec.signatures if "float16" in s]
    assert len(spec.signatures) == (2 if kv else 1)
    assert set(spec.writes) <= set(range(n_args)) and set(spec.reads) <= set(range(n_args))


# ------------------------------------------------------------------ twins vs float64 math


def test_embed_twin():
    r = rng()
    wte, tokens = f32(r, 11, 16), r.integers(0, 11, 16).astype(np.int32)
    for p in (0, 7, 15):
        x = np.zeros(16, np.float32)
        embed_twin((1,), (128,), tokens, np.array([p], np.int32), wte, x)
        assert np.array_equal(x, wte[tokens[p]])


def test_rmsnorm_matvec_swiglu_twins():
    r = rng()
    x, w = f32(r, 300), f32(r, 300)
    out = np.zeros(300, np.float32)
    rmsnorm_twin((1,), (256,), x, w, out, np.float32(1e-5))
    x64 = x.astype(np.float64)
    # float32 sum of 300 squares + sqrt + 2 products vs exact: k = 32 (~log2(300) + 4, doubled)
    assert_close(out, x64 / np.sqrt(np.mean(x64 * x64) + 1e-5) * w, 1e-6, 32)

    W, v, res = f32(r, 7, 40), f32(r, 40), f32(r, 7)
    y = np.zeros(7, np.float32)
    matvec_twin((2,), (128,), W, v, y)
    # 40-term dots: error relative to sum|terms| (~40 * 0.8), not |ref|: atol 40 * eps * 32
    ref = W.astype(np.float64) @ v
    assert_close(y, ref, 40 * EPS32 * 32, 4)
    y2 = res.copy()
    matvec_residual_twin((2,), (128,), W, v, y2)
    assert_close(y2, res + ref, 40 * EPS32 * 32, 4)

    Wg, Wu, h = f32(r, 10, 16), f32(r, 10, 16), f32(r, 16)
    act = np.zeros(10, np.float32)
    swiglu_up_twin((3,), (128,), Wg, Wu, h, act)
    g, u = Wg.astype(np.float64) @ h, Wu.astype(np.float64) @ h
    assert_close(act, g / (1 + np.exp(-g)) * u, 1e-5, 16)


@pytest.mark.parametrize("cache_dtype", [np.float32, np.float16])
def test_rope_twin(cache_dtype):
    r = rng()
    H, hd, S = 3, 6, 12
    D = H * hd
    ang = np.arange(S)[:, None] * (10000.0 ** (-np.arange(hd // 2) / (hd // 2)))[None, :]
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    qkv, p = f32(r, 3 * D), 5
    q = np.zeros(D, np.float32)
    kc, vc = np.zeros((S, D), cache_dtype), np.zeros((S, D), cache_dtype)
    rope_kv_append_twin((H,), (hd,), qkv, np.array([p], np.int32), cos, sin, q, kc, vc)

    def rope64(x):  # the formula, per head, in float64
        x = x.astype(np.float64).reshape(H, hd)
        c, s, half = cos[p].astype(np.float64), sin[p].astype(np.float64), hd // 2
        out = np.empty_like(x)
        out[:, :half] = x[:, :half] * c - x[:, half:] * s
        out[:, half:] = x[:, half:] * c + x[:, :half] * s
        return out.reshape(D)

    assert_close(q, rope64(qkv[:D]), 1e-6, 4)  # 2 products + 1 sum in float32
    eps = EPS16 if cache_dtype == np.float16 else EPS32
    assert_close(kc[p], rope64(qkv[D:2 * D]), 1e-6, 4, eps)  # plus one rounding to the cache dtype
    assert np.array_equal(vc[p], qkv[2 * D:].astype(cache_dtype))
    others = np.arange(S) != p
    assert not kc[others].any() and not vc[others].any(), "only row pos is written"


def _attention64(q, kc, vc, L, H, hd, scale):
    o = np.empty(H * hd)
    for h in range(H):
        sl = slice(h * hd, (h + 1) * hd)
        s = scale * (kc[:L, sl].astype(np.float64) @ q[sl].astype(np.float64))
        p = np.exp(s - s.max())
        o[sl] = (p / p.sum()) @ vc[:L, sl].astype(np.float64)
    return o


@pytest.mark.parametrize("cache_dtype", [np.float32, np.float16])
@pytest.mark.parametrize("L", [1, 2, 7, 16])
@pytest.mark.parametrize("splits", [1, 2, 3, 5, 20])
def test_attention_twins_vs_softmax(cache_dtype, L, splits):
    r = rng()
    H, hd, S = 2, 8, 16
    D = H * hd
    q, kc, vc = f32(r, D, scale=2.0), f32(r, S, D).astype(cache_dtype), f32(r, S, D).astype(cache_dtype)
    scale = np.float32(1 / np.sqrt(hd))
    part_o = np.full((H, splits, hd), np.nan, np.float32)  # NaN: any slot left unwritten shows
    part_ml = np.full((H, splits, 2), np.nan, np.float32)
    attn_partial_twin(*partial_grid(H, splits, hd), q, kc, vc, np.array([L - 1], np.int32), part_o, part_ml, scale)
    for s in range(splits):
        t0, t1 = slice_bounds(L, splits, s)
        if t0 >= t1:  # empty slice: m = -inf, l = 0, o = 0
            assert np.all(part_ml[:, s, 0] == -np.inf) and not part_ml[:, s, 1].any() and not part_o[:, s].any()
    o = np.zeros(D, np.float32)
    with np.errstate(all="raise"):  # exp(-inf - M) must be a clean 0, no NaN/invalid
        attn_merge_twin((H,), (hd,), part_o, part_ml, o)
    # O(1) values, <= 16 terms in each float32 sum, an exp and a divide: 1e-5 + 64 eps |ref|
    assert_close(o, _attention64(q, kc, vc, L, H, hd, scale), 1e-5, 64)


@pytest.mark.parametrize("splits", [1, 3, 5])
def test_combine_twin_is_merge_plus_matvec_residual_bitwise(splits):
    r = rng()
    H, hd = 3, 6
    D = H * hd
    part_o = f32(r, H, splits, hd)
    part_ml = np.stack([f32(r, H, splits), np.abs(f32(r, H, splits)) + 0.5], axis=-1)
    if splits > 1:
        part_ml[:, -1] = (-np.inf, 0.0)  # an empty slice
        part_o[:, -1] = 0.0
    Wo, x0 = f32(r, D, D), f32(r, D)
    x_one = x0.copy()
    attn_combine_twin(((D + 3) // 4,), (128,), part_o, part_ml, Wo, x_one)
    o, x_two = np.zeros(D, np.float32), x0.copy()
    attn_merge_twin((H,), (hd,), part_o, part_ml, o)
    matvec_residual_twin(((D + 3) // 4,), (128,), Wo, o, x_two)
    assert np.array_equal(x_one.view(np.uint32), x_two.view(np.uint32))


def test_argmax_next_twin_rules():
    S, V = 8, 6

    def step(logits, pos, n_prompt):
        tokens = np.arange(S, dtype=np.int32) + 100  # recognisable "untouched" values
        argmax_next_twin((1,), (256,), np.asarray(logits, np.float32), np.array([pos], np.int32),
                         np.array([n_prompt], np.int32), tokens)
        return tokens

    base = [0.1, 3.0, -1.0, 3.0, 2.0, 0.0]
    assert step(base, 2, 1)[3] == 1                              # tie -> lowest index
    assert step([np.nan, 1, 5, np.nan, 5, 0], 2, 1)[3] == 2      # NaN never wins
    assert step([np.nan, -np.inf, np.nan, -np.inf, np.nan, np.nan], 2, 1)[3] == 1
    assert step([np.nan] * V, 2, 1)[3] == 0                      # all NaN -> 0
    assert step(base, 2, 3)[3] == 1                              # nxt == n_prompt: generated
    assert np.array_equal(step(base, 2, 4), np.arange(S) + 100)  # nxt < n_prompt: prompt kept
    t = step(base, S - 2, 1)
    assert t[S - 1] == 1 and np.array_equal(t[:S - 1], np.arange(S - 1) + 100)
    assert np.array_equal(step(base, S - 1, 1), np.arange(S) + 100)  # past the end: untouched


def test_advance_twin():
    pos = np.array([41], np.int32)
    advance_twin((1,), (1,), pos)
    assert pos[0] == 42 and pos.dtype == np.int32


# ------------------------------------------------------------------ reduction orders (NumPy)


def _hard_sums(r, n, *shape):
    """float32 values whose sums depend on the order: mixed signs and magnitudes 1e-4 .. 1e4."""
    return (r.standard_normal(shape + (n,)) * 10.0 ** r.integers(-4, 5, shape + (n,))).astype(np.float32)


def test_warp_sum_shuffle_order_is_the_tree_order_in_every_lane():
    """The xor butterfly gives every lane the tree's lane-0 total, bit for bit (commutativity),
    and both are lab/measure/precision.py's tree over 32 lanes."""
    v = _hard_sums(rng(), R.WARP, 2000)                       # [2000, 32]
    lanes = R.warp_sum_shuffle_twin(v)                        # [2000, 32]
    tree = R.warp_sum_tree_twin(v)                            # [2000]
    assert np.array_equal(lanes.view(np.uint32), np.repeat(tree[:, None], R.WARP, 1).view(np.uint32))
    assert np.array_equal(tree.view(np.uint32), P.tree_sum(v).view(np.uint32))
    assert not np.array_equal(tree, P.chain_sum(v))           # the data do tell orders apart


def test_block_sum_shuffle_order_is_the_256_tree_in_every_thread():
    v = _hard_sums(rng(), R.BLOCK_THREADS, 1000)              # [1000, 256]
    threads = R.block_sum_shuffle_twin(v)                     # [1000, 256]
    tree = R.block_sum_tree_twin(v)
    assert np.array_equal(threads.view(np.uint32),
                          np.repeat(tree[:, None], R.BLOCK_THREADS, 1).view(np.uint32))
    assert np.array_equal(tree.view(np.uint32), P.tree_sum(v).view(np.uint32))


@pytest.mark.parametrize("fused", [False, True])
def test_row_dot_and_rmsnorm_mirrors_are_lane_chains_then_the_shuffle_order(fused):
    """lab/measure/precision.py's mirrors (which the kernels are checked against, bit for bit, on
    the simulator and on a GPU) are the per-lane fma chains followed by either dataflow."""
    r = rng()
    W, x = f32(r, 6, 600), f32(r, 600)
    lane = np.zeros((6, R.WARP), np.float32)
    for k in range(600):  # lane k % 32 takes k, in increasing k
        lane[:, k % 32] = R.mul_add(W[:, k], x[k], lane[:, k % 32], fused)
    for got in (R.warp_sum_tree_twin(lane), R.warp_sum_shuffle_twin(lane)[:, 5]):
        assert np.array_equal(got.view(np.uint32), row_dot_order(W, x, fused).view(np.uint32))
    xs = f32(r, 300)
    part = np.zeros(R.BLOCK_THREADS, np.float32)
    for i in range(300):
        part[i % 256] = R.mul_add(xs[i], xs[i], part[i % 256], fused)
    total = R.block_sum_shuffle_twin(part)[77]
    assert total == R.strided_dot(xs, xs, R.BLOCK_THREADS, fused)


def test_block_argmax_both_orders_pick_the_lowest_index_of_the_max():
    r = rng()
    V = 300
    for trial in range(300):
        logits = np.round(f32(r, V) * 2) / 2                  # many exact ties
        logits[r.integers(0, V, 5)] = np.nan
        if trial % 7 == 0:
            logits[:] = -np.inf
        if trial % 11 == 0:
            logits[r.integers(0, V, 3)] = -0.0
        bv = np.full(R.BLOCK_THREADS, -np.inf, np.float32)    # each thread's strided scan, as the kernel
        bi = np.full(R.BLOCK_THREADS, V, np.int32)
        for i in range(V):
            t = i % R.BLOCK_THREADS
            if logits[i] > bv[t] or (logits[i] == bv[t] and i < bi[t]):
                bv[t], bi[t] = logits[i], i
        tree = int(R.block_argmax_tree_twin(bv, bi))
        lanes = R.block_argmax_shuffle_twin(bv, bi)
        assert np.all(lanes == tree)
        assert (tree if tree < V else 0) == P.argmax_index(logits)


def test_attention_geometry_comes_from_partial_grid():
    assert partial_grid(4, 8, 64) == ((4, 8), (ATTN_THREADS,))
    assert partial_grid(3, 1, MAX_HEAD_DIM)[1] == (ATTN_THREADS,)
    with pytest.raises(ValueError):
        partial_grid(1, 1, MAX_HEAD_DIM + 2)


# ------------------------------------------------------------------ the kernels, simulated


def _cudasim_env(*paths):
    """The environment of a child process under numba's CUDA simulator, with the repository
    (and `paths`) importable."""
    return dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PYTHONPATH=os.pathsep.join(
        [str(ROOT), *map(str, paths), os.environ.get("PYTHONPATH", "")]))


FAMILIES = check.FAMILIES
QUICK = {"attention", "spec_cols"}   # the shuffle path runs these on one case per code path (--quick)
TREES_ONLY = {"spec"}   # no kernel of these reaches kernels/reduce.py: the shuffle path is theirs
REDUCTIONS = {"warp_sum", "warp_sums", "block_sum", "block_argmax", "lane_sums16", "lane_sums32"}
# one simulator child per path for each group: attention (the slowest) apart, so the two groups
# spread over pytest-xdist's workers; the persistent step is tests/engine/test_persistent.py's
GROUPS = {"attention": ["attention"],
          "others": [f for f in FAMILIES if f != "attention"] + ["fused"]}


def _reachable(fn, seen=None) -> set[str]:
    """The names of the device functions `fn` calls, transitively (through its globals)."""
    seen = set() if seen is None else seen
    for name in fn.__code__.co_names:
        target = fn.__globals__.get(name)
        inner = getattr(target, "py_func", None)
        if inner is not None and name not in seen:
            seen.add(name)
            _reachable(inner, seen)
    return seen


def test_the_trees_only_families_reach_no_reduction():
    """Running a family on the emulated shuffles checks kernels/reduce.py's GPU path through it;
    a family none of whose kernels calls a reduction has no such path, so it runs on the trees
    alone (this holds that true: a reduction added to one of them moves it back)."""
    for family in TREES_ONLY:
        for name in FAMILIES[family]:
            assert not _reachable(kernels.REGISTRY[name].py_func) & REDUCTIONS, (family, name)
    # and the check can fail: a kernel that reduces is seen as one
    assert _reachable(kernels.REGISTRY["matmat"].py_func) & REDUCTIONS


def test_every_kernel_is_in_one_op_whose_cases_sit_beside_it():
    """kernels.check's ops cover every registered kernel: each family's kernels, the fused
    step's, the persistent step; each exactly once. Each op's cases are the CASES of the kernel
    files it checks (the files of its kernels), each tolerance given with why."""
    listed = [k for ks in FAMILIES.values() for k in ks] + list(check.FUSED_KERNELS) + ["step_persistent"]
    assert sorted(listed) == sorted(REGISTRY)
    assert set(check.CASES_IN) == set(check.OPS)
    kernels_of = {**FAMILIES, "fused": set(check.FUSED_KERNELS), "persistent": {"step_persistent"}}
    for op, modules in check.CASES_IN.items():
        homes = {REGISTRY[k].py_func.__module__ for k in kernels_of[op]} - {"kernels.fused_split"}
        assert {m.__name__ for m in modules} <= homes, op
        for m in modules:
            tols = {k: v for k, v in m.CASES.items() if k.endswith("tol")}
            assert tols and all(f"{k[:-3]}why" in m.CASES for k in tols), (op, m.__name__)


@pytest.mark.slow
@pytest.mark.parametrize("group", list(GROUPS))
def test_kernels_under_cudasim(group, tmp_path):
    """A group of ops on the simulator's trees AND on emulated warp shuffles (the GPU path), the
    two at once (one child process each): each kernel against its twin and its contracts, then
    the two runs' outputs against each other, bit for bit. The shuffle path runs attention and
    spec_cols on one case per code path (--quick; the emulated warps make attention the slowest
    check here); each case's inputs come from its own label, so the quick run's cases are held
    against the same cases of the full tree run."""
    ops = GROUPS[group]
    dumps = {mode: str(tmp_path / f"{mode}.npz") for mode in ("trees", "shuffles")}
    t = time.perf_counter()
    with ThreadPoolExecutor(2) as pool:
        trees = pool.submit(check.run, ops, "cudasim", dump=dumps["trees"])
        shuffles = pool.submit(check.run, [op for op in ops if op not in TREES_ONLY], "shuffles",
                               quick=True, dump=dumps["shuffles"])
        results = {"trees": trees.result(), "shuffles": shuffles.result()}
    for mode, res in results.items():
        bad = {op: row["error"] for op, row in res["ops"].items() if not row["ok"]}
        assert res["ok"] and not bad, f"cudasim {group} ({mode}): {bad}"
    print(f"(subprocesses {time.perf_counter() - t:.1f}s)")
    with np.load(dumps["trees"]) as a, np.load(dumps["shuffles"]) as b:
        tree_labels, labels = [str(x) for x in a["labels"]], [str(x) for x in b["labels"]]
        for op in ops:
            if op in TREES_ONLY:
                continue
            mine = [i for i, label in enumerate(labels) if label.startswith(f"{op}: ")]
            theirs = [j for j, label in enumerate(tree_labels) if label.startswith(f"{op}: ")]
            assert mine, f"{op}: the shuffle run launched nothing"
            if op in QUICK:   # a subset of the cases, each found by its label (unique here)
                names = [tree_labels[j] for j in theirs]
                assert len(set(names)) == len(names), f"{op}: labels not unique"
                only_here = sorted({labels[i] for i in mine} - set(names))
                assert not only_here, f"run on the shuffle path only: {only_here}"
                pairs = [(tree_labels.index(labels[i]), i) for i in mine]
            else:             # every case, in the same order
                assert [labels[i] for i in mine] == [tree_labels[j] for j in theirs], op
                pairs = list(zip(theirs, mine))
            for j, i in pairs:
                x, y = a[f"a{j}"], b[f"a{i}"]
                assert x.dtype == y.dtype and np.array_equal(x.view(np.uint8), y.view(np.uint8)), \
                    f"{labels[i]}: the shuffle path's bits differ from the tree path's"


_POOL_CHECK = r'''
import numpy as np
from kernels import cudasim
cudasim.install()    # the block pool (pooled_blocks) kernels.check runs the simulator with
from numba import cuda
from numba.cuda.simulator import kernel as simkernel
assert simkernel.BlockManager.run.__name__ == "run_block", "the block pool is not installed"

@cuda.jit
def reverse(a, out, count):
    sh = cuda.shared.array(64, np.float32)
    i = cuda.threadIdx.x
    sh[i] = a[cuda.blockIdx.x * 64 + i]
    cuda.syncthreads()
    out[cuda.blockIdx.x * 64 + i] = sh[63 - i]
    n = cuda.syncthreads_count(sh[i] > 0)
    if i == 0:
        count[cuda.blockIdx.x] = n

@cuda.jit
def lanes(out):
    t = cuda.threadIdx.x + cuda.blockDim.x * cuda.threadIdx.y
    out[cuda.blockIdx.x, t] = cuda.laneid

@cuda.jit
def fails(out):
    i = cuda.threadIdx.x
    if i == 5:
        out[1000] = 1.0          # out of bounds: the simulator raises in thread 5 only
    cuda.syncthreads()
    out[i] = 1.0

a = np.random.default_rng(0).standard_normal(192).astype(np.float32)
out, count = np.zeros_like(a), np.zeros(3, np.int32)
reverse[3, 64](a, out, count)
assert np.array_equal(out, a.reshape(3, 64)[:, ::-1].ravel())
assert list(count) == [int((a.reshape(3, 64)[b] > 0).sum()) for b in range(3)]
ln = np.full((2, 64), -1, np.int32)
lanes[2, (16, 4)](ln)
assert (ln == np.arange(64) % 32).all(), ln
try:
    fails[1, 32](np.zeros(32, np.float32))
except Exception as e:  # noqa: BLE001
    assert "tid=[5, 0, 0]" in str(e), e
else:
    raise AssertionError("a thread's exception was not raised")
reverse[3, 64](a, out, count)    # the pool runs the next launch as before
assert np.array_equal(out, a.reshape(3, 64)[:, ::-1].ravel())
print("pool ok")
'''


def test_the_harness_block_pool_keeps_the_simulators_semantics():
    """kernels.check runs the simulator's blocks on a pool of reused threads
    (`pooled_blocks`, instead of a new thread per CUDA thread and a polling manager). It must
    keep numba's semantics: shared memory and syncthreads(_count) within each block, one block
    after another; threadIdx and the lane (x fastest, in a 2-D block too); a thread's exception
    raised for the launch, named by its thread, without its blockmates hanging at the next
    syncthreads; and the pool usable for the next launch."""
    res = subprocess.run([sys.executable, "-c", _POOL_CHECK], cwd=ROOT,
                         env=_cudasim_env(), text=True, capture_output=True,
                         timeout=120)
    assert res.returncode == 0 and "pool ok" in res.stdout, res.stderr[-3000:]


def test_the_check_command_line_says_its_usage_and_refuses_an_unknown_op():
    """python -m kernels.check: --help prints its usage (and runs nothing); an unknown op or flag
    is one line naming it, exit 2."""
    import subprocess
    import sys
    run = lambda *a: subprocess.run([sys.executable, "-m", "kernels.check", *a],  # noqa: E731
                                    capture_output=True, text=True, cwd=ROOT, timeout=60)
    usage = run("--help")
    assert usage.returncode == 0 and "usage: python -m kernels.check" in usage.stdout
    assert "ok" not in usage.stdout.split("positional arguments")[0]
    bad = run("nosuch")
    assert bad.returncode == 2 and "unknown op nosuch; the ops: embed" in bad.stderr
    assert run("--bogus").returncode == 2
