"""Check and time the persistent step (LAB_PERSISTENT=1) on a GPU against the fused step.

  python scripts/check_gpu_persistent.py OUT.json [--reps 5] [--tokens 64] [--contexts 64,900]
                                         [--backend cuda]

1. Bits: on each of the five standard prompts (lab/measure/compare.py's STANDARD_PROMPTS), the
   prompt fed eagerly, then 64 greedy tokens, eagerly and as graph replays, on a LAB_FUSION=1
   engine and a LAB_PERSISTENT=1 engine: every generated id and every step's logits must have
   the same bytes in all four runs (the persistent kernel runs the fused kernels' arithmetic).
   The persistent engine's counters must be back to 0, and its launch log must hold one launch
   (step_persistent) per step.
2. Time: graph replay ms/token at each context (lab/measure/bench.py's run_sweep: the arms
   interleaved rep by rep, the order reversed every other rep, one untimed warm-up run each,
   seek to the context, mean ± sem over the reps) for four arms: graph (the unfused step),
   graph + PDL (unfused), fused graph (LAB_FUSION=1) and persistent graph (LAB_PERSISTENT=1).
   Arms that allocate alike share one engine, as `decode-lab bench` does.
Prints one table and writes OUT.json (source, date, the kernel's grid and block, barriers per
token, every check and the sweep's rows). Exit 0 when every check holds and every graph arm
replayed; 1 with one line per mismatch otherwise; 2 on bad arguments or no GPU.

About 1 to 2 minutes on the H200, most of it compiling the kernels (the persistent kernel is
the whole step: its compile is the longest).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ARMS = {"graph": {}, "graph+pdl": {"pdl": True}, "fused graph": {"fusion": True, "attn_tail": "heads"},
        "persistent graph": {"persistent": True}}


def check_bits(model, base, prompts, tokens: int) -> tuple[list[str], list[dict]]:
    """(mismatches, one record per prompt): fused vs persistent, eager vs graph, bytes."""
    import numpy as np

    from lab.engine.runner import DecodeEngine
    from lab.teach.verify import decode_after_prompt
    engines = {"fused": DecodeEngine(model, base.replace(fusion=True, attn_tail="heads")),
               "persistent": DecodeEngine(model, base.replace(persistent=True))}
    bad, records = [], []
    for prompt in prompts:
        ids = model.tokenizer.encode(prompt)
        runs = {}
        for name, eng in engines.items():
            for graph in (False, True):
                first = len(eng.ledger)
                out, ledger = decode_after_prompt(eng, ids, tokens, graph=graph)
                runs[f"{name} {'graph' if graph else 'eager'}"] = out
                if graph and any(e.outcome not in ("replay", "capture") for e in ledger):
                    bad.append(f"{name} graph on {prompt!r}: ledger "
                               f"{sorted({e.outcome for e in eng.ledger[first:]})}")
        ref = runs["fused eager"]
        for label, out in runs.items():
            if out.tokens.tobytes() != ref.tokens.tobytes():
                bad.append(f"{label} on {prompt!r}: ids differ from fused eager")
            if out.logits.tobytes() != ref.logits.tobytes():
                diff = float(np.max(np.abs(out.logits.astype(np.float64) - ref.logits)))
                bad.append(f"{label} on {prompt!r}: logits differ from fused eager "
                           f"(max |d| {diff:.3g})")
        records.append({"prompt": prompt, "ids": ref.tokens.tolist(),
                        "runs": sorted(runs), "text": model.tokenizer.decode(ref.tokens)})
    eng = engines["persistent"]
    if eng.backend.download(eng.devices[0].persistent.counter).any():
        bad.append("persistent: counter slots not 0 after the runs")
    kinds = {r.kernel for r in eng.log.records if r.kind in ("eager", "capture")}
    if kinds != {"step_persistent"}:
        bad.append(f"persistent: its launch log holds {sorted(kinds)}, not step_persistent only")
    return bad, records


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="the JSON file to write")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--contexts", default="64,900")
    ap.add_argument("--backend", default="cuda", choices=("cuda", "sim"),
                    help="sim: a dry run of this script without a GPU (simulated times)")
    args = ap.parse_args()
    if args.reps < 2 or args.tokens < 1:
        print("check_gpu_persistent: --reps must be >= 2 and --tokens >= 1", file=sys.stderr)
        return 2
    if not args.out.parent.is_dir():
        print(f"check_gpu_persistent: {args.out.parent} is not a folder", file=sys.stderr)
        return 2

    from kernels import persistent
    from lab.config import LabConfig
    from lab.errors import LabError
    from lab.measure.bench import BENCH_PROMPT, parse_contexts, run_sweep
    from lab.measure.compare import STANDARD_PROMPTS
    from lab.model import load_model

    t0 = time.perf_counter()
    base = LabConfig(backend=args.backend)
    model = load_model()
    try:
        contexts = parse_contexts(args.contexts)
        bad, records = check_bits(model, base, STANDARD_PROMPTS, 64)
        t_bits = time.perf_counter() - t0
        sweep = run_sweep(model, {n: base.replace(**kw) for n, kw in ARMS.items()}, contexts,
                          reps=args.reps, tokens=args.tokens, prompt=BENCH_PROMPT)
    except LabError as exc:
        print(f"check_gpu_persistent: {exc}", file=sys.stderr)
        return 2
    if not sweep["meaningful"]:
        bad.append(f"timing not meaningful: {sweep['reason']}")
    from lab.engine.runner import DecodeEngine
    eng = DecodeEngine(model, base.replace(persistent=True), warm_up=False)
    launch = eng.step_launches(eng.plan(0))[0]
    lines = [f"source: {sweep['source']}",
             f"step_persistent: grid {launch.grid}, block {launch.block}, "
             f"{persistent.barriers_per_token(model.cfg.n_layer)} grid barriers per token",
             f"bits: fused vs persistent, eager vs graph, {len(STANDARD_PROMPTS)} prompts x 64 "
             f"tokens: {'identical' if not bad else 'MISMATCH'}",
             f"{'context':>7}  {'arm':<18} {'ms/token':>9} {'± sem us':>9} {'launches':>8} "
             f"{'replays':>8}"]
    for r in sweep["rows"]:
        rf = r["replay_fraction"]
        lines.append(f"{r['context']:>7}  {r['arm']:<18} {r['mean_ms']:>9.4f} "
                     f"{1000 * r['sem_ms']:>9.2f} {r['launches_per_token']:>8} "
                     f"{'-' if rf is None else f'{100 * rf:.1f}%':>8}")
    for c in contexts:
        ms = {r["arm"]: r["mean_ms"] for r in sweep["rows"] if r["context"] == c}
        lines.append(f"context {c}: persistent / fused graph {ms['persistent graph'] / ms['fused graph']:.3f}, "
                     f"persistent / graph+pdl {ms['persistent graph'] / ms['graph+pdl']:.3f}")
    print("\n".join(lines))
    result = {"what": "LAB_PERSISTENT=1 against LAB_FUSION=1: bits, and graph replay ms/token",
              "source": sweep["source"], "date": time.strftime("%Y-%m-%d"),
              "grid": list(launch.grid), "block": list(launch.block),
              "barriers_per_token": persistent.barriers_per_token(model.cfg.n_layer),
              "bits": {"ok": not bad, "mismatches": bad, "prompts": records},
              "sweep": sweep, "table": "\n".join(lines),
              "seconds": {"bits": round(t_bits, 1), "total": round(time.perf_counter() - t0, 1)}}
    tmp = args.out.with_suffix(args.out.suffix + ".tmp")
    tmp.write_text(json.dumps(result, indent=2, default=str))
    tmp.replace(args.out)
    print(f"wrote {args.out} ({time.perf_counter() - t0:.0f} s)")
    for line in bad:
        print(f"MISMATCH: {line}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
