"""Mutation testing of the hands-on checkers: small wrong versions ("mutants") of each exercise's
reference solution, each of which its check must fail with a verdict that NAMES the mistake.

The references are source text (`Exercise.reference`), so a file-based tool does not reach them:
this module parses the text, finds each place an operator class applies, and edits the text at
that place only (the rest of the source, comments included, stays as written). A mutant is
(exercise, operator class, line:col, a short description, the mutated source).

The operator classes (`OPERATORS`), what each changes:

  comparison         a comparison's sense or boundary: < <-> <=, < -> >=, == <-> !=, in <-> not in
  boolean            a condition's logic: and <-> or, a `not` dropped
  constant           a number +1 / -1 (0 <-> 1), True <-> False, a name-like string replaced by
                     another string of the same source (never a message, a docstring, an f-string)
  off_by_one         a range bound +-1, a slice bound +-1, an array index +-1 (a constant index
                     anywhere; any index inside a kernel or its NumPy twin)
  removed_statement  a statement of a function removed (`pass` where it was the only one)
  swapped_args       two adjacent positional arguments of a call swapped
  arithmetic         + <-> -, * <-> /, // -> *, % -> //, ** -> * (and the same in `x += ...`)
  empty_kernel       a kernel's body (a function decorated by kernel(...) or cuda.jit) -> `pass`
  neutered_kernel    a kernel keeps only its thread guard, or loses every write to an array
  thread_guard       a kernel's guard on cuda.threadIdx / cuda.blockIdx / cuda.grid: `== 0` ->
                     `== 1` or `>= 0` (`!= 0` -> `!= 1` or `< 0`), one part of it dropped, or the
                     whole guard removed

Not mutated: imports, decorators (a kernel's signature and its reads/writes declaration: the
lab's kernel machinery holds those), annotations, docstrings, and the text of messages (the
arguments of print, raise, Fail and exception constructors; f-strings).

A mutant that does not parse, or is the reference's own text (less comments and whitespace), is
dropped; two mutants with the same text are one (the first in source order). The enumeration is deterministic: the
same source gives the same mutants in the same order, each with a signature that does not
depend on line numbers (`Mutant.signature`: class, enclosing function, the edit in its
statement), so the registry of equivalent mutants survives edits elsewhere in a reference.

OPERATOR_WORDS maps each class to the words a verdict that names its mistake contains; a mutant
is KILLED only when its check fails with one of them (`verdict`). EQUIVALENT lists, per
exercise, the mutants that no check can fail (the reference's behaviour unchanged), each with
its reason; they are re-run with FIXTURE_ENV=large (`lab.config.fixture_size()`), so a checker
that grows its random fixture there gets the chance to show one is not equivalent after all.
"""
from __future__ import annotations

import ast
import difflib
import functools
import hashlib
import random
import re
from dataclasses import dataclass

__all__ = ["OPERATORS", "OPERATOR_WORDS", "EXERCISE_WORDS", "EQUIVALENT", "FIXTURE_ENV",
           "Mutant", "mutants", "exercise_mutants", "sample", "words_for", "verdict",
           "is_equivalent", "KILLED", "UNNAMED", "SURVIVED"]

OPERATORS = ("comparison", "boolean", "constant", "off_by_one", "removed_statement",
             "swapped_args", "arithmetic", "empty_kernel", "neutered_kernel", "thread_guard")

FIXTURE_ENV = "DECODE_LAB_FIXTURE"      # lab.config.FIXTURE_ENV: "large", a larger fixture

KILLED, UNNAMED, SURVIVED = "killed", "failed-unnamed", "survived"

# ---- the words a verdict must contain -----------------------------------------------------------
# A kill must NAME the mistake: a verdict of numbers alone ("worth 1.2, the runs give 1.3"), or an
# exception's text the solution happened to raise, does not. Each class lists the words (lower
# case; a word matches inside the verdict, so "interleav" meets "interleave" and "interleaved")
# with which a verdict says what kind of mistake it saw. They are grouped by the mistake they
# name; a class takes the groups whose mistake its mutants make:
_DECISION = ("you said", "says pass", "says fail", "the gate says", "the audit says", "verdict",
             "decision", "decide", "judge", "false alarm", "passes ", "misses", "accepts ",
             "rejects ")
#   a wrong yes/no (a gate, a verdict, an audit's class, a test that passes a bug): the verdict
#   contrasts the answer with the right one in words
_BOUNDARY = ("boundary", "the limit", "threshold", "off by one", "one too many", "one too few",
             "one too far", "out of bounds", "out of range", "past the end", "beyond")
#   an edge moved by one: which edge (the limit, the plan boundary, the end of an array). Not a
#   bare "limit": a case's parameters print as "limit=13"
_ORDER = ("order", "interleav", "back to back", "reversed", "swapped", "sign", "argument",
          "in place of", "instead of")
#   two things in each other's place: the order, the sign of a difference, an argument's place
_MISSING = ("missing", "never ran", "never runs", "did not run", "not run", "skipped", "left out",
            "left open", "nothing ", "no fallback", "no replay", "no step", "no rep", "no arm",
            "no untimed", "no '", "kept", "not pre-warmed", "restore", "did not move",
            "is not defined", "not associated with a value", "returned none", "forgot",
            "without", "endless loop")
#   a step of the solution not done: what was not done (a write, a reset, a restore, a rep); a
#   name left undefined (Python's own words), a loop that never advances
_WRITES = ("writes nothing", "wrote nothing", "never writes", "never written", "not written",
           "unwritten", "sentinel", "no write", "does not write", "nothing advances",
           "written by no thread", "did not move")
#   a kernel that runs and leaves its output as it was: the output not written
_THREAD = ("thread", "blockidx", "block ", "blocks", "guard", "writer", "written twice",
           "write count", "race")
#   a kernel whose wrong threads (or none) write: which thread, which block, how many writers
_VALUE = ("moved by", "did not move", "too many", "too few", "one more", "one fewer", "twice",
          "flipped", "ddof", "population", "sample sd", "sided", "1 ms is 1000 us", "per launch",
          "other tokens", "differ", "count ", "how many", "unit", "endless loop")
#   a quantity computed wrong, said in words: how it is wrong (moved by 2, one more, flipped,
#   ddof, the unit), or what it breaks downstream (other tokens, replays differ)

# The expression-level classes change a value somewhere, and what a check sees is its effect: a
# wrong decision, an edge crossed, an order, a quantity, an output left unwritten. Any of those
# effects, named, names the mistake. The classes that change a kernel's shape are held to the
# words of THEIR effect alone: an emptied or neutered kernel to "not written", a wrong guard to
# the thread or block that wrote (or that none did).
_EFFECT = _DECISION + _BOUNDARY + _ORDER + _VALUE + _WRITES
OPERATOR_WORDS: dict[str, tuple[str, ...]] = {
    "comparison": _EFFECT,
    "boolean": _EFFECT + _MISSING,
    "constant": _EFFECT,
    "off_by_one": _EFFECT,
    "removed_statement": _MISSING + _WRITES + _DECISION + _BOUNDARY,
    "swapped_args": _EFFECT,
    "arithmetic": _EFFECT,
    "empty_kernel": _WRITES,
    "neutered_kernel": _WRITES,
    "thread_guard": _THREAD + _WRITES,
}

# per exercise, extra words for a class where that exercise's mistake has a name of its own
# ((exercise, class) -> words). Empty today: the groups above name every class's mistakes.
EXERCISE_WORDS: dict[tuple[str, str], tuple[str, ...]] = {}


def words_for(exercise: str, op: str) -> tuple[str, ...]:
    """The words a verdict on an `op` mutant of `exercise` must contain (one of them)."""
    return OPERATOR_WORDS[op] + EXERCISE_WORDS.get((exercise, op), ())


# "X (its case) raised KeyError: 'A'", "the check stopped: TypeError: ...": an exception the
# solution (or the check) raised. Only the exception's own text can name the mistake there (a
# NameError's "is not defined" does); the case's label before it does not.
_RAISED = re.compile(r"(?:raised|stopped:) [A-Za-z_.]*(?:Error|Exception|Fault|Interrupt)\b:?")


def verdict(exercise: str, op: str, passed: bool, message: str) -> str:
    """KILLED (failed, naming the mistake), UNNAMED (failed without the words), SURVIVED."""
    if passed:
        return SURVIVED
    raised = _RAISED.search(message)
    text = " ".join((message[raised.end():] if raised else message).lower().split())
    return KILLED if any(w in text for w in words_for(exercise, op)) else UNNAMED


# ---- equivalent mutants -------------------------------------------------------------------------
# exercise -> {Mutant.signature: why no check can fail it}. At most 10% of an exercise's mutants;
# each is re-run with DECODE_LAB_FIXTURE=large by scripts/mutation_score.py.
_ALTERNATION = ("the reps alternate starting with the other order; any alternation start is "
                "valid, and the check must accept it")
_ONE_THREAD = ("the reference launches one thread (grid (1,) x block (1,)): thread 0 of block 0 "
               "is the launch's only thread, so a guard that turns away other threads, or none, "
               "leaves the same one thread doing the work (a wider launch with a missing or "
               "partial guard fails: the known wrong solutions 'every thread' and 'two blocks')")
EQUIVALENT: dict[str, dict[str, str]] = {
    "aa_gate": {
        'comparison aa_gate: `==` -> `!=` in `for name in (("A", "A\'") if rep % 2 == 0 else '
        '("A\'", "A")):`': _ALTERNATION,
        'constant aa_gate: `0` -> `1` in `for name in (("A", "A\'") if rep % 2 == 0 else '
        '("A\'", "A")):`': _ALTERNATION,
        'swapped_args aa_gate: args 1,2 of zip() swapped in `for (ta, la), (tb, lb) in '
        'zip(out["A"], out["A\'"]):`':
            "the pairs are the same reps with A' first: each pair's bytes are compared with ==, "
            "which is symmetric, so no pair's verdict (and not the gate's) changes",
    },
    "variance": {
        "comparison measure: `==` -> `!=` in `for name in (names if rep % 2 == 0 else "
        "names[::-1]):`": _ALTERNATION,
        "constant measure: `0` -> `1` in `for name in (names if rep % 2 == 0 else "
        "names[::-1]):`": _ALTERNATION,
    },
    "loo": {
        "comparison leave_one_out: `==` -> `!=` in `for off in (arms if rep % 2 == 0 else "
        "arms[::-1]):`": _ALTERNATION,
        "constant leave_one_out: `0` -> `1` in `for off in (arms if rep % 2 == 0 else "
        "arms[::-1]):`": _ALTERNATION,
    },
    "replay_test": {
        "off_by_one run: range bound `8` -> `9` in `for _ in range(8): # replays of one graph, "
        "and a plan change`":
            "9 decode steps in each arm instead of 8: the statement asks for three or more "
            "replays of one graph (any n of them is right), and 9 catches every replay bug that 8 does "
            "(each fixture's bug shows by the third launch of a graph)",
        "off_by_one run: range bound `8` -> `7` in `for _ in range(8): # replays of one graph, "
        "and a plan change`":
            "7 decode steps in each arm instead of 8: still three or more replays of one graph "
            "after the prompt and after the boundary prompt's plan change (the statement leaves "
            "n to the student), so every fixture's bug shows before the last step",
    },
    "accept": {
        "swapped_args accept_twin: args 1,2 of max() swapped in `g = q - max(p + 1, n_p) + 1`":
            "max is symmetric: max(n_p, p + 1) is max(p + 1, n_p)",
        "swapped_args accept_kernel: args 1,2 of max() swapped in "
        "`g = q - max(p + 1, n_p) + 1`":
            "max is symmetric: max(n_p, p + 1) is max(p + 1, n_p)",
        "removed_statement accept_kernel: removed `if cuda.threadIdx.x != 0 or"
        " cuda.blockIdx.x != …` in `if cuda.threadIdx.x != 0 or cuda.blockIdx.x != 0: # one"
        " thread does the work`":
            _ONE_THREAD,
        "removed_statement accept_kernel: removed `return` in `return`": _ONE_THREAD,
        "thread_guard accept_kernel: guard removed in `if cuda.threadIdx.x != 0 or"
        " cuda.blockIdx.x != 0: # one thread does the work`":
            _ONE_THREAD,
        "thread_guard accept_kernel: `cuda.threadIdx.x != 0` dropped from the guard in `if"
        " cuda.threadIdx.x != 0 or cuda.blockIdx.x != 0: # one thread does the work`":
            _ONE_THREAD,
        "thread_guard accept_kernel: `cuda.blockIdx.x != 0` dropped from the guard in `if"
        " cuda.threadIdx.x != 0 or cuda.blockIdx.x != 0: # one thread does the work`":
            _ONE_THREAD,
        "thread_guard accept_kernel: `cuda.threadIdx.x != 0` -> `< 0` in `if cuda.threadIdx.x"
        " != 0 or cuda.blockIdx.x != 0: # one thread does the work`":
            _ONE_THREAD,
        "thread_guard accept_kernel: `cuda.blockIdx.x != 0` -> `< 0` in `if cuda.threadIdx.x"
        " != 0 or cuda.blockIdx.x != 0: # one thread does the work`":
            _ONE_THREAD,
        "constant AcceptStep.accept: `1` -> `2` in `return launch(accept_kernel, ((1,),"
        " (1,)), (s.cols, s.pred, b.pos, b.n_prompt, b.limit, b.tokens, s.stats))`":
            "a grid of 2 blocks: the kernel's guard keeps thread 0 of block 0 the one writer "
            "however wide the launch",
        "constant AcceptStep.accept: `1` -> `2` in `return launch(accept_kernel, ((1,),"
        " (1,)), (s.cols, s.pred, b.pos, b.n_prompt, b.limit, b.tokens, s.stats))` #1":
            "a block of 2 threads: the kernel's guard keeps thread 0 of block 0 the one writer "
            "however wide the launch",
    },
    "advance": {
        "constant AdvanceStep.advance: `1` -> `2` in `return [launch(advance_kernel, ((1,), "
        "(1,)), (self.dev.buf.pos,))]`":
            "a grid of 2 blocks: the kernel's guard keeps one writer however wide the launch "
            "(the check runs every kernel on 2 blocks of 32 threads as well)",
        "constant AdvanceStep.advance: `1` -> `2` in `return [launch(advance_kernel, ((1,), "
        "(1,)), (self.dev.buf.pos,))]` #1":
            "a block of 2 threads: the kernel's guard keeps one writer however wide the launch "
            "(the check runs every kernel on 2 blocks of 32 threads as well)",
    },
}


def is_equivalent(m: "Mutant") -> str | None:
    """The reason `m` is listed as equivalent, or None."""
    return EQUIVALENT.get(m.exercise, {}).get(m.signature)


# ---- the mutant ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Mutant:
    exercise: str
    op: str                # an operator class of OPERATORS
    line: int              # where, in the reference (1-based line, 0-based column)
    col: int
    desc: str              # the edit, in its statement: "`>=` -> `>` in `if p >= lim:`"
    scope: str             # the enclosing function or class ("accept_kernel", "<module>")
    signature: str         # op, scope and desc (+ "#k" for the k-th identical one): stable
    source: str            # the mutated source
    original: str = ""     # the reference it came from

    @property
    def id(self) -> str:
        """A short stable name: the exercise and 8 hex digits of the signature's hash."""
        h = hashlib.sha1(f"{self.exercise}\0{self.signature}".encode()).hexdigest()[:8]
        return f"{self.exercise}:{h}"

    @property
    def where(self) -> str:
        return f"{self.line}:{self.col}"

    def diff(self) -> str:
        """The unified diff of the mutant against the reference."""
        return "".join(difflib.unified_diff(
            self.original.splitlines(True), self.source.splitlines(True),
            f"{self.exercise} reference", f"{self.exercise} mutant {self.id}", n=1))

    def __str__(self) -> str:
        return f"{self.id} {self.op} at {self.where} ({self.scope}): {self.desc}"


# ---- the text, edited at byte offsets (ast columns count UTF-8 bytes) ----------------------------
class _Text:
    def __init__(self, source: str):
        self.src = source.encode()
        self.starts = [0]
        for i, b in enumerate(self.src):
            if b == 0x0A:
                self.starts.append(i + 1)

    def off(self, line: int, col: int) -> int:
        return self.starts[line - 1] + col

    def span(self, node) -> tuple[int, int]:
        return (self.off(node.lineno, node.col_offset),
                self.off(node.end_lineno, node.end_col_offset))

    def seg(self, a: int, b: int) -> str:
        return self.src[a:b].decode()

    def text(self, node) -> str:
        return self.seg(*self.span(node))

    def line_start(self, off: int) -> int:
        return self.src.rfind(b"\n", 0, off) + 1

    def line_end(self, off: int) -> int:        # just past the newline
        i = self.src.find(b"\n", off)
        return len(self.src) if i < 0 else i + 1

    def apply(self, edits) -> str:
        out, last = [], 0
        for a, b, new in sorted(edits, key=lambda e: e[0]):
            if a < last:
                raise ValueError("overlapping edits")
            out += [self.src[last:a], new.encode()]
            last = b
        out.append(self.src[last:])
        return b"".join(out).decode()


def _gap_token(t: _Text, a: int, b: int) -> tuple[int, int]:
    """The span of the operator between two operands (offsets a..b): the text there, less
    parentheses, whitespace, line continuations and comments."""
    gap = t.seg(a, b)
    keep = []
    i = 0
    for ln in gap.split("\n"):
        code = ln.split("#", 1)[0]
        for j, ch in enumerate(code):
            if ch not in "()\\ \t\r":
                keep.append(i + j)
        i += len(ln) + 1
    if not keep:
        raise ValueError("no operator in the gap")
    lo, hi = keep[0], keep[-1] + 1
    # offsets are in characters of `gap`; convert to bytes
    return a + len(gap[:lo].encode()), a + len(gap[:hi].encode())


_CMP_SYM = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=",
            ast.Is: "is", ast.IsNot: "is not", ast.In: "in", ast.NotIn: "not in"}
_CMP_ALT = {ast.Lt: (ast.LtE, ast.GtE), ast.LtE: (ast.Lt, ast.Gt), ast.Gt: (ast.GtE, ast.LtE),
            ast.GtE: (ast.Gt, ast.Lt), ast.Eq: (ast.NotEq,), ast.NotEq: (ast.Eq,),
            ast.Is: (ast.IsNot,), ast.IsNot: (ast.Is,), ast.In: (ast.NotIn,),
            ast.NotIn: (ast.In,)}
_BIN_SYM = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//",
            ast.Mod: "%", ast.Pow: "**"}
_BIN_ALT = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult,
            ast.FloorDiv: ast.Mult, ast.Mod: ast.FloorDiv, ast.Pow: ast.Mult}
_MESSAGE_CALLS = {"print", "Fail", "warn", "LabError", "format"}
_GUARD_NAMES = ("threadIdx", "blockIdx", "grid", "blockDim", "gridDim")


def _call_name(node) -> str:
    f = node.func if isinstance(node, ast.Call) else node
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


def _is_kernel(fn) -> bool:
    for d in fn.decorator_list:
        name = _call_name(d.func if isinstance(d, ast.Call) else d)
        base = d.func if isinstance(d, ast.Call) else d
        if name == "kernel" or (name == "jit" and isinstance(base, ast.Attribute)
                                and isinstance(base.value, ast.Name) and base.value.id == "cuda"):
            return True
    return False


def _twins(tree) -> set[str]:
    """Names passed as twin= to a kernel decorator: the NumPy twins."""
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for d in n.decorator_list:
                if isinstance(d, ast.Call):
                    out |= {k.value.id for k in d.keywords
                            if k.arg == "twin" and isinstance(k.value, ast.Name)}
    return out


def _mentions_guard(node) -> bool:
    for n in ast.walk(node):
        if isinstance(n, ast.Attribute) and n.attr in _GUARD_NAMES:
            return True
        if isinstance(n, ast.Name) and n.id in _GUARD_NAMES:
            return True
    return False


def _is_docstring(stmt, body) -> bool:
    return (body and stmt is body[0] and isinstance(stmt, ast.Expr)
            and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str))


def _short(text: str, n: int = 72) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[:n - 1] + "…"


class _Walker:
    """One pass over the tree: each node with its statement, its scope, and whether it lies in a
    part that is not mutated (a message, a docstring, a decorator, an annotation, an import)."""

    def __init__(self, tree):
        self.info = {}          # id(node) -> (stmt, scope, skipped, kernel fn or None, in_twin)
        self.twins = _twins(tree)
        self.stmts = []         # (stmt, its block (list), scope, kernel fn or None, in function)
        self._visit_block(tree.body, "<module>", None, False, False)

    def _visit_block(self, body, scope, kern, in_twin, in_fn):
        for s in body:
            self.stmts.append((s, body, scope, kern, in_fn))
            self._visit_stmt(s, scope, kern, in_twin, in_fn)

    def _visit_stmt(self, s, scope, kern, in_twin, in_fn):
        if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)):
            inner = s.name if scope == "<module>" else f"{scope}.{s.name}"
            k = s if _is_kernel(s) else kern
            twin = in_twin or s.name in self.twins
            self._mark(s.args, s, inner, True, k, twin)
            for d in s.decorator_list:
                self._mark(d, s, inner, True, k, twin)
            if s.returns:
                self._mark(s.returns, s, inner, True, k, twin)
            self._visit_block(s.body, inner, k, twin, True)
            return
        if isinstance(s, ast.ClassDef):
            inner = s.name if scope == "<module>" else f"{scope}.{s.name}"
            for d in (*s.decorator_list, *s.bases, *s.keywords):
                self._mark(d, s, inner, True, kern, in_twin)
            self._visit_block(s.body, inner, kern, in_twin, in_fn)
            return
        skip_all = isinstance(s, (ast.Import, ast.ImportFrom, ast.Global, ast.Nonlocal))
        for field, value in ast.iter_fields(s):
            items = value if isinstance(value, list) else [value]
            for v in items:
                if isinstance(v, ast.stmt):
                    continue
                if isinstance(v, ast.AST):
                    skip = (skip_all or field in ("annotation", "type_comment")
                            or (isinstance(s, ast.Raise))
                            or (isinstance(s, ast.Assert) and field == "msg"))
                    self._mark(v, s, scope, skip, kern, in_twin)
                elif isinstance(v, list):
                    pass
        for field in ("body", "orelse", "finalbody"):
            block = getattr(s, field, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                self._visit_block(block, scope, kern, in_twin, in_fn)
        for h in getattr(s, "handlers", []) or []:
            if h.type:
                self._mark(h.type, s, scope, True, kern, in_twin)
            self._visit_block(h.body, scope, kern, in_twin, in_fn)
        if isinstance(s, ast.Match):
            for c in s.cases:
                self._visit_block(c.body, scope, kern, in_twin, in_fn)
        if isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant):
            self._mark(s.value, s, scope, True, kern, in_twin)       # a docstring / bare string

    def _mark(self, node, stmt, scope, skip, kern, in_twin):
        stack = [(node, skip)]
        while stack:
            n, sk = stack.pop()
            if isinstance(n, ast.JoinedStr):
                sk = True
            if isinstance(n, ast.Call) and _call_name(n) in _MESSAGE_CALLS:
                self.info[id(n)] = (stmt, scope, sk, kern, in_twin)
                self.info[id(n.func)] = (stmt, scope, sk, kern, in_twin)
                for a in (*n.args, *[k.value for k in n.keywords]):
                    stack.append((a, True))
                continue
            if isinstance(n, ast.Call) and (_call_name(n).endswith("Error")
                                            or _call_name(n).endswith("Exception")):
                sk = True
            self.info[id(n)] = (stmt, scope, sk, kern, in_twin)
            for c in ast.iter_child_nodes(n):
                stack.append((c, sk))


def _header(t: _Text, stmt) -> str:
    """A statement's text for a description: a simple statement whole, a compound one's first
    line (its header)."""
    if isinstance(stmt, (ast.If, ast.For, ast.While, ast.With, ast.Try, ast.FunctionDef,
                         ast.ClassDef, ast.AsyncFor, ast.AsyncWith)):
        a = t.off(stmt.lineno, stmt.col_offset)
        return t.seg(a, t.line_end(a)).strip()
    return t.text(stmt)


def _indent_of(t: _Text, stmt) -> str:
    a = t.off(stmt.lineno, stmt.col_offset)
    return t.seg(t.line_start(a), a)


def _remove_stmt_edit(t: _Text, stmt, alone: bool):
    """The edit that removes `stmt` (its whole lines when it has them to itself), or replaces
    it with `pass` when it is the only statement of its block."""
    a, b = t.span(stmt)
    if alone:
        return (a, b, "pass")
    ls, le = t.line_start(a), t.line_end(b)
    before = t.seg(ls, a)
    after = t.seg(b, le).split("#", 1)[0]
    if not before.strip() and not after.strip():
        return (ls, le, "")
    return (a, b, "pass")


def _block_replace_edit(t: _Text, stmts, text: str):
    """Replace the statements `stmts` (consecutive, of one block) by one line `text`."""
    first, last = stmts[0], stmts[-1]
    a = t.off(first.lineno, first.col_offset)
    b = t.off(last.end_lineno, last.end_col_offset)
    return (a, b, text)


def _canonical(source: str) -> str:
    """The source less its comments and whitespace: two mutants the same here are one."""
    return re.sub(r"#[^\n]*|\s+", "", source)


def mutants(source: str, exercise: str = "?") -> list[Mutant]:
    """Every mutant of `source`, in source order (deterministic)."""
    tree = ast.parse(source)
    base = _canonical(source)
    t = _Text(source)
    w = _Walker(tree)
    found = []          # (line, col, op, desc, scope, stmt_context, edits)

    def ok(node):
        inf = w.info.get(id(node))
        return inf is not None and not inf[2]

    def ctx(node):
        stmt, scope = w.info[id(node)][:2]
        return scope, _header(t, stmt)

    def add(node, op, what, edits, scope=None, context=None):
        sc, cx = ctx(node) if scope is None else (scope, context)
        found.append((node.lineno, node.col_offset, OPERATORS.index(op), op, what, sc, cx,
                      edits))

    nodes = [n for n in ast.walk(tree) if id(n) in w.info]
    nodes.sort(key=lambda n: (getattr(n, "lineno", 0), getattr(n, "col_offset", 0)))
    kern_of = {id(n): w.info[id(n)][3] for n in nodes}
    twin_of = {id(n): w.info[id(n)][4] for n in nodes}

    # index / range / slice positions: off_by_one's, not constant's
    index_like, range_args, slice_bounds = set(), set(), set()
    for n in nodes:
        if isinstance(n, ast.Call) and _call_name(n) == "range" and isinstance(n.func, ast.Name):
            range_args |= {id(a) for a in n.args[:2]}
            index_like |= {id(a) for a in n.args[:2]}
        elif isinstance(n, ast.Slice):
            slice_bounds |= {id(x) for x in (n.lower, n.upper) if x is not None}
            index_like |= {id(x) for x in (n.lower, n.upper) if x is not None}
        elif isinstance(n, ast.Subscript) and not isinstance(n.slice, (ast.Slice, ast.Tuple)):
            index_like.add(id(n.slice))
    strings = sorted({n.value for n in nodes if ok(n) and isinstance(n, ast.Constant)
                      and isinstance(n.value, str) and n.value})

    def guard_compare(n) -> bool:
        return kern_of[id(n)] is not None and _mentions_guard(n)

    in_guard = {id(c) for n in nodes if isinstance(n, ast.Compare) and guard_compare(n)
                for c in ast.walk(n)}           # thread_guard's, not constant's

    for n in nodes:
        if not ok(n):
            continue
        # ---- comparison
        if isinstance(n, ast.Compare) and not guard_compare(n):
            for j, op in enumerate(n.ops):
                left = n.left if j == 0 else n.comparators[j - 1]
                a, b = _gap_token(t, t.span(left)[1], t.span(n.comparators[j])[0])
                for alt in _CMP_ALT[type(op)]:
                    add(n, "comparison", f"`{_CMP_SYM[type(op)]}` -> `{_CMP_SYM[alt]}`",
                        [(a, b, _CMP_SYM[alt])])
        # ---- boolean
        if isinstance(n, ast.BoolOp) and not guard_compare(n):
            new = "or" if isinstance(n.op, ast.And) else "and"
            edits = [(*_gap_token(t, t.span(x)[1], t.span(y)[0]), new)
                     for x, y in zip(n.values, n.values[1:])]
            add(n, "boolean", f"`{'and' if new == 'or' else 'or'}` -> `{new}`", edits)
        if (isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.Not)
                and not guard_compare(n)):
            a = t.span(n)[0]
            b = t.span(n.operand)[0]
            keep = "(" * t.seg(a, b).count("(")
            add(n, "boolean", "`not` dropped", [(a, b, keep)])
        # ---- constant
        if isinstance(n, ast.Constant) and id(n) not in index_like and id(n) not in in_guard:
            v = n.value
            a, b = t.span(n)
            if isinstance(v, bool):
                add(n, "constant", f"`{v}` -> `{not v}`", [(a, b, str(not v))])
            elif isinstance(v, (int, float)) and not isinstance(v, complex):
                for nv in (v + 1, v - 1):
                    if nv < 0 and v >= 0 and t.seg(a - 1, a) == "-":
                        continue
                    add(n, "constant", f"`{v!r}` -> `{nv!r}`", [(a, b, repr(nv))])
            elif isinstance(v, str) and v:
                others = [s for s in strings if s != v]
                nv = (others[[s > v for s in others].index(True)]
                      if any(s > v for s in others) else others[0]) if others else ""
                add(n, "constant", f"`{v!r}` -> `{nv!r}`", [(a, b, repr(nv))])
        # ---- off_by_one
        if id(n) in index_like:
            parent_index = id(n) not in slice_bounds
            is_int = isinstance(n, ast.Constant) and type(n.value) is int
            is_arr = kern_of[id(n)] is not None or twin_of[id(n)]
            is_range = id(n) in range_args
            if isinstance(n, ast.Constant) and isinstance(n.value, str):
                pass
            elif is_int or is_arr or is_range or not parent_index:
                a, b = t.span(n)
                txt = t.seg(a, b)
                kind = ("range bound" if is_range else "slice bound" if not parent_index
                        else "index")
                for d in (1, -1):
                    if is_int:
                        nv = n.value + d
                        if nv < 0 and n.value >= 0 and kind != "range bound":
                            continue        # index 0 - 1 is the last element, not one before
                        new = repr(nv)
                    else:
                        paren = isinstance(n, (ast.BoolOp, ast.Compare, ast.IfExp, ast.Lambda))
                        new = f"({txt}) {'+' if d > 0 else '-'} 1" if paren else \
                            f"{txt} {'+' if d > 0 else '-'} 1"
                    add(n, "off_by_one", f"{kind} `{_short(txt, 30)}` -> `{_short(new, 30)}`",
                        [(a, b, new)])
        # ---- swapped_args
        if isinstance(n, ast.Call) and _call_name(n) not in _MESSAGE_CALLS:
            for i in range(len(n.args) - 1):
                x, y = n.args[i], n.args[i + 1]
                if isinstance(x, ast.Starred) or isinstance(y, ast.Starred):
                    continue
                if ast.dump(x) == ast.dump(y):
                    continue
                (xa, xb), (ya, yb) = t.span(x), t.span(y)
                add(n, "swapped_args", f"args {i + 1},{i + 2} of {_call_name(n) or 'a call'}() "
                    f"swapped", [(xa, yb, t.seg(ya, yb) + t.seg(xb, ya) + t.seg(xa, xb))])
        # ---- arithmetic
        if isinstance(n, ast.BinOp) and type(n.op) in _BIN_ALT:
            strs = [s for s in (n.left, n.right) if isinstance(s, ast.JoinedStr) or (
                isinstance(s, ast.Constant) and isinstance(s.value, str))]
            if not strs:
                alt = _BIN_ALT[type(n.op)]
                a, b = _gap_token(t, t.span(n.left)[1], t.span(n.right)[0])
                add(n, "arithmetic", f"`{_BIN_SYM[type(n.op)]}` -> `{_BIN_SYM[alt]}`",
                    [(a, b, _BIN_SYM[alt])])
    # statements: augmented assignment, removal, the kernel operators
    bodies: dict[int, list] = {}
    for s, block, scope, kern, in_fn in w.stmts:
        ctx_text = _header(t, s)
        if isinstance(s, ast.AugAssign) and type(s.op) in _BIN_ALT:
            alt = _BIN_ALT[type(s.op)]
            a, b = _gap_token(t, t.span(s.target)[1], t.span(s.value)[0])
            add(s, "arithmetic", f"`{_BIN_SYM[type(s.op)]}=` -> `{_BIN_SYM[alt]}=`",
                [(a, b, _BIN_SYM[alt] + "=")], scope, ctx_text)
        if id(block) not in bodies:
            bodies[id(block)] = [x for x in block if not _is_docstring(x, block)]
        body = bodies[id(block)]
        if (in_fn or scope != "<module>") and not isinstance(
                s, (ast.Pass, ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef,
                    ast.ClassDef, ast.Global, ast.Nonlocal)) and not _is_docstring(s, block):
            add(s, "removed_statement", f"removed `{_short(ctx_text, 48)}`",
                [_remove_stmt_edit(t, s, len(body) == 1)], scope, ctx_text)
        if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)) and _is_kernel(s):
            inner = s.name if scope == "<module>" else f"{scope}.{s.name}"
            _kernel_mutants(t, s, inner, add)
    out, seen = [], {base}
    counts: dict[str, int] = {}
    for line, col, _, op, what, scope, cx, edits in sorted(found, key=lambda f: f[:3]):
        try:
            src = t.apply(edits)
            ast.parse(src)
        except (SyntaxError, ValueError):
            continue
        dump = _canonical(src)
        if dump in seen:
            continue
        seen.add(dump)
        desc = what if op == "removed_statement" else f"{what} in `{_short(cx)}`"
        sig = f"{op} {scope}: {what} in `{' '.join(cx.split())}`"
        k = counts.get(sig, 0)
        counts[sig] = k + 1
        out.append(Mutant(exercise, op, line, col, desc, scope, sig + (f" #{k}" if k else ""),
                          src, source))
    return out


def _kernel_mutants(t: _Text, fn, scope: str, add) -> None:
    body = [s for s in fn.body if not _is_docstring(s, fn.body)]
    if not body:
        return
    ind = _indent_of(t, body[0])
    ctx = _header(t, fn)
    # emptied: the body -> pass
    add(fn, "empty_kernel", "body emptied (`pass`)", [_block_replace_edit(t, body, "pass")],
        scope, ctx)
    # neutered (a): only the guard kept
    first = body[0]
    if isinstance(first, ast.If) and _mentions_guard(first.test):
        if len(body) == 1 and not first.orelse:        # if guard: <work>
            add(fn, "neutered_kernel", "only its guard kept (the guarded work removed)",
                [_block_replace_edit(t, first.body, "pass")], scope, ctx)
        elif len(body) > 1 and all(isinstance(x, ast.Return) for x in first.body):
            add(fn, "neutered_kernel", "only its guard kept (the work after it removed)",
                [_block_replace_edit(t, body[1:], "")], scope, ctx)
    # neutered (b): every write to an array removed
    writes = []

    def is_write(s) -> bool:
        if isinstance(s, ast.Assign):
            return any(isinstance(x, ast.Subscript) for x in s.targets)
        if isinstance(s, ast.AugAssign):
            return isinstance(s.target, ast.Subscript)
        if isinstance(s, ast.Expr) and isinstance(s.value, ast.Call):
            f = s.value.func
            return (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Attribute)
                    and f.value.attr == "atomic")
        return False

    def visit(block):
        for s in block:
            if is_write(s):
                writes.append((s, block))
            for field in ("body", "orelse", "finalbody"):
                sub = getattr(s, field, None)
                if isinstance(sub, list) and sub and isinstance(sub[0], ast.stmt):
                    visit(sub)
    visit(fn.body)
    if writes:
        edits = []
        for s, block in writes:
            others = [x for x in block if not any(x is y for y, _ in writes)]
            if not others and s is block[0]:
                edits.append(_block_replace_edit(t, [s], "pass"))
            else:
                edits.append(_remove_stmt_edit(t, s, False))
        add(fn, "neutered_kernel", f"every array write removed ({len(writes)})", edits,
            scope, ctx)
    # wrong thread guard
    for node in ast.walk(fn):
        if isinstance(node, ast.If) and _mentions_guard(node.test):
            test = node.test
            returns = all(isinstance(x, ast.Return) for x in node.body)
            a, b = t.span(test)
            add(test, "thread_guard", "guard removed",
                [(a, b, "False" if returns else "True")], scope, _header(t, node))
            if isinstance(test, ast.BoolOp):
                for i, v in enumerate(test.values):
                    if not _mentions_guard(v):
                        continue
                    rest = [t.text(x) for j, x in enumerate(test.values) if j != i]
                    join = " and " if isinstance(test.op, ast.And) else " or "
                    add(test, "thread_guard", f"`{_short(t.text(v), 30)}` dropped from the guard",
                        [(a, b, join.join(rest))], scope, _header(t, node))
            for c in ast.walk(test):
                if not (isinstance(c, ast.Compare) and len(c.ops) == 1 and _mentions_guard(c)):
                    continue
                op, rhs = c.ops[0], c.comparators[0]
                if _mentions_guard(rhs) or not isinstance(rhs, ast.Constant):
                    continue
                ra, rb = t.span(rhs)
                oa, ob = _gap_token(t, t.span(c.left)[1], ra)
                lhs = _short(t.text(c.left), 30)
                if isinstance(op, (ast.Eq, ast.NotEq)):
                    sym = _CMP_SYM[type(op)]
                    add(c, "thread_guard", f"`{lhs} {sym} {rhs.value}` -> `{sym} {rhs.value + 1}`",
                        [(ra, rb, repr(rhs.value + 1))], scope, _header(t, node))
                    loose = ">=" if isinstance(op, ast.Eq) else "<"
                    add(c, "thread_guard", f"`{lhs} {sym} {rhs.value}` -> `{loose} {rhs.value}`",
                        [(oa, ob, loose)], scope, _header(t, node))


# ---- per exercise, and the seeded sample --------------------------------------------------------
def exercise_mutants(name: str) -> list[Mutant]:
    """Every mutant of exercise `name`'s reference."""
    from lab.teach.handson import exercise
    return list(_cached(exercise(name).reference, name))


@functools.lru_cache(maxsize=32)
def _cached(source: str, name: str) -> tuple[Mutant, ...]:
    return tuple(mutants(source, name))


def sample(pool: list[Mutant], k: int, seed: int) -> list[Mutant]:
    """`k` mutants of `pool` drawn with `seed` (the same seed, the same draw)."""
    rng = random.Random(seed)
    return rng.sample(pool, min(k, len(pool)))
