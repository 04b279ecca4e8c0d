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

Prints us per phase for each (measured on this GPU; the header names it). Needs a GPU. The
kernels and the timing are lab/measure/handoff.py's; `decode-lab record handoff` records the
same at D = 256 and 512 in handoff.json.
"""
from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


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
    from lab.backend.cuda.device import CudaBackend
    from lab.measure.handoff import measure, table
    from lab.measure.registry import revision
    rev = revision()
    print(f"scripts/handoff_probe.py {' '.join(argv if argv is not None else sys.argv[1:])}; "
          f"commit {rev['commit']}{' (dirty)' if rev['dirty'] else ''}; {datetime.date.today()}")
    print(CudaBackend.describe(None))   # the GPU and versions, as every recording names them
    print("\n".join(table(measure(a.d, a.phases, a.launches, a.reps))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
