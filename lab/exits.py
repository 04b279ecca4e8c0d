"""How a command ends: the exit codes of `decode-lab` (docs/cli.md), each with one line on stderr.

  DONE         0    the command did what it was asked, and found nothing wrong
  FINDING      1    a finding: audit flags, a conformance or compare FAIL, an exercise or the
                    self-check not passing, a kernel fault on the device (DeviceFault), a
                    non-finite result the host read (NumericFault)
  BAD_INPUT    2    bad input or an unusable setup: a LabError naming the argument, file or field
  INTERNAL     70   an internal error (any other exception): one line naming it and the file
                    where its traceback is saved (under lab.config.state_folder())
  INTERRUPTED  130  Ctrl-C (SIGINT)
  BROKEN_PIPE  141  the reader of the output went away (`decode-lab selfcheck | head -1`)
  TERMINATED   143  SIGTERM

`run(command)` runs `command()` (which returns 0 or 1) under those rules: SIGTERM raises
`Terminated` in the main thread, so that a write in progress removes its temporary file on the
way out (lab/files.py), and temporary files left by processes that died are swept first.
"""
from __future__ import annotations

import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Callable

from lab.config import state_folder
from lab.errors import DeviceFault, LabError, NumericFault
from lab.files import sweep_leftovers

DONE, FINDING, BAD_INPUT, INTERNAL = 0, 1, 2, 70
INTERRUPTED, BROKEN_PIPE, TERMINATED = 130, 141, 143

# (code, name, meaning): the table docs/cli.md shows
TABLE: tuple[tuple[int, str, str], ...] = (
    (DONE, "done", "the command did what it was asked and found nothing wrong"),
    (FINDING, "a finding", "audit flags, conformance or compare FAIL, an exercise or the "
     "self-check not passing, a kernel fault or a non-finite result"),
    (BAD_INPUT, "bad input", "an argument, file, field or setup the lab cannot use; the line "
     "names it"),
    (INTERNAL, "internal error", "a fault of the lab itself; the line names the exception and "
     "the file holding its traceback"),
    (INTERRUPTED, "interrupted", "Ctrl-C"),
    (BROKEN_PIPE, "broken pipe", "the reader of the output went away"),
    (TERMINATED, "terminated", "SIGTERM"),
)

PREFIX = "decode-lab"


class Terminated(BaseException):
    """SIGTERM arrived: raised in the main thread, unwinding like Ctrl-C (not an Exception, so
    no `except Exception` swallows it)."""


def _on_sigterm(signum, frame):
    raise Terminated


def _say(text: str) -> None:
    try:
        print(f"{PREFIX}: {text}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass                              # stderr closed too: the code alone says it


def _one_line(text: str) -> str:
    lines = [s.strip() for s in str(text).splitlines() if s.strip()]
    return lines[0] if lines else ""


def _stdout_closed() -> bool:
    """Whether stdout's reader went away (a pipe or socket with no reader left)."""
    import select
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0))
    except (AttributeError, OSError, ValueError):
        return False


def _flush() -> None:
    """Flush stdout; a broken pipe raises, an absent or closed stdout is nothing to report."""
    try:
        sys.stdout.flush()
    except (AttributeError, ValueError):
        pass


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's last flush finds no broken pipe."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (AttributeError, OSError, ValueError):
        pass


def crash_report(exc: BaseException, argv: list[str]) -> Path | None:
    """Save the command line and `exc`'s traceback in a file of its own under the state
    folder's crashes/ (the temporary folder when that cannot be written); returns the file, or
    None when neither can be written."""
    import tempfile
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    name = f"crash-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.txt"
    for folder in (lambda: state_folder() / "crashes", lambda: Path(tempfile.gettempdir())):
        try:
            path = folder() / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"{PREFIX} {' '.join(argv)}\n{text}")
            return path
        except (OSError, RuntimeError):        # RuntimeError: no home folder to be found
            continue
    return None


def _internal(exc: BaseException, argv: list[str]) -> int:
    path = crash_report(exc, argv)
    where = f"traceback saved in {path}" if path else "its traceback could not be saved"
    message = _one_line(exc)
    _say(f"internal error: {type(exc).__name__}{': ' + message if message else ''} ({where})")
    return INTERNAL


def run(command: Callable[[], int], argv: list[str] | None = None) -> int:
    """Run `command()` and return its exit code, or the code of the way it ended (the table);
    `argv` (default: this process's arguments) heads a saved traceback."""
    argv = sys.argv[1:] if argv is None else list(argv)
    sweep_leftovers()
    try:
        previous, installed = signal.signal(signal.SIGTERM, _on_sigterm), True
    except ValueError:                   # not the main thread: SIGTERM keeps its default
        previous, installed = None, False
    try:
        try:
            code = command()
        finally:
            _flush()                     # a closed pipe is reported here, not at the exit
        return code
    except Terminated:
        _say("terminated (SIGTERM)")
        return TERMINATED
    except KeyboardInterrupt:
        _say("interrupted")
        return INTERRUPTED
    except BrokenPipeError as exc:
        if not _stdout_closed():
            return _internal(exc, argv)
        _silence_stdout()
        _say("output closed before the end (broken pipe)")
        return BROKEN_PIPE
    except DeviceFault as exc:
        _say(f"device fault: {_one_line(exc)}")
        return FINDING
    except NumericFault as exc:
        _say(f"numeric fault: {_one_line(exc)}")
        return FINDING
    except LabError as exc:
        _say(f"error: {exc}")
        return BAD_INPUT
    except Exception as exc:
        return _internal(exc, argv)
    finally:
        if installed:
            signal.signal(signal.SIGTERM, previous)
