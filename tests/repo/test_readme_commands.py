"""Every command the README and docs/ show, run: each `decode-lab ...` / `python -m lab ...` line
of README.md (its code blocks and inline code) and of docs/*.md's code blocks is a case below.
Its shown form (optional parts included, each alternative) must parse; a run of it on the
simulator, with small --tokens/--reps/--contexts, must exit as the text says and print what the
text shows. Commands that need a GPU are parsed only. The README's demo block, unwrapped, is
`python -m lab demo --backend sim`'s output line for line.

The runs are in process (`lab.__main__.main`), one per distinct command line, shared by the
tests that read it."""
from __future__ import annotations

import contextlib
import io
import itertools
import json
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from lab.__main__ import build_parser, main

# one worker runs the module under pytest-xdist: its runs are shared by its tests
pytestmark = pytest.mark.xdist_group("readme_commands")

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
COMMAND = re.compile(r"(?:^|[\s`])((?:decode-lab|python -m lab)(?=[\s`]|$)[^`]*)")
FENCE = "```"


# ------------------------------------------------------------------ collecting what is shown

def _strip(line: str) -> str:
    """The command alone: no `# comment`, no shell redirection or background, one space apart."""
    line = re.sub(r"\s#\s.*$", "", line).replace("\\\n", " ")
    words = []
    for word in line.split():
        if word in ("&", "&&", ";") or word.startswith((">", "<", "2>")):
            break
        words.append(word)
    return " ".join(words)


def _code_lines(text: str):
    """The lines of fenced code blocks, and of indented ones (4 spaces or more, outside a
    fence), with a trailing backslash joined to the next line."""
    inside, held = False, ""
    for line in text.splitlines():
        if line.lstrip().startswith(FENCE):
            inside = not inside
            continue
        if not (inside or line.startswith("    ")):
            continue
        if line.rstrip().endswith("\\"):
            held += line.rstrip()[:-1] + " "
            continue
        yield held + line
        held = ""


def shown_commands() -> dict[str, str]:
    """Each shown command line -> the page that shows it first."""
    found: dict[str, str] = {}

    def add(text, page):
        m = COMMAND.search(text)
        if m:
            found.setdefault(_strip(m.group(1)), page)

    for page in [README, *DOCS]:
        text = page.read_text()
        for line in _code_lines(text):
            add(line, page.name)
        if page == README:
            for inline in re.findall(r"`([^`\n]+)`", text):
                add(inline, page.name)
    return found


# ------------------------------------------------------------------ the cases


@dataclass
class Run:
    """One run of a shown command: its argv (small arguments), environment, expected exit code,
    and patterns its stdout must match (re.MULTILINE)."""
    argv: list
    code: int = 0
    env: dict = field(default_factory=dict)
    expect: tuple = ()


@dataclass
class Case:
    runs: tuple = ()           # none: parsed only (a GPU command), or --help
    gpu_only: bool = False
    mention: bool = False      # a command named in prose (`decode-lab record`): it exists


SIM = ["--backend", "sim"]
TMP = "{tmp}"               # replaced by the module's temporary folder
DATA_GPU = str(ROOT / "data" / "gpu")
ROWS = r"^{}\s+8\s+4\s+5\s+37\s+\d+\.\d{{3}}\s+\d+\.\d{{2}}$"   # a launch-bill row

DEMO = Run(["demo", *SIM], expect=(
    r"^backend: simulated \(CPU simulator; component costs from kernel_costs\.json",
    r"^model: tiny_model\.npz, 4 layers, d_model 256, vocab 71, max_seq 1024$",
    r"^--- greedy continuation ---\nROMEO\.\n",
    r"^launch bill \(200 tokens after 'ROMEO\.\\n'\):$",
    r"^mode\s+kernels/layer layers other launches/token\s+ms/token us/launch$",
    ROWS.format("dispatcher"), ROWS.format("prebound"), ROWS.format("graph"),
    r"^graph replay: [\d.]+x less time per token than pre-bound eager launches \([\d.]+x less "
    r"than numba's dispatcher\)$",
    r"^graph run's ledger: \{'replay': 206\}$"))

RECORD_SIM = Run(["record", "instances", "--backend", "sim", "--out", f"{TMP}/rec", "--quick"],
                 expect=(r"^instances\s+\d+\s+\d+\s+ok$", r"^1 experiments, 0 failed"))

CASES: dict[str, Case] = {
    'decode-lab generate --prompt "ROMEO:" --tokens 200 [--backend auto|cuda|sim] [--ledger]': Case((
        Run(["generate", "--prompt", "ROMEO:", "--tokens", "4", *SIM, "--ledger"], expect=(
            r"\AROMEO:", r"^\[\d+ prompt steps \+ 4 tokens, \d+\.\d{3} ms/token \(per step",
            r"^step  pos  plan", r"^summary: \{'capture': 1, 'replay': \d+\}$")),)),
    "decode-lab demo [--tokens N]": Case((DEMO,)),
    "python -m lab demo --backend sim": Case((DEMO,)),
    # its comment, exit 1 for each LAB_BUG_<NAME>=1: tests/cli/test_cli.py runs every bug
    "decode-lab audit": Case((
        Run(["audit", *SIM], expect=(r"^capture audit over \d+ eager steps", r"^lazy-init detector",
                                     r"^a graph run and the step's kernels: nothing found$")),)),
    "decode-lab bench ab --a LAB_GRAPH=0 --b LAB_GRAPH=1 --reps 5 [--json out.json]": Case((
        Run(["bench", "ab", "--a", "LAB_GRAPH=0", "--b", "LAB_GRAPH=1", "--reps", "2", "--tokens",
             "1", "--per-token", "0", "--json", f"{TMP}/out.json", *SIM], expect=(
            r"^A/A gate \(A vs A'\): PASS", r"^A\s+GRAPH=0\s", r"^B\s+GRAPH=1\s",
            r"^B - A = [-+\d.]+ ms/token", r"^wrote .*out\.json$")),)),
    "decode-lab bench loo --factors GRAPH,PDL,OVERLAP,SPLIT_COMBINE": Case((
        Run(["bench", "loo", "--factors", "GRAPH,PDL,OVERLAP,SPLIT_COMBINE", "--reps", "2",
             "--tokens", "1", *SIM], expect=(
            r"^all-on\s", r"^all-off\s", r"^-GRAPH\s", r"^-PDL\s", r"^-OVERLAP\s",
            r"^-SPLIT_COMBINE\s", r"^interaction\s")),)),
    "decode-lab bench sweep --contexts 64,256,1000 --arms LAB_GRAPH=0 LAB_GRAPH=1": Case((
        Run(["bench", "sweep", "--contexts", "64,256,1000", "--arms", "LAB_GRAPH=0", "LAB_GRAPH=1",
             "--reps", "2", "--tokens", "1", *SIM],
            expect=tuple(rf"^\s*{c}\s+\d+ LAB_GRAPH={g}\s" for c in (64, 256, 1000) for g in (0, 1))),)),
    "decode-lab compare --a reference --b FUSION=1 --prompts standard --tokens 256": Case((
        Run(["compare", "--a", "reference", "--b", "FUSION=1", "--prompts", "standard", "--tokens",
             "1", *SIM], expect=(r"^A: reference\s+B: FUSION=1\s+1 tokens? per prompt$",
                                 *(rf"^'{p}" for p in ("ROMEO", "To be", "First Citizen",
                                                       "Enter HAMLET", "JULIET")),
                                 r"^verdict: PASS$")),)),
    "decode-lab conformance [--data DIR]": Case((
        Run(["conformance", "--data", DATA_GPU, "--only", "context"], expect=(
            r"^lesson\s+unit\s+simulated\s+GPU", r"\sPASS$", r"^GPU: measured on NVIDIA H200")),)),
    "decode-lab spec [--draft 4] [--curve]": Case((
        Run(["spec", "--draft", "4", "--tokens", "3", *SIM],
            expect=(*(rf"^  PASS  '{p}" for p in ("ROMEO", "To be", "First Citizen",
                                                    "Enter HAMLET", "JULIET")),
                    r"^PASS \(simulated")),
        Run(["spec", "--draft", "4", "--curve", "--contexts", "8", "--tokens", "2", "--reps", "2",
             *SIM], expect=tuple(rf"^\s+8\s+draft {k}\s" for k in (0, 2, 4, 8)) +
            (r"^\s+8\s+draft 4 \+ LAB_BUG_SPEC_KEY\s",)))),
    "decode-lab selfcheck [--answers answers.json] [--solutions my_solutions.py]": Case((
        Run(["selfcheck"], env={"DECODE_LAB_STUDENT": "readme"},
            expect=(r"^q1 \(lecture section", r"^q10 \(lecture section")),)),
    "decode-lab exercise list": Case((Run(["exercise", "list"], expect=(r"^step\s+1\s+launch_count",
                                                                       r"\saccept\s")),)),
    "decode-lab record NAME|--all --backend cuda|sim --out DIR": Case((RECORD_SIM,)),
    "decode-lab record --all --backend cuda --out OUT --archive OUT.tar.gz": Case(gpu_only=True),
    "decode-lab record --all --backend cuda --out OUT --archive OUT.tar.gz --resume":
        Case(gpu_only=True),
    "decode-lab record costs overlap --backend cuda --out OUT": Case(gpu_only=True),
    "decode-lab record instances --backend sim --out /tmp/rec --quick": Case((RECORD_SIM,)),
    "decode-lab record": Case(mention=True),
    "decode-lab --help": Case(),
    "decode-lab COMMAND --help": Case(),
}


# ------------------------------------------------------------------ parsing the shown form

PLACEHOLDER = {"N": "8", "NAME": "instances", "DIR": "OUT"}


def shown_variants(shown: str) -> list[list[str]]:
    """The argv lists a shown line stands for: its optional [...] parts included, each of its
    a|b|c alternatives in turn, N/NAME/DIR as an example value, COMMAND as every subcommand."""
    words = shlex.split(shown)
    words = words[3:] if words[:3] == ["python", "-m", "lab"] else words[1:]
    choices = []
    for w in words:
        w = w.strip("[]")
        if w == "COMMAND":
            choices.append(sorted(_subcommands()))
        elif "|" in w:
            choices.append([PLACEHOLDER.get(a, a) for a in w.split("|")])
        else:
            choices.append([PLACEHOLDER.get(w, w)])
    return [list(v) for v in itertools.product(*choices)]


def _subcommands() -> list[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "cmd")
    return list(sub.choices)


def _parses(argv: list[str], capsys) -> None:
    try:
        build_parser().parse_args(argv)
    except SystemExit as exc:
        out, err = capsys.readouterr()
        assert exc.code == 0 and "--help" in argv, f"{argv}: exit {exc.code}: {err.strip()}"


# ------------------------------------------------------------------ running, once per command

_RUNS: dict = {}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("readme")


@contextlib.contextmanager
def _environment(env: dict):
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run(r: Run, workdir: Path) -> tuple[int, str, str]:
    """`main(argv)` under the run's environment (and a state folder and HOME of the test's):
    (exit code, stdout, stderr), computed once per argv and environment."""
    argv = [a.replace(TMP, str(workdir)) for a in r.argv]
    key = (tuple(argv), tuple(sorted(r.env.items())))
    if key not in _RUNS:
        env = {"DECODE_LAB_STATE": str(workdir / "state"), "HOME": str(workdir / "home"), **r.env}
        out, err = io.StringIO(), io.StringIO()
        with _environment(env), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv)
        _RUNS[key] = (code, out.getvalue(), err.getvalue())
    return _RUNS[key]


# ------------------------------------------------------------------ the tests


def test_every_shown_command_has_a_case():
    shown = shown_commands()
    missing = {s: page for s, page in shown.items() if s not in CASES}
    stale = sorted(set(CASES) - set(shown))
    assert not missing, f"commands shown without a case here (add one): {missing}"
    assert not stale, f"cases for commands no page shows: {stale}"


@pytest.mark.parametrize("shown", sorted(CASES))
def test_the_shown_form_parses(shown, capsys):
    """As written (optional parts in, each alternative), the line is a valid command line."""
    if CASES[shown].mention:
        assert shown_variants(shown)[0][0] in _subcommands()
        return
    for argv in shown_variants(shown):
        _parses(argv, capsys)


RUNS = [(shown, i) for shown, case in sorted(CASES.items()) for i in range(len(case.runs))]


@pytest.mark.parametrize("shown,i", RUNS, ids=[f"{s[:60]}-{i}" for s, i in RUNS])
def test_the_shown_command_runs_as_the_text_says(shown, i, workdir):
    r = CASES[shown].runs[i]
    assert r.argv[0] == shown_variants(shown)[0][0], "the run is of another command"
    code, out, err = run(r, workdir)
    assert code == r.code, f"{r.argv}: exit {code}, not {r.code}: {err.strip()[-500:]}"
    missing = [p for p in r.expect if not re.search(p, out, re.MULTILINE)]
    assert not missing, f"{r.argv}: output lacks {missing}:\n{out[-3000:]}"


def test_bench_json_is_written(workdir):
    shown = "decode-lab bench ab --a LAB_GRAPH=0 --b LAB_GRAPH=1 --reps 5 [--json out.json]"
    code, _, _ = run(CASES[shown].runs[0], workdir)
    assert code == 0 and json.loads((workdir / "out.json").read_text())


def test_gpu_commands_name_registered_experiments():
    """The GPU-only record lines are parsed only; the experiments they name exist."""
    from lab.measure.registry import load
    names = set(load())
    for shown, case in CASES.items():
        if case.gpu_only:
            words = shlex.split(shown)[2:]
            named = [w for w in itertools.takewhile(lambda w: not w.startswith("-"), words)]
            assert set(named) <= names, f"{shown}: {set(named) - names} not registered"


def test_spec_curve_as_shown_passes_its_argument_checks(monkeypatch, workdir):
    """`decode-lab spec --curve` with its defaults gets past every check to the curve itself
    (the curve is not run here: it takes seconds per context)."""
    from lab.measure import spec

    class Reached(BaseException):
        pass

    def reached(*a, **k):
        raise Reached
    monkeypatch.setattr(spec, "curve", reached)
    monkeypatch.setenv("DECODE_LAB_STATE", str(workdir / "state"))
    with pytest.raises(Reached):
        main(["spec", "--curve", *SIM])


# ------------------------------------------------------------------ the README's demo block

TIMING = re.compile(r"\d+\.\d+")


def readme_demo_block() -> list[str]:
    """The README's block after 'python -m lab demo --backend sim` printed', unwrapped (a line
    starting with two spaces continues the one before)."""
    text = README.read_text()
    start = text.index("`python -m lab demo --backend sim`")
    block = text[text.index(FENCE, start) + len(FENCE):]
    block = block[:block.index(FENCE)].strip("\n")
    lines: list[str] = []
    for line in block.splitlines():
        if line.startswith("  ") and lines:
            lines[-1] += " " + line.strip()
        else:
            lines.append(line)
    return lines


def _timing_masked(line: str) -> str:
    """A bill row or the ratio line with its timing figures (ms, us, x) replaced."""
    if re.match(r"^(dispatcher|prebound|graph) ", line) or line.startswith("graph replay:"):
        return TIMING.sub("#", line)
    return line


def test_readme_demo_block_is_what_the_demo_prints(workdir):
    code, out, _ = run(DEMO, workdir)
    assert code == 0
    shown = [_timing_masked(s) for s in readme_demo_block()]
    printed = [_timing_masked(s) for s in out.rstrip("\n").splitlines()]
    assert shown == printed


def test_readme_demo_timing_figures_are_the_simulated_ones(workdir):
    """The simulator is seeded: the README's simulated figures are the ones the demo prints."""
    code, out, _ = run(DEMO, workdir)
    timed = [s for s in out.splitlines() if _timing_masked(s) != s]
    shown = [s for s in readme_demo_block() if _timing_masked(s) != s]
    assert shown == timed


# ------------------------------------------------------------------ make targets

def test_make_targets_named_exist():
    """Each `make X` the README and the docs name is a Makefile target; `make demo` runs the
    demo the README shows."""
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([\w-]+):", makefile, re.MULTILINE))
    named = set()
    for page in [README, *DOCS]:
        named |= set(re.findall(r"(?:^|[\s`])make ([a-z][\w-]*)", page.read_text(), re.MULTILINE))
    assert named and named <= targets, f"not Makefile targets: {named - targets}"
    assert re.search(r"^demo:.*\n\t\$\(PY\) -m lab demo$", makefile, re.MULTILINE)


def test_readme_parameter_count_is_the_weights():
    """The README's "2.7M-parameter" model is the shipped weights, rounded to 0.1 M."""
    import numpy as np
    shown = float(re.search(r"([\d.]+)M-parameter", README.read_text()).group(1))
    with np.load(ROOT / "data" / "tiny_model.npz") as z:
        count = sum(z[k].size for k in z.files)
    assert round(count / 1e6, 1) == shown, f"the weights hold {count} parameters"


def test_the_imports_docs_show_resolve():
    """Each code block of docs/ made of `from lab ... import ...` lines runs as shown."""
    blocks = []
    for page in DOCS:
        parts = page.read_text().split(FENCE)[1::2]
        blocks += [(page.name, b.strip()) for b in parts if b.strip().startswith("from lab")]
    assert blocks
    for name, block in blocks:
        code = "\n".join(line.split("#")[0] for line in block.splitlines())
        exec(compile(code, name, "exec"), {})
