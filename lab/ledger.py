"""What the engine records about each step: a ledger entry (how the step ran: eagerly, as a new
graph, as a replay, after an update, in the device loop, or as a fallback and why), and what a
failed capture left to report."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LedgerEntry:
    step: int
    position: int
    plan_key: tuple
    outcome: str            # "eager" | "capture" (new graph, then replayed) | "replay" |
                            # "update" (the live graph updated to this plan, then replayed) |
                            # "device" (a step of the device loop) | "fallback"
    reason: str = ""        # why a fallback happened, or "update-refused: ..." for a capture


@dataclass(frozen=True)
class CaptureFailure:
    reason: str             # the first offence, as the backend names it
    shown_at: str           # where the error showed: "launch 4 (attn_partial)", "end_capture", ...
    launch_index: int | None  # launches issued before it showed (None: at end_capture)
