"""The device loop's two condition kernels (LAB_LOOP=device), each beside its NumPy twin.

A conditional graph node runs its body according to a value the DEVICE sets: a kernel in the
graph calls `cudaGraphSetConditional(handle, value)`. numba cannot call that device-runtime
function, so these two are CUDA C, compiled by CuPy (NVRTC) on a GPU; the simulator runs their
twins. Both read device memory only: the position the step's own `advance` kernel wrote, a
table made at start-up, and the request's step limit.

  loop_plan      SWITCH value: which plan body runs this iteration = plan_of[pos[0]]
  loop_continue  WHILE value: another iteration while pos[0] < limit[0]
"""
from __future__ import annotations

import numpy as np

SOURCE = r"""
#include <cuda_device_runtime_api.h>

extern "C" __global__ void loop_plan(const int* pos, const int* plan_of,
                                     cudaGraphConditionalHandle handle) {
    cudaGraphSetConditional(handle, (unsigned int)plan_of[pos[0]]);
}

extern "C" __global__ void loop_continue(const int* pos, const int* limit,
                                         cudaGraphConditionalHandle handle) {
    cudaGraphSetConditional(handle, pos[0] < limit[0] ? 1u : 0u);
}
"""
NAMES = ("loop_plan", "loop_continue")


def loop_plan_twin(pos: np.ndarray, plan_of: np.ndarray) -> int:
    """The SWITCH value loop_plan sets: the plan body for the current position."""
    return int(plan_of[int(pos[0])])


def loop_continue_twin(pos: np.ndarray, limit: np.ndarray) -> int:
    """The WHILE value loop_continue sets: 1 while steps remain."""
    return int(pos[0] < limit[0])
