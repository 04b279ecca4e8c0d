"""The statistics and audit exercises' fixtures separate right from wrong: correct solutions
written differently from the references pass (scipy against a hand-written t, either arm opening
the first round, an early return, other ways to compare bytes), and wrong solutions that are not
among the exercises' own `wrong` lists fail with a verdict naming their mistake. The rules the
fixtures rest on (the alternation, the gate's model of each mistake) are tested directly.

Each runs the exercise's whole check on the simulator, in process (tests/teach/test_handson.py runs the
references and the known wrong solutions through the child process); the wrong ones fail on the
made-up fixtures that come first, mostly before any engine runs."""
import pytest

from lab.teach import handson
from lab.teach.handson import aa_gate, variance
from lab.teach.exercise import Source

EXERCISES = handson.EXERCISES


def _passes(name, text):
    """In process (the caches of the small model and the cost model shared with the other
    tests: a child would build them again): the whole check of `text` passes."""
    ex = EXERCISES[name]
    res = ex.run(Source(text, f"{name} test").namespace())
    assert res.passed, res.message


def _fails_naming(name, text, words):
    """In process: the check of `text` fails, its verdict holding `words`."""
    ex = EXERCISES[name]
    res = ex.run(Source(text, f"{name} test").namespace())
    assert not res.passed
    assert words in res.message, res.message


# ---- the alternation rule: any valid start, never back to back -----------------------------------
def test_the_alternation_accepts_any_start_and_names_back_to_back():
    ok = variance.alternation_problem
    assert ok(list("ABBAAB"), ["A", "B"], 3) is None
    assert ok(list("BAABBA"), ["A", "B"], 3) is None
    assert ok(list("CABBACCAB"), ["A", "B", "C"], 3) is None
    assert "back to back" in ok(list("AAABBB"), ["A", "B"], 3)
    assert "the same order every round" in ok(list("ABABAB"), ["A", "B"], 3)
    assert "not round 2 reversed" in ok(list("ABCCBABCA"), ["A", "B", "C"], 3)
    assert "6 timed runs" in ok(list("ABBAAB"), ["A", "B"], 4)


def test_each_modelled_gate_mistake_changes_some_fixture_s_verdict():
    """Every mistake the gate names is separated from the right gate by at least one made-up
    A/A, and the fixtures' right verdicts are the lab's own gate's (lab.measure.stats)."""
    from lab.measure.stats import aa_verdict
    for fx in aa_gate._FIXTURES:
        want = aa_verdict(fx["a"], fx["a2"], fx["oa"], fx["oa2"], threshold=fx["critical"])
        assert aa_gate.gate_model(fx) == want.ok, fx["label"]
    for flaw in aa_gate._FLAWS:
        assert any(aa_gate.gate_model(fx, flaw) != aa_gate.gate_model(fx)
                   for fx in aa_gate._FIXTURES), flaw


# ---- correct solutions written differently: they pass ---------------------------------------------
AA_GATE_SCIPY = '''
import numpy as np
from scipy import stats


def aa_gate(run_a, run_a2, reps, critical):
    a, a2 = [], []
    for r in range(reps):
        order = [(run_a2, a2), (run_a, a)] if r % 2 == 0 else [(run_a, a), (run_a2, a2)]
        for run, into in order:                       # A' opens the first round
            into.append(run())
        (ta, (ia, la)), (tb, (ib, lb)) = a[-1], a2[-1]
        if not (np.array_equal(ia, ib) and np.array_equal(la, lb)):
            return False                              # the outputs decide: no need to go on
    d = [y[0] - x[0] for x, y in zip(a, a2)]
    if len(set(d)) == 1:
        return d[0] == 0
    t = stats.ttest_rel([y[0] for y in a2], [x[0] for x in a]).statistic
    return bool(abs(t) <= critical)
'''


def test_aa_gate_scipy_a_prime_first_and_an_early_return_pass():
    pytest.importorskip("scipy")
    _passes("aa_gate", AA_GATE_SCIPY)


VARIANCE_ROUND_ZERO = '''
import statistics


def measure(arms, reps):
    names = list(arms)
    ms = {n: [] for n in names}
    for r in range(reps + 1):                         # round 0 is the warm-up, untimed
        for n in (names if r % 2 == 0 else names[::-1]):
            t = arms[n]()
            if r:
                ms[n].append(t)
    return {n: (statistics.mean(v), statistics.stdev(v) / len(v) ** 0.5) for n, v in ms.items()}
'''


def test_variance_a_warm_up_round_then_the_other_arm_first_passes():
    """The warm-up is the first round, so the first timed round opens with the other arm."""
    _passes("variance", VARIANCE_ROUND_ZERO)


LOO_OTHER_ORDER = '''
def leave_one_out(run, factors, reps):
    arms = [frozenset(factors)] + [frozenset([f]) for f in reversed(factors)] + [frozenset()]
    ms = {arm: [] for arm in arms}
    for r in range(reps):
        for arm in (arms[::-1] if r % 2 else arms):
            ms[arm].append(run(arm))
    on = ms[frozenset()]

    def worth(arm):
        return sum(x - y for x, y in zip(ms[arm], on)) / reps
    table = {f: worth(frozenset([f])) for f in factors}
    table["all"] = worth(frozenset(factors))
    return table
'''


def test_loo_arms_in_another_order_and_plain_python_pass():
    _passes("loo", LOO_OTHER_ORDER)


AA_CONTROL_ARRAY_EQUAL = '''
import numpy as np


def ab_verdict(run_a, run_b):
    a1 = run_a()
    b = run_b()
    a2 = run_a()
    same = lambda x, y: np.array_equal(x[0], y[0]) and np.array_equal(x[1], y[1])
    if not same(a1, a2):
        return "broken"
    return "same" if same(a1, b) else "different"
'''


def test_aa_control_with_array_equal_and_b_between_the_two_as_passes():
    _passes("aa_control", AA_CONTROL_ARRAY_EQUAL)


REPLAY_ARRAY_EQUAL = '''
import numpy as np


def arm(engine, ids, graph, n):
    engine.cfg = engine.cfg.replace(graph=False)
    engine.reset(ids, n)
    for _ in range(len(ids) - 1):
        engine.step()
    engine.cfg = engine.cfg.replace(graph=graph)
    logits = []
    for _ in range(n):
        engine.step()
        logits.append(engine.logits().copy())
    return logits, engine.tokens().copy()


def replays_match(engine, prompt_ids):
    g_logits, g_tokens = arm(engine, prompt_ids, True, 5)     # the graph arm first
    e_logits, e_tokens = arm(engine, prompt_ids, False, 5)
    return np.array_equal(g_tokens, e_tokens) and all(
        np.array_equal(x, y) for x, y in zip(g_logits, e_logits))
'''


def test_replay_test_graph_arm_first_with_array_equal_passes():
    _passes("replay_test", REPLAY_ARRAY_EQUAL)


AUDIT_SETS = '''
from collections import defaultdict

from lab.backend import Buffer


def audit_values(engine, positions):
    seen = defaultdict(dict)
    kinds = {}
    for p in positions:
        plan = engine.plan(p)
        for i, x in enumerate(engine.step_launches(plan)):
            seen[(i, "kernel")][p] = (plan.key, x.kernel.name)
            seen[(i, "grid")][p] = (plan.key, x.grid)
            seen[(i, "block")][p] = (plan.key, x.block)
            for name, a in zip(x.kernel.arg_names, x.args):
                seen[(i, name)][p] = (plan.key, a.ptr if isinstance(a, Buffer) else repr(a))
                kinds[(i, name)] = "arg"
    out = {}
    for where, by_pos in seen.items():
        values = {v for _, v in by_pos.values()}
        if len(by_pos) == len(positions) and len(values) == 1:
            continue
        if where in kinds:
            out[where] = "promote to device memory"
            continue
        per_key = defaultdict(set)
        for key, v in by_pos.values():
            per_key[key].add(v)
        ok = len(by_pos) == len(positions) and all(len(s) == 1 for s in per_key.values())
        out[where] = "capture key" if ok else "unhandled capture key"
    return out
'''


def test_audit_written_with_sets_and_repr_passes():
    _passes("audit", AUDIT_SETS)


FALLBACK_FINALLY = '''
from lab.backend import Launch
from lab.engine.step import HostWork
from lab.errors import CaptureError
from lab.ledger import CaptureFailure
from lab.teach.handson import issue


def capture(engine, plan):
    be = engine.backend
    before = dict(engine.pieces.lazy)
    issued, where = 0, None
    be.begin_capture()
    try:
        for item in engine.pieces.items(plan):
            if isinstance(item, HostWork):
                where = f"host work before launch {issued} ({item.what})"
            else:
                where = f"launch {issued} ({getattr(item, 'name', '')})"
            issue(engine, item)
            issued += isinstance(item, Launch)
    except CaptureError as exc:
        first = exc.reason
        try:
            be.end_capture()
        except CaptureError as invalidated:       # the capture's first offence
            first = invalidated.reason
        engine.pieces.lazy.clear()
        engine.pieces.lazy.update(before)
        return None, CaptureFailure(first, where, issued)
    try:
        return be.end_capture(), None
    except CaptureError as exc:
        engine.pieces.lazy.clear()
        engine.pieces.lazy.update(before)
        return None, CaptureFailure(exc.reason, "end_capture", None)
'''


def test_fallback_with_two_try_blocks_passes():
    _passes("fallback", FALLBACK_FINALLY)


# ---- wrong solutions not in the exercises' lists: each fails naming its mistake -------------------
_GATE = EXERCISES["aa_gate"].reference


@pytest.mark.parametrize("old,new,words", [
    ("sem = d.std(ddof=1) / math.sqrt(d.size)", "sem = d.std(ddof=1) / math.sqrt(d.size - 1)",
     "not sqrt(reps - 1)"),
    ("sem = d.std(ddof=1) / math.sqrt(d.size)", "sem = d.std(ddof=1)", "with the sd alone"),
    ("    return abs(t) <= critical\n", "    return -t <= critical\n", "two-sided"),
    ("    t = (0.0 if mean == 0 else math.copysign(math.inf, mean)) if sem == 0 else mean / sem\n",
     "    with np.errstate(all='ignore'):\n        t = np.float64(mean) / sem\n",
     "not the nan that 0/0 gives"),
    ('zip(out["A"], out["A\'"])', 'zip(out["A"][-1:], out["A\'"][-1:])', "EVERY rep"),
    ("np.asarray(ta).tobytes() == np.asarray(tb).tobytes()\n                and ", "",
     "compare the token ids too"),
], ids=["sqrt(n-1)", "sd not sem", "other side only", "nan at sem 0", "last rep only",
        "logits only"])
def test_aa_gate_wrong_statistics_fail_naming_them(old, new, words):
    assert old in _GATE
    _fails_naming("aa_gate", _GATE.replace(old, new), words)


def test_variance_and_loo_wrong_arithmetic_fails_naming_it():
    ref = EXERCISES["variance"].reference
    _fails_naming("variance", ref.replace("math.sqrt(v.size)", "math.sqrt(v.size - 1)"),
                  "not sqrt(reps - 1)")
    _fails_naming("variance", ref.replace("out[name] = (", "out[names[1 - names.index(name)]] = ("),
                  "the arms are swapped")
    loo = EXERCISES["loo"].reference
    _fails_naming("loo", loo.replace("np.mean(np.asarray(ms[frozenset({f})]) - on)",
                                     "(np.asarray(ms[frozenset({f})]) - on)[0]"),
                  "one rep's difference")
    _fails_naming("loo", loo.replace("for rep in range(reps):", "for rep in range(reps - 1):"),
                  "did not run 4 reps")


def test_aa_control_first_element_only_fails_naming_it():
    ref = EXERCISES["aa_control"].reference
    wrong = ref.replace("np.asarray(x).tobytes()", "np.asarray(x).reshape(-1)[:1].tobytes()")
    assert wrong != ref
    _fails_naming("aa_control", wrong, "compare every element")
