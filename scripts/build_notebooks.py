"""Build notebooks/NN_topic.ipynb from its jupytext source NN_topic.py, executed (on the
simulator unless a GPU is present), so the committed notebook shows real output.

  python scripts/build_notebooks.py [NAME ...]
"""
from __future__ import annotations

import sys
from pathlib import Path

import jupytext
from nbclient import NotebookClient

NB_DIR = Path(__file__).resolve().parent.parent / "notebooks"


def execute(source: Path, timeout: int = 600):
    nb = jupytext.read(source)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    NotebookClient(nb, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(source.parent)}}).execute()
    return nb


def main(names) -> int:
    sources = sorted(NB_DIR.glob("[0-9][0-9]_*.py"))
    if names:
        sources = [s for s in sources if any(n in s.stem for n in names)]
    for src in sources:
        print(f"executing {src.name} ...", flush=True)
        nb = execute(src)
        jupytext.write(nb, src.with_suffix(".ipynb"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
