"""Every op's kernels against their NumPy twins and contracts, on numba's CUDA simulator or a GPU.

  python -m kernels.check [--cudasim | --shuffles | --gpu] [--quick] [--dump PATH] [OP ...]

  --cudasim    numba's CUDA simulator with its own reduction trees (the default)
  --shuffles   the simulator with lane-exact warp shuffles (kernels/reduce.py's GPU path)
  --gpu        kernels compiled for the device, plus the model's dims
  --quick      attention and spec_cols on one case per code path (for the shuffle path)
  --dump PATH  every kernel output, labelled, to PATH (.npz): two paths held bit for bit
  OP           ops to run (OPS; all by default)

Contents
  OPS, run(ops, mode) -> dict     the API (scripts and tests call it)
  harness                         run_case: kernel vs twin, tolerance atol + k eps |ref|;
                                  same_bits; compiled; the --dump list
  one-token ops                   FAMILIES: embed .. spec_cols, CONFIGS, check_family
  fused                           the fused step's kernels, check_fused
  persistent                      the persistent step, check_persistent
  main                            the command line; a simulator mode runs in a child process
                                  (the simulator flag must be set before numba is imported)
Each op's shapes and tolerances (with why) are the CASES of its kernel files (CASES_IN). Exit
status 0, or 1 naming the first mismatch.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

import numba
import numpy as np
from numba import config, cuda

from kernels import (REGISTRY, attention, draft, embed, fused, fused_split, matvec, mlp,
                     persistent, position, probe, reduce, rmsnorm, rope, sample)
from kernels import cudasim
from kernels import verify as VK
from kernels import verify_attention as VKA
from kernels.attention import combine_grid, merge_elem, merge_elem_batch, merge_grid, partial_grid
from kernels.draft import ACCEPT_BLOCK, ACCEPT_GRID, DRAFT_BLOCK, DRAFT_GRID, NGRAM_BLOCK, NGRAM_GRID
from kernels.matvec import MATVEC_THREADS, row_dot2, row_dot_order
from kernels.matvec import grid_for as rows_grid
from kernels.rmsnorm import rmsnorm_order
from kernels.sample import argmax_twin_index
from kernels.verify_attention import causal_attention64 as causal64

MODES = ("cudasim", "shuffles", "gpu")


class _Options:
    """What this process runs on (set by `_run_here`)."""
    gpu = False
    shuffles = False
    quick = False


OPT = _Options()


# ==== KERNELS_DEFS
SEED = 1234
EPS32 = float(np.finfo(np.float32).eps)
EPS16 = float(np.finfo(np.float16).eps)

# Tiny model: D = n_head * head_dim, head_dim even; second config has odd n_head and hd not a
# power of two, and D not a multiple of the 4 rows per block.
CONFIGS = [dict(D=16, n_head=2, hd=8, F=24, V=11, max_seq=16),
           dict(D=18, n_head=3, hd=6, F=10, V=7, max_seq=12)]
# on a GPU also the real model's dims (max_seq cut: L = 128 is 4 passes of 32 timesteps)
GPU_CONFIG = dict(D=256, n_head=4, hd=64, F=512, V=100, max_seq=128)

# each op: the kernel files whose CASES (shapes, tolerances and why) it runs
CASES_IN = {"embed": (embed,), "rmsnorm": (rmsnorm,), "matvec": (matvec,), "swiglu_up": (mlp,),
            "rope_kv_append": (rope,), "attention": (attention,), "argmax_next": (sample,),
            "advance": (position, probe), "spec": (draft, VK), "spec_cols": (VK, VKA),
            "fused": (fused,), "persistent": (persistent,)}

# each family: the kernels its checks exercise (every registered kernel is in exactly one)
FAMILIES = {
    "embed": {"embed"},
    "rmsnorm": {"rmsnorm", "rmsnorm_late_wait"},
    "matvec": {"matvec", "matvec_residual"},
    "swiglu_up": {"swiglu_up"},
    "rope_kv_append": {"rope_kv_append", "rope_kv_append_row"},
    "attention": {"attn_partial", "attn_partial_len", "attn_merge", "attn_combine"},
    "argmax_next": {"argmax_next", "argmax_next_float"},
    "advance": {"advance", "empty", "spin", "pos_set", "relay"},  # + the cost recorder's probes
    # speculative decoding: the kernels with no reduction of kernels/reduce.py or
    # kernels/verify_attention.py (the shuffle path changes nothing in them:
    # tests/kernels/test_kernels.py runs them on the trees only) ...
    "spec": {"draft_lookup", "draft_ngram", "accept", "embed_cols", "rope_kv_append_cols"},
    # ... and the verify step's kernels that reduce (warp_sum, block_sum, block_argmax, the
    # column reduce-scatters lane_sums16 and lane_sums32), with the merge of verify_partial's
    # partials
    "spec_cols": {"rmsnorm_cols", "matmat", "matmat_residual", "swiglu_cols", "argmax_cols",
                  "verify_partial", "verify_merge"},
}
# --quick runs attention on its CASES["quick"] (one case per code path) and leaves out
# matmat_residual and swiglu_cols (family spec_cols): their reductions are matmat's (the same
# lane_sums16, col_dots' chains); spec_cols runs the verify attention on its CASES["quick"]; and
# attn_partial_len: attn_partial's device function (partial_slice) with
# the context length by value, so its shuffle path is attn_partial's; the full tree run holds it
# bit for bit against attn_partial on every case
QUICK_SKIPS = {"attn_partial_len", "matmat_residual", "swiglu_cols"}


def family_rng(family: str, config: int) -> np.random.Generator:
    return np.random.default_rng([SEED, config, zlib.crc32(family.encode())])


def case_rng(label: str) -> np.random.Generator:
    """The inputs of one case from its label alone: the same bits in a quick and a full run."""
    return np.random.default_rng([SEED, zlib.crc32(label.encode())])


_compiled: dict[tuple[str, str], object] = {}
_exercised: set[tuple[str, str]] = set()
_dump: list[tuple[str, np.ndarray]] = []   # (label, kernel output) in launch order, for --dump


class Mismatch(Exception):
    """A kernel disagrees with its twin or breaks a contract (the message names it)."""


def mode_label(gpu: bool) -> str:
    """What a harness ran on, for its closing line: the GPU, or the simulator's reduction path."""
    return "gpu" if gpu else "cudasim " + ("shuffles" if reduce.SHUFFLES else "trees")


def compiled(name: str, sig: str):
    key = (name, sig)
    if key not in _compiled:
        _compiled[key] = cuda.jit(sig)(REGISTRY[name].py_func)
    _exercised.add(key)
    return _compiled[key]


def sig_for(name: str, cache_dtype=np.float32) -> str:
    """The signature of `name` whose KV-cache arrays have cache_dtype (or its only one)."""
    sigs = REGISTRY[name].signatures
    if len(sigs) == 1:
        return sigs[0]
    (sig,) = [s for s in sigs if ("float16" in s) == (np.dtype(cache_dtype) == np.float16)]
    return sig


def close(got, ref, atol, k, eps, nan_equal=False):
    """|got - ref| <= atol + k * eps * |ref| elementwise; equal infinities pass, NaN fails (or,
    with nan_equal, passes where both are NaN: an output whose inputs hold NaN on purpose)."""
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    same = got == ref  # covers matching +-inf
    if nan_equal:
        same |= np.isnan(got) & np.isnan(ref)
    with np.errstate(invalid="ignore"):
        ok = same | (np.abs(got - ref) <= atol + k * eps * np.abs(ref))
        err = np.abs(np.where(same, 0.0, got - ref))
    return bool(np.all(ok)), float(np.nanmax(err)) if got.size else 0.0


def run_case(name, grid, block, args, tol, cache_dtype=np.float32, label="", skip=(),
             nan_equal=False):
    """Launch kernel `name` and its twin on copies of args; compare every argument but those in
    `skip` (an output the caller checks itself); return the kernel's arguments after the launch.

    tol: (atol, k) for float32 outputs; float16 outputs get k * eps(float16) with the same k
    (a 1-ulp rounding difference before the cast can flip the float16 rounding). nan_equal:
    see `close`.
    """
    spec = REGISTRY[name]
    sig = sig_for(name, cache_dtype)
    kern = compiled(name, sig)
    a_k = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    a_t = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    kern[grid, block](*a_k)
    spec.twin(grid, block, *a_t)
    where = f"kernel {name} [{sig}] grid={grid} block={block} {label}"
    _dump.extend((f"{where} arg {i}", a_k[i].copy()) for i in spec.writes)  # (label, output)
    for i, (orig, got, ref) in enumerate(zip(args, a_k, a_t)):
        if not isinstance(orig, np.ndarray) or i in skip:
            continue
        if i not in spec.writes:
            if not np.array_equal(got, orig, equal_nan=True) or not np.array_equal(ref, orig, equal_nan=True):
                raise Mismatch(f"{where}: argument {i} changed but is not in writes={spec.writes}")
            continue
        if got.dtype.kind in "iu":
            if not np.array_equal(got, ref):
                raise Mismatch(f"{where}: argument {i} kernel {got} != twin {ref}")
            continue
        atol, k = tol
        eps = EPS16 if got.dtype == np.float16 else EPS32
        ok, err = close(got, ref, atol, k, eps, nan_equal)
        if not ok:
            raise Mismatch(f"{where}: argument {i} max |err| {err:.3g} > atol {atol} + {k}*eps*|ref|"
                           f"\n kernel {got.ravel()[:8]}\n twin   {ref.ravel()[:8]}")
    return a_k


def f32(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def same_bits(got, want, what):
    """Bit-for-bit equality of two float32 arrays, or a Mismatch naming `what`."""
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    if not np.array_equal(got.view(np.uint32), want.view(np.uint32)):
        bad = int(np.sum(got.view(np.uint32) != want.view(np.uint32)))
        raise Mismatch(f"{what}: {bad} of {got.size} elements differ in their bits "
                       f"(max diff {np.max(np.abs(got.astype(np.float64) - want)):.3g})")


FMA_ONCE = not config.ENABLE_CUDASIM   # a GPU's fma rounds once; the simulator's is a * b + c


@cuda.jit
def _row_dot2_probe(Wa, Wb, x, out_a, out_b):
    """out_a, out_b = Wa @ x, Wb @ x through row_dot2 (matvec's geometry)."""
    red = cuda.shared.array(MATVEC_THREADS, numba.float32)
    tid = cuda.threadIdx.x
    r = cuda.blockIdx.x * (MATVEC_THREADS // 32) + tid // 32
    a, b = row_dot2(Wa, Wb, r, x, tid, red)
    if tid % 32 == 0 and r < out_a.shape[0]:
        out_a[r] = a
        out_b[r] = b


@cuda.jit
def _merge_elem_probe(part_o, part_ml, o):
    """o[h*hd + d] = merge_elem(part_o, part_ml, h, d): the per-element merge kernels/fused.py
    calls, launched as grid (n_head,), block (hd,); it must give attn_merge's bits."""
    h = cuda.blockIdx.x
    d = cuda.threadIdx.x
    o[h * part_o.shape[2] + d] = merge_elem(part_o, part_ml, h, d)


@cuda.jit
def _merge_batch_probe(part_o, part_ml, o):
    """o[h*hd + d] = merge_elem_batch(part_o, part_ml, h, d): the batched merge the persistent
    step's merge1 variants call (grid (n_head,), block (hd,)); it must give attn_merge's bits,
    past MERGE_BATCH slices too."""
    h = cuda.blockIdx.x
    d = cuda.threadIdx.x
    o[h * part_o.shape[2] + d] = merge_elem_batch(part_o, part_ml, h, d)


def check_merges(part_o, part_ml, Wo, x0, label):
    """attn_merge and attn_combine on these partials against their twins; then the contracts:
    attn_combine == attn_merge + matvec_residual bit for bit, merge_elem and merge_elem_batch ==
    attn_merge."""
    H, _, hd = part_o.shape
    D = H * hd
    g, b = merge_grid(H, hd)
    tol = attention.CASES["tol"]
    o = run_case("attn_merge", g, b, [part_o, part_ml, np.zeros(D, np.float32)],
                 tol["attn_merge"], label=label)[2]
    g, b = combine_grid(D)
    x_one = run_case("attn_combine", g, b, [part_o, part_ml, Wo, x0.copy()],
                     tol["attn_combine"], label=label)[3]
    # contract: ONE kernel == merge kernel + matvec_residual kernel, bit for bit
    x_two = x0.copy()
    g, b = rows_grid(D)
    compiled("matvec_residual", REGISTRY["matvec_residual"].signatures[0])[g, b](Wo, o, x_two)
    same_bits(x_one, x_two, f"kernel attn_combine {label}: attn_merge + matvec_residual")
    o_elem = np.zeros(D, np.float32)
    _merge_elem_probe[(H,), (hd,)](part_o, part_ml, o_elem)
    same_bits(o_elem, o, f"device function merge_elem {label}: attn_merge")
    o_batch = np.zeros(D, np.float32)
    _merge_batch_probe[(H,), (hd,)](part_o, part_ml, o_batch)
    same_bits(o_batch, o, f"device function merge_elem_batch {label}: attn_merge")
    # the slices rolled by 5: written slices past MERGE_BATCH and empty ones inside it, where
    # the made-up case's empty slices sit at its end
    po, pm = np.roll(part_o, 5, axis=1).copy(), np.roll(part_ml, 5, axis=1).copy()
    o_elem, o_batch = np.zeros(D, np.float32), np.zeros(D, np.float32)
    _merge_elem_probe[(H,), (hd,)](po, pm, o_elem)
    _merge_batch_probe[(H,), (hd,)](po, pm, o_batch)
    same_bits(o_batch, o_elem, f"device function merge_elem_batch {label}, slices rolled by 5: "
                               f"merge_elem")


def check_partials(H, hd, S, cases, tag, Wo=None):
    """attn_partial for each (dtype, pos, splits) against the twin, and attn_partial_len (the
    same device function, slow to simulate) for the last case of each cache dtype, bit for bit
    against attn_partial; with Wo, merge and combine the kernel's partials (check_merges)."""
    D = H * hd
    scale = np.float32(1.0 / np.sqrt(hd))
    tol = attention.CASES["tol"]["attn_partial"]
    by_value = {np.dtype(dt): i for i, (dt, _, _) in enumerate(cases)}   # the last of each dtype
    for i, (dt, p, splits) in enumerate(cases):
        label = f"{tag} pos={p} splits={splits} cache={np.dtype(dt).name}"
        rng = case_rng(label)
        kc = f32(rng, S, D).astype(dt)
        vc = f32(rng, S, D).astype(dt)
        q = f32(rng, D, scale=2.0)  # sharper softmax: later timesteps raise the max
        pos = np.array([p], np.int32)
        g, b = partial_grid(H, splits, hd)
        part_o, part_ml = run_case(
            "attn_partial", g, b,
            [q, kc, vc, pos, np.zeros((H, splits, hd), np.float32),
             np.zeros((H, splits, 2), np.float32), scale], tol, dt, label=label)[4:6]
        if by_value[np.dtype(dt)] == i and not OPT.quick:  # the bug variant: L by value
            part_o2, part_ml2 = run_case(
                "attn_partial_len", g, b,
                [q, kc, vc, np.int32(p + 1), np.zeros((H, splits, hd), np.float32),
                 np.zeros((H, splits, 2), np.float32), scale], tol, dt, label=label)[4:6]
            same_bits(part_o2, part_o, f"kernel attn_partial_len {label}: attn_partial's part_o")
            same_bits(part_ml2, part_ml, f"kernel attn_partial_len {label}: attn_partial's part_ml")
        if Wo is not None:  # merge and combine run on the KERNEL's partials (the twin's differ in the last bits)
            check_merges(part_o, part_ml, Wo, f32(rng, D), label)


# ---- the speculative-decoding kernels (family "spec": kernels/draft.py, kernels/verify.py, kernels/verify_attention.py)

SPEC_T = VK.CASES["cols"]   # verify columns at the tiny shapes


def _i32(*v):
    return np.array(v, np.int32)


def check_drafts(S):
    """draft_lookup on hand-made texts (integer outputs: exact against the twin), draft_ngram
    over a random table, and accept on hand-made verdicts. The lookup texts: a periodic
    continuation, the latest of several matches, a 3-gram beating a later 1-gram, the fallback,
    p = 0, prompt-forced columns, the limit, and a match past the first stride of the 128
    threads; the n-gram texts: drafts chained on drafts, a context reaching before position 0,
    p = 0, prompt-forced columns, the limit (kernels/draft.py's CASES, then two made here)."""
    T = 6
    tol = draft.CASES["tol"]
    def run_draft(tokens, p, n_prompt, limit, label):
        buf = np.full(max(S, len(tokens)), 3, np.int32)
        buf[:len(tokens)] = tokens
        run_case("draft_lookup", DRAFT_GRID, DRAFT_BLOCK,
                 [buf, _i32(p), _i32(n_prompt), _i32(limit), np.full(T, -1, np.int32)], tol,
                 label=f"draft {label} p={p} n_prompt={n_prompt} limit={limit}")
    for tokens, p, n_prompt, limit, what in draft.CASES["texts"]:
        run_draft(tokens, p, n_prompt, S - 1 if limit is None else limit, what)
    big = np.arange(300, dtype=np.int32) + 10                           # distinct: no match but ...
    big[198:201] = big[287:290]                                         # ... this 3-gram (j = 200)
    big[250] = big[289]                                                 # and a later 1-gram
    run_draft(big, 289, 1, 299, "stride")
    rng = case_rng("draft random")
    for p in (7, S - 2):
        run_draft(rng.integers(0, 3, S).astype(np.int32), p, 1, S - 1, "random")

    # draft_ngram: a random table over a small vocabulary (its rows [V**3, V]), every rule
    Vn = draft.CASES["ngram_vocab"]
    table = case_rng("draft ngram").integers(0, Vn, (Vn ** (draft.NGRAM_CONTEXT - 1), Vn)
                                             ).astype(np.uint8)
    for tokens, p, n_prompt, limit, what in draft.CASES["ngram"]:
        buf = np.full(max(S, len(tokens)), 3, np.int32)
        buf[:len(tokens)] = tokens
        lim = S - 1 if limit is None else limit
        run_case("draft_ngram", NGRAM_GRID, NGRAM_BLOCK,
                 [buf, _i32(p), _i32(n_prompt), _i32(lim), table, np.full(T, -1, np.int32)], tol,
                 label=f"draft ngram {what} p={p} n_prompt={n_prompt} limit={lim}")

    def run_accept(cols, pred, p, n_prompt, limit, label):
        tokens = np.arange(S, dtype=np.int32) + 100
        run_case("accept", ACCEPT_GRID, ACCEPT_BLOCK,
                 [_i32(*cols), _i32(*pred), _i32(p), _i32(n_prompt), _i32(limit), tokens, _i32(2, 5)],
                 tol, label=f"accept {label} p={p} n_prompt={n_prompt} limit={limit}")
    for cols, pred, p, n_prompt, limit, what in draft.CASES["verdicts"]:
        run_accept(cols, pred, p, n_prompt, S - 1 if limit is None else limit, what)


def check_verify_attention(H, hd, S, cases, tag):
    """verify_partial then verify_merge for each (dtype, pos, splits) against the twins, the
    merged output against float64 causal attention, and each column's merge bit for bit against
    attn_merge on that column's partials."""
    D, T = H * hd, SPEC_T
    scale = np.float32(1.0 / np.sqrt(hd))
    tol = VKA.CASES["tol"]
    for dt, p, splits in cases:
        label = f"{tag} verify pos={p} splits={splits} cache={np.dtype(dt).name}"
        r = case_rng(label)
        q, kc, vc = f32(r, T, D, scale=2.0), f32(r, S, D).astype(dt), f32(r, S, D).astype(dt)
        g, b = VKA.verify_grid(H, splits, hd, T)
        part_o, part_ml = run_case(
            "verify_partial", g, b,
            [q, kc, vc, _i32(p), np.full((H, T, splits + 1, hd), np.nan, np.float32),
             np.full((H, T, splits + 1, 2), np.nan, np.float32), scale], tol["verify_partial"], dt,
             label=label)[4:6]
        g, b = VKA.merge_cols_grid(H, hd, T)
        o = run_case("verify_merge", g, b, [part_o, part_ml, np.full((T, D), np.nan, np.float32)],
                     tol["verify_merge"], label=label)[2]
        ok, err = close(o, causal64(q, kc, vc, p, H, hd, scale), *tol["causal64"], EPS32)
        if not ok:
            raise Mismatch(f"{label}: verify_partial + verify_merge vs float64 causal attention: {err:.3g}")
        mg, mb = merge_grid(H, hd)
        for t in range(T):   # contract: column t merged as attn_merge merges a step's slices
            o1 = np.zeros(D, np.float32)
            compiled("attn_merge", REGISTRY["attn_merge"].signatures[0])[mg, mb](
                np.ascontiguousarray(part_o[:, t]), np.ascontiguousarray(part_ml[:, t]), o1)
            same_bits(o[t], o1, f"kernel verify_merge {label} col {t}: attn_merge")


def check_verify_cols(cfg, tag):
    """The verify step's reducing column kernels against their twins, and their contracts:
    matmat's column t is matvec's bits (and row_dot_order's), rmsnorm_cols' row rmsnorm's,
    swiglu_cols' column swiglu_up's; argmax_cols' ties and NaNs. Each case's inputs come from
    its label (`case_rng`). --quick (the shuffle path): one case per kernel, without the
    one-token kernels beside them (their own families run those on both paths)."""
    D, F, V = cfg["D"], cfg["F"], cfg["V"]
    T, quick = SPEC_T, OPT.quick
    tol = VK.CASES["tol"]
    g, b = VK.cols_grid(T)
    sizes = VK.CASES["rmsnorm_sizes"](cfg)
    for n in sizes[:1] if quick else sizes:
        label = f"rmsnorm_cols {tag} n={n}"
        rng = case_rng(label)
        X, w = f32(rng, T, n), f32(rng, n)
        out = run_case("rmsnorm_cols", g, b, [X, w, np.zeros((T, n), np.float32), np.float32(1e-5)],
                       tol["rmsnorm_cols"], label=label)[2]
        for t in range(T):
            same_bits(out[t], rmsnorm_order(X[t], w, np.float32(1e-5), FMA_ONCE),
                      f"kernel rmsnorm_cols n={n} row {t}: rmsnorm_order")
        if not quick and n == D:   # the mirror above holds every row; the kernel itself once
            one = np.zeros(n, np.float32)
            compiled("rmsnorm", REGISTRY["rmsnorm"].signatures[0])[(1,), (256,)](X[1], w, one, np.float32(1e-5))
            same_bits(out[1], one, f"kernel rmsnorm_cols n={n} row 1: rmsnorm")

    shapes = VK.CASES["matmat_shapes"](cfg)
    for N, K in shapes[:1] if quick else shapes:
        g, b = VK.matmat_grid(N)
        label = f"matmat {tag} N={N} K={K}"
        rng = case_rng(label)
        W, Xc = f32(rng, N, K, scale=K ** -0.5), f32(rng, T, K)
        out = run_case("matmat", g, b, [W, Xc, np.full((T, N), np.nan, np.float32)],
                       tol["matmat"], label=label)[2]
        for t in range(T):
            same_bits(out[t], row_dot_order(W, Xc[t], FMA_ONCE), f"kernel matmat N={N} K={K} col {t}: row_dot_order")
        if not quick and N == V:   # the mirror above holds every column; the kernel itself once
            one = np.zeros(N, np.float32)
            compiled("matvec", REGISTRY["matvec"].signatures[0])[g, b](W, Xc[T - 1], one)
            same_bits(out[T - 1], one, f"kernel matmat N={N} K={K} col {T - 1}: matvec")
        if quick:   # matmat_residual and swiglu_cols reduce as matmat does (matmat_rows,
            continue  # col_dots2: the same lane_sums16): their shuffle path is matmat's
        res = f32(rng, T, N)
        out = run_case("matmat_residual", g, b, [W, Xc, res], tol["matmat_residual"],
                       label=f"matmat_residual {tag} N={N} K={K}")[2]
        for t in range(T):
            same_bits(out[t], res[t] + row_dot_order(W, Xc[t], FMA_ONCE),
                      f"kernel matmat_residual N={N} K={K} col {t}: row_dot_order")

    if not quick:
        g, b = VK.matmat_grid(F)
        label = f"swiglu_cols {tag}"
        rng = case_rng(label)
        Wg, Wu, Xc = f32(rng, F, D, scale=D ** -0.5), f32(rng, F, D, scale=D ** -0.5), f32(rng, T, D)
        act = run_case("swiglu_cols", g, b, [Wg, Wu, Xc, np.full((T, F), np.nan, np.float32)],
                       tol["swiglu_cols"], label=label)[3]
        one = np.zeros(F, np.float32)     # column 0 (no row mirror: the kernel itself)
        compiled("swiglu_up", REGISTRY["swiglu_up"].signatures[0])[g, b](Wg, Wu, Xc[0], one)
        same_bits(act[0], one, f"kernel swiglu_cols {tag} col 0: swiglu_up")

    g, b = VK.cols_grid(T)
    label = f"argmax_cols {tag} ties, NaN"
    tie = f32(case_rng(label), V); tie[[2, V - 1]] = 9.0
    nan = np.full(V, np.nan, np.float32); nan[V - 2] = -np.inf
    run_case("argmax_cols", g, b, [np.stack([tie, nan, np.full(V, np.nan, np.float32)]),
                                   np.full(T, -1, np.int32)], tol["argmax_cols"], label=label)
    if not quick:
        wide = VK.CASES["argmax_wide"]
        label = f"argmax_cols {tag} V={wide}"
        big = f32(case_rng(label), T, wide); big[:, [299, 257, 200]] = 7.0   # 200 beats thread 1's 257
        run_case("argmax_cols", g, b, [big, np.full(T, -1, np.int32)], tol["argmax_cols"], label=label)


def check_verify(rng, cfg, tag):
    """The verify step's kernels that do not reduce against their twins, and their contracts:
    embed_cols, rope_kv_append_cols' column rope_kv_append's at p + t."""
    D, H, hd, V, S = cfg["D"], cfg["n_head"], cfg["hd"], cfg["V"], cfg["max_seq"]
    T = SPEC_T
    tol = VK.CASES["tol"]
    g, b = VK.embed_cols_grid(D, T)
    run_case("embed_cols", g, b, [_i32(3, 0, V - 1), f32(rng, V, D), np.full((T, D), np.nan, np.float32)],
             tol["embed_cols"], label=tag)

    ang = np.arange(S)[:, None] * (10000.0 ** (-np.arange(hd // 2) / (hd // 2)))[None, :]
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    g, b = VK.rope_cols_grid(H, hd, T)
    for dt in (np.float32, np.float16):
        for p in VK.CASES["rope_positions"](cfg):
            qkv, kc, vc = f32(rng, T, 3 * D), f32(rng, S, D).astype(dt), f32(rng, S, D).astype(dt)
            out = run_case("rope_kv_append_cols", g, b,
                           [qkv, _i32(p), cos, sin, np.full((T, D), np.nan, np.float32), kc, vc],
                           tol["rope_kv_append_cols"], dt, label=f"{tag} pos={p}")
            for t in range(T):
                if p + t >= S:
                    continue
                q1, kc1, vc1 = np.zeros(D, np.float32), kc.copy(), vc.copy()
                compiled("rope_kv_append", sig_for("rope_kv_append", dt))[(H,), (hd,)](
                    qkv[t], _i32(p + t), cos, sin, q1, kc1, vc1)
                same_bits(out[4][t], q1, f"kernel rope_kv_append_cols pos={p} col {t}: q")
                if not (np.array_equal(out[5][p + t], kc1[p + t]) and np.array_equal(out[6][p + t], vc1[p + t])):
                    raise Mismatch(f"kernel rope_kv_append_cols pos={p} col {t}: cache rows differ from rope_kv_append's")


# ---- the one-token and verify-step ops: one op is one family of FAMILIES -------------------
def check_family(family: str) -> set[str]:
    """Every case of one family, at each config, on inputs of the family's own seed (the same
    bits whichever other families run); returns the kernels it covers."""
    families = [family]

    def timed(name, fn):
        if name in families:
            fn(family_rng(name, ci))

    for ci, cfg in enumerate(CONFIGS + ([GPU_CONFIG] if OPT.gpu else [])):
        first = ci == 0
        D, H, hd, F, V, S = cfg["D"], cfg["n_head"], cfg["hd"], cfg["F"], cfg["V"], cfg["max_seq"]
        tag = f"D={D} H={H} hd={hd}"

        # each op's shapes and tolerances: the CASES of its kernel file
        def t_embed(rng):
            wte = f32(rng, V, D)
            tokens = rng.integers(0, V, S).astype(np.int32)
            g = ((D + 127) // 128,)
            for p in embed.CASES["positions"](cfg):
                run_case("embed", g, (128,), [tokens, np.array([p], np.int32), wte,
                                              np.zeros(D, np.float32)], embed.CASES["tol"], label=tag)
        timed("embed", t_embed)

        # rmsnorm: against the twin, and bit for bit its order twin rmsnorm_order
        def t_rmsnorm(rng):
            eps = np.float32(rmsnorm.CASES["eps"])
            for n in rmsnorm.CASES["sizes"](cfg):
                for name in ("rmsnorm", "rmsnorm_late_wait"):  # same math; the bug is only timing
                    x, w = f32(rng, n), f32(rng, n)
                    out = run_case(name, (1,), (256,), [x, w, np.zeros(n, np.float32), eps],
                                   rmsnorm.CASES["tol"], label=f"n={n}")[2]
                    same_bits(out, rmsnorm_order(x, w, eps, FMA_ONCE),
                              f"kernel {name} n={n}: kernels/rmsnorm.py's rmsnorm_order")
        timed("rmsnorm", t_rmsnorm)

        # matvec / matvec_residual: against the twins, and bit for bit the order twin row_dot_order
        def t_matvec(rng):
            tol = matvec.CASES["tol"]
            for N, K in matvec.CASES["shapes"](cfg):
                g, b = rows_grid(N)
                W, x = f32(rng, N, K, scale=K ** -0.5), f32(rng, K)
                out = run_case("matvec", g, b, [W, x, np.zeros(N, np.float32)], tol,
                               label=f"N={N} K={K}")[2]
                same_bits(out, row_dot_order(W, x, FMA_ONCE), f"kernel matvec N={N} K={K}: row_dot_order")
                W, x, res = f32(rng, N, K, scale=K ** -0.5), f32(rng, K), f32(rng, N)
                out = run_case("matvec_residual", g, b, [W, x, res], tol, label=f"N={N} K={K}")[2]
                same_bits(out, res + row_dot_order(W, x, FMA_ONCE),
                          f"kernel matvec_residual N={N} K={K}: row_dot_order")
        timed("matvec", t_matvec)

        # swiglu_up: against the twin; its row_dot2 gives exactly row_dot's bits per matrix
        def t_swiglu(rng):
            g, b = rows_grid(F)
            Wg, Wu, h = f32(rng, F, D, scale=D ** -0.5), f32(rng, F, D, scale=D ** -0.5), f32(rng, D)
            run_case("swiglu_up", g, b, [Wg, Wu, h, np.zeros(F, np.float32)], mlp.CASES["tol"],
                     label=tag)
            ga, ub = np.zeros(F, np.float32), np.zeros(F, np.float32)
            _row_dot2_probe[g, b](Wg, Wu, h, ga, ub)
            same_bits(ga, row_dot_order(Wg, h, FMA_ONCE), f"device function row_dot2 {tag}: gate rows")
            same_bits(ub, row_dot_order(Wu, h, FMA_ONCE), f"device function row_dot2 {tag}: up rows")
        timed("swiglu_up", t_swiglu)

        # rope_kv_append and its bug variant
        def t_rope(rng):
            ang = np.arange(S)[:, None] * (10000.0 ** (-np.arange(hd // 2) / (hd // 2)))[None, :]
            cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
            tol = rope.CASES["tol"]
            for dt in rope.CASES["caches"]:
                for p in rope.CASES["positions"](cfg):
                    kc = f32(rng, S, D).astype(dt)
                    vc = f32(rng, S, D).astype(dt)
                    run_case("rope_kv_append", (H,), (hd,),
                             [f32(rng, 3 * D), np.array([p], np.int32), cos, sin,
                              np.zeros(D, np.float32), kc, vc], tol, dt, label=f"{tag} pos={p}")
                    # the bug variant writes row views the host chose: same values, row p
                    run_case("rope_kv_append_row", (H,), (hd,),
                             [f32(rng, 3 * D), np.array([p], np.int32), cos, sin,
                              np.zeros(D, np.float32), kc[p].copy(), vc[p].copy()], tol, dt,
                             label=f"{tag} pos={p}")
        timed("rope_kv_append", t_rope)

        # attention: attn_partial on each case, merge and combine on its partials
        def t_attention(rng):
            cases_of = attention.CASES
            Wo = f32(rng, D, D, scale=D ** -0.5)
            if OPT.quick:
                cases = list(cases_of["quick"][ci])
            else:
                cases = cases_of["first" if first else "other"](cfg) + [cases_of["empty"]]
            check_partials(H, hd, S, cases, tag, Wo)
            if first:
                splits, full = cases_of["made_up"]
                rng = case_rng(f"{tag} merges splits={splits}")
                part_o = f32(rng, H, splits, hd)
                part_ml = np.stack([f32(rng, H, splits), np.abs(f32(rng, H, splits)) + 0.5], axis=-1)
                part_ml[:, full:] = (-np.inf, 0.0)
                part_o[:, full:] = 0.0
                check_merges(part_o, part_ml, Wo, f32(rng, D), f"{tag} splits={splits} (made up)")
                for extra in cases_of["extra"]:
                    h2, d2, s2 = extra["n_head"], extra["hd"], extra["max_seq"]
                    check_partials(h2, d2, s2, extra["cases"][:1] if OPT.quick
                                   else extra["cases"], f"D={h2 * d2} H={h2} hd={d2}")
        timed("attention", t_attention)

        # argmax_next: ties, NaN, -inf, strides, the prompt and end rules
        def t_argmax(rng):
            def logits_cases():
                yield f32(rng, V)
                tie = f32(rng, V); tie[[2, V - 1]] = 9.0; yield tie
                nan = f32(rng, V); nan[0] = np.nan; nan[3] = 50.0; yield nan
                yield np.full(V, -np.inf, np.float32)
                allnan = np.full(V, np.nan, np.float32); allnan[V - 2] = -np.inf; yield allnan
                yield np.full(V, np.nan, np.float32)
                big = f32(rng, 300); big[[299, 257, 200]] = 7.0; yield big  # 200 wins over thread 1's 257
            rules = sample.CASES["rules"](cfg)
            for j, lg in enumerate(logits_cases()):
                for p, n_prompt in (rules if j == 0 else rules[:1]):
                    tokens = rng.integers(0, V, S).astype(np.int32)
                    run_case("argmax_next", (1,), (256,),
                             [lg, np.array([p], np.int32), np.array([n_prompt], np.int32), tokens],
                             sample.CASES["tol"], label=f"pos={p} n_prompt={n_prompt} logits={lg[:4]}")
            # the deliberate bug's sampler (LAB_BUG_FLOAT_IDS): the same pick, stored as float32
            lg = f32(rng, V)
            run_case("argmax_next_float", (1,), (256,),
                     [lg, np.array([3], np.int32), np.array([2], np.int32), np.zeros(S, np.float32)],
                     sample.CASES["tol"], label="float ids")
        if first:  # independent of the model dims
            timed("argmax_next", t_argmax)

        # advance, and the probes of the cost recorder: empty does nothing, spin's float32
        # loop matches its twin, pos_set writes the position it is given, relay copies
        def t_advance(rng):
            run_case("advance", (1,), (1,), [np.array([7], np.int32)], position.CASES["tol"])
            if first:
                tol = probe.CASES["tol"]
                run_case("empty", (1,), (32,), [np.array([3], np.int32)], tol)
                run_case("spin", (1,), (1,), [np.int32(50), np.zeros(1, np.float32)],
                         probe.CASES["spin_tol"])
                run_case("pos_set", (1,), (32,), [np.array([7], np.int32), np.int32(300)], tol)
                run_case("relay", (1,), (256,), [f32(rng, 256), np.zeros(256, np.float32)], tol)
        timed("advance", t_advance)

        # the speculative-decoding kernels: the drafter and the acceptance, and the verify
        # step's column kernels, each against its twin and its one-token kernel
        def t_spec(rng):
            check_drafts(S)
            check_verify(rng, cfg, tag)

        def t_spec_cols(rng):
            check_verify_cols(cfg, tag)
            cases = VKA.CASES["cases"](cfg)
            check_verify_attention(H, hd, S, [cases[i] for i in VKA.CASES["quick"]]
                                   if OPT.quick else cases, tag)
            if first and not OPT.quick:
                h1, d1, s1, wide = VKA.CASES["wide"]
                check_verify_attention(h1, d1, s1, wide, f"D={h1 * d1} H={h1} hd={d1}")
        if first or OPT.gpu:  # the simulator runs a thread per CUDA thread: tiny dims
            timed("spec", t_spec)
            timed("spec_cols", t_spec_cols)

    skipped = QUICK_SKIPS if OPT.quick else set()
    return FAMILIES[family] - skipped


# ==== FUSED_DEFS
# ---- the fused step's kernels (kernels/fused.py, fused_split.py): op "fused" -----------------
FUSED_KERNELS = ("norm_qkv_rope", "attn_fused", "attn_fused_grid", "norm_swiglu",
                 "norm_lm_head_argmax", "attn_partial_wide", "attn_project_heads")
FUSED_SEED = 4321
FUSED_TOL = fused.CASES["tol"]     # kernels/fused.py's CASES: the shapes, tolerances and why


def copies(args):
    return [a.copy() if isinstance(a, np.ndarray) else a for a in args]


def same_bytes(a, b, what):
    if np.asarray(a).tobytes() != np.asarray(b).tobytes():
        raise Mismatch(f"{what}: not bit-identical (max diff "
                       f"{np.nanmax(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))):.3g})")


def second_launch(name, dt, grid, block, args, out, counter, written, label):
    """The replay-2 check: `name` launched again on copies of the same inputs leaves its counter
    slots (argument `counter`) at 0 and writes out's bits into every argument in `written`."""
    again = copies(args)
    compiled(name, sig_for(name, dt))[grid, block](*again)
    counter_zero(again[counter], f"{name} {label}, second launch")
    for i in written:
        same_bytes(again[i], out[i], f"{name} {label}: second launch, argument {i}")


def attention_inputs(rng, D, H, hd, S, dt, p, splits, scale):
    """The fused attentions' first nine arguments, in their order: q, the caches (dt), pos,
    zeroed part_o / part_ml for `splits` slices, scale, Wo, x."""
    return [f32(rng, D, scale=2.0), f32(rng, S, D).astype(dt), f32(rng, S, D).astype(dt),
            np.array([p], np.int32), np.zeros((H, splits, hd), np.float32),
            np.zeros((H, splits, 2), np.float32), scale, f32(rng, D, D, scale=D ** -0.5),
            f32(rng, D)]


def counter_zero(counter, what):
    if np.any(counter != 0):
        raise Mismatch(f"{what}: the last-block counter slots are {counter} after the launch, not 0")


def folded_order(W, x, w, eps):
    """W @ rmsnorm(x, w) in the fused kernels' order (kernels/fused_device.py's xw_dot2): each
    row is row_dot's order on x * w, times 1 / sqrt(row_dot's order on x . x / D + eps)."""
    x, w = np.asarray(x, np.float32), np.asarray(w, np.float32)
    ss = row_dot_order(x[None, :], x, FMA_ONCE)[0]
    inv = np.float32(1.0) / np.sqrt(ss / np.float32(x.shape[0]) + np.float32(eps), dtype=np.float32)
    return row_dot_order(W, x * w, FMA_ONCE) * inv


def rope_tables(S, hd):
    ang = np.arange(S)[:, None] * (10000.0 ** (-np.arange(hd // 2) / (hd // 2)))[None, :]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def check_norm_qkv_rope(rng, cfg, tag):
    """Full launch (q, k, v); the k/v part alone (LAB_OVERLAP's side launch) with a float16
    cache; the q part alone at position 0 (cos 1, sin 0: the rotation is exact, so q is the
    folded rows themselves). Bit for bit: q at position 0 and v (never rotated) against
    folded_order."""
    D, H, hd, S = cfg["D"], cfg["n_head"], cfg["hd"], cfg["max_seq"]
    cos, sin = rope_tables(S, hd)
    eps = np.float32(1e-5)
    tol = FUSED_TOL["norm_qkv_rope"]
    W = f32(rng, 3 * D, D, scale=D ** -0.5)
    x, w = f32(rng, D), f32(rng, D)
    blank = lambda dt: [np.zeros(D, np.float32), f32(rng, S, D).astype(dt), f32(rng, S, D).astype(dt)]
    out = run_case("norm_qkv_rope", *fused.qkv_grid(D, 3),
                   [x, w, eps, W, np.int32(0), np.array([5], np.int32), cos, sin, *blank(np.float32)],
                   tol, label=f"{tag} full pos=5")
    want = folded_order(W, x, w, eps)
    same_bytes(out[10][5], want[2 * D:], f"norm_qkv_rope {tag}: v vs the folded order")
    run_case("norm_qkv_rope", *fused.qkv_grid(D, 2),
             [x, w, eps, np.ascontiguousarray(W[D:]), np.int32(1), np.array([S - 1], np.int32),
              cos, sin, *blank(np.float16)], tol, np.float16, label=f"{tag} k/v part, float16 cache")
    q = run_case("norm_qkv_rope", *fused.qkv_grid(D, 1),
                 [x, w, eps, np.ascontiguousarray(W[:D]), np.int32(0), np.array([0], np.int32),
                  cos, sin, *blank(np.float32)], tol, label=f"{tag} q part, pos=0")[8]
    same_bytes(q, want[:D], f"norm_qkv_rope {tag}: q at position 0 vs the folded order")


def check_attn_fused(rng, cfg, tag):
    """Every block's partials, each head's merge + projection, the heads' sum + residual:
    against the twin; the counter slots back to 0; a second launch on the same inputs
    identical; and the split form bit for bit: attn_partial_wide's partials are attn_fused's,
    and attn_project_heads on attn_merge of them gives attn_fused's x."""
    D, H, hd, S = cfg["D"], cfg["n_head"], cfg["hd"], cfg["max_seq"]
    scale = np.float32(1.0 / np.sqrt(hd))
    tol = FUSED_TOL["attn_fused"]
    cases = fused.CASES["attn_fused"](cfg)
    if OPT.gpu and D > 16:
        cases += fused.CASES["attn_fused_gpu"](cfg)
    for n, (dt, p, splits) in enumerate(cases):
        threads = cfg["attn_threads"][n % len(cfg["attn_threads"])]
        grid, block = fused.attention_grid(H, splits, hd, threads)
        label = f"{tag} pos={p} splits={splits} threads={block[0]} cache={np.dtype(dt).name}"
        args = [*attention_inputs(rng, D, H, hd, S, dt, p, splits, scale),
                np.zeros((H, D), np.float32), np.zeros(fused.counter_slots(H), np.int32)]
        out = run_case("attn_fused", grid, block, args, tol, dt, label=label)
        counter_zero(out[10], f"attn_fused {label}")
        if n == 1:
            second_launch("attn_fused", dt, grid, block, args, out, 10, (4, 5, 8, 9), label)
        # the split form: its three kernels, each against its twin, and their bits against
        # attn_fused's (merge and projection run on the kernel's partials); its partials on
        # the several-slice and the float16 case (slow to simulate: the same device function)
        if n >= 1:
            part_o, part_ml = run_case("attn_partial_wide", grid, block, args[:7], tol, dt,
                                       label=label)[4:6]
            same_bytes(part_o, out[4], f"attn_partial_wide {label}: part_o vs attn_fused's")
            same_bytes(part_ml, out[5], f"attn_partial_wide {label}: part_ml vs attn_fused's")
        o = np.zeros(D, np.float32)
        compiled("attn_merge", REGISTRY["attn_merge"].signatures[0])[merge_grid(H, hd)](
            out[4], out[5], o)
        x = run_case("attn_project_heads", *fused.project_grid(D),
                     [args[7], o, args[8].copy(), np.int32(hd)], FUSED_TOL["attn_project_heads"],
                     label=label)[2]
        same_bytes(x, out[8], f"attn_fused {label}: x vs attn_project_heads(attn_merge(its partials))")


def check_attn_fused_grid(rng, cfg, tag):
    """LAB_ATTN_TAIL=grid: against the twin; the counter slots back to 0; a second launch on the
    same inputs identical; and its contract bit for bit: its partials are attn_partial's and its
    x is attn_combine's on them (the unfused attention's two kernels, which are its split)."""
    D, H, hd, S = cfg["D"], cfg["n_head"], cfg["hd"], cfg["max_seq"]
    scale = np.float32(1.0 / np.sqrt(hd))
    tol = FUSED_TOL["attn_fused_grid"]
    cases = list(fused.CASES["attn_fused_grid"])
    if OPT.gpu and D > 16:
        cases += fused.CASES["attn_fused_grid_gpu"](cfg)
    # the contract against attn_partial + attn_combine, on one case under the simulator's trees
    # (slow to simulate: those two kernels again); with --shuffles the harness's dump holds this
    # kernel's outputs bit for bit against the trees run's, and kernels.check's attention op holds
    # attn_partial and attn_combine on both paths
    contract = (range(len(cases)) if OPT.gpu else () if OPT.shuffles else (0,))
    for n, (dt, p, splits) in enumerate(cases):
        grid, block = fused.grid_tail_grid(H, splits, D)
        label = f"{tag} pos={p} splits={splits} grid={grid[0]} cache={np.dtype(dt).name}"
        args = [*attention_inputs(rng, D, H, hd, S, dt, p, splits, scale),
                np.zeros(fused.counter_slots(H), np.int32)]
        out = run_case("attn_fused_grid", grid, block, args, tol, dt, label=label)
        counter_zero(out[9], f"attn_fused_grid {label}")
        if n == 0:
            second_launch("attn_fused_grid", dt, grid, block, args, out, 9, (4, 5, 8), label)
        if n not in contract:
            continue
        part_o, part_ml = np.zeros_like(args[4]), np.zeros_like(args[5])
        compiled("attn_partial", sig_for("attn_partial", dt))[partial_grid(H, splits, hd)](
            *args[:4], part_o, part_ml, scale)
        same_bytes(out[4], part_o, f"attn_fused_grid {label}: part_o vs attn_partial's")
        same_bytes(out[5], part_ml, f"attn_fused_grid {label}: part_ml vs attn_partial's")
        x = args[8].copy()
        compiled("attn_combine", sig_for("attn_combine"))[combine_grid(D)](part_o, part_ml, args[7], x)
        same_bytes(out[8], x, f"attn_fused_grid {label}: x vs attn_combine(attn_partial)")


def check_row_dot_loaded(rng, cfg, tag):
    """attn_fused_grid's row dots: row_load + row_dot_loaded give row_dot's bits, row for row,
    with K past one group of loads (K = 600 > ROW_UNROLL * 32: the later groups' loop too) and
    rows past the matrix's end (0)."""
    from kernels.matvec import ROW_UNROLL, row_dot, row_dot_loaded, row_load

    @cuda.jit
    def both(W, vec, a, b):
        red = cuda.shared.array(64, np.float32)
        tid = cuda.threadIdx.x
        r = cuda.blockIdx.x * 2 + tid // 32
        wk = cuda.local.array(ROW_UNROLL, np.float32)
        row_load(W, r, tid, wk)
        x = row_dot_loaded(W, r, vec, tid, red, wk)
        y = row_dot(W, r, vec, tid, red)
        if tid % 32 == 0 and r < a.shape[0]:
            a[r] = x
            b[r] = y
    K = fused.CASES["row_dot_loaded_k"][OPT.gpu]
    W, vec = f32(rng, 5, K), f32(rng, K)
    a, b = np.zeros(6, np.float32), np.zeros(6, np.float32)
    both[3, 64](W, vec, a, b)
    same_bytes(a, b, f"row_dot_loaded {tag} K={K}: vs row_dot")
    if not np.any(a[:5]) or a[5] != 0:
        raise Mismatch(f"row_dot_loaded {tag}: rows {a} (want 5 dots, then 0 past the end)")


def check_norm_swiglu(rng, cfg, tag):
    D, F = cfg["D"], cfg["F"]
    # its dots are xw_dot2's, held bit for bit by norm_qkv_rope's check
    run_case("norm_swiglu", *fused.rows_grid(F),
             [f32(rng, D), f32(rng, D), np.float32(1e-5), f32(rng, F, D, scale=D ** -0.5),
              f32(rng, F, D, scale=D ** -0.5), np.zeros(F, np.float32)], FUSED_TOL["norm_swiglu"],
             label=tag)


def check_norm_lm_head_argmax(rng, cfg, tag):
    """Logits against the twin (and, on random weights, bit for bit against folded_order); the
    token: the argmax policy on the logits the kernel wrote (ties to the lowest index, NaN never
    wins, all NaN gives 0), only at generated positions; the position advanced every time; the
    counter back to 0; a second launch identical."""
    D, V, S = cfg["D"], cfg["V"], cfg["max_seq"]
    grid, block = fused.lm_head_grid(V)
    x, w = f32(rng, D), f32(rng, D)
    ties = f32(rng, V, D, scale=D ** -0.5)
    ties[0] = np.nan                        # logit 0 is NaN: never picked
    ties[2] = ties[V - 1] = 8.0 * np.sign(x * w) * D ** -0.5   # the largest logits, equal: 2 wins
    cases = [("ties and NaN, last slot", ties, S - 2, 1),
             ("all NaN", np.full((V, D), np.nan, np.float32), 3, 2),
             ("random", f32(rng, V, D, scale=D ** -0.5), 5, 2),
             ("prompt slot: no token", f32(rng, V, D, scale=D ** -0.5), 3, 5)]
    for n, (what, W, p, n_prompt) in enumerate(cases):
        label = f"{tag} {what} pos={p} n_prompt={n_prompt}"
        tokens = (np.arange(S, dtype=np.int32) + 100)          # recognisable "untouched" ids
        args = [x, w, np.float32(1e-5), W, np.zeros(V, np.float32), np.array([p], np.int32),
                np.array([n_prompt], np.int32), tokens, np.zeros(1, np.int32)]
        # tokens are checked on the kernel's logits
        out = run_case("norm_lm_head_argmax", grid, block, args, FUSED_TOL["norm_lm_head_argmax"],
                       label=label, skip=(7,),
                       nan_equal=True)            # NaN weights on purpose: NaN logits
        if what == "random":
            same_bytes(out[4], folded_order(W, x, w, np.float32(1e-5)),
                      f"norm_lm_head_argmax {label}: logits vs the folded order")
        want = tokens.copy()
        if p + 1 >= n_prompt:
            want[p + 1] = argmax_twin_index(out[4])
        if not np.array_equal(out[7], want) or out[5][0] != p + 1:
            raise Mismatch(f"norm_lm_head_argmax {label}: tokens {out[7]} (want {want}), "
                           f"pos {out[5][0]} (want {p + 1})")
        if n == 0 and out[7][p + 1] != 2:
            raise Mismatch(f"norm_lm_head_argmax {label}: picked {out[7][p + 1]}, want 2 (tie)")
        if n == 1 and out[7][p + 1] != 0:
            raise Mismatch(f"norm_lm_head_argmax {label}: picked {out[7][p + 1]}, want 0 (all NaN)")
        counter_zero(out[8], f"norm_lm_head_argmax {label}")
        if n == 0:
            second_launch("norm_lm_head_argmax", np.float32, grid, block, args, out, 8, (4, 5, 7),
                          label)


def check_fused() -> set[str]:
    """Every fused kernel's cases, in order, on one stream of FUSED_SEED's inputs."""
    if OPT.shuffles and not reduce.SHUFFLES:
        raise Mismatch("--shuffles: kernels/reduce.py did not take the shuffle path")
    rng = np.random.default_rng(FUSED_SEED)
    for cfg in fused.CASES["configs"] + ([fused.CASES["gpu_config"]] if OPT.gpu else []):
        tag = f"D={cfg['D']} H={cfg['n_head']} hd={cfg['hd']}"
        for name, check in (("norm_qkv_rope", check_norm_qkv_rope), ("attn_fused", check_attn_fused),
                            ("attn_fused_grid", check_attn_fused_grid),
                            ("row_dot_loaded", check_row_dot_loaded),
                            ("norm_swiglu", check_norm_swiglu),
                            ("norm_lm_head_argmax", check_norm_lm_head_argmax)):
            check(rng, cfg, tag)
    unlisted = sorted(n for n, spec in REGISTRY.items() if n not in FUSED_KERNELS
                      and spec.py_func.__module__ in (fused.__name__, fused_split.__name__))
    if unlisted:
        raise Mismatch(f"kernels in kernels/fused.py or fused_split.py this check does not know: "
                       f"{unlisted}")
    return set(FUSED_KERNELS)


# ---- the persistent step (kernels/persistent.py): op "persistent" ------------------------------
# kernels/persistent.py's CASES: the tiny model, the cases, the tolerance and why
PERSISTENT_SEED = 2468
PERSISTENT_EPS = np.float32(persistent.CASES["eps"])
P_TOKENS, P_POS, P_KC, P_VC, P_X, P_LOGITS, P_COUNTER = 0, 1, 15, 16, 17, 22, 23   # argument indices


def model_args(rng, cfg, dt, p, splits, n_prompt):
    L, D, H, hd, F, V, S = (cfg[k] for k in ("L", "D", "H", "hd", "F", "V", "S"))
    ang = np.arange(S)[:, None] * (10000.0 ** (-np.arange(hd // 2) / (hd // 2)))[None, :]
    tokens = rng.integers(0, V, S).astype(np.int32)
    return [tokens, np.array([p], np.int32), np.array([n_prompt], np.int32),
            f32(rng, V, D), 1.0 + 0.1 * f32(rng, L, 2, D),
            f32(rng, L, 3 * D, D, scale=D ** -0.5), f32(rng, L, D, D, scale=D ** -0.5),
            f32(rng, L, 2, F, D, scale=D ** -0.5), f32(rng, L, D, F, scale=F ** -0.5),
            1.0 + 0.1 * f32(rng, D), f32(rng, V, D, scale=D ** -0.5), PERSISTENT_EPS,
            np.float32(1.0 / np.sqrt(hd)), np.cos(ang).astype(np.float32),
            np.sin(ang).astype(np.float32), f32(rng, L, S, D).astype(dt),
            f32(rng, L, S, D).astype(dt), np.zeros(D, np.float32), np.zeros(D, np.float32),
            np.zeros((H, splits, hd), np.float32), np.zeros((H, splits, 2), np.float32),
            np.zeros(F, np.float32), np.zeros(V, np.float32),
            np.zeros(persistent.counter_slots(H), np.int32)]


def fused_sequence(a, cfg, dt):
    """The fused step's kernels (LAB_ATTN_TAIL=grid) one after another on copies of the
    persistent kernel's inputs: (tokens, pos, logits, x, k_cache, v_cache) after the step."""
    (tokens, pos, n_prompt, wte, norms, wqkv, wo, w_gu, w_down, final_norm, lm_head, eps, scale,
     cos, sin, k_cache, v_cache, x, q, part_o, part_ml, act, logits, _) = \
        [v.copy() if isinstance(v, np.ndarray) else v for v in a]
    D, H, F, V = (cfg[k] for k in ("D", "H", "F", "V"))
    splits = part_o.shape[1]
    counter = np.zeros(2, np.int32)
    compiled("embed", sig_for("embed"))[embed.grid_for(D)](tokens, pos, wte, x)
    for layer in range(wqkv.shape[0]):
        kc, vc = k_cache[layer], v_cache[layer]
        compiled("norm_qkv_rope", sig_for("norm_qkv_rope", dt))[fused.qkv_grid(D, 3)](
            x, norms[layer, 0].copy(), eps, wqkv[layer], np.int32(0), pos, cos, sin, q, kc, vc)
        compiled("attn_fused_grid", sig_for("attn_fused_grid", dt))[
            fused.grid_tail_grid(H, splits, D)](q, kc, vc, pos, part_o, part_ml, scale, wo[layer],
                                                x, counter)
        compiled("norm_swiglu", sig_for("norm_swiglu"))[fused.rows_grid(F)](
            x, norms[layer, 1].copy(), eps, w_gu[layer, 0].copy(), w_gu[layer, 1].copy(), act)
        compiled("matvec_residual", sig_for("matvec_residual"))[matvec.grid_for(D)](
            w_down[layer], act, x)
    compiled("norm_lm_head_argmax", sig_for("norm_lm_head_argmax"))[fused.lm_head_grid(V)](
        x, final_norm, eps, lm_head, logits, pos, n_prompt, tokens, np.zeros(1, np.int32))
    return tokens, pos, logits, x, k_cache, v_cache


def _copies(args):
    return [v.copy() if isinstance(v, np.ndarray) else v for v in args]


def check_case(rng, cfg, dt, p, splits, n_prompt, grid, fused_bits):
    T = cfg["T"]
    label = (f"pos={p} splits={splits} n_prompt={n_prompt} cache={np.dtype(dt).name} "
             f"grid={grid} block={T}")
    args = model_args(rng, cfg, dt, p, splits, n_prompt)
    spec = REGISTRY["step_persistent"]
    kern = compiled("step_persistent", sig_for("step_persistent", dt))
    got = _copies(args)
    kern[grid, (T,)](*got)
    want = _copies(args)
    spec.twin(grid, (T,), *want)
    # against the twin: float32 within persistent.CASES["tol"], integers exactly; the argument
    # a kernel does not write untouched
    for i, (orig, a, b) in enumerate(zip(args, got, want)):
        if not isinstance(orig, np.ndarray):
            continue
        name = spec.arg_names[i]
        if i not in spec.writes:
            if not np.array_equal(a, orig):
                raise Mismatch(f"step_persistent {label}: {name} changed but is not written")
        elif a.dtype.kind in "iu":
            if name != "tokens" and not np.array_equal(a, b):
                raise Mismatch(f"step_persistent {label}: {name} {a} != twin {b}")
        else:
            ok, err = close(a, b, *persistent.CASES["tol"], np.finfo(a.dtype).eps)
            if not ok:
                raise Mismatch(f"step_persistent {label}: {name} max |err| {err:.3g} vs the twin")
    if got[P_COUNTER][persistent.SLOT_ERR] or not persistent.settled(got[P_COUNTER],
                                                                    _adds(cfg)):
        raise Mismatch(f"step_persistent {label}: counter slots {got[P_COUNTER]} after the "
                       f"launch, not one clean launch's (error word: "
                       f"{persistent.describe_wait(got[P_COUNTER][0])})")
    # the token: the argmax policy on the kernel's own logits (a near tie may differ from the
    # twin's pick on its logits), only at a generated slot
    tok = args[P_TOKENS].copy()
    if p + 1 >= n_prompt:
        tok[p + 1] = argmax_twin_index(got[P_LOGITS])
    if not np.array_equal(got[P_TOKENS], tok) or got[P_POS][0] != p + 1:
        raise Mismatch(f"step_persistent {label}: tokens {got[P_TOKENS]} (want {tok}), "
                       f"pos {got[P_POS]}")
    if fused_bits:   # bit for bit the fused step's kernels (grid tail)
        tokens, pos, logits, x, kc, vc = fused_sequence(args, cfg, dt)
        for name, a, b in (("tokens", got[P_TOKENS], tokens), ("pos", got[P_POS], pos),
                           ("logits", got[P_LOGITS], logits), ("x", got[P_X], x),
                           ("k_cache", got[P_KC], kc), ("v_cache", got[P_VC], vc)):
            if a.tobytes() != b.tobytes():
                raise Mismatch(f"step_persistent {label}: {name} is not the fused step's bits")
    if OPT.gpu:   # launches again on the same inputs: the same bits (the counts started at 0)
        for again in range(3):
            rerun = _copies(args)
            kern[grid, (T,)](*rerun)
            for i in spec.writes:
                if rerun[i].tobytes() != got[i].tobytes():
                    raise Mismatch(f"step_persistent {label}: launch {again + 2}, "
                                   f"{spec.arg_names[i]} differs from the first")
    return got


def _adds(cfg):
    return persistent.launch_adds(cfg["L"], cfg["D"], cfg["F"], cfg["V"], cfg["H"], cfg["hd"])


def _variant(name: str, stamped: bool, dt):
    """Variant `name` of the persistent kernel (kernels/persistent.py's VARIANTS or PROBES),
    compiled once with step_persistent's signature for `dt` (stamped: STAMPED_SIGS) and jit
    options."""
    i = 0 if np.dtype(dt) == np.float32 else 1
    sig = persistent.STAMPED_SIGS[i] if stamped else REGISTRY["step_persistent"].signatures[i]
    key = ("step_persistent", name, stamped, sig)
    if key not in _compiled:
        opts = dict(REGISTRY["step_persistent"].jit_options) if OPT.gpu else {}
        _compiled[key] = cuda.jit(sig, **opts)(persistent.variant_kernel(name, stamped))
    return _compiled[key]


def check_variants(rng, cfg, dt, p, splits, n_prompt, grid, plain) -> None:
    """Every other variant of the body (VARIANTS) on the same inputs: step_persistent's bits in
    every output, the counter as its own twin leaves it (a clean launch of its exit form)."""
    T = cfg["T"]
    args = model_args(rng, cfg, dt, p, splits, n_prompt)
    spec = REGISTRY["step_persistent"]
    for name in persistent.VARIANTS:
        if name == persistent.DEFAULT_VARIANT:
            continue
        label = f"variant {name} pos={p} splits={splits} grid={grid}"
        got = _copies(args)
        _variant(name, False, dt)[grid, (T,)](*got)
        want = _copies(args)
        persistent.variant_spec(name).twin(grid, (T,), *want)
        for i in spec.writes:
            if i == P_COUNTER:
                if got[i].tobytes() != want[i].tobytes():
                    raise Mismatch(f"step_persistent {label}: counter {got[i]}, its twin's "
                                   f"{want[i]}")
            elif got[i].tobytes() != plain[i].tobytes():
                raise Mismatch(f"step_persistent {label}: {spec.arg_names[i]} differs from "
                               f"step_persistent's ({persistent.DEFAULT_VARIANT})")


def check_probes(rng, cfg, dt, p, splits, n_prompt, grid, plain) -> None:
    """Every body that leaves work out (kernels/persistent.py's PROBES, timing only) on the same
    inputs: the launch ends with no wait given up and the counts a clean launch leaves, x is
    NOT the step's (the work it leaves out is left out), and its stamped form's stamps are
    sane (the probe script reads them)."""
    T = cfg["T"]
    args = model_args(rng, cfg, dt, p, splits, n_prompt)
    for name in persistent.PROBES:
        label = f"probe {name} pos={p} splits={splits} grid={grid}"
        got = _copies(args)
        _variant(name, False, dt)[grid, (T,)](*got)
        word = int(got[P_COUNTER][persistent.SLOT_ERR])
        if word:
            raise Mismatch(f"step_persistent {label}: a wait gave up: "
                           f"{persistent.describe_wait(word)}")
        if not persistent.settled(got[P_COUNTER], _adds(cfg)):
            raise Mismatch(f"step_persistent {label}: counts {got[P_COUNTER]}, not a launch's")
        if got[P_X].tobytes() == plain[P_X].tobytes():
            raise Mismatch(f"step_persistent {label}: x is the step's: nothing was left out")
        stamps = np.zeros((grid[0], persistent.phase_count(cfg["L"]), persistent.STAMP_FIELDS),
                          np.int64)
        got = _copies(args) + [stamps]
        _variant(name, True, dt)[grid, (T,)](*got)       # its stamped form: sane stamps
        _check_stamps(got[-1], f"stamped {label}")


def check_stamped(rng, cfg, dt, p, splits, n_prompt, grid, plain) -> None:
    """step_persistent_stamped on the same inputs: the plain kernel's bits, and a stamp per
    phase: start <= ready <= end in every block that had items."""
    T = cfg["T"]
    label = f"stamped pos={p} splits={splits} grid={grid}"
    args = model_args(rng, cfg, dt, p, splits, n_prompt)
    n_ph = persistent.phase_count(cfg["L"])
    stamps = np.zeros((grid[0], n_ph, persistent.STAMP_FIELDS), np.int64)
    got = _copies(args) + [stamps]
    _variant(persistent.DEFAULT_VARIANT, True, dt)[grid, (T,)](*got)
    for i in REGISTRY["step_persistent"].writes:
        if got[i].tobytes() != plain[i].tobytes():
            raise Mismatch(f"step_persistent {label}: {REGISTRY['step_persistent'].arg_names[i]} "
                           f"differs from step_persistent's")
    _check_stamps(got[-1], label)


def _check_stamps(st, label: str) -> None:
    """A stamped launch's stamps: start <= end everywhere, and in every busy phase its ready
    stamp (its wait returned) between them."""
    busy = st[:, :, 6] > 0
    for f0, f1 in ((0, 2), (3, 5)):      # clock64, globaltimer: start <= end everywhere
        if np.any(st[:, :, f1] < st[:, :, f0]):
            raise Mismatch(f"step_persistent {label}: a phase ends before it starts (field {f0})")
    ready = st[:, :, 4]
    if np.any(busy & ((ready < st[:, :, 3]) | (ready > st[:, :, 5]))):
        raise Mismatch(f"step_persistent {label}: a busy phase's ready stamp is outside it")


def check_timeout(rng, cfg, dt, p, splits, n_prompt, grid) -> None:
    """A wait made impossible (the mlp's count started far below 0): the launch still ends, the
    error word names that wait (layer 0's mlp up), every other count is as a launch leaves it
    (the poisoned one stays poisoned: the host zeroes the counter when it reads the error word),
    and the next launch on fresh inputs writes the clean bits."""
    T = cfg["T"]
    label = f"timeout grid={grid}"
    args = model_args(rng, cfg, dt, p, splits, n_prompt)
    kern = compiled("step_persistent", sig_for("step_persistent", dt))
    clean = _copies(args)
    kern[grid, (T,)](*clean)
    bad = _copies(args)
    bad[P_COUNTER][persistent.SLOT_X_ATTN] = -(1 << 30)
    kern[grid, (T,)](*bad)
    word = int(bad[P_COUNTER][persistent.SLOT_ERR])
    want = persistent.wait_code(0, 3, 0)
    # every wait that stops records its code and the word keeps the smallest (record_give_up):
    # at 132 blocks of these dims some blocks reach a later wait first and spin out sooner (the
    # protocol model's test_the_error_word_names_the_wait_made_impossible), so "the first to
    # spin out" would name that later wait
    if word != want:
        raise Mismatch(f"step_persistent {label}: error word {word} "
                       f"({persistent.describe_wait(word)!r}), want {want} "
                       f"({persistent.describe_wait(want)!r})")
    poisoned = bad[P_COUNTER].astype(np.int64)
    if persistent.VARIANTS[persistent.DEFAULT_VARIANT]["epochs"]:
        poisoned[persistent.SLOT_X_ATTN] += 1 << 30    # the poisoned count stays poisoned
    poisoned[persistent.SLOT_ERR] = 0                  # (the arrive exit zeroes every count)
    if not persistent.settled(poisoned, _adds(cfg)):
        raise Mismatch(f"step_persistent {label}: counts {bad[P_COUNTER]} after a timeout, not "
                       f"a launch's")
    again = _copies(args)
    kern[grid, (T,)](*again)
    for i in REGISTRY["step_persistent"].writes:
        if again[i].tobytes() != clean[i].tobytes():
            raise Mismatch(f"step_persistent {label}: after a timeout, "
                           f"{REGISTRY['step_persistent'].arg_names[i]} is not the clean bits")


def check_persistent() -> set[str]:
    """step_persistent against its twin and, bit for bit, the fused kernels (grid tail) one after
    another; its clock-stamped form and every other variant of its body (VARIANTS) write the
    same bits; a wait made impossible sets the error word and leaves the other counts clean. On the simulator: the first case at grid (1,), one layer
    (the timeout case too: a wait there is met at once or never). On a GPU: every case at grids
    of 1, 2, 7 and 132 blocks, two layers, launches repeated identical."""
    if OPT.shuffles and not reduce.SHUFFLES:
        raise Mismatch("--shuffles: kernels/reduce.py did not take the shuffle path")
    cases_of = persistent.CASES
    cfg = dict(cases_of["tiny"], L=cases_of["gpu_layers"]) if OPT.gpu else cases_of["tiny"]
    grids = list(cases_of["gpu_grids"]) if OPT.gpu else [(1,)]
    cases = cases_of["cases"] if OPT.gpu else cases_of["cases"][:1]
    for n, (dt, p, splits, n_prompt) in enumerate(cases):
        rng = np.random.default_rng(PERSISTENT_SEED + n)     # each case's inputs its own
        for grid in grids:
            state = rng.bit_generator.state
            out = check_case(rng, cfg, dt, p, splits, n_prompt, grid, fused_bits=True)
            if n == 0 and grid == (1,):
                _dump.extend((f"step_persistent {REGISTRY['step_persistent'].arg_names[i]}",
                              out[i].copy()) for i in REGISTRY["step_persistent"].writes)
            if n == 0 and (OPT.gpu or grid == (1,)):
                rng.bit_generator.state = state              # the same inputs again
                check_stamped(rng, cfg, dt, p, splits, n_prompt, grid, out)
                rng.bit_generator.state = state
                check_variants(rng, cfg, dt, p, splits, n_prompt, grid, out)
                rng.bit_generator.state = state
                check_probes(rng, cfg, dt, p, splits, n_prompt, grid, out)
            if n == 0 and grid == grids[-1]:
                check_timeout(np.random.default_rng(PERSISTENT_SEED), cfg, dt, p, splits,
                              n_prompt, grid)
    return {"step_persistent"} if OPT.gpu else set()   # the simulator: the float32 cache only


# ---- the API and the command line ------------------------------------------------------------
OPS = {**{f: check_family for f in FAMILIES}, "fused": check_fused,
       "persistent": check_persistent}


def _run_here(ops, mode: str, quick: bool = False, dump: str | None = None) -> dict:
    """Run `ops` in this process (its numba already in the right mode)."""
    OPT.gpu, OPT.shuffles, OPT.quick = mode == "gpu", mode == "shuffles", quick
    if OPT.shuffles and not reduce.SHUFFLES:
        raise RuntimeError("mode 'shuffles': kernels/reduce.py did not take the shuffle path")
    t0 = time.perf_counter()
    result = {"mode": mode_label(OPT.gpu), "ok": True, "ops": {}, "seconds": 0.0}
    labels: list[str] = []
    arrays: list[np.ndarray] = []
    for op in ops:
        _exercised.clear()
        _dump.clear()
        t = time.perf_counter()
        row = {"ok": True, "error": None, "kernels": [], "signatures": 0}
        try:
            mine = OPS[op](op) if OPS[op] is check_family else OPS[op]()
            missing = sorted({(n, s) for n in mine for s in REGISTRY[n].signatures} - _exercised)
            if missing:
                raise Mismatch(f"kernels/signatures never exercised: {missing}")
            row.update(kernels=sorted(mine or {n for n, _ in _exercised}), signatures=len(_exercised))
        except Mismatch as e:
            row.update(ok=False, error=str(e))
            result["ok"] = False
        row["seconds"] = round(time.perf_counter() - t, 2)
        result["ops"][op] = row
        labels += [f"{op}: {label}" for label, _ in _dump]
        arrays += [a for _, a in _dump]
    if dump:
        np.savez(dump, labels=np.array(labels), **{f"a{i}": a for i, a in enumerate(arrays)})
    result["seconds"] = round(time.perf_counter() - t0, 2)
    return result


# a fresh interpreter for a simulator mode: the patches (and the shuffles) go in before the
# kernels package is imported, by kernels/cudasim.py's path
_CHILD = """import importlib.util, sys
spec = importlib.util.spec_from_file_location("kernels.cudasim", {path!r})
sim = importlib.util.module_from_spec(spec); sys.modules[spec.name] = sim; spec.loader.exec_module(sim)
sim.install(shuffles={shuffles})
from kernels.check import _child
_child(sys.argv[1:])
"""


def _child(argv) -> None:
    out, mode, quick, dump, ops = argv[0], argv[1], argv[2] == "1", argv[3] or None, argv[4:]
    Path(out).write_text(json.dumps(_run_here(ops, mode, quick, dump)))


def run(ops=None, mode: str = "gpu", *, quick: bool = False, dump: str | None = None) -> dict:
    """Run `ops` (names of OPS; None: all) on `mode` ("cudasim", "shuffles" or "gpu") and
    return {"mode", "ok", "ops": {op: {"ok", "seconds", "error", "kernels", "signatures"}},
    "seconds"}. A mismatch is reported in the dict, never raised. The simulator modes run in one
    child process for all the ops; "gpu" runs here (numba must not be in simulator mode)."""
    ops = list(OPS) if not ops else list(ops)
    unknown = sorted(set(ops) - set(OPS))
    if unknown:
        raise ValueError(f"unknown op{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
                         f"the ops: {', '.join(OPS)}")
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; the modes: {', '.join(MODES)}")
    if mode == "gpu":
        if config.ENABLE_CUDASIM:
            raise RuntimeError("mode 'gpu' in a process whose numba is the CUDA simulator")
        return _run_here(ops, mode, quick, dump)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        code = _CHILD.format(path=str(Path(__file__).with_name("cudasim.py")),
                             shuffles=mode == "shuffles")
        proc = subprocess.run([sys.executable, "-c", code, str(out), mode, "1" if quick else "0",
                               dump or "", *ops], env=cudasim.child_env(), capture_output=True,
                              text=True)
        if proc.returncode != 0 or not out.exists():
            raise RuntimeError(f"kernels.check child (mode {mode}) failed, rc {proc.returncode}:"
                               f"\n{proc.stdout}\n{proc.stderr[-4000:]}")
        return json.loads(out.read_text())


def main(argv=None) -> int:
    import argparse
    ap = argparse.ArgumentParser(prog="python -m kernels.check",
                                 description="Every op's kernels against their NumPy twins and "
                                             "contracts, on numba's CUDA simulator or a GPU.")
    where = ap.add_mutually_exclusive_group()
    for m, what in (("cudasim", "numba's CUDA simulator with its own reduction trees (default)"),
                    ("shuffles", "the simulator with lane-exact warp shuffles"),
                    ("gpu", "kernels compiled for the device, plus the model's dims")):
        where.add_argument(f"--{m}", dest="mode", action="store_const", const=m, help=what)
    ap.add_argument("--quick", action="store_true",
                    help="attention and spec_cols on one case per code path")
    ap.add_argument("--dump", metavar="PATH", help="every kernel output, labelled, to PATH (.npz)")
    ap.add_argument("ops", nargs="*", metavar="OP", help=f"ops to run (all by default): "
                                                          f"{', '.join(OPS)}")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    # the simulator runs a Python thread per CUDA thread, which does not unwind promptly on
    # Ctrl-C; nothing here needs cleaning up: stop at once, as a shell would
    signal.signal(signal.SIGINT, lambda *_: os._exit(130))
    try:
        result = run(args.ops, args.mode or "cudasim", quick=args.quick, dump=args.dump)
    except (ValueError, RuntimeError) as e:
        print(f"kernels.check: {e}", file=sys.stderr)
        return 2
    for op, row in result["ops"].items():
        print(f"{op:<16} {'ok' if row['ok'] else 'MISMATCH':<9} {row['seconds']:6.1f}s  "
              f"{len(row['kernels'])} kernels, {row['signatures']} signatures"
              + (f"\n  {row['error']}" if row["error"] else ""))
    print(f"{result['mode']}: {'OK' if result['ok'] else 'MISMATCH'} in {result['seconds']:.1f}s")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
