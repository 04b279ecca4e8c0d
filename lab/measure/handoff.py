"""What one hand-off between phases costs inside a persistent kernel, on a GPU (the `handoff`
experiment records it in handoff.json; scripts/handoff_probe.py prints it): a chain of P phases
over a grid of one block per SM, each phase D rows (a warp per row, rows round-robin over the
blocks, as kernels/persistent.py spreads them), each row reading the whole vector the phase
before wrote. The forms (FORMS):

  none    no hand-off: each phase reads whatever the vector holds (the work alone); none/apart
          writes where no thread reads, none/loads stores nothing in the loop, `(plain launch)`
          an ordinary launch (the others are cooperative, as the megakernel is)
  count   the megakernel's hand-off: the row written, the block meets, thread 0 adds its rows
          to the phase's count with release (red.release.gpu); the next phase's blocks poll the
          count with acquire loads (64 ns backoff between polls; count/spin: back to back),
          meet, then load the vector
  ll      the flag in the data (NCCL's LL protocol): each element stored as one 64-bit word,
          its float32 bits beside a tag naming the launch and phase (kernels/sync.py
          ll_store); a warp polls the words it reads (ll_load) until every tag is the phase's.
          No fence, no count, no second round trip for the data
  graph   each phase a kernel of its own (the same warps, rows and work) in one CUDA graph;
          graph+pdl the same launched with programmatic dependent launch (each kernel triggers
          its dependents at its start and waits for its predecessor before its loads)

  make_chain, make_phase    the kernels (the probe's own: no part of a decode step)
  chain_timer, graph_timer  one batch of back-to-back launches (replays) between two events
  measure                   every form compiled and warmed, then interleaved rounds: us per
                            phase, the median over rounds
"""
from __future__ import annotations

import numpy as np

T = 128                 # threads a block: the megakernel's
FORMS = (("none", False, True), ("none", False, False), ("none/apart", False, True),
         ("none/loads", False, True), ("count", False, True), ("count", True, True),
         ("ll", False, True))   # (mode, spin, cooperative) of the chain forms; then the graphs


def _pieces(D: int):
    """The phase's work as device functions (the chain and the graph kernels run the same
    code): load_row (a lane's D / 32 elements of row ph - 1 of vec, every load in flight
    together) and finish (the warp's sum of them, scaled, plus the row index: the value the row
    writes)."""
    import numba
    from numba import cuda
    from kernels.reduce import WARP
    K = D // WARP

    @cuda.jit(device=True)
    def load_row(vec, ph, lane, vals):
        for k in range(K):
            vals[k] = vec[ph - 1, lane + k * WARP]

    @cuda.jit(device=True)
    def finish(vals, r):
        acc = numba.float32(0.0)
        for k in range(K):
            acc += vals[k]
        for off in (16, 8, 4, 2, 1):
            acc += cuda.shfl_down_sync(0xFFFFFFFF, acc, off)
        return acc * numba.float32(1.0 / D) + numba.float32(r)

    return load_row, finish


def make_chain(mode: str, spin: bool, D: int, T: int, coop: bool = True):
    """The chain kernel of one hand-off form (the module doc). Diagnostic forms of `none`:
    `none/apart` writes each phase's row half the chain away from the row the next phase reads
    (no thread reads an address it wrote this phase), `none/loads` stores nothing in the loop
    (one store at the end); coop False: an ordinary launch (the others are cooperative, as the
    megakernel is)."""
    import numba
    from numba import cuda
    from kernels.persistent import _mine, bump, require_cooperative
    from kernels.sync import acquire_load, backoff, ll_load, ll_store
    from kernels.reduce import WARP
    K = D // WARP
    load_row, finish = _pieces(D)

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
                    load_row(vec, ph, lane, vals)
            val = finish(vals, r)
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
                if mode == "count":   # the block's rows this phase, as the megakernel bumps
                    bump(counter, ph, min(_mine(D, blk, G), T // WARP))
        if mode == "none/loads" and r < D and lane == 0:
            vec[0, r] = keep
    return chain


def make_phase(D: int):
    """One phase as a kernel of its own (graph modes): the chain kernel's body for one phase."""
    import numba
    from numba import cuda
    from kernels.pdl import pdl_launch_dependents, pdl_wait
    from kernels.reduce import WARP
    K = D // WARP
    load_row, finish = _pieces(D)

    @cuda.jit("void(float32[:, ::1], int64)")
    def phase(vec, ph):
        pdl_wait()
        pdl_launch_dependents()
        tid = cuda.threadIdx.x
        lane = tid % WARP
        r = (tid // WARP) * cuda.gridDim.x + cuda.blockIdx.x
        vals = cuda.local.array(K, numba.float32)
        for k in range(K):
            vals[k] = numba.float32(0.0)
        if r < D:
            load_row(vec, ph, lane, vals)
        val = finish(vals, r)
        if r < D and lane == 0:
            vec[ph, r] = val
    return phase


def graph_timer(D: int, T: int, G: int, P: int, launches: int, pdl: bool):
    """A CUDA graph of P - 1 phase kernels (graph modes), captured once; returns a function
    that replays it `launches` times back to back between two events and gives us a replay."""
    import cupy as cp
    from numba import cuda
    from cuda.core import Device, LaunchConfig, launch
    from lab.backend.cuda.launch import flatten_args
    disp = make_phase(D)
    overload = next(iter(disp.overloads.values()))
    stream = cp.cuda.Stream(non_blocking=True)
    core = Device().create_stream(stream)
    nbstream = cuda.external_stream(stream.ptr)
    vec = cuda.as_cuda_array(cp.zeros((P, D), cp.float32), sync=False)
    kern = overload._codelibrary.get_cufunc().kernel
    cfg = LaunchConfig(grid=(G,), block=(T,), programmatic_stream_serialization=pdl)
    flat = [flatten_args(overload, (vec, ph), nbstream) for ph in range(1, P)]
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


def form_name(mode: str, spin: bool, coop: bool) -> str:
    return mode + ("/spin" if spin else "") + ("" if coop else " (plain launch)")


def check_rows(D: int) -> None:
    """ValueError for a D a warp cannot split: a lane reads D / 32 elements."""
    if D % 32 or D < 32:
        raise ValueError(f"D = {D}: a multiple of 32 (a lane reads D / 32 elements)")


def measure(D: int, phases: int = 100, launches: int = 20, reps: int = 5) -> dict:
    """Every form at D rows a phase on this GPU: {"rows", "phases", "launches", "reps", "grid",
    "block", "us": {form: us per phase (the median launch over `reps` interleaved rounds / (phases
    - 1))}, "launch_us": {form: that median launch}}. ValueError for a D that is not a
    multiple of 32."""
    check_rows(D)
    from numba import cuda
    G = cuda.get_current_device().MULTIPROCESSOR_COUNT
    P = phases
    vec = cuda.to_device(np.zeros((P, D), np.float32))
    words = cuda.to_device(np.zeros(P * D, np.int64))
    epochs = cuda.to_device(np.arange(launches, dtype=np.int32))
    timers = {form_name(m, s, c): chain_timer(m, s, c, D, T, G, P, launches, vec, words, epochs)
              for m, s, c in FORMS}
    for pdl in (False, True):
        timers["graph+pdl" if pdl else "graph"] = graph_timer(D, T, G, P, launches, pdl)
    for batch in timers.values():     # compiles and warms up
        batch()
    times = {name: [] for name in timers}
    for _ in range(reps):             # interleaved: one batch of every form a round
        for name, batch in timers.items():
            times[name].append(batch())
    med = {name: float(np.median(ts)) for name, ts in times.items()}
    return {"rows": D, "phases": P, "launches": launches, "reps": reps, "grid": G, "block": T,
            "us": {name: m / (P - 1) for name, m in med.items()}, "launch_us": med}


def table(res: dict) -> list[str]:
    """One measure() result as printed lines: each form's us per phase, then each against
    `none` (the work alone)."""
    out = [f"grid {res['grid']} x {res['block']} threads, D = {res['rows']} rows a phase (a warp "
           f"per row), {res['phases']} phases a launch (or {res['phases'] - 1} kernels a graph), "
           f"{res['launches']} launches back to back a batch, the forms interleaved over "
           f"{res['reps']} rounds; us per phase = a launch's time / {res['phases'] - 1}"]
    for name, us in res["us"].items():
        out.append(f"  {name:22s} {us:7.3f} us per phase  (a launch or replay "
                   f"{res['launch_us'][name]:8.1f} us, median of {res['reps']} rounds)")
    base = res["us"]["none"]
    for name, us in res["us"].items():
        if name != "none":
            out.append(f"  {name:22s} {us - base:+7.3f} us per phase against none")
    return out
