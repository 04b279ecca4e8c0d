"""Run the persistent step kernel (kernels/persistent.py) under numba's CUDA simulator.

Started by tests/test_persistent.py in a subprocess with NUMBA_ENABLE_CUDASIM=1 (set before
numba is imported). numba's simulator runs a cooperative grid of ONE block only (its grid sync
is the block's barrier), so the kernel runs at grid (1,) and its virtual-block loops do all the
work. At tiny shapes (1 layer, 2 with --gpu; D 8, 2 heads of 4, F 8, V 11, a block of 256 threads: pick_next's
floor; the simulator takes about 20 ms per barrier of 256 threads, so every case costs seconds)
it checks:
  - against the twin (the fused step's twins, composed) within tolerance, the token by the
    argmax policy on the kernel's own logits, pos advanced, integers exactly, the arguments it
    does not write untouched, the counter slots back to 0 (the next launch, a graph's next
    replay, starts clean);
  - (`--fused`) bit for bit against the fused step's kernels run one after another under the
    same simulator (embed, then per layer norm_qkv_rope, attn_fused at the same block size,
    norm_swiglu, matvec_residual, then norm_lm_head_argmax): tokens, pos, logits, x and the KV
    cache -- the contract that makes LAB_PERSISTENT=1 write LAB_FUSION=1's bits.
Cases: CASES[0] a float32 cache, 2 splits, a generated slot; CASES[1] (`--all`) a float16
cache, 4 slices of which one is empty, a prompt slot (no token written). `--dump PATH` writes
CASES[0]'s outputs (to hold a `--shuffles` run's against a trees run's by hand; the suite runs
the trees path only, and the GPU, which takes the shuffle path, is checked against the fused
kernels bit for bit by `--gpu`). Exits non-zero naming the first mismatch.

  --shuffles  lane-exact warp shuffles first (kernels/reduce.py's GPU path)
  --gpu       the same checks compiled for a real device, at grids of 1, 2 and 7 blocks, and a
              second launch on the same inputs bit-identical
"""
import sys
import time

import numpy as np
from numba import config, cuda

GPU = "--gpu" in sys.argv
if not config.ENABLE_CUDASIM and not GPU:
    sys.exit("_cudasim_persistent.py needs NUMBA_ENABLE_CUDASIM=1 set before numba is imported")
if "--shuffles" in sys.argv:   # before kernels/ is imported: reduce.py picks its path at import
    from _cudasim_kernels import cudasim_module      # kernels/cudasim.py, by its path
    cudasim_module().install(shuffles=True)           # (idempotent: the harness's import did it)
from _cudasim_kernels import (Mismatch, close, compiled, f32, mode_label,  # noqa: E402
                              run_harness, sig_for)

from kernels import REGISTRY, embed, fused, matvec, persistent, reduce  # noqa: E402

SEED = 2468
# one layer under the simulator (every phase and barrier of a layer, the LM head; the layer
# loop's second pass, which reads x instead of the embedding row, costs another ~10 s of
# simulated threads there), two on a device (--gpu)
TINY = dict(L=2 if GPU else 1, D=8, H=2, hd=4, F=8, V=11, S=16, T=256)
# (KV dtype, position, splits, n_prompt): a generated slot; a prompt slot (no token written),
# an empty slice (L = 10 over 4 slices of 3) and a float16 cache
CASES = [(np.float32, 5, 2, 3), (np.float16, 9, 4, 12)]
EPS = np.float32(1e-5)


def model_args(rng, cfg, dt, p, splits, n_prompt):
    L, D, H, hd, F, V, S = (cfg[k] for k in ("L", "D", "H", "hd", "F", "V", "S"))
    ang = np.arange(S)[:, None] * (10000.0 ** (-np.arange(hd // 2) / (hd // 2)))[None, :]
    tokens = rng.integers(0, V, S).astype(np.int32)
    return [tokens, np.array([p], np.int32), np.array([n_prompt], np.int32),
            f32(rng, V, D), 1.0 + 0.1 * f32(rng, L, 2, D),
            f32(rng, L, 3 * D, D, scale=D ** -0.5), f32(rng, L, D, D, scale=D ** -0.5),
            f32(rng, L, 2, F, D, scale=D ** -0.5), f32(rng, L, D, F, scale=F ** -0.5),
            1.0 + 0.1 * f32(rng, D), f32(rng, V, D, scale=D ** -0.5), EPS,
            np.float32(1.0 / np.sqrt(hd)), np.cos(ang).astype(np.float32),
            np.sin(ang).astype(np.float32), f32(rng, L, S, D).astype(dt),
            f32(rng, L, S, D).astype(dt), np.zeros(D, np.float32), np.zeros(D, np.float32),
            np.zeros((H, splits, hd), np.float32), np.zeros((H, splits, 2), np.float32),
            np.zeros((H, D), np.float32), np.zeros(F, np.float32), np.zeros(V, np.float32),
            np.zeros(persistent.counter_slots(H), np.int32)]


def fused_sequence(a, cfg, dt, T):
    """The fused step's kernels one after another on copies of the persistent kernel's inputs:
    (tokens, pos, logits, x, k_cache, v_cache) after the step."""
    (tokens, pos, n_prompt, wte, norms, wqkv, wo, w_gu, w_down, final_norm, lm_head, eps, scale,
     cos, sin, k_cache, v_cache, x, q, part_o, part_ml, head_out, act, logits, _) = \
        [v.copy() if isinstance(v, np.ndarray) else v for v in a]
    D, H, hd, F, V = (cfg[k] for k in ("D", "H", "hd", "F", "V"))
    splits = part_o.shape[1]
    counter = np.zeros(fused.counter_slots(H), np.int32)
    compiled("embed", sig_for("embed"))[embed.grid_for(D)](tokens, pos, wte, x)
    for layer in range(wqkv.shape[0]):
        kc, vc = k_cache[layer], v_cache[layer]
        compiled("norm_qkv_rope", sig_for("norm_qkv_rope", dt))[fused.qkv_grid(D, 3)](
            x, norms[layer, 0].copy(), eps, wqkv[layer], np.int32(0), pos, cos, sin, q, kc, vc)
        compiled("attn_fused", sig_for("attn_fused", dt))[fused.attention_grid(H, splits, hd, T)](
            q, kc, vc, pos, part_o, part_ml, scale, wo[layer], x, head_out, counter)
        compiled("norm_swiglu", sig_for("norm_swiglu"))[fused.rows_grid(F)](
            x, norms[layer, 1].copy(), eps, w_gu[layer, 0].copy(), w_gu[layer, 1].copy(), act)
        compiled("matvec_residual", sig_for("matvec_residual"))[matvec.grid_for(D)](
            w_down[layer], act, x)
    compiled("norm_lm_head_argmax", sig_for("norm_lm_head_argmax"))[fused.lm_head_grid(V)](
        x, final_norm, eps, lm_head, logits, pos, n_prompt, tokens, np.zeros(1, np.int32))
    return tokens, pos, logits, x, k_cache, v_cache


def check_case(rng, cfg, dt, p, splits, n_prompt, grid, fused_bits):
    T = cfg["T"]
    label = (f"pos={p} splits={splits} n_prompt={n_prompt} cache={np.dtype(dt).name} "
             f"grid={grid} block={T}")
    args = model_args(rng, cfg, dt, p, splits, n_prompt)
    spec = REGISTRY["step_persistent"]
    kern = compiled("step_persistent", sig_for("step_persistent", dt))
    got = [v.copy() if isinstance(v, np.ndarray) else v for v in args]
    kern[grid, (T,)](*got)
    want = [v.copy() if isinstance(v, np.ndarray) else v for v in args]
    spec.twin(grid, (T,), *want)
    # against the twin: float32 within the fused harness's widest tolerance (attention: atol
    # 1e-5, k = 64, per kernel; a step chains 2 layers: atol 4x that), integers exactly; the
    # argument a kernel does not write untouched
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
            ok, err = close(a, b, 4e-5, 64, np.finfo(a.dtype).eps)
            if not ok:
                raise Mismatch(f"step_persistent {label}: {name} max |err| {err:.3g} vs the twin")
    if np.any(got[24] != 0):
        raise Mismatch(f"step_persistent {label}: counter slots {got[24]} after the launch, not 0")
    # the token: the argmax policy on the kernel's own logits (a near tie may differ from the
    # twin's pick on its logits), only at a generated slot
    tok = args[0].copy()
    if p + 1 >= n_prompt:
        from kernels.sample import argmax_twin_index
        tok[p + 1] = argmax_twin_index(got[23])
    if not np.array_equal(got[0], tok) or got[1][0] != p + 1:
        raise Mismatch(f"step_persistent {label}: tokens {got[0]} (want {tok}), pos {got[1]}")
    if fused_bits:   # bit for bit the fused step's kernels
        tokens, pos, logits, x, kc, vc = fused_sequence(args, cfg, dt, T)
        for name, a, b in (("tokens", got[0], tokens), ("pos", got[1], pos),
                           ("logits", got[23], logits), ("x", got[17], x), ("k_cache", got[15], kc),
                           ("v_cache", got[16], vc)):
            if a.tobytes() != b.tobytes():
                raise Mismatch(f"step_persistent {label}: {name} is not the fused step's bits")
    if GPU:   # a second launch on the same inputs: the same bits (the counters started clean)
        again = [v.copy() if isinstance(v, np.ndarray) else v for v in args]
        kern[grid, (T,)](*again)
        for i in spec.writes:
            if again[i].tobytes() != got[i].tobytes():
                raise Mismatch(f"step_persistent {label}: second launch, {spec.arg_names[i]}")
    return got


def main() -> int:
    if "--shuffles" in sys.argv and not reduce.SHUFFLES:
        raise Mismatch("--shuffles: kernels/reduce.py did not take the shuffle path")
    t0 = time.perf_counter()
    dump = []
    grids = [(1,)] + ([(2,), (7,)] if GPU else [])
    cases = CASES if ("--all" in sys.argv or GPU) else CASES[:1]
    for n, (dt, p, splits, n_prompt) in enumerate(cases):
        case_rng = np.random.default_rng(SEED + n)     # each case's inputs its own
        for grid in grids:
            out = check_case(case_rng, TINY, dt, p, splits, n_prompt, grid,
                             fused_bits="--fused" in sys.argv or GPU)
            if n == 0 and grid == (1,):
                dump += [out[i] for i in REGISTRY["step_persistent"].writes]
    if "--dump" in sys.argv:
        path = sys.argv[sys.argv.index("--dump") + 1]
        np.savez(path, **{f"a{i}": v for i, v in enumerate(dump)})
    print(f"{mode_label(GPU)}: step_persistent OK ({len(dump)} outputs) in {time.perf_counter() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    run_harness(main)
