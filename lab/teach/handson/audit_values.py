"""Checklist step 2, audit host-computed values: list every pointer, by-value size or loop
bound, grid and block dimension and kernel choice that reaches a launch and changes between
steps, and classify each: promote it to device memory, or make it a capture key.

The student's `audit_values(engine, positions)` reads the step's launches at each position (a
query: engine.step_launches(engine.plan(p)) runs nothing). The check holds its verdicts to the
lab's own audit (lab.measure.audit.audit, which runs eager steps and reads the launch log) on real
engines: the clean step, LAB_BUG_FROZEN_KV_ROW (a pointer), LAB_BUG_CTX_BY_VALUE (a loop bound
passed by value) and a step whose MLP grid the host sizes from the position (a grid that changes
within one plan key, which no plan-keyed graph handles).
"""
from __future__ import annotations

import dataclasses

from lab.engine.step import Step, launch
from lab.measure.audit import audit
from lab.teach.exercise import Exercise, Fail
from .base import need, variant, watched
from .crash import explained
from .fixtures import engine

STATEMENT = """
Anything the host computes and a launch receives is frozen by a capture. Before capturing, list
every such value that changes between steps and decide: promote to device memory (pointers,
sizes and loop bounds passed by value), or make it a capture key (grid and block dimensions and
the kernel choice, which no kernel can read from memory). Do not skip loop bounds.

Write audit_values(engine, positions) -> {(launch index, what): verdict} for every value that is
not the same at all `positions`. For each position p: plan = engine.plan(p); the launches are
engine.step_launches(plan) (a query), each with .kernel.name, .grid, .block, .args and
.kernel.arg_names. `what` is "kernel", "grid", "block" or the argument's name. An argument that
is a lab.backend.Buffer is a pointer (compare its .ptr); any other is passed by value. Verdicts:
  "promote to device memory"  a pointer or by-value argument that changes (even one that
                              changes only where plan.key changes)
  "capture key"               a kernel, grid or block that changes only where plan.key changes
  "unhandled capture key"     a kernel, grid or block that changes within one plan key

A value is "the same at all positions" only when it is equal at EVERY position: one that changes
between the first and the last and comes back is not.

The check: the clean engine, a frozen KV-row pointer, a by-value context length, a grid sized
from the position, a kernel chosen by the plan, a grid changed for the middle plan only, and a
block and a by-value eps chosen by the plan, against lab.measure.audit.audit (calling it fails
the check).
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


# the launches' grids, blocks and arguments compared, never the kernel each one runs
NO_KERNEL = variant(REFERENCE, '''            values = [("kernel", "key", x.kernel.name), ("grid", "key", x.grid),
                      ("block", "key", x.block)]''', '''            values = [("grid", "key", x.grid), ("block", "key", x.block)]''')
# "the same at all positions" judged by the first and the last position only
ENDS_ONLY = variant(REFERENCE, '''        if len(values) == len(positions) and len(set(values.values())) == 1:''',
                    '''        ends = [values.get(positions[0]), values.get(positions[-1])]
        if len(values) == len(positions) and ends[0] == ends[1]:''')


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


class KernelForTheLastPlan(Step):
    """The MLP's up projection launched through another kernel (the same code under another
    name: a specialisation) when the plan has 4 splits: the kernel choice changes where the plan
    key does."""
    rebuilt_each_step = True

    def mlp_up(self, plan, layer):
        norm, up = list(super().mlp_up(plan, layer))
        kern = (dataclasses.replace(up.kernel, name=f"{up.kernel.name}_wide")
                if plan.splits == 4 else up.kernel)
        yield norm
        yield launch(kern, (up.grid, up.block), up.args, layer)


class GridForTheMiddlePlan(Step):
    """The MLP's up projection launched on one more block for the plan of 2 splits only (the
    twin computes every row whatever the grid): a grid that changes between the first and the
    last positions of the audit and is the same at both."""
    rebuilt_each_step = True

    def mlp_up(self, plan, layer):
        norm, up = list(super().mlp_up(plan, layer))
        grid = (up.grid[0] + (plan.splits == 2), *up.grid[1:])
        yield norm
        yield launch(up.kernel, (grid, up.block), up.args, layer)


class BlockForThePlan(Step):
    """The MLP's up projection launched with a block of another size for the plan of 4 splits
    (the twin computes every row whatever the block): a block that changes where the plan key
    does."""
    rebuilt_each_step = True

    def mlp_up(self, plan, layer):
        norm, up = list(super().mlp_up(plan, layer))
        block = (up.block[0] // 2 if plan.splits == 4 else up.block[0], *up.block[1:])
        yield norm
        yield launch(up.kernel, (up.grid, block), up.args, layer)


class EpsForThePlan(Step):
    """The MLP's norm given its epsilon by value, another for the plan of 4 splits: a by-value
    argument that changes only where the plan key does -- still a value a kernel could read
    from device memory, so promoted, not keyed."""
    rebuilt_each_step = True

    def mlp_up(self, plan, layer):
        norm, up = list(super().mlp_up(plan, layer))
        eps = type(norm.args[-1])(norm.args[-1] * (2 if plan.splits == 4 else 1))
        yield launch(norm.kernel, (norm.grid, norm.block), (*norm.args[:-1], eps), layer)
        yield up


_CASES = (("the clean engine", {}), ("LAB_BUG_FROZEN_KV_ROW", {"bugs": {"frozen_kv_row"}}),
          ("LAB_BUG_CTX_BY_VALUE", {"bugs": {"ctx_by_value"}}),
          ("an MLP grid sized from the position", {"step": GridFromPosition}),
          ("an MLP kernel chosen by the plan (another for 4 splits)",
           {"step": KernelForTheLastPlan}),
          ("an MLP grid one block larger in the middle plan only",
           {"step": GridForTheMiddlePlan}),
          ("an MLP block chosen by the plan (half as wide for 4 splits)",
           {"step": BlockForThePlan}),
          ("the MLP norm's eps passed by value, chosen by the plan (doubled for 4 splits)",
           {"step": EpsForThePlan}))
_HINTS = {"promote to device memory": "a pointer, size or loop bound that changes: promote it to "
                                      "device memory (do not skip by-value loop bounds)",
          "capture key": "a grid, block or kernel cannot be promoted: it is a capture key",
          "unhandled capture key": "group its values by plan key: a grid that changes WITHIN one "
                                   "plan key is not handled by one graph per key"}


def _hint(where, verdict, got, values: dict, kind: str, found=()) -> str:
    """Why the solution's verdict on one value is wrong, from what it said, the values, their
    kind ("pointer", "by value", "grid", "block", "kernel") and the solution's other findings."""
    what = where[1]
    if got is None:
        ordered = [values[p] for p in sorted(values)]
        if len(ordered) > 1 and ordered[0] == ordered[-1]:
            return (f"its values at the first and last positions agree ({ordered[0]}) and it "
                    f"changes between them: compare its value at EVERY position")
        if any(w == what and i != where[0] for i, w in found):
            seq = ", ".join(map(str, ordered[:4]))
            return (f"you flag other launches' {what!r}, so you compare it, but this one changes "
                    f"from one position to the next ({seq}, ...): read every position you are "
                    f"given, none skipped")
        if what == "kernel":
            return ("the kernel choice is a host value that reaches the launch too: compare "
                    "x.kernel.name at every position (a capture key)")
        if what in ("grid", "block"):
            return f"the {what} is a host value that reaches the launch too: a capture key"
        if kind == "pointer":
            names = {str(v).split("+")[0] for v in values.values()}
            if len(names) == 1:
                return (f"it points into {names.pop()} at another offset each step (a view of one "
                        f"allocation): compare a Buffer by its .ptr, not its name, and promote "
                        f"it to device memory")
        return _HINTS[verdict]
    if verdict == "capture key" and got == "unhandled capture key":
        return ("it changes only where plan.key changes, and one graph per plan key follows it: "
                "a (handled) capture key")
    if verdict == "promote to device memory":
        return ("a pointer or an argument passed by value can be promoted to device memory (a "
                "kernel reads it from there), even one that changes only where the plan key "
                "does; only grid, block and kernel are capture keys")
    return _HINTS[verdict]


def expected(eng) -> tuple[list[int], dict, dict, dict]:
    """The lab's audit of `eng`: its positions, {(index, what): verdict}, {(index, what):
    {position: value}} and {(index, what): kind}, host writes aside."""
    rep = audit(eng)
    kept = [v for v in rep.varying if v.kind != "host write"]
    want = {(v.index, v.what): v.verdict if v.verdict != "capture key" or v.handled
            else "unhandled capture key" for v in kept}
    return (rep.positions, want, {(v.index, v.what): v.values for v in kept},
            {(v.index, v.what): v.kind for v in kept})


def cases(sol, backend):
    (fn,) = need(sol, ("audit_values",))
    for label, kw in _CASES:
        positions, want, values, kinds = expected(engine(backend, **kw))
        got = watched((("lab.measure.audit.audit", audit),),
                      explained(fn, f"audit_values ({label})"), engine(backend, **kw),
                      list(positions), what=f"audit_values ({label})")
        if not isinstance(got, dict):
            raise Fail(f"audit_values returned {type(got).__name__} ({label}): return a dict")
        odd = [k for k in got if not (isinstance(k, tuple) and len(k) == 2
                                      and isinstance(k[0], int) and isinstance(k[1], str))]
        if odd:
            raise Fail(f"{label}: your finding {odd[0]!r} is not keyed (launch index, what): key "
                       f"each one by the launch's index in engine.step_launches(plan) (an int) "
                       f"and 'kernel', 'grid', 'block' or the argument's name, e.g. (4, 'grid')")
        for where, verdict in want.items():
            if got.get(where) != verdict:
                hint = _hint(where, verdict, got.get(where), values[where], kinds[where], got)
                raise Fail(f"{label}: launch {where[0]} {where[1]!r} changes between steps; you "
                           f"said {got.get(where)!r}, the audit says {verdict!r}: "
                           f"{hint}")
        extra = sorted(set(got) - set(want), key=str)
        if len(extra) > 2 * max(1, len(want)):
            raise Fail(f"{label}: you flagged {len(extra)} values that the audit says are the "
                       f"same at every position, {extra[0]} among them: flag a value only when it "
                       f"differs "
                       f"between the positions, reading each launch at EVERY position you are "
                       f"given")
        if extra:
            raise Fail(f"{label}: you flagged {extra[0]} ({got[extra[0]]!r}), which the audit "
                       f"says is the same at every step: nothing there for a capture to freeze")
        yield label


EXERCISE = Exercise(
    "audit", 2, "classify each host value that reaches a launch", "§2", STATEMENT, STUB,
    ("audit_values",), cases, REFERENCE,
    {"pointers only": (POINTERS_ONLY, "do not skip by-value loop bounds"),
     "grids promoted": (ALL_PROMOTED, "cannot be promoted"),
     "plan keys ignored": (NEVER_UNHANDLED, "WITHIN one plan key"),
     "kernel never compared": (NO_KERNEL, "the kernel choice is a host value"),
     "first and last only": (ENDS_ONLY, "compare its value at EVERY position")},
    stub_says="changes between steps; you said None")
