"""No text in the repository sends a reader to a path outside it: a student has the repository and
nothing beside it. Every tracked text file (code, docs, notebooks and their outputs, data READMEs)
is scanned for a relative path that climbs out of the repository from the file's folder, and for
absolute paths of a particular machine (a home or work folder)."""
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TEXT = {".py", ".md", ".ipynb", ".txt", ".toml", ".sh", ".cfg", ".ini", ".json", ".log", ""}
# a relative path: one or more ../ then a name (what a link, a Path() or a prose mention holds)
RELATIVE = re.compile(r"(?<![\w./-])((?:\.\./)+[\w.-][\w./-]*)")
# a folder path that names no folder of the repository's top level (`shared/gpu/...`): one that
# lives beside the repository, where a student has nothing
SIBLING = re.compile(r"(?<![\w./-])([A-Za-z_][\w-]*)/(?:[\w.-]+/)*[\w-]+\.(?:md|txt|sh|py|json)\b")
# a machine's own folders: nothing a student's machine has
ABSOLUTE = re.compile(r"(?<![\w.~-])(/(?:work|root|home|Users|mnt)/[\w.-]+[\w./-]*)")


def tracked() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                             check=True).stdout.decode()
        names = [n for n in out.split("\0") if n]
    except (OSError, subprocess.CalledProcessError):      # a copy without git: walk the tree
        names = [p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*")
                 if p.is_file() and ".git" not in p.parts and ".venv" not in p.parts]
    return [ROOT / n for n in names if (ROOT / n).suffix in TEXT and (ROOT / n).is_file()]


def outside(text: str, folder: Path) -> list[str]:
    """The paths in `text` that lead outside the repository when read from `folder`."""
    found = []
    for m in RELATIVE.finditer(text):
        target = (folder / m.group(1)).resolve()
        if not (target == ROOT or ROOT in target.parents):
            found.append(m.group(1))
        elif target != ROOT and not (ROOT / target.relative_to(ROOT).parts[0]).exists():
            found.append(m.group(1))          # inside by its letters, but nothing there
    found += [m.group(0) for m in SIBLING.finditer(text) if m.group(1) == "shared"
              and not (ROOT / "shared").exists()]
    found += [m.group(1) for m in ABSOLUTE.finditer(text)]
    return found


FILES = tracked()


def test_there_are_files_to_scan():
    names = {p.relative_to(ROOT).as_posix() for p in FILES}
    assert {"README.md", "data/gpu/README.md", "kernels/persistent.py"} <= names
    assert any(n.endswith(".ipynb") for n in names)


@pytest.mark.parametrize("path", FILES, ids=[p.relative_to(ROOT).as_posix() for p in FILES])
def test_no_text_points_outside_the_repository(path):
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        pytest.skip("not text")
    bad = outside(text, path.parent)
    assert not bad, (f"{path.relative_to(ROOT)} points outside the repository: "
                     f"{', '.join(sorted(set(bad)))} (a student has only the repository)")


def test_the_scan_tells_inside_from_outside():
    nb = ROOT / "notebooks"
    up, sib, home = "..", "shared", "/work"      # spelt apart: this file is scanned too
    assert outside('GPU = Path("../data/gpu")', nb) == []
    fact = f"{up}/{sib}/gpu/FACTS.md"
    assert outside(f"see `{fact}`", ROOT) == [fact]
    assert outside(f"see `{fact}`", nb) == [fact]
    assert outside(f"the driver ({sib}/gpu/FACTS.md) allowed", ROOT) == [f"{sib}/gpu/FACTS.md"]
    assert outside("kernels/matvec.py and data/gpu/kernel_costs.json", ROOT) == []
    assert outside(f"see {up}/{up}/x/y.md", nb) == [f"{up}/{up}/x/y.md"]
    assert outside(f"written by {home}/main/lab/x.py", ROOT) == [f"{home}/main/lab/x.py"]
    assert outside("cached in ~/.decode-lab and /dev/null", ROOT) == []


def test_every_script_the_text_names_exists():
    """A script named in code, docs or a notebook (a path under scripts/ ending .py or .sh) exists: a
    moved or retired tool leaves no pointer behind (docs/moved.md, which lists what moved, aside)."""
    import re
    named = re.compile(r"\bscripts/([A-Za-z0-9_]+\.(?:py|sh))\b")
    stale = [f"{p.relative_to(ROOT)}: scripts/{m.group(1)}"
             for p in tracked() if p.name != "moved.md" and p.suffix != ".ipynb"
             and not p.is_relative_to(ROOT / "data")
             for m in named.finditer(p.read_text(errors="replace"))
             if not (ROOT / "scripts" / m.group(1)).is_file()]
    assert not stale, stale
