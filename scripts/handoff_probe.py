"""What one hand-off between phases costs inside a persistent kernel, on a GPU: a chain of
--phases phases over a grid of every SM, each phase D rows (a warp per row, rows round-robin over
the blocks, as kernels/persistent.py spreads them), each row reading the whole vector the phase
before wrote. Three ways to hand the vector on:

  count   the megakernel's: the row written, the block meets, thread 0 adds its rows to the
          phase's count with release (red.release.gpu); the next phase's blocks poll the count
          with acquire loads (64 ns backoff between polls, or back to back: count/spin), meet,
          then load the vector
  ll      flag in the data (NCCL's LL protocol): each element stored as one 64-bit word, its
          float32 bits beside a tag naming the launch and phase (st.relaxed.gpu.b64); a warp
          polls the words it reads (ld.relaxed.gpu.b64) until every tag is the phase's. No
          fence, no count, no second round trip for the data
  none    no hand-off: each phase reads whatever the vector holds (the work alone)
  graph   no persistent kernel: each phase its own kernel (the same warps, rows and work), the
          phases' launches captured in one CUDA graph; graph+pdl the same launched with
          programmatic dependent launch (each kernel triggers its dependents at its start and
          waits for its predecessor before its loads, as the lab's kernels do)

    python3 scripts/handoff_probe.py [--phases 100] [--launches 20] [--d 256] [--reps 5]

Prints us per phase for each (measured on this GPU; the header names it). Needs a GPU.
"""
from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def make_chain(mode: str, spin: bool, D: int, T: int, coop: bool = True):
    """The chain kernel of one hand-off form (the module doc). Diagnostic forms of `none`:
    `none/apart` reads rows of `vec` and writes rows of `words` viewed as float32 (no thread
    reads an address it wrote), `none/loads` stores nothing in the loop (one store at the end);
    coop False: an ordinary launch (the others are cooperative, as the megakernel is)."""
    import numba
    from numba import cuda
    from kernels.fused import backoff
    from kernels.persistent import (acquire_load, ll_load, ll_store, release_add,
                                    require_cooperative)
    from kernels.reduce import WARP
    K = D // WARP

    @cuda.jit
    def chain(vec, words, counter, epoch, n_phase):
        if coop:
            require_cooperative()
        tid = cuda.threadIdx.x
        lane = tid % WARP
        warp = tid // WARP
        blk = cuda.blockIdx.x
        G = cuda.gridDim.x
        r = warp * G + blk                  # this warp's row
        e = epoch[0]
        vals = cuda.local.array(K, numba.float32)   # [D / 32] the lane's elements
        keep = numba.float32(0.0)
        for ph in range(1, n_phase):
            acc = numba.float32(0.0)
            if mode == "count" and ph > 1:    # phase 0's vector: none to wait for
                if tid == 0:
                    while acquire_load(counter, ph - 1) < (e + 1) * D:
                        if not spin:
                            backoff()
                cuda.syncthreads()
            if r < D:
                if mode == "ll":              # every word's load in flight, then the tags
                    for k in range(K):
                        vals[k] = numba.float32(0.0)
                    want = numba.int32(e * n_phase + ph)
                    ok = ph == 1
                    while not ok:
                        ok = True
                        for k in range(K):
                            v, t = ll_load(words, (ph - 1) * D + lane + k * WARP)
                            vals[k] = v
                            if t != want:
                                ok = False
                else:
                    for k in range(K):
                        vals[k] = vec[ph - 1, lane + k * WARP]
                for k in range(K):
                    acc += vals[k]
            for off in (16, 8, 4, 2, 1):
                acc += cuda.shfl_down_sync(0xFFFFFFFF, acc, off)
            val = acc * numba.float32(1.0 / D) + numba.float32(r)
            if mode == "none/loads":
                keep += val
            elif mode == "none/apart":
                if r < D and lane == 0:
                    vec[(ph + n_phase // 2) % n_phase, r] = val
            elif mode == "ll":
                if r < D and lane == 0:
                    ll_store(words, ph * D + r, val, numba.int32(e * n_phase + ph + 1))
            else:
                if r < D and lane == 0:
                    vec[ph, r] = val
                if mode == "count":
                    cuda.syncthreads()
                    mine = 0
                    if blk < D:
                        mine = (D - blk + G - 1) // G
                    if tid == 0:
                        release_add(counter, ph, min(mine, T // WARP))
        if mode == "none/loads" and r < D and lane == 0:
            vec[0, r] = keep
    return chain


def make_phase(D: int, T: int):
    """One phase as a kernel of its own (graph modes): the chain kernel's body for one phase."""
    import numba
    from numba import cuda
    from kernels.pdl import pdl_launch_dependents, pdl_wait
    from kernels.reduce import WARP
    K = D // WARP

    @cuda.jit("void(float32[:, ::1], int64)")
    def phase(vec, ph):
        pdl_wait()
        pdl_launch_dependents()
        tid = cuda.threadIdx.x
        lane = tid % WARP
        r = (tid // WARP) * cuda.gridDim.x + cuda.blockIdx.x
        vals = cuda.local.array(K, numba.float32)
        acc = numba.float32(0.0)
        if r < D:
            for k in range(K):
                vals[k] = vec[ph - 1, lane + k * WARP]
            for k in range(K):
                acc += vals[k]
        for off in (16, 8, 4, 2, 1):
            acc += cuda.shfl_down_sync(0xFFFFFFFF, acc, off)
        if r < D and lane == 0:
            vec[ph, r] = acc * numba.float32(1.0 / D) + numba.float32(r)
    return phase


def graph_timer(D: int, T: int, G: int, P: int, launches: int, pdl: bool):
    """A CUDA graph of P - 1 phase kernels (graph modes), captured once; returns a function
    that replays it `launches` times back to back between two events and gives us a replay."""
    import cupy as cp
    from numba import cuda
    from cuda.core import Device, LaunchConfig, launch
    disp = make_phase(D, T)
    overload = next(iter(disp.overloads.values()))
    stream = cp.cuda.Stream(non_blocking=True)
    core = Device().create_stream(stream)
    nbstream = cuda.external_stream(stream.ptr)
    vec = cuda.as_cuda_array(cp.zeros((P, D), cp.float32), sync=False)
    kern = overload._codelibrary.get_cufunc().kernel
    cfg = LaunchConfig(grid=(G,), block=(T,), programmatic_stream_serialization=pdl)
    flat = []
    for ph in range(1, P):
        args, retr = [], []
        for ty, val in zip(overload.argument_types, (vec, ph)):
            overload._prepare_args(ty, val, nbstream, retr, args)
        flat.append(tuple(args))
    stream.begin_capture(mode=cp.cuda.runtime.streamCaptureModeGlobal)
    for args in flat:
        launch(core, cfg, kern, *args)
    graph = stream.end_capture()

    def batch() -> float:
        s, t = cp.cuda.Event(), cp.cuda.Event()
        s.record(stream)
        for _ in range(launches):
            graph.launch(stream)
        t.record(stream)
        t.synchronize()
        return cp.cuda.get_elapsed_time(s, t) * 1e3 / launches
    return batch


def chain_timer(mode: str, spin: bool, coop: bool, D: int, T: int, G: int, P: int,
                launches: int, vec, words, epochs):
    """The chain kernel of one form; returns a function that launches it `launches` times back
    to back between two events (counter and tags fresh) and gives us a launch."""
    from numba import cuda
    k = make_chain(mode, spin, D, T, coop)

    def batch() -> float:
        d_counter = cuda.to_device(np.zeros(P, np.int32))
        words.copy_to_device(np.zeros(P * D, np.int64))
        cuda.synchronize()
        s, t = cuda.event(), cuda.event()
        s.record()
        for i in range(launches):
            k[G, T](vec, words, d_counter, epochs[i:i + 1], P)
        t.record()
        t.synchronize()
        return cuda.event_elapsed_time(s, t) * 1e3 / launches
    return batch


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--phases", type=int, default=100)
    ap.add_argument("--launches", type=int, default=20)
    ap.add_argument("--d", type=int, default=256)
    ap.add_argument("--reps", type=int, default=5, help="interleaved rounds (one batch of "
                    "--launches launches of every form a round)")
    a = ap.parse_args(argv)
    if a.d % 32 or a.d < 32:
        raise SystemExit(f"--d {a.d}: a multiple of 32 (a lane reads d / 32 elements)")

    import numba
    from numba import cuda
    D = a.d
    T = 128
    dev = cuda.get_current_device()
    sms = dev.MULTIPROCESSOR_COUNT
    G = sms
    P = a.phases
    from lab.measure.registry import revision
    rev = revision()
    print(f"scripts/handoff_probe.py {' '.join(argv if argv is not None else sys.argv[1:])}; "
          f"commit {rev['commit']}{' (dirty)' if rev['dirty'] else ''}; {datetime.date.today()}")
    from lab.backend.cuda.device import CudaBackend
    print(CudaBackend.describe(None))   # the GPU and versions, as every recording names them
    print(f"grid {G} x {T} threads, D = {D} rows a phase (a warp per row), {P} phases a launch "
          f"(or {P - 1} kernels a graph), {a.launches} launches back to back a batch, the forms "
          f"interleaved over {a.reps} rounds; us per phase = a launch's time / {P - 1}")
    vec = cuda.to_device(np.zeros((P, D), np.float32))
    words = cuda.to_device(np.zeros(P * D, np.int64))
    R = a.launches
    epochs = cuda.to_device(np.arange(R, dtype=np.int32))
    timers = {}
    for mode, spin, coop in (("none", False, True), ("none", False, False),
                             ("none/apart", False, True), ("none/loads", False, True),
                             ("count", False, True), ("count", True, True), ("ll", False, True)):
        name = mode + ("/spin" if spin else "") + ("" if coop else " (plain launch)")
        timers[name] = chain_timer(mode, spin, coop, D, T, G, P, R, vec, words, epochs)
    for pdl in (False, True):
        timers["graph+pdl" if pdl else "graph"] = graph_timer(D, T, G, P, R, pdl)
    for batch in timers.values():     # compiles and warms up
        batch()
    times = {name: [] for name in timers}
    for _ in range(a.reps):           # interleaved: one batch of every form per round
        for name, batch in timers.items():
            times[name].append(batch())
    rows = []
    for name, ts in times.items():
        med = float(np.median(ts))
        rows.append((name, med / (P - 1)))
        print(f"  {name:22s} {med / (P - 1):7.3f} us per phase  (a launch or replay "
              f"{med:8.1f} us, median of {a.reps} rounds)")
    base = rows[0][1]
    for name, us in rows[1:]:
        print(f"  {name:22s} {us - base:+7.3f} us per phase against none")
    return 0


if __name__ == "__main__":
    sys.exit(main())
