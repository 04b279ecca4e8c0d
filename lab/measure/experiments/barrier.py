"""grid_barrier.json: the device time of one grid-wide barrier (notebook 11).

One cooperative launch runs `n` barriers (numba's `cuda.cg.this_grid().sync()`) and nothing else;
its device time (CUDA events around back-to-back launches, median over rounds) is fitted against
n, so the slope is one barrier: what the persistent step (kernels/persistent.py) pays 16 times a
token instead of node boundaries. Measured at one block per SM of 512 and of 256 threads, and
at twice the SMs' blocks where they fit. The probe kernel lives here: it is no part of a decode
step and not in the kernel registry (an engine's warm-up never compiles it).
"""
from __future__ import annotations

import statistics

from lab.measure.experiment import experiment, today, versions

# every count long enough that the device, not the host's launch, paces the back-to-back
# launches (a launch of 0 or 16 barriers is host-paced and would bend the fit)
BARRIERS = (128, 512, 2048)


def probe_kernel():
    from numba import cuda

    @cuda.jit("void(int32, int32[::1])")
    def grid_barriers(n, flag):
        """n grid-wide barriers; thread 0 of block 0 counts them (the loop cannot be elided)."""
        g = cuda.cg.this_grid()
        for _ in range(n):
            g.sync()
            if cuda.threadIdx.x == 0 and cuda.blockIdx.x == 0:
                flag[0] += 1
    return grid_barriers


def time_us(kern, grid, block, n, flag, launches=20, rounds=7) -> float:
    """Median device time of one launch of `n` barriers, microseconds."""
    from numba import cuda
    start, stop = cuda.event(), cuda.event()
    kern[grid, block](n, flag)                     # compiled and loaded outside the timing
    cuda.synchronize()
    per = []
    for _ in range(rounds):
        start.record()
        for _ in range(launches):
            kern[grid, block](n, flag)
        stop.record()
        stop.synchronize()
        per.append(1e3 * cuda.event_elapsed_time(start, stop) / launches)
    return statistics.median(per)


@experiment("barrier", ("grid_barrier.json",), priority=75, backends=("cuda",))
def barrier(ctx) -> None:
    """One grid-wide barrier's device time, the slope of a cooperative launch's time over its
    barrier count, at the persistent step's grid and two others (notebook 11)."""
    import numpy as np
    from numba import cuda
    from lab.backend import make_backend
    from lab.config import LabConfig
    be = make_backend(LabConfig(backend="cuda"))
    sms = cuda.get_current_device().MULTIPROCESSOR_COUNT
    kern = probe_kernel()
    flag = cuda.to_device(np.zeros(1, np.int32))
    rows = []
    for blocks_per_sm, threads in ((1, 512), (1, 256), (2, 256)):
        grid = sms * blocks_per_sm
        co = kern.overloads[kern.signatures[0]].max_cooperative_grid_blocks(threads)
        if grid > co:
            print(f"  grid {grid} x {threads}: not co-resident (max {co}), skipped")
            continue
        t = {n: time_us(kern, grid, threads, n, flag) for n in BARRIERS}
        slope, intercept = np.polyfit(list(t), list(t.values()), 1)
        rows.append({"grid": grid, "block": threads, "launch_us": {str(n): v for n, v in t.items()},
                     "per_barrier_us": float(slope), "intercept_us": float(intercept)})
        print(f"  grid {grid:>4} x {threads:>3}: {slope:.3f} us per barrier "
              f"(fit intercept {intercept:.2f} us)")
    if int(flag.copy_to_host()[0]) == 0:
        raise RuntimeError("the probe's barrier loop never ran (flag still 0)")
    ctx.write_json("grid_barrier.json", {
        "what": "one grid-wide barrier (cg.this_grid().sync()), device time: the slope of a "
                "cooperative launch's time over its barrier count",
        "source": be.describe(), "date": today(), "versions": versions(be), "sms": sms,
        "barriers": list(BARRIERS), "rows": rows})
