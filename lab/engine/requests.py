"""What an engine does with a request, on top of its reset / step (a mixin of lab/engine/runner.py's
DecodeEngine): generate (reset, decode, read the tokens), decode N steps on the backend's clock,
seek, and reading device memory, only when asked."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lab.errors import LabError


@dataclass
class Generation:
    prompt: str
    text: str               # the generated continuation
    tokens: np.ndarray      # prompt + generated ids
    steps: int
    seconds: float
    source: str             # "simulated ..." or "measured on ..."
    draft: dict | None = None   # LAB_DRAFT>0: the engine's spec_stats() (read once, at the end)

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


class Requests:
    def encode(self, prompt: str) -> np.ndarray:
        return self.model.tokenizer.encode(prompt)

    def generate(self, prompt: str, n_tokens: int, progress: bool | None = False) -> Generation:
        """Greedy generation of `n_tokens` after `prompt`; times the whole decode. `progress`:
        True shows a bar, None shows one on a terminal once the decode takes over a second.
        LAB_LOOP=device: one launch of the device loop runs every step (no bar: the host waits).
        LAB_DRAFT=k: `steps` positions in rounds of verify steps; `Generation.draft` holds the
        device's counts (verify steps, tokens generated), read once at the end."""
        ids = self.encode(prompt)
        self.reset(ids, n_tokens)
        steps = ids.size - 1 + n_tokens
        seconds = self.decode(steps, progress)
        tokens = self.tokens(ids.size + n_tokens)
        text = self.model.tokenizer.decode(tokens[ids.size:])
        return Generation(prompt, text, tokens, steps, seconds, self.describe(),
                          self.spec_stats() if self.cfg.draft else None)

    def decode(self, steps: int, progress: bool | None = False) -> float:
        """Decode `steps` steps from the current position (after reset, or seek); the seconds
        they took on the backend's clock (which waits for issued work: wall time on a GPU, model
        time in the simulator). LAB_LOOP=device: ONE launch runs them all (no bar then)."""
        if self.position + steps >= self.model.cfg.max_seq:
            raise LabError(f"{steps} steps from position {self.position} would exceed max_seq "
                           f"{self.model.cfg.max_seq}")
        if self.cfg.draft:                 # speculative: rounds of verify steps (lab/engine/spec.py)
            return self._decode_spec(steps, progress)
        loop = self.device_loop() if self.cfg.loop == "device" else None
        if loop is not None:
            return self._run_device_loop(loop, steps)
        t0 = self.group.clock()
        desc = "decode" if self.ranks == 1 else f"decode x{self.ranks} ranks"
        for _ in progress_bar(range(steps), progress, desc):
            self.step()
        return self.group.clock() - t0

    def seek(self, position: int) -> None:
        """Jump the current request to `position` (device `pos` and host mirror) WITHOUT
        computing the positions before it: the KV rows in between are never written.

        What that is a fixture for depends on what the cache holds. With `kv_init="zeros"` (the
        default) a step at `position` does the work of a step at that context length (same plan,
        same bytes read) over reproducible zeros: usable for timing these kernels, whose work
        does not depend on the values, and for a narrow A/A byte-compare -- but zeros are not a
        real prefix, so it validates nothing about long-context outputs. With `kv_init="empty"`
        attention reads uninitialised memory: two runs differ, so it is no byte-compare fixture,
        and no trustworthy timing fixture either (garbage may hold NaN, inf or denormals, and
        nobody checked that the timing does not depend on them). Needs `reset(prompt)` first;
        the token read at `position` is the prompt's or the id 0 that reset wrote there, a valid
        id. `seek(self.position)` writes only `pos`: a host write between graph launches.
        """
        limit = self.model.cfg.max_seq - 1      # one step at `position` writes position + 1
        if self.n_prompt == 0:
            raise LabError("seek needs a request: call reset(prompt_ids) first")
        if not 0 <= position < limit:
            raise LabError(f"seek to position {position} is outside [0, {limit}): a decode step "
                           f"there would pass max_seq {self.model.cfg.max_seq}")
        for be, b in zip(self.backends, self.bufs):
            be.upload(b.pos, np.array([position], np.int32))
        self.position = int(position)

    def describe(self) -> str:
        return self.group.describe()

    @property
    def steps_run(self) -> int:
        """Steps this engine has run, over every request (the ledger's step numbers)."""
        return self._steps

    def ledger_summary(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for e in self.ledger:
            out[e.outcome] = out.get(e.outcome, 0) + 1
        return out

    # ---- reading device memory (only when asked) ----------------------------------------------
    def rank_tokens(self, count: int | None = None) -> list[np.ndarray]:
        """Every rank's token ids (they must agree: each rank took the same argmax)."""
        count = self.position + 1 if count is None else count
        return [be.download(b.tokens)[:count] for be, b in zip(self.backends, self.bufs)]

    def tokens(self, count: int | None = None) -> np.ndarray:
        """Token ids in device memory (prompt + generated); with ranks rank 0's, after checking
        that every rank holds the same."""
        toks = self.rank_tokens(count)
        for r, t in enumerate(toks[1:], 1):
            if not np.array_equal(t, toks[0]):
                raise LabError(f"rank {r}'s tokens differ from rank 0's: the ranks disagree")
        return toks[0]

    def logits(self, rank: int = 0) -> np.ndarray:
        """The logits of the real vocabulary (with ranks: gathered, as rank `rank` holds them;
        LAB_DRAFT>0: the last verify step's, one row per column, [k + 1, vocab])."""
        d = self.devices[rank]
        if d.spec is not None:
            return d.backend.download(d.spec.logits)
        return d.backend.download(d.vocab_view)

    def device_position(self, rank: int = 0) -> int:
        return int(self.devices[rank].backend.download(self.devices[rank].buf.pos)[0])
