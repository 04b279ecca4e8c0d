"""Wrong solutions a student plausibly writes for the statistics, audit and test exercises, none
in an exercise's own `wrong` list: each fails with a verdict that names its mistake in words (not
numbers only), and correct solutions written otherwise than the references pass. The classes:
a boundary read as "at most", a count of distinct kernels, a step that was a replay; a block
never compared, a by-value argument keyed by the plan, a Buffer compared by name, findings keyed
by kernel name; a pre-warm that switches graphs off or runs inside a capture; a launch index
that counts host work or the failing launch, an `except Exception`; a test of a prompt of its
own, the wrong way round, or rounding the logits; B judged before the A/A, verdicts swapped; a
critical value of one's own, the median, sorted pairs, the first token id only; (sem, mean)
swapped, rounded numbers, a round short; factors switched on alone, a factor given as a string,
a rep left out; a rotation either way.

Each runs the exercise's whole check in process, on the simulator (the caches of the small
model shared with the other tests); most wrong ones fail on the made-up fixtures that come
first. Where a fixture case comes late in a check, its separating power is tested directly.
"""
import pytest

from lab.teach import handson
from lab.teach.handson import audit_values, count, variance
from lab.teach.exercise import Source
from lab.teach.handson.fixtures import engine

EXERCISES = handson.EXERCISES


def _result(name, text):
    return EXERCISES[name].run(Source(text, f"{name} red team").namespace())


def _fails_naming(name, text, *words):
    res = _result(name, text)
    assert not res.passed
    for w in words:
        assert w in res.message, res.message


def _passes(name, text):
    res = _result(name, text)
    assert res.passed, res.message


def _ref(name, *pairs):
    """The reference of `name` with each (old, new) replaced (old must be there)."""
    text = EXERCISES[name].reference
    for old, new in pairs:
        assert old in text, old
        text = text.replace(old, new)
    return text


# ---- launch_count ------------------------------------------------------------------------------
def test_capture_pays_names_each_wrong_reading_of_the_budget_rule():
    """Every wrong reading is told apart by the budgets, and the hint names the one fitted."""
    def answers(rule):
        return [bool(rule(ms, n)) for ms, n, _ in count._BUDGETS]
    right = answers(lambda ms, n: 1000.0 * ms / n < 10.0)
    for rule, words in ((lambda ms, n: ms * 1000 / n <= 10, "not <="),
                        (lambda ms, n: ms / n < 10, "1 ms is 1000 us"),
                        (lambda ms, n: 1000 * ms / n > 10, "not over"),
                        (lambda ms, n: n / (1000 * ms) < 10, "not launches per microsecond")):
        assert answers(rule) != right
        assert words in count._pays_hint(answers(rule))


def test_launch_count_names_distinct_kernels_and_a_step_it_never_ran():
    pays = ("\n\ndef capture_pays(ms_per_token, launches):\n"
            "    return ms_per_token / launches < 0.01\n")
    _fails_naming("launch_count", '''
def launches_per_token(engine):
    engine.cfg = engine.cfg.replace(graph=False)
    return len({r.kernel for r in engine.log.for_step(engine.step().step)})''' + pays,
                  "distinct kernels")
    _fails_naming("launch_count", '''
def launches_per_token(engine):
    return len(engine.log.for_step(engine.ledger[-1].step))''' + pays,
                  "you ran no step", "graph replay")


# ---- audit -------------------------------------------------------------------------------------
def test_audit_fixtures_vary_a_block_and_a_by_value_argument_by_plan():
    """A solution that never compares blocks, or keys a by-value argument that changes only with
    the plan, is wrong on these (they come last in the check: tested here directly)."""
    _, want, _, _ = audit_values.expected(engine("sim", step=audit_values.BlockForThePlan))
    assert want.get((7, "block")) == "capture key"
    _, want, _, kinds = audit_values.expected(engine("sim", step=audit_values.EpsForThePlan))
    assert want.get((6, "eps")) == "promote to device memory" and kinds[(6, "eps")] == "by value"
    hint = audit_values._hint((6, "eps"), "promote to device memory", "capture key", {}, "by value")
    assert "even one that changes only where the plan key does" in hint


def test_audit_names_a_buffer_compared_by_name_and_findings_keyed_by_kernel():
    ptr = "a.ptr if isinstance(a, Buffer) else a"
    _fails_naming("audit", _ref("audit", (ptr, "a.name if isinstance(a, Buffer) else a")),
                  "compare a Buffer by its .ptr, not its name")
    _fails_naming("audit", _ref("audit", ("seen.setdefault((i, what)",
                                          "seen.setdefault((x.kernel.name, what)")),
                  "not keyed (launch index, what)")


# ---- prewarm -----------------------------------------------------------------------------------
def test_prewarm_names_graphs_switched_off_and_work_run_inside_a_capture():
    _fails_naming("prewarm", "def pre_warm(engine):\n"
                             "    engine.cfg = engine.cfg.replace(graph=False)\n",
                  "pre_warm changed engine.cfg", "put the configuration back")
    opened = ("    for plan in", "    engine.backend.begin_capture()\n    for plan in")
    _fails_naming("prewarm", _ref("prewarm", opened), "OUTSIDE any capture")


def test_prewarm_by_eager_steps_that_restores_the_engine_passes():
    """Eager steps at every plan's start warm it too, and leave KV rows written: the check's
    seek must not hold a pre-warm to rows a real request would write itself."""
    _passes("prewarm", '''
from lab.plan import plan_boundaries


def pre_warm(engine):
    cfg = engine.cfg
    engine.cfg = cfg.replace(graph=False)
    try:
        for b in [0, *plan_boundaries(engine.model.cfg.max_seq)]:
            engine.reset(engine.encode("R"), 2)
            engine.seek(b)
            engine.step()
    finally:
        engine.cfg = cfg
''')


# ---- fallback ----------------------------------------------------------------------------------
_ISSUE_LOOP = '''        for item in engine.pieces.items(plan):
            shown = (f"launch {launches} ({item.name})" if isinstance(item, Launch) else
                     f"host work before launch {launches} ({item.what})")
            issue(engine, item)
            launches += isinstance(item, Launch)'''


def test_fallback_names_a_launch_index_that_counts_host_work():
    enumerated = _ISSUE_LOOP.replace(
        "        for item in engine.pieces.items(plan):",
        "        for launches, item in enumerate(engine.pieces.items(plan)):").replace(
        "\n            launches += isinstance(item, Launch)", "")
    _fails_naming("fallback", _ref("fallback", (_ISSUE_LOOP, enumerated)), "not every item")


def test_fallback_names_an_except_that_catches_every_error():
    broad = ("    except CaptureError as exc:\n        reason = exc.reason",
             "    except Exception as exc:\n        reason = getattr(exc, 'reason', str(exc))")
    _fails_naming("fallback", _ref("fallback", broad), "catch only lab.errors.CaptureError")


# ---- replay_test -------------------------------------------------------------------------------
def test_replay_test_names_a_prompt_of_its_own_and_a_test_the_wrong_way_round():
    own = ("    engine.reset(prompt_ids)", "    engine.reset(engine.encode('ROMEO.\\n'))")
    _fails_naming("replay_test", _ref("replay_test", own),
                  "never reset the engine with the prompt it was given")
    _fails_naming("replay_test", _ref("replay_test", ("    return a == b", "    return a != b")),
                  "the wrong way round")


def test_replay_test_names_logits_rounded_before_the_comparison():
    rounded = ("out.append(engine.logits().tobytes())",
               "out.append(engine.logits().round(4).tobytes())")
    _fails_naming("replay_test", _ref("replay_test", rounded), "one ulp off", "compare every byte")


# ---- aa_control --------------------------------------------------------------------------------
def test_aa_control_names_verdicts_swapped_and_b_judged_before_the_control():
    swapped = ('return "same" if run_bytes(run_b) == a1 else "different"',
               'return "different" if run_bytes(run_b) == a1 else "same"')
    _fails_naming("aa_control", _ref("aa_control", swapped), "the wrong way round")
    _fails_naming("aa_control", '''
import numpy as np


def ab_verdict(run_a, run_b):
    a1, b, a2 = run_a(), run_b(), run_a()
    same = lambda x, y: all(np.array_equal(p, q) for p, q in zip(x, y))
    if not same(a1, b):
        return "different"
    return "same" if same(a1, a2) else "broken"
''', "check A against itself FIRST")


# ---- aa_gate -----------------------------------------------------------------------------------
@pytest.mark.parametrize("old,new,words", [
    ("    return abs(t) <= critical", "    return abs(t) <= 4.541",
     "does not change with `critical`"),
    ("    mean = d.mean()", "    mean = float(np.median(d))", "not the median"),
    ("    mean = d.mean()", "    mean = d.sum() / (d.size - 1)", "not over reps - 1"),
    ('    d = np.asarray(ms["A\'"]) - np.asarray(ms["A"])',
     '    d = np.sort(ms["A\'"]) - np.sort(ms["A"])', "not each arm sorted"),
    ("np.asarray(ta).tobytes() == np.asarray(tb).tobytes()",
     "np.asarray(ta).reshape(-1)[0] == np.asarray(tb).reshape(-1)[0]", "not only the first"),
], ids=["own critical", "median", "mean over reps - 1", "sorted pairs", "first id only"])
def test_aa_gate_wrong_statistics_are_named_by_their_own_t(old, new, words):
    """The solution's t is found by moving `critical` until its verdict flips, and matched to the
    wrong formula that gives it; a verdict that never moves ignores `critical`."""
    _fails_naming("aa_gate", _ref("aa_gate", (old, new)), words)


def test_aa_gate_hand_written_with_statistics_passes():
    _passes("aa_gate", '''
import statistics


def aa_gate(run_a, run_a2, reps, critical):
    runs, times, outs, order = (run_a, run_a2), ([], []), ([], []), [1, 0]
    for _ in range(reps):
        for k in order:
            ms, out = runs[k]()
            times[k].append(ms)
            outs[k].append(out)
        order.reverse()
    for (ia, la), (ib, lb) in zip(*outs):
        if ia.tobytes() != ib.tobytes() or la.tobytes() != lb.tobytes():
            return False
    d = [b - a for a, b in zip(*times)]
    m, s = statistics.fmean(d), statistics.stdev(d)
    if s == 0:
        return m == 0
    return -critical <= m / (s / reps ** 0.5) <= critical
''')


# ---- variance ----------------------------------------------------------------------------------
_PAIR = "        out[name] = (float(v.mean()), float(v.std(ddof=1) / math.sqrt(v.size)))"


@pytest.mark.parametrize("old,new,words", [
    (_PAIR, "        out[name] = (float(v.std(ddof=1) / math.sqrt(v.size)), float(v.mean()))",
     "the pair is (mean, sem), in that order"),
    (_PAIR, "        out[name] = (round(float(v.mean()), 3), round(float(v.std(ddof=1) / "
            "math.sqrt(v.size)), 3))", "rounded to 3 decimals"),
    ("    for rep in range(reps):", "    for rep in range(reps - 1):", "run 4 timed rounds"),
    ("math.sqrt(v.size)", "math.sqrt(v.size + 1)", "the warm-up is not one"),
], ids=["(sem, mean)", "rounded", "a round short", "sqrt(reps + 1)"])
def test_variance_wrong_numbers_are_named(old, new, words):
    _fails_naming("variance", _ref("variance", (old, new)), words)


# ---- loo ---------------------------------------------------------------------------------------
def test_loo_names_factors_switched_on_alone_a_string_arm_and_a_rep_left_out():
    arms = "    arms = [frozenset()] + [frozenset({f}) for f in factors] + [frozenset(factors)]"
    _fails_naming("loo", _ref("loo", (arms, arms.replace("frozenset({f})",
                                                         "frozenset(factors) - {f}")),
                              ("ms[frozenset({f})]", "ms[frozenset(factors) - {f}]")),
                  "OUT of all on")
    _fails_naming("loo", _ref("loo", (arms, arms.replace("frozenset({f})", "f")),
                              ("ms[frozenset({f})]", "ms[f]")), "not the string")
    _fails_naming("loo", _ref("loo", ("    on = np.asarray(ms[frozenset()])",
                                      "    ms = {k: v[1:] for k, v in ms.items()}\n"
                                      "    on = np.asarray(ms[frozenset()])")),
                  "leaves out the first rep")


def test_a_round_rotated_either_way_is_a_valid_order():
    """deque.rotate(1) rotates right, lab.measure.stats.rotated left: both put every arm at
    every place in turn."""
    arms = ["on", "-X", "-Y", "off"]
    right, order = [], list(arms)
    for _ in range(4):
        right += order
        order = order[-1:] + order[:-1]
    assert variance.alternation_problem(right, arms, 4) is None
    left = [a for r in range(4) for a in arms[r:] + arms[:r]]
    assert variance.alternation_problem(left, arms, 4) is None
    shuffled = arms + ["-Y", "on", "off", "-X"] + arms[::-1] + arms
    assert "reversed or rotated by one" in variance.alternation_problem(shuffled, arms, 4)

