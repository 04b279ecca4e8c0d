"""The graph cache: one graph per key (one per rank with ranks), captured on a miss, replayed on
a hit; a key whose capture failed runs eagerly from then on (the fallback, its reason kept).

  GraphCache.get      the graph for a plan: kept, updated in place, or captured (or why not)
  GraphCache.record   capture what `issue` issues on every backend; every clean-up of a failure
  GraphCache.replay   launch each rank's graph
  drop, release       forget every graph; release them (before the communicators go)

LAB_PLAN_SWITCH=update (one device): instead of instantiating a graph per plan, give the live
graph the new plan's parameters in place (cudaGraphExecUpdate); each plan's captured graph is
kept, so a switch back is an update too. When the runtime refuses (another topology), the plan
gets a graph of its own, as recapture does.
"""
from __future__ import annotations

from typing import Callable

from lab.errors import CaptureError
from lab.ledger import CaptureFailure
from lab.plan import Plan


def per_rank(graph) -> list:
    """A plan's graphs, one per rank: a list with ranks, one graph on one device."""
    return graph if isinstance(graph, list) else [graph]


class GraphCache:
    """The graphs of one engine's devices. `capture(plan, instantiate)` captures the step for
    `plan`: (graph, None) or (None, CaptureFailure); the engine's `capture`, built on `record`."""

    def __init__(self, backends: list, group, capture: Callable):
        self.backends, self.group, self.capture = list(backends), group, capture
        self._graphs: dict[tuple, object] = {}     # key -> graph (ranks: a list, one per rank)
        self._defs: dict[tuple, object] = {}       # LAB_PLAN_SWITCH=update: captured, not instantiated
        self._live = None                          # the executable graph launched last
        self._failed: dict[tuple, CaptureFailure] = {}   # keys whose capture failed

    # ---- get or capture --------------------------------------------------------------------------
    def get(self, plan: Plan, key: tuple, update: bool = False):
        """(graph, outcome, note): outcome "replay", "update" or "capture"; or (None,
        "fallback", why) when the key's capture failed (now or before): run the step eagerly."""
        if key in self._failed:
            return None, "fallback", self._failed[key].reason
        graph, outcome, note, failure = self._graphs.get(key), "replay", "", None
        if graph is None and update and self._live is not None:
            graph, note, failure = self._update_live(plan, key)
            outcome = "update"
        if graph is None and failure is None:
            graph, failure = self._new_graph(plan, key, update)
            outcome = "capture"
        if graph is None:
            self._failed[key] = failure
            return None, "fallback", failure.reason
        self._graphs[key] = self._live = graph
        return graph, outcome, note

    def put(self, key: tuple, graph) -> None:
        """File `graph` under `key` (a capture made outside `get`)."""
        self._graphs[key] = graph

    def replay(self, graph, logs: list, key: tuple) -> None:
        """Launch `graph` (each rank's), each launch recorded in its rank's log."""
        for g, log in zip(per_rank(graph), logs):
            g.launch()
            log.record_replay(key, g.node_count)

    def _new_graph(self, plan: Plan, key: tuple, update: bool):
        """Capture and instantiate the plan's graph. Under LAB_PLAN_SWITCH=update the captured
        graph is kept too, so a later switch back to this plan is an update, not a capture."""
        if not update:
            return self.capture(plan, True)
        source, failure = self._kept_capture(plan)
        if source is None:
            return None, failure
        return self.backends[0].instantiate(source), None

    def _kept_capture(self, plan: Plan):
        """The plan's captured (not instantiated) graph, captured on first need and kept:
        (source, None), or (None, CaptureFailure)."""
        source = self._defs.get(plan.key)
        if source is None:
            source, failure = self.capture(plan, False)
            if source is None:
                return None, failure
            self._defs[plan.key] = source
        return source, None

    def _update_live(self, plan: Plan, key: tuple):
        """Give the live graph the new plan's parameters in place. (graph, "", None) when done;
        (None, "update-refused: why", None) when the runtime refused, and then the caller
        instantiates a graph of its own for the plan, as recapture does; (None, "",
        CaptureFailure) when the step could not be captured at all."""
        source, failure = self._kept_capture(plan)
        if source is None:
            return None, "", failure
        why = self._live.update(source)
        if why is not None:
            return None, f"update-refused: {why}", None
        for k in [k for k, g in self._graphs.items() if g is self._live]:
            del self._graphs[k]               # the live graph now runs this plan, not its old one
        return self._live, "", None

    # ---- a capture and its clean-up --------------------------------------------------------------
    def record(self, issue: Callable, instantiate: bool = True):
        """Capture what `issue(where)` issues (with ranks: every rank's capture open at once, in
        global mode, ended before any is instantiated): (graph, None), or (None, CaptureFailure)
        after ending the failed captures cleanly. `where`: [what is being issued, launches
        before it], kept up to date by `issue` for the failure's report. Any other exception
        aborts the open captures and goes through."""
        where, opened = ["begin_capture", 0], []
        try:
            for be in self.backends:
                be.begin_capture()
                opened.append(be)
            issue(where)
            where = ["end_capture", None]
            graph = self._end_captures(instantiate)
        except CaptureError as exc:
            return None, CaptureFailure(self._close_failed(exc, opened), *where)
        except BaseException:
            for be in reversed(opened):
                be.abort_capture()
            raise
        return graph, None

    def _end_captures(self, instantiate: bool):
        """One device: its graph. Ranks: every rank's capture ended (the group ends them, the
        last opened first), then each instantiated: a list, one graph per rank."""
        if len(self.backends) == 1:
            return self.backends[0].end_capture(instantiate=instantiate)
        defs = self.group.end_captures()
        return [be.instantiate(d) for be, d in zip(self.backends, defs)] if instantiate else defs

    def _close_failed(self, exc: CaptureError, opened: list) -> str:
        """End what a failed capture left open; the reason to report. One device: end it, and
        report the error end_capture shows for the invalidated capture (the first offence).
        Ranks: abort every rank's capture, in the reverse of the order they were opened."""
        if len(self.backends) == 1:
            reason, be = exc.reason, self.backends[0]
            if be.is_capturing():
                try:
                    be.end_capture()
                except CaptureError as invalidated:
                    reason = invalidated.reason
            return reason
        for be in reversed(opened):
            be.abort_capture()
        return f"capture failed on a rank: {exc.reason}"

    # ---- clean-up --------------------------------------------------------------------------------
    def drop(self) -> None:
        """Forget every graph (and capture failure): the next step of each plan captures anew."""
        self._graphs.clear()
        self._defs.clear()
        self._failed.clear()
        self._live = None

    def release(self) -> None:
        """Destroy every graph (each rank's): before the communicators their collectives use."""
        for graphs in self._graphs.values():
            for g in per_rank(graphs):
                getattr(g, "release", lambda: None)()
        self._graphs.clear()

    @property
    def graphs(self) -> dict:
        """{key: its graph} (with ranks: a list, one graph per rank)."""
        return dict(self._graphs)

    @property
    def failures(self) -> dict:
        """{key: why its capture failed (a CaptureFailure)} for every key that runs eagerly."""
        return dict(self._failed)
