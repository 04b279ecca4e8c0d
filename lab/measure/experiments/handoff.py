"""handoff.json: what one hand-off between phases costs inside a persistent kernel, against the
same phase's work as kernels in a CUDA graph with and without PDL (notebook 10; docs/results.md's
megakernel row). lab/measure/handoff.py's forms at D = 256 rows a phase (the model's d_model:
the output projection and the down projection) and 512 (its d_ff: the mlp's rows), each form
interleaved with the others over rounds. The probe's kernels are no part of a decode step and
not in the kernel registry.
"""
from __future__ import annotations

from lab.measure.experiment import experiment, today, versions

ROWS = (256, 512)


@experiment("handoff", ("handoff.json",), priority=77, backends=("cuda",))
def handoff(ctx) -> None:
    """Every hand-off form's us per phase at D = 256 and 512 (lab/measure/handoff.py)."""
    from lab.backend import make_backend
    from lab.config import LabConfig
    from lab.measure.handoff import measure, table
    be = make_backend(LabConfig(backend="cuda"))
    rows = []
    for D in ROWS:
        res = measure(D)
        print("\n".join(table(res)))
        rows.append(res)
    ctx.write_json("handoff.json", {
        "what": "us per phase of a chain of phases (D rows, a warp each, every row reading the "
                "whole vector the phase before wrote) by hand-off form: none (the work alone), "
                "the megakernel's counter, the tag in the data, graph kernels, graph kernels "
                "with PDL",
        "source": be.describe(), "date": today(), "versions": versions(be), "rows": rows})
