"""The text a reader meets: the README fits a screen and names every notebook, docs/ links resolve,
the generated pages match their build, and no prose cites history (a commit, a pass, a round)."""
import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))


def test_readme_fits_a_screen():
    lines = README.read_text().splitlines()
    long = [i for i, line in enumerate(lines, 1) if len(line) > 100]
    assert len(lines) <= 150 and not long, f"{len(lines)} lines; over 100 characters: {long}"


def test_readme_names_each_notebook_on_one_line():
    lines = README.read_text().splitlines()
    for nb in sorted(ROOT.glob("notebooks/[0-9][0-9]_*.py")):
        hits = [line for line in lines if f"`{nb.stem}`" in line]
        assert len(hits) == 1, f"{nb.stem}: {len(hits)} README lines name it"


LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


@pytest.mark.parametrize("page", [README, *DOCS], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_links_resolve(page):
    missing = [t for t in LINK.findall(page.read_text()) if "://" not in t
               and not (page.parent / t).exists()]
    assert not missing, f"{page.name} links to what is not there: {missing}"


def test_generated_pages_match_their_build():
    """docs/toggles.md and docs/results.md are what scripts/build_docs.py writes from
    lab.config.TOGGLES and data/gpu/ (run it after changing either)."""
    import sys
    sys.path.insert(0, str(ROOT))
    from scripts.build_docs import PAGES
    stale = [rel for rel, build in PAGES.items() if (ROOT / rel).read_text() != build()]
    assert not stale, f"{stale} differ from scripts/build_docs.py's output: run it"


def test_the_results_page_reads_its_files(monkeypatch, tmp_path):
    """A number in docs/results.md comes from its file: a changed recording changes the page."""
    import json
    import shutil
    from scripts import build_docs
    for f in (ROOT / "data" / "gpu").glob("*.json"):
        shutil.copy(f, tmp_path)
    ladder = json.loads((tmp_path / "ladder.json").read_text())
    ladder["arms"][2]["mean_ms"] = 0.0123456
    (tmp_path / "ladder.json").write_text(json.dumps(ladder))
    monkeypatch.setattr(build_docs, "DATA", tmp_path)
    assert "| graph | 0.0123 ± " in build_docs.results_page()
    assert "| graph | 0.0123 ± " not in (ROOT / "docs" / "results.md").read_text()


def test_the_targets_table_reads_the_sanitizer_table_and_the_ratios(monkeypatch, tmp_path):
    """The top-of-the-ladder table: the sanitizer gate from sanitize_kernels.log's own closing
    table (checks.sanitize_table's form), a missed gate named with its run; the megakernel's
    verdict from persistent.json's ratio."""
    import json
    import shutil
    from lab.measure.experiments.checks import sanitize_table
    from scripts import build_docs
    clean = [("memcheck", "LAB_PERSISTENT=1 graph", 0, "ERROR SUMMARY: 0 errors"),
             ("racecheck", "LAB_DRAFT=4 graph", 0,
              "RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)")]
    assert build_docs.sanitizer_runs("$ cmd\nERROR SUMMARY: 0 errors\n"
                                     + sanitize_table(clean)[0]) == (2, [])
    dirty = clean + [("synccheck", "LAB_DRAFT=4 graph", 1, "ERROR SUMMARY: 2 errors"),
                     ("memcheck", "LAB_DRAFT=4 eager", 124, "")]
    assert build_docs.sanitizer_runs(sanitize_table(dirty)[0]) == (
        4, ["synccheck LAB_DRAFT=4 graph", "memcheck LAB_DRAFT=4 eager"])
    assert build_docs.sanitizer_runs("no table") == (0, [])
    for f in (ROOT / "data" / "gpu").glob("*.json"):
        shutil.copy(f, tmp_path)
    (tmp_path / "sanitize_kernels.log").write_text(sanitize_table(dirty)[0] + "\n")
    (tmp_path / "megakernel_bound.json").unlink(missing_ok=True)   # its clause: the next test
    per = json.loads((tmp_path / "persistent.json").read_text())
    per.pop("phases_long", None)                       # added below
    for ctx in per["ratio_to_best_multi_node"].values():
        ctx["persistent lean/arrive"] = 1.1
    (tmp_path / "persistent.json").write_text(json.dumps(per))
    monkeypatch.setattr(build_docs, "DATA", tmp_path)
    handoff = json.loads((tmp_path / "handoff.json").read_text())["rows"][0]
    assert (f"; the fastest body variant, lean/arrive: 1.10 / 1.10; measured apart "
            f"(`handoff.json`), a phase of {handoff['rows']} rows costs {handoff['us']['none']:.2f}"
            f" us in a persistent loop with no hand-off, {handoff['us']['count']:.2f} with the "
            f"counter's, against {handoff['us']['graph+pdl']:.2f} as graph kernels with PDL |"
            ) in build_docs.results_page()
    (tmp_path / "handoff.json").unlink()               # not recorded: no such clause
    assert "; the fastest body variant, lean/arrive: 1.10 / 1.10 |" in build_docs.results_page()
    assert "; at context 900" not in build_docs.results_page()   # no phases_long recorded
    long = dict(per["phases"], context=900)
    long["kinds"] = dict(per["phases"]["kinds"], **{"out proj": dict(
        per["phases"]["kinds"]["out proj"], step=8.96)})
    per["phases_long"] = long
    (tmp_path / "persistent.json").write_text(json.dumps(per))
    page = build_docs.results_page()
    assert f"; at context 900: out proj 8.96 us, " in page
    ratios = per["ratio_to_best_multi_node"]
    ratios["64"]["persistent lean/arrive"] = 1.05       # the fastest body differs by context:
    ratios["900"]["persistent graph"] = 1.01            # the default is named by its body
    (tmp_path / "persistent.json").write_text(json.dumps(per))
    assert (f"; the fastest body: lean/arrive 1.05 at context 64, {per['default_variant']} "
            f"(the default) 1.01 at context 900 |") in build_docs.results_page()
    for ctx in per["ratio_to_best_multi_node"].values():
        ctx["persistent graph"] = 0.5
    (tmp_path / "persistent.json").write_text(json.dumps(per))
    page = build_docs.results_page()
    assert "| gate | clean | 2 of 4 runs clean (sanitize_kernels.log) | missed | not clean: " \
           "synccheck LAB_DRAFT=4 graph, memcheck LAB_DRAFT=4 eager |" in page
    assert "| gate | < 1.0 | 0.50 / 0.50 | met |  |" in page
    assert "| aim | <= 0.6 | 0.50 / 0.50 | met |  |" in page


def test_the_megakernel_row_says_what_the_bound_allows(monkeypatch, tmp_path):
    """megakernel_bound.json's probe against the best multi-node arm, per context: behind it at
    both, at one, or ahead at both, the megakernel row's reason says which."""
    import json
    import shutil
    from scripts import build_docs
    for f in (ROOT / "data" / "gpu").glob("*.json"):
        shutil.copy(f, tmp_path)
    shutil.copy(ROOT / "data" / "gpu" / "sanitize_kernels.log", tmp_path)
    monkeypatch.setattr(build_docs, "DATA", tmp_path)
    probe = "persistent tails-noproj/arrive"
    bound = {"probes": {"tails-noproj/arrive": {}}, "ratio_to_best_multi_node": {
        "64": {probe: 1.04, "gate_reachable": False},
        "900": {probe: 1.11, "gate_reachable": False}}}
    cases = [((False, False), "1.04 / 1.11 the best multi-node arm: a body that folded that "
              "phase into the attention's tail, whose time cannot be below this one's, cannot "
              "meet the gate at either context"),
             ((True, False), "cannot meet the gate at context 900"),
             ((True, True), "ahead of it at every context, so a body that folded that phase "
              "into the attention's tail could meet the gate if its projection costs less than "
              "the margin")]
    for (r64, r900), want in cases:
        bound["ratio_to_best_multi_node"]["64"]["gate_reachable"] = r64
        bound["ratio_to_best_multi_node"]["900"]["gate_reachable"] = r900
        (tmp_path / "megakernel_bound.json").write_text(json.dumps(bound))
        page = build_docs.results_page()
        assert "without its output projection phase (tails-noproj/arrive, timing only, " \
               "`megakernel_bound.json`) the body is " in page
        assert want in page, want
    (tmp_path / "megakernel_bound.json").unlink()
    assert "without its output projection phase" not in build_docs.results_page()


def test_the_toggles_page_lists_every_toggle_and_bug():
    from lab.bugspec import BUGS, RANK_BUGS, SPEC_BUGS
    from lab.config import TOGGLES
    page = (ROOT / "docs" / "toggles.md").read_text()
    names = [t[0] for t in TOGGLES] + [b.env for b in {**BUGS, **RANK_BUGS, **SPEC_BUGS}.values()]
    assert all(f"| `{n}` |" in page for n in names)


def test_data_gpu_readme_names_every_recording():
    """data/gpu/README.md says what each recorded file is: a file it leaves out fails."""
    text = (ROOT / "data" / "gpu" / "README.md").read_text()
    files = [p.name for p in (ROOT / "data" / "gpu").iterdir() if p.suffix in (".json", ".txt")]
    missing = [n for n in files if f"`{n}`" not in text]
    assert files and not missing, f"data/gpu/README.md does not name {missing}"


def test_architecture_has_the_replay_file_blocks():
    text = (ROOT / "docs" / "architecture.md").read_text()
    for backend in ("sim", "cuda"):
        block = re.search(rf"<!-- replay-files:{backend} -->\n(.*?)<!-- /replay-files -->",
                          text, re.S)
        assert block and block.group(1).strip().startswith("- "), backend


# ---- the history lint ------------------------------------------------------------------------

# a commit: 7 to 40 hex digits with a letter and a digit, standing alone (a sha256 is 64 long,
# so it never matches; nor does a hex literal, 0x...)
COMMIT = re.compile(r"(?<![\w./-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![\w-])")
HISTORY = re.compile("|".join([
    r"\bthe pass of\b", r"\bon the [\w.-]+ pass\b", r"\bthe pass before\b",
    r"\b(?:previous|earlier|last|this|that) pass\b", r"\bpasses before\b",
    r"\bit was not always so\b", r"\b(?:this|last|previous|that) round\b",
    r"\bthe round before\b", r"\bused to be\b", r"\bwe used to\b"]), re.I)


def python_prose(text: str) -> list[tuple[int, str]]:
    """(line, text) of a module's docstrings and comments (a notebook source's markdown is
    comments); string literals that are not docstrings are data, not prose."""
    found = []
    try:
        for t in tokenize.generate_tokens(io.StringIO(text).readline):
            if t.type == tokenize.COMMENT:
                found.append((t.start[0], t.string))
    except (tokenize.TokenError, SyntaxError):
        return [(i, line) for i, line in enumerate(text.splitlines(), 1)]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(
                    getattr(body[0], "value", None), ast.Constant) and isinstance(
                    body[0].value.value, str):
                for k, line in enumerate(body[0].value.value.splitlines()):
                    found.append((body[0].lineno + k, line))
    return sorted(found)


def history(path: Path) -> list[str]:
    """file:line: what, for every commit hash or history phrase in the file's prose. Phrases
    are matched across a wrapped line too (each line is joined with the next)."""
    text = path.read_text()
    if not (COMMIT.search(text) or HISTORY.search(re.sub(r"[\s#\"]+", " ", text))):
        return []                 # nothing anywhere in the file: no need to parse its prose
    lines = python_prose(text) if path.suffix == ".py" else list(enumerate(text.splitlines(), 1))
    name = path.relative_to(ROOT) if ROOT in path.parents else path.name
    hits = []
    for k, (n, line) in enumerate(lines):
        nxt = lines[k + 1][1].lstrip("#\" ") if k + 1 < len(lines) else ""
        joined = line + " " + nxt
        for m in COMMIT.finditer(line):
            hits.append(f"{name}:{n}: {m.group(0)}")
        for m in HISTORY.finditer(joined):
            if m.start() < len(line):
                hits.append(f"{name}:{n}: {m.group(0)!r}")
    return hits


PROSE = {"lab": ["lab/**/*.py"], "kernels": ["kernels/**/*.py"], "scripts": ["scripts/**/*.py"],
         "tests": ["tests/**/*.py"], "notebooks": ["notebooks/[0-9][0-9]_*.py"],
         "docs": ["README.md", "docs/*.md", "data/README.md", "data/gpu/README.md"]}


@pytest.mark.parametrize("floor", sorted(PROSE))
def test_no_history_in_prose(floor):
    """Text says what is and why; which commit or pass measured a number lives in git and in
    the recordings' own fields."""
    files = sorted({p for pattern in PROSE[floor] for p in ROOT.glob(pattern)
                    if "__pycache__" not in p.parts} - {Path(__file__)})
    assert files
    hits = [h for p in files for h in history(p)]
    assert not hits, "history in prose:\n" + "\n".join(hits)


def test_the_history_lint_tells_prose_from_data(tmp_path):
    """Hashes and phrases in docstrings, comments and markdown fail; digests, hex literals and
    string data do not."""
    mod = tmp_path / "m.py"
    mod.write_text('"""Recorded on the 400fcee\npass."""\nDIGEST = "deadbeef12"  # sha256 '
                   + "ab" * 32 + '\nX = "the pass of"  # the pass before it\nY = 0x7f800000\n')
    assert [h.split(": ", 1)[1] for h in history(mod)] == [
        "400fcee", "'on the 400fcee pass'", "'the pass before'"]
    md = tmp_path / "x.md"
    md.write_text("Weights sha256 52ea4d9b9410fe66f195ba4045f1c193105cd7d6de865e8c4706327de128d36e"
                  "\nIt was not always\nso: commit 847f577 in this round.\n")
    assert [h.split(": ", 1)[1] for h in history(md)] == [
        "'It was not always so'", "847f577", "'this round'"]
