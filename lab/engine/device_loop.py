"""LAB_LOOP=device: the whole generation in ONE launch of a graph that loops on the device
(WHILE pos < limit over a SWITCH of every plan's step, the plan read from `plan_of[pos]`), built
once per set of toggles. One device, the clean step, graphs on; anything else is refused with a
warning, and `generate` runs the host loop instead.

`DeviceLoop` is a mixin of lab/engine/runner.py's DecodeEngine.
"""
from __future__ import annotations

import warnings

import numpy as np

from lab.errors import CaptureError, LabError
from lab.ledger import LedgerEntry
from lab.plan import plan_boundaries


class DeviceLoop:
    def device_loop_refusal(self) -> str | None:
        """Why LAB_LOOP=device cannot run here (None: it can)."""
        if not self.cfg.graph:
            return "it needs LAB_GRAPH=1 (the loop is one graph)"
        if self.cfg.bugs:
            return ("it runs the clean step only: a deliberate bug's host work cannot run inside "
                    "the loop, and a step that stops the position would never end it")
        return self.backend.loop_support()

    def device_loop(self):
        """The loop graph for the current toggles (built on first use: one body per plan), or
        None after a warning when it is refused; generate then runs the host loop."""
        why = self.device_loop_refusal()
        key = self.plan(0).key[2:]                 # the toggles: every plan of them shares a loop
        if why is None and key not in self._loops:
            plans = [self.plan(p) for p in [0] + plan_boundaries(self.model.cfg.max_seq)]

            def issue_body(k):
                for item in self._items(plans[k]):
                    self._issue(item)
            try:
                b = self.buf
                self._loops[key] = self.backend.build_loop(len(plans), issue_body, b.pos,
                                                           b.plan_of, b.limit)
            except (CaptureError, LabError) as exc:
                why = f"the device loop could not be built: {exc}"
        if why is not None:
            msg = f"LAB_LOOP=device refused: {why}; running the host loop"
            if msg not in self.warnings:
                self.warnings.append(msg)
                warnings.warn(msg, stacklevel=3)
            return None
        return self._loops[key]

    def _run_device_loop(self, loop, steps: int) -> float:
        """`steps` steps from the current position in ONE launch; the ledger gets a "device"
        entry per step (the plan the device chose from plan_of, known here after the fact)."""
        start = self.position
        self.backend.upload(self.buf.limit, np.array([start + steps], np.int32))
        self.log.step = self._steps
        t0 = self.backend.clock()
        loop.launch()
        seconds = self.backend.clock() - t0
        self.log.record_replay(("device loop",), loop.node_count)
        for i in range(steps):
            self.ledger.append(LedgerEntry(self._steps + i, start + i, self.plan(start + i).key,
                                           "device"))
        self.position, self._steps = start + steps, self._steps + steps
        return seconds
