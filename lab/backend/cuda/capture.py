"""What every capture on the cuda backend shares, and the runtime calls beneath it.

  cudart, check   cuda-bindings' runtime module; unpack its (err, *values) results
  is_fault        whether an exception is a kernel's illegal address
  CaptureState    whether a capture is open, its first offence, the collector held off, guard()
"""
from __future__ import annotations

import gc

from lab.errors import CaptureError, DeviceFault


def cudart():
    from cuda.bindings import runtime
    return runtime


def check(result):
    """Unpack a cuda-bindings (err, *values) tuple, raising on an error code."""
    err, *values = result
    if int(err) != 0:
        raise RuntimeError(f"CUDA runtime error {err!r}")
    return values[0] if len(values) == 1 else values


def is_fault(exc: Exception) -> bool:
    """A CUDA error for a kernel's illegal address, as CuPy, numba or cuda.core words it."""
    text = str(exc)
    return ("ILLEGAL_ADDRESS" in text or "IllegalAddress" in text
            or "illegal memory access" in text.lower())


class CaptureState:
    """One device's capture bookkeeping. `active`: whether `open` opened a capture (asked on
    every launch: a Python flag costs nothing where a runtime query per launch does);
    `offence`: the first failed operation inside it. Global mode forbids unsafe CUDA calls from
    ANY thread while a capture is open, and Python's garbage collector may free an old graph
    exec or unload a module (both unsafe) at any moment: the collector is off while one is
    open. (No gc.collect() first: on the H200 a full collection made each capture cost 166 ms
    instead of ~0.4 ms.)"""

    def __init__(self):
        self.active = False
        self.offence: str | None = None
        self._gc_was_on = True      # the collector's state when the open capture began

    def open(self, begin) -> None:
        """Open a global-mode capture with `begin()`: no offence yet, the collector held off."""
        self.offence = None
        self._gc_was_on = gc.isenabled()
        gc.disable()
        try:
            begin()
        except Exception:
            self._restore_gc()
            raise
        self.active = True

    def close(self) -> None:
        """The capture ended (even when invalidated): the collector as it was when it began."""
        self._restore_gc()
        self.active = False

    def _restore_gc(self) -> None:
        if self._gc_was_on:
            gc.enable()

    def offend(self, why: str) -> None:
        """Record `why` as the offence, unless an earlier one is recorded."""
        self.offence = self.offence or why

    def take_offence(self) -> str | None:
        """The first offence, cleared."""
        offence, self.offence = self.offence, None
        return offence

    def guard(self, what, fn, *args, **kwargs):
        """Run fn; during a capture, turn a CUDA error into CaptureError naming the offence
        (`what`: its description, or a function making it, called only on a failure); outside
        one, a kernel's illegal address reported by this call into DeviceFault."""
        if not self.active:
            try:
                return fn(*args, **kwargs)
            except Exception as exc:   # a kernel's illegal address, reported by a later call
                if is_fault(exc):
                    raise DeviceFault(f"{DeviceFault.ILLEGAL_ADDRESS} ({exc})") from exc
                raise
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            what = what() if callable(what) else what
            self.offend(f"{what}: {exc.__class__.__name__}: {exc}")
            raise CaptureError(f"{what} failed during capture: {exc}", self.offence) from exc
