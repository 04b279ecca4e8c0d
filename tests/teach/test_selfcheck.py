"""Self-check exercises (lab/selfcheck): a correct solution passes, the stub and plausible wrong
solutions get a "not yet" with a message that names the failing case, and nothing but a
non-callable makes a checker raise. The solutions live here, never in the package."""
import math
import sys

import numpy as np
import pytest

from kernels.attention import attn_combine_twin
from kernels.attention import attn_merge_twin as twin_under_an_alias
from lab.backend.instrument import LaunchBill
from lab.measure import stats
from lab.teach import selfcheck as sc


def _not_yet(res, *words):
    assert isinstance(res, sc.CheckResult)
    assert not res.passed and not res
    for w in words:
        assert w in res.message, res.message
    assert res.line().startswith(f"{res.exercise}: not yet -- ")


# ---------------------------------------------------------------- merge_partials

def merge_ok(part_o, part_ml):
    m, l = part_ml[..., 0], part_ml[..., 1]                      # [H, S]
    w = np.exp(m - m.max(axis=1, keepdims=True))                 # [H, S]
    return ((part_o * w[..., None]).sum(1) / (l * w).sum(1)[:, None]).reshape(-1)


def merge_ok_f64_loop(part_o, part_ml):   # another order, another precision: still within tolerance
    H, S, hd = part_o.shape
    o = np.zeros((H, hd))
    for h in range(H):
        M = max(float(part_ml[h, s, 0]) for s in range(S))
        L = sum(float(part_ml[h, s, 1]) * math.exp(float(part_ml[h, s, 0]) - M) for s in range(S))
        for s in range(S):
            o[h] += part_o[h, s].astype(np.float64) * math.exp(float(part_ml[h, s, 0]) - M)
        o[h] /= L
    return o.reshape(-1)


def merge_no_rescale(part_o, part_ml):
    return (part_o.sum(1) / part_ml[..., 1].sum(1)[:, None]).reshape(-1)


def merge_no_max(part_o, part_ml):    # exp(m_s) instead of exp(m_s - M): overflows for large m
    with np.errstate(all="ignore"):
        w = np.exp(part_ml[..., 0])
        return ((part_o * w[..., None]).sum(1) / (part_ml[..., 1] * w).sum(1)[:, None]).reshape(-1)


def merge_unflattened(part_o, part_ml):
    return merge_ok(part_o, part_ml).reshape(part_o.shape[0], -1)


def test_merge_partials(capsys):
    assert sc.check_merge_partials(merge_ok).passed
    assert sc.check_merge_partials(merge_ok_f64_loop).passed
    assert "merge_partials: PASS (5 cases)" in capsys.readouterr().out
    _not_yet(sc.check_merge_partials(sc.merge_partials), "None", "FILL ME IN")
    _not_yet(sc.check_merge_partials(merge_no_rescale), "4 slices with different maxima", "exp(m_s - M)")
    _not_yet(sc.check_merge_partials(merge_no_max), "huge scores", "nan")
    _not_yet(sc.check_merge_partials(merge_unflattened), "shape (2, 8)", "n_head * hd")
    assert "merge_partials: not yet" in capsys.readouterr().out


# ---------------------------------------------------------------- the launch bill

def launches_ok(kernels_per_layer, layers, other, ranks=1):
    return (kernels_per_layer * layers + other) * ranks


def budget_ok(ms_per_token, launches):
    return 1000.0 * ms_per_token / launches


def test_launch_bill():
    assert sc.check_launch_bill(launches_ok, budget_ok).passed
    _not_yet(sc.check_launch_bill(sc.launches_per_token, sc.per_launch_budget_us), "None")
    _not_yet(sc.check_launch_bill(launches_ok, sc.per_launch_budget_us), "per_launch_budget_us", "None")
    _not_yet(sc.check_launch_bill(launches_ok, lambda ms, n: ms / n),
             "eager, split_combine=False", "milliseconds")
    _not_yet(sc.check_launch_bill(lambda k, l, o, ranks=1: k * l, budget_ok),
             "eager, split_combine=False", "launches_per_token(8, 4, 5)", "37")
    # the bill with ranks is the engine's (DecodeEngine.bill): every rank issues its whole step
    _not_yet(sc.check_launch_bill(lambda k, l, o, ranks=1: k * l * ranks + o, budget_ok),
             "ranks=2 (a two-rank engine's bill)", "launches_per_token(9, 4, 5, ranks=2) = 77",
             "the bill counts 82", "multiplies only the layer stack")
    _not_yet(sc.check_launch_bill(lambda k, l, o, ranks=1: (k * l + o) * min(ranks, 2), budget_ok),
             "ranks=8", "the bill counts 328")


# ---------------------------------------------------------------- paired_t

def paired_t_ok(a, b):
    d = np.asarray(b, float) - np.asarray(a, float)
    mean, sem = d.mean(), d.std(ddof=1) / math.sqrt(d.size)
    if sem == 0:
        return mean, sem, (0.0 if mean == 0 else math.copysign(math.inf, mean))
    return mean, sem, mean / sem


def paired_t_population_sd(a, b):
    d = np.asarray(b, float) - np.asarray(a, float)
    mean, sem = d.mean(), d.std() / math.sqrt(d.size)
    return mean, sem, (mean / sem if sem else 0.0)


def paired_t_nan_convention(a, b):
    d = np.asarray(b, float) - np.asarray(a, float)
    mean, sem = d.mean(), d.std(ddof=1) / math.sqrt(d.size)
    with np.errstate(all="ignore"):
        return mean, sem, np.float64(mean) / sem


def paired_t_a_minus_b(a, b):
    return paired_t_ok(b, a)


def test_paired_t():
    assert sc.check_paired_t(paired_t_ok).passed
    _not_yet(sc.check_paired_t(sc.paired_t), "None")
    _not_yet(sc.check_paired_t(paired_t_population_sd), "5 reps", "population sd")
    _not_yet(sc.check_paired_t(paired_t_nan_convention), "identical arrays", "t = nan")
    _not_yet(sc.check_paired_t(paired_t_a_minus_b), "5 reps", "sign flipped")
    _not_yet(sc.check_paired_t(lambda a, b: (1.0, 2.0)), "returned 2 numbers")


# ---------------------------------------------------------------- verdict

def verdict_ok(kind, values_by_step, plan_keys_by_step):
    if kind != "host write" and len({str(v) for v in values_by_step.values()}) == 1:
        return "fine"
    if kind not in ("grid", "block", "kernel"):
        return "promote to device memory"
    per_key = {}
    for pos, v in values_by_step.items():
        per_key.setdefault(plan_keys_by_step[pos], set()).add(str(v))
    return "capture key" if all(len(s) == 1 for s in per_key.values()) else "unhandled capture key"


def verdict_ignores_keys(kind, values_by_step, plan_keys_by_step):
    if kind != "host write" and len({str(v) for v in values_by_step.values()}) == 1:
        return "fine"
    return "capture key" if kind in ("grid", "block", "kernel") else "promote to device memory"


def verdict_forgets_host_writes(kind, values_by_step, plan_keys_by_step):
    return verdict_ok("by value" if kind == "host write" else kind, values_by_step, plan_keys_by_step)


def verdict_by_pattern(kind, values_by_step, plan_keys_by_step):
    # judges a by-value scalar by its pattern (constant within a key -> capture key): the audit doesn't
    return verdict_ok("grid" if kind == "by value" else kind, values_by_step, plan_keys_by_step)


def test_verdict():
    assert sc.check_verdict(verdict_ok).passed
    _not_yet(sc.check_verdict(sc.verdict), "None")
    _not_yet(sc.check_verdict(verdict_ignores_keys), "ONE plan key", "unhandled capture key")
    _not_yet(sc.check_verdict(verdict_forgets_host_writes), "LAB_BUG_POS_OUTSIDE_GRAPH",
             "host write", "promote to device memory")
    _not_yet(sc.check_verdict(verdict_by_pattern), "LAB_BUG_CTX_BY_VALUE", "ctx_len")
    _not_yet(sc.check_verdict(lambda *a: "promote"), "clean engine", "not one of")


# ---------------------------------------------------------------- replays_needed

def test_replays_needed():
    assert sc.check_replays_needed(lambda: 3).passed
    assert sc.check_replays_needed(lambda: 8).passed          # capture + 7, as the lecture's PR
    _not_yet(sc.check_replays_needed(sc.replays_needed), "None")
    _not_yet(sc.check_replays_needed(lambda: 1), "ends mid-plan", "PASSES",
             "replay 1 is the captured step")
    # two replays expose every frozen bug mid-plan, and none after a plan boundary
    _not_yet(sc.check_replays_needed(lambda: 2), "one token before the plan boundary",
             "2 replay(s) PASSES", "captured afresh", "first shows at replay 3",
             "useful minimum, not a theorem")
    _not_yet(sc.check_replays_needed(lambda: 65), "at most 64")
    _not_yet(sc.check_replays_needed(lambda: "3"), "whole number")
    _not_yet(sc.check_replays_needed(lambda: 0), "whole number")


def test_the_boundary_prompt_ends_one_token_before_a_plan_boundary():
    from lab.plan import decode_plan
    model = sc.checkers._model()
    (_, short), (_, long) = sc.checkers._replay_prompts()
    first = len(long) - 1                                   # the first decoded token's position
    cfg = sc.checkers._sim_cfg()
    assert decode_plan(first, model.cfg, cfg).key != decode_plan(first + 1, model.cfg, cfg).key
    assert decode_plan(len(short) - 1, model.cfg, cfg).key == decode_plan(len(short) + 1,
                                                                            model.cfg, cfg).key


# ---------------------------------------------------------------- never raises, except on non-callables

@pytest.mark.parametrize("check", [sc.check_merge_partials, sc.check_paired_t, sc.check_verdict,
                                   sc.check_replays_needed])
def test_checkers_report_exceptions_and_refuse_non_callables(check):
    def boom(*args):
        raise ValueError("oops")

    def todo(*args):
        raise NotImplementedError

    _not_yet(check(boom), "raised ValueError: oops")
    _not_yet(check(todo), "NotImplementedError", "not filled in")
    with pytest.raises(TypeError, match="needs a function"):
        check(42)


def test_launch_bill_refuses_non_callables():
    with pytest.raises(TypeError, match="budget_fn"):
        sc.check_launch_bill(launches_ok, 1000.0)


def test_no_solutions_ship():
    import lab.teach.selfcheck.exercises as ex
    for stub in (ex.merge_partials, ex.launches_per_token, ex.per_launch_budget_us, ex.paired_t,
                 ex.verdict, ex.replays_needed):
        assert stub(*([None] * stub.__code__.co_argcount)) is None


def test_one_exercise_type_for_self_check_and_hands_on():
    """The self-check's exercises are the hands-on's Exercise: each stub, run through it, fails
    saying what is missing; a solution without the names fails naming the first one."""
    from lab.teach import handson
    from lab.teach.exercise import Exercise, Source
    assert all(isinstance(e, Exercise) for e in (*sc.EXERCISES.values(),
                                                 *handson.EXERCISES.values()))
    assert [n for e in sc.EXERCISES.values() for n in e.names] == [
        "merge_partials", "launches_per_token", "per_launch_budget_us", "paired_t", "verdict",
        "replays_needed"]
    for e in sc.EXERCISES.values():
        assert e.reference is None and set(e.solutions()) == {"stub"}
        assert e.stub in e.show() and "# FILL ME IN" in e.stub
        _not_yet(e.run(Source("x = 1", "empty").namespace()), f"defines no function {e.names[0]}")
    for name in ("merge_partials", "paired_t", "replays_needed"):    # the cases cheap to build
        e = sc.EXERCISES[name]
        _not_yet(e.run(e.solutions()["stub"].namespace()), e.stub_says, "fill in the stub")


def test_lab_teach_imports_no_private_name():
    """No module of lab/teach imports another's private (_name) names: what is shared is public."""
    import ast
    from pathlib import Path
    root = Path(__file__).resolve().parents[2] / "lab" / "teach"
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module != "__future__":
                found += [f"{path.relative_to(root)}:{node.lineno} {a.name}" for a in node.names
                          if a.name.startswith("_")]
    assert found == []


# ---------------------------------------------------------------- constant answers

def test_constant_answers_do_not_pass():
    _not_yet(sc.check_merge_partials(lambda part_o, part_ml: np.zeros(8)), "shape (8,)")
    # 37 is the clean one-kernel bill: right for split_combine=False, wrong once the combine splits
    _not_yet(sc.check_launch_bill(lambda *a, **k: 37, budget_ok), "split_combine=True", "37")
    _not_yet(sc.check_launch_bill(launches_ok, lambda ms, n: 3.0), "eager, split_combine=False",
             "per_launch_budget_us")
    _not_yet(sc.check_paired_t(lambda a, b: (0.0, 0.0, 0.0)), "5 reps", "mean_diff = 0")
    _not_yet(sc.check_verdict(lambda *a: "fine"), "clean engine", "the audit says")


# ---------------------------------------------------------------- the project's own code: off limits

def merge_via_twin(part_o, part_ml):            # the reference under another name
    o = np.empty(part_o.shape[0] * part_o.shape[2], np.float32)
    twin_under_an_alias((part_o.shape[0],), (part_o.shape[2],), part_o, part_ml, o)
    return o


def merge_via_combine(part_o, part_ml):         # the combine kernel's twin with Wo = identity
    D = part_o.shape[0] * part_o.shape[2]
    x = np.zeros(D, np.float32)
    attn_combine_twin(None, None, part_o, part_ml, np.eye(D, dtype=np.float32), x)
    return x


def paired_t_via_mean_sem(a, b):
    mean, sem = stats.mean_sem(np.asarray(b, float) - np.asarray(a, float))
    return mean, sem, (mean / sem if sem else 0.0)


def paired_t_via_paired_test(a, b):
    r = stats.paired_test(a, b)
    return r["diff"], r["sem"], r["t"]


@pytest.mark.parametrize("fn, used", [
    (merge_via_twin, "kernels.attention.attn_merge_twin"),
    (merge_via_combine, "kernels.attention.attn_merge_twin"),
])
def test_merge_may_not_call_the_reference(fn, used):
    _, part_o, part_ml, ref, _, _ = sc.checkers._merge_cases()[0]
    assert np.array_equal(fn(part_o, part_ml), ref)      # it would pass, unwatched
    _not_yet(sc.check_merge_partials(fn), "one slice per head", f"called {used}", "yourself")


@pytest.mark.parametrize("fn, used", [
    (lambda a, b: stats.paired_t(a, b), "lab.measure.stats.paired_t"),
    (paired_t_via_paired_test, "lab.measure.stats.paired_t"),
    (paired_t_via_mean_sem, "lab.measure.stats.mean_sem"),
])
def test_paired_t_may_not_call_the_reference(fn, used):
    _not_yet(sc.check_paired_t(fn), "5 reps", f"called {used}")


def test_launch_bill_may_not_call_the_reference():
    def budget_via_bill(ms_per_token, launches):
        return LaunchBill("mine", 0, 0, 0, launches, ms_per_token, "").us_per_launch

    _not_yet(sc.check_launch_bill(launches_ok, budget_via_bill), "eager, split_combine=False",
             "called lab.backend.instrument.LaunchBill.us_per_launch")


def test_the_watch_leaves_other_profilers_in_place():
    calls = []

    def profiler(frame, event, arg):
        calls.append(event)

    before = sys.getprofile()
    sys.setprofile(profiler)
    try:
        assert sc.check_paired_t(paired_t_ok).passed
        assert not sc.check_paired_t(lambda a, b: stats.paired_t(a, b)).passed
        assert sys.getprofile() is profiler
    finally:
        sys.setprofile(before)
    assert "call" in calls                       # it was still called during the checks
