"""Beyond the checklist (the case studies 003/004): speculative decoding's acceptance, on the
device, so that one graph replays the whole generation.

The student writes the acceptance kernel (its numba source and its NumPy twin, as
kernels/draft.py's `accept` does) and the verify step's piece that launches it
(`AcceptStep(SpecStep).accept`). The check first runs that launch alone on hand-made device
buffers -- each case built so that a common mistake shows, and is named -- then the same cases
with the student's kernel itself on numba's CUDA simulator (the engine on a laptop runs its
twin), then generates with
LAB_DRAFT=4 in the real engine: the greedy tokens of LAB_DRAFT=0 across positions 32 and 64, one
capture then replays only, and the eager path's bytes.
"""
from __future__ import annotations

import numpy as np

import kernels
from kernels import draft
from lab.backend import Launch
from lab.engine.spec import SpecStep
from .base import Exercise, Fail, Source, hold_kernel, issue, need, variant, watched
from .fixtures import PROMPT, TOKENS, clean_tokens, engine, first_difference

K = 4     # the check's LAB_DRAFT: the verify step's columns are T = K + 1

SPEC = """
Speculative decoding (LAB_DRAFT=k) drafts k tokens and verifies them with ONE step of the model
over the k + 1 columns cols = [tokens[p], draft 1, ..., draft k] (p = pos[0]). The step leaves
pred[t], the model's greedy choice after column t: the token for position p + t + 1. Acceptance
decides on the device how far the step got; the host never reads it between steps, so one
captured graph serves the whole generation.

Write three things:
  accept_twin(grid, block, cols, pred, pos, n_prompt, limit, tokens, stats)
        the NumPy twin: what the engine runs for one launch on the sim backend. It mutates pos,
        tokens and stats in place. All int32: cols, pred [k + 1]; pos, n_prompt, limit [1]; tokens [max_seq];
        stats [2] = (verify steps that generated, tokens generated).
  accept_kernel(cols, pred, pos, n_prompt, limit, tokens, stats)
        the numba.cuda source of the same kernel (one thread does the work; a GPU runs it,
        and this check on numba's CUDA simulator), declared with lab.teach.handson.kernel(...)
        and your twin
  AcceptStep(SpecStep)  its accept(self, plan) returns the launch of your kernel:
        lab.engine.step.launch(accept_kernel, (grid, block), args), args in the kernel's order:
        self.dev.spec.cols, self.dev.spec.pred, self.dev.buf.pos, self.dev.buf.n_prompt,
        self.dev.buf.limit, self.dev.buf.tokens, self.dev.spec.stats

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

The check: hand-made cases on device buffers (each common mistake named); the same cases with
your kernel itself at your launch's grid and block on numba's CUDA simulator (a laptop runs it
there): the reference kernel's pos, tokens and stats, each element written by exactly one thread,
no prompt position written, what your twin leaves; then LAB_DRAFT=4 generations from a 7-token
prompt across positions 32 and 64: LAB_DRAFT=0's greedy tokens, one capture then replays only,
eager and graph byte-identical. Launching kernels.draft.accept (the
lab's own), calling its twin or SpecStep.accept fails the check.
"""

STUB = '''
import numpy as np
from numba import cuda

from lab.engine.spec import SpecStep
from lab.engine.step import launch
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


class AcceptStep(SpecStep):
    def accept(self, plan):
        """The launch of accept_kernel after the verify step's columns."""
        # FILL ME IN: return launch(accept_kernel, ((1,), (1,)), (the seven buffers, in order))
        return None
'''

REFERENCE = '''
from numba import cuda

from lab.engine.spec import SpecStep
from lab.engine.step import launch
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


class AcceptStep(SpecStep):
    def accept(self, plan):
        b, s = self.dev.buf, self.dev.spec
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
         ("lab.engine.spec.SpecStep.accept", SpecStep.accept))
_ARGS = ("spec.cols", "spec.pred", "buf.pos", "buf.n_prompt", "buf.limit", "buf.tokens",
         "spec.stats")


# ---- the hand-made cases ----------------------------------------------------------------------
# (name, p, n_prompt, limit, cols, pred): T = K + 1 columns; drafts confirmed where
# cols[i] == pred[i - 1]. Each case is where one mistake first shows.
CASES = (
    ("every draft confirmed", 10, 3, 100, [7, 11, 12, 13, 14], [11, 12, 13, 14, 15]),
    ("a mismatch, then drafts that agree again", 10, 3, 100, [7, 11, 50, 13, 14],
     [11, 12, 13, 14, 15]),
    ("prompt positions: forced, never overwritten", 2, 6, 100, [42, 43, 44, 45, 50],
     [1, 2, 3, 50, 60]),
    ("the whole step inside the prompt", 0, 9, 100, [40, 41, 42, 43, 44], [9, 9, 9, 9, 9]),
    ("three positions before the limit", 10, 3, 13, [7, 11, 12, 13, 14], [11, 12, 13, 14, 15]),
    ("at the limit: the generation is done", 13, 3, 13, [7, 11, 12, 13, 14],
     [11, 12, 13, 14, 15]),
)
STATS0 = (3, 7)       # stats before each case: accept adds to them


def _start_tokens(max_seq: int, n_prompt: int) -> np.ndarray:
    """The prompt's ids 40, 41, ..., zeros after it (nothing generated yet)."""
    t = np.zeros(max_seq, np.int32)
    t[:n_prompt] = 40 + np.arange(n_prompt)
    return t


def model_outcome(case, max_seq, bonus=True, prefix=True, shift=1, prompt=True):
    """(pos, tokens, stats) after an acceptance with the given flaws (none: the rule)."""
    _, p, n_p, lim, cols, pred = case
    tokens, stats = _start_tokens(max_seq, n_p), np.array(STATS0, np.int32)
    if p >= lim:
        return p, tokens, stats

    def ok(i):
        return p + i <= lim - 1 and ((prompt and p + i < n_p) or cols[i] == pred[i - shift])
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
    _, p, n_p, lim, cols, pred = case
    tokens, stats = _start_tokens(max_seq, n_p), np.array(STATS0, np.int32)
    pos = np.array([p], np.int32)
    draft.accept_twin(draft.ACCEPT_GRID, draft.ACCEPT_BLOCK, np.array(cols, np.int32),
                      np.array(pred, np.int32), pos, np.array([n_p], np.int32),
                      np.array([lim], np.int32), tokens, stats)
    return int(pos[0]), tokens, stats


MISTAKES = (    # (the flaws, what the verdict says)
    ({"bonus": False}, "no bonus token: pos advanced by the accepted count only. pred[a], the "
                       "model's choice after the last accepted column, is the next token, and it "
                       "is free: write it at p + a + 1 and advance pos by a + 1"),
    ({"prefix": False}, "accepted drafts after the first mismatch: keep only the longest agreeing "
                        "PREFIX -- once draft i is rejected, every prediction after column i "
                        "was made on a token the text does not have"),
    ({"shift": 0}, "off by one: draft i compared with pred[i]; pred[t] is the model's choice "
                   "AFTER column t (the token for position p + t + 1), so draft i (position "
                   "p + i) is confirmed by pred[i - 1]"),
    ({"prompt": False}, "a draft at a prompt position was rejected: where p + i < n_prompt the "
                        "column is the prompt's own token, known, so it is accepted whatever pred "
                        "says (the model's guess there does not matter)"),
)


def _diagnose(case, got, max_seq) -> str:
    """What is wrong with `got` = (pos, tokens, stats) on `case`: the mistake it shows."""
    name, p, n_p, lim, cols, pred = case
    pos, tokens, stats = got
    want = expected(case, max_seq)
    where = (f"case '{name}' (p={p}, n_prompt={n_p}, limit={lim}, cols={cols}, pred={pred}): "
             f"pos[0] = {pos} (expected {want[0]})")
    start = _start_tokens(max_seq, n_p)
    changed = np.flatnonzero(tokens != start)
    if any(i < n_p for i in changed):
        return (f"{where}; tokens[{changed[0]}], a prompt position, was overwritten: a prompt "
                f"token is known; accept it as it is and write nothing there")
    if p >= lim and (pos != p or changed.size or list(stats) != list(STATS0)):
        return (f"{where}: a step at or past the limit changed pos, tokens or stats. The engine "
                f"issues whole rounds of steps, so a step at the limit must do nothing; going "
                f"past the limit writes past the end of the generation")
    if pos > lim or any(i > lim for i in changed):
        return (f"{where}: went past the limit (limit[0] = {lim}): accept drafts only while "
                f"p + i <= limit - 1, so that the bonus lands at the limit at the latest")
    for flaws, words in MISTAKES:
        m = model_outcome(case, max_seq, **flaws)
        if pos == m[0] and np.array_equal(tokens, m[1]) and not (
                pos == want[0] and np.array_equal(tokens, want[1])):
            return f"{where}; {words}"
    if pos == p:
        return (f"{where}: pos[0] did not move: accept advances it past the accepted drafts and "
                f"the bonus token")
    if pos == want[0] and np.array_equal(tokens, want[1]):
        return (f"{where}; stats = {stats.tolist()}, expected {want[2].tolist()} (they were "
                f"{list(STATS0)}): add g (how many of p + 1 .. p + a + 1 are at or past n_prompt) "
                f"to stats[1], and 1 to stats[0] when g > 0")
    lo, hi = p + 1, min(max_seq, p + len(cols) + 1)
    return (f"{where}; tokens[{lo}:{hi}] = {tokens[lo:hi].tolist()}, expected "
            f"{want[1][lo:hi].tolist()}")


# ---- the check --------------------------------------------------------------------------------
def _step_class(sol):
    (cls,) = need(sol, ("AcceptStep",))
    if not (isinstance(cls, type) and issubclass(cls, SpecStep)):
        raise Fail(f"AcceptStep is {cls!r}: make it a subclass of lab.engine.spec.SpecStep "
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
    b, s = eng.bufs[0], eng.dev_spec
    want = (s.cols, s.pred, b.pos, b.n_prompt, b.limit, b.tokens, s.stats)
    if len(item.args) != len(want) or any(
            getattr(x, "name", None) != w.name for x, w in zip(item.args, want)):
        got = ", ".join(getattr(x, "name", repr(x)) for x in item.args)
        raise Fail(f"the launch's arguments are ({got}); the kernel takes, in order, "
                   f"({', '.join(_ARGS)})")
    return item


def _run_case(eng, item, case):
    """Upload the case into the engine's buffers, issue the student's launch alone, read back."""
    _, p, n_p, lim, cols, pred = case
    be, b, s = eng.backend, eng.bufs[0], eng.dev_spec
    max_seq = b.tokens.shape[0]
    for buf, value in ((b.tokens, _start_tokens(max_seq, n_p)), (b.pos, [p]), (b.n_prompt, [n_p]),
                       (b.limit, [lim]), (s.cols, cols), (s.pred, pred), (s.stats, STATS0)):
        be.upload(buf, np.asarray(value, np.int32))

    def run():
        issue(eng, item)
        return int(be.download(b.pos)[0]), be.download(b.tokens), be.download(s.stats)
    return watched(_REFS, run, what=f"accept_kernel (case '{case[0]}')")


def _kernel_case(eng, item) -> str:
    """The student's kernel itself, at their launch's grid and block, on numba's CUDA simulator
    beside the reference kernel, on every hand-made case: the same pos, tokens and stats, each
    element written by one thread, no prompt position written, and what their twin leaves."""
    max_seq = eng.bufs[0].tokens.shape[0]
    ref = Source(REFERENCE, "accept reference").namespace().accept_kernel
    cases, protect, by_name = [], {}, {c[0]: c for c in CASES}
    for case in CASES:
        name, p, n_p, lim, cols, pred = case
        cases.append((name, [np.asarray(v, np.int32) for v in (
            cols, pred, [p], [n_p], [lim], _start_tokens(max_seq, n_p), STATS0)]))
        prompt = np.zeros(max_seq, bool)
        prompt[:n_p] = True
        protect[name] = {5: (prompt, "a prompt position: its token is known; accept it as it "
                                     "is and write nothing there")}

    def diagnose(cname, after):
        return _diagnose(by_name[cname], (int(after[2][0]), after[5], after[6]), max_seq)
    n = hold_kernel(item.kernel, item.grid, item.block, cases, ref, draft.ACCEPT_GRID,
                    draft.ACCEPT_BLOCK, [a.split(".")[-1] for a in _ARGS], _REFS, diagnose,
                    protect)
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
    kept.update({n: eng.backend.download(getattr(eng.dev_spec, n)).tobytes()
                 for n in ("logits", "pred", "cols", "stats")})
    return gen, eng, kept


def cases(sol, backend):
    cls = _step_class(sol)
    eng = _engine(backend, cls, graph=False)
    item = _accept_launch(eng, cls)
    yield "AcceptStep.accept launches your kernel on the seven buffers"
    max_seq = eng.bufs[0].tokens.shape[0]
    for case in CASES:
        got, want = _run_case(eng, item, case), expected(case, max_seq)
        if not all(np.array_equal(g, w) for g, w in zip(got, want)):
            raise Fail(_diagnose(case, got, max_seq))
    yield f"{len(CASES)} hand-made cases: the prefix, the bonus, the prompt, the limit, stats"
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
    "case studies 003/004", SPEC, STUB, ("AcceptStep",), cases, REFERENCE,
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
                                              "13, 14], pred=[11, 12, 13, 14, 15]): pos[0] = 11 "
                                              "(expected 15); off by one")},
    stub_says="AcceptStep.accept returned None", simulator=True)
