"""Checklist step 2, audit host-computed values: list every pointer, by-value size or loop
bound, grid and block dimension and kernel choice that reaches a launch and changes between
steps, and classify each: promote it to device memory, or make it a capture key.

The student's `audit_values(engine, positions)` reads the step's launches at each position (a
query: engine.step_launches(engine.plan(p)) runs nothing). The check holds its verdicts to the
lab's own audit (lab.teach.audit.audit, which runs eager steps and reads the launch log) on real
engines: the clean step, LAB_BUG_FROZEN_KV_ROW (a pointer), LAB_BUG_CTX_BY_VALUE (a loop bound
passed by value) and a step whose MLP grid the host sizes from the position (a grid that changes
within one plan key, which no plan-keyed graph handles).
"""
from __future__ import annotations

from lab.engine.step import Step, launch
from lab.teach.audit import audit
from .base import Exercise, Fail, need, variant, watched
from .fixtures import engine

SPEC = """
Anything the host computes and a launch receives is frozen by a capture. Before capturing, list
every such value that changes between steps and decide: promote to device memory (pointers,
sizes and loop bounds passed by value), or make it a capture key (grid and block dimensions and
the kernel choice, which no kernel can read from memory). Do not skip loop bounds.

Write audit_values(engine, positions) -> {(launch index, what): verdict} for every value that is
not the same at all `positions`. For each position p: plan = engine.plan(p); the launches are
engine.step_launches(plan) (a query), each with .kernel.name, .grid, .block, .args and
.kernel.arg_names. `what` is "kernel", "grid", "block" or the argument's name. An argument that
is a lab.backend.Buffer is a pointer (compare its .ptr); any other is passed by value. Verdicts:
  "promote to device memory"  a pointer or by-value argument that changes
  "capture key"               a kernel, grid or block that changes only where plan.key changes
  "unhandled capture key"     a kernel, grid or block that changes within one plan key

The check: the clean engine, a frozen KV-row pointer, a by-value context length and a grid sized
from the position, against lab.teach.audit.audit (calling it fails the check).
"""

STUB = '''
from lab.backend import Buffer


def audit_values(engine, positions):
    """{(launch index, what): verdict} for each host value that changes between positions."""
    findings = {}
    # FILL ME IN
    return findings
'''

REFERENCE = '''
from lab.backend import Buffer


def audit_values(engine, positions):
    seen, keys = {}, {}
    for p in positions:
        plan = engine.plan(p)
        keys[p] = plan.key
        for i, x in enumerate(engine.step_launches(plan)):
            values = [("kernel", "key", x.kernel.name), ("grid", "key", x.grid),
                      ("block", "key", x.block)]
            values += [(name, "promote", a.ptr if isinstance(a, Buffer) else a)
                       for name, a in zip(x.kernel.arg_names, x.args)]
            for what, kind, v in values:
                seen.setdefault((i, what), (kind, {}))[1][p] = str(v)
    findings = {}
    for where, (kind, values) in seen.items():
        if len(values) == len(positions) and len(set(values.values())) == 1:
            continue                                    # the same at every step: nothing frozen
        if kind == "promote":
            findings[where] = "promote to device memory"
            continue
        per_key = {}
        for p, v in values.items():
            per_key.setdefault(keys[p], set()).add(v)
        handled = all(len(s) == 1 for s in per_key.values())
        findings[where] = "capture key" if handled else "unhandled capture key"
    return findings
'''


# pointers only: by-value sizes and loop bounds are skipped
POINTERS_ONLY = variant(REFERENCE, '''            values += [(name, "promote", a.ptr if isinstance(a, Buffer) else a)
                       for name, a in zip(x.kernel.arg_names, x.args)]''',
                         '''            values += [(name, "promote", a.ptr)
                       for name, a in zip(x.kernel.arg_names, x.args) if isinstance(a, Buffer)]''')
# every changing value promoted, grids too
ALL_PROMOTED = variant(REFERENCE, '''            values = [("kernel", "key", x.kernel.name), ("grid", "key", x.grid),
                      ("block", "key", x.block)]''',
                        '''            values = [("kernel", "promote", x.kernel.name), ("grid", "promote", x.grid),
                      ("block", "promote", x.block)]''')
# a capture key is taken as handled without grouping by plan key
NEVER_UNHANDLED = variant(REFERENCE,
                          'findings[where] = "capture key" if handled else "unhandled capture key"',
                           'findings[where] = "capture key"')


class GridFromPosition(Step):
    """The MLP's up projection launched on a grid the host sizes from the position: a grid that
    changes within one plan key (the twin computes every row whatever the grid, so the tokens
    stay right; a graph of one plan would keep one of these grids for every step)."""
    rebuilt_each_step = True

    def mlp_up(self, plan, layer):
        norm, up = list(super().mlp_up(plan, layer))
        grid = (max(1, up.grid[0] - plan.position % 2),)
        yield norm
        yield launch(up.kernel, (grid, up.block), up.args, layer)


_CASES = (("the clean engine", {}), ("LAB_BUG_FROZEN_KV_ROW", {"bugs": {"frozen_kv_row"}}),
          ("LAB_BUG_CTX_BY_VALUE", {"bugs": {"ctx_by_value"}}),
          ("an MLP grid sized from the position", {"step": GridFromPosition}))
_HINTS = {"promote to device memory": "a pointer, size or loop bound that changes: promote it to "
                                      "device memory (do not skip by-value loop bounds)",
          "capture key": "a grid, block or kernel cannot be promoted: it is a capture key",
          "unhandled capture key": "group its values by plan key: a grid that changes WITHIN one "
                                   "plan key is not handled by one graph per key"}


def expected(eng) -> tuple[list[int], dict]:
    """The lab's audit of `eng`: its positions and {(index, what): verdict}, host writes aside."""
    rep = audit(eng)
    want = {(v.index, v.what): v.verdict if v.verdict != "capture key" or v.handled
            else "unhandled capture key" for v in rep.varying if v.kind != "host write"}
    return rep.positions, want


def cases(sol, backend):
    (fn,) = need(sol, ("audit_values",))
    for label, kw in _CASES:
        positions, want = expected(engine(backend, **kw))
        got = watched((("lab.teach.audit.audit", audit),), fn, engine(backend, **kw),
                      list(positions), what=f"audit_values ({label})")
        if not isinstance(got, dict):
            raise Fail(f"audit_values returned {type(got).__name__} ({label}): return a dict")
        for where, verdict in want.items():
            if got.get(where) != verdict:
                raise Fail(f"{label}: launch {where[0]} {where[1]!r} changes between steps; you "
                           f"said {got.get(where)!r}, the audit says {verdict!r}: "
                           f"{_HINTS[verdict]}")
        extra = sorted(set(got) - set(want), key=str)
        if extra:
            raise Fail(f"{label}: you flagged {extra[0]} ({got[extra[0]]!r}), which is the same at "
                       f"every step: nothing there for a capture to freeze")
        yield label


EXERCISE = Exercise(
    "audit", 2, "classify each host value that reaches a launch", "§2", SPEC, STUB,
    ("audit_values",), cases, REFERENCE,
    {"pointers only": (POINTERS_ONLY, "do not skip by-value loop bounds"),
     "grids promoted": (ALL_PROMOTED, "cannot be promoted"),
     "plan keys ignored": (NEVER_UNHANDLED, "WITHIN one plan key")},
    stub_says="changes between steps; you said None")
