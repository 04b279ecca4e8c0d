"""The house's floors (lab/__init__.py): the ground floor's modules sit in lab/, every floor
above it is a folder (backend/, engine/, measure/, teach/), and each module imports only from its
own floor or the floors below, so a reader can take the lab apart from the ground up. Read from the
source's import statements (top level and inside functions alike)."""
import ast
from pathlib import Path

LAB = Path(__file__).resolve().parents[1] / "lab"
FLOORS = {
    0: {"errors", "config", "bugspec", "files", "model", "reference", "plan", "pdl_check",
        "ledger"},
    1: {"backend"},
    2: {"engine"},
    3: {"measure"},
    4: {"teach"},
    5: {"__main__"},
}
FLOOR_OF = {name: floor for floor, names in FLOORS.items() for name in names}


def _room(path: Path) -> str:
    """The top-level name under lab/ that `path` belongs to (a module, or a package folder)."""
    return path.relative_to(LAB).parts[0].removesuffix(".py")


def _imported_rooms(path: Path) -> set[str]:
    return _rooms_in(path.read_text(), path.relative_to(LAB).parent.parts)


def _rooms_in(source: str, pkg: tuple) -> set[str]:
    """The lab rooms `source` imports, for a module in package folder `pkg` under lab/ (()
    for lab/x.py, ("backend",) for lab/backend/x.py)."""
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            if node.level == 0:
                parts = (node.module or "").split(".")
                if parts[0] == "lab" and len(parts) > 1:
                    out.add(parts[1])
                elif parts[0] == "lab":
                    out |= {a.name for a in node.names}
                continue
            base = pkg[:len(pkg) - (node.level - 1)] if node.level > 1 else pkg
            parts = [*base, *((node.module or "").split(".") if node.module else [])]
            out |= {parts[0]} if parts else {a.name for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name.split(".")[1] for a in node.names
                    if a.name.startswith("lab.") and len(a.name.split(".")) > 1}
    return out


def test_every_module_of_lab_has_a_floor():
    rooms = {_room(p) for p in LAB.rglob("*.py")} - {"__init__"}
    assert rooms <= set(FLOOR_OF), sorted(rooms - set(FLOOR_OF))


def test_imports_run_down_the_floors():
    up = []
    for path in sorted(LAB.rglob("*.py")):
        room = _room(path)
        if room == "__init__":
            continue
        for other in _imported_rooms(path) - {room}:
            if other in FLOOR_OF and FLOOR_OF[other] > FLOOR_OF[room]:
                up.append(f"{path.relative_to(LAB)} ({room}, floor {FLOOR_OF[room]}) imports "
                          f"{other} (floor {FLOOR_OF[other]})")
    assert not up, "\n".join(up)


def test_the_check_sees_every_form_of_import():
    """Relative (one or two dots, from a package folder too), absolute, and inside a function."""
    src = ("from .plan import x\nfrom . import measure\nimport lab.teach.audit\n"
           "def f():\n    from ..engine.runner import DecodeEngine\n")
    assert _rooms_in(src, ()) >= {"plan", "measure", "teach"}
    assert _rooms_in("from ..runner import E\nfrom lab.engine.step import S\n",
                     ("measure", "x")) == {"measure", "engine"}
    assert _rooms_in("from ..engine import E\nfrom .base import B\n", ("backend",)) == {
        "engine", "backend"}


def test_every_folder_says_what_it_owns():
    """Each floor's folder has an __init__ whose docstring names every module in it."""
    for folder in sorted(p for p in LAB.iterdir() if p.is_dir() and p.name != "__pycache__"):
        init = folder / "__init__.py"
        assert init.exists(), f"{folder.name}/ has no __init__.py"
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        for mod in sorted(folder.glob("*.py")):
            if mod.stem != "__init__":
                assert mod.stem in doc, f"{folder.name}/__init__.py does not name {mod.stem}"
        subs = [p for p in folder.iterdir() if p.is_dir() and (p / "__init__.py").exists()]
        for sub in sorted(subs):
            assert sub.name in doc, f"{folder.name}/__init__.py does not name {sub.name}/"
