"""Speculative decoding's two bookkeeping kernels: the drafter and the acceptance.

Contents
  latest_match, draft_lookup_twin  the drafting rule in NumPy (prompt lookup)
  draft_lookup                     fills the verify step's columns: tokens[p], then drafts
  ngram_drafts, draft_ngram_twin   the other drafter's rule in NumPy (an n-gram table)
  draft_ngram                      fills the columns from the table: tokens[p], then drafts
  accepted, accept_twin            the acceptance rule in NumPy
  accept                           keeps the confirmed drafts and the bonus, advances pos
  CASES                            kernels/check.py's cases

Two drafters (LAB_DRAFTER): `draft_lookup` copies what followed the latest earlier occurrence
of the text's last tokens (it pays where the model copies the text it was given); `draft_ngram`
asks a table of the model's training corpus which token most often follows the last
NGRAM_CONTEXT tokens, chained over its own drafts (it pays where the model writes what its
corpus writes). The table is an input (lab/engine/draft.py builds it from the corpus), never
a global.

Device state only (never a host value, so a captured graph replays at any position): tokens
[max_seq] int32 (prompt, then generated ids), pos [1] (the step's column 0 is position p),
n_prompt [1], limit [1] (the last position a generation may reach, limit <= max_seq - 1).
"""
import numba
import numpy as np
from numba import cuda

from kernels.registry import kernel
from kernels.pdl import pdl_launch_dependents, pdl_wait

NGRAM = 3             # longest n-gram the drafter matches (then 2, then 1)
NGRAM_CONTEXT = 4     # draft_ngram's context: the table answers for the last 4 tokens
MAX_COLS = 9          # columns of a verify step: T = k + 1, k <= 8 drafted tokens
DRAFT_THREADS = 128   # draft_lookup's block: candidate ends scanned in parallel
DRAFT_GRID = (1,)
DRAFT_BLOCK = (DRAFT_THREADS,)
NGRAM_GRID = (1,)
NGRAM_BLOCK = (1,)
ACCEPT_GRID = (1,)
ACCEPT_BLOCK = (1,)


# ---------------------------------------------------------------- draft_lookup

def latest_match(tokens, p: int) -> tuple[int, int]:
    """(n, j): the longest n <= NGRAM with a match and its latest end j < p, or (0, -1).
    Every candidate end at once: after k steps, hit[i] says tokens[j-m] == tokens[p-m] for
    m <= k at the end j = i + k (so j >= n - 1 for n = k + 1 tokens)."""
    t = np.asarray(tokens)
    hit = t[:p] == t[p] if p > 0 else np.zeros(0, bool)     # [p] n = 1: ends j = 0 .. p-1
    latest = []
    for k in range(min(NGRAM, p)):
        if k:
            hit = hit[1:] & (t[:p - k] == t[p - k])           # [p-k] ends j = k .. p-1
        idx = np.flatnonzero(hit)
        latest.append(int(idx[-1]) + k if idx.size else -1)
    for n in range(len(latest), 0, -1):                      # a longer n-gram wins
        if latest[n - 1] >= 0:
            return n, latest[n - 1]
    return 0, -1


def draft_lookup_twin(grid, block, tokens, pos, n_prompt, limit, cols):
    p, n_p, lim = int(pos[0]), int(n_prompt[0]), int(limit[0])
    _, j = latest_match(tokens, p)
    cols[0] = tokens[p]
    for i in range(1, cols.shape[0]):
        q = p + i
        if q > lim:                  # past the generation's end: never accepted
            cols[i] = tokens[p]
        elif q < n_p:                # a prompt token: forced
            cols[i] = tokens[q]
        elif j < 0:                  # no match for any n: the fallback
            cols[i] = tokens[p]
        elif j + i <= p:             # the occurrence's continuation, a known token
            cols[i] = tokens[j + i]
        else:                        # ... or one drafted just before (a periodic loop)
            cols[i] = cols[j + i - p]


@kernel("void(int32[::1], int32[::1], int32[::1], int32[::1], int32[::1])",
        twin=draft_lookup_twin, reads=(0, 1, 2, 3), writes=(4,))
def draft_lookup(tokens, pos, n_prompt, limit, cols):
    """cols[0] = tokens[p]; cols[1..T-1] = prompt tokens or prompt-lookup drafts; tokens
    [max_seq], pos/n_prompt/limit [1], cols [T] (T = k + 1 <= MAX_COLS); grid (1,), block (128,).

    Column i = 1 .. T-1 at position q = p + i, the first rule that applies:
      1. q > limit: tokens[p] (a filler: accept never takes a position past limit - 1);
      2. q < n_prompt: tokens[q] (a prompt token: known, forced);
      3. a match: for n = NGRAM (3), 2, 1, the LATEST j with n-1 <= j < p whose n-gram
         tokens[j-n+1 .. j] equals the text's last one tokens[p-n+1 .. p]; the first n that has
         one wins (a longer context beats a later occurrence of a shorter one). Position p+i
         gets tokens[j+i] if j+i <= p, else cols[j+i-p], a guess made just before: the
         continuation runs into the draft itself (a periodic loop of period p - j);
      4. the fallback, when no n matches: tokens[p].
    Only tokens at positions <= p are read. Thread x scans the candidate ends j = x, x + 128,
    ... < p, extends each match backwards while the tokens agree and keeps per n its latest j;
    a shared-memory max tree (exact in any order) gives each n's latest j; then thread 0 writes
    the columns in increasing i."""
    pdl_wait()
    pdl_launch_dependents()  # the next kernel may launch now; it waits in its pdl_wait
    best = cuda.shared.array((NGRAM, DRAFT_THREADS), numba.int32)  # [n-1, threads] latest end j
    tid = cuda.threadIdx.x
    p = pos[0]
    mine = cuda.local.array(NGRAM, numba.int32)                    # [n-1] this thread's latest j
    for n in range(NGRAM):
        mine[n] = -1
    for j in range(tid, p, DRAFT_THREADS):  # increasing j: a later match overwrites
        n = 0
        while n < NGRAM and j - n >= 0 and tokens[j - n] == tokens[p - n]:
            mine[n] = j                     # tokens[j-n .. j] == tokens[p-n .. p]
            n += 1
    for n in range(NGRAM):
        best[n, tid] = mine[n]
    cuda.syncthreads()
    s = DRAFT_THREADS // 2
    while s > 0:                            # max tree; uniform: every thread, every stride
        if tid < s:
            for n in range(NGRAM):
                best[n, tid] = max(best[n, tid], best[n, tid + s])
        cuda.syncthreads()
        s //= 2
    if tid == 0:
        j = numba.int32(-1)
        n = NGRAM
        while n > 0 and j < 0:              # the longest n-gram that has a match
            j = best[n - 1, 0]
            n -= 1
        cur = tokens[p]
        lim = limit[0]
        n_p = n_prompt[0]
        cols[0] = cur
        for i in range(1, cols.shape[0]):   # increasing i: cols[j+i-p] (< i) is written
            q = p + i
            v = cur                         # past limit, or the fallback
            if q <= lim:
                if q < n_p:
                    v = tokens[q]
                elif j >= 0:
                    v = tokens[j + i] if j + i <= p else cols[j + i - p]
            cols[i] = v


# ---------------------------------------------------------------- draft_ngram

def ngram_drafts(tokens, p: int, n_prompt: int, limit: int, table, T: int) -> np.ndarray:
    """[T] the columns draft_ngram writes (see its docstring): tokens[p], then per column the
    filler past limit, a prompt token, or the table's choice for the last NGRAM_CONTEXT tokens
    of the text so far (its drafts included)."""
    t = np.asarray(tokens)
    V = table.shape[1]
    ctx = [int(t[q]) if q >= 0 else 0 for q in range(p - NGRAM_CONTEXT + 1, p + 1)]
    cols = np.empty(T, np.int32)
    cols[0] = t[p]
    for i in range(1, T):
        q = p + i
        if q > limit:
            v = int(t[p])
        elif q < n_prompt:
            v = int(t[q])
        else:
            row = 0
            for c in ctx[:-1]:
                row = row * V + c
            v = int(table[row, ctx[-1]])
        cols[i] = v
        ctx = ctx[1:] + [v]
    return cols


def draft_ngram_twin(grid, block, tokens, pos, n_prompt, limit, table, cols):
    cols[:] = ngram_drafts(tokens, int(pos[0]), int(n_prompt[0]), int(limit[0]), table,
                           cols.shape[0])


@kernel("void(int32[::1], int32[::1], int32[::1], int32[::1], uint8[:, ::1], int32[::1])",
        twin=draft_ngram_twin, reads=(0, 1, 2, 3, 4), writes=(5,))
def draft_ngram(tokens, pos, n_prompt, limit, table, cols):
    """cols[0] = tokens[p]; cols[1..T-1] = prompt tokens or the n-gram table's drafts; tokens
    [max_seq], pos/n_prompt/limit [1], table [V**(NGRAM_CONTEXT-1), V] uint8, cols [T];
    grid (1,), block (1,) (thread 0 of block 0: each draft is the next one's context).

    The context is the text's last NGRAM_CONTEXT tokens, c_1 .. c_n (positions p-n+1 .. p; a
    position before 0 reads as token 0). Column i = 1 .. T-1 at position q = p + i, the first
    rule that applies:
      1. q > limit: tokens[p] (a filler: accept never takes a position past limit - 1);
      2. q < n_prompt: tokens[q] (a prompt token: known, forced);
      3. table[row, c_n], row = ((c_1 V + c_2) V + ...) + c_{n-1}: the corpus's most frequent
         token after that context (lab/engine/draft.py: unseen contexts back off to shorter).
    The column's token then joins the context (the oldest leaves it). Only tokens at positions
    <= p are read."""
    pdl_wait()
    pdl_launch_dependents()  # the next kernel may launch now; it waits in its pdl_wait
    if cuda.threadIdx.x != 0 or cuda.blockIdx.x != 0:  # robust to a wider launch
        return
    ctx = cuda.local.array(NGRAM_CONTEXT, numba.int32)
    p = pos[0]
    for m in range(NGRAM_CONTEXT):
        q = p - NGRAM_CONTEXT + 1 + m
        ctx[m] = tokens[q] if q >= 0 else 0
    V = table.shape[1]
    cur = tokens[p]
    lim = limit[0]
    n_p = n_prompt[0]
    cols[0] = cur
    for i in range(1, cols.shape[0]):
        q = p + i
        v = cur                             # past limit
        if q <= lim:
            if q < n_p:
                v = tokens[q]
            else:
                row = 0
                for m in range(NGRAM_CONTEXT - 1):
                    row = row * V + ctx[m]
                v = numba.int32(table[row, ctx[NGRAM_CONTEXT - 1]])
        cols[i] = v
        for m in range(NGRAM_CONTEXT - 1):
            ctx[m] = ctx[m + 1]
        ctx[NGRAM_CONTEXT - 1] = v


# ---------------------------------------------------------------- accept

def accepted(cols, pred, p: int, n_prompt: int, limit: int) -> int:
    """a: how many drafts (columns 1, 2, ...) the verify step keeps."""
    a = 0
    while (a + 1 <= cols.shape[0] - 1 and p + a + 1 <= limit - 1
           and (p + a + 1 < n_prompt or cols[a + 1] == pred[a])):
        a += 1
    return a


def accept_twin(grid, block, cols, pred, pos, n_prompt, limit, tokens, stats):
    p, n_p, lim = int(pos[0]), int(n_prompt[0]), int(limit[0])
    if p >= lim:                                  # the generation is done: a no-op step
        return
    a = accepted(cols, pred, p, n_p, lim)
    for i in range(1, a + 1):
        if p + i >= n_p:
            tokens[p + i] = cols[i]
    q = p + a + 1                                 # the bonus token's position
    if q >= n_p:
        tokens[q] = pred[a]
    pos[0] = q
    g = sum(1 for x in range(p + 1, q + 1) if x >= n_p)
    if g > 0:
        stats[0] += 1
        stats[1] += g


@kernel("void(int32[::1], int32[::1], int32[::1], int32[::1], int32[::1], int32[::1], int32[::1])",
        twin=accept_twin, reads=(0, 1, 2, 3, 4, 5, 6), writes=(2, 5, 6))
def accept(cols, pred, pos, n_prompt, limit, tokens, stats):
    """Keep the confirmed drafts and the bonus token, advance pos.

    cols, pred [T], pos/n_prompt/limit [1], tokens [max_seq], stats [2] = (steps that generated,
    tokens generated); grid (1,), block (1,) (thread 0 of block 0 does all the work).

    If p >= limit the generation is done and nothing changes. Otherwise draft i = 1, 2, ... is
    accepted while i <= T-1 and p + i <= limit - 1 (room for the bonus) and (p + i < n_prompt
    or cols[i] == pred[i-1]) (pred[t]: the model's argmax after column t); a = the number
    accepted. Generated positions among p+1 .. p+a get cols[i]; the bonus q = p+a+1 gets
    pred[a] if q >= n_prompt (a prompt slot is never overwritten); pos[0] = p + a + 1.
    stats[1] += g, the positions of p+1 .. p+a+1 at or past n_prompt; stats[0] += 1 if g > 0.
    As pred[t] is the greedy choice given columns 0..t and every accepted column equals it, the
    sequence is exactly the one a step per token writes.
    """
    pdl_wait()
    pdl_launch_dependents()  # the next kernel may launch now; it waits in its pdl_wait
    if cuda.threadIdx.x != 0 or cuda.blockIdx.x != 0:  # robust to a wider launch
        return
    p = pos[0]
    lim = limit[0]
    n_p = n_prompt[0]
    if p >= lim:
        return
    T = cols.shape[0]
    a = 0
    while a + 1 <= T - 1 and p + a + 1 <= lim - 1 and (p + a + 1 < n_p or cols[a + 1] == pred[a]):
        a += 1
    for i in range(1, a + 1):
        if p + i >= n_p:
            tokens[p + i] = cols[i]
    q = p + a + 1
    if q >= n_p:
        tokens[q] = pred[a]
    pos[0] = q
    g = q - max(p + 1, n_p) + 1  # positions of p+1 .. q at or past n_prompt
    if g > 0:
        stats[0] += 1
        stats[1] += g


# ---- the cases kernels/check.py runs
CASES = {
    # draft_lookup: (tokens, p, n_prompt, limit (None: max_seq - 1), what it holds)
    "texts": (([5, 1, 2, 1, 2], 4, 1, None, "periodic"),              # (1, 2) at j = 2, period 2
              ([5, 1, 2, 9, 5, 1, 2, 7, 5, 1, 2], 10, 1, None, "latest"),  # ends 2 and 6: 6 wins
              ([1, 2, 3, 8, 4, 3, 6, 1, 2, 3], 9, 1, None, "longest"),  # 3-gram at 2, '3' at 5
              (list(range(20, 32)), 11, 1, None, "fallback"),
              ([4, 4], 0, 1, None, "p=0"),
              ([1, 2, 3, 1, 2, 3, 50, 51], 5, 8, None, "prompt"),  # 6, 7 forced; the loop reads them
              ([1, 2, 3, 1, 2, 3, 50, 51], 5, 8, 7, "limit")),     # 8.. past limit: tokens[p]
    # draft_ngram over a random table of "ngram_vocab" tokens: (tokens, p, n_prompt, limit
    # (None: max_seq - 1), what it holds)
    "ngram_vocab": 5,
    "ngram": (([1, 2, 3, 4, 0, 1, 2], 6, 1, None, "chained"),     # 5 drafts, each the next's context
              ([2, 4], 1, 1, None, "short"),                     # positions before 0 read as 0
              ([3], 0, 1, None, "p=0"),
              ([1, 2, 3, 1, 2, 3, 4, 0], 5, 8, None, "prompt"),  # 6, 7 forced, then the table
              ([1, 2, 3, 1, 2, 3, 4, 0], 5, 1, 7, "limit")),     # 8.. past limit: tokens[p]
    # accept: (cols, pred, p, n_prompt, limit (None: max_seq - 1), what it holds)
    "verdicts": (([103, 7, 8, 9], [7, 8, 9, 4], 3, 2, None, "all"),
                 ([103, 7, 8, 9], [7, 5, 9, 4], 3, 2, None, "mismatch"),
                 ([103, 7, 8, 9], [6, 8, 9, 4], 3, 2, None, "bonus only"),
                 ([102, 103, 104, 9], [0, 0, 9, 4], 2, 5, None, "prompt"),
                 ([100, 101, 102, 103], [5, 5, 5, 5], 0, 10, None, "all prompt"),
                 ([104, 7, 8, 9], [7, 8, 9, 4], 4, 2, 6, "limit"),
                 ([106, 7, 8, 9], [7, 8, 9, 4], 6, 2, 6, "at limit")),   # a no-op
    "tol": (0.0, 0),
    "why": "token ids and counts: exact",
}
