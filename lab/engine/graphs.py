"""The engine's graph cache: one graph per plan key (one per rank with ranks), captured on a
miss, replayed on a hit; a plan whose capture failed runs eagerly from then on (the fallback,
with its reason in the ledger).

LAB_PLAN_SWITCH=update (one device): instead of instantiating a graph per plan, give the live
graph the new plan's parameters in place (cudaGraphExecUpdate); each plan's captured graph is
kept, so a switch back is an update too. When the runtime refuses (another topology), the plan
gets a graph of its own, as recapture does.

`GraphCache` is a mixin of lab/engine/runner.py's DecodeEngine: it calls the engine's `capture` and
`_eager`, and keeps `_graphs`, `_defs` (captured, not instantiated), `_live` and `_failed`; it
also ends a capture (one device's, or every rank's) as `capture` needs it ended.
"""
from __future__ import annotations

from lab.errors import CaptureError
from lab.ledger import LedgerEntry
from lab.plan import Plan
from .ranks import per_rank


class GraphCache:
    def graph_key(self, plan: Plan) -> tuple:
        """The key of `plan`'s graph in the graph cache (the step's `graph_key`: the plan key)."""
        return self._pieces[0].graph_key(plan)

    def _graph_step(self, plan: Plan) -> LedgerEntry:
        key = self.graph_key(plan)
        if key in self._failed:
            return self._eager(plan, "fallback", self._failed[key].reason)
        graph, outcome, note = self._graphs.get(key), "replay", ""
        failure = None
        if graph is None and self.cfg.plan_switch == "update" and self._live is not None:
            graph, note, failure = self._update_live(plan)
            outcome = "update"
        if graph is None and failure is None:
            graph, failure = self._new_graph(plan)
            outcome = "capture"
        if graph is None:
            self._failed[key] = failure
            return self._eager(plan, "fallback", failure.reason)
        for g, log in zip(per_rank(graph), self.logs):
            g.launch()
            log.record_replay(key, g.node_count)
        self._live = graph
        return LedgerEntry(self._steps, self.position, key, outcome, note, plan.key)

    def _new_graph(self, plan: Plan):
        """Capture and instantiate the plan's graph. Under LAB_PLAN_SWITCH=update the captured
        graph is kept too, so a later switch back to this plan is an update, not a capture."""
        if self.cfg.plan_switch != "update":
            return self.capture(plan)
        source, failure = self._kept_capture(plan)
        if source is None:
            return None, failure
        graph = self._graphs[self.graph_key(plan)] = self.backend.instantiate(source)
        return graph, None

    def _kept_capture(self, plan: Plan):
        """The plan's captured (not instantiated) graph, captured on first need and kept:
        (source, None), or (None, CaptureFailure)."""
        source = self._defs.get(plan.key)
        if source is None:
            source, failure = self.capture(plan, instantiate=False)
            if source is None:
                return None, failure
            self._defs[plan.key] = source
        return source, None

    def _update_live(self, plan: Plan):
        """LAB_PLAN_SWITCH=update: give the live graph the new plan's parameters in place.
        (graph, "", None) when done; (None, "update-refused: why", None) when the runtime refused,
        and then the caller instantiates a graph of its own for the plan, as recapture does;
        (None, "", CaptureFailure) when the step could not be captured at all."""
        source, failure = self._kept_capture(plan)
        if source is None:
            return None, "", failure
        why = self._live.update(source)
        if why is not None:
            return None, f"update-refused: {why}", None
        for k in [k for k, g in self._graphs.items() if g is self._live]:
            del self._graphs[k]               # the live graph now runs this plan, not its old one
        self._graphs[self.graph_key(plan)] = self._live
        return self._live, "", None

    def _end_captures(self, instantiate: bool):
        """One device: its graph. Ranks: every rank's capture ended (the group ends them, the
        last opened first), then each instantiated: a list, one graph per rank."""
        if self.ranks == 1:
            return self.backend.end_capture(instantiate=instantiate)
        defs = self.group.end_captures()
        return [be.instantiate(d) for be, d in zip(self.backends, defs)] if instantiate else defs

    def _close_failed_capture(self, exc: CaptureError, opened: list) -> str:
        """End what a failed capture left open; the reason to report. One device: end it, and
        report the error end_capture shows for the invalidated capture (the first offence). Ranks: abort every
        rank's capture, in the reverse of the order they were opened."""
        if self.ranks == 1:
            reason, be = exc.reason, self.backend
            if be.is_capturing():
                try:
                    be.end_capture()
                except CaptureError as invalidated:
                    reason = invalidated.reason
            return reason
        for be in reversed(opened):
            be.abort_capture()
        return f"capture failed on a rank: {exc.reason}"

    def drop_graphs(self) -> None:
        """Forget every graph (and capture failure): the next step of each plan captures anew,
        as on a fresh engine, with the buffers and the position kept."""
        self._graphs.clear()
        self._defs.clear()
        self._failed.clear()
        self._live = None

    @property
    def graphs(self) -> dict:
        """{plan key: its graph} (with ranks: a list, one graph per rank)."""
        return dict(self._graphs)

    @property
    def capture_failures(self) -> dict:
        """{plan key: why its capture failed (a CaptureFailure)} for every plan that runs eagerly
        instead."""
        return dict(self._failed)
