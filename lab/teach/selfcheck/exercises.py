"""Self-check exercises: for each, a spec (the stub's docstring), a stub that returns None, and the
cases its checker (lab/teach/selfcheck/checkers.py) runs the learner's function on.

The references are never copies: the split-K merge is `kernels.attention.attn_merge_twin`, the
launch bill is `lab.backend.instrument.launch_bill` over a simulator engine's launch log (with
ranks, a two-rank engine's `DecodeEngine.bill`), the paired t is `lab.measure.stats.paired_t`, the
verdicts are `lab.teach.audit.audit` reports, the replay count is `lab.teach.verify.replay_check` on
the frozen bugs of `lab/engine/bugs.py`. Every check runs on the simulator. Fill in the stubs in a
file of your own (`decode-lab selfcheck --solutions FILE` checks it) or in notebook 08.
"""
from __future__ import annotations

import functools
import math

import numpy as np


@functools.lru_cache(maxsize=1)
def _model():
    from lab.model import load_model
    return load_model()


def _sim_cfg(**changes):
    from lab.config import LabConfig
    return LabConfig(backend="sim", **changes)


# ================================================================ 1. the split-K merge

def merge_partials(part_o, part_ml):
    """Merge split-K attention partials into the attention output o.

    part_o  [n_head, splits, hd]  float32: slice s of head h, sum_t exp(score_t - m_s) * v_t
    part_ml [n_head, splits, 2]   float32: (m_s, l_s) = (max score in the slice,
                                           sum_t exp(score_t - m_s))
    returns o [n_head * hd]: per head h,
        M = max_s m_s,  L = sum_s l_s * exp(m_s - M),
        o[h*hd:(h+1)*hd] = sum_s part_o[h, s] * exp(m_s - M) / L
    An empty slice (splits > context length) has m_s = -inf, l_s = 0, part_o = 0 and must weigh
    nothing. Slice 0 is never empty.
    """
    # FILL ME IN
    return None


def _merge_case(name, n_head, splits, hd, L, q_scale, seed, hint):
    """Realistic partials: the project's attn_partial twin on random q, K, V at context L."""
    from kernels.attention import attn_merge_twin, attn_partial_twin
    rng = np.random.default_rng(seed)
    D = n_head * hd
    q = (q_scale * rng.standard_normal(D)).astype(np.float32)               # [D]
    k = rng.standard_normal((L, D)).astype(np.float32)                      # [L, D]
    k *= rng.uniform(0.2, 3.0, (L, 1)).astype(np.float32)  # uneven norms: slice maxima differ
    v = rng.standard_normal((L, D)).astype(np.float32)                      # [L, D]
    part_o = np.zeros((n_head, splits, hd), np.float32)
    part_ml = np.zeros((n_head, splits, 2), np.float32)
    attn_partial_twin((n_head, splits), (hd,), q, k, v, np.array([L - 1], np.int32),
                      part_o, part_ml, np.float32(1.0 / math.sqrt(hd)))
    ref = np.empty(D, np.float32)
    attn_merge_twin((n_head,), (hd,), part_o, part_ml, ref)
    return name, part_o, part_ml, ref, float(np.abs(v).max()), hint


@functools.lru_cache(maxsize=1)
def _merge_cases():
    rescale = "weigh slice s by exp(m_s - M): part_o and l_s are relative to the slice's own max"
    return [
        _merge_case("one slice per head, context 5", 2, 1, 8, 5, 1.0, 0, "with one slice, o = part_o / l"),
        _merge_case("4 slices with different maxima, context 100", 4, 4, 16, 100, 4.0, 1, rescale),
        _merge_case("splits 8 > context 3 (5 empty slices: m = -inf, l = 0)", 2, 8, 8, 3, 2.0, 2,
                    "an empty slice must weigh 0: exp(-inf - M) = 0; avoid 0 * inf and 0 / 0"),
        _merge_case("huge scores (m up to ~900: exp(m) overflows even float64)", 2, 4, 16, 64, 150.0, 3,
                    "subtract the max M before exponentiating: exp(m_s - M) <= 1 never overflows"),
        _merge_case("model dims: 4 heads x 64, 32 slices, context 1000", 4, 32, 64, 1000, 3.0, 4,
                    rescale),
    ]


# ================================================================ 2. the launch bill

def launches_per_token(kernels_per_layer, layers, other, ranks=1):
    """Kernel launches per decoded token, counted over every rank.

    kernels_per_layer  launches issued by one transformer layer on one rank
    layers             layers in the stack
    other              launches outside the layer stack on one rank (embedding, final norm,
                       head, sampling...)
    ranks              tensor-parallel ranks, one GPU each: every rank issues the whole step,
                       its share of each layer and its own launches outside the stack
    """
    # FILL ME IN
    return None


def per_launch_budget_us(ms_per_token, launches):
    """The time each launch may take, in MICROseconds, when a token takes `ms_per_token`
    MILLIseconds and issues `launches` launches."""
    # FILL ME IN
    return None


@functools.lru_cache(maxsize=1)
def _ranked_bill():
    """(kernels/layer, layers, other) on one rank of a two-rank simulator engine, and the
    engine's own bill: launches per token summed over its ranks (DecodeEngine.bill)."""
    from collections import Counter

    from lab.engine.runner import DecodeEngine
    eng = DecodeEngine(_model(), _sim_cfg(ranks=2))
    plan = eng.plan()
    shapes = set()
    for rank in range(eng.ranks):
        per_layer = Counter(launch.layer for launch in eng.step_launches(plan, rank))
        other = per_layer.pop(None, 0)
        if len(set(per_layer.values())) != 1:
            raise RuntimeError(f"rank {rank}'s layers issue different launch counts: {per_layer}")
        shapes.add((next(iter(per_layer.values())), len(per_layer), other))
    if len(shapes) != 1:
        raise RuntimeError(f"the ranks issue different steps: {shapes}")
    bill = eng.bill(plan)
    eng.close()
    return shapes.pop(), bill["ranks"], bill["launches_per_token"]


@functools.lru_cache(maxsize=1)
def _bills():
    """Launch bills from simulator engines' logs: eager and graph, one and two combine kernels."""
    from lab.backend.instrument import launch_bill
    from lab.engine.runner import DecodeEngine
    bills = []
    for split in (False, True):
        for graph in (False, True):
            eng = DecodeEngine(_model(), _sim_cfg(graph=graph, split_combine=split))
            gen = eng.generate("ROMEO.\n", 8)
            # in graph mode the launches are logged when a step is captured
            step = next(r.step for r in reversed(eng.log.records) if r.kind in ("eager", "capture"))
            mode = "graph" if graph else "eager"
            bills.append((f"{mode}, split_combine={split}",
                          launch_bill(eng.log, step, mode, gen.ms_per_token, gen.source)))
    return bills


# ================================================================ 3. the paired t

def paired_t(a, b):
    """Paired difference d = b - a over reps (a[i] and b[i] are rep i of arms A and B).

    returns (mean_diff, sem, t): mean of d, its standard error (SAMPLE sd of d, ddof = 1,
    divided by sqrt(n)), and t = mean_diff / sem. When every difference is identical (sem = 0):
    t = 0.0 if mean_diff == 0, else +inf or -inf with the sign of mean_diff.
    """
    # FILL ME IN
    return None


def _t_cases():
    rng = np.random.default_rng(7)
    a5 = np.array([1.20, 1.31, 1.18, 1.25, 1.22])
    a20 = 1.0 + 0.05 * rng.standard_normal(20)
    return [
        ("5 reps, B slower by ~0.02", a5, a5 + np.array([0.02, 0.03, 0.01, 0.025, 0.015]),
         "d = b - a; sem uses the sample sd (ddof = 1)"),
        ("20 reps, drifting arms, B faster", a20 + np.linspace(0, 0.2, 20),
         a20 + np.linspace(0, 0.2, 20) - 0.004 + 0.003 * rng.standard_normal(20),
         "pair rep i of A with rep i of B: the drift cancels in d"),
        ("2 reps (the smallest n with a sem)", np.array([3.0, 5.0]), np.array([4.0, 5.5]),
         "sem = sd(d, ddof=1) / sqrt(n)"),
        ("identical arrays", a5, a5.copy(), "no difference and no noise: t = 0.0, not nan"),
        ("constant shift +0.5", a5, a5 + 0.5, "sem = 0 and mean > 0: t = +inf"),
        ("constant shift -1 (integers)", [4, 5, 6], [3, 4, 5], "sem = 0 and mean < 0: t = -inf"),
    ]


# ================================================================ 4. the audit verdict

VERDICTS = ("fine", "promote to device memory", "capture key", "unhandled capture key")


def verdict(kind, values_by_step, plan_keys_by_step):
    """Classify a host-computed value that reaches a launch, as lab/teach/audit.py does.

    kind               "pointer", "by value", "host write" (an upload between steps),
                       "grid", "block" or "kernel"
    values_by_step     {position: the value at that step}
    plan_keys_by_step  {position: the step's plan key (decode_plan(position).key)}
    returns one of
      "fine"                      the same value at every step (nothing for a capture to freeze)
      "promote to device memory"  a pointer or by-value argument that changes between steps,
                                  or any host write (a replay never re-runs it)
      "capture key"               grid / block / kernel that changes, but is constant within
                                  every plan key (one graph per key handles it)
      "unhandled capture key"     grid / block / kernel that changes within one plan key
    Values compare by their str().
    """
    # FILL ME IN
    return None


@functools.lru_cache(maxsize=1)
def _verdict_cases():
    """(name, kind, values, keys, expected) from real audits on the simulator, plus synthetic."""
    from lab.engine.runner import DecodeEngine
    from lab.teach.audit import _arg_value, audit
    cases = []
    for bug in (None, "frozen_kv_row", "ctx_by_value", "pos_outside_graph"):
        eng = DecodeEngine(_model(), _sim_cfg(bugs={bug} if bug else set()))
        rep = audit(eng)
        keys = {p: eng.plan(p).key for p in rep.positions}
        label = f"LAB_BUG_{bug.upper()}" if bug else "clean engine"
        flagged = set()
        for v in rep.varying:
            want = (v.verdict if v.verdict != "capture key" or v.handled
                    else "unhandled capture key")
            cases.append((f"{label}: launch {v.index} {v.kernel}.{v.what} ({v.kind})",
                          v.kind, dict(v.values), keys, want))
            flagged.add((v.index, v.what))
        if bug is None:   # what the audit did NOT flag is fine: read it from the step's launches
            from lab.backend.instrument import provenance
            seen: dict = {}
            for p in rep.positions:
                for i, launch in enumerate(eng.step_launches(eng.plan(p))[:5]):
                    items = [("kernel", "kernel", launch.name), ("grid", "grid", launch.grid),
                             ("block", "block", launch.block)]
                    items += [(n, *_arg_value(provenance(a)))
                              for n, a in zip(launch.kernel.arg_names, launch.args)]
                    for what, kind, value in items:
                        seen.setdefault((i, launch.name, what, kind), {})[p] = value
            for (i, kname, what, kind), values in seen.items():
                if (i, what) not in flagged:
                    cases.append((f"{label}: launch {i} {kname}.{what} ({kind})", kind, values,
                                  keys, "fine"))
            grid = next(v for v in rep.varying if v.what == "grid")
            clean_keys = keys
    # synthetic, from the clean engine's real values
    one_key = {p: ("one graph for every position",) for p in grid.values}
    cases.append(("synthetic: attn_partial grid with ONE plan key for all positions", "grid",
                  dict(grid.values), one_key, "unhandled capture key"))
    cases.append(("synthetic: a by-value splits count that changes only with the plan key",
                  "by value", {p: repr(clean_keys[p][1]) for p in grid.values}, clean_keys,
                  "promote to device memory"))
    cases.append(("synthetic: a block shape constant over all steps", "block",
                  {p: (64,) for p in grid.values}, clean_keys, "fine"))
    return cases


# ================================================================ 5. how many replays?

def replays_needed():
    """How many consecutive graph replays should a replay test (lab.teach.verify.replay_check) run,
    at the least, to expose a host value frozen at capture (the "frozen" bugs of
    lab/engine/bugs.py)?

    Replay 1 is the step that was captured: its frozen value is still right. A plan change can
    re-capture along the way and make a later replay right again. The checker runs your number
    on every frozen bug, from a prompt that ends mid-plan and from one that ends one token
    before a plan boundary; it must expose each of them. A floor, not a proof: a real test also
    runs many more, across plan boundaries and after a request reset.
    """
    # FILL ME IN
    return None


@functools.lru_cache(maxsize=1)
def _replay_prompts():
    """(label, token ids): a prompt that ends mid-plan, and one whose first decoded token is the
    last of its plan (the second starts a new plan key, so it is captured afresh)."""
    from lab.plan import plan_boundaries
    short = _model().tokenizer.encode("ROMEO.\n")
    boundary = plan_boundaries(_model().cfg.max_seq)[0]
    # prompt ingestion covers positions 0 .. P-2, so the first decoded token is at P-1
    long = np.resize(short, boundary)
    return (("a prompt that ends mid-plan", short),
            (f"a prompt ending one token before the plan boundary at position {boundary}", long))


@functools.lru_cache(maxsize=None)
def _replay_fails(bug: str, prompt: int, replays: int) -> int | None:
    """First mismatching replay of replay_check(replays) on a fresh sim engine with `bug`, from
    prompt number `prompt` of _replay_prompts(); None when every replay matched."""
    from lab.engine.runner import DecodeEngine
    from lab.teach.verify import replay_check
    ids = _replay_prompts()[prompt][1]
    rep = replay_check(DecodeEngine(_model(), _sim_cfg(bugs={bug})), [ids], replays=replays)
    return rep.checks[0].first_mismatch
