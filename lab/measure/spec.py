"""Speculative decoding measured: does drafting keep the tokens, and when does it pay?

- `same_tokens(model, draft)`: greedy ids with LAB_DRAFT=k against LAB_DRAFT=0 on the standard
  prompts; where they part, the float64 oracle's margin (top-1 minus top-2 logit) at that
  position on the shared prefix says whether it is a near-tie (the verify step sums the
  attention in another order) or a bug.
- `curve(model, drafts, contexts)`: ms per generated token and tokens per verify step against the
  context (case study 003's curve), arms interleaved rep by rep, each on its own engine: a
  drafting arm ingests the real text (the drafter's acceptance depends on the values), the
  one-token arm `seek`s over it (its work does not); every arm's replay share from its ledger
  (the replay gate).
- `splits_sweep(model, draft, splits, contexts)`: the verify attention's split count (NSPLIT)
  against its workspace and the context, as 003 weighed it.
- `copy_reach(model, name)`: how many characters the model's own greedy continuation of a
  text's prompt follows the text the prompt repeats (the ceiling on what prompt lookup's drafts
  keep: the n-gram table drafts what the model writes, copy or not).
- `break_even(model, texts, drafts, drafters)`: for each drafter (LAB_DRAFTER: prompt lookup,
  the n-gram table of the corpus), on two texts fixed before any measurement (TEXTS:
  "repeating", a corpus passage the prompt holds once and then starts again, and "prose", a
  passage whose continuation the prompt does not hold), for each k: E (tokens per verify step,
  the engine's draft stats), V (a verify step's cost in one-token steps, from interleaved
  timing of verify steps and one-token steps at the same position), the ms per generated token
  with and without drafting (interleaved reps, standard errors) and the break-even rule:
  drafting pays where E > V (its speed-up is about E / V).

Prompts of a given context come from the model's training corpus (data/corpus.txt): real text,
so prompt lookup finds what it finds on text like the model's own (and the n-gram table, built
from that corpus, drafts what the model was trained to write).
"""
from __future__ import annotations

import statistics

import numpy as np

from lab.config import LabConfig
from lab.engine.runner import DecodeEngine
from lab.errors import LabError
from lab.measure.arms import replay_fraction
from lab.measure.compare import STANDARD_PROMPTS
from lab.model import CORPUS
from lab.reference import Reference

TIE_MARGIN = 1e-3       # the lecture's near-tie: an oracle margin below this is rounding's to break

# The two texts of `break_even`, fixed before any measurement: passages of data/corpus.txt by
# (offset, length), whole lines. "repeating": the prompt is the passage, then its first `primed`
# characters again, so the generation continues a text the prompt holds verbatim (prompt lookup
# finds every n-gram of it; whether the model copies it is what E measures). "prose": the
# prompt is the passage alone; the generation continues it, text the prompt does not hold.
TEXTS = {
    "repeating": {"offset": 73863, "length": 132, "primed": 32,
                  "what": "Hamlet, 'To be, or not to be', three lines, then their first 32 "
                          "characters again"},
    "prose": {"offset": 794165, "length": 172, "primed": 0,
              "what": "Julius Caesar, 'Friends, Romans, countrymen', four lines"},
}


def corpus_prompt(model, context: int, offset: int = 0) -> str:
    """`context` characters of the training corpus from `offset` (every character is in the
    model's vocabulary: the corpus is what it was trained on)."""
    text = CORPUS.read_text(encoding="utf-8")
    if not 1 <= context <= len(text) - offset:
        raise LabError(f"context {context} from offset {offset}: the corpus has {len(text)} characters")
    out = text[offset:offset + context]
    model.tokenizer.encode(out)          # raises, naming the characters, if any is outside
    return out


def oracle_margin(model, ids, position: int) -> float:
    """The float64 oracle's top-1 minus top-2 logit for the token after `position`, fed `ids`
    up to it (the shared prefix of two runs that part right after it)."""
    ref = Reference(model)
    for p in range(position + 1):
        logits = ref.step(int(ids[p]), p)
    top = np.sort(logits)[::-1]
    return float(top[0] - top[1])


def same_tokens(model, draft: int, prompts=STANDARD_PROMPTS, tokens: int = 256,
                base: LabConfig | None = None, tie_margin: float = TIE_MARGIN,
                splits: int | None = None, drafter: str = "lookup") -> dict:
    """Greedy ids of LAB_DRAFT=`draft` (its verify attention at `splits`, LAB_DRAFT_SPLITS;
    None: `base`'s; its drafter `drafter`, LAB_DRAFTER) against LAB_DRAFT=0 (both on `base`'s
    backend, graphs on) for each prompt: identical, or where they part with the oracle's
    margin there (ok when below `tie_margin`). Also each drafting run's counts (verify steps,
    tokens per step)."""
    base = base or LabConfig()
    one = DecodeEngine(model, base.replace(draft=0, drafter="lookup"))
    spec = DecodeEngine(model, base.replace(draft=draft, drafter=drafter,
                                            **({"draft_splits": splits} if splits else {})))
    rows = []
    for prompt in prompts:
        a = one.generate(prompt, tokens)
        b = spec.generate(prompt, tokens)
        n = len(model.tokenizer.encode(prompt))
        differ = np.flatnonzero(a.tokens != b.tokens)
        row = {"prompt": prompt, "identical": differ.size == 0, "ok": differ.size == 0,
               "first_divergence": None, "draft_stats": b.draft}
        if differ.size:
            pos = int(differ[0]) - 1               # the position whose next token differs
            margin = oracle_margin(model, a.tokens, pos)
            row["first_divergence"] = {"position": pos, "generated_index": pos + 1 - n,
                                       "id_one": int(a.tokens[pos + 1]),
                                       "id_draft": int(b.tokens[pos + 1]),
                                       "oracle_margin": margin, "near_tie": margin < tie_margin}
            row["ok"] = margin < tie_margin
        rows.append(row)
    return {"what": f"greedy ids, LAB_DRAFT={draft} (LAB_DRAFTER={drafter}) against LAB_DRAFT=0",
            "draft": draft, "drafter": drafter,
            "tokens": tokens, "tie_margin": tie_margin, "source": one.describe(),
            "prompts": rows, "ok": all(r["ok"] for r in rows)}


def _engines(model, arms: dict, prompt: str, backend_factory=None):
    """Each arm's engine at the end of `prompt` (untimed: a drafting arm's graph is captured
    there, before anything is timed). `backend_factory(cfg, index)`: each arm's backend (the default: the
    config's)."""
    out = {}
    for i, (name, cfg) in enumerate(arms.items()):
        eng = DecodeEngine(model, cfg, backend=backend_factory(cfg, i) if backend_factory else None)
        ids = eng.encode(prompt)
        eng.reset(ids)
        if cfg.draft:
            eng.decode(ids.size - 1)      # the prompt, once: later reps start after it
        else:
            # one token per step does the same work whatever the cache holds: `seek` over the
            # prompt (zeros in the cache), as bench's context sweep does; drafting's acceptance
            # depends on the text, so the drafting arms ingest it
            eng.seek(ids.size - 1)
        out[name] = eng
    return out


def _timed(eng, start: int, new_tokens: int) -> tuple[float, dict, dict]:
    """One rep: from the position after the prompt, `new_tokens` positions; (seconds, draft
    counts or None, ledger outcomes of this rep's steps). Every rep decodes the same positions,
    so a graph keyed on the position would be found again in the next rep, which a server's
    requests, always further on, never do: an arm with a deliberate bug starts each rep with
    no graph, as a fresh engine."""
    if eng.cfg.draft:
        eng.clear_draft_stats()
    if eng.cfg.bugs:
        eng.drop_graphs()
    eng.seek(start)
    first = len(eng.ledger)
    seconds = eng.decode(new_tokens)
    outcomes: dict = {}
    for e in eng.ledger[first:]:
        outcomes[e.outcome] = outcomes.get(e.outcome, 0) + 1
    return seconds, (eng.draft_stats() if eng.cfg.draft else None), outcomes


def curve(model, drafts=(0, 2, 4, 8), contexts=(64, 900), new_tokens: int = 64, reps: int = 3,
          base: LabConfig | None = None, bug: int | None = 4, splits: int | None = None,
          progress=None, backend_factory=None, drafter: str = "lookup") -> dict:
    """ms per generated token and tokens per verify step for each draft length at each context,
    arms interleaved rep by rep (one engine per arm, the same corpus prompt; the drafting arms'
    drafter `drafter`, LAB_DRAFTER). `bug`: also LAB_BUG_SPEC_KEY with that draft length (None:
    not), whose replay share the ledger shows."""
    base = base or LabConfig()
    arms = {f"draft {k}": (base.replace(draft=k, drafter=drafter,
                                        **({"draft_splits": splits} if splits else {}))
                           if k else base.replace(draft=0)) for k in drafts}
    if bug:
        arms[f"draft {bug} + LAB_BUG_SPEC_KEY"] = base.replace(draft=bug, drafter=drafter,
                                                               bugs={"spec_key"})
    rows, source = [], None
    bar = _bar(progress, len(contexts) * reps * len(arms), "spec curve")
    for ctx in contexts:
        prompt = corpus_prompt(model, ctx)
        engines = _engines(model, arms, prompt, backend_factory)
        source = next(iter(engines.values())).describe()
        start = ctx - 1
        runs = {name: [] for name in arms}
        for eng in engines.values():                  # one untimed rep each: every plan the
            _timed(eng, start, new_tokens)            # timed reps meet is captured before them
        for _ in range(reps):
            for name, eng in engines.items():        # interleaved: every arm in every rep
                runs[name].append(_timed(eng, start, new_tokens))
                if bar is not None:
                    bar.update(1)
        for name, eng in engines.items():
            secs = [r[0] for r in runs[name]]
            ms = [1e3 * s / new_tokens for s in secs]
            outcomes: dict = {}
            for r in runs[name]:                     # the ledger over every timed rep
                for k, n in r[2].items():
                    outcomes[k] = outcomes.get(k, 0) + n
            stats = runs[name][-1][1]
            rows.append({
                "arm": name, "draft": eng.cfg.draft, "context": ctx, "bug": bool(eng.cfg.bugs),
                "splits": eng.cfg.draft_splits if eng.cfg.draft else None,
                "ms_per_token": statistics.fmean(ms),
                "se": statistics.stdev(ms) / len(ms) ** 0.5 if len(ms) > 1 else float("nan"),
                "reps_ms": ms,
                "tokens_per_step": stats["tokens per step"] if stats else 1.0,
                "verify_steps": stats["verify steps"] if stats else new_tokens,
                "replay_fraction": replay_fraction(outcomes), "ledger": outcomes,
                "text": (model.tokenizer.decode(eng.tokens(start + 1 + new_tokens)[start + 1:])
                         if eng.cfg.draft else None),   # draft 0 ran over zeros (`_engines`)
            })
    if bar is not None:
        bar.close()
    return {"what": "speculative decoding: ms per generated token and tokens per verify step "
                    "against context (lab.measure.spec.curve)",
            "new_tokens": new_tokens, "reps": reps, "source": source, "rows": rows}


def splits_sweep(model, draft: int = 4, splits=(1, 4, 16, 64), contexts=(64, 900),
                 new_tokens: int = 32, reps: int = 3, base: LabConfig | None = None,
                 progress=None) -> dict:
    """The verify step's ms per generated token for each NSPLIT at each context, with the
    partials' workspace: how 003 chose its split count."""
    from kernels.verify_attention import workspace_bytes
    base = base or LabConfig()
    c = model.cfg
    rows = []
    for s in splits:
        r = curve(model, drafts=(draft,), contexts=contexts, new_tokens=new_tokens, reps=reps,
                  base=base, bug=None, splits=s, progress=progress)
        source = r["source"]
        for row in r["rows"]:
            row["workspace_bytes"] = workspace_bytes(c.n_head, draft + 1, s, c.head_dim)
            rows.append(row)
    return {"what": f"the verify attention's split count against workspace and context "
                    f"(LAB_DRAFT={draft})", "new_tokens": new_tokens, "reps": reps,
            "source": source, "rows": rows}


def format_same(res: dict) -> str:
    """One line per prompt: identical, or where drafting parted from one token per step and
    the oracle's margin there; the tokens each verify step yielded."""
    lines = [f"{res['what']}, {res['tokens']} tokens per prompt (near-tie: oracle margin < "
             f"{res['tie_margin']:g})"]
    for r in res["prompts"]:
        d, st = r["first_divergence"], r["draft_stats"]
        verdict = "identical" if d is None else (
            f"parts at generated token {d['generated_index']} ({d['id_one']} vs {d['id_draft']}), "
            f"oracle margin {d['oracle_margin']:.2g}: {'near-tie' if d['near_tie'] else 'NOT a near-tie'}")
        lines.append(f"  {'PASS' if r['ok'] else 'FAIL'}  {r['prompt']!r:<28} {verdict}; "
                     f"{st['tokens per step']:.2f} tokens per verify step")
    lines.append(f"{'PASS' if res['ok'] else 'FAIL'} ({res['source']})")
    return "\n".join(lines)


def format_curve(res: dict) -> str:
    """The curve as a table: one row per (context, arm)."""
    lines = [f"{'context':>7}  {'arm':<28} {'ms/token':>9} {'± se':>8} {'tok/step':>8} "
             f"{'replays':>8}" + ("  workspace" if "workspace_bytes" in res["rows"][0] else "")]
    for r in res["rows"]:
        f = r["replay_fraction"]
        rep = "eager" if f is None else f"{100 * f:.0f}%"
        name = r["arm"] + (f" (splits {r['splits']})" if "workspace_bytes" in r else "")
        lines.append(f"{r['context']:>7}  {name:<28} {r['ms_per_token']:>9.4f} {r['se']:>8.4f} "
                     f"{r['tokens_per_step']:>8.2f} {rep:>8}"
                     + (f"  {r['workspace_bytes'] / 1024:.0f} KiB" if "workspace_bytes" in r else ""))
    lines.append(f"({res['source']}; {res['new_tokens']} generated tokens per rep, {res['reps']} "
                 f"reps interleaved)")
    return "\n".join(lines)


def _bar(progress, total: int, desc: str):
    if progress is False:
        return None
    from tqdm.auto import tqdm
    return tqdm(total=total, desc=desc, disable=None if progress is None else False,
                delay=0.0 if progress else 1.0)


# ---- when drafting pays: E against V on two fixed texts --------------------------------------
def text_prompt(model, name: str) -> str:
    """TEXTS[name]'s prompt: the passage (data/corpus.txt at its offset), then its first
    `primed` characters again (a repeat under way)."""
    t = TEXTS[name]
    passage = corpus_prompt(model, t["length"], t["offset"])
    return passage + passage[:t["primed"]]


def copy_reach(model, name: str = "repeating", tokens: int = 64) -> dict:
    """How far the model copies: the float64 oracle's greedy continuation of TEXTS[name]'s
    prompt against the text the prompt repeats (the passage, on from its `primed` characters),
    character by character. `reach`: the characters they share before they part (E cannot beat
    what the model itself writes: prompt lookup drafts the copy, the verify step keeps only what
    the model's own argmax agrees with)."""
    from lab.reference import generate
    t = TEXTS[name]
    prompt = text_prompt(model, name)
    passage = corpus_prompt(model, t["length"], t["offset"])
    ids = model.tokenizer.encode(prompt)
    got = model.tokenizer.decode(generate(model, ids, tokens)[ids.size:])
    want = (passage * 2)[t["primed"]:t["primed"] + tokens]
    reach = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    return {"text": name, "tokens": tokens, "reach": reach, "generated": got, "copy": want,
            "source": "the float64 oracle (lab/reference.py), greedy"}


def _step_seconds(eng, start: int, steps: int) -> float:
    """Seconds per step of `steps` steps issued back to back from `start` (the device
    position), on the backend's clock: one-token steps replay their graph, verify steps theirs
    (limit at the end of the cache: every step does its whole work)."""
    eng.seek(start)
    if eng.cfg.draft:
        eng.devices.upload("limit", np.array([eng.model.cfg.max_seq - 1], np.int32))
    t0 = eng.group.clock()
    for _ in range(steps):
        eng.step()
    return (eng.group.clock() - t0) / steps


def _mean_se(xs) -> tuple[float, float]:
    return statistics.fmean(xs), (statistics.stdev(xs) / len(xs) ** 0.5 if len(xs) > 1
                                  else float("nan"))


DRAFTERS = ("lookup", "ngram")     # LAB_DRAFTER's values (kernels/draft.py)


def _arm(drafter: str, k: int) -> str:
    return f"draft {k}" if drafter == "lookup" else f"draft {k} {drafter}"


def break_even(model, texts=tuple(TEXTS), drafts=(2, 4, 8), new_tokens: int = 64, reps: int = 5,
               step_reps: int = 16, base: LabConfig | None = None, progress=None,
               backend_factory=None, drafters=DRAFTERS) -> dict:
    """For each text of TEXTS, each drafter of `drafters` (LAB_DRAFTER) and each k of `drafts`:
    E, V, ms per generated token against LAB_DRAFT=0, and the break-even line E = V (see the
    module's docstring).

    One engine per arm (draft 0 and each k), at the end of the text's prompt (`_engines`: the
    drafting arms ingest it, draft 0 seeks). Each rep, interleaved arm by arm: `new_tokens`
    generated positions timed (`_timed`: ms per generated token, the draft counts), then
    `step_reps` steps of each arm timed back to back from the same position (`_step_seconds`).
    E = tokens generated / verify steps (the device's counts over the reps); V = a verify
    step's seconds over a one-token step's, per rep (the mean and its standard error over the
    reps); speed-up = draft 0's ms per token over draft k's, and E / V its prediction."""
    base = (base or LabConfig()).replace(draft=0, drafter="lookup")
    unknown = [d for d in drafters if d not in DRAFTERS]
    if unknown or not drafters:
        raise LabError(f"break_even: drafters {list(drafters)!r}: give one or more of "
                       f"{', '.join(DRAFTERS)}")
    arms = {"draft 0": base, **{_arm(d, k): base.replace(draft=k, drafter=d)
                                for d in drafters for k in drafts}}
    bar = _bar(progress, len(texts) * reps * len(arms), "break even")
    out, source = [], None
    for name in texts:
        prompt = text_prompt(model, name)
        engines = _engines(model, arms, prompt, backend_factory)
        source = next(iter(engines.values())).describe()
        start = len(model.tokenizer.encode(prompt)) - 1
        runs = {a: [] for a in arms}
        steps = {a: [] for a in arms}
        for eng in engines.values():                  # untimed: every graph captured before
            _timed(eng, start, new_tokens)
            _step_seconds(eng, start, 2)
        for _ in range(reps):
            for a, eng in engines.items():            # interleaved: every arm in every rep
                runs[a].append(_timed(eng, start, new_tokens))
                steps[a].append(_step_seconds(eng, start, step_reps))
                if bar is not None:
                    bar.update(1)
        one_ms = [1e3 * r[0] / new_tokens for r in runs["draft 0"]]
        ms0, se0 = _mean_se(one_ms)
        for d, k in ((d, k) for d in drafters for k in drafts):
            a = _arm(d, k)
            made = sum(r[1]["tokens generated"] for r in runs[a])
            verify = sum(r[1]["verify steps"] for r in runs[a])
            E = made / verify if verify else float("nan")
            V, V_se = _mean_se([v / o for v, o in zip(steps[a], steps["draft 0"])])
            ms = [1e3 * r[0] / new_tokens for r in runs[a]]
            msk, sek = _mean_se(ms)
            out.append({
                "text": name, "drafter": d, "draft": k, "tokens_per_step": E, "verify_steps": verify,
                "verify_step_cost": V, "verify_step_cost_se": V_se,
                "verify_step_us": 1e6 * statistics.fmean(steps[a]),
                "one_step_us": 1e6 * statistics.fmean(steps["draft 0"]),
                "ms_per_token": msk, "se": sek, "ms_per_token_one": ms0, "se_one": se0,
                "speedup": ms0 / msk, "predicted_speedup": E / V, "pays": bool(E > V),
                "generated": model.tokenizer.decode(
                    engines[a].tokens(start + 1 + new_tokens)[start + 1:]),
            })
    if bar is not None:
        bar.close()
    return {"what": "when drafting pays: tokens per verify step (E) against the verify step's cost "
                    "in one-token steps (V) on two fixed texts (lab.measure.spec.break_even); "
                    "break-even where E = V",
            "texts": {n: {**TEXTS[n], "source": f"data/corpus.txt[{TEXTS[n]['offset']}:"
                                                f"{TEXTS[n]['offset'] + TEXTS[n]['length']}]",
                          "prompt_chars": len(text_prompt(model, n))} for n in texts},
            "new_tokens": new_tokens, "reps": reps, "step_reps": step_reps, "source": source,
            "rows": out}


def verdict(row: dict) -> str:
    """Whether drafting paid on a break_even row: by the measured speed-up, with what the rule
    (E against V: `pays`) said. E > V predicts a win that a drafting round's other costs (the
    host's read of the device position, once a round) can still eat where E / V is near 1."""
    won, rule = row["speedup"] > 1.0, row["pays"]
    if won == rule:
        return "pays (E > V)" if won else "does not pay (E <= V)"
    return "does not pay (E > V: the round costs more)" if rule else "pays (E <= V)"


def format_break_even(res: dict) -> str:
    """One row per (text, k): E, V, the speed-up measured and predicted, and the verdict (by the
    measured speed-up: `verdict`)."""
    lines = [f"{'text':<10} {'drafter':<7} {'k':>2} {'E tok/step':>10} {'V steps':>8} {'± se':>6} "
             f"{'ms/tok k':>9} {'ms/tok 0':>9} {'speed-up':>8} {'E/V':>6}  verdict"]
    for r in res["rows"]:
        lines.append(f"{r['text']:<10} {r.get('drafter', 'lookup'):<7} {r['draft']:>2} "
                     f"{r['tokens_per_step']:>10.2f} "
                     f"{r['verify_step_cost']:>8.2f} {r['verify_step_cost_se']:>6.2f} "
                     f"{r['ms_per_token']:>9.4f} {r['ms_per_token_one']:>9.4f} "
                     f"{r['speedup']:>8.2f} {r['predicted_speedup']:>6.2f}  "
                     f"{verdict(r)}")
    for n, t in res["texts"].items():
        lines.append(f"  {n}: {t['source']} ({t['what']}), prompt of {t['prompt_chars']} characters")
    if "copy_reach" in res:
        c = res["copy_reach"]
        lines.append(f"  the model's own greedy continuation of {c['text']} follows the repeat for "
                     f"{c['reach']} of {c['tokens']} characters ({c['source']})")
    lines.append(f"({res['source']}; {res['new_tokens']} generated tokens and {res['step_reps']} "
                 f"steps per arm per rep, {res['reps']} reps interleaved)")
    return "\n".join(lines)
