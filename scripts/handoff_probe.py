"""What one hand-off between phases costs inside a persistent kernel, on a GPU, against the same
phase's work as graph kernels with and without PDL: lab/measure/handoff.py's measurement (its
docstring names the forms) at one D, printed with its commit, GPU and versions.

    python3 scripts/handoff_probe.py [--phases 100] [--launches 20] [--d 256] [--reps 5]

Needs a GPU. `decode-lab record handoff` records the same at D = 256 and 512 in handoff.json.
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
    from lab.measure.handoff import check_rows, measure, table
    try:
        check_rows(a.d)
    except ValueError as e:
        raise SystemExit(f"--d: {e}")
    from lab.backend.cuda.device import CudaBackend
    from lab.measure.registry import revision
    rev = revision()
    print(f"scripts/handoff_probe.py {' '.join(argv if argv is not None else sys.argv[1:])}; "
          f"commit {rev['commit']}{' (dirty)' if rev['dirty'] else ''}; {datetime.date.today()}")
    print(CudaBackend.describe(None))   # the GPU and versions, as every recording names them
    print("\n".join(table(measure(a.d, a.phases, a.launches, a.reps))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
