"""Build notebooks/NN_topic.ipynb from its jupytext source NN_topic.py, executed (on the
simulator unless a GPU is present), so the committed notebook shows real output.

  python scripts/build_notebooks.py [-j N] [NAME ...]   (N notebooks at a time: one per core)

Every build also writes the metadata JupyterLab expects, into both files of the pair:
- the kernelspec exactly as JupyterLab writes it (`KERNELSPEC`), so a notebook opened in
  JupyterLab is not marked modified on open;
- the jupytext pairing (`FORMATS`, also set for the whole folder by notebooks/jupytext.toml),
  so an edit saved in JupyterLab updates the .py source and the .ipynb together.
The .py source gets only its header rewritten (the `# ---` block jupytext writes); a source
whose body jupytext would write differently is left alone, with a warning.

A rebuild of unchanged code rewrites nothing: each cell's id is derived from its source (a
changed cell changes its own id only), no execution timestamps are recorded, and the Python
version JupyterLab would write is the only volatile metadata kept. `stable_outputs` is what
a check of committed outputs holds against a fresh execution: every text a cell prints, except
in cells tagged `volatile` (`# %% tags=["volatile"]`: output that depends on the wall clock or
on uninitialised memory, which is random on purpose) and in cells tagged `after-attempt`.

A cell tagged `after-attempt` (`# %% tags=["after-attempt"]`) shows evidence that gives a
self-check answer away (notebook 08): it is executed like any other, but its outputs are
stripped before the notebook is written, so it ships empty and the student runs it after an
attempt. Notebooks run as the self-check identity NOTEBOOK_STUDENT (DECODE_LAB_STUDENT in the
kernel's environment): a fixed name for the build, never a student's.
"""
from __future__ import annotations

import hashlib
import os
import re
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import jupytext
from nbclient import NotebookClient

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from lab.config import STUDENT_ENV, child_env  # noqa: E402
from lab.files import atomic_write_text  # noqa: E402

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


VOLATILE = "volatile"   # the cell tag for output that depends on the wall clock or random memory
AFTER_ATTEMPT = "after-attempt"   # the cell tag for output that gives a self-check answer away
NOTEBOOK_STUDENT = "notebook build"   # the self-check identity notebooks execute as
# a line the simulator does not decide: a progress bar's rate and elapsed time (tqdm)
VOLATILE_LINE = re.compile(r"\d+(\.\d+)?(it|s)/(s|it)\b|\[\d+:\d+<")


def stable_ids(nb):
    """Each cell's id from its type and source (and its rank among equal cells): ids survive a
    rebuild, and an edited cell changes only its own."""
    seen: dict[str, int] = {}
    for cell in nb.cells:
        digest = hashlib.sha1(f"{cell.cell_type}\n{cell.source}".encode()).hexdigest()[:8]
        seen[digest] = seen.get(digest, 0) + 1
        cell.id = digest if seen[digest] == 1 else f"{digest}-{seen[digest]}"
    return nb


def merge_streams(nb):
    """One output per run of consecutive stream outputs of the same stream in each cell: how a
    print reaches the kernel's client in chunks depends on timing, what it printed does not."""
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        merged = []
        for o in cell.get("outputs", []):
            if (o.get("output_type") == "stream" and merged
                    and merged[-1].get("output_type") == "stream"
                    and merged[-1].get("name") == o.get("name")):
                merged[-1]["text"] = "".join(merged[-1]["text"]) + "".join(o.get("text", ""))
            else:
                merged.append(o)
        cell["outputs"] = merged
    return nb


def _tagged(cell, tag: str) -> bool:
    return tag in cell.get("metadata", {}).get("tags", [])


def strip_after_attempt(nb):
    """`nb` with no outputs in its code cells tagged `after-attempt` (they ship empty)."""
    for cell in nb.cells:
        if cell.cell_type == "code" and _tagged(cell, AFTER_ATTEMPT):
            cell["outputs"] = []
            cell["execution_count"] = None
    return nb


def stable_outputs(nb) -> list[tuple[int, str]]:
    """(cell index, text) of every text output of every code cell not tagged `volatile` or
    `after-attempt`, lines of progress bars left out. A cell's stdout is one text and its
    stderr another, whatever chunks they arrived in: how a stream is cut where the other
    stream's writes (a progress bar's) fall between its own is timing, not content."""
    out = []
    for i, cell in enumerate(merge_streams(nb).cells):
        if cell.cell_type != "code" or _tagged(cell, VOLATILE) or _tagged(cell, AFTER_ATTEMPT):
            continue
        streams: dict[str, str] = {}
        rest = []
        for o in cell.get("outputs", []):
            if o.get("output_type") == "stream":
                name = o.get("name", "stdout")
                streams[name] = streams.get(name, "") + "".join(o.get("text", ""))
            elif o.get("output_type") in ("execute_result", "display_data"):
                rest.append("".join(o.get("data", {}).get("text/plain", "")))
            elif o.get("output_type") == "error":
                rest.append(f"{o.get('ename')}: {o.get('evalue')}")
        for text in [streams[k] for k in sorted(streams)] + rest:
            text = "\n".join(line for line in text.replace("\r", "\n").splitlines()
                             if line.strip() and not VOLATILE_LINE.search(line))
            if text:
                out.append((i, text))
    return out


def execute(source: Path, timeout: int = 600):
    """The notebook of `source`, executed in a kernel of its own (its folder as the working
    directory, NOTEBOOK_STUDENT its self-check identity), with stable cell ids and no
    timestamps."""
    nb = stable_ids(with_metadata(jupytext.read(source)))
    NotebookClient(nb, timeout=timeout, kernel_name="python3", record_timing=False,
                   resources={"metadata": {"path": str(source.parent)}}).execute(
        env=child_env(**{STUDENT_ENV: NOTEBOOK_STUDENT}))
    return merge_streams(nb)


def build(src: Path) -> str:
    """Execute one notebook and write its .ipynb whole (an interrupted build leaves the
    committed notebook as it was); the line to print."""
    t = time.perf_counter()
    nb = strip_after_attempt(execute(src))
    atomic_write_text(src.with_suffix(".ipynb"), jupytext.writes(nb, fmt="ipynb"))
    return f"{src.name}: executed and written in {time.perf_counter() - t:.0f} s"


def main(argv) -> int:
    """python scripts/build_notebooks.py [-j N] [NAME ...]: each notebook in a kernel of its
    own, N at a time (default: one per core)."""
    jobs = os.cpu_count() or 1
    if argv[:1] == ["-j"]:
        if len(argv) < 2 or not argv[1].isdigit() or int(argv[1]) < 1:
            print("usage: build_notebooks.py [-j N] [NAME ...]  (N >= 1)", file=sys.stderr)
            return 2
        jobs, argv = int(argv[1]), argv[2:]
    sources = sorted(NB_DIR.glob("[0-9][0-9]_*.py"))
    if argv:
        sources = [s for s in sources if any(n in s.stem for n in argv)]
        if not sources:
            print(f"no notebook matches {argv}", file=sys.stderr)
            return 2
    for src in sources:
        if sync_source_header(src):
            print(f"{src.name}: header updated (kernelspec, jupytext pairing)", flush=True)
    print(f"executing {len(sources)} notebook(s), {min(jobs, len(sources))} at a time ...", flush=True)
    with ProcessPoolExecutor(max_workers=min(jobs, len(sources))) as pool:
        for line in pool.map(build, sources):
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
