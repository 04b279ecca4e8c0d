"""peer.json's content, for the peer experiment (lab/measure/experiments/peer.py): the
statistics, the tokens check and the ratios from the raw per-rep data (`summarize`, pure: the
tests feed it numbers), and the whole file with its provenance and method (`record`).
"""
from __future__ import annotations

import math
import platform
import time
from pathlib import Path

from lab.measure.stats import mean_sem
from lab.model import sha256_of
from lab.measure.peer_torch import (COMPILE_ARM, MIN_BUCKET, STRONGEST_ARM, TORCH_WHAT,
                                    window_lengths)
from lab.measure.experiment import now, versions as software_versions

RECORDED_BY = "decode-lab record peer"
HOST_BOUND = 0.9    # an arm whose host issues a step in >= 90% of the step's time is host-bound:
                    # the GPU waits on Python, so the host (not the kernels) sets its speed
LAB_WHAT = {
    "lab graph": "LabConfig(graph=True): the lab's step replayed as one CUDA graph per plan",
    "lab graph+pdl": "LabConfig(graph=True, pdl=True): programmatic dependent launch",
    "lab graph+pdl+fusion": "LabConfig(graph=True, pdl=True) + LAB_FUSION=1 (the attention's grid "
                            "tail: one kernel, its tail blocks waiting on a counter)",
    "lab graph+pdl+fusion+split": "LabConfig(graph=True, pdl=True) + LAB_FUSION=1 + "
                                  "LAB_SPLIT_COMBINE=1: the fused step, its attention as "
                                  "attn_partial + attn_combine (two graph nodes)",
    "lab persistent": "LabConfig(graph=True) + LAB_PERSISTENT=1: the whole step in one "
                      "cooperative kernel, one graph node",
}


def _first_diff(a, b) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def summarize(contexts, arm_names, data: dict, oracle: dict | None = None,
              failed: dict | None = None, compile_arm: str = COMPILE_ARM) -> dict:
    """Statistics, the tokens check and the ratios from raw per-rep data.

    data[arm][context] = {"ms": [ms/token per rep], "tokens": [generated ids per rep]};
    oracle[context] = the float64 oracle's generated ids; failed[arm] = why an arm has no data.
    The reference ids are the first arm's (with data) first rep at each context."""
    failed = dict(failed or {})
    results, ratios, mismatches, oracle_rows, refs = {}, {}, [], {}, {}
    live = [a for a in arm_names if a not in failed and a in data]
    for c in contexts:
        key = str(c)
        results[key], ratios[key] = {}, {}
        ref_arm = next((a for a in live if data[a].get(key, {}).get("tokens")), None)
        ref = data[ref_arm][key]["tokens"][0] if ref_arm else None
        for arm in arm_names:
            if arm in failed:
                results[key][arm] = {"error": failed[arm]}
                continue
            d = data.get(arm, {}).get(key)
            if not d or not d.get("ms"):
                results[key][arm] = {"error": "no timed runs"}
                continue
            m, s = mean_sem(d["ms"])
            toks = d["tokens"]
            same_reps = all(t == toks[0] for t in toks)
            diffs = [(r, _first_diff(t, ref)) for r, t in enumerate(toks) if t != ref]
            row = {"ms_per_token": list(d["ms"]), "mean_ms": m, "sem_ms": s,
                   "tok_per_s": 1000.0 / m if m else float("nan"),
                   "tokens_match_reference": not diffs, "reps_identical": same_reps}
            if diffs:
                rep, at = diffs[0]
                row["first_mismatch"] = {"rep": rep, "token_index": at,
                                         "ids": toks[rep], "reference_ids": ref}
                mismatches.append({"context": c, "arm": arm, "reference_arm": ref_arm,
                                   "reps_differing": [r for r, _ in diffs],
                                   "rep": rep, "token_index": at})
            if oracle is not None and key in oracle:
                at = _first_diff(toks[0], oracle[key])
                row["matches_oracle"] = at is None
                row["oracle_first_diff"] = at
            for extra in ("replay_fraction", "mode", "ledger", "toggles"):
                if extra in d:
                    row[extra] = d[extra]
            if d.get("host_ms"):        # a torch arm: how long the host took to issue a step
                row["host_ms"] = list(d["host_ms"])
                row["mean_host_ms"] = mean_sem(d["host_ms"])[0]
                row["host_share"] = row["mean_host_ms"] / m if m else float("nan")
                row["host_bound"] = row["host_share"] >= HOST_BOUND
            results[key][arm] = row
        base = results[key].get(compile_arm, {})
        for arm in arm_names:
            row = results[key][arm]
            if "mean_ms" not in row:
                continue
            out = {}
            for other in arm_names:
                o = results[key][other]
                if other == arm or "mean_ms" not in o or not arm.startswith("lab") \
                        or other.startswith("lab"):
                    continue
                r = row["mean_ms"] / o["mean_ms"]
                rs = r * math.hypot(row["sem_ms"] / row["mean_ms"], o["sem_ms"] / o["mean_ms"])
                out[other] = {"ratio": r, "sem": rs}
            if out:
                ratios[key][arm] = out
            if "mean_ms" in base:
                row["ratio_to_torch_compile"] = row["mean_ms"] / base["mean_ms"]
        if oracle is not None and key in oracle:
            oracle_rows[key] = {"ids": list(oracle[key]),
                                "reference_matches_oracle": ref is not None
                                and _first_diff(ref, oracle[key]) is None,
                                "first_diff": None if ref is None
                                else _first_diff(ref, oracle[key])}
        refs[key] = {"arm": ref_arm, "ids": ref}
    ok = not mismatches and not failed and bool(live)
    return {"results": results, "ratios": ratios,
            "tokens_check": {"ok": not mismatches and bool(live),
                             "rule": "every rep of every arm generates the reference ids: the "
                                     "first arm's (lab graph's) first rep at that context",
                             "reference": refs, "mismatches": mismatches,
                             "oracle": oracle_rows},
            "failed_arms": failed, "ok": ok}


def record(args, model, contexts, prompts, arms, data, oracle, failed, torch_names, torch_info,
           run_order, t_start) -> dict:
    """peer.json's content: provenance, the method, and summarize()'s statistics and checks,
    with the lab arms' replay gate (lab/measure/bench.py) and the compile arm's CUDA-graph skips."""
    from lab.measure.bench import arm_mode, replay_fraction
    lab_names = list(dict.fromkeys(name for name, _ in arms))
    problems = []
    for (name, c), arm in arms.items():
        f = replay_fraction(arm.outcomes)
        row = data[name][str(c)]
        row.update({"replay_fraction": f, "mode": arm_mode(True, f),
                    "ledger": dict(arm.outcomes), "toggles": arm.cfg.toggles()})
        if row["mode"] != "graph":
            problems.append(f"{name} at context {c} is not a graph arm (ledger {row['ledger']})")
    arm_order = lab_names + torch_names
    summary = summarize(contexts, arm_order, data, oracle, failed)
    for c in contexts:
        ref = summary["tokens_check"]["reference"][str(c)]
        if ref["ids"] is not None:
            ref["text"] = model.tokenizer.decode(ref["ids"])
    warnings = []
    counters = torch_info.get("compile_counters") or {}
    if COMPILE_ARM in torch_info.get("arms", []) and args.torch_device.startswith("cuda") \
            and counters.get("cudagraph_skips"):
        why = (counters.get("cudagraph_skip_reasons") or ["see the worker's log"])[0]
        warnings.append(f"torch.compile skipped CUDA graphs {counters['cudagraph_skips']} "
                        f"time(s), so its arm ran (partly) without them: {why}")
    backend = next(iter(arms.values())).engine.backend
    versions = software_versions(backend)
    tsrc = (f"PyTorch {torch_info['torch']} (CUDA {torch_info.get('torch_cuda')}) on "
            f"{torch_info.get('device_name', '?')}")
    lengths = window_lengths(contexts, args.tokens, model.cfg.max_seq, args.buckets)
    buckets = ("the torch step's attention reads the first L cache rows and masks those past "
               "the device position; L = max(128, next power of two >= position + 1), capped "
               "at max_seq: one torch.cuda.CUDAGraph per L (every L the prefill meets), one "
               "torch.compile specialisation per L the windows meet"
               if args.buckets == "pow2" else
               "the torch step's attention reads all max_seq cache rows and masks those past "
               "the device position: one graph serves every position")
    res = {
        "what": "decode-lab's graph arms against a PyTorch peer (eager, torch.cuda.CUDAGraph, "
                "torch.compile reduce-overhead, inductor's kernels in one torch.cuda.CUDAGraph) "
                "of the same model from the same weight file: "
                "ms/token at each context, greedy tokens compared",
        "source": f"{versions['describe']}; {tsrc}",
        "date": now(),
        "recorded_by": RECORDED_BY,
        "versions": {**{k: v for k, v in versions.items() if k != "describe"},
                     "torch": torch_info["torch"], "torch_cuda": torch_info.get("torch_cuda"),
                     "torch_device": torch_info.get("device_name"),
                     "python": platform.python_version()},
        "weights": {"file": Path(args.weights).name, "sha256": sha256_of(Path(args.weights))},
        "method": {
            "reps": args.reps, "tokens_per_rep": args.tokens, "contexts": contexts,
            "compile_arm": COMPILE_ARM, "strongest_arm": STRONGEST_ARM,
            "host_time": "host_ms (torch arms): the wall time until the host had issued the "
                         "window's last step, before the closing synchronize, per token; "
                         f"host_share = host_ms / ms; host_bound when host_share >= {HOST_BOUND}: "
                         "the GPU then waits on the host's Python between steps",
            "context": "context c: the prompt is c + 1 characters of data/corpus.txt from "
                       f"offset {args.prompt_offset}, fed one position per step (untimed); "
                       "the timed window is the next `tokens_per_rep` steps, at positions "
                       "c .. c + tokens_per_rep - 1",
            "prefill": "each lab arm runs its own prefill through its own step every run; each "
                       "torch arm's worker prefills once per context per rep (through its own "
                       "graphs for the cudagraph and inductor arms, eager steps otherwise) and "
                       "rewinds to the prompt's end before its window (generated ids cleared)",
            "timing": "ms/token = wall time of the window / tokens, synchronised at its two "
                      "ends only (lab: engine.decode on the backend clock; torch: "
                      "torch.cuda.synchronize around time.perf_counter), garbage collector "
                      "off; one untimed warm-up run per arm and context first",
            "interleaving": "rep i runs the lab arms in this process and the torch arms in "
                            "their workers (one at a time), the lab first on even reps and the "
                            "workers first on odd ones; each side's arm order is rotated per rep",
            "process_separation": "each torch arm ran in a process of its own (python -m "
                                  "lab.measure.peer_worker; JSON lines over a pipe); "
                                  "the lab's process never imports torch",
            "why_separate": "once torch has run kernels in a process, every later CUDA graph "
                            "node in that process (numba's too) replays about 0.18 us slower",
            "dtype": "float32 (weights, activations, KV cache) in every arm",
            "tf32": torch_info.get("settings", {}),
            "argmax": "greedy, on the device, inside the step (lab: argmax_next; torch: "
                      "torch.argmax, written to a device token buffer)",
            "graph_bucketing": {
                "scheme": args.buckets, "min_bucket": MIN_BUCKET, "description": buckets,
                "window_lengths": {str(c): v for c, v in lengths.items()},
                "cudagraph_buckets_captured": torch_info.get("cudagraph_buckets", []),
                "lab": "the lab's attention reads exactly position + 1 rows (one graph per "
                       "plan key: split count per position range)"},
            "arms": {**{n: LAB_WHAT[n] for n in lab_names},
                     **{n: TORCH_WHAT[n] for n in torch_names}},
            "fusion_arm": "lab graph+pdl+fusion" in lab_names,
        },
        "prompts": {str(c): {"offset": args.prompt_offset, "chars": len(t), "text": t}
                    for c, (t, _) in prompts.items()},
        "arm_order": arm_order,
        **summary,
        "run_order": run_order,
        "torch_worker": {"warmup_s": torch_info.get("warmup_s", {}),
                         "build_s": torch_info.get("build_s", {}),
                         "compile_s": torch_info.get("compile_s", {}),
                         "compile_counters": counters,
                         "compile_counters_by_arm": torch_info.get("compile_counters_by_arm", {}),
                         "python": torch_info.get("python")},
        "problems": problems,
        "warnings": warnings,
        "wall_s": time.perf_counter() - t_start,
    }
    res["ok"] = summary["ok"] and not problems
    return res
