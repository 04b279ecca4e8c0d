"""The mistake classes that mutants of the non-kernel exercises' references make, each failed by
its check with a verdict that names it: a crash in the solution's own code said in words (where,
and what the operation there was given), a budget a hair either side of the limit, a t exactly
at the critical value, a prompt run with a step too few, a capture that fails before its first
item or after an earlier swallowed offence, a lazy flag added inside a failed capture, a sum
where a difference goes. Each runs the exercise's check in process on the simulator; most fail
on the made-up fixtures before any engine runs.
"""
from lab.teach import handson, mutate
from lab.teach.handson import aa_gate, count
from lab.teach.exercise import Source

EXERCISES = handson.EXERCISES


def _message(name, text):
    res = EXERCISES[name].run(Source(text, f"{name} mutant test").namespace())
    assert not res.passed
    return res.message


def _ref(name, old, new):
    text = EXERCISES[name].reference
    assert old in text, old
    return text.replace(old, new)


def test_a_crash_in_the_solution_says_where_and_what_it_was_given():
    msg = _message("variance", _ref("variance", "np.asarray(v, np.float64)",
                                    "np.asarray(np.float64, v)"))
    assert "at line" in msg and "np.asarray(np.float64, v)" in msg
    assert mutate.verdict("variance", "swapped_args", False, msg) == mutate.KILLED
    msg = _message("aa_gate", _ref("aa_gate", 'ms = {"A": [], "A\'": []}',
                                   'ms = {"A\'": [], "A\'": []}'))
    assert "`ms` has no key 'A'" in msg, msg
    msg = _message("loo", _ref("loo", "arms = [frozenset()] + [", "arms = [frozenset()] - ["))
    assert "in place of another" in msg, msg


def test_arms_that_did_not_pair_up_are_named_before_the_crash_they_cause():
    msg = _message("loo", _ref("loo", "arms[::-1]", "arms[::-2]"))
    assert "too few for" in msg and "do not pair up" in msg, msg


def test_a_budget_a_hair_either_side_of_10_us_is_told_apart():
    for scale, side in ((1001.0, "between 8.997 and 9.995"), (999.0, "between 10.01")):
        rule = _ref("launch_count", "1000.0 * ms_per_token", f"{scale} * ms_per_token")
        assert side in _message("launch_count", rule)
    assert any(9.99 < 1000 * ms / n < 10 for ms, n, _ in count._BUDGETS)


def test_a_t_exactly_at_the_critical_value_passes_the_gate():
    tie = next(fx for fx in aa_gate._FIXTURES if fx["critical"] == 2.0)
    assert aa_gate._paired_t(tie["a"], tie["a2"]) == 2.0 and aa_gate.gate_model(tie)
    msg = _message("aa_gate", _ref("aa_gate", "return abs(t) <= critical",
                                   "return abs(t) < critical"))
    assert "exactly at the threshold passes" in msg, msg


def test_the_prompt_run_with_a_step_too_few_or_as_graphs_is_named():
    msg = _message("replay_test", _ref("replay_test", "range(len(prompt_ids) - 1)",
                                       "range(len(prompt_ids) - 2)"))
    assert "one too few" in msg, msg
    first = "    engine.cfg = engine.cfg.replace(graph=False)      # the prompt"
    msg = _message("replay_test", _ref("replay_test", first, "    #"))
    assert "your eager arm ran" in msg and "as graphs" in msg, msg


def test_fallback_names_a_failure_before_the_first_item_and_the_first_offence():
    msg = _message("fallback", _ref("fallback", 'launches, shown = 0, "begin_capture"',
                                    'launches, shown = 0, "end_capture"'))
    assert "before the first item was issued" in msg, msg
    msg = _message("fallback", _ref("fallback", "                reason = invalidated.reason\n",
                                    "                pass\n"))
    assert "first offence" in msg, msg
    msg = _message("fallback", _ref("fallback", "        lazy.clear()\n", ""))
    assert "a key added inside it goes too" in msg, msg
