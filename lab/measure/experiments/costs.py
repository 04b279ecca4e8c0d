"""kernel_costs.json (+ ladder.json, fission.json) and spec_costs.json: the simulator's costs,
recorded by lab/measure/costfile.py (imported when the experiment runs: the listing loads no numba)."""
from __future__ import annotations

from lab.measure.experiment import experiment


@experiment("costs", ("kernel_costs.json", "ladder.json", "fission.json"), priority=10,
            backends=("cuda",))
def costs(ctx) -> None:
    """The simulator's component costs (kernel_costs.json), and in the same process the ladder
    and fission, whose host-bound arms need this process's host (notebooks 03, 06, 10)."""
    from lab.measure.costfile import record_costs
    record_costs(ctx)


@experiment("spec_costs", ("spec_costs.json",), priority=15, backends=("cuda",))
def spec_costs(ctx) -> None:
    """The verify steps' component costs (SPEC_STEPS, LAB_DRAFT), the cost file's supplement
    (notebook 14)."""
    from lab.measure.costfile import record_spec_costs
    record_spec_costs(ctx)
