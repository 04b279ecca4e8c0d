"""The kernel registry: one `KernelSpec` per numba.cuda kernel, each tied to its NumPy twin.

A kernel file defines the kernel's Python source, decorates it with `@kernel(...)`, and the
decorator records everything a backend needs:

- `py_func`: the kernel source; the `cuda` backend compiles it with the explicit `signatures`
  (never lazily), numba's CUDA simulator runs it as Python in the kernel tests.
- `twin(grid, block, *args)`: the NumPy implementation with the same semantics; it mutates its
  output arrays in place, exactly like the kernel. The `sim` backend executes twins.
- `reads` / `writes`: argument indices the kernel reads / writes. The simulator uses them to
  order work (fork/join, PDL) and to detect races; the capture audit uses them to name buffers.
- `jit_options`: extra keyword arguments for numba's `cuda.jit` when the `cuda` backend compiles
  it (e.g. `launch_bounds`); empty for almost every kernel.

Nothing here imports CUDA or compiles anything: importing `kernels` is safe on any machine.
"""
from __future__ import annotations

import functools
import inspect

from dataclasses import dataclass, field
from typing import Callable

REGISTRY: dict[str, "KernelSpec"] = {}


@dataclass(frozen=True)
class KernelSpec:
    name: str
    py_func: Callable
    signatures: tuple[str, ...]
    twin: Callable
    reads: tuple[int, ...]
    writes: tuple[int, ...]
    doc: str = field(default="", compare=False)
    jit_options: tuple = ()           # ((name, value), ...) for cuda.jit (hashable: frozen)

    @functools.cached_property
    def arg_names(self) -> tuple[str, ...]:
        """The kernel's parameter names, in order (inspect.signature costs microseconds: once
        per kernel, never per launch; the launch log and the cost model read them)."""
        return tuple(inspect.signature(self.py_func).parameters)

    def __repr__(self) -> str:  # keep launch logs short
        return f"<kernel {self.name}>"


def kernel(*signatures: str, twin: Callable, reads: tuple[int, ...], writes: tuple[int, ...],
           jit_options: dict | None = None):
    """Register a kernel with its explicit numba signatures and its NumPy twin (and, rarely,
    options for numba's cuda.jit)."""
    if not signatures:
        raise ValueError("a kernel needs at least one explicit signature")

    def wrap(fn: Callable) -> KernelSpec:
        spec = KernelSpec(fn.__name__, fn, tuple(signatures), twin, tuple(reads), tuple(writes),
                          (fn.__doc__ or "").strip(), tuple(sorted((jit_options or {}).items())))
        if spec.name in REGISTRY:
            raise ValueError(f"kernel {spec.name!r} registered twice")
        REGISTRY[spec.name] = spec
        return spec

    return wrap
