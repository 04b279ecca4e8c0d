"""Examples are tests: every notebook executes on the simulator, and its committed .ipynb
holds the same code as its jupytext source."""
from pathlib import Path

import jupytext
import pytest

from scripts.build_notebooks import NB_DIR, execute

SOURCES = sorted(NB_DIR.glob("[0-9][0-9]_*.py"))


def test_there_are_notebooks():
    assert SOURCES


@pytest.mark.parametrize("source", SOURCES, ids=[s.stem for s in SOURCES])
def test_notebook_executes(source):
    nb = execute(source)
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors


@pytest.mark.parametrize("source", SOURCES, ids=[s.stem for s in SOURCES])
def test_ipynb_matches_its_source(source):
    ipynb = source.with_suffix(".ipynb")
    assert ipynb.is_file(), f"run: python scripts/build_notebooks.py {source.stem}"
    want = [c.source for c in jupytext.read(source).cells if c.cell_type == "code"]
    have = [c.source for c in jupytext.read(ipynb).cells if c.cell_type == "code"]
    assert have == want, f"{ipynb.name} is stale: run python scripts/build_notebooks.py {source.stem}"
