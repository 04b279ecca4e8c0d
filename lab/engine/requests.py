"""What an engine does with a request, on top of its reset / step: drivers that take an engine.

  generate     reset, decode, read the tokens and check the last logits (a Generation)
  decode       N steps on the backend's clock: host steps, the device loop, or drafting's rounds
  check_seek   what `DecodeEngine.seek` refuses, and what a seek is a fixture for
  tokens       device memory, read only when asked (rank_tokens, tokens, logits)
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lab.errors import LabError, NumericFault
from lab.reference import first_non_finite
from . import device_loop, draft


@dataclass
class Generation:
    prompt: str
    text: str               # the generated continuation
    tokens: np.ndarray      # prompt + generated ids
    steps: int
    seconds: float
    source: str             # "simulated ..." or "measured on ..."
    draft: dict | None = None   # LAB_DRAFT>0: the engine's draft_stats() (read once, at the end)

    @property
    def ms_per_token(self) -> float:
        return 1000.0 * self.seconds / max(self.steps, 1)


def progress_bar(it, progress: bool | None, desc: str):
    """`it` with a tqdm bar: progress True shows one, None shows one on a terminal once the loop
    takes over a second, False none (the iterable itself)."""
    if progress is False:
        return it
    from tqdm.auto import tqdm
    return tqdm(it, desc=desc, unit="step", disable=None if progress is None else False,
                delay=0.0 if progress else 1.0, leave=True)


def generate(eng, prompt: str, n_tokens: int, progress: bool | None = False) -> Generation:
    """Greedy generation of `n_tokens` after `prompt`; times the whole decode. `progress`: True
    shows a bar, None shows one on a terminal once the decode takes over a second.
    LAB_LOOP=device: one launch of the device loop runs every step (no bar: the host waits).
    LAB_DRAFT=k: `steps` positions in rounds of verify steps; `Generation.draft` holds the
    device's counts (verify steps, tokens generated), read once at the end. The last step's
    logits are read after the tokens (once, off the steps' clock) and must be finite
    (check_finite): a NaN propagates through the KV cache to every later step, so a decode
    whose arithmetic overflowed is refused, not returned as text, with what a float32 re-run of
    the same tokens on the host says (lab/reference.py first_non_finite: the first step and the
    layer where a value leaves the finite range, or that the re-run stays finite: a kernel's)."""
    ids = eng.encode(prompt)
    eng.reset(ids, n_tokens)
    steps = ids.size - 1 + n_tokens
    seconds = decode(eng, steps, progress)
    tokens = eng.tokens(ids.size + n_tokens)
    if steps:
        try:
            check_finite(logits(eng), f"the last decode step's (position {eng.position - 1})")
        except NumericFault as fault:   # which step and layer: a host re-run, after the fact
            why = first_non_finite(eng.model, tokens, steps, np.dtype(eng.cfg.kv_dtype))
            raise NumericFault(f"{fault}; {why}") from None
    text = eng.model.tokenizer.decode(tokens[ids.size:])
    return Generation(prompt, text, tokens, steps, seconds, eng.describe(),
                      draft.read_stats(eng) if eng.cfg.draft else None)


def decode(eng, steps: int, progress: bool | None = False) -> float:
    """Decode `steps` steps from the current position (after reset, or seek); the seconds they
    took on the backend's clock (which waits for issued work: wall time on a GPU, model time in
    the simulator). LAB_LOOP=device: ONE launch runs them all (no bar then). Then each step's
    `check_decode` (the persistent step's error word: a DeviceFault)."""
    if eng.position + steps >= eng.model.cfg.max_seq:
        raise LabError(f"{steps} steps from position {eng.position} would exceed max_seq "
                       f"{eng.model.cfg.max_seq}")
    if eng.cfg.draft:                 # speculative: rounds of verify steps (lab/engine/draft.py)
        return draft.decode_rounds(eng, steps, progress)
    loop = device_loop.get(eng) if eng.cfg.loop == "device" else None
    if loop is not None:
        return device_loop.run(eng, loop, steps)
    t0 = eng.group.clock()
    desc = "decode" if eng.ranks == 1 else f"decode x{eng.ranks} ranks"
    for _ in progress_bar(range(steps), progress, desc):
        eng.step()
    seconds = eng.group.clock() - t0
    for pieces in eng.issuer.pieces:   # after the clock: a check may read the device
        pieces.check_decode()
    return seconds


def check_seek(eng, position: int) -> None:
    """Refuse (a LabError) a seek to `position` without a request, or past the last position a
    step can start from. What a seek is a fixture for depends on what the cache holds. With
    kv_init="zeros" (the default) a step at `position` does the work of a step at that context
    length (same plan, same bytes read) over reproducible zeros: usable for timing these
    kernels, whose work does not depend on the values, and for a narrow A/A byte-compare -- but
    zeros are not a real prefix, so it validates nothing about long-context outputs. With
    kv_init="empty" attention reads uninitialised memory: two runs differ, so it is no
    byte-compare fixture, and no trustworthy timing fixture either (garbage may hold NaN, inf or
    denormals). The token read at `position` is the prompt's or the id 0 that reset wrote
    there, a valid id; `seek(eng.position)` writes only `pos`."""
    limit = eng.model.cfg.max_seq - 1      # one step at `position` writes position + 1
    if eng.n_prompt == 0:
        raise LabError("seek needs a request: call reset(prompt_ids) first")
    if not 0 <= position < limit:
        raise LabError(f"seek to position {position} is outside [0, {limit}): a decode step "
                       f"there would pass max_seq {eng.model.cfg.max_seq}")


def rank_tokens(eng, count: int | None = None) -> list[np.ndarray]:
    """Every rank's token ids (they must agree: each rank took the same argmax)."""
    count = eng.position + 1 if count is None else count
    return [d.backend.download(d.buf.tokens)[:count] for d in eng.devices]


def tokens(eng, count: int | None = None) -> np.ndarray:
    """Token ids in device memory (prompt + generated); with ranks rank 0's, after checking that
    every rank holds the same."""
    toks = rank_tokens(eng, count)
    for r, t in enumerate(toks[1:], 1):
        if not np.array_equal(t, toks[0]):
            raise LabError(f"rank {r}'s tokens differ from rank 0's: the ranks disagree")
    return toks[0]


def check_finite(values: np.ndarray, what: str) -> np.ndarray:
    """`values` (logits the host has read) if every one is finite; else a NumericFault saying `what`
    they are (the step's position) and how many are NaN or infinite (not why: `generate` adds
    first_non_finite's diagnosis)."""
    bad = ~np.isfinite(values)
    if bad.any():
        raise NumericFault(f"{what} logits hold {int(np.isnan(values).sum())} NaN and "
                       f"{int(np.isinf(values).sum())} infinite value(s) of {values.size}: its "
                       f"tokens are no result")
    return values


def logits(eng, rank: int = 0) -> np.ndarray:
    """The logits of the real vocabulary (with ranks: gathered, as rank `rank` holds them;
    LAB_DRAFT>0: the last verify step's, one row per column, [k + 1, vocab])."""
    d = eng.devices[rank]
    if d.draft is not None:
        return d.backend.download(d.draft.logits)
    return d.backend.download(d.vocab_view)
