"""spec.json: speculative decoding (LAB_DRAFT), measured by lab/measure/spec.py (notebook 14).

  same_tokens   greedy ids of LAB_DRAFT=4 against LAB_DRAFT=0 on the five standard prompts
  curve         ms per generated token, tokens per verify step and the replay share for the
                draft lengths DRAFTS and LAB_BUG_SPEC_KEY (draft BUG_DRAFT) at CONTEXTS
  splits        the verify attention's split count against its workspace at CONTEXTS
  same_tokens_ngram  the same with the n-gram drafter (LAB_DRAFTER=ngram)
  break_even    on the two fixed texts (lab.measure.spec.TEXTS, their corpus offsets recorded),
                for each drafter (prompt lookup, the n-gram table): E (tokens per verify
                step), V (a verify step in one-token steps), ms per generated token of each k
                against LAB_DRAFT=0, drafting pays where E > V
Conformance re-runs the curve's draft 0 and draft BUG_DRAFT arms, and break_even's k =
BUG_DRAFT on both texts with each recorded drafter, on the simulator. Every field conformance
reads is checked against lab/schema.py's SPEC first.
"""
from __future__ import annotations

from lab.config import LabConfig
from lab.errors import LabError
from lab.measure.experiment import experiment, now, versions

DRAFTS = (0, 2, 4, 8)
BUG_DRAFT = 4          # the draft length of the same-tokens check, the splits and the bug arm
CONTEXTS = (64, 900)
SPLITS = (1, 4, 16, 64)
REPS, TOKENS, PROMPT_TOKENS = 5, 64, 256
BREAK_EVEN_DRAFTS, STEP_REPS = (2, 4, 8), 32
QUICK = dict(reps=2, tokens=3, prompt_tokens=3, contexts=(16, 40), splits=(1, 4), step_reps=2)


@experiment("spec", files=("spec.json",), priority=140,
            doc="speculative decoding: same tokens, the curve against context, NSPLIT "
                "(notebook 14)")
def record(ctx) -> None:
    from lab.engine.runner import DecodeEngine
    from lab.measure import spec
    p = QUICK if ctx.quick else dict(reps=REPS, tokens=TOKENS, prompt_tokens=PROMPT_TOKENS,
                                     contexts=CONTEXTS, splits=SPLITS, step_reps=STEP_REPS)
    model, base = ctx.model, LabConfig(backend=ctx.backend)
    ctx.progress(f"same tokens: LAB_DRAFT={BUG_DRAFT} vs 0, standard prompts x "
                 f"{p['prompt_tokens']}")
    same = spec.same_tokens(model, BUG_DRAFT, tokens=p["prompt_tokens"], base=base)
    # the n-gram drafter (LAB_DRAFTER=ngram): the same tokens, drafted otherwise
    same_ngram = spec.same_tokens(model, BUG_DRAFT, tokens=p["prompt_tokens"], base=base,
                                  drafter="ngram")
    for res in (same, same_ngram):
        for r in res["prompts"]:
            d = r["first_divergence"]
            ctx.progress(f"  {res['drafter']:<6} {r['prompt']!r}: "
                         f"{'identical' if r['identical'] else d}; "
                         f"{r['draft_stats']['tokens per step']:.2f} tokens per verify step")
    ctx.progress(f"curve: k = {DRAFTS} + the bug, contexts {p['contexts']}, {p['reps']} reps")
    curve = spec.curve(model, drafts=DRAFTS, contexts=p["contexts"], new_tokens=p["tokens"],
                       reps=p["reps"], base=base, bug=BUG_DRAFT, progress=False)
    ctx.progress(spec.format_curve(curve))
    ctx.progress(f"splits: {p['splits']} (k = {BUG_DRAFT})")
    splits = spec.splits_sweep(model, BUG_DRAFT, splits=p["splits"], contexts=p["contexts"],
                               new_tokens=p["tokens"], reps=p["reps"], base=base, progress=False)
    ctx.progress(spec.format_curve(splits))
    ctx.progress(f"break even: texts {', '.join(spec.TEXTS)}, k = {BREAK_EVEN_DRAFTS}")
    even = spec.break_even(model, drafts=BREAK_EVEN_DRAFTS, new_tokens=p["tokens"], reps=p["reps"],
                           step_reps=p["step_reps"], base=base, progress=False)
    # how far the model itself copies the repeat (the float64 oracle, on the host): E's ceiling
    even["copy_reach"] = spec.copy_reach(model, "repeating", p["tokens"])
    ctx.progress(spec.format_break_even(even))
    res = {"what": "speculative decoding (LAB_DRAFT): same tokens, the curve against context, "
                   "the verify attention's split count, when drafting pays on two fixed texts",
           "same_tokens": same, "same_tokens_ngram": same_ngram, "curve": curve,
           "splits": splits, "break_even": even,
           "source": curve["source"],
           "versions": versions(DecodeEngine(model, base, warm_up=False).backend),
           "date": now(), "recorded_by": "decode-lab record spec"}
    from lab import schema
    schema.check(res, schema.SPEC, "spec.json")   # what conformance will read, before it is written
    ctx.write_json("spec.json", res)
    for key, res in (("same_tokens", same), ("same_tokens_ngram", same_ngram)):
        if not res["ok"]:
            raise LabError(f"FAIL: LAB_DRAFT={BUG_DRAFT} (LAB_DRAFTER={res['drafter']}) parted "
                           f"from LAB_DRAFT=0 away from a near-tie ({key} in spec.json)")
