"""Backends: `make_backend(cfg)` picks `cuda` (numba.cuda + CuPy) or `sim` (CPU simulator);
`make_ranks(cfg, n)` gives n devices with collectives among them (LAB_RANKS), and
`make_devices(cfg)` what an engine drives: either, as a group.

  base.py         the interface: Buffer, Launch, Collective, StreamWait, Graph, Backend, OneDevice
  sim/            the CPU simulator (ranks -> device -> graph, queue, memory)
  cuda/           numba.cuda + CuPy (ranks -> device -> graph, launch, capture)
  costmodel.py    the simulator's measured costs
  instrument.py   the launch log every backend writes, and the launch bill read from it
"""
from __future__ import annotations

from lab.errors import LabError
from .base import Backend, Buffer, Collective, Graph, Launch, OneDevice, StreamWait  # noqa: F401


def gpu_status() -> tuple[bool, str]:
    """(usable, reason): whether a CUDA GPU and CuPy are usable here, and why not."""
    try:
        import cupy
    except Exception as exc:  # ImportError, or a broken CUDA install raising at import
        return False, f"CuPy is not importable ({exc.__class__.__name__}: {exc})"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        return False, f"no CUDA device ({exc})"
    if n < 1:
        return False, "no CUDA device"
    try:
        from numba import cuda
        if not cuda.is_available():
            return False, "numba.cuda reports no usable GPU"
    except Exception as exc:
        return False, f"numba.cuda is unusable ({exc})"
    return True, "ok"


def make_backend(cfg) -> Backend:
    """The backend named by `cfg.backend` (auto = cuda when usable, else sim)."""
    if cfg.backend == "sim":
        from .sim import SimBackend
        return SimBackend()
    usable, reason = gpu_status()
    if cfg.backend == "cuda" and not usable:
        raise LabError(f"LAB_BACKEND=cuda (or --backend cuda) needs a GPU, but {reason}; "
                       f"use --backend sim to run on the CPU simulator")
    if usable:
        from .cuda import CudaBackend
        return CudaBackend()
    from .sim import SimBackend
    return SimBackend()


def make_ranks(cfg, ranks: int):
    """A group of `ranks` backends, one device each, with collectives among them (LAB_RANKS):
    simulated devices on sim, GPUs 0..ranks-1 with NCCL on cuda. Fewer devices than ranks is a
    LabError naming both numbers."""
    if cfg.backend == "sim":
        from .sim import SimRanks
        return SimRanks(ranks)
    usable, reason = gpu_status()
    if cfg.backend == "cuda" and not usable:
        raise LabError(f"LAB_BACKEND=cuda (or --backend cuda) needs a GPU, but {reason}; "
                       f"use --backend sim to run on the CPU simulator")
    if not usable:
        from .sim import SimRanks
        return SimRanks(ranks)
    import cupy
    n = cupy.cuda.runtime.getDeviceCount()
    if n < ranks:
        raise LabError(f"LAB_RANKS={ranks} needs {ranks} GPUs, this machine has {n}; use "
                       f"LAB_RANKS=1, or --backend sim (one simulated device per rank)")
    from .cuda import CudaRanks
    return CudaRanks(ranks)


def make_devices(cfg, backend: Backend | None = None, group=None):
    """The devices an engine drives for `cfg`: a group of `cfg.ranks` (one device each, with
    collectives among them: `group`, or make_ranks), or for one rank `backend` (or
    make_backend's) as a group of one (OneDevice)."""
    if cfg.ranks == 1:
        if group is not None:
            raise LabError("a group of devices is for LAB_RANKS>1; pass backend= for one device")
        return OneDevice(backend or make_backend(cfg))
    if backend is not None:
        raise LabError(f"LAB_RANKS={cfg.ranks} drives {cfg.ranks} devices: pass group= "
                       f"(lab.backend.make_ranks), not one backend")
    group = group or make_ranks(cfg, cfg.ranks)
    if len(group.backends) != cfg.ranks:
        raise LabError(f"LAB_RANKS={cfg.ranks} needs {cfg.ranks} devices; the group has "
                       f"{len(group.backends)}")
    return group
