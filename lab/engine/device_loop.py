"""LAB_LOOP=device: the whole generation in ONE launch of a graph that loops on the device
(WHILE pos < limit over a SWITCH of every plan's step, the plan read from `plan_of[pos]`), built
once per set of toggles. One device, the clean step, graphs on; anything else is refused with a
warning, and `decode` runs the host loop instead. Drivers that take an engine:

  refusal   why the loop cannot run here (None: it can)
  get       the loop graph for the engine's toggles (built on first use), or None
  run       `steps` steps in one launch; a "device" ledger entry per step
"""
from __future__ import annotations

import warnings

import numpy as np

from lab.errors import CaptureError, LabError
from lab.ledger import LedgerEntry
from lab.plan import plan_boundaries


def refusal(eng) -> str | None:
    """Why LAB_LOOP=device cannot run on `eng` (None: it can)."""
    if not eng.cfg.graph:
        return "it needs LAB_GRAPH=1 (the loop is one graph)"
    if eng.cfg.bugs:
        return ("it runs the clean step only: a deliberate bug's host work cannot run inside "
                "the loop, and a step that stops the position would never end it")
    return eng.backend.loop_support()


def get(eng):
    """The loop graph for the current toggles (built on first use: one body per plan, kept in
    `eng.loops`), or None after a warning when it is refused; decode then runs the host loop."""
    why = refusal(eng)
    key = eng.plan(0).key[2:]                  # the toggles: every plan of them shares a loop
    if why is None and key not in eng.loops:
        plans = [eng.plan(p) for p in [0] + plan_boundaries(eng.model.cfg.max_seq)]

        def issue_body(k):
            for item in eng.issuer.items(plans[k]):
                eng.issuer.issue(item)
        try:
            b = eng.buf
            eng.loops[key] = eng.backend.build_loop(len(plans), issue_body, b.pos, b.plan_of,
                                                    b.limit)
        except (CaptureError, LabError) as exc:
            why = f"the device loop could not be built: {exc}"
    if why is not None:
        msg = f"LAB_LOOP=device refused: {why}; running the host loop"
        if msg not in eng.warnings:
            eng.warnings.append(msg)
            warnings.warn(msg, stacklevel=4)
        return None
    return eng.loops[key]


def run(eng, loop, steps: int) -> float:
    """`steps` steps from the current position in ONE launch; the ledger gets a "device" entry
    per step (the plan the device chose from plan_of, known here after the fact)."""
    start, first = eng.position, eng.steps_run
    eng.backend.upload(eng.buf.limit, np.array([start + steps], np.int32))
    eng.log.step = first
    t0 = eng.backend.clock()
    loop.launch()
    seconds = eng.backend.clock() - t0
    eng.log.record_replay(("device loop",), loop.node_count)
    for i in range(steps):
        eng.ledger.append(LedgerEntry(first + i, start + i, eng.plan(start + i).key, "device"))
    eng.track_position(start + steps, steps)
    return seconds
