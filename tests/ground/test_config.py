import pytest

from lab.config import TOGGLES, LabConfig, from_env
from lab.errors import LabError


def test_defaults_match_the_table():
    cfg = from_env({})
    for var, fld, allowed, default, _ in TOGGLES:
        assert cfg.toggles()[var] == default


def test_from_env_parses_every_toggle():
    cfg = from_env({"LAB_GRAPH": "0", "LAB_SPLIT_COMBINE": "1", "LAB_KV_DTYPE": "float16",
                    "LAB_BACKEND": "sim", "PATH": "/ignored"})
    assert (cfg.graph, cfg.split_combine, cfg.kv_dtype, cfg.backend) == (False, True, "float16", "sim")


@pytest.mark.parametrize("env, needle", [
    ({"LAB_GRAPH": "yes"}, "LAB_GRAPH='yes' is not allowed; use one of 0, 1"),
    ({"LAB_BACKEND": "tpu"}, "LAB_BACKEND='tpu' is not allowed; use one of auto, cuda, sim"),
    ({"LAB_KV_DTYPE": "int8"}, "LAB_KV_DTYPE"),
    ({"LAB_GRAPHS": "1"}, "unknown variable LAB_GRAPHS"),
])
def test_bad_values_name_the_variable(env, needle):
    with pytest.raises(LabError, match=needle.replace("(", r"\(").replace("'", ".")):
        from_env(env)


def test_direct_construction_is_validated_too():
    with pytest.raises(LabError, match="LAB_KV_DTYPE"):
        LabConfig(kv_dtype="bfloat16")
    with pytest.raises(LabError, match="must be a bool"):
        LabConfig(graph="1")


def test_with_toggles_round_trips():
    cfg = LabConfig().with_toggles({"LAB_GRAPH": "0"})
    assert cfg.graph is False and cfg.toggles()["LAB_GRAPH"] == "0"


def test_importing_the_config_imports_nothing_heavy():
    """The config is the ground floor: every CLI call and test process imports it, so it must not
    pull in numba, the step or a backend (a fresh interpreter, since this one has them)."""
    import subprocess
    import sys
    code = ("import sys, lab.config; heavy = sorted(m for m in ('numba', 'lab.engine.step', "
            "'lab.engine.bugs', 'lab.backend', 'kernels') if m in sys.modules); print(heavy); "
            "assert not heavy")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_each_bug_row_lists_the_pieces_its_override_replaces():
    """The refusals are checked from the rows' data (lab/bugspec.py); the rows must say exactly
    which pieces of the step each override class in lab/engine/bugs.py replaces."""
    from lab.engine import bugs
    from lab.engine.ranks import RankSkewStep, RankStep
    from lab.engine.step import Step
    alloc = {"__init__", "__doc__", "__module__", "rebuilt_each_step", "scratch_splits_at_start",
             "tables_at_start_up"}   # how the engine allocates and issues, not a token-path piece
    for name, bug in bugs.BUGS.items():
        pieces = (set(vars(bugs.OVERRIDES[name])) & set(vars(Step))) - alloc
        assert set(bug.overrides) == pieces, name
    assert set(bugs.RANK_BUGS["rank_skew"].overrides) == (
        set(vars(RankSkewStep)) & set(vars(RankStep))) - alloc


def test_the_cli_help_imports_nothing_heavy():
    """`decode-lab --help` (its parser includes every subcommand's arguments) answers without
    numba or the engine: the heavy imports happen when a command runs."""
    import subprocess
    import sys
    code = ("import sys, runpy; sys.argv = ['decode-lab', '--help']\n"
            "try:\n    runpy.run_module('lab', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "heavy = sorted(m for m in ('numba', 'lab.engine.runner', 'lab.measure.bench', "
            "'lab.engine.step') if m in sys.modules)\nassert not heavy, heavy")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and "usage: decode-lab" in out.stdout, out.stdout + out.stderr


def test_attn_tail_heads_needs_the_fused_step():
    """LAB_ATTN_TAIL picks the fused attention's tail: `heads` without LAB_FUSION=1 (or the
    persistent step, which runs it) is refused naming why; `grid`, the default, is inert there."""
    with pytest.raises(LabError, match="LAB_ATTN_TAIL=heads chooses the fused attention's tail"):
        from_env({"LAB_ATTN_TAIL": "heads"})
    with pytest.raises(LabError, match="LAB_ATTN_TAIL='rows' is not allowed; use one of grid, heads"):
        from_env({"LAB_ATTN_TAIL": "rows"})
    assert from_env({"LAB_ATTN_TAIL": "heads", "LAB_FUSION": "1"}).attn_tail == "heads"
    assert from_env({"LAB_ATTN_TAIL": "heads", "LAB_PERSISTENT": "1"}).persistent
    assert from_env({}).attn_tail == "grid"


def test_only_the_config_reads_the_environment():
    """os.environ (and os.getenv) appear in lab/ only in lab/config.py, the one reader."""
    import re
    from pathlib import Path
    lab = Path(__file__).resolve().parents[2] / "lab"
    readers = sorted(str(p.relative_to(lab)) for p in lab.rglob("*.py")
                     if p.name != "config.py" or p.parent != lab
                     if re.search(r"\bos\.(environ|getenv)\b|\bgetenv\(|from os import", p.read_text()))
    assert readers == [], readers
