"""The one exception type users see: a `LabError` is bad input or an unusable setup, reported
by the CLI as a one-line message and exit status 2 (never a traceback)."""


class LabError(Exception):
    """Bad input or an unusable environment, with a message that says what to do."""


class CaptureError(LabError):
    """A stream capture failed; `reason` names the first offending operation."""

    def __init__(self, message: str, reason: str | None = None):
        super().__init__(message)
        self.reason = reason or message


class CollectiveError(LabError):
    """Ranks' collectives that cannot all complete: on a GPU pair, a hang (NCCL waits for ever)
    or silent corruption; the simulator reports it instead, naming each rank's position."""
