"""The issuer: a step's items onto the devices, eagerly or into an open capture.

  Issuer.items        a rank's items for a plan (a clean step's built once per plan key)
  Issuer.issue_step   every rank's step: one device item by item; ranks in lockstep, each
                      rank's items up to its next collective, then every rank's pending
                      collective in one group
  collective_order    where the ranks' collective sequences first differ (None: they agree)
"""
from __future__ import annotations

from lab.backend import Collective, Launch
from lab.errors import CollectiveError
from lab.plan import Plan
from .step import HostWork


class Issuer:
    """Issues the steps `pieces` (one per rank: lab/engine/step.py) on `backends`; `group`:
    their collectives' group (`collectives()`, `simulated`)."""

    def __init__(self, backends: list, group, pieces: list):
        self.backends, self.group, self.pieces = list(backends), group, list(pieces)
        self.built: dict[tuple, list] = {}     # (rank, plan key) -> the step's items (clean)
        self.collectives_issued = 0

    def items(self, plan: Plan, rank: int = 0):
        """The step's items to issue. Clean step: the list built once per plan key (its build
        does no host work and does not depend on the position). A step rebuilt each step (most
        deliberate bugs): the build itself, issued as it yields, so the bug's host work happens
        between launches, where a capture sees it (and where the lazy-init detector places it)."""
        pieces = self.pieces[rank]
        if pieces.rebuilt_each_step:
            return pieces.items(plan)
        items = self.built.get((rank, plan.key))
        if items is None:
            items = self.built[(rank, plan.key)] = list(pieces.items(plan))
        return items

    def issue(self, item, rank: int = 0) -> None:
        self.backends[rank].issue(item)

    def issue_step(self, plan: Plan, where: list | None = None) -> None:
        """Issue every rank's step. A rank with none left while another waits in a collective
        is issued as it is: the device (or the simulator) meets the mismatch; a GPU group is
        refused before anything is issued (NCCL would hang). `where`: [what is being issued,
        launches before it], kept up to date for a capture's failure report."""
        ranks = len(self.pieces)
        if ranks > 1 and not self.group.simulated:
            why = self.collective_order(plan)
            if why is not None:                  # never hang a real GPU pair
                raise CollectiveError(f"refused before issuing: {why}; NCCL would hang both GPUs")
        its = [iter(self.items(plan, r)) for r in range(ranks)]
        done = [False] * ranks
        while not all(done):
            pending = []
            for r, it in enumerate(its):
                if done[r]:
                    continue
                for item in it:
                    if isinstance(item, Collective):
                        pending.append((r, item))
                        break
                    if where is not None:
                        where[0] = issuing(item, where[1])
                    self.issue(item, r)
                    if where is not None:
                        where[1] += isinstance(item, Launch)
                else:
                    done[r] = True
            if pending:
                with self.group.collectives():
                    for r, coll in pending:
                        self.backends[r].collective(coll)
                self.collectives_issued += len(pending)

    # ---- queries: nothing is issued --------------------------------------------------------------
    def step_items(self, plan: Plan, rank: int = 0) -> list:
        """Rank `rank`'s items for `plan` (nothing issued, cached, allocated or uploaded; for a
        clean step already issued at this plan key, the very objects its steps issue)."""
        items = self.built.get((rank, plan.key))
        return list(items) if items is not None else list(self.pieces[rank].items(plan))

    def step_launches(self, plan: Plan, rank: int = 0) -> list[Launch]:
        items = self.built.get((rank, plan.key))
        if items is None:
            return self.pieces[rank].launches(plan)
        return [x for x in items if isinstance(x, Launch)]

    def step_collectives(self, plan: Plan, rank: int = 0) -> list[Collective]:
        return [x for x in self.step_items(plan, rank) if isinstance(x, Collective)]

    def collective_order(self, plan: Plan) -> str | None:
        """None when every rank issues the same collectives (op, count, dtype) in the same order
        for `plan`; else where the first difference is. NCCL matches collectives by order alone."""
        colls = [self.step_collectives(plan, r) for r in range(len(self.pieces))]
        seqs = [[c.signature() for c in cs] for cs in colls]
        for k in range(max(len(s) for s in seqs)):
            have = [s[k] if k < len(s) else None for s in seqs]
            if len(set(have)) > 1:
                parts = [f"rank {r}: " + (colls[r][k].describe() if h else
                                          f"none (it issues {len(seqs[r])})")
                         for r, h in enumerate(have)]
                return (f"collective #{k} differs across ranks at position {plan.position} "
                        f"({'; '.join(parts)})")
        return None


def issuing(item, launches: int) -> str:
    """Where a capture is when it issues `item` after `launches` launches (its failure report)."""
    if isinstance(item, Launch):
        return f"launch {launches} ({item.name})"
    if isinstance(item, HostWork):
        return f"host work before launch {launches} ({item.what})"
    return f"stream wait before launch {launches}"
