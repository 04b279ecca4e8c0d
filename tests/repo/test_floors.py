"""The house's floors (lab/__init__.py): the ground floor's modules sit in lab/, every floor
above it is a folder (backend/, engine/, measure/, teach/), and each module imports only from its
own floor or the floors below, so a reader can take the lab apart from the ground up. Read from the
source's import statements (every one: tests/repo/test_imports.py)."""
import ast
from pathlib import Path

from test_imports import lab_graph

LAB = Path(__file__).resolve().parents[2] / "lab"
FLOORS = {
    0: {"errors", "config", "bugspec", "files", "exits", "schema", "model", "reference", "plan",
        "pdl_check", "ledger"},
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


def _room_of(module: str) -> str:
    """The same for a dotted module name: lab.engine.runner -> engine, lab.plan -> plan."""
    return module.split(".")[1] if module.count(".") else "__init__"


def test_every_module_of_lab_has_a_floor():
    rooms = {_room(p) for p in LAB.rglob("*.py")} - {"__init__"}
    assert rooms <= set(FLOOR_OF), sorted(rooms - set(FLOOR_OF))


def test_imports_run_down_the_floors():
    """Every import statement counts (tests/repo/test_imports.py builds the graph); kernels/, the
    floor below the ground, imports nothing from lab/."""
    up = []
    for module, targets in sorted(lab_graph().items()):
        lab_targets = sorted(t for t in targets if t.split(".")[0] == "lab")
        if module.split(".")[0] == "kernels":
            up += [f"{module} (kernels/, below every floor) imports {t}" for t in lab_targets]
            continue
        room = _room_of(module)
        if room == "__init__":
            continue
        for other in {_room_of(t) for t in lab_targets} - {room}:
            if other in FLOOR_OF and FLOOR_OF[other] > FLOOR_OF[room]:
                up.append(f"{module} ({room}, floor {FLOOR_OF[room]}) imports "
                          f"{other} (floor {FLOOR_OF[other]})")
    assert not up, "\n".join(up)


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


def test_no_class_over_250_lines_and_the_runner_reads_in_one_sitting():
    """A class a reader holds in mind at once: none in lab/ or kernels/ over 250 lines, and the
    engine's runner (lab/engine/runner.py, the token path's entry) at most 250 lines in all."""
    import ast
    root = LAB.parent
    big = []
    for path in sorted([*LAB.rglob("*.py"), *(root / "kernels").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > 250:
                big.append(f"{path.relative_to(root)}:{node.lineno} {node.name} "
                           f"({node.end_lineno - node.lineno + 1} lines)")
    assert not big, big
    assert len((LAB / "engine" / "runner.py").read_text().splitlines()) <= 250
