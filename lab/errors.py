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


class DeviceFault(LabError):
    """A kernel faulted on the device (an illegal address, as cudaErrorIllegalAddress). Kernels
    run asynchronously, so the fault is reported by the first later call that waits for the
    device (a copy, a synchronize, or a launch), not by the launch of the kernel at fault; and
    as in CUDA it is sticky: every later call on that device fails the same way."""

    ILLEGAL_ADDRESS = ("an illegal memory access was encountered (cudaErrorIllegalAddress): a "
                       "kernel queued before this call faulted; the call reporting it is not "
                       "the one at fault")
