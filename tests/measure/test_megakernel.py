"""lab/measure/megakernel.py's readers of the megakernel's probes, device-free."""
from pathlib import Path

import pytest

from lab.measure.megakernel import handoff_tables

ROOT = Path(__file__).resolve().parents[2]

PRINTOUT = """scripts/handoff_probe.py --d 64; commit abc; 2026-12-03
measured on Some GPU (sm_90), numba 0.68.0
grid 4 x 128 threads, D = 64 rows a phase (a warp per row), 10 phases a launch, 2 launches
  none                     1.500 us per phase  (launch     13.5 us)
  count/spin               2.250 us per phase  (launch     20.2 us)
  graph+pdl                1.000 us per phase  (replay      9.0 us, 9 kernels)
  count/spin              +0.750 us per phase against none
"""


def test_handoff_tables_read_each_form_and_skip_the_differences():
    t, = handoff_tables(PRINTOUT)
    assert t == {"rows": 64, "source": "measured on Some GPU (sm_90), numba 0.68.0",
                 "us": {"none": 1.5, "count/spin": 2.25, "graph+pdl": 1.0}}
    two = handoff_tables(PRINTOUT + "\n" + PRINTOUT.replace("D = 64", "D = 128"))
    assert [x["rows"] for x in two] == [64, 128]


def test_handoff_tables_refuse_a_printout_with_no_table():
    with pytest.raises(ValueError, match="no table"):
        handoff_tables(PRINTOUT.split("  none")[0])


def test_the_recorded_handoff_probe_reads_back():
    """data/gpu/handoff_probe.txt: both printouts, every form, measured on a GPU."""
    tables = handoff_tables((ROOT / "data/gpu/handoff_probe.txt").read_text())
    assert [t["rows"] for t in tables] == [256, 512]
    for t in tables:
        assert {"none", "count", "ll", "graph", "graph+pdl"} <= set(t["us"])
        assert t["source"].startswith("measured on ") and all(v > 0 for v in t["us"].values())
