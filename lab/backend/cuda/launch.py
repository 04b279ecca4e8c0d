"""How the cuda backend launches a kernel (LAB_LAUNCH).

  Launcher             compile (once per process), check a cooperative grid, launch on a rung:
                       `dispatcher` (numba types and flattens the arguments at every launch),
                       `prebound` (done once per Launch, launched through cuda.core), and PDL
                       launches (always through cuda.core)
  cooperative_refusal  why a cooperative grid cannot run (None: it can)
  cooperative_limit    the fewest co-resident blocks any cooperative overload may have

Cooperative kernels (numba makes a kernel cooperative when it calls cg.this_grid().sync())
launch with `LaunchConfig(is_cooperative=True)` on the pre-bound rung, numba's dispatcher sets
it by itself; a grid the device cannot co-schedule is refused with a LabError naming why,
never launched to hang at its first grid barrier.
"""
from __future__ import annotations

from typing import NamedTuple

from lab.errors import LabError
from ..base import Buffer, Launch, RawArray


class _Bound(NamedTuple):
    """One launch through cuda.core, prepared: everything but the launch call itself."""
    stream: object       # cuda.core Stream wrapping our CuPy stream
    config: object       # cuda.core LaunchConfig (grid, block, programmatic serialisation)
    kernel: object       # the loaded cuda.core Kernel of the numba overload
    args: tuple          # the arguments flattened by numba (pointers, shapes, strides, scalars)


def flatten_args(overload, args, nbstream) -> tuple:
    """numba's own flattening of a kernel's arguments for a raw launch (one overload's
    argument types; `nbstream` the numba stream of the launch's). Its write-backs of host
    arrays are dropped: device arrays and scalars, all a launch here passes, have none."""
    kernelargs, retr = [], []
    for ty, val in zip(overload.argument_types, args):
        overload._prepare_args(ty, val, nbstream, retr, kernelargs)
    return tuple(kernelargs)


def cooperative_refusal(name: str, grid_blocks: int, threads: int, co_resident: int,
                        supported: bool) -> str | None:
    """Why a cooperative launch of `name` with `grid_blocks` blocks of `threads` cannot run
    (None: it can): every block must be resident at once for a grid barrier to return."""
    if not supported:
        return f"{name} needs a cooperative launch, which this device does not support"
    if grid_blocks > co_resident:
        return (f"{name} needs its {grid_blocks} blocks of {threads} threads co-resident for its "
                f"grid barriers, and this device co-schedules at most {co_resident} "
                f"(max_cooperative_grid_blocks)")
    return None


def cooperative_limit(disp, threads: int) -> int | None:
    """The fewest blocks of `threads` any cooperative overload of dispatcher `disp` may have
    co-resident (None: no overload is cooperative)."""
    counts = [o.max_cooperative_grid_blocks(threads) for o in disp.overloads.values()
              if getattr(o, "cooperative", False)]
    return min(counts) if counts else None


# Compiled kernels are per process, not per backend: numba dispatchers are bound to the CUDA
# context every backend here shares, and compiling ~20 kernels costs seconds per engine.
_PROCESS_KERNELS: dict[str, object] = {}
_COOPERATIVE: set[str] = set()      # the compiled kernels numba made cooperative (a grid sync)


class Launcher:
    """Compile, prepare and launch kernels on one device's streams. Built from the device's
    numba and CuPy modules, its CuPy streams and its capture state (`guard`)."""

    def __init__(self, nbcuda, cp, streams: dict, capture):
        from cuda.core import LaunchConfig, launch as core_launch   # numba-cuda's own launcher
        self.nbcuda, self.cp, self.capture = nbcuda, cp, capture
        self._LaunchConfig, self._core_launch = LaunchConfig, core_launch
        self.streams = streams
        self._nbstreams = {k: nbcuda.external_stream(v.ptr) for k, v in streams.items()}
        self._core_streams = {k: self._core_stream(k) for k in streams}
        self._compiled: dict[str, object] = {}       # what THIS device has warmed up
        self._overloads: dict = {}
        self._coop: dict[tuple, tuple] = {}          # (kernel, threads) -> cooperative_limits

    def compiled(self, name: str):
        """The dispatcher of kernel `name` if this device compiled it, else None."""
        return self._compiled.get(name)

    def compile(self, spec):
        """Kernel `spec` compiled from its signatures and its modules loaded (once per process)."""
        disp = _PROCESS_KERNELS.get(spec.name)
        if disp is None:
            disp = self.nbcuda.jit(list(spec.signatures), **dict(spec.jit_options))(spec.py_func)
            for overload in disp.overloads.values():
                overload._codelibrary.get_cufunc()  # load the module now, not at first launch
            _PROCESS_KERNELS[spec.name] = disp
            if any(getattr(o, "cooperative", False) for o in disp.overloads.values()):
                _COOPERATIVE.add(spec.name)
        self._compiled[spec.name] = disp
        return disp

    def cooperative_limits(self, kernel, threads: int):
        """(SMs, co-resident blocks of `threads` for `kernel`, why refused or ""), from the
        device and numba's occupancy query (compiles the kernel if need be; not in a capture).
        Kept per (kernel, threads): the launch-time check reads it from here."""
        key = (kernel.name, threads)
        if key not in self._coop:
            disp = self._compiled.get(kernel.name) or self.compile(kernel)
            dev = self.nbcuda.get_current_device()
            supported = bool(getattr(dev, "COOPERATIVE_LAUNCH", 1))
            blocks = cooperative_limit(disp, threads) or 0
            why = cooperative_refusal(kernel.name, 1, threads, blocks, supported) or ""
            self._coop[key] = (int(dev.MULTIPROCESSOR_COUNT), blocks, why)
        return self._coop[key]

    def check_cooperative(self, launch: Launch) -> None:
        """Refuse a cooperative launch the device cannot co-schedule (once per Launch)."""
        if launch.name not in _COOPERATIVE or "cooperative" in launch.prepared:
            return
        threads = int(launch.block[0]) * int(launch.block[1] if len(launch.block) > 1 else 1)
        _, blocks, why = self.cooperative_limits(launch.kernel, threads)
        grid = 1
        for g in launch.grid:
            grid *= int(g)
        why = why or cooperative_refusal(launch.name, grid, threads, blocks, True)
        if why:
            raise LabError(f"refused: {why}")
        launch.prepared["cooperative"] = True     # checked: the grid fits

    def launch(self, launch: Launch, disp, mechanism: str, pdl: bool) -> None:
        """Launch on the rung `mechanism` names (a raw argument always takes the dispatcher)."""
        bound = self._prebound(launch, disp, pdl) if mechanism == "prebound" else None
        if bound is not None:
            self.capture.guard(lambda: f"launch of {launch.name}", self._core_launch,
                               bound.stream, bound.config, bound.kernel, *bound.args)
        else:
            self._launch_dispatcher(launch, disp, pdl)

    @staticmethod
    def _arg(a):
        if isinstance(a, Buffer):
            return a.handle[1]
        if isinstance(a, RawArray):  # the CuPy array itself: numba syncs through its interface
            return a.buf.handle[0]
        return a

    def _launch_dispatcher(self, launch: Launch, disp, pdl: bool) -> None:
        """The dispatcher rung: numba types and flattens the arguments at every launch."""
        args = [self._arg(a) for a in launch.args]
        raw = [a.label for a in launch.args if isinstance(a, RawArray)]
        what = f"launch of {launch.name}" + (
            f" with raw argument {raw[0]}: array-interface synchronisation" if raw else "")
        if pdl:
            self.capture.guard(what, self._launch_pdl, launch, disp, args)
        else:
            nbstream = self._nbstreams[launch.stream]
            self.capture.guard(what, disp[launch.grid, launch.block, nbstream], *args)

    def _launch_pdl(self, launch: Launch, disp, args) -> None:
        """Launch through cuda.core with programmatic stream serialisation: the kernel may
        start before its predecessor on the stream finishes; it waits in its pdl_wait()."""
        # a raw CuPy array gets what numba's dispatcher gives it: a synchronising wrap
        args = [self.nbcuda.as_cuda_array(a) if isinstance(a, self.cp.ndarray) else a for a in args]
        bound = self._bind(launch, disp, args, True)
        self._core_launch(bound.stream, bound.config, bound.kernel, *bound.args)

    def _prebound(self, launch: Launch, disp, pdl: bool) -> _Bound | None:
        """The launch prepared once for this PDL setting and stream, kept in `launch.prepared`;
        None for a launch with a raw argument (it takes the dispatcher rung)."""
        key = (pdl, launch.stream)
        bound = launch.prepared.get(key)
        if bound is None:
            if any(isinstance(a, RawArray) for a in launch.args):
                return None
            # guarded: a failure while preparing inside a capture must end it as a CaptureError
            bound = launch.prepared[key] = self.capture.guard(
                lambda: f"preparing the launch of {launch.name}", self._bind, launch, disp,
                [self._arg(a) for a in launch.args], pdl)
        return bound

    def _bind(self, launch: Launch, disp, args, pdl: bool) -> _Bound:
        """What a cuda.core launch of `launch` with these (numba-ready) arguments needs: the
        overload numba's dispatcher would pick, the arguments flattened by numba's own code, the
        launch config and the loaded kernel. No CUDA call: legal inside a capture."""
        from numba import typeof
        nbstream = self._nbstreams[launch.stream]
        key = (launch.name, tuple(typeof(a) for a in args))
        overload = self._overloads.get(key)
        if overload is None:
            overload = self._overloads[key] = disp.overloads[key[1]]
        kernelargs = flatten_args(overload, args, nbstream)
        # a cooperative overload (a grid barrier) launches as numba's own launch would
        coop = {"is_cooperative": True} if getattr(overload, "cooperative", False) else {}
        config = self._LaunchConfig(grid=launch.grid, block=launch.block,
                                    programmatic_stream_serialization=pdl, **coop)
        return _Bound(self._core_streams[launch.stream], config,
                      overload._codelibrary.get_cufunc().kernel, kernelargs)

    def _core_stream(self, name: str):
        """A cuda.core Stream wrapping our CuPy stream `name`, made at start-up (never inside a
        capture; cuda.core deprecates being handed foreign stream objects at launch)."""
        try:
            from cuda.core import Device
            return Device().create_stream(self.streams[name])
        except Exception:  # an older cuda.core: hand it the numba stream as before
            return self._nbstreams[name]
