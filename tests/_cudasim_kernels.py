"""Run every registered kernel under numba's CUDA simulator against its NumPy twin.

Started by tests/test_kernels.py in a subprocess with NUMBA_ENABLE_CUDASIM=1 (the flag must be set
before numba is imported). For each kernel in REGISTRY and each of its signatures it compiles
`cuda.jit(sig)(spec.py_func)`, launches it at tiny shapes and compares the written arguments with
the twin's (`atol + k * eps(dtype) * |ref|`), checks that arguments it does not declare as written
are untouched, checks matvec and rmsnorm bit for bit against lab/measure/precision.py's order
mirrors, attn_combine bitwise against attn_merge + matvec_residual, and merge_elem (the per-element
merge kernels/fused.py uses) bitwise against attn_merge, and the speculative-decoding kernels
(family "spec": kernels/draft.py, kernels/verify.py, kernels/verify_attention.py) against their twins and, bit for bit, each
column against its one-token kernel (matmat = matvec, rmsnorm_cols = rmsnorm, swiglu_cols =
swiglu_up, rope_kv_append_cols = rope_kv_append, verify_merge = attn_merge). Exits non-zero
naming the kernel on the first mismatch, or if a registered kernel/signature was never exercised.

  --shuffles    give the simulator lane-exact warp shuffles (`install_warp_shuffles`) BEFORE the
                kernels are imported, so kernels/reduce.py takes its GPU path (SHUFFLES): the GPU
                dataflow's logic runs here, without a GPU
  --dump PATH   write every kernel output in order to PATH (.npz); tests/test_kernels.py runs the
                tree and the shuffle paths and holds their dumps bit for bit against each other
  --gpu         the same checks on a real device, kernels compiled for real, plus the model's dims
  --family A,B  only these kernel families (FAMILIES), each on inputs of its own seed, so a
                family gives the same bits whichever others run; tests/test_kernels.py runs one
                family per test, so the families spread over pytest-xdist's workers
  --quick       attention on one case per code path (QUICK_ATTENTION) instead of every case, and
                the verify step's column kernels (family spec_cols) on one case each:
                for the shuffle path, whose emulated warps make attention the slowest thing
                here; each case's inputs come from its own seed, so its bits can be held
                against the full tree run's same case
"""
import os
import signal
import sys
import time
import zlib

import numba
import numpy as np
from numba import config, cuda

# `--gpu` runs the same checks on a real device (kernels compiled for real); otherwise the
# simulator is required, and it can only be switched on before numba is imported.
if not config.ENABLE_CUDASIM and "--gpu" not in sys.argv:
    sys.exit("_cudasim_kernels.py needs NUMBA_ENABLE_CUDASIM=1 set before numba is imported")


def cudasim_module():
    """kernels/cudasim.py (the simulator's patches), loaded by its path when the kernels package
    is not imported yet: importing it as part of the package would import kernels/reduce.py,
    which picks its reduction path at import, before --shuffles could install the shuffles."""
    if "kernels.cudasim" in sys.modules:
        return sys.modules["kernels.cudasim"]
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "kernels" / "cudasim.py"
    spec = importlib.util.spec_from_file_location("kernels.cudasim", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


_sim = cudasim_module()
install_warp_shuffles = _sim.install_warp_shuffles
lock_shared_allocations = _sim.lock_shared_allocations
pooled_blocks = _sim.pooled_blocks

if config.ENABLE_CUDASIM:
    lock_shared_allocations()
    pooled_blocks()

if "--shuffles" in sys.argv:
    if not config.ENABLE_CUDASIM:
        sys.exit("--shuffles is for the simulator (a GPU has its own)")
    install_warp_shuffles()

from kernels import REGISTRY  # noqa: E402
from kernels import reduce  # noqa: E402
from kernels.attention import (combine_grid, merge_elem, merge_grid, partial_grid)  # noqa: E402
from kernels.matvec import MATVEC_THREADS, row_dot2  # noqa: E402
from kernels.matvec import grid_for as rows_grid  # noqa: E402
from kernels import verify as VK  # noqa: E402
from kernels import verify_attention as VKA  # noqa: E402
from _oracle import causal64  # noqa: E402
from kernels.draft import ACCEPT_BLOCK, ACCEPT_GRID, DRAFT_BLOCK, DRAFT_GRID  # noqa: E402
from lab.measure.precision import rmsnorm_order, row_dot_order  # noqa: E402

if "--shuffles" in sys.argv:
    assert reduce.SHUFFLES, "kernels/reduce.py did not take the shuffle path"

SEED = 1234
EPS32 = float(np.finfo(np.float32).eps)
EPS16 = float(np.finfo(np.float16).eps)

# Tiny model: D = n_head * head_dim, head_dim even; second config has odd n_head and hd not a
# power of two, and D not a multiple of the 4 rows per block.
CONFIGS = [dict(D=16, n_head=2, hd=8, F=24, V=11, max_seq=16),
           dict(D=18, n_head=3, hd=6, F=10, V=7, max_seq=12)]
if "--gpu" in sys.argv:  # the real model's dims (max_seq cut: L = 128 is 4 passes of 32 timesteps)
    CONFIGS.append(dict(D=256, n_head=4, hd=64, F=512, V=100, max_seq=128))
# attn_partial only, at shapes the configs above miss: slices longer than one pass of ATTN_PASS
# = 32 timesteps (the online rescale across passes), head_dim 40 (lanes past hd in a lane's
# second dim) and 128 (every dim of every lane). (dtype, pos, splits) per case.
ATTN_EXTRA = [dict(n_head=2, hd=40, max_seq=72, cases=[(np.float32, 71, 1), (np.float16, 66, 2)]),
              dict(n_head=1, hd=128, max_seq=40, cases=[(np.float32, 39, 1)])]

# kernels another harness runs (their own twins and contracts): not this file's to exercise
OTHER_HARNESSES = {"kernels.fused": "tests/_cudasim_fused.py",
                   "kernels.fused_split": "tests/_cudasim_fused.py",
                   "kernels.persistent": "tests/_cudasim_persistent.py"}

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
    # speculative decoding: the kernels with no reduction of kernels/reduce.py (the shuffle path
    # changes nothing in them: tests/test_kernels.py runs them on the trees only) ...
    "spec": {"draft_lookup", "accept", "embed_cols", "rope_kv_append_cols", "verify_partial",
             "verify_merge"},
    # ... and the verify step's column kernels that reduce (warp_sum, block_sum, block_argmax)
    "spec_cols": {"rmsnorm_cols", "matmat", "matmat_residual", "swiglu_cols", "argmax_cols"},
}
# --quick: attention's code paths, one case each, in (dtype, pos, splits) per config: several
# slices, a float16 cache (and attn_partial_len, the last case of each dtype), empty slices
# (splits > L); merges over more slices than MERGE_GROUP; the extra shapes' first cases (more
# than one pass, lanes past head_dim, every dim of every lane), the second config's one case (an
# odd head count, D not a multiple of the rows per block: the merge and combine's row tail).
QUICK_ATTENTION = ([(np.float32, 15, 3), (np.float16, 6, 2), (np.float32, 1, 5)],
                   [(np.float32, 11, 1)])
# --quick leaves out matmat_residual and swiglu_cols (family spec_cols): their reductions are
# matmat's (the same warp_sum per column), and attn_partial_len: the same device function as attn_partial (partial_slice)
# with the context length by value, so its shuffle path is attn_partial's; the full tree run
# holds it bit for bit against attn_partial on every case
QUICK_SKIPS = {"attn_partial_len", "matmat_residual", "swiglu_cols"}


def family_rng(family: str, config: int) -> np.random.Generator:
    return np.random.default_rng([SEED, config, zlib.crc32(family.encode())])


def case_rng(label: str) -> np.random.Generator:
    """The inputs of one case from its label alone: the same bits in a quick and a full run."""
    return np.random.default_rng([SEED, zlib.crc32(label.encode())])


def chosen_families() -> list[str]:
    if "--family" not in sys.argv:
        return list(FAMILIES)
    names = sys.argv[sys.argv.index("--family") + 1].split(",")
    unknown = sorted(set(names) - set(FAMILIES))
    if unknown:
        sys.exit(f"unknown kernel family {unknown}; known: {', '.join(FAMILIES)}")
    return names

_compiled: dict[tuple[str, str], object] = {}
_exercised: set[tuple[str, str]] = set()
_dump: list[tuple[str, np.ndarray]] = []   # (label, kernel output) in launch order, for --dump


def save_dump() -> None:
    """With `--dump PATH` on the command line: every kernel output so far, in order, to PATH."""
    if "--dump" in sys.argv:
        path = sys.argv[sys.argv.index("--dump") + 1]
        np.savez(path, labels=np.array([k for k, _ in _dump]),
                 **{f"a{i}": v for i, (_, v) in enumerate(_dump)})


class Mismatch(Exception):
    pass


def mode_label(gpu: bool) -> str:
    """What a harness ran on, for its closing line: the GPU, or the simulator's reduction path."""
    return "gpu" if gpu else "cudasim " + ("shuffles" if reduce.SHUFFLES else "trees")


def run_harness(main) -> None:
    """A harness's entry point: exit with main()'s status, 1 with one line on a Mismatch.
    Ctrl-C: the simulator runs a thread per simulated CUDA thread, and they do not unwind
    promptly on KeyboardInterrupt; nothing here needs cleaning up, so stop at once, as a shell
    would (exit 130)."""
    signal.signal(signal.SIGINT, lambda *_: os._exit(130))
    try:
        sys.exit(main())
    except Mismatch as e:
        print(f"CUDASIM MISMATCH: {e}", file=sys.stderr)
        sys.exit(1)


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
    _dump.extend((f"{where} arg {i}", a_k[i].copy()) for i in spec.writes)
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


FUSED = not config.ENABLE_CUDASIM   # a GPU's fma rounds once; the simulator's is a * b + c


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


def check_merges(part_o, part_ml, Wo, x0, label):
    """attn_merge and attn_combine on these partials against their twins; then the contracts:
    attn_combine == attn_merge + matvec_residual bit for bit, merge_elem == attn_merge."""
    H, _, hd = part_o.shape
    D = H * hd
    g, b = merge_grid(H, hd)
    o = run_case("attn_merge", g, b, [part_o, part_ml, np.zeros(D, np.float32)],
                 (1e-6, 16), label=label)[2]
    g, b = combine_grid(D)
    x_one = run_case("attn_combine", g, b, [part_o, part_ml, Wo, x0.copy()],
                     (1e-5, 16), label=label)[3]
    # contract: ONE kernel == merge kernel + matvec_residual kernel, bit for bit
    x_two = x0.copy()
    g, b = rows_grid(D)
    compiled("matvec_residual", REGISTRY["matvec_residual"].signatures[0])[g, b](Wo, o, x_two)
    same_bits(x_one, x_two, f"kernel attn_combine {label}: attn_merge + matvec_residual")
    o_elem = np.zeros(D, np.float32)
    _merge_elem_probe[(H,), (hd,)](part_o, part_ml, o_elem)
    same_bits(o_elem, o, f"device function merge_elem {label}: attn_merge")


def check_partials(H, hd, S, cases, tag, Wo=None):
    """attn_partial for each (dtype, pos, splits) against the twin, and attn_partial_len (the
    same device function, slow to simulate) for the last case of each cache dtype, bit for bit
    against attn_partial; with Wo, merge and combine the kernel's partials (check_merges)."""
    D = H * hd
    scale = np.float32(1.0 / np.sqrt(hd))
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
             np.zeros((H, splits, 2), np.float32), scale], (1e-5, 64), dt, label=label)[4:6]
        if by_value[np.dtype(dt)] == i and "--quick" not in sys.argv:  # the bug variant: L by value
            part_o2, part_ml2 = run_case(
                "attn_partial_len", g, b,
                [q, kc, vc, np.int32(p + 1), np.zeros((H, splits, hd), np.float32),
                 np.zeros((H, splits, 2), np.float32), scale], (1e-5, 64), dt, label=label)[4:6]
            same_bits(part_o2, part_o, f"kernel attn_partial_len {label}: attn_partial's part_o")
            same_bits(part_ml2, part_ml, f"kernel attn_partial_len {label}: attn_partial's part_ml")
        if Wo is not None:  # merge and combine run on the KERNEL's partials (the twin's differ in the last bits)
            check_merges(part_o, part_ml, Wo, f32(rng, D), label)


# ---- the speculative-decoding kernels (family "spec": kernels/draft.py, kernels/verify.py, kernels/verify_attention.py)

SPEC_T = 3   # verify columns at the tiny shapes: T = k + 1 with k = 2 drafted tokens


def _i32(*v):
    return np.array(v, np.int32)


def check_drafts(S):
    """draft_lookup on hand-made texts (integer outputs: exact against the twin) and accept on
    hand-made verdicts. The texts: a periodic continuation, the latest of several matches, a
    3-gram beating a later 1-gram, the fallback, p = 0, prompt-forced columns, the limit, and a
    match past the first stride of the 128 threads."""
    T = 6
    def run_draft(tokens, p, n_prompt, limit, label):
        buf = np.full(max(S, len(tokens)), 3, np.int32)
        buf[:len(tokens)] = tokens
        run_case("draft_lookup", DRAFT_GRID, DRAFT_BLOCK,
                 [buf, _i32(p), _i32(n_prompt), _i32(limit), np.full(T, -1, np.int32)], (0.0, 0),
                 label=f"draft {label} p={p} n_prompt={n_prompt} limit={limit}")
    run_draft([5, 1, 2, 1, 2], 4, 1, S - 1, "periodic")                 # (1, 2) at j = 2, period 2
    run_draft([5, 1, 2, 9, 5, 1, 2, 7, 5, 1, 2], 10, 1, S - 1, "latest")  # ends 2 and 6: 6 wins
    run_draft([1, 2, 3, 8, 4, 3, 6, 1, 2, 3], 9, 1, S - 1, "longest")   # 3-gram at 2, '3' at 5
    run_draft(list(range(20, 32)), 11, 1, S - 1, "fallback")
    run_draft([4, 4], 0, 1, S - 1, "p=0")
    run_draft([1, 2, 3, 1, 2, 3, 50, 51], 5, 8, S - 1, "prompt")       # 6, 7 forced; loop reads them
    run_draft([1, 2, 3, 1, 2, 3, 50, 51], 5, 8, 7, "limit")             # 8.. past limit: tokens[p]
    big = np.arange(300, dtype=np.int32) + 10                           # distinct: no match but ...
    big[198:201] = big[287:290]                                         # ... this 3-gram (j = 200)
    big[250] = big[289]                                                 # and a later 1-gram
    run_draft(big, 289, 1, 299, "stride")
    rng = case_rng("draft random")
    for p in (7, S - 2):
        run_draft(rng.integers(0, 3, S).astype(np.int32), p, 1, S - 1, "random")

    def run_accept(cols, pred, p, n_prompt, limit, label):
        tokens = np.arange(S, dtype=np.int32) + 100
        run_case("accept", ACCEPT_GRID, ACCEPT_BLOCK,
                 [_i32(*cols), _i32(*pred), _i32(p), _i32(n_prompt), _i32(limit), tokens, _i32(2, 5)],
                 (0.0, 0), label=f"accept {label} p={p} n_prompt={n_prompt} limit={limit}")
    run_accept([103, 7, 8, 9], [7, 8, 9, 4], 3, 2, S - 1, "all")
    run_accept([103, 7, 8, 9], [7, 5, 9, 4], 3, 2, S - 1, "mismatch")
    run_accept([103, 7, 8, 9], [6, 8, 9, 4], 3, 2, S - 1, "bonus only")
    run_accept([102, 103, 104, 9], [0, 0, 9, 4], 2, 5, S - 1, "prompt")
    run_accept([100, 101, 102, 103], [5, 5, 5, 5], 0, 10, S - 1, "all prompt")
    run_accept([104, 7, 8, 9], [7, 8, 9, 4], 4, 2, 6, "limit")
    run_accept([106, 7, 8, 9], [7, 8, 9, 4], 6, 2, 6, "at limit")       # a no-op


def check_verify_attention(H, hd, S, cases, tag):
    """verify_partial then verify_merge for each (dtype, pos, splits) against the twins, the
    merged output against float64 causal attention, and each column's merge bit for bit against
    attn_merge on that column's partials."""
    D, T = H * hd, SPEC_T
    scale = np.float32(1.0 / np.sqrt(hd))
    for dt, p, splits in cases:
        label = f"{tag} verify pos={p} splits={splits} cache={np.dtype(dt).name}"
        r = case_rng(label)
        q, kc, vc = f32(r, T, D, scale=2.0), f32(r, S, D).astype(dt), f32(r, S, D).astype(dt)
        g, b = VKA.verify_grid(H, splits, hd)
        part_o, part_ml = run_case(
            "verify_partial", g, b,
            [q, kc, vc, _i32(p), np.full((H, T, splits + 1, hd), np.nan, np.float32),
             np.full((H, T, splits + 1, 2), np.nan, np.float32), scale], (1e-5, 64), dt, label=label)[4:6]
        g, b = VKA.merge_cols_grid(H, hd, T)
        o = run_case("verify_merge", g, b, [part_o, part_ml, np.full((T, D), np.nan, np.float32)],
                     (1e-6, 16), label=label)[2]
        ok, err = close(o, causal64(q, kc, vc, p, H, hd, scale), 1e-5, 64, EPS32)
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
    T, quick = SPEC_T, "--quick" in sys.argv
    g, b = VK.cols_grid(T)
    for n in (D,) if quick else (D, 300):
        label = f"rmsnorm_cols {tag} n={n}"
        rng = case_rng(label)
        X, w = f32(rng, T, n), f32(rng, n)
        out = run_case("rmsnorm_cols", g, b, [X, w, np.zeros((T, n), np.float32), np.float32(1e-5)],
                       (1e-6, 16), label=label)[2]
        for t in range(T):
            same_bits(out[t], rmsnorm_order(X[t], w, np.float32(1e-5), FUSED),
                      f"kernel rmsnorm_cols n={n} row {t}: rmsnorm_order")
        if not quick and n == D:   # the mirror above holds every row; the kernel itself once
            one = np.zeros(n, np.float32)
            compiled("rmsnorm", REGISTRY["rmsnorm"].signatures[0])[(1,), (256,)](X[1], w, one, np.float32(1e-5))
            same_bits(out[1], one, f"kernel rmsnorm_cols n={n} row 1: rmsnorm")

    for N, K in ((V, D),) if quick else ((V, D), (5, 40)):   # V rows: a tail of the 4 rows per
        g, b = VK.matmat_grid(N)                             # block; 40 > 32 lanes
        label = f"matmat {tag} N={N} K={K}"
        rng = case_rng(label)
        W, Xc = f32(rng, N, K, scale=K ** -0.5), f32(rng, T, K)
        out = run_case("matmat", g, b, [W, Xc, np.full((T, N), np.nan, np.float32)], (1e-5, 8),
                       label=label)[2]
        for t in range(T):
            same_bits(out[t], row_dot_order(W, Xc[t], FUSED), f"kernel matmat N={N} K={K} col {t}: row_dot_order")
        if not quick and N == V:   # the mirror above holds every column; the kernel itself once
            one = np.zeros(N, np.float32)
            compiled("matvec", REGISTRY["matvec"].signatures[0])[g, b](W, Xc[T - 1], one)
            same_bits(out[T - 1], one, f"kernel matmat N={N} K={K} col {T - 1}: matvec")
        if quick:   # matmat_residual and swiglu_cols reduce as matmat does (matmat_rows,
            continue  # lane_dots2: the same warp_sum per column): their shuffle path is matmat's
        res = f32(rng, T, N)
        out = run_case("matmat_residual", g, b, [W, Xc, res], (1e-5, 8),
                       label=f"matmat_residual {tag} N={N} K={K}")[2]
        for t in range(T):
            same_bits(out[t], res[t] + row_dot_order(W, Xc[t], FUSED),
                      f"kernel matmat_residual N={N} K={K} col {t}: row_dot_order")

    if not quick:
        g, b = VK.matmat_grid(F)
        label = f"swiglu_cols {tag}"
        rng = case_rng(label)
        Wg, Wu, Xc = f32(rng, F, D, scale=D ** -0.5), f32(rng, F, D, scale=D ** -0.5), f32(rng, T, D)
        act = run_case("swiglu_cols", g, b, [Wg, Wu, Xc, np.full((T, F), np.nan, np.float32)],
                       (1e-5, 16), label=label)[3]
        one = np.zeros(F, np.float32)     # column 0 (no row mirror: the kernel itself)
        compiled("swiglu_up", REGISTRY["swiglu_up"].signatures[0])[g, b](Wg, Wu, Xc[0], one)
        same_bits(act[0], one, f"kernel swiglu_cols {tag} col 0: swiglu_up")

    g, b = VK.cols_grid(T)
    label = f"argmax_cols {tag} ties, NaN"
    tie = f32(case_rng(label), V); tie[[2, V - 1]] = 9.0
    nan = np.full(V, np.nan, np.float32); nan[V - 2] = -np.inf
    run_case("argmax_cols", g, b, [np.stack([tie, nan, np.full(V, np.nan, np.float32)]),
                                   np.full(T, -1, np.int32)], (0.0, 0), label=label)
    if not quick:
        label = f"argmax_cols {tag} V=300"
        big = f32(case_rng(label), T, 300); big[:, [299, 257, 200]] = 7.0   # 200 beats thread 1's 257
        run_case("argmax_cols", g, b, [big, np.full(T, -1, np.int32)], (0.0, 0), label=label)


def check_verify(rng, cfg, tag):
    """The verify step's other kernels against their twins, and their contracts:
    rope_kv_append_cols' column rope_kv_append's at p + t, verify_merge's column attn_merge's;
    verify_partial + verify_merge against float64 causal attention."""
    D, H, hd, V, S = cfg["D"], cfg["n_head"], cfg["hd"], cfg["V"], cfg["max_seq"]
    T = SPEC_T
    g, b = VK.embed_cols_grid(D, T)
    run_case("embed_cols", g, b, [_i32(3, 0, V - 1), f32(rng, V, D), np.full((T, D), np.nan, np.float32)],
             (0.0, 0), label=tag)

    ang = np.arange(S)[:, None] * (10000.0 ** (-np.arange(hd // 2) / (hd // 2)))[None, :]
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    g, b = VK.rope_cols_grid(H, hd, T)
    for dt in (np.float32, np.float16):
        for p in (0, 5, S - 2):      # S - 2: column 2 is past max_seq (no row, q = 0)
            qkv, kc, vc = f32(rng, T, 3 * D), f32(rng, S, D).astype(dt), f32(rng, S, D).astype(dt)
            out = run_case("rope_kv_append_cols", g, b,
                           [qkv, _i32(p), cos, sin, np.full((T, D), np.nan, np.float32), kc, vc],
                           (1e-6, 4), dt, label=f"{tag} pos={p}")
            for t in range(T):
                if p + t >= S:
                    continue
                q1, kc1, vc1 = np.zeros(D, np.float32), kc.copy(), vc.copy()
                compiled("rope_kv_append", sig_for("rope_kv_append", dt))[(H,), (hd,)](
                    qkv[t], _i32(p + t), cos, sin, q1, kc1, vc1)
                same_bits(out[4][t], q1, f"kernel rope_kv_append_cols pos={p} col {t}: q")
                if not (np.array_equal(out[5][p + t], kc1[p + t]) and np.array_equal(out[6][p + t], vc1[p + t])):
                    raise Mismatch(f"kernel rope_kv_append_cols pos={p} col {t}: cache rows differ from rope_kv_append's")

    # verify attention: p = 0 (every cache slice empty), p on a slice boundary (6 = 2 x 3) and
    # inside one (7), more slices than rows (p = 3, S = 4), a float16 cache, a column past max_seq
    check_verify_attention(H, hd, S, [(np.float32, 0, 2), (np.float32, 6, 2), (np.float32, 7, 2),
                                      (np.float16, 9, 2), (np.float32, 3, 4), (np.float16, S - 2, 1)], tag)


def main() -> int:
    # Python's default GIL time slice (5 ms): with pooled_blocks() no thread spins, and shorter
    # slices only add hand-offs (the attention family's tree run took 64 s at 0.2 ms, 34 at 5 ms;
    # 0.2 ms was right for numba's polling block manager, about 1.5x faster than 5 ms there)
    t_start = time.perf_counter()
    timings: dict[str, float] = {}

    families = chosen_families()
    unassigned = {n for n, spec in REGISTRY.items() if spec.py_func.__module__ not in OTHER_HARNESSES
                  } - set().union(*FAMILIES.values())
    if unassigned:
        raise Mismatch(f"registered kernels in no family of FAMILIES: {sorted(unassigned)}")

    def timed(name, fn):
        if name not in families:
            return
        t = time.perf_counter()
        fn(family_rng(name, ci))
        timings[name] = timings.get(name, 0.0) + time.perf_counter() - t

    for ci, cfg in enumerate(CONFIGS):
        first = ci == 0
        D, H, hd, F, V, S = cfg["D"], cfg["n_head"], cfg["hd"], cfg["F"], cfg["V"], cfg["max_seq"]
        tag = f"D={D} H={H} hd={hd}"

        # ---- embed: a pure gather, must be exact
        def t_embed(rng):
            wte = f32(rng, V, D)
            tokens = rng.integers(0, V, S).astype(np.int32)
            g = ((D + 127) // 128,)
            for p in (0, 5, S - 1):
                run_case("embed", g, (128,), [tokens, np.array([p], np.int32), wte,
                                              np.zeros(D, np.float32)], (0.0, 0), label=tag)
        timed("embed", t_embed)

        # ---- rmsnorm: sum of D squares in a different order than NumPy's pairwise sum, then
        # rsqrt and two products: relative error ~ (log2(D) + 4) eps; k = 16 covers D <= 4096.
        # Its own order is lab/measure/precision.py's rmsnorm_order, bit for bit.
        def t_rmsnorm(rng):
            for n in (D, 300):  # 300 > 256 threads: exercises the strided partial sums
                for name in ("rmsnorm", "rmsnorm_late_wait"):  # same math; the bug is only timing
                    x, w = f32(rng, n), f32(rng, n)
                    out = run_case(name, (1,), (256,), [x, w, np.zeros(n, np.float32), np.float32(1e-5)],
                                   (1e-6, 16), label=f"n={n}")[2]
                    same_bits(out, rmsnorm_order(x, w, np.float32(1e-5), FUSED),
                              f"kernel {name} n={n}: lab/measure/precision.py's rmsnorm_order")
        timed("rmsnorm", t_rmsnorm)

        # ---- matvec / matvec_residual: K-term dot products summed in another order (fma, lane
        # strides, tree); the error is relative to sum|W x| rather than |ref|. Weights are scaled
        # by 1/sqrt(K) (as in a trained model) so outputs are O(1) and that sum is ~sqrt(K):
        # atol 1e-5 (> 2 * sqrt(512) * eps) guards cancellation, k = 8 the rest. Their own order
        # is lab/measure/precision.py's row_dot_order, bit for bit.
        def t_matvec(rng):
            # 40 > 32 lanes: two k per lane; 600 > ROW_UNROLL * 32 = 512: two load groups
            for N, K in ((V, D), (D, F), (5, 40), (3, 600)):
                g, b = rows_grid(N)
                W, x = f32(rng, N, K, scale=K ** -0.5), f32(rng, K)
                out = run_case("matvec", g, b, [W, x, np.zeros(N, np.float32)], (1e-5, 8),
                               label=f"N={N} K={K}")[2]
                same_bits(out, row_dot_order(W, x, FUSED), f"kernel matvec N={N} K={K}: row_dot_order")
                W, x, res = f32(rng, N, K, scale=K ** -0.5), f32(rng, K), f32(rng, N)
                out = run_case("matvec_residual", g, b, [W, x, res], (1e-5, 8), label=f"N={N} K={K}")[2]
                same_bits(out, res + row_dot_order(W, x, FUSED),
                          f"kernel matvec_residual N={N} K={K}: row_dot_order")
        timed("matvec", t_matvec)

        # ---- swiglu_up: two dot products (as matvec) then exp and a divide (~3 eps more). Its
        # row_dot2 must give exactly what matvec's row_dot gives for each matrix.
        def t_swiglu(rng):
            g, b = rows_grid(F)
            Wg, Wu, h = f32(rng, F, D, scale=D ** -0.5), f32(rng, F, D, scale=D ** -0.5), f32(rng, D)
            run_case("swiglu_up", g, b, [Wg, Wu, h, np.zeros(F, np.float32)], (1e-5, 16), label=tag)
            ga, ub = np.zeros(F, np.float32), np.zeros(F, np.float32)
            _row_dot2_probe[g, b](Wg, Wu, h, ga, ub)
            same_bits(ga, row_dot_order(Wg, h, FUSED), f"device function row_dot2 {tag}: gate rows")
            same_bits(ub, row_dot_order(Wu, h, FUSED), f"device function row_dot2 {tag}: up rows")
        timed("swiglu_up", t_swiglu)

        # ---- rope_kv_append: two products and a sum per element, ~2 eps; k = 4. The float16
        # cache gets k * eps(f16): at most one f16 rounding flip from that f32 difference.
        def t_rope(rng):
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
        # then merge (<= splits terms, a divide). Values are O(1) and L <= 128, so relative
        # error stays below ~(hd + L + 8) eps; k = 64 with atol 1e-5 for cancelling o entries.
        def t_attention(rng):
            Wo = f32(rng, D, D, scale=D ** -0.5)
            if "--quick" in sys.argv:
                cases = QUICK_ATTENTION[ci]
            elif first:  # L = 1 and L = max_seq for every splits
                cases = [(np.float32, p, s) for p in (0, S - 1) for s in (1, 2, 3, 5)]
                cases += [(np.float16, S - 1, 1), (np.float16, 6, 2)]
            else:
                cases = [(np.float32, S - 1, 1), (np.float32, 7, 3), (np.float16, S - 1, 2)]
            if "--quick" not in sys.argv:
                cases += [(np.float32, 1, 5)]  # splits > L: empty slices (pos 0 above has them too)
            check_partials(H, hd, S, cases, tag, Wo)
            if first:
                # merge and combine over more slices than MERGE_GROUP (two load groups), some
                # empty, on made-up partials (attn_partial at 40 splits is slow to simulate)
                splits = 40
                rng = case_rng(f"{tag} merges splits={splits}")
                part_o = f32(rng, H, splits, hd)
                part_ml = np.stack([f32(rng, H, splits), np.abs(f32(rng, H, splits)) + 0.5], axis=-1)
                part_ml[:, 30:] = (-np.inf, 0.0)
                part_o[:, 30:] = 0.0
                check_merges(part_o, part_ml, Wo, f32(rng, D), f"{tag} splits={splits} (made up)")
                for extra in ATTN_EXTRA:
                    h2, d2, s2 = extra["n_head"], extra["hd"], extra["max_seq"]
                    check_partials(h2, d2, s2, extra["cases"][:1] if "--quick" in sys.argv
                                   else extra["cases"], f"D={h2 * d2} H={h2} hd={d2}")
        timed("attention", t_attention)

        # ---- argmax_next: integer output, exact. Ties, NaN, -inf, strides, prompt and end rules.
        def t_argmax(rng):
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
            # the deliberate bug's sampler (LAB_BUG_FLOAT_IDS): the same pick, stored as float32
            lg = f32(rng, V)
            run_case("argmax_next_float", (1,), (256,),
                     [lg, np.array([3], np.int32), np.array([2], np.int32), np.zeros(S, np.float32)],
                     (0.0, 0), label="float ids")
        if first:  # independent of the model dims
            timed("argmax_next", t_argmax)

        # ---- advance
        # ---- advance, and the probes of the cost recorder: empty does nothing, spin's float32
        # loop matches its twin, pos_set writes the position it is given, relay adds one
        def t_advance(rng):
            run_case("advance", (1,), (1,), [np.array([7], np.int32)], (0.0, 0))
            if first:
                run_case("empty", (1,), (32,), [np.array([3], np.int32)], (0.0, 0))
                run_case("spin", (1,), (1,), [np.int32(50), np.zeros(1, np.float32)], (0.0, 4))
                run_case("pos_set", (1,), (32,), [np.array([7], np.int32), np.int32(300)], (0.0, 0))
                run_case("relay", (1,), (256,), [f32(rng, 256), np.zeros(256, np.float32)], (0.0, 0))
        timed("advance", t_advance)

        # ---- the speculative-decoding kernels: the drafter and the acceptance (integers, exact)
        # and the verify step's column kernels, each against its twin and its one-token kernel
        def t_spec(rng):
            check_drafts(S)
            check_verify(rng, cfg, tag)
            if first:  # slices of more than one tile of rows (the rescale across tiles), head_dim
                # 96 (tiles of 21 rows; T * hd > 256: three o slots per thread)
                check_verify_attention(1, 96, 40, [(np.float32, 37, 1)], "D=96 H=1 hd=96")
        if first or "--gpu" in sys.argv:  # the simulator runs a thread per CUDA thread: tiny dims
            timed("spec", t_spec)
            timed("spec_cols", lambda rng: check_verify_cols(cfg, tag))

    mine = {n: spec for n, spec in REGISTRY.items() if n in set().union(*(FAMILIES[f] for f in families))}
    skipped = QUICK_SKIPS if "--quick" in sys.argv else set()
    missing = sorted({(n, s) for n, spec in mine.items() if n not in skipped
                      for s in spec.signatures} - _exercised)
    if missing:
        raise Mismatch(f"registered kernels/signatures never exercised: {missing}")
    save_dump()
    total = time.perf_counter() - t_start
    print(" ".join(f"{k}={v:.1f}s" for k, v in timings.items()))
    print(f"{mode_label('--gpu' in sys.argv)}: {len(mine)} kernels, {len(_exercised)} signatures OK in {total:.1f}s")
    return 0


if __name__ == "__main__":
    run_harness(main)
