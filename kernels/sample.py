"""Greedy sampling on the device: the next token id is written by a kernel, never by the host.

Owns `argmax_next`: tokens[pos[0] + 1] = argmax(logits) unless that slot is still part of the
prompt (nxt < n_prompt[0], the prompt is preloaded in tokens) or past the end of `tokens`. So
prompt ingestion and generation are the same step. Ties go to the LOWEST index; NaN never wins
(all-NaN logits give token 0).

One block of ARGMAX_THREADS = 256 threads: thread t scans i = t, t + 256, ... keeping its best
(value, index), then kernels/reduce.py's `block_argmax` picks the block's best pair (one barrier
and a shuffle butterfly on a GPU, the shared-memory tree under numba's CUDA simulator). The
pick is a total order on (value, index) pairs, so the id never depends on the reduction order.
"""
import math

import numba
import numpy as np
from numba import cuda

from kernels.registry import kernel
from kernels.pdl import pdl_launch_dependents, pdl_wait
from kernels.reduce import BLOCK_THREADS, block_argmax

ARGMAX_THREADS = BLOCK_THREADS  # 256: block_argmax is written for exactly this many
ARGMAX_GRID = (1,)
ARGMAX_BLOCK = (ARGMAX_THREADS,)


def argmax_twin_index(logits) -> int:
    """Lowest index of the largest non-NaN logit; 0 if all are NaN."""
    valid = np.flatnonzero(~np.isnan(logits))
    if valid.size == 0:
        return 0
    return int(valid[np.argmax(logits[valid])])  # np.argmax returns the first maximum


def argmax_next_twin(grid, block, logits, pos, n_prompt, tokens):
    nxt = int(pos[0]) + 1
    if nxt < tokens.shape[0] and nxt >= int(n_prompt[0]):
        tokens[nxt] = argmax_twin_index(logits)


@cuda.jit(device=True)
def pick_next(logits, tokens, nxt, tid, red_v, red_i):
    """tokens[nxt] = argmax(logits) over a block of ARGMAX_THREADS threads (every thread calls):
    a strided scan per thread, then reduce's block_argmax. red_v, red_i: shared [threads]."""
    V = logits.shape[0]
    bv = numba.float32(-math.inf)
    bi = numba.int32(V)  # "none yet": loses every comparison below on index
    for i in range(tid, V, ARGMAX_THREADS):
        v = logits[i]
        # NaN compares false both ways, so it is never taken; -inf is taken only if nothing better
        if v > bv or (v == bv and i < bi):
            bv = v
            bi = numba.int32(i)
    best = block_argmax(bv, bi, tid, red_v, red_i)
    if tid == 0:
        tokens[nxt] = best if best < V else 0  # V: every logit was NaN


def argmax_next_float_twin(grid, block, logits, pos, n_prompt, tokens):
    nxt = int(pos[0]) + 1
    if nxt < tokens.shape[0] and nxt >= int(n_prompt[0]):
        tokens[nxt] = np.float32(argmax_twin_index(logits))


@kernel("void(float32[::1], int32[::1], int32[::1], int32[::1])",
        twin=argmax_next_twin, reads=(0, 1, 2, 3), writes=(3,))
def argmax_next(logits, pos, n_prompt, tokens):
    """tokens[pos[0]+1] = argmax(logits) if n_prompt[0] <= pos[0]+1 < max_seq; grid (1,), block 256.

    logits [V], pos [1], n_prompt [1], tokens [max_seq].
    """
    pdl_wait()
    pdl_launch_dependents()  # the next kernel may launch now; it waits in its pdl_wait
    best_v = cuda.shared.array(ARGMAX_THREADS, numba.float32)  # [threads]
    best_i = cuda.shared.array(ARGMAX_THREADS, numba.int32)    # [threads]
    nxt = pos[0] + 1
    if nxt >= tokens.shape[0] or nxt < n_prompt[0]:
        return  # uniform over the block: no thread is left waiting at a barrier
    pick_next(logits, tokens, nxt, cuda.threadIdx.x, best_v, best_i)


@kernel("void(float32[::1], int32[::1], int32[::1], float32[::1])",
        twin=argmax_next_float_twin, reads=(0, 1, 2, 3), writes=(3,))
def argmax_next_float(logits, pos, n_prompt, tokens):
    """argmax_next storing the id as a float32 (LAB_BUG_FLOAT_IDS: the token buffer reaches it
    viewed as float32). Id 40 is stored as 40.0f, whose bits an int32 reader sees as 1109393408.
    Same geometry and rules as argmax_next."""
    pdl_wait()
    pdl_launch_dependents()
    best_v = cuda.shared.array(ARGMAX_THREADS, numba.float32)  # [threads]
    best_i = cuda.shared.array(ARGMAX_THREADS, numba.int32)    # [threads]
    nxt = pos[0] + 1
    if nxt >= tokens.shape[0] or nxt < n_prompt[0]:
        return
    pick_next(logits, tokens, nxt, cuda.threadIdx.x, best_v, best_i)


# ---- the cases kernels/check.py runs (c: the dims of one of its tiny models)
CASES = {
    # (pos, n_prompt): generate; nxt == n_prompt (the first generated); nxt < n_prompt (prompt,
    # untouched); nxt == max_seq - 1 (the last slot); nxt == max_seq (past the end, untouched)
    "rules": lambda c: ((3, 2), (3, 4), (3, 5), (c["max_seq"] - 2, 1), (c["max_seq"] - 1, 1)),
    "tol": (0.0, 0),
    "why": "an index: exact",
}
