"""No import circle anywhere in lab/ or kernels/.

  import_graph   module -> the modules it imports, from the AST: EVERY import statement counts
                 (module level, inside functions, under TYPE_CHECKING), relative ones resolved
  lab_graph      import_graph of this checkout's lab/ and kernels/, built once per process
                 (tests/repo/test_floors.py checks the floors on it)
  cycles         the circles of that graph, each as a path that returns to its start

An import of a.b.c is an edge to a.b.c alone (its parent packages run first, but a package
whose __init__ imports its own submodules is no circle); `from pkg import name` is an edge to
pkg.name when that is a module, else to pkg (a submodule that takes a name from its package's
__init__, while that __init__ imports the submodule, is a circle).
"""
from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _modules(root: Path, packages) -> dict[str, Path]:
    """Dotted name -> file, for every module of `packages` under `root`."""
    out = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def import_graph(root: Path, packages=("lab", "kernels")) -> dict[str, set[str]]:
    mods = _modules(root, packages)
    graph = {}
    for name, path in mods.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    parts = alias.name.split(".")
                    known = [".".join(parts[:i]) for i in range(len(parts), 0, -1)
                             if ".".join(parts[:i]) in mods]
                    edges.update(known[:1])
            elif isinstance(node, ast.ImportFrom):
                base = here.split(".")[:len(here.split(".")) - node.level + 1] if node.level else []
                mod = ".".join(base + ([node.module] if node.module else []))
                for alias in node.names:
                    sub = f"{mod}.{alias.name}"
                    if sub in mods:
                        edges.add(sub)
                    elif mod in mods:
                        edges.add(mod)
        graph[name] = edges - {name}
    return graph


@functools.lru_cache(maxsize=1)
def lab_graph() -> dict[str, set[str]]:
    return import_graph(ROOT)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle through each strongly connected group of modules (Tarjan), as a path
    [a, b, ..., a]."""
    index, low, stack, on, groups = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_path_in(graph, g) for g in groups]


def _path_in(graph, group: set[str]) -> list[str]:
    """A circle inside `group`: from its first module, breadth first back to it."""
    start = min(group)
    prev, frontier = {}, [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & group):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(prev[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no circle in {sorted(group)}")


def test_no_import_circle_in_lab_or_kernels():
    found = cycles(lab_graph())
    assert not found, "import circles:\n" + "\n".join(" -> ".join(c) for c in found)


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_the_check_sees_every_form_of_import_and_passes_a_one_way_package(tmp_path):
    # a one-way package (its __init__ re-exports a submodule; device -> graph): no circle
    one_way = _tree(tmp_path / "ok", {
        "p/__init__.py": "from .device import Device\n",
        "p/device.py": "from .graph import Graph\nfrom . import memory\n",
        "p/graph.py": "import numpy\n",
        "p/memory.py": ""})
    assert cycles(import_graph(one_way, ["p"])) == []
    # the same circle hidden three ways: under TYPE_CHECKING, inside a function, `import a.b`
    hidden = {
        "type_checking": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                         "    from .device import Device\n",
        "deferred": "def f():\n    from ..p import device\n",
        "dotted": "import p.device\n"}
    for how, back in hidden.items():
        root = _tree(tmp_path / how, {"p/__init__.py": "", "p/device.py": "from .graph import G\n",
                                      "p/graph.py": back})
        assert cycles(import_graph(root, ["p"])) == [["p.device", "p.graph", "p.device"]], how
    # a submodule taking a name from its package's __init__, which imports the submodule
    reexport = _tree(tmp_path / "reexport", {
        "p/__init__.py": "from .device import Device\nVERSION = 1\n",
        "p/device.py": "from p import VERSION\n"})
    assert cycles(import_graph(reexport, ["p"])) == [["p", "p.device", "p"]]
