"""Build notebooks/NN_topic.ipynb from its jupytext source NN_topic.py, executed (on the
simulator unless a GPU is present), so the committed notebook shows real output.

  python scripts/build_notebooks.py [NAME ...]

Every build also writes the metadata JupyterLab expects, into both files of the pair:
- the kernelspec exactly as JupyterLab writes it (`KERNELSPEC`), so a notebook opened in
  JupyterLab is not marked modified on open;
- the jupytext pairing (`FORMATS`, also set for the whole folder by notebooks/jupytext.toml),
  so an edit saved in JupyterLab updates the .py source and the .ipynb together.
The .py source gets only its header rewritten (the `# ---` block jupytext writes); a source
whose body jupytext would write differently is left alone, with a warning.
"""
from __future__ import annotations

import sys
from pathlib import Path

import jupytext
from nbclient import NotebookClient

NB_DIR = Path(__file__).resolve().parent.parent / "notebooks"
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
FORMATS = "ipynb,py:percent"
HEADER_MARK = "# ---"


def with_metadata(nb):
    """`nb` with the kernelspec and the jupytext pairing every notebook here carries."""
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    nb.metadata.setdefault("jupytext", {})["formats"] = FORMATS
    return nb


def split_header(text: str) -> tuple[str, str]:
    """(the jupytext YAML header block, the rest) of a percent-format source."""
    lines = text.splitlines(keepends=True)
    if not lines or lines[0].rstrip() != HEADER_MARK:
        return "", text
    for i in range(1, len(lines)):
        if lines[i].rstrip() == HEADER_MARK:
            return "".join(lines[:i + 1]), "".join(lines[i + 1:])
    return "", text


def sync_source_header(source: Path) -> bool:
    """Rewrite the header of `source` as jupytext writes it for a paired notebook; True when the
    file changed. The body is never touched: if jupytext would write it differently, warn."""
    text = source.read_text()
    want = jupytext.writes(with_metadata(jupytext.read(source)), fmt="py:percent")
    (_, body), (header, new_body) = split_header(text), split_header(want)
    if new_body != body:
        print(f"warning: {source.name}: jupytext would rewrite its body; header left as it is",
              file=sys.stderr)
        return False
    if header + body == text:
        return False
    source.write_text(header + body)
    return True


def execute(source: Path, timeout: int = 600):
    nb = with_metadata(jupytext.read(source))
    NotebookClient(nb, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(source.parent)}}).execute()
    return nb


def main(names) -> int:
    sources = sorted(NB_DIR.glob("[0-9][0-9]_*.py"))
    if names:
        sources = [s for s in sources if any(n in s.stem for n in names)]
    for src in sources:
        if sync_source_header(src):
            print(f"{src.name}: header updated (kernelspec, jupytext pairing)", flush=True)
        print(f"executing {src.name} ...", flush=True)
        nb = execute(src)
        jupytext.write(nb, src.with_suffix(".ipynb"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
