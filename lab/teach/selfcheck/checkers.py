"""The self-check exercises' checkers: each runs the learner's function on its exercise's
cases (lab/teach/selfcheck/exercises.py) and compares it with the project's own code.

A checker raises TypeError only when handed something that is not callable. A wrong, unfinished
or crashing answer is a `CheckResult` with passed=False and a message that names the failing case
(a notebook with unfilled stubs still executes); each check prints a one-line verdict. So is an
answer that calls the reference it is checked against (attn_merge_twin, launch_bill or
LaunchBill.us_per_launch, lab.measure.stats.paired_t or mean_sem): while the learner's function
runs, a profile hook watches for those functions' code, however they were imported.
"""
from __future__ import annotations

import contextlib
import math
import sys
from dataclasses import dataclass

import numpy as np

from .exercises import (VERDICTS, _bills, _merge_cases, _ranked_bill, _replay_fails,
                        _replay_prompts, _t_cases, _verdict_cases)


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


# ================================================================ 1. the split-K merge

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

def check_launch_bill(launches_fn, budget_fn) -> CheckResult:
    """Compare launches_per_token and per_launch_budget_us with the launch bills of simulator
    engines (lab.backend.instrument.launch_bill over a DecodeEngine's launch log), and
    launches_per_token with ranks with a two-rank engine's own bill (DecodeEngine.bill: every rank's
    launches); neither may call launch_bill or LaunchBill.us_per_launch."""
    from lab.backend.instrument import LaunchBill, launch_bill
    _need_callable(launches_fn, "check_launch_bill", "launches_fn")
    _need_callable(budget_fn, "check_launch_bill", "budget_fn")
    refs = (("lab.backend.instrument.launch_bill", launch_bill),
            ("lab.backend.instrument.LaunchBill.us_per_launch", LaunchBill.us_per_launch.fget))

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
        # the engine's two ranks, then eight: every rank issues the same step (lab/engine/ranks.py)
        for r, want in ((ranks, engine_total), (8, engine_total // ranks * 8)):
            name = f"tensor parallel, ranks={r}" + (" (a two-rank engine's bill)" if r == ranks else "")
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

def check_paired_t(fn) -> CheckResult:
    """Compare fn(a, b) with lab.measure.stats.paired_t on 6 cases (incl. identical arrays); fn must
    not call lab.measure.stats.paired_t or mean_sem (paired_test and aa_verdict call paired_t)."""
    from lab.measure.stats import mean_sem
    from lab.measure.stats import paired_t as ref_paired_t
    _need_callable(fn, "check_paired_t")
    refs = (("lab.measure.stats.paired_t", ref_paired_t), ("lab.measure.stats.mean_sem", mean_sem))

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
    """Compare fn(kind, values_by_step, plan_keys_by_step) with lab.teach.audit.audit reports of the
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

MAX_CHECKED_REPLAYS = 64     # the check runs replay_check with the learner's count; cap its cost


def check_replays_needed(fn) -> CheckResult:
    """Run lab.teach.verify.replay_check with fn() replays on each frozen bug from two prompts (one
    ending mid-plan, one ending one token before a plan boundary): every run must fail, i.e.
    expose the bug. One replay misses them all; two miss them after the boundary, where the
    second token is a fresh capture and the frozen value first goes stale at replay 3."""
    from lab.engine.bugs import BUGS
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
