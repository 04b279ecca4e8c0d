"""Beyond the checklist (the case studies 003/004): speculative decoding's acceptance, on the
device, so that one graph replays the whole generation.

The student writes the acceptance kernel (its numba source and its NumPy twin, as
kernels/draft.py's `accept` does) and the verify step's piece that launches it
(`AcceptStep(DraftStep).accept`). The check first runs that launch alone on hand-made device
buffers -- each case built so that a common mistake shows, and is named -- then the same cases
with the student's kernel itself on numba's CUDA simulator (the engine on a laptop runs its
twin), then generates with
LAB_DRAFT=4 in the real engine: the greedy tokens of LAB_DRAFT=0 across positions 32 and 64, one
capture then replays only, and the eager path's bytes.
"""
from __future__ import annotations

import re
import traceback

import numpy as np

import kernels
from kernels import cudasim, draft
from lab.backend import Launch
from lab.config import fixture_size
from lab.engine.draft import DraftStep
from lab.teach.exercise import Exercise, Fail, Source
from .base import hold_kernel, issue, kernel_source, need, simulate, variant, watched
from .fixtures import PROMPT, TOKENS, clean_tokens, engine, first_difference

K = 4     # the check's LAB_DRAFT: the verify step's columns are T = K + 1

STATEMENT = """
Speculative decoding (LAB_DRAFT=k) drafts k tokens and verifies them with ONE step of the model
over the k + 1 columns cols = [tokens[p], draft 1, ..., draft k] (p = pos[0]). The step leaves
pred[t], the model's greedy choice after column t: the token for position p + t + 1. Acceptance
decides on the device how far the step got; the host never reads it between steps, so one
captured graph serves the whole generation.

Write three things:
  accept_twin(grid, block, cols, pred, pos, n_prompt, limit, tokens, stats)
        the NumPy twin: what the engine runs for one launch on the sim backend. It mutates pos,
        tokens and stats in place. All int32: cols, pred [k + 1] (k from cols.shape[0]); pos,
        n_prompt, limit [1]; tokens [max_seq]; stats [2] = (verify steps that generated, tokens
        generated).
  accept_kernel(cols, pred, pos, n_prompt, limit, tokens, stats)
        the numba.cuda source of the same kernel (one thread does the work; a GPU runs it,
        and this check on numba's CUDA simulator), declared with lab.teach.handson.kernel(...)
        and your twin
  AcceptStep(DraftStep)  its accept(self, plan) returns the launch of your kernel:
        lab.engine.step.launch(accept_kernel, (grid, block), args), args in the kernel's order:
        self.dev.draft.cols, self.dev.draft.pred, self.dev.buf.pos, self.dev.buf.n_prompt,
        self.dev.buf.limit, self.dev.buf.tokens, self.dev.draft.stats

The rule, with p = pos[0], n_p = n_prompt[0], lim = limit[0] (the last position to reach):
  - p >= lim: the generation is done; change nothing.
  - draft i = 1, 2, ... is accepted while i <= k, p + i <= lim - 1 (room for the bonus) and
      p + i < n_p (a prompt position: its token is known) or cols[i] == pred[i - 1]
    -- stop at the first draft that fails: a = the length of the accepted prefix;
  - tokens[p + i] = cols[i] for i = 1..a, then the bonus tokens[p + a + 1] = pred[a] (the
    model's own next token, free) -- never into a prompt position (p + i < n_p);
    pos[0] = p + a + 1;
  - g = how many of the positions p + 1 .. p + a + 1 are at or past n_p: stats[1] += g, and
    stats[0] += 1 when g > 0.

The check: hand-made cases on device buffers (each common mistake named); the same cases, and
two of one draft (k = 1: take k from cols.shape[0]), with your kernel itself at your launch's
grid and block on numba's CUDA simulator (a laptop runs it there): the reference kernel's pos,
tokens and stats, each element written by exactly one thread, no prompt position written, what
your twin leaves; then LAB_DRAFT=4 generations from a 7-token prompt across positions 32 and 64:
LAB_DRAFT=0's greedy tokens, one capture then replays only, eager and graph byte-identical.
Launching kernels.draft.accept (the lab's own), calling its twin or DraftStep.accept fails the
check.
"""

STUB = '''
import numpy as np
from numba import cuda

from lab import DraftStep, launch
from lab.teach.handson import kernel


def accept_twin(grid, block, cols, pred, pos, n_prompt, limit, tokens, stats):
    """Keep the longest prefix of drafts the model confirms, add the bonus token, advance pos."""
    # FILL ME IN
    pass


@kernel("void(int32[::1], int32[::1], int32[::1], int32[::1], int32[::1], int32[::1], int32[::1])",
        twin=accept_twin, reads=(0, 1, 2, 3, 4, 5, 6), writes=(2, 5, 6))
def accept_kernel(cols, pred, pos, n_prompt, limit, tokens, stats):
    # FILL ME IN (numba.cuda: one thread, cuda.threadIdx.x == 0 and cuda.blockIdx.x == 0)
    pass


class AcceptStep(DraftStep):
    def accept(self, plan):
        """The launch of accept_kernel after the verify step's columns."""
        # FILL ME IN: return launch(accept_kernel, ((1,), (1,)), (the seven buffers, in order))
        return None
'''

REFERENCE = '''
from numba import cuda

from lab import DraftStep, launch
from lab.teach.handson import kernel


def accept_twin(grid, block, cols, pred, pos, n_prompt, limit, tokens, stats):
    p, n_p, lim, T = int(pos[0]), int(n_prompt[0]), int(limit[0]), cols.shape[0]
    if p >= lim:
        return
    a = 0
    while a + 1 < T and p + a + 1 <= lim - 1 and (p + a + 1 < n_p or cols[a + 1] == pred[a]):
        a += 1
    for i in range(1, a + 1):
        if p + i >= n_p:
            tokens[p + i] = cols[i]
    q = p + a + 1
    if q >= n_p:
        tokens[q] = pred[a]
    pos[0] = q
    g = q - max(p + 1, n_p) + 1
    if g > 0:
        stats[0] += 1
        stats[1] += g


@kernel("void(int32[::1], int32[::1], int32[::1], int32[::1], int32[::1], int32[::1], int32[::1])",
        twin=accept_twin, reads=(0, 1, 2, 3, 4, 5, 6), writes=(2, 5, 6))
def accept_kernel(cols, pred, pos, n_prompt, limit, tokens, stats):
    if cuda.threadIdx.x != 0 or cuda.blockIdx.x != 0:    # one thread does the work
        return
    p, n_p, lim, T = pos[0], n_prompt[0], limit[0], cols.shape[0]
    if p >= lim:
        return
    a = 0
    while a + 1 < T and p + a + 1 <= lim - 1 and (p + a + 1 < n_p or cols[a + 1] == pred[a]):
        a += 1
    for i in range(1, a + 1):
        if p + i >= n_p:
            tokens[p + i] = cols[i]
    q = p + a + 1
    if q >= n_p:
        tokens[q] = pred[a]
    pos[0] = q
    g = q - max(p + 1, n_p) + 1
    if g > 0:
        stats[0] += 1
        stats[1] += g


class AcceptStep(DraftStep):
    def accept(self, plan):
        b, s = self.dev.buf, self.dev.draft
        return launch(accept_kernel, ((1,), (1,)),
                      (s.cols, s.pred, b.pos, b.n_prompt, b.limit, b.tokens, s.stats))
'''

# (a) pos advances by the accepted count only: the model's own next token is thrown away
NO_BONUS = variant(REFERENCE, "    q = p + a + 1\n    if q >= n_p:\n        tokens[q] = pred[a]\n",
                   "    q = p + a\n")
# (b) every draft that agrees counts, also after a mismatch
EVERY_AGREEING = variant(
    REFERENCE,
    "    while a + 1 < T and p + a + 1 <= lim - 1 and (p + a + 1 < n_p or "
    "cols[a + 1] == pred[a]):\n"
    "        a += 1\n",
    "    for i in range(1, T):\n"
    "        if p + i <= lim - 1 and (p + i < n_p or cols[i] == pred[i - 1]):\n"
    "            a += 1\n")
# (c) draft i compared with pred[i], the model's choice for the position AFTER it
OFF_BY_ONE = variant(REFERENCE, "cols[a + 1] == pred[a])", "cols[a + 1] == pred[a + 1])")
# (d) no limit: a step at the end still advances, and drafts run past the last position
NO_LIMIT = variant(variant(REFERENCE, "    if p >= lim:\n        return\n"),
                   "p + a + 1 <= lim - 1 and ")

# the reference kernel's body and what follows it, up to the step class (cut from the reference,
# not written out a second time)
_KERNEL = REFERENCE[REFERENCE.index("    if cuda.threadIdx.x != 0"):
                    REFERENCE.index("class AcceptStep") + len("class AcceptStep")]
assert REFERENCE.count(_KERNEL) == 1
# (e) the kernel's body left empty: its twin is right, so the engine on a laptop (which runs the
# twin) decodes right; a GPU would run the kernel, which writes nothing
EMPTY_KERNEL = variant(REFERENCE, _KERNEL, "    pass\n\n\nclass AcceptStep")
# (f) guarded on the thread only, launched on two blocks: each block's thread 0 does the work
TWO_BLOCKS = variant(variant(REFERENCE, "if cuda.threadIdx.x != 0 or cuda.blockIdx.x != 0:",
                             "if cuda.threadIdx.x != 0:"),
                     "launch(accept_kernel, ((1,), (1,))", "launch(accept_kernel, ((2,), (1,))")
# (g) no guard on a 32-thread block: every thread does the whole acceptance
EVERY_THREAD = variant(variant(REFERENCE, _KERNEL[:_KERNEL.index("    p, n_p, lim, T")], ""),
                       "launch(accept_kernel, ((1,), (1,))", "launch(accept_kernel, ((1,), (32,))")
# (i) the twin right, the kernel off by one (the engine on a laptop runs the twin: only the
# kernel on the simulator shows it)
KERNEL_OFF_BY_ONE = variant(REFERENCE, _KERNEL, _KERNEL.replace("cols[a + 1] == pred[a])",
                                                                "cols[a + 1] == pred[a + 1])"))
# (h) the guard keeps thread 1, which a one-thread launch does not have
WRONG_THREAD = variant(REFERENCE, "if cuda.threadIdx.x != 0 or", "if cuda.threadIdx.x != 1 or")

_REFS = (("kernels.draft.accept_twin", draft.accept_twin),
         ("kernels.draft.accepted", draft.accepted),
         ("lab.engine.draft.DraftStep.accept", DraftStep.accept))
_ARGS = ("draft.cols", "draft.pred", "buf.pos", "buf.n_prompt", "buf.limit", "buf.tokens",
         "draft.stats")


# ---- the hand-made cases ----------------------------------------------------------------------
# (name, p, n_prompt, limit, cols, pred): drafts confirmed where cols[i] == pred[i - 1]. Each case
# is where one mistake first shows: every draft taken or none, a mismatch before drafts that agree
# again, drafts equal to the prediction one column on, prompt positions (forced, left as they are;
# the step ending on the last one; the bonus on the first generated one), the limit three, one and
# zero positions away. A case's name holds none of the words a verdict names a mistake with (a
# test): the verdict's words are the diagnosis's.
CASES = (
    ("every draft confirmed", 10, 3, 100, [7, 11, 12, 13, 14], [11, 12, 13, 14, 15]),
    ("draft 1 rejected, the rest agreeing", 10, 3, 100, [7, 20, 12, 13, 14],
     [11, 12, 13, 14, 15]),
    ("a mismatch, then drafts that agree again", 10, 3, 100, [7, 11, 50, 13, 14],
     [11, 12, 13, 14, 15]),
    ("each draft equal to the prediction one column on", 10, 3, 100, [7, 30, 31, 32, 33],
     [30, 30, 31, 32, 33]),
    ("prompt positions: forced, the prompt untouched", 2, 6, 100, [42, 43, 44, 45, 50],
     [1, 2, 3, 50, 60]),
    ("the bonus on the first position after the prompt", 2, 6, 100, [42, 43, 44, 45, 77],
     [1, 2, 3, 50, 60]),
    ("the whole step inside the prompt", 0, 9, 100, [40, 90, 91, 92, 93], [9, 9, 9, 9, 9]),
    ("the step ends on the last prompt position", 0, 6, 100, [40, 90, 91, 92, 93],
     [9, 9, 9, 9, 9]),
    ("three positions before limit[0]", 10, 3, 13, [7, 11, 12, 13, 14], [11, 12, 13, 14, 15]),
    ("one position before limit[0]", 12, 3, 13, [7, 13, 14, 15, 16], [13, 14, 15, 16, 17]),
    ("at limit[0]: the generation is done", 13, 3, 13, [7, 11, 12, 13, 14],
     [11, 12, 13, 14, 15]),
)
# cases of one draft (LAB_DRAFT=1: T = 2 columns), for the kernel on the simulator (the engine's
# buffers hold K + 1 columns): a kernel that takes k from anything but cols.shape shows here
ONE_DRAFT_CASES = (
    ("one draft, confirmed", 10, 3, 100, [7, 11], [11, 12]),
    ("one draft, rejected", 10, 3, 100, [7, 20], [11, 12]),
)
STATS0 = (3, 7)       # stats before each case: accept adds to them
_STATS = ("stats[0] (the verify steps that generated)", "stats[1] (the tokens generated)")


def _random_cases(n: int = 48, seed: int = 34) -> tuple:
    """`n` cases drawn at random (k = 4): positions around the prompt's end and the limit,
    drafts that agree with pred more often than not. Only with DECODE_LAB_FIXTURE=large (the
    mutation tool's re-run of a mutant listed as equivalent)."""
    rng = np.random.default_rng(seed)
    out = []
    for c in range(n):
        n_p = int(rng.integers(1, 12))
        p = int(rng.integers(max(0, n_p - 6), n_p + 8))
        lim = int(rng.integers(p - 1, p + 9))
        pred = [int(v) for v in rng.integers(10, 60, K + 1)]
        cols = [int(rng.integers(10, 60))] + [
            pred[i - 1] if rng.random() < 0.7 else int(rng.integers(10, 60))
            for i in range(1, K + 1)]
        out.append((f"drawn {c}", p, n_p, lim, cols, pred))
    return tuple(out)


def _cases() -> tuple:
    """The hand-made cases, and with a large fixture asked for, drawn ones after them."""
    return CASES + (_random_cases() if fixture_size() == "large" else ())


def _start_tokens(max_seq: int, n_prompt: int) -> np.ndarray:
    """The prompt's ids 40, 41, ..., zeros after it (nothing generated yet)."""
    t = np.zeros(max_seq, np.int32)
    t[:n_prompt] = 40 + np.arange(n_prompt)
    return t


def _case_arrays(case, max_seq):
    """The kernel's seven arguments for `case`, in its order, as they are before the launch."""
    _, p, n_p, lim, cols, pred = case
    return [np.asarray(v, np.int32) for v in (cols, pred, [p], [n_p], [lim],
                                              _start_tokens(max_seq, n_p), STATS0)]


def model_outcome(case, max_seq, bonus=True, prefix=True, shift=1, prompt=True, room=1):
    """(pos, tokens, stats) after an acceptance with the given flaws (none: the rule): no bonus
    token, drafts counted past the first mismatch (not a prefix), draft i held to pred[i - shift],
    prompt positions not forced, drafts only while p + i <= limit - room."""
    _, p, n_p, lim, cols, pred = case
    tokens, stats = _start_tokens(max_seq, n_p), np.array(STATS0, np.int32)
    if p >= lim:
        return p, tokens, stats

    def ok(i):
        return p + i <= lim - room and ((prompt and p + i < n_p) or cols[i] == pred[i - shift])
    if prefix:
        a = 0
        while a + 1 < len(cols) and ok(a + 1):
            a += 1
    else:
        a = sum(ok(i) for i in range(1, len(cols)))
    for i in range(1, a + 1):
        if p + i >= n_p:
            tokens[p + i] = cols[i]
    q = p + a + 1 if bonus else p + a
    if bonus and q >= n_p:
        tokens[q] = pred[a]
    g = q - max(p + 1, n_p) + 1
    if g > 0:
        stats += (1, g)
    return q, tokens, stats


def expected(case, max_seq):
    """(pos, tokens, stats) after the lab's own acceptance (kernels.draft.accept_twin): what a
    right solution leaves; `model_outcome` with no flaw agrees with it on every case (a test)."""
    cols, pred, pos, n_prompt, limit, tokens, stats = _case_arrays(case, max_seq)
    draft.accept_twin(draft.ACCEPT_GRID, draft.ACCEPT_BLOCK, cols, pred, pos, n_prompt, limit,
                      tokens, stats)
    return int(pos[0]), tokens, stats


MISTAKES = (    # (the flaws, what the verdict says)
    ({"bonus": False}, "no bonus token: pos advanced by the accepted count only. pred[a], the "
                       "model's choice after the last accepted column, is the next token, and it "
                       "is free: write it at p + a + 1 and advance pos by a + 1"),
    ({"prefix": False}, "accepted drafts after the first mismatch: keep only the longest agreeing "
                        "PREFIX -- once draft i is rejected, every prediction after column i "
                        "was made on a token the text does not have"),
    ({"shift": 0}, "off by one: draft i compared with {shifted}; pred[t] is the model's choice "
                   "AFTER column t (the token for position p + t + 1), so draft i (position "
                   "p + i) is confirmed by pred[i - 1]"),
    ({"shift": 2}, "off by one: draft i compared with {shifted}; pred[t] is the model's choice "
                   "AFTER column t (the token for position p + t + 1), so draft i (position "
                   "p + i) is confirmed by pred[i - 1]"),
    ({"room": 2}, "stopped one draft short of the limit: a draft fits while p + i <= limit - 1, "
                  "and the bonus token then lands on the limit itself (pos reaches limit[0], "
                  "the last position to reach)"),
    ({"prompt": False}, "a draft at a prompt position was rejected: where p + i < n_prompt the "
                        "column is the prompt's own token, known, so it is accepted whatever pred "
                        "says (the model's guess there does not matter)"),
)


def _how_many(d: int) -> str:
    n = "one" if abs(d) == 1 else str(abs(d))
    return f"{n} too many" if d > 0 else f"{n} too few"


def _why_taken(case, i: int) -> str:
    """Why the rule accepts draft i of `case` (it does)."""
    _, p, n_p, lim, cols, pred = case
    edge = (f"; p + {i} = {p + i} = limit - 1 still leaves room for the bonus token on the limit"
            if p + i == lim - 1 else "")
    if p + i < n_p:
        return (f"position p + {i} = {p + i} is a prompt position (n_prompt = {n_p}): its token "
                f"is known, so the draft is accepted whatever pred says{edge}")
    return f"pred[{i - 1}] = {pred[i - 1]} confirms cols[{i}] = {cols[i]}{edge}"


def _why_not(case, i: int) -> str:
    """Why the rule stops before draft i of `case`."""
    _, p, n_p, lim, cols, pred = case
    if i >= len(cols):
        return (f"there are only {len(cols) - 1} drafts (cols[1:]): pos moves by at most "
                f"{len(cols)}")
    if p + i > lim - 1:
        return (f"position p + {i} = {p + i} leaves no room for the bonus token before the "
                f"limit (a draft needs p + i <= limit - 1 = {lim - 1})")
    return (f"position {p + i} is past the prompt and pred[{i - 1}] = {pred[i - 1]} differs "
            f"from cols[{i}] = {cols[i]}: the first mismatch ends the accepted prefix")


def _pos_words(case, pos: int, want: int, short: bool = False, tokens=None) -> str:
    """pos[0] against the rule's, in words: how far it moved, and (unless `short`) which draft
    it took or left -- or, moved too little, whether the bonus token went uncounted (`tokens`,
    what the step wrote, tells: a bonus written at the new pos was counted)."""
    _, p, n_p, lim, cols, pred = case
    a, moved, rule = want - p - 1, pos - p, want - p
    said = f"{a} accepted draft{'s' if a != 1 else ''} and the bonus token"
    if moved == 0:
        return f"pos[0] did not move; the rule moves it by {rule} ({said})"
    if moved < 0:
        return f"pos[0] moved backwards, by {-moved}; the rule moves it forward by {rule} ({said})"
    text = (f"pos[0] moved by {moved} where the rule moves it by {rule} ({said}): "
            f"{_how_many(moved - rule)}")
    if short:
        return text
    if moved > rule:
        return f"{text} -- as if draft {a + 1} was accepted, though {_why_not(case, a + 1)}"
    i = moved                  # the first draft not taken, if the bonus was counted
    rejected = f"draft {i} was rejected, though {_why_taken(case, i)}"
    uncounted = "the bonus token was not counted (pos moves past the accepted drafts AND the " \
                "bonus token)"
    if not 1 <= i <= a:
        return f"{text} -- {uncounted}"
    if tokens is None or pos < n_p:
        return f"{text} -- either {rejected}, or {uncounted}"
    start = _start_tokens(tokens.shape[0], n_p)
    written = np.flatnonzero(tokens != start)
    if written.size and written[-1] > pos:
        return (f"{text} -- pos stops at {pos}, short of tokens[{written[-1]}] that the step "
                f"wrote: {uncounted}")
    bonus, draft_i = tokens[pos] == pred[moved - 1], tokens[pos] == cols[moved]
    if bonus and not draft_i:
        return f"{text} -- {rejected}"
    if draft_i and not bonus:
        return f"{text} -- the bonus token was neither written nor counted"
    return f"{text} -- either {rejected}, or {uncounted}"


def _sources(case, v: int) -> list[str]:
    _, p, n_p, lim, cols, pred = case
    return [f"cols[{k}]" for k, c in enumerate(cols) if c == v] + \
        [f"pred[{k}]" for k, c in enumerate(pred) if c == v]


def _token_words(case, j: int, got: int, want_tokens, want_pos: int, start) -> str:
    """tokens[j], which differs from the rule's, in words: which slot it is, and how it is wrong
    (not written, written where the rule writes nothing, another column's or prediction's)."""
    _, p, n_p, lim, cols, pred = case
    a, want = want_pos - p - 1, int(want_tokens[j])
    if j == p:
        role = (f"position p itself (its token is decided already, cols[0]; the accepted drafts "
                f"go to p + 1 .. p + a)")
        right = None
    elif p < j < want_pos:
        role, right = f"the slot of accepted draft {j - p} (cols[{j - p}])", ("cols", j - p)
    elif j == want_pos:
        role, right = (f"the bonus slot p + a + 1 (pred[a] = pred[{a}], the model's own next "
                       f"token)"), ("pred", a)
    elif j > want_pos:
        role, right = (f"one past the bonus slot p + a + 1 = {want_pos}: one too far"
                       if j == want_pos + 1 else f"{j - want_pos} past the bonus slot p + a + 1 "
                       f"= {want_pos}, beyond what this step fills"), None
    else:
        role, right = f"{p - j} before position p, decided before this step", None
    if got == start[j] and want != start[j]:
        return f"tokens[{j}], {role}, was not written"
    if want == start[j]:
        return f"tokens[{j}], {role}, was written ({got}) where the rule leaves it alone"
    src = _sources(case, got)
    shown = f" ({', '.join(src)})" if src else ""
    text = f"tokens[{j}], {role}, holds {got}{shown} instead of {want}"
    if right and any(s.startswith(f"{right[0]}[") and abs(int(s[len(right[0]) + 1:-1]) -
                                                           right[1]) == 1 for s in src):
        text += (f": off by one -- draft i goes to position p + i, the bonus pred[a] to "
                 f"p + a + 1")
    elif right and any(s.startswith("pred[" if right[0] == "cols" else "cols[") for s in src):
        text += f": {'a prediction' if right[0] == 'cols' else 'a draft'} in place of " \
                f"{'the draft' if right[0] == 'cols' else 'the bonus pred[a]'}"
    return text


def _stats_words(case, stats, want_stats, want_pos: int) -> list[str]:
    _, p, n_p, lim, cols, pred = case
    g = int(want_stats[1]) - STATS0[1]
    out = []
    for k in (0, 1):
        dg, dw = int(stats[k]) - STATS0[k], int(want_stats[k]) - STATS0[k]
        if dg == dw:
            continue
        if dg == 0:
            text = (f"{_STATS[k]} did not change (up by 0 where the rule adds {dw}: "
                    f"{_how_many(-dw)}): its update is missing, skipped or adds 0")
        elif dg < 0:
            text = (f"{_STATS[k]} went down by {-dg} instead of up by {dw}: subtracted where the "
                    f"rule adds (the sign flipped)" if dw > 0 else
                    f"{_STATS[k]} went down by {-dg} where the rule leaves it alone")
        else:
            text = f"{_STATS[k]} went up by {dg} where the rule adds {dw}: {_how_many(dg - dw)}"
        if k == 1:
            text += (f" (g = how many of the positions p + 1 .. p + a + 1 = {p + 1} .. "
                     f"{want_pos} are at or past n_prompt = {n_p}: {g}; prompt positions are "
                     f"not generated)")
        elif g == 0:
            text += (" (this step filled prompt positions only: it generated nothing, and counts "
                     "in neither)")
        else:
            text += " (one per verify step that generated: g > 0)"
        out.append(text)
    return out


def _diagnose(case, got, max_seq, runs=()) -> str:
    """What is wrong with `got` = (pos, tokens, stats) on `case`, in words: the mistake it shows
    -- a rule broken, or a flawed model of the rule that reproduces it and what the solution
    left on every other case it ran (`runs`: (case, outcome) pairs; one case alone rarely tells
    two flaws apart) -- else each quantity that differs: which one, which slot, in which
    direction."""
    name, p, n_p, lim, cols, pred = case
    pos, tokens, stats = got
    want = expected(case, max_seq)
    where = (f"case '{name}' (p={p}, n_prompt={n_p}, limit={lim}, cols={cols}, pred={pred})")
    start = _start_tokens(max_seq, n_p)
    changed = np.flatnonzero(tokens != start)
    if any(i < n_p for i in changed):
        return (f"{where}: tokens[{changed[0]}], a prompt position, was overwritten: a prompt "
                f"token is known, so the rule does not write there (accept it as it is)")
    if p >= lim and (pos != p or changed.size or list(stats) != list(STATS0)):
        return (f"{where}: a step at or past the limit changed pos, tokens or stats. The engine "
                f"issues whole rounds of steps, so a step at the limit must do nothing; going "
                f"past the limit writes past the end of the generation")
    if pos > lim or any(i > lim for i in changed):
        return (f"{where}: went past the limit (limit[0] = {lim}; pos[0] = {pos}): accept "
                f"drafts only while p + i <= limit - 1, so that the bonus lands at the limit at "
                f"the latest")
    if pos == p and not changed.size and list(stats) == list(STATS0):
        return (f"{where}: the step changed nothing -- pos[0] did not move, no token was "
                f"written, stats did not change: a step before the limit always moves pos by "
                f"at least 1 (the bonus token, with no draft accepted) -- a return before the "
                f"update?")

    def same(x, y):
        return x[0] == y[0] and np.array_equal(x[1], y[1])
    fits = [(flaws, words) for flaws, words in MISTAKES
            if same((pos, tokens), model_outcome(case, max_seq, **flaws))
            and not same((pos, tokens), want)
            and all(same(model_outcome(c, max_seq, **flaws), o) for c, o in runs)]
    if fits:
        # the draft held to another prediction: every shift that fits, named (on one case
        # pred[i] and pred[i - 2] may reject the same drafts)
        shifted = " or ".join("pred[i]" if f["shift"] == 0 else f"pred[i - {f['shift']}]"
                              for f, _ in fits if "shift" in f)
        return (f"{where}: {fits[0][1].format(shifted=shifted)} "
                f"({_pos_words(case, pos, want[0], short=True)})")
    parts = []
    if pos != want[0]:
        parts.append(_pos_words(case, pos, want[0], tokens=tokens))
    bad = np.flatnonzero(tokens != want[1])
    if bad.size:
        j = int(bad[0])
        more = f" (and {bad.size - 1} more token{'s' if bad.size > 2 else ''} differ)" \
            if bad.size > 1 else ""
        parts.append(_token_words(case, j, int(tokens[j]), want[1], want[0], start) + more)
    parts += _stats_words(case, stats, want[2], want[0])
    return f"{where}: {'; '.join(parts) or 'as the rule leaves them'}"


def _twin_fault(twin, case, max_seq) -> str | None:
    """Where the student's twin indexes out of bounds on `case` (run on plain arrays: the engine
    reports it as a device fault, as a GPU would), in words; None if it does not."""
    args = _case_arrays(case, max_seq)
    try:
        twin(draft.ACCEPT_GRID, draft.ACCEPT_BLOCK, *args)
    except IndexError as exc:
        frames = traceback.extract_tb(exc.__traceback__)
        line = frames[-1].line if frames else ""
        name, p, n_p, lim, cols, pred = case
        return (f"case '{name}' (p={p}, n_prompt={n_p}, limit={lim}, cols={cols}, pred={pred}): "
                f"your twin reads or writes out of bounds{f' at `{line}`' if line else ''} "
                f"({' '.join(str(exc).split())}) -- an index past the end of its array, an "
                f"illegal memory access on a GPU: cols and pred hold {len(cols)} entries (index "
                f"0 .. {len(cols) - 1}), pos, n_prompt and limit one (index 0), stats two, tokens "
                f"{max_seq}")
    except Exception:        # noqa: BLE001 -- another error: the engine's own report stands
        return None
    return None


# ---- the check --------------------------------------------------------------------------------
def _step_class(sol):
    (cls,) = need(sol, ("AcceptStep",))
    if not (isinstance(cls, type) and issubclass(cls, DraftStep)):
        raise Fail(f"AcceptStep is {cls!r}: make it a subclass of lab.engine.draft.DraftStep "
                   f"(the verify step), overriding accept(self, plan)")
    return cls


def _accept_launch(eng, cls) -> Launch:
    """The student's accept launch, checked: their own kernel, the seven buffers in order."""
    item = watched(_REFS, cls(eng).accept, eng.plan(), what="AcceptStep.accept")
    if not isinstance(item, Launch):
        raise Fail(f"AcceptStep.accept returned {item!r}: return lab.engine.step.launch("
                   f"accept_kernel, (grid, block), args)")
    kern = item.kernel
    if kern is draft.accept or getattr(kern, "twin", None) is draft.accept_twin or getattr(
            kern, "py_func", None) is draft.accept.py_func:
        raise Fail("AcceptStep.accept launches kernels.draft.accept, the lab's own kernel that "
                   "this check compares against: write it yourself")
    if not callable(getattr(kern, "twin", None)):
        raise Fail(f"AcceptStep.accept launches {kern!r}: declare your kernel with "
                   f"lab.teach.handson.kernel(..., twin=accept_twin, ...)")
    if kern.name in kernels.REGISTRY:   # a GPU backend compiles kernels once per process, by name
        raise Fail(f"your kernel is named {kern.name!r}, as a kernel of the lab's: a GPU would "
                   f"run the lab's kernel of that name; name yours otherwise (accept_kernel)")
    b, s = eng.bufs[0], eng.draft_buffers
    want = (s.cols, s.pred, b.pos, b.n_prompt, b.limit, b.tokens, s.stats)
    if len(item.args) != len(want) or any(
            getattr(x, "name", None) != w.name for x, w in zip(item.args, want)):
        got = ", ".join(getattr(x, "name", repr(x)) for x in item.args)
        raise Fail(f"the launch's arguments are ({got}); the kernel takes, in order, "
                   f"({', '.join(_ARGS)})")
    return item


def _run_case(eng, item, case):
    """Upload the case into the engine's buffers, issue the student's launch alone, read back;
    a twin that indexes out of bounds (a device fault, as on a GPU) is named with its line."""
    be, b, s = eng.backend, eng.bufs[0], eng.draft_buffers
    max_seq = b.tokens.shape[0]
    cols, pred, pos, n_prompt, limit, tokens, stats = _case_arrays(case, max_seq)
    for buf, value in ((b.tokens, tokens), (b.pos, pos), (b.n_prompt, n_prompt),
                       (b.limit, limit), (s.cols, cols), (s.pred, pred), (s.stats, stats)):
        be.upload(buf, value)

    def run():
        issue(eng, item)
        return int(be.download(b.pos)[0]), be.download(b.tokens), be.download(s.stats)
    try:
        return watched(_REFS, run, what=f"accept_kernel (case '{case[0]}')")
    except Fail as exc:
        if "DeviceFault" in str(exc):
            words = _twin_fault(item.kernel.twin, case, max_seq)
            if words:
                raise Fail(words) from None
        raise


def _kernel_runs(item, every, max_seq) -> list:
    """(case, (pos, tokens, stats)) of the student's kernel on every case, at their launch's
    grid and block on numba's CUDA simulator: what a diagnosis holds a flawed model to (asked
    for once a case differs; a case whose launch raised is left out)."""
    src, name = kernel_source(item.kernel)
    arrays, launches = {}, []
    for c, case in enumerate(every):
        keys = []
        for j, a in enumerate(_case_arrays(case, max_seq)):
            arrays[f"c{c}.{j}"] = a
            keys.append(f"c{c}.{j}")
        launches.append(cudasim.Launch(f"{case[0]}: yours, for the diagnosis", f"yours:{name}",
                                       tuple(item.grid), tuple(item.block), keys))
    out = []
    for case, r in zip(every, simulate(launches, arrays, {"yours": src}, what=f"{name} (yours)")):
        if not r.error:
            out.append((case, (int(r.arrays[2][0]), r.arrays[5], r.arrays[6])))
    return out


_ONE_THREAD_OOB = re.compile(r"^case '(?P<case>[^']*)': .*?(?P<error>IndexError: [^)]*)\)")


def _kernel_case(eng, item) -> str:
    """The student's kernel itself, at their launch's grid and block, on numba's CUDA simulator
    beside the reference kernel, on every hand-made case (and cases of one draft): the same
    pos, tokens and stats, each element written by one thread, no prompt position written, and
    what their twin leaves."""
    max_seq = eng.bufs[0].tokens.shape[0]
    ref = Source(REFERENCE, "accept reference").namespace().accept_kernel
    every = _cases() + ONE_DRAFT_CASES
    cases, protect, by_name = [], {}, {c[0]: c for c in every}
    for case in every:
        cases.append((case[0], _case_arrays(case, max_seq)))
        prompt = np.zeros(max_seq, bool)
        prompt[:case[2]] = True
        protect[case[0]] = {5: (prompt, "a prompt position: its token is known; accept it as "
                                        "it is and write nothing there")}

    def diagnose(cname, after):
        return _diagnose(by_name[cname], (int(after[2][0]), after[5], after[6]), max_seq,
                         _kernel_runs(item, every, max_seq))
    try:
        n = hold_kernel(item.kernel, item.grid, item.block, cases, ref, draft.ACCEPT_GRID,
                        draft.ACCEPT_BLOCK, [a.split(".")[-1] for a in _ARGS], _REFS, diagnose,
                        protect)
    except Fail as exc:
        m = _ONE_THREAD_OOB.match(str(exc))
        if m and np.prod(item.grid) * np.prod(item.block) == 1 and m["case"] in by_name:
            # one thread, so no spare thread ran past the work: the index itself is wrong
            name, p, n_p, lim, cols, pred = by_name[m["case"]]
            raise Fail(f"your kernel {item.kernel.name} on numba's CUDA simulator, case "
                       f"'{name}' (p={p}, n_prompt={n_p}, limit={lim}, cols={cols}, "
                       f"pred={pred}): reads or writes out of bounds ({m['error']}) -- an index "
                       f"past the end of its array, an illegal memory access on a GPU: cols and "
                       f"pred hold k + 1 = {len(cols)} entries (index 0 .. {len(cols) - 1}; k "
                       f"comes from cols.shape[0], not a constant), pos, n_prompt and limit one, "
                       f"stats two") from None
        raise
    return (f"your kernel on numba's CUDA simulator at its launch's geometry: {n} cases, one "
            f"writer per element, the reference's and your twin's values")


def _engine(backend, cls, graph: bool):
    """A fresh LAB_DRAFT=K engine with the solution's step, its kernels compiled before any
    capture (a GPU compiles outside captures)."""
    def build():
        eng = engine(backend, draft=K, step=cls, graph=graph)
        eng.backend.warm_up({x.kernel for x in eng.step_launches(eng.plan())})
        return eng
    return watched(_REFS, build, what="building the engine with AcceptStep")


def _generate(backend, cls, graph: bool):
    """(the generation, its engine, the bytes to compare: tokens and the verify step's buffers)."""
    eng = _engine(backend, cls, graph)
    gen = watched(_REFS, eng.generate, PROMPT, TOKENS, what=f"generating with AcceptStep "
                  f"(LAB_DRAFT={K}, {'graph' if graph else 'eager'})")
    kept = {"tokens": gen.tokens.tobytes()}
    kept.update({n: eng.backend.download(getattr(eng.draft_buffers, n)).tobytes()
                 for n in ("logits", "pred", "cols", "stats")})
    return gen, eng, kept


def cases(sol, backend):
    cls = _step_class(sol)
    eng = _engine(backend, cls, graph=False)
    item = _accept_launch(eng, cls)
    yield "AcceptStep.accept launches your kernel on the seven buffers"
    max_seq = eng.bufs[0].tokens.shape[0]
    runs = [(case, _run_case(eng, item, case)) for case in _cases()]
    for case, got in runs:
        if not all(np.array_equal(g, w) for g, w in zip(got, expected(case, max_seq))):
            raise Fail(_diagnose(case, got, max_seq, runs))
    yield (f"{len(_cases())} cases on device buffers: the prefix, the bonus, the prompt, the "
           f"limit, stats")
    yield _kernel_case(eng, item)
    gen, eng, graph_bytes = _generate(backend, cls, graph=True)
    i = first_difference(gen.tokens, clean_tokens(backend))
    if i is not None:
        raise Fail(f"LAB_DRAFT={K} with your acceptance decodes other tokens than LAB_DRAFT=0 "
                   f"from position {i} (verify steps and tokens counted: {gen.draft})")
    if gen.draft["tokens generated"] != TOKENS:
        raise Fail(f"stats count {gen.draft['tokens generated']} generated tokens; the "
                   f"generation made {TOKENS}")
    yield f"{TOKENS} tokens, LAB_DRAFT=0's, in {gen.draft['verify steps']} verify steps"
    outcomes = eng.ledger_summary()
    if outcomes != {"capture": 1, "replay": len(eng.ledger) - 1}:
        raise Fail(f"the ledger is {outcomes}: one capture, then replays only, was expected")
    yield f"one capture, then {outcomes['replay']} replays"
    _, _, eager_bytes = _generate(backend, cls, graph=False)
    differ = [n for n in graph_bytes if graph_bytes[n] != eager_bytes[n]]
    if differ:
        raise Fail(f"graph replays and eager steps differ in {', '.join(differ)}")
    yield "eager and graph byte-identical (tokens, logits, pred, cols, stats)"


EXERCISE = Exercise(
    "accept", 11, "speculative decoding's acceptance, on the device and replayed",
    "case studies 003/004", STATEMENT, STUB, ("AcceptStep",), cases, REFERENCE,
    {"no bonus": (NO_BONUS, "no bonus token"),
     "every agreeing draft": (EVERY_AGREEING, "longest agreeing PREFIX"),
     "off by one": (OFF_BY_ONE, "off by one"),
     "no limit": (NO_LIMIT, "past the limit"),
     "empty kernel": (EMPTY_KERNEL, "accept_kernel is empty: it writes nothing"),
     "two blocks": (TWO_BLOCKS, "in 2 different blocks"),
     "every thread": (EVERY_THREAD, "a race inside a block"),
     "wrong thread": (WRONG_THREAD, "writes nothing: no thread of the launch reached a write"),
     "kernel off by one": (KERNEL_OFF_BY_ONE, "CUDA simulator: case 'every draft confirmed' "
                                              "(p=10, n_prompt=3, limit=100, cols=[7, 11, 12, "
                                              "13, 14], pred=[11, 12, 13, 14, 15]): off by one")},
    stub_says="AcceptStep.accept returned None", simulator=True)
