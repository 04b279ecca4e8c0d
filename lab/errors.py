"""The one exception type users see: a `LabError` is bad input or an unusable setup, reported
by the CLI as a one-line message and exit status 2 (never a traceback). One kind is not bad
input: a `DeviceFault`, a kernel's fault on the device, is a finding about the run (exit status 1,
one line). Every exit status: lab/exits.py, docs/cli.md."""


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
    as in CUDA it is sticky: every later call on that device fails the same way. The CLI
    reports it as a finding (exit status 1), not as bad input."""

    ILLEGAL_ADDRESS = ("an illegal memory access was encountered (cudaErrorIllegalAddress): a "
                       "kernel queued before this call faulted; the call reporting it is not "
                       "the one at fault")


class NumericFault(LabError):
    """A result the host read holds NaN or infinite values (the float32 arithmetic overflowed):
    its tokens are no result. A finding about the run (exit status 1), like a DeviceFault;
    weights that would overflow are refused at load instead (lab/model.py `probe`)."""


class WriteFailed(LabError, OSError):
    """A file that could not be written whole (a full disk, a folder that takes no files); the
    old file, if any, is left as it was (lab/files.py atomic_write). An OSError too, with its
    errno, so that a caller that can do without the file (a cache) still passes it by."""

    def __init__(self, message: str, errno: int | None = None, strerror: str | None = None):
        LabError.__init__(self, message)
        self.errno, self.strerror = errno, strerror

    def __str__(self) -> str:
        return str(self.args[0])
