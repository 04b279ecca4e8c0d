"""persistent.json: the persistent step (LAB_PERSISTENT=1) checked and timed against the fused
step (notebook 10); on a GPU, every op's kernels against their twins first (kernels.check).

  kernel_checks  `kernels.check.run(None, "gpu")`: each op's kernels at the model's dims, the
                 persistent kernel at grids of 1, 2, 7 and 132 blocks (a GPU only)
  bits           the five standard prompts fed eagerly, then 64 greedy tokens, eagerly and as
                 graph replays, on a LAB_FUSION=1 (grid tail) and a LAB_PERSISTENT=1 engine:
                 every id and every step's logits the same bytes in all four runs; the
                 persistent engine's counters as clean launches leave them, one launch
                 (step_persistent) per step
  sweep          graph replay ms/token at CONTEXTS for ARMS and every other variant of the
                 megakernel's body (kernels/persistent.py VARIANTS), interleaved; each
                 persistent arm's ratio to the best multi-node graph arm (MULTI_NODE)
  phases         (a GPU only) where the default kernel's time goes at PHASE_CONTEXT: per
                 phase, blocks busy, wait and work, and the kernel's span (lab/measure/
                 megakernel.py: the clock-stamped body launched PHASE_LAUNCHES times);
                 phases_long the same at PHASE_CONTEXT_LONG, where each head's merge
                 reads many more partials
The peer times its persistent arm only where this file says the checks held (`held`).
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from lab.config import LabConfig
from lab.errors import LabError
from lab.measure.replay_check import decode_after_prompt
from lab.measure.experiment import experiment, today

ARMS = {"graph": {}, "graph+pdl": {"pdl": True},
        "fused graph": {"fusion": True},          # the grid tail: the persistent step's bits
        "fused+pdl graph": {"fusion": True, "pdl": True},
        "fused+split+pdl graph": {"fusion": True, "split_combine": True, "pdl": True},
        "persistent graph": {"persistent": True}}
MULTI_NODE = ("graph", "graph+pdl", "fused graph", "fused+pdl graph", "fused+split+pdl graph")
CONTEXTS, REPS, TOKENS, BITS_TOKENS = (64, 900), 5, 64, 64
PHASE_CONTEXT, PHASE_LAUNCHES = 64, 30
PHASE_CONTEXT_LONG = 900
QUICK = dict(contexts=(64, 900), reps=2, tokens=2, bits_tokens=8)


def held(out: Path) -> bool:
    """Whether out/persistent.json exists and its checks held (bits, and the kernel's where
    it was checked)."""
    try:
        res = json.loads((Path(out) / "persistent.json").read_text())
        kernel = (res.get("kernel_checks") or {}).get("ops", {}).get("persistent", {"ok": True})
        return bool(res["bits"]["ok"] and kernel["ok"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def check_bits(model, base: LabConfig, prompts, tokens: int) -> tuple[list[str], list[dict]]:
    """(mismatches, one record per prompt): fused vs persistent, eager vs graph, bytes."""
    from lab.engine.runner import DecodeEngine
    engines = {"fused": DecodeEngine(model, base.replace(**ARMS["fused graph"])),
               "persistent": DecodeEngine(model, base.replace(**ARMS["persistent graph"]))}
    bad, records = [], []
    for prompt in prompts:
        ids = model.tokenizer.encode(prompt)
        runs = {}
        for name, eng in engines.items():
            for graph in (False, True):
                got, ledger = decode_after_prompt(eng, ids, tokens, graph)
                toks, logits = got.tokens, got.logits
                runs[f"{name} {'graph' if graph else 'eager'}"] = (toks, logits)
                if graph and any(e.outcome not in ("replay", "capture") for e in ledger):
                    bad.append(f"{name} graph on {prompt!r}: ledger "
                               f"{sorted({e.outcome for e in ledger})}")
        ref_toks, ref_logits = runs["fused eager"]
        for label, (toks, logits) in runs.items():
            if toks.tobytes() != ref_toks.tobytes():
                bad.append(f"{label} on {prompt!r}: ids differ from fused eager")
            if logits.tobytes() != ref_logits.tobytes():
                diff = float(np.max(np.abs(logits.astype(np.float64) - ref_logits)))
                bad.append(f"{label} on {prompt!r}: logits differ from fused eager "
                           f"(max |d| {diff:.3g})")
        records.append({"prompt": prompt, "ids": ref_toks.tolist(), "runs": sorted(runs),
                        "text": model.tokenizer.decode(ref_toks)})
    eng = engines["persistent"]
    from kernels import persistent
    c = model.cfg
    adds = persistent.launch_adds(c.n_layer, c.d_model, c.d_ff, c.vocab_size, c.n_head,
                                  c.head_dim)
    word = eng.backend.download(eng.devices[0].persistent.counter)
    if word[persistent.SLOT_ERR] or not persistent.settled(word, adds):
        bad.append("persistent: counter slots not as clean launches leave them after the runs")
    kinds = {r.kernel for r in eng.log.records if r.kind in ("eager", "capture")}
    if kinds != {"step_persistent"}:
        bad.append(f"persistent: its launch log holds {sorted(kinds)}, not step_persistent only")
    return bad, records


def _sweep(model, base: LabConfig, p: dict) -> dict:
    """ARMS and every non-default variant of the megakernel's body (an engine each),
    interleaved at each context (lab/measure/megakernel.py's sweep_with_variants)."""
    from kernels import persistent
    from lab.measure.megakernel import sweep_with_variants
    others = [n for n in persistent.VARIANTS if n != persistent.DEFAULT_VARIANT]
    return sweep_with_variants(model, base, ARMS, others, p["contexts"], p["reps"],
                               p["tokens"])[0]


def _phases(model, base: LabConfig, progress, context: int = PHASE_CONTEXT) -> dict:
    """The default kernel's phase table at `context` after a real prefix, and its span."""
    from lab.measure.megakernel import (engine_at, kernel_span_us, phase_kinds, phase_rows,
                                        stamped_kernel, stamped_runs)
    eng, launch = engine_at(model, base, context)
    runs = stamped_runs(eng, stamped_kernel(base.kv_dtype), launch.grid[0], context,
                        PHASE_LAUNCHES)
    rows = phase_rows(runs, model.cfg.n_layer)
    kinds = phase_kinds(rows)
    med, best = kernel_span_us(runs)
    progress(f"phases at context {context} (us, mean over layers): " + ", ".join(
        f"{k} {v['step']:.2f} (wait {v['wait']:.2f}, work {v['work']:.2f})"
        for k, v in kinds.items()) + f"; span {med:.2f} us")
    return {"context": context, "launches": PHASE_LAUNCHES, "grid": list(launch.grid),
            "block": list(launch.block), "rows": rows, "kinds": kinds,
            "span_us": {"median": med, "min": best},
            "how": "step_persistent_stamped (the default body, a stamp per block and phase) on "
                   "the engine's buffers: start/end by globaltimer from the kernel's first "
                   "stamp, wait and work by clock64 at each block's rate; medians over launches"}


def kernel_checks(progress) -> dict:
    """kernels.check on this GPU, every op; a line per op."""
    from kernels.check import run
    res = run(None, "gpu")
    for op, r in res["ops"].items():
        progress(f"  kernels.check {op}: {'ok' if r['ok'] else 'FAIL ' + str(r['error'])} "
                 f"({r['seconds']:.1f} s, {r['signatures']} signatures)")
    return res


@experiment("persistent", files=("persistent.json",), priority=3,
            doc="every op's kernels on the GPU, and the persistent step against the fused step: "
                "bits, ms/token beside the multi-node graph arms and its body's variants, and "
                "its phases by the kernel's own clocks (notebook 10)")
def record(ctx) -> None:
    from kernels import persistent
    from lab.engine.runner import DecodeEngine
    from lab.measure.compare import STANDARD_PROMPTS
    p = QUICK if ctx.quick else dict(contexts=CONTEXTS, reps=REPS, tokens=TOKENS,
                                     bits_tokens=BITS_TOKENS)
    t0 = time.perf_counter()
    model, base = ctx.model, LabConfig(backend=ctx.backend)
    kernels = kernel_checks(ctx.progress) if ctx.backend == "cuda" else None
    bad, records = check_bits(model, base, STANDARD_PROMPTS, p["bits_tokens"])
    t_bits = time.perf_counter() - t0
    sweep = _sweep(model, base, p)
    if not sweep["meaningful"]:
        bad.append(f"timing not meaningful: {sweep['reason']}")
    eng = DecodeEngine(model, base.replace(**ARMS["persistent graph"]), warm_up=False)
    launch = eng.step_launches(eng.plan(0))[0]
    waits = persistent.waits_per_token(model.cfg.n_layer)
    lines = [f"source: {sweep['source']}",
             f"step_persistent: grid {launch.grid}, block {launch.block}, {waits} counter "
             f"waits per token, no grid barrier",
             f"bits: fused vs persistent, eager vs graph, {len(STANDARD_PROMPTS)} prompts x "
             f"{p['bits_tokens']} tokens: {'identical' if not bad else 'MISMATCH'}",
             f"{'context':>7}  {'arm':<18} {'ms/token':>9} {'± sem us':>9} {'launches':>8} "
             f"{'replays':>8}"]
    for r in sweep["rows"]:
        rf = r["replay_fraction"]
        lines.append(f"{r['context']:>7}  {r['arm']:<18} {r['mean_ms']:>9.4f} "
                     f"{1000 * r['sem_ms']:>9.2f} {r['launches_per_token']:>8} "
                     f"{'-' if rf is None else f'{100 * rf:.1f}%':>8}")
    from lab.measure.megakernel import ratio_to_best
    ratios = ratio_to_best(sweep["rows"], MULTI_NODE)
    for c, rc in ratios.items():
        lines.append(f"context {c}: the best multi-node graph arm is {rc['best_multi_node']} "
                     f"({rc['best_ms']:.4f} ms/token); " + ", ".join(
                         f"{a} / it {r:.3f}" for a, r in rc.items() if a.startswith("pers")))
    on_gpu = ctx.backend == "cuda" and not ctx.quick
    phases = _phases(model, base, ctx.progress) if on_gpu else None
    phases_long = _phases(model, base, ctx.progress, PHASE_CONTEXT_LONG) if on_gpu else None
    ctx.progress("\n".join(lines))
    result = {"what": "LAB_PERSISTENT=1 against LAB_FUSION=1: bits, and graph replay ms/token",
              "source": sweep["source"], "date": today(),
              "grid": list(launch.grid), "block": list(launch.block),
              "barriers_per_token": 0, "waits_per_token": waits, "bits_tail": "grid",
              "default_variant": persistent.DEFAULT_VARIANT,
              "variants": {n: dict(v) for n, v in persistent.VARIANTS.items()},
              "bits": {"ok": not bad, "mismatches": bad, "prompts": records},
              "sweep": sweep, "ratio_to_best_multi_node": ratios, "table": "\n".join(lines),
              "seconds": {"bits": round(t_bits, 1), "total": round(time.perf_counter() - t0, 1)}}
    if kernels is not None:
        result["kernel_checks"] = kernels
    if phases is not None:
        result["phases"] = phases
    if phases_long is not None:
        result["phases_long"] = phases_long
    ctx.write_json("persistent.json", result)
    failed = [op for op, r in (kernels or {"ops": {}})["ops"].items() if not r["ok"]]
    if bad or failed:
        raise LabError(f"FAIL: {len(bad)} mismatch(es) "
                       f"{'; '.join(bad[:3])}{'; kernels.check failed: ' if failed else ''}"
                       f"{', '.join(failed)} (persistent.json)")
