"""What the engine records about each step: a ledger entry (how the step ran: eagerly, as a new
graph, as a replay, after an update, in the device loop, or as a fallback and why; under which
plan, and under which graph key), what a failed capture left to report, and what a ledger says
about its graph keys.

A plan (lab/plan.py) is what a captured graph depends on by design, so a graph per plan is the
design and a graph key should hold the plan key and nothing else. A key part that takes more
than one value under one plan files that plan's work under several graphs: each is captured
once and looked up only when that value comes back (case study 004's question, "does the
runtime replay what it captured?"). `key_changes` finds those parts, named or not, in any
stretch of a ledger; the replay gate (lab/measure/arms.py) and `decode-lab audit`
(lab/measure/audit.py) both read it.
"""
from __future__ import annotations

from dataclasses import dataclass

# outcomes of a step that ran a graph (captured, replayed, updated, or in the device loop): the
# steps whose graph key the cache looked up
GRAPH_RAN = ("capture", "replay", "update", "device")
# outcomes of a step run in graph mode: those, and an eager fallback for a plan whose capture failed
GRAPH_MODE = GRAPH_RAN + ("fallback",)


@dataclass(frozen=True)
class LedgerEntry:
    step: int
    position: int
    plan_key: tuple         # the key the step was filed under: for a step that ran a graph, the
                            # graph cache's key (the plan key, plus whatever the step's graph_key
                            # adds to it); for an eager step or a fallback, the plan key
    outcome: str            # "eager" | "capture" (new graph, then replayed) | "replay" |
                            # "update" (the live graph updated to this plan, then replayed) |
                            # "device" (a step of the device loop) | "fallback"
    reason: str = ""        # why a fallback happened, or "update-refused: ..." for a capture
    plan: tuple = ()        # the step's plan key (decode_plan's `plan.key`); () when built
                            # without it: then the plan key is `plan_key`

    def __post_init__(self):
        if not self.plan:
            object.__setattr__(self, "plan", self.plan_key)

    @property
    def graph_key(self) -> tuple | None:
        """The graph cache's key of a step that ran a graph; None for an eager step or a
        fallback (no graph was looked up)."""
        return self.plan_key if self.outcome in GRAPH_RAN else None


@dataclass(frozen=True)
class CaptureFailure:
    reason: str             # the first offence, as the backend names it
    shown_at: str           # where the error showed: "launch 4 (attn_partial)", "end_capture", ...
    launch_index: int | None  # launches issued before it showed (None: at end_capture)


# ---- what a ledger says about its graph keys ---------------------------------------------------
def key_parts(key: tuple) -> list[tuple[str, object]]:
    """(label, value) for each part of a key. A key is read as flat (name, value, name, value,
    ...) pairs where it has them: a value that follows a name (a str) is labelled with that
    name; any other part is labelled by its index, "part 12 (no name)". A label met twice in
    one key gets "#2", "#3", ... appended."""
    out, seen, i = [], {}, 0
    while i < len(key):
        if isinstance(key[i], str) and i + 1 < len(key):
            label, value, i = key[i], key[i + 1], i + 2
        else:
            label, value, i = f"part {i} (no name)", key[i], i + 1
        seen[label] = seen.get(label, 0) + 1
        out.append((label if seen[label] == 1 else f"{label}#{seen[label]}", value))
    return out


def key_text(key: tuple) -> str:
    """A key as `splits=4 pdl=0 ...` (True/False as 1/0); a part with no name as `[12]=5`."""
    def show(v):
        return int(v) if isinstance(v, bool) else v
    return " ".join(f"[{label.split()[1]}]={show(v)}" if label.endswith("(no name)")
                    else f"{label}={show(v)}" for label, v in key_parts(key))


_ABSENT = "(absent)"


def _keys_by_plan(entries) -> dict[tuple, dict[tuple, None]]:
    """{plan key: the graph keys the entries' graph steps (GRAPH_RAN) looked it up under, in the
    order first met}."""
    keys: dict[tuple, dict[tuple, None]] = {}
    for e in entries:
        if e.outcome in GRAPH_RAN:
            keys.setdefault(e.plan, {})[e.plan_key] = None
    return keys


def key_changes(entries) -> dict[tuple, dict[str, list]]:
    """{plan key: {key part: its values, in the order first met}} for each plan that the entries'
    graph steps (GRAPH_RAN) looked up under more than one graph key, with the parts in which
    those keys differ (named or not; a part missing from some keys has the value "(absent)").
    A clean run gives {}: a plan's graph key is its plan key, whatever the position or step."""
    out = {}
    for plan, met in _keys_by_plan(entries).items():
        if len(met) < 2:
            continue
        parts = [dict(key_parts(k)) for k in met]
        labels = dict.fromkeys(label for p in parts for label in p)
        changed = {}
        for label in labels:
            values = dict.fromkeys((type(v).__name__, v) for v in (p.get(label, _ABSENT)
                                                                   for p in parts))
            if len(values) > 1:
                changed[label] = [v for _, v in values]
        out[plan] = changed
    return out


def keys_met(entries) -> dict[tuple, int]:
    """{plan key: how many distinct graph keys the entries' graph steps looked it up under}."""
    return {plan: len(k) for plan, k in _keys_by_plan(entries).items()}


def recaptures(before, entries) -> dict[tuple, int]:
    """{plan key: captures} among `entries` of a plan already run in graph mode (GRAPH_MODE) in
    `before` or earlier in `entries`. A plan's graph is captured once, the first time the plan
    is met; a capture for a plan met before means its key did not come back."""
    seen = {e.plan for e in before if e.outcome in GRAPH_MODE}
    out: dict[tuple, int] = {}
    for e in entries:
        if e.outcome == "capture" and e.plan in seen:
            out[e.plan] = out.get(e.plan, 0) + 1
        if e.outcome in GRAPH_MODE:
            seen.add(e.plan)
    return out


def values_sample(values: list, shown: int = 4) -> str:
    """A part's values for a message: all of them, or the first few and the last."""
    vals = [str(v) for v in values]
    return ", ".join(vals if len(vals) <= shown + 1 else vals[:shown] + ["...", vals[-1]])


def values_text(values: list, shown: int = 4) -> str:
    """A part's values for a message: their count, and the first few and the last."""
    return f"{len(values)} values: {values_sample(values, shown)}"
