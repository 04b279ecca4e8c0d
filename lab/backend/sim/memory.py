"""The simulated device's memory: an arena of segments at real integer addresses, so a view's
pointer is a number a capture freezes and a replay writes wherever that number points.

  Arena                  alloc, resolve (a buffer's NumPy view, by pointer), pool_bytes
  row, rows, reshape,    views: a new pointer (and shape, or dtype) into the same bytes
  view_as
"""
from __future__ import annotations

import bisect

import numpy as np

from ..base import Buffer

_BASE_ADDR = 0x7F00_0000_0000
_ALIGN = 512  # CuPy's pool rounds allocations to 512 bytes


class Arena:
    """Allocations that are never freed or moved, each followed by a gap (an overrun does not
    land in the next buffer). `init="empty"` memory comes from an unseeded generator: really
    unpredictable, like a GPU's."""

    def __init__(self):
        self._bases: list[int] = []
        self._segments: dict[int, np.ndarray] = {}
        self._views: dict[tuple, np.ndarray] = {}     # (ptr, shape, dtype) -> its NumPy view
        self._next = _BASE_ADDR

    def alloc(self, name, shape, dtype, init="zeros") -> Buffer:
        shape = tuple(int(s) for s in (shape if isinstance(shape, (tuple, list)) else (shape,)))
        dtype = np.dtype(dtype)
        nbytes = max(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize, 1)
        size = -(-nbytes // _ALIGN) * _ALIGN
        if init == "zeros":
            seg = np.zeros(size, np.uint8)
        elif init == "empty":  # unseeded on purpose: uninitialised memory is not reproducible
            rng = np.random.default_rng()
            seg = rng.integers(0, 256, size, dtype=np.uint8)
            if dtype.kind == "f":  # a recycled pool block holds an earlier tensor: finite values
                seg.view(dtype)[:] = rng.standard_normal(size // dtype.itemsize)
        else:
            raise ValueError(f"init must be 'zeros' or 'empty', not {init!r}")
        base = self._next
        self._next += size + _ALIGN
        self._bases.append(base)
        self._segments[base] = seg
        return Buffer(name, base, shape, dtype)

    def resolve(self, buf: Buffer) -> np.ndarray:
        """The NumPy view at a buffer's address: resolution by pointer, as a GPU would do (each
        view made once: allocations are never freed or moved, so a view stays valid)."""
        key = (buf.ptr, buf.shape, buf.dtype)
        view = self._views.get(key)
        if view is None:
            view = self._views[key] = self._resolve_new(buf)
        return view

    def _resolve_new(self, buf: Buffer) -> np.ndarray:
        i = bisect.bisect_right(self._bases, buf.ptr) - 1
        if i < 0:
            raise RuntimeError(f"address {buf.ptr:#x} is not device memory")
        base = self._bases[i]
        seg = self._segments[base]
        off = buf.ptr - base
        if off + buf.nbytes > seg.size:
            raise RuntimeError(f"{buf.label}: access of {buf.nbytes} B at {buf.ptr:#x} overruns "
                               f"its allocation of {seg.size} B (illegal address)")
        return np.ndarray(buf.shape, buf.dtype, buffer=seg, offset=off)

    def pool_bytes(self) -> int:
        return int(sum(s.size for s in self._segments.values()))


def row(buf: Buffer, index) -> Buffer:
    index = int(index)
    if not 0 <= index < buf.shape[0]:
        raise IndexError(f"row {index} of {buf.label} with shape {buf.shape}")
    stride = int(np.prod(buf.shape[1:], dtype=np.int64)) * np.dtype(buf.dtype).itemsize
    return Buffer(buf.name, buf.ptr + index * stride, buf.shape[1:], buf.dtype,
                  buf.offset + index * stride)


def rows(buf: Buffer, start: int, stop: int) -> Buffer:
    if not 0 <= start < stop <= buf.shape[0]:
        raise IndexError(f"rows [{start}, {stop}) of {buf.label} with shape {buf.shape}")
    stride = int(np.prod(buf.shape[1:], dtype=np.int64)) * np.dtype(buf.dtype).itemsize
    return Buffer(buf.name, buf.ptr + start * stride, (stop - start, *buf.shape[1:]),
                  buf.dtype, buf.offset + start * stride)


def reshape(buf: Buffer, shape) -> Buffer:
    shape = tuple(int(s) for s in shape)
    if int(np.prod(shape)) * np.dtype(buf.dtype).itemsize > buf.nbytes:
        raise ValueError(f"view {shape} is larger than {buf.label} {buf.shape}")
    return Buffer(buf.name, buf.ptr, shape, buf.dtype, buf.offset)


def view_as(buf: Buffer, dtype) -> Buffer:
    dtype = np.dtype(dtype)
    if dtype.itemsize != np.dtype(buf.dtype).itemsize:
        raise ValueError(f"view of {buf.label} as {dtype}: element sizes differ")
    return Buffer(buf.name, buf.ptr, buf.shape, dtype, buf.offset)
