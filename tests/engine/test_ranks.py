"""LAB_RANKS=2: tensor-parallel decode over two ranks (lab/engine/ranks.py), on simulated devices
(SimRanks) and, marked gpu, on two GPUs with NCCL."""
import dataclasses

import numpy as np
import pytest

from _oracle import logit_tol, stepped_logits
from lab.backend import Collective, Launch
from lab.backend.costmodel import CollectiveCosts
from lab.backend.sim import SimRanks
from lab.config import LabConfig, from_env
from lab.engine.ranks import RankStep, check_divisible, shard
from lab.engine.runner import DecodeEngine, make_engine
from lab.errors import CollectiveError, LabError
from lab.reference import generate as oracle_generate

SIM2 = LabConfig(backend="sim", ranks=2)
PROMPTS = ("ROMEO.\n", "First Citizen:\nBefore we")


def _gen(model, cfg, prompt, n, **kw):
    eng = DecodeEngine(model, cfg, **kw)
    return eng, eng.generate(prompt, n)


# ---- the split ----------------------------------------------------------------------------------
def test_shards_put_back_together_are_the_model(model):
    """Column and row slices of every rank, reassembled, are the model's weights."""
    c, w = model.cfg, model.weights
    s = [shard(model, r, 2) for r in range(2)]
    D = c.d_model
    for i in range(c.n_layer):
        p = f"layers.{i}."
        for k in range(3):   # q, k, v: each rank's rows of each
            got = np.concatenate([s[r][p + "wqkv"][k * D // 2:(k + 1) * D // 2] for r in range(2)])
            assert np.array_equal(got, w[p + "wqkv"][k * D:(k + 1) * D])
        assert np.array_equal(np.hstack([s[r][p + "wo"] for r in range(2)]), w[p + "wo"])
        assert np.array_equal(np.vstack([s[r][p + "w_up"] for r in range(2)]), w[p + "w_up"])
        assert np.array_equal(np.hstack([s[r][p + "w_down"] for r in range(2)]), w[p + "w_down"])
    head = np.vstack([s[r]["lm_head"] for r in range(2)])
    assert np.array_equal(head[:c.vocab_size], w["lm_head"]) and not head[c.vocab_size:].any()


def test_bill_counts_launches_per_rank_and_collectives_per_token(model):
    eng = DecodeEngine(model, SIM2)
    bill = eng.bill(eng.plan(0))
    one = len(DecodeEngine(model, LabConfig(backend="sim"), warm_up=False).step_launches(eng.plan(0)))
    # per layer: the one-GPU step's 8 kernels + the merge (fission: the all-reduce sits between
    # the merge and the projection's sum), so 9; plus embed, final norm, LM head, argmax, advance
    assert bill["launches_per_rank"] == [9 * model.cfg.n_layer + 5] * 2
    assert bill["launches_per_rank"][0] == one + model.cfg.n_layer
    assert bill["collectives_per_token"] == 2 * model.cfg.n_layer + 1
    assert [c.split(" ")[0] for c in bill["collectives"]] == ["all_reduce"] * 8 + ["all_gather"]


# ---- tokens and bits ----------------------------------------------------------------------------
@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("graph", [False, True])
def test_tokens_equal_one_gpu_and_oracle(model, prompt, graph):
    n = 70 - len(prompt)                       # crosses the plan boundaries at 32 and 64
    _, two = _gen(model, SIM2.replace(graph=graph), prompt, n)
    one = DecodeEngine(model, LabConfig(backend="sim")).generate(prompt, n)
    oracle = oracle_generate(model, model.tokenizer.encode(prompt), n)
    assert np.array_equal(two.tokens, one.tokens)
    assert np.array_equal(two.tokens, oracle)


def test_graph_is_byte_identical_to_eager_and_ranks_agree(model):
    out = {}
    for graph in (False, True):
        eng = DecodeEngine(model, SIM2.replace(graph=graph))
        eng.reset(eng.encode(PROMPTS[1]), 50)
        for _ in range(40):
            eng.step()
        out[graph] = (eng.rank_tokens(), eng.logits(0), eng.logits(1))
        assert np.array_equal(out[graph][1], out[graph][2])        # every rank holds the same
        assert np.array_equal(out[graph][0][0], out[graph][0][1])
    assert all(np.array_equal(a, b) for a, b in zip(out[False][1:], out[True][1:]))
    assert np.array_equal(out[False][0][0], out[True][0][0])
    assert eng.ledger_summary() == {"capture": 2, "replay": 38}   # plans at 0 and 32


def test_replay_check_per_rank_across_plan_boundaries(model):
    from lab.measure.replay_check import replay_check
    eng = DecodeEngine(model, SIM2)
    report = replay_check(eng, [PROMPTS[0], PROMPTS[1]], replays=40)
    assert report.ok, report.summary()
    assert report.checks[0].eager.logits.shape[1] == 2 * model.cfg.vocab_size   # both ranks
    assert {e.outcome for c in report.checks for e in c.ledger} == {"capture", "replay"}


class _RawOnRankOne(RankStep):
    """Rank 1 hands its LM head a raw framework array: numba synchronises on it, illegal in a
    capture. Rank 0's step is clean."""

    def items(self, plan):
        for item in super().items(plan):
            if self.rank == 1 and isinstance(item, Launch) and item.name == "matvec" \
                    and item.layer is None:
                W, h, out = item.args
                item = Launch(item.kernel, item.grid, item.block,
                              (W, self.engine.backends[1].raw(h), out), item.layer, item.stream)
            yield item


def test_a_capture_failure_on_one_rank_falls_back_on_all(model):
    eng = DecodeEngine(model, SIM2)
    eng.pieces = [_RawOnRankOne(eng, r) for r in range(2)]
    gen = eng.generate("ROMEO.\n", 12)
    assert np.array_equal(gen.tokens, oracle_generate(model, eng.encode("ROMEO.\n"), 12))
    assert eng.graphs == {} and not any(be.is_capturing() for be in eng.backends)
    assert {e.outcome for e in eng.ledger} == {"fallback"}
    assert "capture failed on a rank" in eng.ledger[0].reason
    assert "array-interface" in eng.capture_failures[eng.plan(0).key].reason


def test_logits_within_the_oracle_tolerance(model):
    """The sum over ranks (x + W0 o0, then + W1 o1) is another order than the one-GPU step's
    x + W o: the logits move by float32 rounding, within the tolerance the oracle tests use."""
    ids, n = model.tokenizer.encode(PROMPTS[1]), 24
    ref_tokens, ref = oracle_generate(model, ids, n, return_logits=True)
    got = stepped_logits(DecodeEngine(model, SIM2), ref_tokens, ids.size, n)
    one = stepped_logits(DecodeEngine(model, LabConfig(backend="sim")), ref_tokens, ids.size, n)
    assert np.all(np.abs(got - ref) <= logit_tol(ref))
    moved = np.abs(got - one).max()
    assert 0 < moved < 1e-4                    # not the one GPU's bits, but close


# ---- collectives: NCCL's semantics on the simulator ----------------------------------------------
def _tiny_group():
    g = SimRanks(2)
    bufs = []
    for r, be in enumerate(g.backends):
        x = be.alloc("x", (4,), np.float32)
        be.upload(x, np.arange(4, dtype=np.float32) + 10 * r)
        half = be.alloc("half", (2,), np.float32)
        bufs.append((be, x, half))
    return g, bufs


def test_all_reduce_all_gather_reduce_scatter_semantics():
    g, bufs = _tiny_group()
    with g.collectives():
        for be, x, half in bufs:
            be.collective(Collective("reduce_scatter", x, half))
    with g.collectives():
        for be, x, half in bufs:
            be.collective(Collective("all_reduce", x, x))
    g.clock()
    total = np.arange(4, dtype=np.float32) * 2 + 10
    for r, (be, x, half) in enumerate(bufs):
        assert np.array_equal(be.download(half), total[2 * r:2 * r + 2])
        assert np.array_equal(be.download(x), total)
    with g.collectives():
        for be, x, half in bufs:
            be.collective(Collective("all_gather", half, x))
    for be, x, half in bufs:
        assert np.array_equal(be.download(x), total)


def test_mismatched_collectives_are_reported_not_hung():
    g, bufs = _tiny_group()
    (b0, x0, _), (b1, x1, h1) = bufs
    b0.collective(Collective("all_reduce", x0, x0, "attention out"))
    b1.collective(Collective("reduce_scatter", x1, h1, "attention out"))
    with pytest.raises(CollectiveError, match=r"collective #0 does not match.*rank 0: all_reduce"
                                              r".*rank 1: reduce_scatter"):
        g.clock()


def test_a_skipped_collective_is_a_reported_deadlock():
    g, bufs = _tiny_group()
    (b0, x0, _), _ = bufs
    b0.collective(Collective("all_reduce", x0, x0, "MLP out"))
    with pytest.raises(CollectiveError, match=r"deadlock: rank 0 waits in collective #0 "
                                              r"\(all_reduce of 4 float32 \(MLP out\)\); rank 1"):
        g.clock()


class _SkipsTheGather(RankStep):
    """Rank 1 leaves out the logits' all-gather: rank 0 waits in it for ever."""

    def gather_logits(self):
        if self.rank == 0:
            yield from super().gather_logits()


def test_a_rank_that_skips_one_deadlocks_in_the_engine(model):
    eng = DecodeEngine(model, SIM2.replace(graph=False))
    eng.pieces = [_SkipsTheGather(eng, r) for r in range(2)]
    assert "collective #8 differs" in eng.collective_order(eng.plan(0))
    eng.reset(eng.encode("ROMEO.\n"), 2)
    eng.step()
    # 3 warm-up collectives (one of each kind), then the step's #3..#10; the gather is #11
    with pytest.raises(CollectiveError, match=r"rank 0 waits in collective #11 \(all_gather"):
        eng.tokens()


def test_collectives_are_graph_nodes_and_cost_their_recorded_time(model):
    slow = CollectiveCosts.from_dict({"source": "test", "graph_us": {"all_reduce": 50.0},
                                      "eager_us": {"all_reduce": 50.0},
                                      "host_call_us": {"all_reduce": 5.0}})
    ms = {}
    for name, cost in (("slow", slow), ("fast", dataclasses.replace(slow, graph_us={"all_reduce": 1.0}))):
        eng = DecodeEngine(model, SIM2, group=SimRanks(2, coll_cost=cost))
        ms[name] = eng.generate("ROMEO.\n", 16).ms_per_token
        g = eng.graphs[eng.plan(0).key]
        assert [x.node_types() for x in g] == [{"kernel": 41, "collective": 9}] * 2
    # 9 collectives per token at 49 us more each, on the critical path of every rank
    assert ms["slow"] - ms["fast"] == pytest.approx(9 * 49e-3, rel=0.02)


# ---- the rank-skew bug ----------------------------------------------------------------------------
def test_rank_skew_right_at_short_context_then_reported(model):
    cfg = SIM2.replace(bugs=frozenset({"rank_skew"}))
    eng = DecodeEngine(model, cfg)
    assert eng.collective_order(eng.plan(40)) is None
    assert "collective #0 differs" in eng.collective_order(eng.plan(64))
    gen = eng.generate("ROMEO.\n", 40)                           # positions < 64: right
    assert np.array_equal(gen.tokens, oracle_generate(model, eng.encode("ROMEO.\n"), 40))
    eng = DecodeEngine(model, cfg)
    with pytest.raises(CollectiveError, match="does not match across ranks.*reduce_scatter"):
        eng.generate("ROMEO.\n", 70)


# ---- bad input -------------------------------------------------------------------------------------
def test_bad_input(model):
    with pytest.raises(LabError, match="LAB_RANKS='3' is not allowed"):
        from_env({"LAB_RANKS": "3"})
    with pytest.raises(LabError, match="LAB_PDL=1 is not built for ranks"):
        LabConfig(ranks=2, pdl=True)
    with pytest.raises(LabError, match="LAB_FUSION=1 is not built for ranks"):
        LabConfig(ranks=2, fusion=True)
    with pytest.raises(LabError, match="needs LAB_RANKS=2"):
        from_env({"LAB_BUG_RANK_SKEW": "1"})
    with pytest.raises(LabError, match="3 attention heads do not split evenly over 2 ranks"):
        check_divisible(dataclasses.replace(model.cfg, n_head=3), 2)
    with pytest.raises(LabError, match="needs 2 devices; the group has 1"):
        DecodeEngine(model, SIM2, group=SimRanks(1))
    assert isinstance(make_engine(model, LabConfig(backend="sim")), DecodeEngine)


def test_one_engine_class_for_one_rank_and_two(model):
    """LAB_RANKS is a step variant plus the devices the engine drives, not another engine."""
    one, two = make_engine(model, LabConfig(backend="sim")), make_engine(model, SIM2)
    assert type(one) is type(two) is DecodeEngine
    assert type(two.pieces[1]) is RankStep and len(two.backends) == 2 and len(one.backends) == 1
    if _two_gpus() is not None:       # one GPU or none: asking for two is a clear error
        with pytest.raises(LabError, match="needs a GPU|needs 2 GPUs, this machine has 1"):
            from lab.backend import make_ranks
            make_ranks(LabConfig(backend="cuda"), 2)


# ---- two GPUs ---------------------------------------------------------------------------------------
def _two_gpus():
    from lab.backend import gpu_status
    usable, why = gpu_status()
    if not usable:
        return why
    import cupy
    n = cupy.cuda.runtime.getDeviceCount()
    return None if n >= 2 else f"this machine has {n} GPU"


@pytest.mark.gpu
def test_two_gpus_tokens_graph_eager_identity_and_skew_refusal():
    """On GPUs 0 and 1 (tests/_two_gpus.py, in a child process with a time limit): tokens equal
    the oracle's, graph == eager bit for bit, both ranks hold the same logits, each rank's graph
    holds the step's kernels and its collectives, and the skew is refused before it is issued."""
    why = _two_gpus()
    if why:
        pytest.skip(f"needs two GPUs: {why}")
    import json
    import subprocess
    import sys
    from pathlib import Path
    child = subprocess.run([sys.executable, str(Path(__file__).resolve().parents[1] / "_two_gpus.py")],
                           capture_output=True, text=True, timeout=150)
    assert child.returncode == 0, child.stderr[-3000:]
    report = json.loads(child.stdout.strip().splitlines()[-1])
    print(report)
    assert report["oracle"] and report["graph_eq_eager"] and report["ranks_agree"], report
    assert report["ledger"] == {"capture": 3, "replay": 66}, report        # plans at 0, 32, 64
    for types in report["node_types"]:
        assert sum(types.values()) >= 41 + 9, types    # NCCL adds its own nodes per collective
    assert "refused before issuing" in report["skew"] and report["skew_position"] == 64, report
