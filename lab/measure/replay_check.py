"""The replay check: is the captured step really the eager step, replay after replay?

`replay_check(engine, prompts, replays=8)` runs each prompt twice on the SAME engine (a
DecodeEngine; with ranks, every rank's logits are compared) -- once
eagerly, once with the decode steps as graph replays (capturing on a plan-key miss) -- and
byte-compares every generated token id and every step's logits. Graphs stay cached across
prompts, so the second prompt checks replays after a request reset. Prompt ingestion runs
eagerly in both arms, so replay k is the k-th generated token.

A bug that freezes a host value at capture is right on replay 1 and wrong from replay 2: a
check with one replay passes, a check with three fails. `first_mismatch` says where. Three is a
floor that catches this lab's frozen-value bugs, not a proof that every graph bug shows by the
third token: check many replays, across plan boundaries and after a request reset.

Was the graph replayed at all? `key_parts_beyond_plan(ledger)` names every part of the graph
keys, named or not, that takes more values over the run than the plan does (more than one under
some plan): each value files the plan's work under a graph of its own, captured once and found
again only if that value comes back (LAB_BUG_STEP_KEY, LAB_BUG_SPEC_KEY: case study 004's
question). A step count, a position or `position // 2`, a clock tick, a part with no name, a
part that repeats once before it changes: each is one. `never_repeating(ledger)` is the
narrower check notebook 04 has the student write: the NAMED parts whose value differs at every
step; it misses a part with no name and one that repeats before it changes.

Why bytes, not a tolerance: this lab's kernels are deterministic (no atomic in any sum -- the
fused step's "last block done" counters only elect which block does the follow-on work -- and a
fixed reduction order), both arms start from the same initialised state and run the same
launches in an order their dependencies fix, so a replay must reproduce the eager step bit for
bit. That is a property of these kernels and this fixture, not of CUDA graphs in general:
kernels with atomic accumulation or order-dependent reductions can differ between two eager
runs already, and then only an A/A control tells a real difference from that noise.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from lab.ledger import GRAPH_RAN, key_changes


@dataclass
class Decoded:
    """What one side of the check decoded (a bench `Arm` is something else: a timed config)."""
    tokens: np.ndarray          # generated ids [replays]
    logits: np.ndarray          # [replays, vocab], float32 as the device wrote them


@dataclass
class PromptCheck:
    prompt_ids: np.ndarray
    eager: Decoded
    graph: Decoded
    ledger: list = field(default_factory=list)   # the graph arm's ledger entries

    @property
    def first_mismatch(self) -> int | None:
        """1-based replay index of the first differing token or logits row; None if identical."""
        for k in range(len(self.eager.tokens)):
            if (self.eager.tokens[k] != self.graph.tokens[k]
                    or self.eager.logits[k].tobytes() != self.graph.logits[k].tobytes()):
                return k + 1
        return None

    @property
    def ok(self) -> bool:
        return self.first_mismatch is None


@dataclass
class ReplayReport:
    replays: int
    checks: list[PromptCheck]

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def summary(self) -> str:
        lines = [f"replay_check: {len(self.checks)} prompt(s) x {self.replays} replays: "
                 f"{'IDENTICAL' if self.ok else 'MISMATCH'}"]
        for i, c in enumerate(self.checks):
            outcomes: dict[str, int] = {}
            for e in c.ledger:
                outcomes[e.outcome] = outcomes.get(e.outcome, 0) + 1
            where = "" if c.ok else f", first mismatch at replay {c.first_mismatch}"
            lines.append(f"  prompt {i}: {len(c.prompt_ids)} ids, ledger {outcomes}{where}")
        return "\n".join(lines)


def _logits(engine) -> np.ndarray:
    """The step's logits; with ranks (LAB_RANKS=2) every rank's copy side by side, so that a
    replay must reproduce each rank's bits, not only rank 0's."""
    ranks = getattr(engine, "ranks", 1)
    if ranks == 1:
        return engine.logits()
    return np.concatenate([engine.logits(r) for r in range(ranks)])


def decode_after_prompt(engine, prompt_ids, steps: int, graph: bool) -> tuple[Decoded, list]:
    """Ingest the prompt eagerly, then decode `steps` tokens (as graph replays if `graph`)."""
    cfg = engine.cfg
    try:
        engine.cfg = cfg.replace(graph=False)
        engine.reset(prompt_ids, steps)
        for _ in range(len(prompt_ids) - 1):
            engine.step()
        engine.cfg = cfg.replace(graph=graph)
        start = len(engine.ledger)
        logits = []
        for _ in range(steps):
            engine.step()
            logits.append(_logits(engine))
        tokens = engine.tokens(len(prompt_ids) + steps)[len(prompt_ids):]
        return Decoded(tokens, np.array(logits)), engine.ledger[start:]
    finally:
        engine.cfg = cfg


def replay_check(engine, prompts, replays: int = 8) -> ReplayReport:
    """Byte-compare graph replays with eager steps for each prompt (token-id arrays or text)."""
    if replays < 1:
        raise ValueError("replays must be >= 1")
    checks = []
    for p in prompts:
        ids = engine.encode(p) if isinstance(p, str) else np.asarray(p, np.int32)
        eager, _ = decode_after_prompt(engine, ids, replays, graph=False)
        graph, ledger = decode_after_prompt(engine, ids, replays, graph=True)
        checks.append(PromptCheck(ids, eager, graph, ledger))
    return ReplayReport(replays, checks)


def never_repeating(ledger) -> set[str]:
    """The names in the ledger's graph keys (flat (name, value, name, value, ...) tuples) whose
    value is different at every step of a graph run: with one of them in the key, no graph is
    looked up twice. A clean run's keys change only at plan boundaries, so none is found."""
    values: dict[str, list] = {}
    for entry in ledger:
        if entry.outcome in ("eager", "device"):
            continue
        key = entry.plan_key
        for name, value in zip(key[::2], key[1::2]):
            values.setdefault(name, []).append(repr(value))
    return {name for name, seen in values.items() if len(seen) > 1 and len(set(seen)) == len(seen)}


def key_parts_beyond_plan(ledger) -> dict[str, dict]:
    """{key part: {"values": its values under the plans where it changed (sorted where they
    compare), "plans": how many plans it changed under}} for each part of the ledger's graph
    keys, named ("pos") or not ("part 10 (no name)", `lab.ledger.key_parts`), that takes more
    than one value under one plan: over the run it takes more values than the plan does. A
    clean run's graph key is its plan key, so it gives {}."""
    out: dict[str, dict] = {}
    for parts in key_changes(ledger).values():
        for label, values in parts.items():
            row = out.setdefault(label, {"values": [], "plans": 0})
            row["values"] += [v for v in values if v not in row["values"]]
            row["plans"] += 1
    for row in out.values():
        try:
            row["values"].sort()
        except TypeError:       # values of several types: the order they were met in
            pass
    return out


def graph_steps(ledger) -> int:
    """Steps of the ledger that ran a graph (captured, replayed, updated, or in the device loop)."""
    return sum(e.outcome in GRAPH_RAN for e in ledger)
