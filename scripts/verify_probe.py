"""The verify step against the one-token step, on one GPU: are the verify kernels near their
one-token kernels' cost, and when does drafting pay?

  python scripts/verify_probe.py --out verify_probe.json [--backend cuda] [--quick]

Four measurements, each interleaved (every arm in every round), printed as one table and written
as JSON to --out:

  products    matvec against matmat at T = 2 .. 9 columns on the qkv projection (768 x 256), and
              at T = 5 (k = 4) each product of the verify step against its one-token kernel
              (matmat_residual vs matvec_residual, swiglu_cols vs swiglu_up, the LM head):
              graph-captured node times (lab/measure/chains.py's chains: a chain cycles through
              the layers' instances, per-node time = the slope over two chain lengths)
  attention   verify_partial (k = 4, LAB_DRAFT_SPLITS splits + the causal block) against
              attn_partial (the one-token plan's splits) at contexts 64 and 900, node times as above
  step        the k = 4 verify step against the one-token step at contexts 64 and 900: steps
              replayed back to back from the same position (lab.measure.spec's timing), their
              ratio V with its standard error over the rounds
  texts       drafting (k = 2, 4, 8) against LAB_DRAFT=0 on the two fixed texts
              (lab.measure.spec.break_even): ms per generated token, E, V, break-even E = V

With --backend sim everything runs on the simulator (a smoke test: the node times are then the
host's wall time of the twins, meaningless as GPU times; the table says "simulated").
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels import REGISTRY, matvec, verify  # noqa: E402
from lab import DecodeEngine, LabConfig, load_model  # noqa: E402
from lab.engine.step import launch  # noqa: E402
from lab.measure import spec  # noqa: E402
from lab.measure.chains import chain_fit, set_pos, step_instances  # noqa: E402

COLS = tuple(range(2, 10))        # T = k + 1 columns: 2 .. MAX_COLS
CONTEXTS = (64, 900)
K = 4                             # the draft length of the step and attention comparisons


def node_us(be, arms: dict, rounds: int, reps: int) -> dict:
    """{arm: {"node_us": median per-node us, "rounds": [...]}} for each arm's chain of launches
    (its instances, one per layer), the arms interleaved round by round."""
    times = {a: [] for a in arms}
    for _ in range(rounds):
        for a, items in arms.items():
            fit = chain_fit(be, items, len(items), pdl=False, reps=reps, rounds=1)
            times[a].append(fit["per_node_us"])
    return {a: {"node_us": statistics.median(v), "rounds": [round(x, 4) for x in v]}
            for a, v in times.items()}


def products(eng, rounds: int, reps: int) -> dict:
    """matvec vs matmat on every layer's wqkv at T = COLS, and the other products at T = K + 1."""
    be, c, w = eng.backend, eng.model.cfg, eng.devices[0].w
    D, F, V = c.d_model, c.d_ff, c.vocab_size
    layers = range(c.n_layer)

    def cols(name, T, width):
        return be.alloc(f"probe_{name}{T}", (T, width), np.float32)
    x, xf = be.alloc("probe_x", (D,), np.float32), be.alloc("probe_xf", (F,), np.float32)
    y3, yd, yf = (be.alloc(f"probe_y{n}", (n,), np.float32) for n in (3 * D, D, F))
    yv = be.alloc("probe_yv", (V,), np.float32)
    be.upload(x, np.full(D, 0.01, np.float32))
    be.upload(xf, np.full(F, 0.01, np.float32))
    rows = matvec.grid_for
    arms = {"matvec qkv": [launch(REGISTRY["matvec"], rows(3 * D), (w[f"layers.{i}.wqkv"], x, y3), i)
                           for i in layers]}
    for T in COLS:
        X, Y = cols("x", T, D), cols("y", T, 3 * D)
        be.upload(X, np.full((T, D), 0.01, np.float32))
        arms[f"matmat qkv T={T}"] = [launch(REGISTRY["matmat"], verify.matmat_grid(3 * D),
                                            (w[f"layers.{i}.wqkv"], X, Y), i) for i in layers]
    T = K + 1
    X, Xf = cols("xk", T, D), cols("xfk", T, F)
    be.upload(X, np.full((T, D), 0.01, np.float32))
    be.upload(Xf, np.full((T, F), 0.01, np.float32))
    Yd, Yf, Yv = cols("ydk", T, D), cols("yfk", T, F), cols("yvk", T, V)
    arms.update({
        "matvec_residual wo": [launch(REGISTRY["matvec_residual"], rows(D), (w[f"layers.{i}.wo"], x, yd), i) for i in layers],
        f"matmat_residual wo T={T}": [launch(REGISTRY["matmat_residual"], rows(D), (w[f"layers.{i}.wo"], X, Yd), i) for i in layers],
        "matvec_residual w_down": [launch(REGISTRY["matvec_residual"], rows(D), (w[f"layers.{i}.w_down"], xf, yd), i) for i in layers],
        f"matmat_residual w_down T={T}": [launch(REGISTRY["matmat_residual"], rows(D), (w[f"layers.{i}.w_down"], Xf, Yd), i) for i in layers],
        "swiglu_up": [launch(REGISTRY["swiglu_up"], rows(F), (w[f"layers.{i}.w_gate"], w[f"layers.{i}.w_up"], x, yf), i) for i in layers],
        f"swiglu_cols T={T}": [launch(REGISTRY["swiglu_cols"], rows(F), (w[f"layers.{i}.w_gate"], w[f"layers.{i}.w_up"], X, Yf), i) for i in layers],
        "matvec lm_head": [launch(REGISTRY["matvec"], rows(V), (w["lm_head"], x, yv))],
        f"matmat lm_head T={T}": [launch(REGISTRY["matmat"], rows(V), (w["lm_head"], X, Yv))],
    })
    be.warm_up({x.kernel for items in arms.values() for x in items})
    res = node_us(be, arms, rounds, reps)
    pairs = [("matvec qkv", f"matmat qkv T={t}") for t in COLS] + [
        ("matvec_residual wo", f"matmat_residual wo T={T}"),
        ("matvec_residual w_down", f"matmat_residual w_down T={T}"),
        ("swiglu_up", f"swiglu_cols T={T}"), ("matvec lm_head", f"matmat lm_head T={T}")]
    return {"nodes": res, "ratios": {b: res[b]["node_us"] / res[a]["node_us"] for a, b in pairs},
            "against": {b: a for a, b in pairs}}


def attention(one, ver, rounds: int, reps: int) -> dict:
    """verify_partial (k = K) against attn_partial at each context: the step's own launches (one
    per layer) at the position whose context that is."""
    out = {}
    for ctx in CONTEXTS:
        p = ctx - 1
        arms = {}
        for eng, name in ((one, "attn_partial"), (ver, "verify_partial")):
            eng.reset(eng.encode("ROMEO.\n"), 0)
            eng.seek(p)
            for key, items in step_instances(eng, [eng.cfg], p).items():
                if items[0].name == name:
                    arms[name] = (eng, items, key)
        res = {}
        for _ in range(rounds):
            for name, (eng, items, key) in arms.items():
                set_pos(eng, p)
                fit = chain_fit(eng.backend, items, len(items), pdl=False, reps=reps, rounds=1)
                res.setdefault(name, {"key": key, "rounds": []})["rounds"].append(fit["per_node_us"])
        for r in res.values():
            r["node_us"] = statistics.median(r["rounds"])
        out[str(ctx)] = {**res, "ratio": res["verify_partial"]["node_us"] / res["attn_partial"]["node_us"]}
    return out


def steps(one, ver, rounds: int, step_reps: int) -> dict:
    """The k = K verify step against the one-token step at each context: V per round, its mean
    and standard error (the steps timed back to back, the two interleaved)."""
    out = {}
    for ctx in CONTEXTS:
        p = ctx - 1
        for eng in (one, ver):
            eng.reset(eng.encode("ROMEO.\n"), 0)
            spec._step_seconds(eng, p, 2)                    # untimed: the graph captured
        pairs = [(spec._step_seconds(ver, p, step_reps), spec._step_seconds(one, p, step_reps))
                 for _ in range(rounds)]
        V = [v / o for v, o in pairs]
        out[str(ctx)] = {"verify_step_us": 1e6 * statistics.fmean(v for v, _ in pairs),
                         "one_step_us": 1e6 * statistics.fmean(o for _, o in pairs),
                         "V": statistics.fmean(V),
                         "V_se": statistics.stdev(V) / len(V) ** 0.5 if len(V) > 1 else float("nan")}
    return out


def table(res: dict) -> str:
    lines = [f"verify probe: {res['source']}", "", "products (node us, T columns against the one-token kernel):"]
    prod = res["products"]
    for b, ratio in prod["ratios"].items():
        a = prod["against"][b]
        lines.append(f"  {b:<28} {prod['nodes'][b]['node_us']:7.2f} us  vs {a:<24} "
                     f"{prod['nodes'][a]['node_us']:6.2f} us  = {ratio:5.2f}x")
    lines.append("attention (node us):")
    for ctx, r in res["attention"].items():
        lines.append(f"  context {ctx:>4}: verify_partial {r['verify_partial']['node_us']:6.2f} us vs "
                     f"attn_partial {r['attn_partial']['node_us']:6.2f} us = {r['ratio']:5.2f}x")
    lines.append(f"step (k = {K} verify step over the one-token step, V):")
    for ctx, r in res["steps"].items():
        lines.append(f"  context {ctx:>4}: {r['verify_step_us']:7.1f} us vs {r['one_step_us']:6.1f} us: "
                     f"V = {r['V']:.3f} ± {r['V_se']:.3f}")
    lines.append("texts (drafting against LAB_DRAFT=0):")
    lines += ["  " + line for line in spec.format_break_even(res["texts"]).splitlines()]
    lines.append(f"({res['seconds']:.0f} s)")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the JSON file to write")
    ap.add_argument("--backend", default="cuda", choices=("cuda", "sim"))
    ap.add_argument("--quick", action="store_true", help="few rounds and tokens (a smoke test)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    rounds, reps, step_reps, tokens, text_reps = ((2, 20, 4, 8, 2) if args.quick else
                                                 (5, 200, 32, 64, 5))
    model = load_model()
    base = LabConfig(backend=args.backend)
    one = DecodeEngine(model, base)
    ver = DecodeEngine(model, base.replace(draft=K))
    res = {"what": "verify kernels against their one-token kernels, the verify step against the "
                   "one-token step, drafting against none on two fixed texts (scripts/verify_probe.py)",
           "source": one.describe(), "k": K, "rounds": rounds}
    print("products ...", flush=True)
    res["products"] = products(ver, rounds, reps)
    print("attention ...", flush=True)
    res["attention"] = attention(one, ver, rounds, reps)
    print("steps ...", flush=True)
    res["steps"] = steps(one, ver, rounds, step_reps)
    print("texts ...", flush=True)
    res["texts"] = spec.break_even(model, drafts=(2, 4, 8), new_tokens=tokens, reps=text_reps,
                                   step_reps=step_reps, base=base, progress=False)
    res["seconds"] = time.perf_counter() - t0
    print(table(res))
    Path(args.out).write_text(json.dumps(res, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
