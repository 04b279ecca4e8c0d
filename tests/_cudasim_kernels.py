"""Run every registered kernel under numba's CUDA simulator against its NumPy twin.

Started by tests/test_kernels.py in a subprocess with NUMBA_ENABLE_CUDASIM=1 (the flag must be set
before numba is imported). For each kernel in REGISTRY and each of its signatures it compiles
`cuda.jit(sig)(spec.py_func)`, launches it at tiny shapes and compares the written arguments with
the twin's (`atol + k * eps(dtype) * |ref|`), checks that arguments it does not declare as written
are untouched, and checks attn_combine bitwise against attn_merge + matvec_residual. Exits
non-zero naming the kernel on the first mismatch, or if a registered kernel/signature was never
exercised.
"""
import sys
import time

import numpy as np
from numba import config, cuda

# `--gpu` runs the same checks on a real device (kernels compiled for real); otherwise the
# simulator is required, and it can only be switched on before numba is imported.
if not config.ENABLE_CUDASIM and "--gpu" not in sys.argv:
    sys.exit("_cudasim_kernels.py needs NUMBA_ENABLE_CUDASIM=1 set before numba is imported")

from kernels import REGISTRY
from kernels.attention import combine_grid, merge_grid, partial_grid
from kernels.matvec import grid_for as rows_grid

SEED = 1234
EPS32 = float(np.finfo(np.float32).eps)
EPS16 = float(np.finfo(np.float16).eps)

# Tiny model: D = n_head * head_dim, head_dim even; second config has odd n_head and hd not a
# power of two, and D not a multiple of the 4 rows per block.
CONFIGS = [dict(D=16, n_head=2, hd=8, F=24, V=11, max_seq=16),
           dict(D=18, n_head=3, hd=6, F=10, V=7, max_seq=12)]
if "--gpu" in sys.argv:  # the real model's dims (max_seq cut: L = 128 is two tiles of hd = 64)
    CONFIGS.append(dict(D=256, n_head=4, hd=64, F=512, V=100, max_seq=128))

_compiled: dict[tuple[str, str], object] = {}
_exercised: set[tuple[str, str]] = set()


class Mismatch(Exception):
    pass


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


def close(got, ref, atol, k, eps):
    """|got - ref| <= atol + k * eps * |ref| elementwise; equal infinities pass, NaN fails."""
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    same = got == ref  # covers matching +-inf
    with np.errstate(invalid="ignore"):
        ok = same | (np.abs(got - ref) <= atol + k * eps * np.abs(ref))
        err = np.abs(np.where(same, 0.0, got - ref))
    return bool(np.all(ok)), float(np.nanmax(err)) if got.size else 0.0


def run_case(name, grid, block, args, tol, cache_dtype=np.float32, label=""):
    """Launch kernel `name` and its twin on copies of args; compare every argument.

    tol: (atol, k) for float32 outputs; float16 outputs get k * eps(float16) with the same k
    (a 1-ulp rounding difference before the cast can flip the float16 rounding).
    """
    spec = REGISTRY[name]
    sig = sig_for(name, cache_dtype)
    kern = compiled(name, sig)
    a_k = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    a_t = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    kern[grid, block](*a_k)
    spec.twin(grid, block, *a_t)
    where = f"kernel {name} [{sig}] grid={grid} block={block} {label}"
    for i, (orig, got, ref) in enumerate(zip(args, a_k, a_t)):
        if not isinstance(orig, np.ndarray):
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
        ok, err = close(got, ref, atol, k, eps)
        if not ok:
            raise Mismatch(f"{where}: argument {i} max |err| {err:.3g} > atol {atol} + {k}*eps*|ref|"
                           f"\n kernel {got.ravel()[:8]}\n twin   {ref.ravel()[:8]}")
    return a_k


def f32(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def main() -> int:
    rng = np.random.default_rng(SEED)
    t_start = time.perf_counter()
    timings: dict[str, float] = {}

    def timed(name, fn):
        t = time.perf_counter()
        fn()
        timings[name] = timings.get(name, 0.0) + time.perf_counter() - t

    for ci, cfg in enumerate(CONFIGS):
        first = ci == 0
        D, H, hd, F, V, S = cfg["D"], cfg["n_head"], cfg["hd"], cfg["F"], cfg["V"], cfg["max_seq"]
        tag = f"D={D} H={H} hd={hd}"

        # ---- embed: a pure gather, must be exact
        def t_embed():
            wte = f32(rng, V, D)
            tokens = rng.integers(0, V, S).astype(np.int32)
            g = ((D + 127) // 128,)
            for p in (0, 5, S - 1):
                run_case("embed", g, (128,), [tokens, np.array([p], np.int32), wte,
                                              np.zeros(D, np.float32)], (0.0, 0), label=tag)
        timed("embed", t_embed)

        # ---- rmsnorm: sum of D squares in a different order than NumPy's pairwise sum, then
        # rsqrt and two products: relative error ~ (log2(D) + 4) eps; k = 16 covers D <= 4096.
        def t_rmsnorm():
            for n in (D, 300):  # 300 > 256 threads: exercises the strided partial sums
                for name in ("rmsnorm", "rmsnorm_late_wait"):  # same math; the bug is only timing
                    run_case(name, (1,), (256,), [f32(rng, n), f32(rng, n), np.zeros(n, np.float32),
                                                  np.float32(1e-5)], (1e-6, 16), label=f"n={n}")
        timed("rmsnorm", t_rmsnorm)

        # ---- matvec / matvec_residual: K-term dot products summed in another order (fma, lane
        # strides, tree); the error is relative to sum|W x| rather than |ref|. Weights are scaled
        # by 1/sqrt(K) (as in a trained model) so outputs are O(1) and that sum is ~sqrt(K):
        # atol 1e-5 (> 2 * sqrt(512) * eps) guards cancellation, k = 8 the rest.
        def t_matvec():
            for N, K in ((V, D), (D, F), (5, 40)):  # 40 > 32 lanes: two strides per lane
                g, b = rows_grid(N)
                run_case("matvec", g, b, [f32(rng, N, K, scale=K ** -0.5), f32(rng, K), np.zeros(N, np.float32)],
                         (1e-5, 8), label=f"N={N} K={K}")
                run_case("matvec_residual", g, b, [f32(rng, N, K, scale=K ** -0.5), f32(rng, K), f32(rng, N)],
                         (1e-5, 8), label=f"N={N} K={K}")
        timed("matvec", t_matvec)

        # ---- swiglu_up: two dot products (as matvec) then exp and a divide (~3 eps more).
        def t_swiglu():
            g, b = rows_grid(F)
            run_case("swiglu_up", g, b, [f32(rng, F, D, scale=D ** -0.5), f32(rng, F, D, scale=D ** -0.5), f32(rng, D),
                                         np.zeros(F, np.float32)], (1e-5, 16), label=tag)
        timed("swiglu_up", t_swiglu)

        # ---- rope_kv_append: two products and a sum per element, ~2 eps; k = 4. The float16
        # cache gets k * eps(f16): at most one f16 rounding flip from that f32 difference.
        def t_rope():
            ang = np.arange(S)[:, None] * (10000.0 ** (-np.arange(hd // 2) / (hd // 2)))[None, :]
            cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
            for dt in (np.float32, np.float16):
                for p in (0, 3, S - 1):
                    kc = f32(rng, S, D).astype(dt)
                    vc = f32(rng, S, D).astype(dt)
                    run_case("rope_kv_append", (H,), (hd,),
                             [f32(rng, 3 * D), np.array([p], np.int32), cos, sin,
                              np.zeros(D, np.float32), kc, vc], (1e-6, 4), dt, label=f"{tag} pos={p}")
                    # the bug variant writes row views the host chose: same values, row p
                    run_case("rope_kv_append_row", (H,), (hd,),
                             [f32(rng, 3 * D), np.array([p], np.int32), cos, sin,
                              np.zeros(D, np.float32), kc[p].copy(), vc[p].copy()], (1e-6, 4), dt,
                             label=f"{tag} pos={p}")
        timed("rope_kv_append", t_rope)

        # ---- attention: partial (scores: hd-term dots; exp; sums of <= L terms, online rescale)
        # then merge (<= splits terms, a divide). Values are O(1) and L <= 16, so relative
        # error stays below ~(hd + L + 8) eps; k = 64 with atol 1e-5 for cancelling o entries.
        def t_attention():
            scale = np.float32(1.0 / np.sqrt(hd))
            Wo = f32(rng, D, D, scale=D ** -0.5)
            if first:  # L = 1 and L = max_seq (two tiles of hd when splits = 1) for every splits
                cases = [(np.float32, p, s) for p in (0, S - 1) for s in (1, 2, 3, 5)]
                cases += [(np.float16, S - 1, 1), (np.float16, 6, 2)]
            else:
                cases = [(np.float32, S - 1, 1), (np.float32, 7, 3), (np.float16, S - 1, 2)]
            cases += [(np.float32, 1, 5)]  # splits > L: empty slices (pos 0 above has them too)
            for dt, p, splits in cases:
                label = f"{tag} pos={p} splits={splits} cache={np.dtype(dt).name}"
                kc = f32(rng, S, D).astype(dt)
                vc = f32(rng, S, D).astype(dt)
                q = f32(rng, D, scale=2.0)  # sharper softmax: later tiles raise the max
                pos = np.array([p], np.int32)
                g, b = partial_grid(H, splits, hd)
                part_o, part_ml = run_case(
                    "attn_partial", g, b,
                    [q, kc, vc, pos, np.zeros((H, splits, hd), np.float32),
                     np.zeros((H, splits, 2), np.float32), scale], (1e-5, 64), dt, label=label)[4:6]
                # the bug variant takes the context length by value: same results for L = p + 1
                run_case("attn_partial_len", g, b,
                         [q, kc, vc, np.int32(p + 1), np.zeros((H, splits, hd), np.float32),
                          np.zeros((H, splits, 2), np.float32), scale], (1e-5, 64), dt, label=label)
                # merge and combine run on the KERNEL's partials (the twin's differ in the last bits)
                g, b = merge_grid(H, hd)
                o = run_case("attn_merge", g, b, [part_o, part_ml, np.zeros(D, np.float32)],
                             (1e-6, 16), label=label)[2]
                x0 = f32(rng, D)
                g, b = combine_grid(D)
                x_one = run_case("attn_combine", g, b, [part_o, part_ml, Wo, x0.copy()],
                                 (1e-5, 16), label=label)[3]
                # contract: ONE kernel == merge kernel + matvec_residual kernel, bit for bit
                x_two = x0.copy()
                g, b = rows_grid(D)
                compiled("matvec_residual", REGISTRY["matvec_residual"].signatures[0])[g, b](Wo, o, x_two)
                if not np.array_equal(x_one.view(np.uint32), x_two.view(np.uint32)):
                    raise Mismatch(f"kernel attn_combine {label}: not bit-identical to attn_merge + "
                                   f"matvec_residual (max diff {np.max(np.abs(x_one - x_two)):.3g})")
        timed("attention", t_attention)

        # ---- argmax_next: integer output, exact. Ties, NaN, -inf, strides, prompt and end rules.
        def t_argmax():
            def logits_cases():
                yield f32(rng, V)
                tie = f32(rng, V); tie[[2, V - 1]] = 9.0; yield tie
                nan = f32(rng, V); nan[0] = np.nan; nan[3] = 50.0; yield nan
                yield np.full(V, -np.inf, np.float32)
                allnan = np.full(V, np.nan, np.float32); allnan[V - 2] = -np.inf; yield allnan
                yield np.full(V, np.nan, np.float32)
                big = f32(rng, 300); big[[299, 257, 200]] = 7.0; yield big  # 200 wins over thread 1's 257
            # (pos, n_prompt): generate; nxt == n_prompt (first generated); nxt < n_prompt (prompt,
            # untouched); nxt == max_seq - 1 (last slot); nxt == max_seq (past the end, untouched)
            rules = [(3, 2), (3, 4), (3, 5), (S - 2, 1), (S - 1, 1)]
            for j, lg in enumerate(logits_cases()):
                for p, n_prompt in (rules if j == 0 else rules[:1]):
                    tokens = rng.integers(0, V, S).astype(np.int32)
                    run_case("argmax_next", (1,), (256,),
                             [lg, np.array([p], np.int32), np.array([n_prompt], np.int32), tokens],
                             (0.0, 0), label=f"pos={p} n_prompt={n_prompt} logits={lg[:4]}")
        if first:  # independent of the model dims
            timed("argmax_next", t_argmax)

        # ---- advance
        timed("advance", lambda: run_case("advance", (1,), (1,), [np.array([7], np.int32)], (0.0, 0)))

        # ---- probes of the cost recorder: empty does nothing, spin's float32 loop matches its twin
        if first:
            run_case("empty", (1,), (32,), [np.array([3], np.int32)], (0.0, 0))
            run_case("spin", (1,), (1,), [np.int32(50), np.zeros(1, np.float32)], (0.0, 4))

    missing = sorted({(n, s) for n, spec in REGISTRY.items() for s in spec.signatures} - _exercised)
    if missing:
        raise Mismatch(f"registered kernels/signatures never exercised: {missing}")
    total = time.perf_counter() - t_start
    print(" ".join(f"{k}={v:.1f}s" for k, v in timings.items()))
    mode = "gpu" if "--gpu" in sys.argv else "cudasim"
    print(f"{mode}: {len(REGISTRY)} kernels, {len(_exercised)} signatures OK in {total:.1f}s")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Mismatch as e:
        print(f"CUDASIM MISMATCH: {e}", file=sys.stderr)
        sys.exit(1)
