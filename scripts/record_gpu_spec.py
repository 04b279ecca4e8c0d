"""Record speculative decoding (LAB_DRAFT) as JSON with source and date: the same greedy tokens
with and without drafting, and case study 003's curve.

  python scripts/record_gpu_spec.py --out DIR [--backend cuda] [--reps 5] [--tokens 64]

Three measurements (lab/measure/spec.py):
- "same_tokens": greedy ids of LAB_DRAFT=4 against LAB_DRAFT=0 on the five standard prompts x
  256 tokens; a divergence with the float64 oracle's margin at it;
- "curve": ms per generated token, tokens per verify step and the replay share for k = 0, 2,
  4, 8 and LAB_BUG_SPEC_KEY (k = 4) at contexts 64 and 900, arms interleaved rep by rep;
- "splits": the verify attention's split count (1, 4, 16, 64) against its workspace at both
  contexts (k = 4).

Writes DIR/spec.json.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lab.config import LabConfig  # noqa: E402
from lab.measure import spec  # noqa: E402
from scripts import recorder  # noqa: E402


def main(argv=None) -> int:
    ap = recorder.arguments(__doc__, backends=recorder.BACKENDS, weights=True, reps=5, tokens=64)
    ap.add_argument("--prompt-tokens", type=int, default=256,
                    help="generated tokens per standard prompt in the same-tokens check")
    args = ap.parse_args(argv)
    out = recorder.out_dir(args.out)
    model = recorder.load(args)
    base = LabConfig(backend=args.backend)
    progress = recorder.stopwatch()
    progress(f"same tokens: LAB_DRAFT=4 vs 0, standard prompts x {args.prompt_tokens}")
    same = spec.same_tokens(model, 4, tokens=args.prompt_tokens, base=base)
    for r in same["prompts"]:
        d = r["first_divergence"]
        progress(f"  {r['prompt']!r}: {'identical' if r['identical'] else d}; "
                 f"{r['draft_stats']['tokens per step']:.2f} tokens per verify step")
    progress(f"curve: k = 0, 2, 4, 8 + the bug, contexts 64 and 900, {args.reps} reps")
    curve = spec.curve(model, contexts=(64, 900), new_tokens=args.tokens, reps=args.reps,
                       base=base, progress=False)
    print(spec.format_curve(curve), flush=True)
    progress("splits: 1, 4, 16, 64 (k = 4)")
    splits = spec.splits_sweep(model, 4, new_tokens=args.tokens, reps=args.reps, base=base,
                               progress=False)
    print(spec.format_curve(splits), flush=True)
    res = {"what": "speculative decoding (LAB_DRAFT): same tokens, the curve against context, "
                   "the verify attention's split count", "same_tokens": same, "curve": curve,
           "splits": splits, "source": curve["source"], "versions": recorder.versions(
               spec.DecodeEngine(model, base, warm_up=False).backend),
           "date": recorder.now(), "recorded_by": "scripts/record_gpu_spec.py"}
    path = recorder.write_json(out / "spec.json", res)
    print(f"same tokens: {'PASS' if same['ok'] else 'FAIL'}; wrote {path}")
    return 0 if same["ok"] else 1


if __name__ == "__main__":
    sys.exit(recorder.run(main))
