#!/usr/bin/env bash
# On a GPU host: run the GPU-marked tests and the kernel checks at model dims, then record every
# GPU figure the README and notebooks quote. Everything lands in OUTDIR (logs + data/gpu JSON).
# Last, the simulator's predictions are held against the fresh recordings (decode-lab conformance).
#   scripts/gpu_run.sh OUTDIR
set -uo pipefail
out=${1:?usage: scripts/gpu_run.sh OUTDIR}
mkdir -p "$out/gpu"
export PYTHONUNBUFFERED=1
step() { echo "== $* ($(date +%T))"; "$@"; echo "== exit $? ($(date +%T))"; }
{
  step python3 -m pytest -q -m gpu tests -p no:cacheprovider --ignore=tests/test_notebooks.py
  step python3 tests/_cudasim_kernels.py --gpu
  step python3 -m lab demo --backend cuda
  step python3 scripts/record_gpu_costs.py --out "$out/gpu"
  step python3 scripts/record_gpu.py --out "$out/gpu"
  step python3 scripts/record_gpu_bugs.py --out "$out/gpu"
  step python3 scripts/record_gpu_instances.py --out "$out/gpu"
  step python3 scripts/record_gpu_overlap.py --out "$out/gpu"
  step python3 scripts/record_gpu_bench.py --out "$out/gpu"
  step python3 scripts/record_gpu_precision.py --out "$out/gpu"
  step python3 scripts/record_gpu_plan_switch.py --out "$out/gpu"
  step python3 scripts/record_gpu_device_loop.py --out "$out/gpu"
  step python3 scripts/record_gpu_peer.py --out "$out/gpu"
  step python3 -m lab conformance --data "$out/gpu"
} 2>&1 | tee "$out/gpu_run.log"
