"""Self-check exercises: for each, a spec (the stub's docstring), a stub that returns None, and a
`check_<name>(fn)` that runs the learner's function against the project's own code.

The references are never copies: the split-K merge is `kernels.attention.attn_merge_twin`, the
launch bill is `lab.instrument.launch_bill` over a simulator engine's launch log (with ranks, a
two-rank engine's `RankedEngine.bill`), the paired t is `lab.stats.paired_t`, the verdicts are
`lab.audit.audit` reports, the replay count is `lab.verify.replay_check` on the frozen bugs of
`lab/bugs.py`. Every check runs on the simulator.

A checker raises TypeError only when handed something that is not callable. A wrong, unfinished
or crashing answer is a `CheckResult` with passed=False and a message that names the failing case
(a notebook with unfilled stubs still executes); each check prints a one-line verdict. So is an
answer that calls the reference it is checked against (attn_merge_twin, launch_bill or
LaunchBill.us_per_launch, lab.stats.paired_t or mean_sem): while the learner's function runs, a
profile hook watches for those functions' code, however they were imported.
"""
from __future__ import annotations

import contextlib
import functools
import math
import sys
from dataclasses import dataclass

import numpy as np

# ---------------------------------------------------------------- the result of a check


@dataclass(frozen=True)
class CheckResult:
    exercise: str
    passed: bool
    message: str      # "" when passed; else the failing case, what came back, what was expected, a hint
    cases: int        # cases run (all of them when passed; up to and including the failing one if not)

    def __bool__(self) -> bool:
        return self.passed

    def line(self) -> str:
        if self.passed:
            return f"{self.exercise}: PASS ({self.cases} cases)"
        return f"{self.exercise}: not yet -- {self.message}"

    def __str__(self) -> str:
        return self.line()


class _Fail(Exception):
    """A failing case inside a checker (never leaves the checker)."""


def _need_callable(fn, check: str, what: str = "fn") -> None:
    if not callable(fn):
        raise TypeError(f"{check}({what}) needs a function, got {type(fn).__name__}: {fn!r}")


@contextlib.contextmanager
def _watching(references):
    """Note, in the yielded list, the names of the `references` ((name, function) pairs) that run
    inside the block: matched by code object, so an alias or an indirect call counts too."""
    codes = {f.__code__: name for name, f in references}
    used: list[str] = []
    previous = sys.getprofile()

    def hook(frame, event, arg):
        if event == "call" and frame.f_code in codes and codes[frame.f_code] not in used:
            used.append(codes[frame.f_code])
        if callable(previous):
            previous(frame, event, arg)

    sys.setprofile(hook if codes else previous)
    try:
        yield used
    finally:
        sys.setprofile(previous)


def _call(fn, case: str, *args, refs=(), **kwargs):
    """Call the learner's function; an exception or a None becomes a failing case, and so does a
    call of one of `refs`, the project's own code that the checker compares against."""
    name = getattr(fn, "__name__", "your function")
    failure = None
    with _watching(refs) as used:
        try:
            out = fn(*args, **kwargs)
        except NotImplementedError:
            failure = f"{name} raises NotImplementedError: the stub is not filled in yet"
        except Exception as exc:   # the learner's bug, reported, never raised
            failure = f"case '{case}': {name} raised {type(exc).__name__}: {exc}"
    if used:
        raise _Fail(f"case '{case}': {name} called {' and '.join(used)}, the project's own code "
                    f"that this checker compares against: write the computation yourself")
    if failure:
        raise _Fail(failure)
    if out is None:
        raise _Fail(f"{name} returned None: fill in the stub (# FILL ME IN)")
    return out


def _run(exercise: str, cases) -> CheckResult:
    """Run `cases` (a generator of checks that raise _Fail) and print the verdict."""
    n = 0
    try:
        for _ in cases:
            n += 1
        res = CheckResult(exercise, True, "", n)
    except _Fail as fail:
        res = CheckResult(exercise, False, str(fail), n + 1)
    print(res.line())
    return res


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


def check_merge_partials(fn) -> CheckResult:
    """Compare fn(part_o, part_ml) with kernels.attention.attn_merge_twin on 5 cases; fn must not
    call attn_merge_twin (attn_combine_twin calls it too)."""
    from kernels.attention import attn_merge_twin
    _need_callable(fn, "check_merge_partials")
    refs = (("kernels.attention.attn_merge_twin", attn_merge_twin),)

    def cases():
        for name, part_o, part_ml, ref, vmax, hint in _merge_cases():
            out = _call(fn, name, part_o.copy(), part_ml.copy(), refs=refs)
            try:
                got = np.asarray(out, np.float64)
            except (TypeError, ValueError):
                raise _Fail(f"case '{name}': returned {type(out).__name__}, not an array") from None
            if got.shape != ref.shape:
                raise _Fail(f"case '{name}': shape {got.shape}, expected {ref.shape} "
                            f"= [n_head * hd] (flatten the heads in order)")
            # The reference sums `splits` float32 terms per element and divides once; a float32
            # or float64 answer summed in another order differs by ~splits * eps(float32) times
            # the magnitude of the averaged values (|v|, not |o|: terms of both signs cancel).
            # 4x margin; relative part for large outputs.
            splits = part_ml.shape[1]
            eps = np.finfo(np.float32).eps
            tol = 4 * splits * eps * vmax + 4 * splits * eps * np.abs(ref)
            with np.errstate(invalid="ignore"):
                bad = ~(np.abs(got - ref) <= tol)        # NaN counts as bad
            if bad.any():
                i = int(np.argmax(bad))
                h, d = divmod(i, part_o.shape[2])
                raise _Fail(f"case '{name}': o[{i}] (head {h}, dim {d}) = {got[i]:.6g}, expected "
                            f"{ref[i]:.6g} (tolerance {tol[i]:.2g}; {int(bad.sum())} of {bad.size} "
                            f"elements off). Hint: {hint}")
            yield name

    return _run("merge_partials", cases())


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
    engine's own bill: launches per token summed over its ranks (RankedEngine.bill)."""
    from collections import Counter

    from lab.ranks import RankedEngine
    eng = RankedEngine(_model(), _sim_cfg(ranks=2))
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
    from lab.engine import DecodeEngine
    from lab.instrument import launch_bill
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


def check_launch_bill(launches_fn, budget_fn) -> CheckResult:
    """Compare launches_per_token and per_launch_budget_us with the launch bills of simulator
    engines (lab.instrument.launch_bill over a DecodeEngine's launch log), and launches_per_token
    with ranks with a two-rank engine's own bill (RankedEngine.bill: every rank's launches);
    neither may call launch_bill or LaunchBill.us_per_launch."""
    from lab.instrument import LaunchBill, launch_bill
    _need_callable(launches_fn, "check_launch_bill", "launches_fn")
    _need_callable(budget_fn, "check_launch_bill", "budget_fn")
    refs = (("lab.instrument.launch_bill", launch_bill),
            ("lab.instrument.LaunchBill.us_per_launch", LaunchBill.us_per_launch.fget))

    def cases():
        for name, b in _bills():
            args = (b.kernels_per_layer, b.layers, b.other_kernels)
            got = _call(launches_fn, name, *args, refs=refs)
            if got != b.launches_per_token:
                raise _Fail(f"case '{name}': launches_per_token{args} = {got!r}, the engine's log "
                            f"counts {b.launches_per_token} launches/token "
                            f"({b.kernels_per_layer} per layer in {b.layers} layers, "
                            f"{b.other_kernels} outside them)")
            yield name
            got = _call(budget_fn, name, b.ms_per_token, b.launches_per_token, refs=refs)
            want = b.us_per_launch
            try:
                ok = math.isclose(float(got), want, rel_tol=1e-9)   # float64 arithmetic only
            except (TypeError, ValueError):
                raise _Fail(f"case '{name}': per_launch_budget_us returned {got!r}, "
                            f"not a number") from None
            if not ok:
                ratio = float(got) / want if want else math.nan
                hint = (" -- that is milliseconds; the budget is in microseconds (x 1000)"
                        if math.isclose(ratio, 1e-3, rel_tol=1e-6) else "")
                raise _Fail(f"case '{name}': per_launch_budget_us({b.ms_per_token:.6g} ms, "
                            f"{b.launches_per_token}) = {float(got):.6g}, the bill says "
                            f"{want:.6g} us/launch{hint}")
            yield name
        (k, layers, other), ranks, engine_total = _ranked_bill()
        # the engine's two ranks, then eight: every rank issues the same step (lab/ranks.py)
        for r, want in ((ranks, engine_total), (8, engine_total // ranks * 8)):
            name = f"tensor parallel, ranks={r}" + (" (a RankedEngine's bill)" if r == ranks else "")
            got = _call(launches_fn, name, k, layers, other, ranks=r, refs=refs)
            if got != want:
                hint = (" -- that multiplies only the layer stack: each rank also issues its own "
                        "launches outside it" if got == k * layers * r + other else "")
                raise _Fail(f"case '{name}': launches_per_token({k}, {layers}, {other}, ranks={r}) "
                            f"= {got!r}, the bill counts {want} ({want // r} on each of {r} "
                            f"ranks){hint}")
            yield name

    return _run("launch_bill", cases())


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


def check_paired_t(fn) -> CheckResult:
    """Compare fn(a, b) with lab.stats.paired_t on 6 cases (incl. identical arrays); fn must not
    call lab.stats.paired_t or mean_sem (paired_test and aa_verdict call paired_t)."""
    from lab.stats import mean_sem
    from lab.stats import paired_t as ref_paired_t
    _need_callable(fn, "check_paired_t")
    refs = (("lab.stats.paired_t", ref_paired_t), ("lab.stats.mean_sem", mean_sem))

    def same(x, y) -> bool:
        if math.isinf(y) or y == 0:
            return x == y                      # the conventions are exact
        return math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-15)   # float64 sums in another order

    def cases():
        for name, a, b, hint in _t_cases():
            want = ref_paired_t(a, b)
            got = _call(fn, name, np.array(a, copy=True), np.array(b, copy=True), refs=refs)
            try:
                got = tuple(float(x) for x in got)
            except (TypeError, ValueError):
                raise _Fail(f"case '{name}': returned {got!r}, expected a tuple "
                            f"(mean_diff, sem, t)") from None
            if len(got) != 3:
                raise _Fail(f"case '{name}': returned {len(got)} numbers, expected 3 "
                            f"(mean_diff, sem, t)")
            for label, g, w in zip(("mean_diff", "sem", "t"), got, want):
                if not same(g, w):
                    extra = ""
                    if label == "sem" and w > 0 and math.isclose(g / w, math.sqrt((len(a) - 1) / len(a)),
                                                                 rel_tol=1e-6):
                        extra = " (that is the population sd, ddof = 0)"
                    elif label == "mean_diff" and math.isclose(g, -w, rel_tol=1e-9):
                        extra = " (sign flipped: d = b - a)"
                    raise _Fail(f"case '{name}': {label} = {g:.6g}, expected {w:.6g}{extra}. "
                                f"Hint: {hint}")
            yield name

    return _run("paired_t", cases())


# ================================================================ 4. the audit verdict

VERDICTS = ("fine", "promote to device memory", "capture key", "unhandled capture key")


def verdict(kind, values_by_step, plan_keys_by_step):
    """Classify a host-computed value that reaches a launch, as lab/audit.py does.

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
    from lab.audit import _arg_value, audit
    from lab.engine import DecodeEngine
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
            from lab.instrument import provenance
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


_VERDICT_HINTS = {
    "fine": "a value that never changes has nothing for a capture to freeze",
    "promote to device memory": "pointers, by-value arguments and host writes are judged by their "
                                "kind: if they change at all (or are host writes) they must live "
                                "in device memory, even when they change only with the plan key",
    "capture key": "grid / block / kernel that change only where the plan key changes are handled "
                   "by capturing one graph per key",
    "unhandled capture key": "group the values by plan key: a launch shape that changes WITHIN one "
                             "key is not handled by the graphs",
}


def check_verdict(fn) -> CheckResult:
    """Compare fn(kind, values_by_step, plan_keys_by_step) with lab.audit.audit reports of the
    clean engine and of LAB_BUG_FROZEN_KV_ROW / CTX_BY_VALUE / POS_OUTSIDE_GRAPH, plus synthetic
    cases."""
    _need_callable(fn, "check_verdict")

    def cases():
        for name, kind, values, keys, want in _verdict_cases():
            got = _call(fn, name, kind, dict(values), dict(keys))
            if got != want:
                shown = list(dict.fromkeys(str(values[p]) for p in sorted(values)))  # step order
                sample = ", ".join(shown[:3]) + (f", ... ({len(shown)} distinct)" if len(shown) > 3 else "")
                extra = "" if got in VERDICTS else f" (not one of {VERDICTS})"
                raise _Fail(f"case '{name}': verdict {got!r}{extra}, the audit says {want!r}; "
                            f"values {sample}. Hint: {_VERDICT_HINTS[want]}")
            yield name

    return _run("verdict", cases())


# ================================================================ 5. how many replays?

def replays_needed():
    """How many consecutive graph replays should a replay test (lab.verify.replay_check) run,
    at the least, to expose a host value frozen at capture (the "frozen" bugs of lab/bugs.py)?

    Replay 1 is the step that was captured: its frozen value is still right. A plan change can
    re-capture along the way and make a later replay right again. The checker runs your number
    on every frozen bug, from a prompt that ends mid-plan and from one that ends one token
    before a plan boundary; it must expose each of them. A floor, not a proof: a real test also
    runs many more, across plan boundaries and after a request reset.
    """
    # FILL ME IN
    return None


MAX_CHECKED_REPLAYS = 64     # the check runs replay_check with the learner's count; cap its cost


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
    from lab.engine import DecodeEngine
    from lab.verify import replay_check
    ids = _replay_prompts()[prompt][1]
    rep = replay_check(DecodeEngine(_model(), _sim_cfg(bugs={bug})), [ids], replays=replays)
    return rep.checks[0].first_mismatch


def check_replays_needed(fn) -> CheckResult:
    """Run lab.verify.replay_check with fn() replays on each frozen bug from two prompts (one
    ending mid-plan, one ending one token before a plan boundary): every run must fail, i.e.
    expose the bug. One replay misses them all; two miss them after the boundary, where the
    second token is a fresh capture and the frozen value first goes stale at replay 3."""
    from lab.bugs import BUGS
    _need_callable(fn, "check_replays_needed")
    frozen = [name for name, b in BUGS.items() if b.kind == "frozen"]

    def cases():
        n = _call(fn, "replays_needed()")
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise _Fail(f"replays_needed() returned {n!r}: expected a whole number >= 1")
        n = int(n)
        if n > MAX_CHECKED_REPLAYS:
            raise _Fail(f"replays_needed() = {n}: this check runs at most {MAX_CHECKED_REPLAYS} "
                        f"replays; give the least a replay test should run")
        for p, (label, _) in enumerate(_replay_prompts()):
            for bug in frozen:
                if _replay_fails(bug, p, n) is None:
                    first = _replay_fails(bug, p, n + 1)
                    why = ("replay 1 is the captured step itself, where the frozen value is "
                           "still right" if n == 1 else
                           f"the plan changes after the first token, so replay 2 is captured "
                           f"afresh and right again; the frozen value first shows at replay "
                           f"{first}. Three consecutive replays are a useful minimum, not a "
                           f"theorem")
                    raise _Fail(f"case '{BUGS[bug].env}, {label}': replay_check with {n} "
                                f"replay(s) PASSES -- the frozen bug goes unseen. Hint: {why}")
                yield f"{bug}, {label}"

    return _run("replays_needed", cases())
