"""Record every ladder arm against the float64 oracle: `decode-lab compare --prompts standard` per
arm, in one process, as JSON with source, versions and date.

Each arm decodes the five STANDARD_PROMPTS fed the oracle's greedy ids (KL both ways, top-1,
max |Δlogit| per step) and alone (its greedy ids must be the oracle's, except after a first
divergence at a near-tie: the oracle's margin under --tie-margin). The arms are the ones the
README's ladder and peer table time; an arm whose path this GPU lacks (PDL before sm_90, the
persistent kernel without enough co-resident blocks) is recorded as refused, with the reason.

  python scripts/record_gpu_compare.py --out DIR [--tokens 256] [--arms NAME,NAME] [--prompts
                                       standard|TEXT;TEXT] [--tie-margin 1e-3] [--backend cuda|sim]

Writes DIR/compare.json: per arm its toggles, the verdict, and per prompt the metrics and the
greedy check (lab/measure/compare.py). Exit 1 when an arm fails. `--backend sim` is a dry run on
the simulator, labelled simulated.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lab.config import LabConfig  # noqa: E402
from lab.errors import LabError  # noqa: E402
from lab.measure import compare  # noqa: E402
from scripts import recorder  # noqa: E402

# label -> the toggles of side B (side A is the oracle); the ladder's and the peer table's arms
ARMS = {
    "graph": "GRAPH=1",
    "graph+pdl": "GRAPH=1,PDL=1",
    "graph+pdl+fusion": "GRAPH=1,PDL=1,FUSION=1",
    "graph+pdl+fusion+split": "GRAPH=1,PDL=1,FUSION=1,SPLIT_COMBINE=1",
    "graph+pdl+fusion (heads tail)": "GRAPH=1,PDL=1,FUSION=1,ATTN_TAIL=heads",
    "persistent": "GRAPH=1,PERSISTENT=1",
}


def _slim(res: dict) -> dict:
    """compare_prompts' result without the per-step columns: per prompt the summary, the greedy
    check and the verdict."""
    rows = []
    for r in res["prompts"]:
        c = r["compare"]
        rows.append({"prompt": r["prompt"], "ok": r["ok"], "summary": c["summary"],
                     "greedy": r["greedy"], "reasons": c["verdict"].get("reasons", [])})
    return {"b": res["b"], "tokens": res["tokens"], "thresholds": res["thresholds"],
            "prompts": rows, "verdict": res["verdict"]}


def main() -> int:
    ap = recorder.arguments(__doc__, backends=recorder.BACKENDS, weights=True, tokens=256)
    ap.add_argument("--arms", default=",".join(ARMS),
                    help=f"comma-separated, from: {', '.join(ARMS)}")
    ap.add_argument("--prompts", default="standard",
                    help="'standard' (the five STANDARD_PROMPTS) or texts separated by ';'")
    ap.add_argument("--tie-margin", type=float, default=1e-3,
                    help="a flip where the oracle's top-1 - top-2 logit is below this is a "
                         "near-tie: reported, not counted")
    args = ap.parse_args()
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = [a for a in arms if a not in ARMS]
    if unknown or not arms:
        raise LabError(f"--arms: unknown arm(s) {unknown}; choose from {', '.join(ARMS)}")
    if args.tokens < 1:
        raise LabError("--tokens must be at least 1")
    if not args.tie_margin >= 0:
        raise LabError("--tie-margin must be a number at least 0")
    out = recorder.out_dir(args.out)
    prompts = compare._prompt_set(args.prompts)
    base = LabConfig(backend=args.backend)
    th = compare.Thresholds(tie_margin=args.tie_margin)
    progress = recorder.stopwatch()
    from lab.backend import make_backend
    versions = recorder.versions(make_backend(base))
    result = {"what": "every ladder arm against the float64 oracle (decode-lab compare "
                      "--prompts): fed the oracle's ids, and decoding alone",
              "source": versions["describe"],   # "measured on <GPU, versions>" or "simulated (...)"
              "versions": versions, "date": recorder.now(), "tokens": args.tokens,
              "prompts": list(prompts), "thresholds": th.describe(), "arms": {}}
    lines = []
    for arm in arms:
        t0 = time.perf_counter()
        progress(f"{arm}: {ARMS[arm]}")
        try:
            res = compare.compare_prompts("reference", ARMS[arm], prompts=prompts,
                                          tokens=args.tokens, weights_a=args.weights, base=base,
                                          thresholds=th)
        except LabError as exc:   # this GPU cannot run the arm: say why, go on
            result["arms"][arm] = {"b": ARMS[arm], "refused": str(exc)}
            lines.append(f"{arm}: refused here: {exc}")
            progress(f"{arm}: refused ({exc})")
            continue
        result["arms"][arm] = _slim(res)
        lines.append(f"--- {arm}\n{compare.format_prompts(res)}")
        progress(f"{arm}: {'PASS' if res['verdict']['ok'] else 'FAIL'} in "
                 f"{time.perf_counter() - t0:.0f} s")
    ran = {k: v for k, v in result["arms"].items() if "refused" not in v}
    result["verdict"] = {"ok": all(v["verdict"]["ok"] for v in ran.values()),
                         "failed": [k for k, v in ran.items() if not v["verdict"]["ok"]],
                         "refused": [k for k, v in result["arms"].items() if "refused" in v]}
    lines.append(f"source: {result['source']}")
    recorder.record(out, "compare", result, "\n".join(lines))
    return 0 if result["verdict"]["ok"] else 1


if __name__ == "__main__":
    sys.exit(recorder.run(main))
