"""Examples are tests: every notebook executes on the simulator, its committed .ipynb holds the
same cells as its jupytext source, and it opens in JupyterLab clean: the kernelspec JupyterLab
writes, the jupytext pairing, outputs that fit a page, no stray matplotlib reprs, and every
plot followed by text that reads it."""
import difflib
import json
import re
from pathlib import Path

import jupytext
import pytest
from jupytext.config import load_jupytext_configuration_file

from scripts.build_notebooks import (AFTER_ATTEMPT, FORMATS, KERNELSPEC, NB_DIR, execute,
                                     split_header, stable_ids, stable_outputs,
                                     strip_after_attempt, sync_source_header)

SOURCES = sorted(NB_DIR.glob("[0-9][0-9]_*.py"))
WIDTH = 100   # the widest output line a notebook may print (the notebooks' show() wraps at it)
REPR = re.compile(r"^(<(Axes|Figure|matplotlib)|Text\()")   # what a plot call's value prints as
IDS = [s.stem for s in SOURCES]


def _ipynb(source: Path) -> dict:
    path = source.with_suffix(".ipynb")
    assert path.is_file(), f"run: python scripts/build_notebooks.py {source.stem}"
    return json.loads(path.read_text())


def _text_outputs(cell):
    """(kind, text, has_image) of each output of a code cell that shows text."""
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            yield "stream", "".join(out.get("text", "")), False
        elif out.get("output_type") in ("execute_result", "display_data"):
            data = out.get("data", {})
            if "text/plain" in data:
                yield out["output_type"], "".join(data["text/plain"]), "image/png" in data


def test_there_are_notebooks():
    assert SOURCES


# notebooks 05 to 07 simulate lessons of the conformance table: in the conformance tests' xdist
# group they re-use that simulation (tests/conftest.py's conformance_cache) instead of running
# their own alongside it
EXECUTE = [pytest.param(s, marks=pytest.mark.xdist_group("conformance"))
           if s.stem[:3] in ("05_", "06_", "07_") else s for s in SOURCES]


@pytest.mark.slow
@pytest.mark.parametrize("source", EXECUTE, ids=IDS)
def test_notebook_executes(source):
    """Executed on the simulator (its own kernel; the notebooks spread over pytest-xdist's
    workers), no cell raises, and every text output is what the committed .ipynb shows: the
    simulator's clock and noise are seeded, so a committed output that differs is stale (cells
    tagged `volatile` and progress-bar lines excepted, scripts/build_notebooks.py)."""
    nb = execute(source)
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors, f"{source.stem}: {errors[0].get('ename')}: {errors[0].get('evalue')}"
    have, want = stable_outputs(nb), stable_outputs(jupytext.read(source.with_suffix(".ipynb")))
    for (i, now), (j, then) in zip(have, want):
        if (i, now) != (j, then):
            diff = "\n".join(list(difflib.unified_diff(then.splitlines(), now.splitlines(),
                                                        "committed", "now", lineterm=""))[:30])
            pytest.fail(f"{source.stem}.ipynb cell {i}: the committed output is stale (rebuild: "
                        f"python scripts/build_notebooks.py {source.stem}):\n{diff}")
    assert len(have) == len(want), (f"{source.stem}.ipynb: {len(want)} committed text outputs, "
                                    f"{len(have)} now (rebuild: python scripts/build_notebooks.py "
                                    f"{source.stem})")


@pytest.mark.parametrize("source", SOURCES, ids=IDS)
def test_ipynb_matches_its_source(source):
    """Every cell, code and markdown: a paired notebook whose two files hold the same cells opens
    in JupyterLab whichever of the two is newer."""
    ipynb = source.with_suffix(".ipynb")
    assert ipynb.is_file(), f"run: python scripts/build_notebooks.py {source.stem}"
    want = [(c.cell_type, c.source) for c in jupytext.read(source).cells]
    have = [(c.cell_type, c.source) for c in jupytext.read(ipynb).cells]
    assert have == want, f"{ipynb.name} is stale: python scripts/build_notebooks.py {source.stem}"


@pytest.mark.parametrize("source", SOURCES, ids=IDS)
def test_a_rebuild_rewrites_nothing_volatile(source):
    """Cell ids derived from the cells (a rebuild keeps them), no execution timestamps, one
    output per run of a stream: a rebuild of unchanged code leaves the committed .ipynb as it is."""
    raw = json.loads(source.with_suffix(".ipynb").read_text())
    nb = jupytext.read(source.with_suffix(".ipynb"))
    assert [c.id for c in nb.cells] == [c.id for c in stable_ids(jupytext.read(source)).cells], \
        f"{source.stem}.ipynb: cell ids are not the stable ones (python scripts/build_notebooks.py)"
    timed = [i for i, c in enumerate(raw["cells"]) if "execution" in c.get("metadata", {})]
    assert not timed, f"{source.stem}.ipynb: execution timestamps in cells {timed[:5]}"
    split = [i for i, c in enumerate(raw["cells"]) for a, b in zip(c.get("outputs", []),
             c.get("outputs", [])[1:]) if a.get("output_type") == b.get("output_type") == "stream"
             and a.get("name") == b.get("name")]
    assert not split, f"{source.stem}.ipynb: a stream split over outputs in cells {split[:5]}"


@pytest.mark.parametrize("source", SOURCES, ids=IDS)
def test_notebook_opens_clean_and_paired_in_jupyterlab(source):
    """The kernelspec exactly as JupyterLab writes it (else opening marks the notebook modified)
    and the jupytext pairing, in both files of the pair."""
    meta = _ipynb(source)["metadata"]
    assert meta.get("kernelspec") == KERNELSPEC, f"{source.stem}.ipynb: {meta.get('kernelspec')}"
    assert meta.get("jupytext", {}).get("formats") == FORMATS, f"{source.stem}.ipynb: not paired"
    text_meta = jupytext.read(source).metadata
    assert text_meta.get("kernelspec") == KERNELSPEC, f"{source.name}: {text_meta}"
    assert text_meta.get("jupytext", {}).get("formats") == FORMATS, f"{source.name}: not paired"


def test_the_notebooks_folder_pairs_every_notebook():
    config = load_jupytext_configuration_file(str(NB_DIR / "jupytext.toml"))
    assert config is not None and config.formats in (FORMATS, [FORMATS])


def test_the_build_rewrites_only_a_sources_header(tmp_path):
    """sync_source_header writes the pairing and the kernelspec into an old header and leaves
    the body byte for byte; a second sync changes nothing."""
    old = ("# ---\n# jupyter:\n#   kernelspec:\n#     display_name: Python 3\n"
           "#     language: python\n#     name: python3\n# ---\n\n"
           "# %% [markdown]\n# # Title\n\n# %%\nx = 1  # a comment\nprint(x)\n")
    src = tmp_path / "00_x.py"
    src.write_text(old)
    assert sync_source_header(src)
    header, body = split_header(src.read_text())
    assert body == split_header(old)[1]
    meta = jupytext.read(src).metadata
    assert meta["kernelspec"] == KERNELSPEC and meta["jupytext"]["formats"] == FORMATS
    assert "Python 3 (ipykernel)" in header
    assert not sync_source_header(src)


@pytest.mark.parametrize("source", SOURCES, ids=IDS)
def test_outputs_fit_the_page(source):
    wide = [(i, len(line), line[:60]) for i, cell in enumerate(_ipynb(source)["cells"])
            if cell["cell_type"] == "code" for _, text, _ in _text_outputs(cell)
            for line in text.splitlines() if len(line) > WIDTH]
    assert not wide, f"{source.stem}: (cell, width, start) of lines over {WIDTH}: {wide[:5]}"


@pytest.mark.parametrize("source", SOURCES, ids=IDS)
def test_no_stray_plot_reprs(source):
    """A plot cell ends with plt.show() or `;`: its last call's value (`<Axes: ...>`, `Text(...)`)
    is not printed as text beside, or instead of, the figure."""
    stray = [(i, text[:60]) for i, cell in enumerate(_ipynb(source)["cells"])
             if cell["cell_type"] == "code" for kind, text, image in _text_outputs(cell)
             if kind != "stream" and not image and REPR.match(text)]
    assert not stray, f"{source.stem}: (cell, output) {stray}"


@pytest.mark.parametrize("source", SOURCES, ids=IDS)
def test_every_plot_is_read_in_the_text_after_it(source):
    """The cell after a cell that draws a figure is prose about it (markdown, not a new heading)."""
    cells = _ipynb(source)["cells"]
    unread = []
    for i, cell in enumerate(cells):
        if cell["cell_type"] != "code" or not any(
                "image/png" in o.get("data", {}) for o in cell.get("outputs", [])):
            continue
        nxt = cells[i + 1] if i + 1 < len(cells) else None
        text = "".join(nxt["source"]).lstrip() if nxt and nxt["cell_type"] == "markdown" else ""
        if not text or text.startswith("#"):
            unread.append(i)
    assert not unread, f"{source.stem}: figures in cells {unread} have no text reading them"


@pytest.mark.parametrize("source", SOURCES, ids=IDS)
def test_cells_that_give_an_answer_away_ship_empty(source):
    """A cell tagged `after-attempt` (evidence that gives a self-check answer away) ships with no
    output in the committed .ipynb: the build strips it, the staleness check skips it."""
    cells = _ipynb(source)["cells"]
    tagged = [i for i, c in enumerate(cells) if AFTER_ATTEMPT in c.get("metadata", {}).get(
        "tags", [])]
    full = [i for i in tagged if cells[i].get("outputs") or cells[i].get("execution_count")]
    assert not full, f"{source.stem}.ipynb: cells {full} are tagged {AFTER_ATTEMPT!r} but ship " \
                     f"outputs (rebuild: python scripts/build_notebooks.py {source.stem})"
    if source.stem.startswith("08_"):
        assert len(tagged) >= 5, f"{source.stem}: its evidence cells are not tagged"


def test_the_build_strips_after_attempt_cells_and_the_check_skips_them():
    import copy
    nb = jupytext.read(SOURCES[0].with_suffix(".ipynb"))
    cell = next(c for c in nb.cells if c.cell_type == "code" and any(
        o.get("output_type") == "stream" for o in c.get("outputs", [])))
    tagged = copy.deepcopy(nb)
    c = next(c for c in tagged.cells if c.id == cell.id)
    c.metadata["tags"] = [AFTER_ATTEMPT]
    before = stable_outputs(copy.deepcopy(nb))
    assert len(stable_outputs(copy.deepcopy(tagged))) < len(before)      # skipped
    stripped = strip_after_attempt(copy.deepcopy(tagged))
    c = next(c for c in stripped.cells if c.id == cell.id)
    assert c.outputs == [] and c.execution_count is None
    others = [(x.id, x.get("outputs")) for x in stripped.cells if x.id != cell.id]
    assert others == [(x.id, x.get("outputs")) for x in nb.cells if x.id != cell.id]


def test_stable_outputs_see_a_stale_output_and_ignore_chunking_and_progress():
    """What the staleness check compares: a changed printed text differs; the same text split
    over two stream outputs (timing) or a progress bar's line (the wall clock) does not."""
    import copy
    nb = jupytext.read(SOURCES[0].with_suffix(".ipynb"))
    base = stable_outputs(copy.deepcopy(nb))
    cell = next(c for c in nb.cells if c.cell_type == "code" and any(
        o.get("output_type") == "stream" for o in c.get("outputs", [])))
    out = next(o for o in cell.outputs if o.get("output_type") == "stream")
    text = "".join(out["text"])
    stale = copy.deepcopy(nb)
    next(o for c in stale.cells if c.id == cell.id for o in c.outputs
         if o.get("output_type") == "stream")["text"] = text + "one more line\n"
    assert stable_outputs(stale) != base
    chunked = copy.deepcopy(nb)
    c = next(c for c in chunked.cells if c.id == cell.id)
    i = c.outputs.index(next(o for o in c.outputs if o.get("output_type") == "stream"))
    half = len(text) // 2
    c.outputs[i:i + 1] = [{**out, "text": text[:half]}, {**out, "text": text[half:]},
                          {**out, "text": " 40%|####  | 4/10 [00:01<00:02, 3.1it/s]\n"}]
    assert stable_outputs(chunked) == base
    # a progress bar on stderr, its closing newline falling between two chunks of stdout (where
    # it falls is timing): the same stdout
    bar = {"output_type": "stream", "name": "stderr"}
    crossed = copy.deepcopy(nb)
    c = next(c for c in crossed.cells if c.id == cell.id)
    c.outputs[i:i + 1] = [{**out, "text": text[:half]},
                          {**bar, "text": "\rcheck 0/8 launches [00:00<?]\rcheck 8/8 launches [00:00<00:00]"},
                          {**bar, "text": "\n"}, {**out, "text": text[half:]}]
    assert stable_outputs(crossed) == base
    c.outputs[i:i + 1] = [{**out, "text": text[:half] + "x"}, {**out, "text": text[half:]}]
    assert stable_outputs(crossed) != base
