"""A solution's own crash, said in words: where in the solution it happened and what the
operation there was given (an argument of the wrong kind, a key never stored, an operator that
does not apply, a slice with step 0, a lab function given its values in the wrong order).

`explained(fn, what)` wraps a solution's function: an exception raised by the solution's own
code (or by a lab function it called with values that function refuses) becomes a Fail whose
line names the exception, the solution's line and what was wrong there. An exception that
`base.call_fault` already puts in words, or one raised elsewhere, goes through unchanged, for
`base.watched` and the check to report.
"""
from __future__ import annotations

import ast
import functools
import linecache

from lab.errors import CaptureError, CollectiveError, DeviceFault, LabError
from lab.teach.exercise import Fail
from .base import call_fault, is_lab, lab_call, solution_frames, traceback_frames

_SEQUENCES = ("list", "tuple", "str")
# what a lab function raises when the values it was given are not the kind it takes
_REFUSALS = (TypeError, ValueError, AttributeError, KeyError, IndexError, LabError)


def explained(fn, what: str):
    """`fn`, its own crashes reported as a Fail that says what went wrong and where."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (Fail, MemoryError):
            raise
        except Exception as exc:          # the solution's crash: said in words when it can be
            words = crash_words(exc)
            if words is None:
                raise
            text = " ".join(str(exc).split())[:160]
            raise Fail(f"{what} raised {type(exc).__name__}: {text} -- {words}") from None
    return call


def crash_words(exc: BaseException) -> str | None:
    """Where the solution crashed and what was wrong there, in words; None when the crash was
    not in the solution's own code, or when call_fault already names it."""
    if call_fault(exc) is not None or isinstance(exc, (CaptureError, CollectiveError,
                                                       DeviceFault)):
        return None           # put in words already, or a failure the check itself judges
    frames = traceback_frames(exc)
    mine = solution_frames(frames)
    if not mine:
        return None
    i = mine[-1]
    frame, lasti, lineno = frames[i]
    line = linecache.getline(frame.f_code.co_filename, lineno).strip()
    at = f"at line {lineno} of your solution, `{_short_text(line, 72)}`"
    if i + 1 < len(frames) and is_lab(frames[i + 1][0].f_code.co_filename):
        if not isinstance(exc, _REFUSALS):
            return None       # the lab's own error, in its own words
        why = _lab_call(frame, frames[i + 1][0])
        return f"{at}: {why}" if why else at
    node = _node_at(frame.f_code, lasti)
    why = _why(exc, node, frame, frames[i - 1][0] if i and i - 1 in mine else None)
    return f"{at}: {why}" if why else at


def _short_text(text: str, n: int) -> str:
    return text if len(text) <= n else text[:n - 3] + "..."


def _lab_call(caller, callee) -> str:
    """A lab function the solution called raised: its values, by name, and its parameters'
    order."""
    name, shown, params = lab_call(callee)
    if not params:
        return ""
    if len(params) >= 2:
        return (f"the lab's {name}({shown}), called by your {caller.f_code.co_name}, stopped on "
                f"the values it was given: check each argument you pass it, in its order "
                f"({', '.join(params)})")
    return (f"the lab's {name}({shown}), called by your {caller.f_code.co_name}, stopped on the "
            f"value it was given: check the argument you pass it")


@functools.lru_cache(maxsize=64)
def _tree(filename: str):
    try:
        return ast.parse("".join(linecache.getlines(filename)))
    except (SyntaxError, ValueError):
        return None


def _node_at(code, lasti: int):
    """The expression of the solution's source whose instruction raised (Python 3.11+
    positions), or None."""
    try:
        pos = list(code.co_positions())[lasti // 2]
    except (AttributeError, IndexError):
        return None
    tree = _tree(code.co_filename)
    if tree is None or None in pos:
        return None
    for n in ast.walk(tree):
        if (getattr(n, "lineno", None), getattr(n, "end_lineno", None),
                getattr(n, "col_offset", None), getattr(n, "end_col_offset", None)) == pos:
            if isinstance(n, ast.expr) or isinstance(n, ast.AugAssign):
                return n
    return None


def _why(exc, node, frame, caller) -> str:
    """What the expression `node` was given, for the exception it raised."""
    if node is None:
        return ""
    text = _short_text(ast.unparse(node), 60)
    msg = str(exc)
    if isinstance(node, ast.Subscript):
        box = ast.unparse(node.value)
        if isinstance(exc, KeyError):
            held = frame.f_locals.get(box) if isinstance(node.value, ast.Name) else None
            keys = (f" (the keys it holds: {', '.join(map(repr, list(held)[:6]))})"
                    if isinstance(held, dict) and held else " (it holds no key)")
            return (f"`{box}` has no key {msg}{keys}: the key read here differs from every key "
                    f"stored -- never stored (a step that stores it missing?), or stored under "
                    f"another name instead of it")
        if isinstance(exc, IndexError):
            return f"`{text}` reads past the end of `{box}`: its index is out of range"
        if isinstance(exc, ValueError) and "slice step" in msg:
            return (f"the slice `{text}` has a step of 0, which Python refuses (a step of 1 keeps "
                    f"the order, -1 reverses it)")
    if isinstance(node, (ast.BinOp, ast.AugAssign)):
        op = _OPS.get(type(node.op), "the operator")
        if isinstance(exc, TypeError) and "unsupported operand" in msg:
            kinds = msg.split(":", 1)[-1].strip()
            seq = all(k.strip(" '") in _SEQUENCES for k in kinds.split(" and "))
            more = (" (lists and tuples are joined with + and repeated with *): an operator in "
                    "place of another?" if seq and op not in ("+", "*") else
                    ": an operand in the wrong place, or an operator in place of another?")
            return f"`{text}` applies {op} to {kinds}, for which it is not defined{more}"
        if isinstance(exc, ValueError) and "broadcast" in msg:
            shapes = msg.split("shapes", 1)[-1].strip()
            return (f"`{text}` combines arrays of shapes {shapes}: the two sides hold a different "
                    f"number of values, where they should hold one each per rep")
    if isinstance(node, ast.Call) and isinstance(exc, (TypeError, ValueError)):
        many = len(node.args) + len(node.keywords) >= 2
        return (f"`{text}` was given an argument it does not take"
                + (": check its arguments, their kinds and their order" if many else
                   ": check the argument you pass it"))
    if isinstance(node, ast.Attribute) and isinstance(exc, AttributeError):
        base = node.value
        kind = msg.split("'")[1] if msg.count("'") >= 2 else "value"
        if isinstance(base, ast.Name) and caller is not None and \
                base.id in frame.f_code.co_varnames[:frame.f_code.co_argcount]:
            return (f"`{base.id}`, the parameter of your {frame.f_code.co_name}(), holds a "
                    f"{kind}, which has no .{node.attr}: check the arguments your "
                    f"{caller.f_code.co_name} passes it, and their order")
        return (f"`{ast.unparse(base)}` is a {kind} here, which has no .{node.attr}: a step that "
                f"should have made it something else is missing, or a value went to the wrong "
                f"place")
    if isinstance(node, ast.Compare) and isinstance(exc, TypeError):
        return f"`{text}` compares values that cannot be compared: {msg}"
    return ""


_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//",
        ast.Mod: "%", ast.Pow: "**"}
