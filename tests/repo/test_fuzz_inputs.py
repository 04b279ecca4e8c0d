"""Random input, property-checked with Hypothesis: what a user can hand the lab ends in a result
or in a `LabError` that names the argument or the file, never in another exception, and never
changes a file under data/.

(a) argument lists per subcommand: `build_parser().parse_args`, then the command itself up to
    its run (the run's first heavy call is replaced by a marker, so each example costs
    milliseconds): every argument check the command makes before any work runs, from a folder
    of the test's own, the lab's data paths pointing at the copy of data/;
(b) the data files' loaders, on a copy of data/ in a temporary folder, each file corrupted one
    way at a time (NaN, infinite, negative, empty, a wrong type, unicode, huge numbers, a field
    deleted, a list for an object, a truncated or empty file): `lab.model.load_model` (the
    weights .npz and the description .json, of a small model written in the shipped format:
    the checks are the same, the load milliseconds), `CostModel.load` (kernel_costs.json and
    spec_costs.json beside it), and the recordings `decode-lab conformance` reads (its `run`
    with every lesson judged against the recordings themselves, nothing simulated).
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import hashlib
import io
import json
import math
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from lab.errors import LabError

# one worker runs the module under pytest-xdist: the copy of data/ is made once
pytestmark = pytest.mark.xdist_group("fuzz_inputs")

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "data"
# no shrinking: a failing example is reported as drawn, and a failure costs no extra time; under
# CI (CI set) the examples are derandomized, the same every run: a CI verdict is reproducible,
# while a run at a desk draws new ones
FUZZ = settings(max_examples=25, deadline=None, database=None, print_blob=True,
                derandomize=bool(os.environ.get("CI")),
                phases=(Phase.explicit, Phase.generate),
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large])


class Reached(BaseException):
    """The command got past its checks to its run (raised by the stand-in of the run's first
    heavy call; a BaseException, so that no `except Exception` of the lab takes it)."""


def _reached(*args, **kwargs):
    raise Reached


# ------------------------------------------------------------------ the data folder's state

def snapshot(folder: Path) -> dict:
    """Every file under `folder` and its size, inode and times: a write, a replacement or a new
    file shows (each example's check; `hashes` holds the contents over the module)."""
    out = {}
    for p in folder.rglob("*"):
        if p.is_file():
            s = p.stat()
            out[str(p.relative_to(folder))] = (s.st_size, s.st_ino, s.st_mtime_ns, s.st_ctime_ns)
    return out


def hashes(folder: Path) -> dict:
    """Every file under `folder` and the sha256 of its bytes."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def changed(before: dict, after: dict) -> list[str]:
    return sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))


@pytest.fixture(scope="module")
def repo_data_kept():
    """The repository's own data/ is the same after the module as before it."""
    before = hashes(DATA)
    yield
    assert not changed(before, hashes(DATA)), "a file under the repository's data/ changed"


@pytest.fixture(scope="module")
def data_copy(tmp_path_factory, repo_data_kept):
    """A copy of data/, plus a small model in the shipped format (fuzz_model.npz/.json): the
    loader's checks are the same, and loading it costs milliseconds where the shipped model's
    self-test costs a third of a second."""
    root = tmp_path_factory.mktemp("fuzz")
    shutil.copytree(DATA, root / "data")
    from lab.model import ModelConfig, random_model, sha256_of
    meta = json.loads((DATA / "tiny_model.json").read_text())
    cfg = ModelConfig(vocab=meta["vocab"], d_model=16, n_layer=1, n_head=2, d_ff=32, max_seq=32,
                      rope_theta=meta["rope_theta"], norm_eps=meta["norm_eps"])
    npz = root / "data" / "fuzz_model.npz"
    np.savez(npz, **random_model(cfg).weights)
    small = {**meta, **{f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)},
             "sha256": sha256_of(npz)}
    npz.with_suffix(".json").write_text(json.dumps(small, indent=1))
    before = hashes(root / "data")
    yield root
    assert not changed(before, hashes(root / "data")), "a file under the copy of data/ changed"


# ------------------------------------------------------------------ (b) corrupting a JSON file

def leaf_paths(obj, at=()) -> list[tuple]:
    """Every path into a JSON value (keys and indices), the value itself first."""
    out = [at]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += leaf_paths(v, (*at, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:4]):          # a few entries of a long list are enough
            out += leaf_paths(v, (*at, i))
    return out


VALUES = {
    "nan": math.nan, "infinite": math.inf, "negative": -1.5, "negative int": -3, "zero": 0,
    "huge float": 1e308, "huge int": 10 ** 40, "empty string": "", "unicode": "ünï☃ \u202e",
    "null": None, "true": True, "a number as a string": "12.5", "empty list": [],
    "empty object": {},
}
EDITS = (*VALUES, "deleted", "a list for it", "an object for it")
FILE_EDITS = ("empty file", "not JSON", "truncated", "a list at the top", "binary", "NaN alone")


def edit_json(data, path: tuple, how: str):
    """`data` with the value at `path` replaced as `how` says (or deleted)."""
    data = copy.deepcopy(data)
    if not path:
        return [data] if how == "a list for it" else VALUES.get(how, {"x": data})
    parent = functools.reduce(lambda d, k: d[k], path[:-1], data)
    key = path[-1]
    if how == "deleted":
        del parent[key]
    elif how == "a list for it":
        parent[key] = [parent[key]]
    elif how == "an object for it":
        parent[key] = {"value": parent[key]}
    else:
        parent[key] = VALUES[how]
    return data


def corrupt_text(text: str, how: str) -> bytes:
    return {"empty file": b"", "not JSON": b"{'single': quotes,}",
            "truncated": text.encode()[: max(1, len(text) // 2)],
            "a list at the top": b"[1, 2, 3]", "binary": bytes(range(256)) * 4,
            "NaN alone": b"NaN"}[how]


@st.composite
def json_corruption(draw, files: tuple[str, ...], root: Path):
    """(file, new bytes, what was done) for one file of `files` (relative to `root`)."""
    name = draw(st.sampled_from(files))
    text = (root / name).read_text()
    if draw(st.integers(0, 5)) == 0:                  # the whole file, now and then
        how = draw(st.sampled_from(FILE_EDITS))
        return name, corrupt_text(text, how), how
    data = json.loads(text)
    paths = leaf_paths(data)
    path = paths[draw(st.integers(0, len(paths) - 1))]
    how = draw(st.sampled_from(EDITS))
    new = edit_json(data, path, how)
    return name, json.dumps(new, indent=1).encode(), f"{'.'.join(map(str, path)) or '(top)'}: {how}"


@contextlib.contextmanager
def written(path: Path, content: bytes):
    """`path` holding `content` for the block, its own bytes again after it."""
    old = path.read_bytes() if path.exists() else None
    path.write_bytes(content)
    try:
        yield
    finally:
        if old is None:
            path.unlink()
        else:
            path.write_bytes(old)


def outcome(call, names: tuple[str, ...], folder: Path, what: str):
    """Run `call()`; return (result, None) or (None, why this is not a valid outcome): an
    exception other than a LabError, a LabError that names none of `names`, or a file under
    `folder` that changed."""
    before = snapshot(folder)
    result, problem = None, None
    try:
        result = call()
    except LabError as exc:
        if not any(n in str(exc) for n in names):
            problem = f"{what}: LabError names none of {names}: {exc}"
    except Exception as exc:                                   # noqa: BLE001 - the finding
        problem = f"{what}: {type(exc).__name__}: {exc}"
    moved = changed(before, snapshot(folder))
    if moved:
        problem = f"{what}: changed {moved}"
    return result, problem


# ------------------------------------------------------------------ (b) the loaders

@st.composite
def npz_corruption(draw):
    """(how, arrays or raw bytes) for the small model's .npz: one array made NaN, infinite,
    float64, the wrong shape, empty, or missing; an array added; or the file truncated,
    emptied or replaced by text."""
    how = draw(st.sampled_from(("nan", "infinite", "float64", "shape", "empty", "missing",
                                "extra", "int32", "truncated", "empty file", "text",
                                "object array")))
    index = draw(st.integers(0, 1000))
    fix_checksum = draw(st.booleans())
    return how, index, fix_checksum


def _npz_bytes(npz: Path, how: str, index: int) -> bytes:
    raw = npz.read_bytes()
    if how in ("truncated", "empty file", "text"):
        return {"truncated": raw[: len(raw) // 2], "empty file": b"", "text": b"weights\n"}[how]
    with np.load(npz) as z:
        arrays = {k: z[k] for k in z.files}
    name = sorted(arrays)[index % len(arrays)]
    a = arrays[name]
    if how == "nan":
        a = a.copy(); a.flat[index % a.size] = np.nan
    elif how == "infinite":
        a = a.copy(); a.flat[index % a.size] = -np.inf
    elif how == "float64":
        a = a.astype(np.float64)
    elif how == "int32":
        a = a.astype(np.int32)
    elif how == "shape":
        a = a.reshape(-1)[:-1] if a.size > 1 else np.zeros((2, 2), np.float32)
    elif how == "empty":
        a = np.zeros((0,), np.float32)
    elif how == "extra":
        arrays["unexpected"] = np.zeros(3, np.float32)
    elif how == "object array":
        a = np.array([{"a": 1}], dtype=object)
    if how == "missing":
        del arrays[name]
    else:
        arrays[name] = a
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


@given(st.data())
@FUZZ
def test_the_model_loader_on_a_corrupt_description(data_copy, data):
    from lab.model import load_model
    folder = data_copy / "data"
    name, content, what = data.draw(json_corruption(("fuzz_model.json",), folder))
    with written(folder / name, content):
        _, problem = outcome(lambda: load_model(folder / "fuzz_model.npz"),
                             ("fuzz_model.json", "fuzz_model.npz"), folder, f"{name} {what}")
    assert problem is None, problem


@given(npz_corruption())
@FUZZ
def test_the_model_loader_on_corrupt_weights(data_copy, corruption):
    from lab.model import load_model, sha256_of
    how, index, fix_checksum = corruption
    folder = data_copy / "data"
    npz, meta = folder / "fuzz_model.npz", folder / "fuzz_model.json"
    content = _npz_bytes(npz, how, index)
    description = json.loads(meta.read_text())
    if fix_checksum:                       # past the checksum, to the arrays' own checks
        description["sha256"] = hashlib.sha256(content).hexdigest()
    with written(npz, content), written(meta, json.dumps(description).encode()):
        assert not fix_checksum or sha256_of(npz) == description["sha256"]
        _, problem = outcome(lambda: load_model(npz), ("fuzz_model.npz", "fuzz_model.json"),
                             folder, f"fuzz_model.npz {how} (checksum fixed: {fix_checksum})")
    assert problem is None, problem


COST_FILES = ("gpu/kernel_costs.json", "gpu/spec_costs.json")


@given(st.data())
@FUZZ
def test_the_cost_model_loader(data_copy, data):
    from lab.backend.costmodel import CostModel
    folder = data_copy / "data"
    name, content, what = data.draw(json_corruption(COST_FILES, folder))
    with written(folder / name, content):
        result, problem = outcome(lambda: CostModel.load(folder / "gpu" / "kernel_costs.json"),
                                  (Path(name).name,), folder, f"{name} {what}")
    assert problem is None, problem
    assert result is None or isinstance(result, CostModel)


# the files `decode-lab conformance` reads: its recordings, its findings, the cost files
CONFORMANCE_FILES = tuple(f"gpu/{n}" for n in (
    "ladder.json", "overlap.json", "fission.json", "bench_sweep.json", "device_loop.json",
    "pdl_context.json", "spec.json", "conformance_findings.json", "kernel_costs.json",
    "spec_costs.json"))


@pytest.fixture(scope="module")
def small_model(data_copy):
    from lab.model import load_model
    return load_model(data_copy / "data" / "fuzz_model.npz")


def _dry(table):
    """conformance's `_table` with `dry` always set: each result is its recording."""
    table = getattr(table, "real", table)

    def dry(*args):
        return table(*args[:-1], True)
    dry.real = table
    return dry


@given(st.data())
@FUZZ
def test_the_conformance_loaders(data_copy, small_model, monkeypatch, data):
    """conformance's run, its simulations replaced by the recordings (its own dry pass): each
    recording read, checked and judged; a result's GPU figures are finite numbers."""
    from lab.measure import conformance
    monkeypatch.setattr(conformance, "_table", _dry(conformance._table))
    folder = data_copy / "data"
    name, content, what = data.draw(json_corruption(CONFORMANCE_FILES, folder))
    with written(folder / name, content):
        result, problem = outcome(lambda: conformance.run(small_model, data_dir=folder / "gpu"),
                                  (Path(name).name,), folder, f"{name} {what}")
    assert problem is None, problem
    if result is not None:
        bad = [r.lesson for r in result["rows"] if not (isinstance(r.gpu, (int, float))
                                                       and math.isfinite(r.gpu))]
        assert not bad, f"{name} {what}: rows with no finite GPU figure: {bad}"


# ------------------------------------------------------------------ (a) argument lists


def _subparsers():
    from lab.__main__ import build_parser
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "cmd")
    out = {}
    for name, sp in sub.choices.items():
        nested = [a for a in sp._actions if a.dest == "bench"]
        if nested:
            out.update({f"{name} {n}": p for n, p in nested[0].choices.items()})
        else:
            out[name] = sp
    return out


SUBCOMMANDS = sorted(_subparsers())

# values an argument may be handed: paths are relative to the test's folder, where data/ is the
# copy (the lab reads the copy: its data paths point there for the test)
TEXTS = ("", " ", "ROMEO.", "ünï☃", "x" * 300, "LAB_GRAPH=0", "LAB_GRAPH=1", "GRAPH",
         "GRAPH,PDL", "FUSION=1", "reference", "standard", "64,256", "0", "-1", "1e400", "nan",
         "inf", "3", "instances", "launch_count", "LAB_NOPE=1", "a;b", ",,", "data",
         "data/gpu", "data/tiny_model.npz", "data/tiny_model.json", "data/gpu/ladder.json",
         "data/corpus.txt", "out.json", "plot.png", "plot.xyz", "no/such/folder/x.json",
         "out", "out.tar.gz", ".", "data/../data/tiny_model.npz", "/proc/version")
NUMBERS = ("0", "1", "2", "-5", "3", "1000000000", "99999999999999999999", "nan", "inf",
           "-inf", "1e-9", "2.5", "x")


@st.composite
def argument_list(draw, command: str):
    """A random argument list for `command`: some of its options, in any order, each with a
    value of its kind or any text; positional words too."""
    parser = _subparsers()[command]
    words = command.split()
    options = [a for a in parser._actions if a.option_strings and a.dest != "help"]
    positional = [a for a in parser._actions if not a.option_strings]
    for a in positional:
        choices = tuple(a.choices or ()) + TEXTS
        n = draw(st.integers(0, 2))
        words += [draw(st.sampled_from(choices)) for _ in range(n)]
    for a in draw(st.lists(st.sampled_from(options), max_size=6, unique_by=lambda a: a.dest)):
        words.append(draw(st.sampled_from(a.option_strings)))
        if a.nargs == 0:
            continue
        if a.choices and draw(st.integers(0, 3)):
            pool = tuple(map(str, a.choices))
        elif a.type in (int, float):
            pool = NUMBERS
        else:
            pool = TEXTS
        count = draw(st.integers(1, 2)) if a.nargs == "+" else 1
        words += [draw(st.sampled_from(pool)) for _ in range(count)]
    if draw(st.integers(0, 9)) == 0:
        words.insert(draw(st.integers(len(command.split()), len(words))),
                     draw(st.sampled_from(("--nope", "-x", "--"))))
    return words


_REAL_LOAD = None


@functools.lru_cache(maxsize=8)
def _loaded(path: Path, stamp: tuple):
    return _REAL_LOAD(path)


def _load_once(path=None, verify_checksum=True):
    """lab.model.load_model, each good file loaded once for the module (keyed on its path, size
    and time): the shipped model's self-test takes a third of a second."""
    import lab.model
    p = Path(path if path is not None else lab.model.DEFAULT_WEIGHTS)
    if not p.is_file() or not verify_checksum:
        return _REAL_LOAD(p, verify_checksum)
    s = p.stat()
    return _loaded(p.resolve(), (s.st_size, s.st_mtime_ns))


@pytest.fixture
def sandbox(data_copy, small_model, monkeypatch, tmp_path):
    """Commands run from a folder of their own (relative outputs land there), reading the copy
    of data/, their runs replaced by the Reached marker, the model loaded once per path."""
    import lab.engine.runner as runner
    import lab.files
    import lab.model
    import lab.backend.costmodel as costmodel
    from lab.measure import bench, compare, conformance, registry, spec
    from lab.teach import handson
    global _REAL_LOAD
    _REAL_LOAD = _REAL_LOAD or lab.model.load_model
    work = tmp_path / "work"
    work.mkdir()
    (work / "data").symlink_to(data_copy / "data")
    monkeypatch.chdir(work)
    copy_data = data_copy / "data"
    monkeypatch.setattr(lab.model, "DATA_DIR", copy_data)
    monkeypatch.setattr(lab.model, "DEFAULT_WEIGHTS", copy_data / "tiny_model.npz")
    monkeypatch.setattr(lab.files, "LAB_DATA", copy_data)
    monkeypatch.setattr(costmodel, "COSTS_FILE", copy_data / "gpu" / "kernel_costs.json")
    monkeypatch.setattr(conformance, "DATA_GPU", copy_data / "gpu")
    monkeypatch.setattr(lab.model, "load_model", _load_once)
    for module, name in ((runner, "make_engine"), (bench, "run_ab"), (bench, "run_loo"),
                         (bench, "run_sweep"), (spec, "curve"), (spec, "same_tokens"),
                         (compare, "compare_prompts"), (compare, "compare"),
                         (conformance, "_table"), (registry, "record"), (handson, "check")):
        monkeypatch.setattr(module, name, _reached)
    monkeypatch.setenv("DECODE_LAB_STATE", str(tmp_path / "state"))
    monkeypatch.setenv("DECODE_LAB_STUDENT", "fuzz")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for k in [k for k in os.environ if k.startswith("LAB_")]:
        monkeypatch.delenv(k)
    return work


def names_an_argument(message: str, argv: list[str], command: str) -> bool:
    """Whether a refusal names an argument of the command (given or its default), the command,
    a value given, or a file given."""
    parser = _subparsers()[command]
    named = {o for a in parser._actions for o in a.option_strings} | set(command.split())
    named |= {Path(w).name for w in argv if "/" in w and Path(w).name}
    if any(n in message for n in named):
        return True
    values = [w.strip() for w in argv if w.strip()]     # a value given, as a word of its own
    return any(re.search(rf"(?<![\w.]){re.escape(v)}(?!\w)", message) for v in values)


@pytest.mark.parametrize("command", SUBCOMMANDS)
@given(data=st.data())
@FUZZ
def test_random_arguments(command, sandbox, data):
    from lab.__main__ import main
    argv = data.draw(argument_list(command))
    folder = sandbox / "data"
    before = snapshot(folder.resolve())
    out, err = io.StringIO(), io.StringIO()
    code, parse_error = None, False
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:                  # argparse: a usage error (2) or --help (0)
            code, parse_error = exc.code, True
            assert code in (0, 2), f"{argv}: argparse exit {code}"
        except Reached:
            code = "reached the run"
    moved = changed(before, snapshot(folder.resolve()))
    assert not moved, f"{argv}: changed {moved} under data/"
    text = err.getvalue()
    assert "internal error" not in text, f"{argv}: {text.strip()}"
    assert code in (0, 1, 2, "reached the run"), f"{argv}: exit {code}: {text.strip()}"
    if code == 2 and not parse_error:                      # a LabError: one line naming it
        line = text.split("decode-lab: error:", 1)[1].strip()
        assert names_an_argument(line, argv, command), f"{argv}: the refusal names no argument: {line}"
