"""The step in named pieces (lab/engine/step.py): each deliberate bug overrides only named pieces of
the clean step, and querying a step (`step_launches`) has no side effects; only issuing it does."""
import numpy as np
import pytest

from lab.backend import Launch
from lab.config import LabConfig
from lab.engine import bugs
from lab.engine.compose import compose_step
from lab.engine.runner import DecodeEngine
from lab.engine.step import HostWork, Step

PROMPT = "ROMEO.\n"
PIECES = {name for name in vars(Step) if not name.startswith("_")} - {"items", "launches"}


@pytest.mark.parametrize("name", list(bugs.BUGS))
def test_each_bug_is_an_override_of_named_pieces(name):
    cls = bugs.OVERRIDES[name]
    assert issubclass(cls, Step)
    own = {k for k in vars(cls) if not k.startswith("_")}
    assert own and own <= PIECES | {"upload_tables_on_first_use", "grow_scratch"}, own
    assert "items" not in own                   # the clean path itself is never rewritten


def test_bugs_override_distinct_pieces_so_any_set_composes():
    seen: dict[str, str] = {}
    for name, cls in bugs.OVERRIDES.items():
        for piece in set(vars(cls)) & PIECES - {"rebuilt_each_step"}:
            assert piece not in seen, f"{name} and {seen[piece]} both override {piece}"
            seen[piece] = name
    sim = LabConfig(backend="sim")
    composed = compose_step(sim.replace(bugs=set(bugs.BUGS)))
    assert composed.rebuilt_each_step and composed.attn_norm_kernel.name == "rmsnorm_late_wait"
    assert compose_step(sim) is Step and not Step.rebuilt_each_step
    assert not compose_step(sim.replace(bugs={"late_wait"})).rebuilt_each_step   # a kernel differs


def _state(eng):
    return (eng.position, len(eng.ledger), len(eng.log.records), len(eng.backend.ops),
            len(eng.graphs), len(eng.issuer.built), dict(eng.pieces.lazy), list(eng.warnings),
            eng.buf.part_o.ptr)


@pytest.mark.parametrize("bug", [None, "lazy_table", "lazy_scratch", "pos_outside_graph",
                                 "frozen_kv_row"])
def test_step_launches_is_a_query(model, sim_cfg, bug):
    eng = DecodeEngine(model, sim_cfg.replace(bugs={bug} if bug else set()))
    eng.reset(eng.encode(PROMPT), 4)
    before = _state(eng)
    for position in (0, 40, 100, 600):                   # plans never issued yet
        launches = eng.step_launches(eng.plan(position))
        assert launches and all(isinstance(x, Launch) for x in launches)
    assert _state(eng) == before                         # no cache, allocation, upload, warning


def test_a_query_before_a_lazy_growth_shows_buffers_not_yet_allocated(model, sim_cfg):
    eng = DecodeEngine(model, sim_cfg.replace(graph=False, bugs={"lazy_scratch"}))
    eng.reset(eng.encode(PROMPT), 4)
    big = eng.plan(600)
    attn = next(x for x in eng.step_launches(big) if x.name == "attn_partial")
    assert attn.args[4].name == "part_o (not yet allocated)" and attn.args[4].ptr == 0
    works = [x for x in eng.pieces.items(big) if isinstance(x, HostWork)]
    assert [w.what for w in works] == [f"grow the attention scratch to {big.splits} splits"] * model.cfg.n_layer
    eng.seek(600)
    eng.step()                                           # issuing runs the host work
    attn = next(x for x in eng.step_launches(big) if x.name == "attn_partial")
    assert attn.args[4].name == "part_o" and attn.args[4].ptr == eng.buf.part_o.ptr != 0


def test_the_clean_step_issues_what_the_query_showed(model, sim_cfg):
    eng = DecodeEngine(model, sim_cfg.replace(graph=False))
    eng.reset(eng.encode(PROMPT), 4)
    shown = eng.step_launches(eng.plan(0))
    issued = []
    real = eng.backend.launch
    eng.backend.launch = lambda launch: (issued.append(launch), real(launch))[1]
    eng.step()
    assert issued == shown                               # same kernels, geometry and buffers
    assert all(a is b for a, b in zip(eng.step_launches(eng.plan(0)), issued))  # now the built ones


class _NoAdvance(Step):
    """A variant for an experiment: the step without its position kernel."""

    def advance(self):
        return []


def test_a_variant_step_composes_with_a_bug(model, sim_cfg):
    eng = DecodeEngine(model, sim_cfg.replace(graph=False, bugs={"ctx_by_value"}), step=_NoAdvance)
    names = [x.name for x in eng.step_launches(eng.plan(0))]
    assert "advance" not in names and "attn_partial_len" in names
    eng.reset(eng.encode(PROMPT), 2)
    eng.step()
    assert eng.device_position() == 0                    # nothing advanced it
    np.testing.assert_array_equal(eng.tokens(1), eng.encode(PROMPT)[:1])


def test_a_dropped_engine_is_freed_without_a_garbage_collection(model, sim_cfg):
    """The engine owns its step; the step refers back weakly, so there is no reference cycle
    and a dropped engine's device memory goes at once (not at the next gc pass)."""
    import gc
    import weakref

    gc.disable()
    try:
        for bugs_on in (set(), {"lazy_scratch"}):
            ref = weakref.ref(DecodeEngine(model, sim_cfg.replace(bugs=bugs_on)))
            assert ref() is None
    finally:
        gc.enable()
