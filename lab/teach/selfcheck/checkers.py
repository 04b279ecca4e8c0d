"""The self-check exercises' checks: each runs the student's function on its cases and compares
it with the lab's own code on the simulator; `EXERCISES` holds them as Exercises
(lab/teach/exercise.py), with the statements and stubs of exercises.py.

  check_merge_partials   kernels.attention.attn_merge_twin on realistic split-K partials
  check_launch_bill      launch_bill over simulator engines' logs; a two-rank engine's bill
  check_paired_t         lab.measure.stats.paired_t
  check_verdict          lab.measure.audit.audit reports of the clean engine and three bugs
  check_replays_needed   lab.measure.replay_check.replay_check on every frozen bug

A check raises TypeError only when handed something that is not callable. A wrong, unfinished
or crashing answer is a CheckResult with passed=False whose message names the failing case; so
is an answer that calls the code it is checked against (a profile hook watches for it, however
it was imported).
"""
from __future__ import annotations

import functools
import inspect
import math

import numpy as np

from lab.teach.exercise import CheckResult, Exercise, Fail, run_cases, watching
from . import exercises
from .exercises import VERDICTS


def _need_callable(fn, check: str, what: str = "fn") -> None:
    if not callable(fn):
        raise TypeError(f"{check}({what}) needs a function, got {type(fn).__name__}: {fn!r}")


def _call(fn, case: str, *args, refs=(), **kwargs):
    """Call the learner's function; an exception or a None becomes a failing case, and so does a
    call of one of `refs`, the project's own code that the checker compares against."""
    name = getattr(fn, "__name__", "your function")
    failure = None
    with watching(refs) as used:
        try:
            out = fn(*args, **kwargs)
        except NotImplementedError:
            failure = f"{name} raises NotImplementedError: the stub is not filled in yet"
        except Exception as exc:   # the learner's bug, reported, never raised
            failure = f"case '{case}': {name} raised {type(exc).__name__}: {exc}"
    if used:
        raise Fail(f"case '{case}': {name} called {' and '.join(used)}, the project's own code "
                   f"that this checker compares against: write the computation yourself")
    if failure:
        raise Fail(failure)
    if out is None:
        raise Fail(f"{name} returned None: fill in the stub (# FILL ME IN)")
    return out


# ---------------------------------------------------------------- the cases

@functools.lru_cache(maxsize=1)
def _model():
    from lab.model import load_model
    return load_model()


def _sim_cfg(**changes):
    from lab.config import LabConfig
    return LabConfig(backend="sim", **changes)


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


@functools.lru_cache(maxsize=1)
def _verdict_cases():
    """(name, kind, values, keys, expected) from real audits on the simulator, plus synthetic."""
    from lab.engine.runner import DecodeEngine
    from lab.measure.audit import arg_value, audit
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
                    items += [(n, *arg_value(provenance(a)))
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
    from lab.measure.replay_check import replay_check
    ids = _replay_prompts()[prompt][1]
    rep = replay_check(DecodeEngine(_model(), _sim_cfg(bugs={bug})), [ids], replays=replays)
    return rep.checks[0].first_mismatch



# ================================================================ 1. the split-K merge

def merge_partials_cases(fn):
    """The cases of check_merge_partials: a generator that raises Fail at the first wrong one."""
    from kernels.attention import attn_merge_twin
    refs = (("kernels.attention.attn_merge_twin", attn_merge_twin),)
    for name, part_o, part_ml, ref, vmax, hint in _merge_cases():
        out = _call(fn, name, part_o.copy(), part_ml.copy(), refs=refs)
        try:
            got = np.asarray(out, np.float64)
        except (TypeError, ValueError):
            raise Fail(f"case '{name}': returned {type(out).__name__}, not an array") from None
        if got.shape != ref.shape:
            raise Fail(f"case '{name}': shape {got.shape}, expected {ref.shape} "
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
            raise Fail(f"case '{name}': o[{i}] (head {h}, dim {d}) = {got[i]:.6g}, expected "
                       f"{ref[i]:.6g} (tolerance {tol[i]:.2g}; {int(bad.sum())} of {bad.size} "
                       f"elements off). Hint: {hint}")
        yield name


def check_merge_partials(fn) -> CheckResult:
    """Compare fn(part_o, part_ml) with kernels.attention.attn_merge_twin on 5 cases; fn must not
    call attn_merge_twin (attn_combine_twin calls it too)."""
    _need_callable(fn, "check_merge_partials")
    return run_cases("merge_partials", merge_partials_cases(fn))


# ================================================================ 2. the launch bill

def launch_bill_cases(launches_fn, budget_fn):
    """The cases of check_launch_bill: a generator that raises Fail at the first wrong one."""
    from lab.backend.instrument import LaunchBill, launch_bill
    refs = (("lab.backend.instrument.launch_bill", launch_bill),
            ("lab.backend.instrument.LaunchBill.us_per_launch", LaunchBill.us_per_launch.fget))
    for name, b in _bills():
        args = (b.kernels_per_layer, b.layers, b.other_kernels)
        got = _call(launches_fn, name, *args, refs=refs)
        if got != b.launches_per_token:
            raise Fail(f"case '{name}': launches_per_token{args} = {got!r}, the engine's log "
                       f"counts {b.launches_per_token} launches/token "
                       f"({b.kernels_per_layer} per layer in {b.layers} layers, "
                       f"{b.other_kernels} outside them)")
        yield name
        got = _call(budget_fn, name, b.ms_per_token, b.launches_per_token, refs=refs)
        want = b.us_per_launch
        try:
            ok = math.isclose(float(got), want, rel_tol=1e-9)   # float64 arithmetic only
        except (TypeError, ValueError):
            raise Fail(f"case '{name}': per_launch_budget_us returned {got!r}, "
                       f"not a number") from None
        if not ok:
            ratio = float(got) / want if want else math.nan
            hint = (" -- that is milliseconds; the budget is in microseconds (x 1000)"
                    if math.isclose(ratio, 1e-3, rel_tol=1e-6) else "")
            raise Fail(f"case '{name}': per_launch_budget_us({b.ms_per_token:.6g} ms, "
                       f"{b.launches_per_token}) = {float(got):.6g}, the bill says "
                       f"{want:.6g} us/launch{hint}")
        yield name
    (k, layers, other), ranks, engine_total = _ranked_bill()
    # the engine's two ranks, then eight: every rank issues the same step (lab/engine/ranks.py)
    for r, want in ((ranks, engine_total), (8, engine_total // ranks * 8)):
        name = f"tensor parallel, ranks={r}" + (" (a two-rank engine's bill)" if r == ranks else "")
        got = _call(launches_fn, name, k, layers, other, ranks=r, refs=refs)
        if got != want:
            hint = (" -- that multiplies only the layer stack: each rank also issues its own "
                    "launches outside it" if got == k * layers * r + other else "")
            raise Fail(f"case '{name}': launches_per_token({k}, {layers}, {other}, ranks={r}) "
                       f"= {got!r}, the bill counts {want} ({want // r} on each of {r} "
                       f"ranks){hint}")
        yield name


def check_launch_bill(launches_fn, budget_fn) -> CheckResult:
    """Compare launches_per_token and per_launch_budget_us with the launch bills of simulator
    engines (lab.backend.instrument.launch_bill over a DecodeEngine's launch log), and
    launches_per_token with ranks with a two-rank engine's own bill (DecodeEngine.bill: every rank's
    launches); neither may call launch_bill or LaunchBill.us_per_launch."""
    _need_callable(launches_fn, "check_launch_bill", "launches_fn")
    _need_callable(budget_fn, "check_launch_bill", "budget_fn")
    return run_cases("launch_bill", launch_bill_cases(launches_fn, budget_fn))


# ================================================================ 3. the paired t

def paired_t_cases(fn):
    """The cases of check_paired_t: a generator that raises Fail at the first wrong one."""
    from lab.measure.stats import mean_sem
    from lab.measure.stats import paired_t as ref_paired_t
    refs = (("lab.measure.stats.paired_t", ref_paired_t), ("lab.measure.stats.mean_sem", mean_sem))

    def same(x, y) -> bool:
        if math.isinf(y) or y == 0:
            return x == y                      # the conventions are exact
        return math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-15)   # float64 sums in another order
    for name, a, b, hint in _t_cases():
        want = ref_paired_t(a, b)
        got = _call(fn, name, np.array(a, copy=True), np.array(b, copy=True), refs=refs)
        try:
            got = tuple(float(x) for x in got)
        except (TypeError, ValueError):
            raise Fail(f"case '{name}': returned {got!r}, expected a tuple "
                       f"(mean_diff, sem, t)") from None
        if len(got) != 3:
            raise Fail(f"case '{name}': returned {len(got)} numbers, expected 3 "
                       f"(mean_diff, sem, t)")
        for label, g, w in zip(("mean_diff", "sem", "t"), got, want):
            if not same(g, w):
                extra = ""
                if label == "sem" and w > 0 and math.isclose(g / w, math.sqrt((len(a) - 1) / len(a)),
                                                             rel_tol=1e-6):
                    extra = " (that is the population sd, ddof = 0)"
                elif label == "mean_diff" and math.isclose(g, -w, rel_tol=1e-9):
                    extra = " (sign flipped: d = b - a)"
                raise Fail(f"case '{name}': {label} = {g:.6g}, expected {w:.6g}{extra}. "
                           f"Hint: {hint}")
        yield name


def check_paired_t(fn) -> CheckResult:
    """Compare fn(a, b) with lab.measure.stats.paired_t on 6 cases (incl. identical arrays); fn must
    not call lab.measure.stats.paired_t or mean_sem (paired_test and aa_verdict call paired_t)."""
    _need_callable(fn, "check_paired_t")
    return run_cases("paired_t", paired_t_cases(fn))


# ================================================================ 4. the audit verdict

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


def verdict_cases(fn):
    """The cases of check_verdict: a generator that raises Fail at the first wrong one."""
    for name, kind, values, keys, want in _verdict_cases():
        got = _call(fn, name, kind, dict(values), dict(keys))
        if got != want:
            shown = list(dict.fromkeys(str(values[p]) for p in sorted(values)))  # step order
            sample = ", ".join(shown[:3]) + (f", ... ({len(shown)} distinct)" if len(shown) > 3 else "")
            extra = "" if got in VERDICTS else f" (not one of {VERDICTS})"
            raise Fail(f"case '{name}': verdict {got!r}{extra}, the audit says {want!r}; "
                       f"values {sample}. Hint: {_VERDICT_HINTS[want]}")
        yield name


def check_verdict(fn) -> CheckResult:
    """Compare fn(kind, values_by_step, plan_keys_by_step) with lab.measure.audit.audit reports of the
    clean engine and of LAB_BUG_FROZEN_KV_ROW / CTX_BY_VALUE / POS_OUTSIDE_GRAPH, plus synthetic
    cases."""
    _need_callable(fn, "check_verdict")
    return run_cases("verdict", verdict_cases(fn))


# ================================================================ 5. how many replays?

MAX_CHECKED_REPLAYS = 64     # the check runs replay_check with the learner's count; cap its cost


def replays_needed_cases(fn):
    """The cases of check_replays_needed: a generator that raises Fail at the first wrong one."""
    from lab.engine.bugs import BUGS
    frozen = [name for name, b in BUGS.items() if b.kind == "frozen"]
    n = _call(fn, "replays_needed()")
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise Fail(f"replays_needed() returned {n!r}: expected a whole number >= 1")
    n = int(n)
    if n > MAX_CHECKED_REPLAYS:
        raise Fail(f"replays_needed() = {n}: this check runs at most {MAX_CHECKED_REPLAYS} "
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
                raise Fail(f"case '{BUGS[bug].env}, {label}': replay_check with {n} "
                           f"replay(s) PASSES -- the frozen bug goes unseen. Hint: {why}")
            yield f"{bug}, {label}"


def check_replays_needed(fn) -> CheckResult:
    """Run lab.measure.replay_check.replay_check with fn() replays on each frozen bug from two prompts (one
    ending mid-plan, one ending one token before a plan boundary): every run must fail, i.e.
    expose the bug. One replay misses them all; two miss them after the boundary, where the
    second token is a fresh capture and the frozen value first goes stale at replay 3."""
    _need_callable(fn, "check_replays_needed")
    return run_cases("replays_needed", replays_needed_cases(fn))


# ================================================================ the exercises

def _solution_cases(names: tuple[str, ...], cases):
    """An Exercise's cases(solution, backend): the solution's functions `names`, checked by
    `cases` (every check runs on the simulator)."""
    def run(solution, backend: str = "sim"):
        fns = []
        for name in names:
            fn = getattr(solution, name, None)
            if not callable(fn):
                raise Fail(f"the solution defines no function {name}: start from the stub "
                           f"(lab/teach/selfcheck/exercises.py)")
            fns.append(fn)
        yield from cases(*fns)
    return run


def _exercise(name: str, title: str, section: str, stubs, cases) -> Exercise:
    names = tuple(f.__name__ for f in stubs)
    statement = "\n\n".join(f"{f.__name__}: {inspect.getdoc(f)}" for f in stubs)
    stub = "\n\n\n".join(inspect.getsource(f).strip() for f in stubs) + "\n"
    return Exercise(name, None, title, section, statement, stub, names,
                    _solution_cases(names, cases), stub_says="returned None")


EXERCISES: dict[str, Exercise] = {e.name: e for e in (
    _exercise("merge_partials", "the split-K softmax merge", "§6",
              (exercises.merge_partials,), merge_partials_cases),
    _exercise("launch_bill", "the launch bill: launches per token and the us each may cost",
              "§Overview", (exercises.launches_per_token, exercises.per_launch_budget_us),
              launch_bill_cases),
    _exercise("paired_t", "the paired difference: mean, standard error, t", "§1",
              (exercises.paired_t,), paired_t_cases),
    _exercise("verdict", "what a capture would freeze: a host value's verdict", "§2",
              (exercises.verdict,), verdict_cases),
    _exercise("replays_needed", "how many replays expose a frozen bug", "§4",
              (exercises.replays_needed,), replays_needed_cases),
)}
