"""The `accept` exercise's check names each mistake in words. Its hand-made cases run the
student's twin on the engine's buffers and the student's kernel on numba's CUDA simulator; at
the first case that differs from the rule, `accept._diagnose` says which rule was broken (a
flawed model of the rule that reproduces the outcome and agrees with the rule on the cases
before it) or, where none does, which quantity differs and how: pos moved too far or not far
enough and which draft it took or left, which token slot (a draft's, the bonus's, one past
them) was left unwritten or holds another column's value, which stats counter and in which
direction. Never numbers alone.

Most tests here run the check's cases in process on a twin written as a student might (NumPy,
no engine, no simulator: milliseconds); a few run the whole check, kernel on the simulator
included, on a correct solution written otherwise and on kernels whose mistake only the
simulator sees."""
import numpy as np
import pytest

from lab.teach import handson, mutate
from lab.teach.handson import accept

MAX_SEQ = 128


# ---- twins written as a student might: each runs the check's case sequence in process ---------
def _rule(cols, pred, p, n_p, lim, tokens, pos, stats, *, cmp=lambda i: i - 1, room=1,
          bonus_write=True, bonus_count=True, prompt_write=False, stats_per_token=False,
          early_return=False, bonus_from_cols=False):
    """The acceptance with one of a student's mistakes switched on (none: right)."""
    if p >= lim:
        return
    a = 0
    for i in range(1, cols.shape[0]):
        if p + i > lim - room or not (p + i < n_p or cols[i] == pred[cmp(i)]):
            break
        a = i
    if early_return and a == 0:
        return
    for i in range(1, a + 1):
        if prompt_write or p + i >= n_p:
            tokens[p + i] = cols[i]
    q = p + a + 1
    if bonus_write and (prompt_write or q >= n_p):
        tokens[q] = cols[a] if bonus_from_cols else pred[a]
    pos[0] = q if bonus_count else q - 1
    g = sum(1 for x in range(p + 1, q + 1) if x >= n_p)
    if stats_per_token:
        stats[0] += g
        stats[1] += g
    elif g > 0:
        stats[0] += 1
        stats[1] += g


def _twin(**mistake):
    def twin(grid, block, cols, pred, pos, n_prompt, limit, tokens, stats):
        _rule(cols, pred, int(pos[0]), int(n_prompt[0]), int(limit[0]), tokens, pos, stats,
              **mistake)
    return twin


def _verdict(twin) -> str | None:
    """The check's cases on `twin`, as the check runs them (every case, then the verdict at the
    first that differs from the rule, held to what the twin left on all of them); None when
    every case agrees with the rule."""
    runs = []
    for case in accept._cases() + accept.ONE_DRAFT_CASES:
        fault = accept._twin_fault(twin, case, MAX_SEQ)
        if fault:
            return fault
        cols, pred, pos, n_prompt, limit, tokens, stats = accept._case_arrays(case, MAX_SEQ)
        twin((1,), (1,), cols, pred, pos, n_prompt, limit, tokens, stats)
        runs.append((case, (int(pos[0]), tokens, stats)))
    for case, got in runs:
        if not all(np.array_equal(g, w) for g, w in zip(got, accept.expected(case, MAX_SEQ))):
            return accept._diagnose(case, got, MAX_SEQ, runs)
    return None


WRONG_TWINS = {   # a student's mistake -> (the twin, the words its verdict names it with)
    "draft i held to pred[i]": (_twin(cmp=lambda i: i), "off by one: draft i compared with "
                                                        "pred[i]"),
    "the bonus token not written": (_twin(bonus_write=False), "the bonus slot p + a + 1"),
    "pos not moved past the bonus": (_twin(bonus_count=False), "short of tokens[15] that the "
                                                                "step wrote: the bonus token "
                                                                "was not counted"),
    "drafts written into the prompt": (_twin(prompt_write=True), "a prompt position, was "
                                                                 "overwritten"),
    "stats counted per token": (_twin(stats_per_token=True), "stats[0] (the verify steps that "
                                                             "generated) went up by 5 where the "
                                                             "rule adds 1"),
    "a return when no draft is accepted": (_twin(early_return=True), "the step changed nothing"),
    "one draft short of the limit": (_twin(room=2), "stopped one draft short of the limit"),
    "the bonus taken from the drafts": (_twin(bonus_from_cols=True), "holds 14 (cols[4], "
                                                                     "pred[3]) instead of 15"),
    "a draft held to pred[i - 2]": (_twin(cmp=lambda i: i - 2), "off by one: draft i compared "
                                                                "with pred[i - 2]"),
}


def test_the_check_s_cases_pass_a_right_twin_written_otherwise():
    assert _verdict(_twin()) is None


@pytest.mark.parametrize("mistake", WRONG_TWINS)
def test_each_wrong_outcome_is_named_in_words(mistake):
    twin, words = WRONG_TWINS[mistake]
    message = _verdict(twin)
    assert message is not None, mistake
    assert words in message, message
    # and named in the words the mutation score counts (a wrong value, an edge, a write, ...)
    assert mutate.verdict("accept", "constant", False, message) == mutate.KILLED, message


def test_where_no_flaw_model_fits_each_quantity_is_said_in_words():
    """Outcomes no modelled flaw reproduces: the position, each token slot and each stats
    counter are described -- which one, and in which direction."""
    case = accept.CASES[0]            # every draft confirmed: p = 10, a = 4, the bonus at 15
    pos, tokens, stats = accept.expected(case, MAX_SEQ)
    said = {}
    t = tokens.copy()
    t[16] = 99                         # written one past the bonus slot
    said["past"] = accept._diagnose(case, (pos, t, stats), MAX_SEQ)
    t = tokens.copy()
    t[12] = 0                          # an accepted draft left unwritten
    said["draft"] = accept._diagnose(case, (pos, t, stats), MAX_SEQ)
    said["pos"] = accept._diagnose(case, (pos + 1, tokens, stats), MAX_SEQ)
    said["stats0"] = accept._diagnose(case, (pos, tokens, stats - [2, 0]), MAX_SEQ)
    said["stats1"] = accept._diagnose(case, (pos, tokens, stats - [0, 5]), MAX_SEQ)
    assert "one past the bonus slot p + a + 1 = 15: one too far, was written" in said["past"]
    assert "the slot of accepted draft 2 (cols[2]), was not written" in said["draft"]
    assert "pos[0] moved by 6 where the rule moves it by 5" in said["pos"]
    assert "one too many" in said["pos"] and "there are only 4 drafts" in said["pos"]
    assert "went down by 1 instead of up by 1" in said["stats0"]
    assert "stats[1] (the tokens generated) did not change" in said["stats1"]


def test_a_twin_indexing_out_of_bounds_is_named_with_its_line():
    def twin(grid, block, cols, pred, pos, n_prompt, limit, tokens, stats):
        _rule(cols, pred, int(pos[0]), int(n_prompt[0]), int(limit[0]), tokens, pos, stats)
        stats[2] += 0
    message = _verdict(twin)
    assert "your twin reads or writes out of bounds at `stats[2] += 0`" in message, message


def test_the_cases_names_hold_no_word_a_verdict_is_judged_by():
    """A case's name is printed in its verdict: a word of the mutation score's map in it would
    name a mistake the diagnosis never named."""
    words = {w for ws in mutate.OPERATOR_WORDS.values() for w in ws}
    for case in accept._random_cases()[:1] + accept.CASES + accept.ONE_DRAFT_CASES:
        name, p, n_p, lim, cols, pred = case
        text = f"case '{name}' (p={p}, n_prompt={n_p}, limit={lim}, cols={cols}, pred={pred})"
        assert not [w for w in words if w in text.lower()], (text, words & set(text.split()))


def test_the_cases_separate_each_boundary():
    """Each boundary of the rule has a case on either side: no draft and every draft taken, the
    step ending on the last prompt position (it generates nothing) and the bonus on the first
    position after it, the limit three, one and no positions away, one draft (k = 1)."""
    outcome = {c[0]: accept.expected(c, MAX_SEQ) for c in accept.CASES + accept.ONE_DRAFT_CASES}
    moved = {c[0]: outcome[c[0]][0] - c[1] for c in accept.CASES + accept.ONE_DRAFT_CASES}
    assert moved["every draft confirmed"] == accept.K + 1
    assert moved["draft 1 rejected, the rest agreeing"] == 1
    assert moved["one position before limit[0]"] == 1
    assert moved["at limit[0]: the generation is done"] == 0
    assert moved["one draft, confirmed"] == 2 and moved["one draft, rejected"] == 1
    assert list(outcome["the step ends on the last prompt position"][2]) == list(accept.STATS0)
    bonus = outcome["the bonus on the first position after the prompt"]
    assert bonus[0] == 6 and bonus[1][6] == 50 and list(bonus[2]) == [4, 8]


# ---- the whole check: the kernel on the simulator ----------------------------------------------
REF = accept.REFERENCE
# the twin a for loop with break, the kernel a separate scan for a, guarded on cuda.grid(1) and
# launched on two blocks of 32: right, however written
OTHERWISE = REF.replace(
    "    a = 0\n    while a + 1 < T and p + a + 1 <= lim - 1 and (p + a + 1 < n_p or "
    "cols[a + 1] == pred[a]):\n        a += 1\n    for i in range(1, a + 1):\n"
    "        if p + i >= n_p:\n            tokens[p + i] = cols[i]\n    q = p + a + 1\n"
    "    if q >= n_p:\n        tokens[q] = pred[a]\n    pos[0] = q\n"
    "    g = q - max(p + 1, n_p) + 1\n    if g > 0:\n        stats[0] += 1\n"
    "        stats[1] += g\n\n\n@kernel",
    "    a = 0\n    for i in range(1, T):\n        if p + i > lim - 1 or (p + i >= n_p and "
    "cols[i] != pred[i - 1]):\n            break\n        a = i\n    for i in range(1, a + 2):\n"
    "        if p + i >= n_p:\n            tokens[p + i] = cols[i] if i <= a else pred[a]\n"
    "    pos[0] = p + a + 1\n    g = sum(1 for x in range(p + 1, p + a + 2) if x >= n_p)\n"
    "    if g:\n        stats[0] += 1\n        stats[1] += g\n\n\n@kernel", 1).replace(
    "    if cuda.threadIdx.x != 0 or cuda.blockIdx.x != 0:    # one thread does the work\n",
    "    if cuda.grid(1) != 0:\n").replace(
    "    a = 0\n    while a + 1 < T and p + a + 1 <= lim - 1 and (p + a + 1 < n_p or "
    "cols[a + 1] == pred[a]):\n        a += 1\n",
    "    a = T - 1\n    stop = False\n    for i in range(1, T):\n"
    "        if not stop and not (p + i <= lim - 1 and (p + i < n_p or cols[i] == pred[i - 1])):"
    "\n            a = i - 1\n            stop = True\n").replace(
    "launch(accept_kernel, ((1,), (1,))", "launch(accept_kernel, ((2,), (32,))")
# the kernel takes k as the check's K, not from cols.shape: only the one-draft cases show it
HARD_K = REF.replace("limit[0], cols.shape[0]\n    if p >= lim:\n        return\n    a = 0",
                     "limit[0], 5\n    if p >= lim:\n        return\n    a = 0")
# the kernel (not its twin) without the check at the limit
NO_DONE = REF.replace("    if cuda.threadIdx.x != 0 or cuda.blockIdx.x != 0:    # one thread "
                      "does the work\n        return\n    p, n_p, lim, T = pos[0], n_prompt[0], "
                      "limit[0], cols.shape[0]\n    if p >= lim:\n        return\n",
                      "    if cuda.threadIdx.x != 0 or cuda.blockIdx.x != 0:    # one thread "
                      "does the work\n        return\n    p, n_p, lim, T = pos[0], n_prompt[0], "
                      "limit[0], cols.shape[0]\n")


def test_a_right_solution_written_otherwise_passes():
    assert OTHERWISE.count("for i in range(1, T)") == 2 and "cuda.grid(1)" in OTHERWISE
    res = handson.check("accept", handson.Source(OTHERWISE, "accept otherwise"), echo=False)
    assert res.passed, res.message


@pytest.mark.parametrize("text,words", [
    (HARD_K, "case 'one draft, confirmed' (p=10, n_prompt=3, limit=100, cols=[7, 11], "
             "pred=[11, 12]): reads or writes out of bounds"),
    (NO_DONE, "case 'at limit[0]: the generation is done' (p=13, n_prompt=3, limit=13, cols=[7, "
              "11, 12, 13, 14], pred=[11, 12, 13, 14, 15]): a step at or past the limit "
              "changed")], ids=["k a constant", "no check at the limit"])
def test_a_kernel_mistake_only_the_simulator_sees_is_named(text, words):
    assert text != REF
    res = handson.check("accept", handson.Source(text, "accept kernel mistake"), echo=False)
    assert not res.passed
    assert "on numba's CUDA simulator" in res.message and words in res.message, res.message
