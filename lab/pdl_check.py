"""PDL safety, statically: does every kernel wait before it reads memory a predecessor wrote?

The rule that can be enforced without a data-flow analysis: the wait is the FIRST statement of
every kernel (after its docstring). `wait_first_violations()` lists the kernels that break it;
`pre_wait_reads(spec)` says which arguments a kernel touches before its wait -- the simulator
uses it to report a race when such an argument was written by the kernel just before it.
`late_trigger_violations()` holds kernels/pdl.py's LATE_TRIGGER kernels to their measured rule:
their trigger, `pdl_launch_dependents()`, comes after their main work, not right after the wait.
"""
from __future__ import annotations

import ast
import functools
import inspect
import textwrap


@functools.lru_cache(maxsize=None)
def _body(py_func):
    fn = ast.parse(textwrap.dedent(inspect.getsource(py_func))).body[0]
    body = list(fn.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    return fn, body


def _is_wait(stmt) -> bool:
    return (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
            and getattr(stmt.value.func, "id", None) == "pdl_wait")


def pre_wait_reads(spec) -> frozenset[int]:
    """Indices of the arguments referenced before the kernel's pdl_wait() (all, if it has none)."""
    fn, body = _body(spec.py_func)
    params = [a.arg for a in fn.args.args]
    used: set[str] = set()
    for stmt in body:
        if _is_wait(stmt):
            break
        used |= {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name)}
    return frozenset(i for i, p in enumerate(params) if p in used)


def wait_first_violations(registry=None) -> dict[str, str]:
    """{kernel: why} for every registered kernel whose first statement is not pdl_wait()."""
    if registry is None:
        from kernels import REGISTRY as registry
    out = {}
    for name, spec in registry.items():
        fn, body = _body(spec.py_func)
        if not body or not _is_wait(body[0]):
            reads = pre_wait_reads(spec)
            names = [fn.args.args[i].arg for i in sorted(reads)]
            out[name] = f"first statement is not pdl_wait(); touches {names} before waiting"
    return out


def _is_trigger(stmt) -> bool:
    return (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
            and getattr(stmt.value.func, "id", None) == "pdl_launch_dependents")


def late_trigger_violations(registry=None, late=None) -> dict[str, str]:
    """{kernel: why} for every kernel of `late` (kernels/pdl.py's LATE_TRIGGER) whose trigger
    is not after its work: one pdl_launch_dependents() at the top level of its body, after the
    last call that is neither the wait nor the trigger (the partials) -- or none at all."""
    if registry is None:
        from kernels import REGISTRY as registry
    if late is None:
        from kernels.pdl import LATE_TRIGGER as late
    out = {}
    for name in late:
        if name not in registry:
            out[name] = "listed in LATE_TRIGGER but not a registered kernel"
            continue
        _, body = _body(registry[name].py_func)
        triggers = [i for i, st in enumerate(body) if _is_trigger(st)]
        work = [i for i, st in enumerate(body) if not (_is_wait(st) or _is_trigger(st))
                and any(isinstance(n, ast.Call) for n in ast.walk(st))
                and not any(isinstance(n, ast.Attribute) and n.attr in ("shared", "local")
                            for n in ast.walk(st))]
        if len(triggers) != 1:
            out[name] = f"{len(triggers)} top-level pdl_launch_dependents() calls, not one"
        elif work and triggers[0] < work[0]:
            out[name] = (f"triggers its dependents at statement {triggers[0] + 1}, before its "
                         f"work (statement {work[0] + 1}): at long context they would be placed "
                         f"on the few SMs its grid leaves free")
    return out
