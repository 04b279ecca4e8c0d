"""Hazards that change data on the simulator: queued work runs in an order chosen adversarially
among those its dependencies allow, so a missing dependency gives WRONG TOKENS (as a race would
on a GPU) instead of staying invisible, while every correct step stays byte-identical."""
import itertools

import numpy as np
import pytest

from lab.backend import StreamWait
from lab.backend.sim import SimBackend
from lab.config import LabConfig
from lab.engine.runner import DecodeEngine
from lab.engine.step import Step
from lab.errors import LabError

PROMPT = "ROMEO.\n"
SIM = LabConfig(backend="sim")
FACTORS = ("graph", "pdl", "overlap", "split_combine")
ORDERS = [("adversarial", 0)] + [("random", seed) for seed in (1, 2, 3)]


def _gen(model, cfg, order="adversarial", seed=0, n=24, step=Step):
    eng = DecodeEngine(model, cfg, backend=SimBackend(seed=seed, order=order), step=step)
    gen = eng.generate(PROMPT, n)
    return gen.tokens, eng.logits(), eng


@pytest.fixture(scope="module")
def reference(model):
    return _gen(model, SIM.replace(graph=False), order="issue")[:2]


@pytest.mark.parametrize("order,seed", ORDERS, ids=[f"{o}-{s}" for o, s in ORDERS])
def test_every_correct_toggle_combination_is_byte_identical_in_any_order(model, reference,
                                                                         order, seed):
    tokens, logits = reference
    for bits in itertools.product((False, True), repeat=4):
        cfg = SIM.replace(**dict(zip(FACTORS, bits)))
        t, lg, _ = _gen(model, cfg, order, seed)
        assert t.tobytes() == tokens.tobytes(), (cfg.toggles(), order, seed)
        assert lg.tobytes() == logits.tobytes(), (cfg.toggles(), order, seed)


def test_late_wait_gives_wrong_tokens_under_pdl_only(model, reference):
    tokens, _ = reference
    bug = SIM.replace(bugs={"late_wait"})
    for graph in (False, True):
        t, _, eng = _gen(model, bug.replace(graph=graph, pdl=True))
        assert not np.array_equal(t, tokens), f"graph={graph}: the race must change the tokens"
        assert eng.backend.races
        t, _, _ = _gen(model, bug.replace(graph=graph, pdl=False))
        np.testing.assert_array_equal(t, tokens)       # without PDL the late wait is harmless


def test_late_wait_is_harmless_in_issue_order(model, reference):
    """Run in issue order, the simulator cannot show the race: why the default is adversarial."""
    t, _, eng = _gen(model, SIM.replace(pdl=True, bugs={"late_wait"}), order="issue")
    np.testing.assert_array_equal(t, reference[0])
    assert eng.backend.races                           # reported, but the data never changes


def _without(items, drop):
    return [x for x in items if not (isinstance(x, StreamWait) and (x.src, x.dst) in drop)]


class _NoJoin(Step):
    """The overlap step with its join dropped (rope reads the k/v projection unordered)."""
    drop = {("side", "main")}

    def items(self, plan):
        return iter(_without(list(super().items(plan)), self.drop))


class _NoForkNoJoin(_NoJoin):
    drop = {("side", "main"), ("main", "side")}


class _LateJoin(Step):
    """The join moved to the end of the step: the capture succeeds (the side stream is joined
    back), but rope may run before the k/v projection it reads."""

    def items(self, plan):
        items = _without(list(super().items(plan)), {("side", "main")})
        return iter(items + [StreamWait("side", "main")])


@pytest.mark.parametrize("step", [_NoJoin, _NoForkNoJoin], ids=["no-join", "no-fork-no-join"])
def test_a_dropped_join_gives_wrong_tokens_eagerly(model, reference, step):
    t, _, _ = _gen(model, SIM.replace(graph=False, overlap=True), step=step)
    assert not np.array_equal(t, reference[0])


def test_a_dropped_join_fails_the_capture_and_falls_back(model):
    _, _, eng = _gen(model, SIM.replace(overlap=True), step=_NoJoin)
    assert eng.ledger_summary().get("fallback", 0) > 0
    assert all("not joined" in e.reason or "unjoined" in e.reason
               for e in eng.ledger if e.outcome == "fallback")


def test_a_late_join_captures_and_gives_wrong_tokens(model, reference):
    t, _, eng = _gen(model, SIM.replace(overlap=True), step=_LateJoin)
    assert set(eng.ledger_summary()) <= {"capture", "replay"}
    assert not np.array_equal(t, reference[0])


def test_random_order_is_reproducible_per_seed(model):
    a = _gen(model, SIM.replace(graph=False, overlap=True), "random", 7, step=_NoJoin)[0]
    b = _gen(model, SIM.replace(graph=False, overlap=True), "random", 7, step=_NoJoin)[0]
    np.testing.assert_array_equal(a, b)


def test_unknown_order_is_a_clear_error():
    with pytest.raises(LabError, match="order='fastest' is not allowed"):
        SimBackend(order="fastest")
