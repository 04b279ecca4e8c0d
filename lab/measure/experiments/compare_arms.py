"""compare.json: every ladder arm against the float64 oracle, `decode-lab compare --prompts
standard` per arm (notebook 9; lab/measure/compare.py).

Each arm decodes the five standard prompts fed the oracle's greedy ids (KL both ways, top-1,
max |Δlogit| per step) and alone (its greedy ids the oracle's, except after a first divergence
at a near-tie). An arm whose path this GPU lacks (PDL before sm_90, the persistent kernel
without enough co-resident blocks) is recorded as refused, with the reason.
"""
from __future__ import annotations

import time

from lab.config import LabConfig
from lab.errors import LabError
from lab.measure.experiment import experiment, now, versions

# label -> the toggles of side B (side A is the oracle): the ladder's and the peer table's arms
ARMS = {
    "graph": "GRAPH=1",
    "graph+pdl": "GRAPH=1,PDL=1",
    "graph+pdl+fusion": "GRAPH=1,PDL=1,FUSION=1",
    "graph+pdl+fusion+split": "GRAPH=1,PDL=1,FUSION=1,SPLIT_COMBINE=1",
    "graph+pdl+fusion (heads tail)": "GRAPH=1,PDL=1,FUSION=1,ATTN_TAIL=heads",
    "persistent": "GRAPH=1,PERSISTENT=1",
}
TOKENS, TIE_MARGIN = 256, 1e-3
QUICK = dict(tokens=2, prompts=("ROMEO.\n",))


def slim(res: dict) -> dict:
    """compare_prompts' result without the per-step columns: per prompt the summary, the greedy
    check and the verdict."""
    rows = []
    for r in res["prompts"]:
        c = r["compare"]
        rows.append({"prompt": r["prompt"], "ok": r["ok"], "summary": c["summary"],
                     "greedy": r["greedy"], "reasons": c["verdict"].get("reasons", [])})
    return {"b": res["b"], "tokens": res["tokens"], "thresholds": res["thresholds"],
            "prompts": rows, "verdict": res["verdict"]}


def judge_arms(model_weights, base: LabConfig, arms, prompts, tokens: int, progress) -> dict:
    """{arm: slim result, or {"b", "refused": why}} for each arm, with the overall verdict."""
    from lab.measure import compare
    th = compare.Thresholds(tie_margin=TIE_MARGIN)
    out: dict = {"thresholds": th.describe(), "arms": {}}
    for arm in arms:
        t0 = time.perf_counter()
        progress(f"{arm}: {ARMS[arm]}")
        try:
            res = compare.compare_prompts("reference", ARMS[arm], prompts=prompts, tokens=tokens,
                                          weights_a=model_weights, base=base, thresholds=th)
        except LabError as exc:   # this GPU cannot run the arm: say why, go on
            out["arms"][arm] = {"b": ARMS[arm], "refused": str(exc)}
            progress(f"{arm}: refused here: {exc}")
            continue
        out["arms"][arm] = slim(res)
        progress(f"--- {arm}\n{compare.format_prompts(res)}")
        progress(f"{arm}: {'PASS' if res['verdict']['ok'] else 'FAIL'} in "
                 f"{time.perf_counter() - t0:.0f} s")
    ran = {k: v for k, v in out["arms"].items() if "refused" not in v}
    out["verdict"] = {"ok": all(v["verdict"]["ok"] for v in ran.values()),
                      "failed": [k for k, v in ran.items() if not v["verdict"]["ok"]],
                      "refused": [k for k, v in out["arms"].items() if "refused" in v]}
    return out


@experiment("compare", files=("compare.json",), priority=180,
            doc="every ladder arm against the float64 oracle on the standard prompts "
                "(notebook 9)")
def record(ctx) -> None:
    from lab.backend import make_backend
    from lab.measure.compare import STANDARD_PROMPTS
    tokens, prompts = (QUICK["tokens"], QUICK["prompts"]) if ctx.quick else (TOKENS,
                                                                             STANDARD_PROMPTS)
    base = LabConfig(backend=ctx.backend)
    ver = versions(make_backend(base))
    judged = judge_arms(ctx.weights, base, ARMS, prompts, tokens, ctx.progress)
    result = {"what": "every ladder arm against the float64 oracle (decode-lab compare "
                      "--prompts): fed the oracle's ids, and decoding alone",
              "source": ver["describe"], "versions": ver, "date": now(), "tokens": tokens,
              "prompts": list(prompts), **judged}
    ctx.write_json("compare.json", result)
    if not result["verdict"]["ok"]:
        raise LabError(f"FAIL: {', '.join(result['verdict']['failed'])} against the "
                       f"oracle (compare.json)")
