"""lab/measure/handoff.py (the handoff experiment's measurement), device-free: its printed
table and its refusals."""
import pytest

from lab.measure.handoff import FORMS, form_name, measure, table

RES = {"rows": 64, "phases": 10, "launches": 2, "reps": 3, "grid": 4, "block": 128,
       "us": {"none": 1.5, "count/spin": 2.25, "graph+pdl": 1.0},
       "launch_us": {"none": 13.5, "count/spin": 20.25, "graph+pdl": 9.0}}


def test_the_table_prints_each_form_then_each_against_the_work_alone():
    lines = table(RES)
    assert "D = 64 rows" in lines[0] and "over 3 rounds" in lines[0] and "/ 9" in lines[0]
    assert lines[1].split()[:2] == ["none", "1.500"] and "13.5 us" in lines[1]
    assert lines[3].split()[:2] == ["graph+pdl", "1.000"]
    assert lines[4].split()[:2] == ["count/spin", "+0.750"]
    assert lines[5].split()[:2] == ["graph+pdl", "-0.500"] and len(lines) == 6


def test_the_forms_are_named_once_each():
    names = [form_name(*f) for f in FORMS]
    assert len(set(names)) == len(names) and names[0] == "none"
    assert "none (plain launch)" in names and "count/spin" in names and "ll" in names


@pytest.mark.parametrize("D", [0, 48, 100])
def test_measure_refuses_rows_a_warp_cannot_split(D):
    with pytest.raises(ValueError, match="multiple of 32"):
        measure(D)
