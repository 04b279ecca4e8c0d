"""Two decode runs of one prompt, compared step by step: `decode-lab compare`.

A side is a run spec: `reference` (the float64 oracle, lab/reference.py) or an engine given by a
backend and/or LAB_* toggles (`sim`, `cuda,PDL=1`, `KV_DTYPE=float16,GRAPH=0`; the LAB_ prefix
is optional, toggles are parsed like bench arms; an empty spec is the base configuration).
lab/measure/compare_sides.py parses a spec and runs a side; this module compares two runs and judges
them.

  1. weights   the sha256 of each side's weights file. Different hashes FAIL the comparison:
               it would measure the weights, not the path.
  2. input     side A decodes `tokens` tokens greedily after the prompt; side B is fed those same
               ids (teacher forcing), so both sides see the same context at every step, and the
               first step where their top-1 differs is where B, decoding alone, would leave A.
               B's device token buffer is read back to show it held exactly A's ids.
  3. per step  KL(A||B) and KL(B||A) of the softmaxed logits (float64), each side's top-1 (the
               sampler's rule) and whether they agree, max |Δlogit|, A's margin (top-1 minus
               top-2 logit): a disagreement at a small margin is rounding, not a bug.
  4. paths     each engine's ledger and launch log must show the path its spec claims (graph
               replays, the KV cache's dtype in the launches that touch it, ...); a claim the run
               does not show is a dead fast path, and FAILs the comparison (the evidence each
               toggle's path leaves: lab/measure/compare_evidence.py).
  5. verdict   PASS when 1 and 4 hold and the metrics are inside the thresholds (`Thresholds`).
               With a tie margin, a top-1 disagreement where A's margin is below it is a
               near-tie: listed in the summary, not counted against the top-1 bar.

`compare_prompts()` (`decode-lab compare --prompts standard`) runs the comparison on each of
STANDARD_PROMPTS and, for each, lets B also decode ALONE: its greedy ids must be A's, except
after a first divergence at a near-tie of A's (the lecture's §8-§9 check of a path that sums
in another order: the oracle is the judge, a flip at a margin below the tie margin is rounding).

`kv_dtype_study()` runs the float64 oracle, a float32 and a float16 KV cache on one input
(notebook 09, `decode-lab record precision`).
"""
from __future__ import annotations

import datetime as dt
import hashlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from .compare_evidence import path_checks
from .compare_sides import REFERENCE, Run, RunSpec, parse_spec, run_side
from lab.config import LabConfig
from lab.errors import LabError
from lab.files import check_output, refuse_overlap
from lab.model import DEFAULT_WEIGHTS, Model, check_request, load_model, weights_read
from .report import save

DEFAULT_PROMPT = "ROMEO.\n"
# five prompts from the training text's kinds (a speaker's name, a line, a dialogue, a stage
# direction, a question): `compare --prompts standard`; with 256 tokens each, 1280 steps
STANDARD_PROMPTS = ("ROMEO.\n", "To be, or not to be", "First Citizen:\nBefore we",
                    "Enter HAMLET.\n", "JULIET.\nWhat is")


@dataclass(frozen=True)
class Thresholds:
    """The verdict's bars. The defaults are a float32 bar: two float32 paths of one model (or a
    float32 path and the float64 oracle) differ only by rounding in a different order, so their
    logits agree to far better than 1e-3 and every greedy pick agrees. A float16 KV cache rounds
    every stored k and v to 11 significant bits and is expected to miss the |Δlogit| bar: judge
    it with a bar chosen for float16 (notebook 09), not with this one."""
    max_kld: float = 1e-6      # mean over steps of KL, in EACH direction (nats)
    min_top1: float = 1.0      # fraction of steps whose greedy pick agrees (near-ties excused)
    max_dlogit: float = 1e-3   # largest |Δlogit| over every step and vocabulary entry
    tie_margin: float = 0.0    # a disagreement where A's top-1 - top-2 is below this is a
                               # near-tie: reported, not counted (0: none is excused)

    def __post_init__(self):
        for flag, v in (("--max-kld", self.max_kld), ("--max-dlogit", self.max_dlogit),
                        ("--tie-margin", self.tie_margin)):
            if not v >= 0:          # NaN fails this too
                raise LabError(f"{flag} {v}: give a threshold >= 0")
        if not 0 <= self.min_top1 <= 1:
            raise LabError(f"--min-top1 {self.min_top1}: give a fraction in [0, 1]")

    def describe(self) -> str:
        ties = f" (near-ties below a margin of {self.tie_margin:g} excused)" if self.tie_margin else ""
        return (f"mean KL (each direction) <= {self.max_kld:g}, top-1 agreement >= "
                f"{self.min_top1:g}{ties}, max |Δlogit| <= {self.max_dlogit:g}")


# ---- the comparison ----------------------------------------------------------------------------
def _ids_hash(ids) -> str:
    return hashlib.sha256(np.asarray(ids, np.int32).tobytes()).hexdigest()


def _summary(m: dict, a: Run, tie_margin: float = 0.0) -> dict:
    steps = len(m["agree"])
    worst = int(np.argmax(m["max_dlogit"]))
    tight = int(np.argmin(m["margin_a"]))
    out = {"steps": steps, "top1_agreement": float(np.mean(m["agree"])),
           "top1_agree_steps": int(np.sum(m["agree"])),
           "mean_kld_ab": float(np.mean(m["kld_ab"])), "mean_kld_ba": float(np.mean(m["kld_ba"])),
           "max_kld_ab": float(np.max(m["kld_ab"])), "max_kld_ba": float(np.max(m["kld_ba"])),
           "max_dlogit": float(m["max_dlogit"][worst]), "max_dlogit_step": worst,
           "mean_max_dlogit": float(np.mean(m["max_dlogit"])),
           "min_margin_a": float(m["margin_a"][tight]), "min_margin_step": tight,
           "dlogit_at_min_margin": float(m["max_dlogit"][tight]), "first_divergence": None}
    ties = [int(i) for i in np.flatnonzero(~m["agree"] & (m["margin_a"] < tie_margin))]
    out["near_ties"] = [{"step": i, "position": a.n_prompt - 1 + i, "top1_a": int(m["top1_a"][i]),
                         "top1_b": int(m["top1_b"][i]), "margin_a": float(m["margin_a"][i])}
                        for i in ties]
    out["top1_agreement_beyond_ties"] = float((np.sum(m["agree"]) + len(ties)) / steps)
    bad = np.flatnonzero(~m["agree"])
    if bad.size:
        s = int(bad[0])
        out["first_divergence"] = {"step": s, "position": a.n_prompt - 1 + s,
                                   "top1_a": int(m["top1_a"][s]), "top1_b": int(m["top1_b"][s]),
                                   "margin_a": float(m["margin_a"][s]),
                                   "margin_b": float(m["margin_b"][s]),
                                   "max_dlogit": float(m["max_dlogit"][s])}
    return out


def _verdict(weights_same: bool, a: Run, b: Run, inputs_same: bool, checks, summary: dict,
             th: Thresholds) -> dict:
    reasons = []
    if not weights_same:
        reasons.append(f"weights differ: A {a.weights} sha256 {a.sha256[:16]}..., B {b.weights} "
                       f"sha256 {b.sha256[:16]}...: the comparison would measure the weights, "
                       f"not the path")
    if not inputs_same:
        reasons.append("the sides were not fed the same token ids")
    for side in (a, b):                  # NaN or inf: the float32 arithmetic overflowed
        bad = np.flatnonzero(~np.isfinite(side.logits).all(axis=-1)) if side.logits.size else []
        if len(bad):
            reasons.append(f"{side.label}'s logits hold NaN or infinite values at {len(bad)} of "
                           f"{len(side.logits)} steps (first at step {int(bad[0])}): no result")
    for c in checks:
        if c.ok is False:
            reasons.append(f"dead fast path: {c.side} claims {c.claim} but its run shows "
                           f"{c.evidence}")
    if summary["top1_agreement_beyond_ties"] < th.min_top1:
        d = summary["first_divergence"]
        ties = (f" beyond {len(summary['near_ties'])} near-tie(s)" if summary["near_ties"] else "")
        reasons.append(f"top-1 agreement {summary['top1_agreement_beyond_ties']:.4f}{ties} < "
                       f"{th.min_top1:g} (first at step {d['step']}, A's margin "
                       f"{d['margin_a']:.3g})")
    for key, arrow in (("mean_kld_ab", "KL(A||B)"), ("mean_kld_ba", "KL(B||A)")):
        if summary[key] > th.max_kld:
            reasons.append(f"mean {arrow} {summary[key]:.3g} > {th.max_kld:g}")
    if summary["max_dlogit"] > th.max_dlogit:
        reasons.append(f"max |Δlogit| {summary['max_dlogit']:.3g} > {th.max_dlogit:g} (step "
                       f"{summary['max_dlogit_step']})")
    return {"ok": not reasons, "reasons": reasons}


def compare_runs(a: Run, b: Run, thresholds: Thresholds | None = None, tokenizer=None) -> dict:
    """The per-step table, summary, path evidence and verdict of two runs of one input."""
    th = thresholds or Thresholds()
    if a.logits.shape != b.logits.shape:
        raise LabError(f"the sides' logits differ in shape ({a.logits.shape} vs {b.logits.shape}):"
                       f" different models or inputs cannot be compared step by step")
    from .precision import step_metrics   # imports the kernels' constants (numba)
    m = step_metrics(a.logits, b.logits)
    fed = [r.fed for r in (a, b) if r.fed is not None]
    inputs_same = np.array_equal(a.ids, b.ids) and all(np.array_equal(f, a.ids) for f in fed)
    checks = path_checks(a) + path_checks(b)
    summary = _summary(m, a, th.tie_margin)
    char = (lambda i: tokenizer.vocab[i]) if tokenizer else str
    steps = [{"step": s, "position": a.n_prompt - 1 + s, "top1_a": int(m["top1_a"][s]),
              "top1_b": int(m["top1_b"][s]), "char_a": char(int(m["top1_a"][s])),
              "char_b": char(int(m["top1_b"][s])), "agree": bool(m["agree"][s]),
              "max_dlogit": float(m["max_dlogit"][s]), "kld_ab": float(m["kld_ab"][s]),
              "kld_ba": float(m["kld_ba"][s]), "margin_a": float(m["margin_a"][s])}
             for s in range(len(m["agree"]))]
    weights_same = a.sha256 == b.sha256
    return {"what": "two runs of one input, step by step (decode-lab compare)",
            "date": dt.datetime.now().isoformat(timespec="seconds"),
            "sides": {r.label: {"spec": r.spec.text, "run": r.spec.describe(), "source": r.source,
                                "weights": r.weights, "sha256": r.sha256} for r in (a, b)},
            "weights_identical": weights_same,
            "input": {"n_prompt": a.n_prompt, "tokens": len(a.ids) - a.n_prompt,
                      "ids_sha256": _ids_hash(a.ids), "identical": bool(inputs_same),
                      "how": "A decodes greedily; B is fed A's ids (teacher forcing)"},
            "checks": [asdict(c) for c in checks], "steps": steps, "summary": summary,
            "thresholds": asdict(th),
            "verdict": _verdict(weights_same, a, b, inputs_same, checks, summary, th)}


def compare(spec_a: str, spec_b: str, prompt: str = DEFAULT_PROMPT, tokens: int = 64,
            weights_a=DEFAULT_WEIGHTS, weights_b=None, base: LabConfig | None = None,
            thresholds: Thresholds | None = None, engine_factory: Callable | None = None,
            progress=False) -> dict:
    """Compare two run specs on one prompt (see the module docstring). Bad input (an unknown
    spec or toggle value, an empty prompt, tokens < 1, models of different shapes) raises a
    LabError before any decoding; different weights are a FAIL, not an error. B fed A's ids is
    stepped by the host, so a LAB_LOOP=device claim is judged on B decoding the whole generation
    alone (one launch of the device loop), as compare_prompts does."""
    res, a, b = _compare(spec_a, spec_b, prompt, tokens, weights_a, weights_b, base, thresholds,
                         engine_factory, progress)
    if not b.spec.is_reference and b.spec.cfg.loop == "device":
        weights_b = weights_a if weights_b is None else weights_b
        alone = run_side("B alone", b.spec, load_model(weights_b), weights_b,
                         a.ids[:a.n_prompt], tokens, engine_factory=engine_factory,
                         progress=progress, whole=True)
        _judge_the_loop_on(res, a, b, alone, thresholds or Thresholds())
    return res


def _compare(spec_a, spec_b, prompt, tokens, weights_a, weights_b, base, thresholds,
             engine_factory, progress) -> tuple[dict, Run, Run]:
    """compare()'s result, and the two runs it compared."""
    base = base or LabConfig()
    a_spec, b_spec = parse_spec(spec_a, base), parse_spec(spec_b, base)
    th = thresholds or Thresholds()
    if tokens < 1:
        raise LabError(f"tokens {tokens}: give at least 1 token to compare")
    weights_b = weights_a if weights_b is None else weights_b
    model_a = load_model(weights_a)
    model_b = model_a if Path(weights_b) == Path(weights_a) else load_model(weights_b)
    if model_a.cfg != model_b.cfg:
        raise LabError(f"the sides' models differ in shape or vocabulary ({weights_a} vs "
                       f"{weights_b}): their logits cannot be compared")
    ids = model_a.tokenizer.encode(prompt)
    check_request(model_a.cfg, ids, tokens)
    a = run_side("A", a_spec, model_a, weights_a, ids, tokens, engine_factory=engine_factory,
                 progress=progress)
    b = run_side("B", b_spec, model_b, weights_b, ids, feed=a.ids, engine_factory=engine_factory,
                 progress=progress)
    return {**compare_runs(a, b, th, model_a.tokenizer), "prompt": prompt}, a, b


# ---- several prompts, and B decoding alone -----------------------------------------------------
def _prompt_set(text: str) -> tuple[str, ...]:
    if text.strip().lower() == "standard":
        return STANDARD_PROMPTS
    prompts = tuple(p.replace("\\n", "\n") for p in text.split(";") if p)
    if not prompts:
        raise LabError(f"--prompts {text!r}: give 'standard' or prompts separated by ';'")
    return prompts


def greedy_check(a: Run, free: Run, tie_margin: float) -> dict:
    """A's greedy ids against B's own greedy decode (B not fed): identical, or B leaves A first
    at a step where A's margin is below `tie_margin` (a near-tie: after it the two continue
    different texts, so nothing later is compared)."""
    gen_a, gen_b = a.ids[a.n_prompt:], free.ids[free.n_prompt:]
    differ = np.flatnonzero(gen_a != gen_b)
    if differ.size == 0:
        return {"identical": True, "steps": int(gen_a.size), "first_divergence": None, "ok": True}
    s = int(differ[0])
    top = np.sort(a.logits[s])[::-1]
    margin = float(top[0] - top[1])
    return {"identical": False, "steps": int(gen_a.size), "ok": margin < tie_margin,
            "first_divergence": {"step": s, "position": a.n_prompt - 1 + s, "id_a": int(gen_a[s]),
                                 "id_b": int(gen_b[s]), "margin_a": margin,
                                 "near_tie": margin < tie_margin}}


def _judge_the_loop_on(res: dict, a: Run, b: Run, alone: Run, th: Thresholds) -> None:
    """Re-judge `res` (a comparison whose B was fed step by step) with B's LAB_LOOP claim read
    from `alone` (B decoding the whole generation): its checks and its verdict."""
    checks = path_checks(a) + path_checks(b, loop_run=alone)
    res["checks"] = [asdict(c) for c in checks]
    res["verdict"] = _verdict(res["weights_identical"], a, b, res["input"]["identical"], checks,
                              res["summary"], th)


def compare_prompts(spec_a: str, spec_b: str, prompts=STANDARD_PROMPTS, tokens: int = 256,
                    weights_a=DEFAULT_WEIGHTS, weights_b=None, base: LabConfig | None = None,
                    thresholds: Thresholds | None = None, engine_factory: Callable | None = None,
                    progress=False) -> dict:
    """`compare` on each prompt (B fed A's ids), plus B decoding each prompt alone
    (`greedy_check`); PASS when every prompt's comparison and greedy check pass."""
    th = thresholds or Thresholds()
    base = base or LabConfig()
    b_spec = parse_spec(spec_b, base)
    weights_b = weights_a if weights_b is None else weights_b
    model_b = load_model(weights_b)
    # B fed A's ids is stepped by the host, so a device-loop claim is judged on B alone, which
    # decodes the whole generation as `generate` does: one launch of the device loop
    device_loop = not b_spec.is_reference and b_spec.cfg.loop == "device"
    rows = []
    for prompt in prompts:
        res, a, b = _compare(spec_a, spec_b, prompt, tokens, weights_a, weights_b, base, th,
                             engine_factory, progress)
        if b_spec.is_reference:
            free = a
        else:
            free = run_side("B alone", b_spec, model_b, weights_b, a.ids[:a.n_prompt], tokens,
                            engine_factory=engine_factory, progress=progress, whole=device_loop)
        greedy = greedy_check(a, free, th.tie_margin)
        if device_loop:
            _judge_the_loop_on(res, a, b, free, th)
        rows.append({"prompt": prompt, "compare": res, "greedy": greedy,
                     "ok": res["verdict"]["ok"] and greedy["ok"]})
    return {"what": "decode-lab compare on several prompts, and B decoding each alone",
            "date": dt.datetime.now().isoformat(timespec="seconds"), "a": spec_a, "b": spec_b,
            "tokens": tokens, "thresholds": asdict(th), "prompts": rows,
            "verdict": {"ok": all(r["ok"] for r in rows),
                        "failed": [r["prompt"] for r in rows if not r["ok"]]}}


def format_prompts(res: dict) -> str:
    """One line per prompt: the fed comparison's metrics, near-ties, B's own greedy decode."""
    lines = [f"A: {res['a']}   B: {res['b']}   {res['tokens']} tokens per prompt"]
    lines.append(f"{'prompt':<28} {'top-1':>9} {'KL(A||B)':>9} {'KL(B||A)':>9} "
                 f"{'max|Δlogit|':>11} {'min margin':>10}  ties  alone (B's greedy ids)")
    for r in res["prompts"]:
        s, g = r["compare"]["summary"], r["greedy"]
        d = g["first_divergence"]
        alone = ("identical" if g["identical"] else
                 f"leaves A at step {d['step']}, margin {d['margin_a']:.2g} "
                 f"({'near-tie' if d['near_tie'] else 'NOT a near-tie'})")
        lines.append(f"{r['prompt']!r:<28} {s['top1_agree_steps']:>4}/{s['steps']:<4} "
                     f"{s['mean_kld_ab']:>9.2e} {s['mean_kld_ba']:>9.2e} {s['max_dlogit']:>11.3e} "
                     f"{s['min_margin_a']:>10.3g}  {len(s['near_ties']):>4}  {alone}"
                     + ("" if r["ok"] else "   FAIL: " + "; ".join(r["compare"]["verdict"]["reasons"])))
    lines.append(f"thresholds: {Thresholds(**res['thresholds']).describe()}; alone: identical "
                 f"ids, or a first divergence at a near-tie")
    v = res["verdict"]
    lines.append(_verdict_line(v, "PASS" if v["ok"] else f"FAIL on {len(v['failed'])} prompt(s)"))
    return "\n".join(lines)


def _verdict_line(v: dict, said: str) -> str:
    """The verdict's line; an A/A control's says so (its PASS is not a plain PASS)."""
    if v.get("control"):
        return f"verdict: A/A control {said}: {v['control']}"
    return f"verdict: {said}"


# ---- output ------------------------------------------------------------------------------------
def format_compare(res: dict, rows: int | None = None) -> str:
    """The comparison as text: sides, weights, input, path evidence, the per-step table (every
    step, or the first `rows`), the summary and the verdict."""
    sides, s = res["sides"], res["summary"]
    lines = [f"{k}: {v['spec'] or '(base)'} -> {v['run']}; {v['source']}" for k, v in sides.items()]
    same = "identical" if res["weights_identical"] else "DIFFERENT"
    lines.append("weights: " + "; ".join(f"{k} {Path(v['weights']).name} sha256 {v['sha256'][:16]}"
                                         for k, v in sides.items()) + f" -> {same}")
    inp = res["input"]
    lines.append(f"input: {inp['n_prompt']} prompt ids + {inp['tokens']} tokens; {inp['how']}; "
                 f"ids sha256 {inp['ids_sha256'][:16]}, "
                 f"{'the same' if inp['identical'] else 'NOT the same'} on both sides")
    lines.append("path evidence:")
    for c in res["checks"]:
        mark = {True: "ok", False: "DEAD", None: "-"}[c["ok"]]
        lines.append(f"  {c['side']} {c['claim']:<26} {mark:<4} {c['evidence']}")
    lines.append(f"{'step':>4} {'pos':>4} {'A':>5} {'B':>5} {'agree':>5} {'max|Δlogit|':>11} "
                 f"{'KL(A||B)':>9} {'KL(B||A)':>9} {'margin A':>8}")
    shown = res["steps"] if rows is None else res["steps"][:rows]
    for r in shown:
        lines.append(f"{r['step']:>4} {r['position']:>4} {r['char_a']!r:>5} {r['char_b']!r:>5} "
                     f"{'yes' if r['agree'] else 'NO':>5} {r['max_dlogit']:>11.3e} "
                     f"{r['kld_ab']:>9.2e} {r['kld_ba']:>9.2e} {r['margin_a']:>8.3f}")
    if len(shown) < len(res["steps"]):
        lines.append(f"  ... {len(res['steps']) - len(shown)} more steps")
    lines.append(f"top-1 agreement {s['top1_agree_steps']}/{s['steps']} "
                 f"({s['top1_agreement']:.3f}); mean KL(A||B) {s['mean_kld_ab']:.3g}, KL(B||A) "
                 f"{s['mean_kld_ba']:.3g}; max |Δlogit| {s['max_dlogit']:.3g} at step "
                 f"{s['max_dlogit_step']}")
    if s.get("near_ties"):
        lines.append(f"near-ties (A's margin < {res['thresholds']['tie_margin']:g}, not counted): "
                     + ", ".join(f"step {t['step']} (margin {t['margin_a']:.2g})"
                                 for t in s["near_ties"]))
    d = s["first_divergence"]
    if d is None:
        lines.append(f"first divergence: none in {s['steps']} steps; A's smallest margin "
                     f"{s['min_margin_a']:.4g} (step {s['min_margin_step']}), max |Δlogit| there "
                     f"{s['dlogit_at_min_margin']:.3g}")
    else:
        lines.append(f"first divergence: step {d['step']} (position {d['position']}): A's margin "
                     f"{d['margin_a']:.4g}, B's {d['margin_b']:.4g}, max |Δlogit| "
                     f"{d['max_dlogit']:.3g}")
    lines.append(f"thresholds: {Thresholds(**res['thresholds']).describe()}")
    v = res["verdict"]
    lines.append(_verdict_line(v, "PASS" if v["ok"] else "FAIL: " + "; ".join(v["reasons"])))
    return "\n".join(lines)


AA_CONTROL = ("an A/A control: --a and --b are one configuration on one weights file, so this "
              "checks that a run repeats itself, not a difference between two paths")


def _checked_sides(args, base: LabConfig) -> bool:
    """--a and --b checked before any work (each toggle once, parse_spec; no draft length:
    compare steps one token per step); whether they are one configuration on one weights file
    (A/A)."""
    specs = {}
    for flag, text in (("--a", args.a), ("--b", args.b)):
        specs[flag] = parse_spec(text, base)
        cfg = specs[flag].cfg
        if cfg is not None and cfg.draft:
            raise LabError(f"{flag} {text!r}: LAB_DRAFT={cfg.draft} drafts several tokens per "
                           f"step, and compare feeds one token per step; check a draft length's "
                           f"tokens with `decode-lab spec --draft {cfg.draft}` (the same greedy "
                           f"tokens as one token per step)")
    weights_a = Path(args.weights or DEFAULT_WEIGHTS)
    weights_b = weights_a if args.weights_b is None else Path(args.weights_b)
    same_weights = weights_a.resolve() == weights_b.resolve()
    return specs["--a"].cfg == specs["--b"].cfg and same_weights


def _inputs(args) -> dict:
    """The files compare reads, by flag: each side's weights and the description beside them
    (lab.model.weights_read, which refuses an empty path or a folder)."""
    out = weights_read("--weights", args.weights)
    if args.weights_b is not None:
        out.update(weights_read("--weights-b", args.weights_b))
    return out


def main_compare(args, base: LabConfig) -> int:
    """`decode-lab compare`: check every argument, run, print, write --json; exit 0 on PASS,
    1 on FAIL (bad input raises a LabError: exit 2). --a and --b one configuration is run and
    reported as an A/A control, never as a plain PASS."""
    th = Thresholds(args.max_kld, args.min_top1, args.max_dlogit, args.tie_margin)
    refuse_overlap({"--json": args.json}, _inputs(args))
    aa = _checked_sides(args, base)
    if args.json:
        check_output(args.json, "--json")
    if args.prompts is not None:
        res = compare_prompts(args.a, args.b, _prompt_set(args.prompts), args.tokens,
                              args.weights or DEFAULT_WEIGHTS, args.weights_b, base, th,
                              progress=args.progress)
        if aa:
            res["verdict"]["control"] = AA_CONTROL
        print(format_prompts(res))
    else:
        res = compare(args.a, args.b, args.prompt, args.tokens, args.weights or DEFAULT_WEIGHTS,
                      args.weights_b, base, th, progress=args.progress)
        if aa:
            res["verdict"]["control"] = AA_CONTROL
        print(format_compare(res))
    for path in save(res, args.json):
        print(f"wrote {path}")
    return 0 if res["verdict"]["ok"] else 1


def add_parser(sub, common):
    """Add the `compare` subcommand and its arguments to `sub`; returns its parser."""
    d = Thresholds()
    c = sub.add_parser("compare", help="two runs of one prompt step by step: weights, path "
                       "evidence, KL both ways, top-1, max |Δlogit| (exit 1 on FAIL)")
    c.add_argument("--a", required=True, help="side A: reference | a backend | LAB_NAME=VALUE,...")
    c.add_argument("--b", required=True, help="side B, e.g. KV_DTYPE=float16")
    c.add_argument("--prompt", default=DEFAULT_PROMPT)
    c.add_argument("--tokens", type=int, default=64, help="tokens A decodes (B is fed them)")
    c.add_argument("--max-kld", type=float, default=d.max_kld,
                   help=f"FAIL when the mean KL, either direction, exceeds this "
                        f"(default {d.max_kld:g})")
    c.add_argument("--min-top1", type=float, default=d.min_top1,
                   help=f"FAIL below this top-1 agreement (default {d.min_top1:g})")
    c.add_argument("--max-dlogit", type=float, default=d.max_dlogit,
                   help=f"FAIL when a |Δlogit| exceeds this (default {d.max_dlogit:g})")
    c.add_argument("--tie-margin", type=float, default=d.tie_margin,
                   help="a top-1 disagreement where A's top-1 - top-2 logit is below this is a "
                        "near-tie: reported, not counted (default 0: none excused)")
    c.add_argument("--prompts", default=None, metavar="standard|TEXT;TEXT...",
                   help="compare on several prompts instead of --prompt: 'standard' (the five "
                        "STANDARD_PROMPTS) or texts separated by ';'; B also decodes each alone "
                        "and its greedy ids must be A's up to a near-tie")
    c.add_argument("--weights-b", default=None, metavar="PATH",
                   help="side B's weights (default: the same as --weights)")
    c.add_argument("--json", default=None, metavar="PATH", help="write the result as JSON")
    common(c)
    return c


# ---- float32 vs float16 KV cache vs the oracle --------------------------------------------------
def kv_dtype_study(model: Model, prompt: str = DEFAULT_PROMPT, tokens: int = 64,
                   base: LabConfig | None = None, weights=DEFAULT_WEIGHTS, text: str | None = None,
                   progress=False) -> dict:
    """The float64 oracle, a float32 and a float16 KV cache (otherwise `base`) on one input: the
    oracle's greedy decode of `tokens` tokens after `prompt`, or, given `text`, the text itself
    (its first character is the prompt, every later character a step). The engines are fed the
    oracle's ids. Three comparisons: oracle-float32, oracle-float16, float32-float16."""
    base = base or LabConfig()
    oracle_spec = RunSpec(REFERENCE, None)
    if text is None:
        ids = model.tokenizer.encode(prompt)
        oracle = run_side("oracle", oracle_spec, model, weights, ids, tokens, progress=progress)
    else:
        feed = model.tokenizer.encode(text)
        oracle = run_side("oracle", oracle_spec, model, weights, feed[:1], feed=feed,
                          progress=progress)
    runs = {name: run_side(name, RunSpec(f"LAB_KV_DTYPE={name}", base.replace(kv_dtype=name)),
                           model, weights, oracle.ids[:oracle.n_prompt], feed=oracle.ids,
                           progress=progress)
            for name in ("float32", "float16")}
    pairs = {"oracle-float32": (oracle, runs["float32"]),
             "oracle-float16": (oracle, runs["float16"]),
             "float32-float16": (runs["float32"], runs["float16"])}
    decode = model.tokenizer.decode
    return {"what": "KV cache float32 vs float16 vs the float64 oracle, fed the same ids",
            "source": runs["float32"].source,
            "date": dt.datetime.now().isoformat(timespec="seconds"),
            "input": "text" if text is not None else "oracle's greedy decode",
            "prompt": decode(oracle.ids[:oracle.n_prompt]), "steps": len(oracle.logits),
            "text": decode(oracle.ids[oracle.n_prompt:]),
            "pairs": {name: compare_runs(a, b, tokenizer=model.tokenizer)
                      for name, (a, b) in pairs.items()}}


def step_columns(pair: dict) -> dict[str, np.ndarray]:
    """A comparison's per-step values as arrays: from its `steps` rows, or from the `columns` a
    slimmed recording keeps."""
    if "columns" in pair:
        return {k: np.asarray(v) for k, v in pair["columns"].items()}
    return {k: np.array([r[k] for r in pair["steps"]]) for k in pair["steps"][0]}


def slim(study: dict, keep=("max_dlogit", "kld_ab", "kld_ba", "margin_a", "agree"),
         digits: int = 4) -> dict:
    """A study small enough to commit: each comparison keeps the per-step columns `keep` (floats
    to `digits` significant digits) and its disagreeing steps whole, instead of every row."""
    def short(v):
        return int(v) if isinstance(v, (bool, np.bool_)) else float(f"{v:.{digits}g}")

    pairs = {}
    for name, pair in study["pairs"].items():
        cols = step_columns(pair)
        pairs[name] = {**{k: v for k, v in pair.items() if k != "steps"},
                       "columns": {k: [short(x) for x in cols[k].tolist()] for k in keep},
                       "flips": [r for r in pair["steps"] if not r["agree"]]}
    return {**study, "pairs": pairs}
