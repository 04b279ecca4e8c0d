"""Run the fused step's kernels (kernels/fused.py, fused_split.py) under numba's CUDA simulator against their twins.

Started by tests/test_fusion.py in a subprocess with NUMBA_ENABLE_CUDASIM=1 (the flag must be set
before numba is imported). For each fused kernel and signature it launches the kernel at tiny
shapes (the simulator runs every thread in Python) and compares the written arguments with the
twin's (`atol + k * eps(dtype) * |ref|`), checks that arguments it does not declare as written
are untouched, and checks the last-block counters: every slot 0 after every launch, and a second
launch on the same inputs giving the same bits (the replay-2 check). Contracts checked bit for
bit, on the simulator and on a GPU alike: the folded norm's rows (norm_qkv_rope's q at position
0 and its v, norm_lm_head_argmax's logits) are lab/precision.py's `row_dot_order` on x * w,
scaled by 1 / sqrt(row_dot_order(x, x) / D + eps); attn_fused's partials are attn_partial_wide's
and its x is attn_project_heads on attn_merge of them (the split form, LAB_SPLIT_COMBINE=1 under
LAB_FUSION=1, is the fused kernel's bits); the token norm_lm_head_argmax writes is the argmax
policy's pick on the logits it wrote; attn_fused_grid's partials are attn_partial's and its x
is attn_combine's on them (LAB_ATTN_TAIL=grid: the unfused attention's bits). Exits non-zero naming the kernel on the first mismatch, or
if a fused kernel/signature was never exercised.

  --shuffles    give the simulator kernels/cudasim.py's lane-exact warp shuffles first,
                so kernels/reduce.py takes its GPU path (shuffle butterflies, one barrier per
                block reduction): the dataflow a GPU runs, without a GPU
  --dump PATH   write every kernel output in launch order to PATH (.npz); tests/test_fusion.py
                holds the two paths' dumps bit for bit against each other
  --gpu         the same checks on a real device (kernels compiled for real), plus the model's dims
"""
import sys
import time

import numpy as np
from numba import config, cuda

GPU = "--gpu" in sys.argv
if not config.ENABLE_CUDASIM and not GPU:
    sys.exit("_cudasim_fused.py needs NUMBA_ENABLE_CUDASIM=1 set before numba is imported")
if "--shuffles" in sys.argv:   # before kernels/ is imported: reduce.py picks its path at import
    if not config.ENABLE_CUDASIM:
        sys.exit("--shuffles is for the simulator (a GPU has its own)")
    from _cudasim_kernels import cudasim_module      # kernels/cudasim.py, by its path
    cudasim_module().install(shuffles=True)           # (idempotent: the harness's import did it)
# the kernel harness's launch-and-compare against the twin, its registry of compiled kernels
# and signatures exercised, its --dump list, and lab/precision.py's order mirror with the fma
# semantics of the machine at hand
from _cudasim_kernels import (FUSED as FMA_ONCE, Mismatch, _exercised, compiled, f32,  # noqa: E402
                              mode_label, row_dot_order, run_case, run_harness, save_dump, sig_for)

from kernels import REGISTRY, fused, fused_split, reduce  # noqa: E402
from kernels.attention import combine_grid, merge_grid, partial_grid  # noqa: E402
from kernels.sample import argmax_twin_index  # noqa: E402

FUSED = ("norm_qkv_rope", "attn_fused", "attn_fused_grid", "norm_swiglu", "norm_lm_head_argmax",
         "attn_partial_wide", "attn_project_heads")
SEED = 4321

# n_head 2 (head indexing), hd 8 (a 2-tile context at max_seq 16), F and V not multiples of the
# rows a block computes; attention blocks of 32 or 64 threads (4 or 8 groups of hd lanes, 1 or 2
# warps for the tail's rows)
TINY = dict(D=16, n_head=2, hd=8, F=24, V=11, max_seq=16, attn_threads=(32, 64))
CONFIGS = [TINY]
if GPU:   # the real model's dims, attn_fused at its own block size (max_seq cut to 128)
    CONFIGS.append(dict(D=256, n_head=4, hd=64, F=512, V=71, max_seq=128, attn_threads=(None,)))


def copies(args):
    return [a.copy() if isinstance(a, np.ndarray) else a for a in args]


def same_bits(a, b, what):
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
        same_bits(again[i], out[i], f"{name} {label}: second launch, argument {i}")


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
    # rmsnorm (~(log2 D + 4) eps), a D-term dot (error relative to sum |W h|, so atol), two
    # products and a sum for RoPE: atol 1e-5 and k = 16, as the unfused kernels' checks
    tol = (1e-5, 16)
    W = f32(rng, 3 * D, D, scale=D ** -0.5)
    x, w = f32(rng, D), f32(rng, D)
    blank = lambda dt: [np.zeros(D, np.float32), f32(rng, S, D).astype(dt), f32(rng, S, D).astype(dt)]
    out = run_case("norm_qkv_rope", *fused.qkv_grid(D, 3),
                   [x, w, eps, W, np.int32(0), np.array([5], np.int32), cos, sin, *blank(np.float32)],
                   tol, label=f"{tag} full pos=5")
    want = folded_order(W, x, w, eps)
    same_bits(out[10][5], want[2 * D:], f"norm_qkv_rope {tag}: v vs the folded order")
    run_case("norm_qkv_rope", *fused.qkv_grid(D, 2),
             [x, w, eps, np.ascontiguousarray(W[D:]), np.int32(1), np.array([S - 1], np.int32),
              cos, sin, *blank(np.float16)], tol, np.float16, label=f"{tag} k/v part, float16 cache")
    q = run_case("norm_qkv_rope", *fused.qkv_grid(D, 1),
                 [x, w, eps, np.ascontiguousarray(W[:D]), np.int32(0), np.array([0], np.int32),
                  cos, sin, *blank(np.float32)], tol, label=f"{tag} q part, pos=0")[8]
    same_bits(q, want[:D], f"norm_qkv_rope {tag}: q at position 0 vs the folded order")


def check_attn_fused(rng, cfg, tag):
    """Every block's partials, each head's merge + projection, the heads' sum + residual:
    against the twin; the counter slots back to 0; a second launch on the same inputs
    identical; and the split form bit for bit: attn_partial_wide's partials are attn_fused's,
    and attn_project_heads on attn_merge of them gives attn_fused's x."""
    D, H, hd, S = cfg["D"], cfg["n_head"], cfg["hd"], cfg["max_seq"]
    scale = np.float32(1.0 / np.sqrt(hd))
    # scores: hd-term dots; exp; sums of <= L terms with an online rescale; merge (<= splits
    # terms, a divide); hd-term projections summed over heads: values O(1), so k = 64 and atol
    # 1e-5, as the unfused attention's checks
    tol = (1e-5, 64)
    cases = [(np.float32, S - 1, 1), (np.float32, 9, 3), (np.float16, 0, 2)]  # 2 tiles; 3 slices; L = 1, an empty slice
    if GPU and D > 16:
        cases += [(np.float32, S - 1, 4), (np.float16, S - 1, 32)]
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
            same_bits(part_o, out[4], f"attn_partial_wide {label}: part_o vs attn_fused's")
            same_bits(part_ml, out[5], f"attn_partial_wide {label}: part_ml vs attn_fused's")
        o = np.zeros(D, np.float32)
        compiled("attn_merge", REGISTRY["attn_merge"].signatures[0])[merge_grid(H, hd)](
            out[4], out[5], o)
        x = run_case("attn_project_heads", *fused.project_grid(D),
                     [args[7], o, args[8].copy(), np.int32(hd)], (1e-5, 16), label=label)[2]
        same_bits(x, out[8], f"attn_fused {label}: x vs attn_project_heads(attn_merge(its partials))")


def check_attn_fused_grid(rng, cfg, tag):
    """LAB_ATTN_TAIL=grid: against the twin; the counter slots back to 0; a second launch on the
    same inputs identical; and its contract bit for bit: its partials are attn_partial's and its
    x is attn_combine's on them (the unfused attention's two kernels, which are its split)."""
    D, H, hd, S = cfg["D"], cfg["n_head"], cfg["hd"], cfg["max_seq"]
    scale = np.float32(1.0 / np.sqrt(hd))
    tol = (1e-5, 64)   # as attn_fused's
    # 2 slices of a 10-step context; L = 1 over 2 slices (an empty slice), the float16 signature
    cases = [(np.float32, 9, 2), (np.float16, 0, 2)]
    if GPU and D > 16:
        cases += [(np.float32, S - 1, 1), (np.float32, S - 1, 4), (np.float16, S - 1, 32)]
    # the contract against attn_partial + attn_combine, on one case under the simulator's trees
    # (slow to simulate: those two kernels again); with --shuffles the harness's dump holds this
    # kernel's outputs bit for bit against the trees run's, and tests/_cudasim_kernels.py holds
    # attn_partial and attn_combine on both paths
    contract = (range(len(cases)) if GPU else () if "--shuffles" in sys.argv else (0,))
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
        same_bits(out[4], part_o, f"attn_fused_grid {label}: part_o vs attn_partial's")
        same_bits(out[5], part_ml, f"attn_fused_grid {label}: part_ml vs attn_partial's")
        x = args[8].copy()
        compiled("attn_combine", sig_for("attn_combine"))[combine_grid(D)](part_o, part_ml, args[7], x)
        same_bits(out[8], x, f"attn_fused_grid {label}: x vs attn_combine(attn_partial)")


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
    K = 600 if not GPU else 1100
    W, vec = f32(rng, 5, K), f32(rng, K)
    a, b = np.zeros(6, np.float32), np.zeros(6, np.float32)
    both[3, 64](W, vec, a, b)
    same_bits(a, b, f"row_dot_loaded {tag} K={K}: vs row_dot")
    if not np.any(a[:5]) or a[5] != 0:
        raise Mismatch(f"row_dot_loaded {tag}: rows {a} (want 5 dots, then 0 past the end)")


def check_norm_swiglu(rng, cfg, tag):
    D, F = cfg["D"], cfg["F"]
    # rmsnorm, two D-term dots, exp and a divide: atol 1e-5, k = 16 (as swiglu_up's check); its
    # dots are xw_dot2's, held bit for bit by norm_qkv_rope's check
    run_case("norm_swiglu", *fused.rows_grid(F),
             [f32(rng, D), f32(rng, D), np.float32(1e-5), f32(rng, F, D, scale=D ** -0.5),
              f32(rng, F, D, scale=D ** -0.5), np.zeros(F, np.float32)], (1e-5, 16), label=tag)


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
        # rmsnorm and a D-term dot: atol 1e-5, k = 16; tokens are checked on the kernel's logits
        out = run_case("norm_lm_head_argmax", grid, block, args, (1e-5, 16), label=label, skip=(7,),
                       nan_equal=True)            # NaN weights on purpose: NaN logits
        if what == "random":
            same_bits(out[4], folded_order(W, x, w, np.float32(1e-5)),
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


def main() -> int:
    if "--shuffles" in sys.argv and not reduce.SHUFFLES:
        raise Mismatch("--shuffles: kernels/reduce.py did not take the shuffle path")
    rng = np.random.default_rng(SEED)
    t_start = time.perf_counter()
    timings: dict[str, float] = {}
    for cfg in CONFIGS:
        tag = f"D={cfg['D']} H={cfg['n_head']} hd={cfg['hd']}"
        for name, check in (("norm_qkv_rope", check_norm_qkv_rope), ("attn_fused", check_attn_fused),
                            ("attn_fused_grid", check_attn_fused_grid),
                            ("row_dot_loaded", check_row_dot_loaded),
                            ("norm_swiglu", check_norm_swiglu),
                            ("norm_lm_head_argmax", check_norm_lm_head_argmax)):
            t = time.perf_counter()
            check(rng, cfg, tag)
            timings[name] = timings.get(name, 0.0) + time.perf_counter() - t
    missing = sorted({(n, s) for n in FUSED for s in REGISTRY[n].signatures} - _exercised)
    if missing:
        raise Mismatch(f"fused kernels/signatures never exercised: {missing}")
    unlisted = sorted(n for n, spec in REGISTRY.items() if n not in FUSED
                      and spec.py_func.__module__ in (fused.__name__, fused_split.__name__))
    if unlisted:
        raise Mismatch(f"kernels in kernels/fused.py or fused_split.py this check does not know: "
                       f"{unlisted}")
    print(" ".join(f"{k}={v:.1f}s" for k, v in timings.items()))
    save_dump()
    print(f"{mode_label(GPU)}: {len(FUSED)} fused kernels, {len(_exercised)} signatures "
          f"OK in {time.perf_counter() - t_start:.1f}s")
    return 0


if __name__ == "__main__":
    run_harness(main)
