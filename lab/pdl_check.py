"""PDL safety, statically: does every kernel wait before it reads memory a predecessor wrote?

The rule that can be enforced without a data-flow analysis: the wait is the FIRST statement of
every kernel (after its docstring). `wait_first_violations()` lists the kernels that break it;
`pre_wait_reads(spec)` says which arguments a kernel touches before its wait -- the simulator
uses it to report a race when such an argument was written by the kernel just before it.
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
