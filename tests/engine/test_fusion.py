"""LAB_FUSION=1: the fused step (lab/engine/step.py FusedStep, kernels/fused.py).

Device-free: at most 19 launches per token (18; 26 with its attention split, LAB_SPLIT_COMBINE=1)
while the unfused step keeps its 37; tokens equal to the float64 oracle and logits within its
float32 tolerance; the fused step no longer the unfused step's bits (the norm folded into the
projections, attention's heads projected apart) but within tolerance of them; the split
attention bit for bit the fused one; graph replays byte-identical to eager; PDL, overlap, split
and every launch toggle byte-identical, in any order the simulator picks; plan keys that keep
fused and unfused graphs apart; every deliberate bug working under fusion or refused with the
reason; the device loop and LAB_PLAN_SWITCH=update; LAB_FUSION=2 refused; the fused kernels
themselves under numba's CUDA simulator (kernels.check's op fused, two subprocesses: the
simulator's reduction trees and the GPU's shuffle path).
Marked `gpu` (skipped without one): the same kernels on the device, fused vs unfused vs the
oracle at the model's dims, graph vs eager bitwise, the split bitwise, PDL / overlap / device
loop with fusion.
"""
import ast
import itertools
from pathlib import Path

import numpy as np
import pytest

import kernels
from _bug_checks import check_illegal, check_lazy_table
from _lockstep import run_lockstep
from _oracle import logit_tol, stepped_logits
from kernels import fused
from kernels.sample import argmax_twin_index
from lab import reference
from lab.backend.costmodel import launch_bytes
from lab.backend.sim import SimBackend
from lab.config import LabConfig, from_env
from lab.engine import bugs
from lab.engine.compose import compose_step
from lab.engine.runner import DecodeEngine
from lab.engine.step import FusedStep, Step
from lab.errors import LabError
from lab.pdl_check import wait_first_violations
from lab.plan import decode_plan, plan_boundaries
from lab.measure.audit import audit, detect_lazy_init
from lab.measure.replay_check import decode_after_prompt, replay_check

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "ROMEO.\n"          # 7 characters: 72 generated tokens cross the plans at 32 and 64
PROMPTS = [PROMPT, "To be, or not to be"]
N_TOKENS = 72
SIM = LabConfig(backend="sim")
FUSED = SIM.replace(fusion=True)
FUSED_KERNELS = ("norm_qkv_rope", "attn_fused", "attn_fused_grid", "norm_swiglu",
                 "norm_lm_head_argmax")


@pytest.fixture(scope="module")
def oracle(model):
    return reference.generate(model, model.tokenizer.encode(PROMPT), N_TOKENS, return_logits=True)


def _decoded(model, cfg, steps=40, backend=None):
    eng = DecodeEngine(model, cfg, backend=backend)
    return decode_after_prompt(eng, model.tokenizer.encode(PROMPT), steps, graph=cfg.graph)[0]


# ---- the launch bill ------------------------------------------------------------------------------
@pytest.mark.parametrize("overlap", [False, True], ids=["one-stream", "overlap"])
def test_fused_step_has_at_most_19_launches_per_token_and_the_unfused_step_37(model, overlap):
    L = model.cfg.n_layer
    for fusion, split, tail, want in ((False, False, "grid", 37 + overlap * L),
                                      (True, False, "grid", 2 + 4 * L + overlap * L),
                                      (True, True, "grid", 2 + 5 * L + overlap * L),
                                      (True, False, "heads", 2 + 4 * L + overlap * L),
                                      (True, True, "heads", 2 + 6 * L + overlap * L)):
        eng = DecodeEngine(model, SIM.replace(fusion=fusion, overlap=overlap, split_combine=split,
                                              attn_tail=tail))
        eng.generate(PROMPT, 2)
        launches = eng.step_launches(eng.plan(0))
        assert len(launches) == want, [x.name for x in launches]
        graph = next(iter(eng.graphs.values()))
        assert graph.node_count == want and graph.node_types() == {"kernel": want}
        per_layer = eng.log.kernels_per_layer(0)
        assert set(per_layer) == {None, *range(L)}
        if fusion:   # the split: attn_partial + attn_combine (grid), three launches (heads)
            assert per_layer[None] == 2
            extra = split * (2 if tail == "heads" else 1)
            assert all(per_layer[i] == 4 + extra + overlap for i in range(L))
    assert 2 + 4 * L <= 19                       # the tiny model: 18 nodes per token


def test_the_fused_step_reads_straight_through(model):
    eng = DecodeEngine(model, FUSED)
    names = [x.name for x in eng.step_launches(eng.plan(0))]
    layer = ["norm_qkv_rope", "attn_fused_grid", "norm_swiglu", "matvec_residual"]
    assert names == ["embed", *layer * model.cfg.n_layer, "norm_lm_head_argmax"]
    assert isinstance(eng.pieces, FusedStep)
    for tail, split_ in (("grid", ["attn_partial", "attn_combine"]),   # its two kinds of block
                         ("heads", ["attn_partial_wide", "attn_merge", "attn_project_heads"])):
        eng.cfg = FUSED.replace(attn_tail=tail)
        one = {"grid": "attn_fused_grid", "heads": "attn_fused"}[tail]
        assert [x.name for x in eng.step_launches(eng.plan(0))] == [
            "embed", *[one if n == "attn_fused_grid" else n for n in layer] * model.cfg.n_layer,
            "norm_lm_head_argmax"]
        eng.cfg = eng.cfg.replace(split_combine=True)    # the phases, each its own launch
        split = ["norm_qkv_rope", *split_, "norm_swiglu", "matvec_residual"]
        assert [x.name for x in eng.step_launches(eng.plan(0))] == [
            "embed", *split * model.cfg.n_layer, "norm_lm_head_argmax"]
    # every piece the fused step lacks is a real piece of the unfused step
    assert set(FusedStep.absent) <= set(vars(Step))


# ---- against the oracle -------------------------------------------------------------------------
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_fused_tokens_equal_the_float64_oracle_across_plan_boundaries(model, oracle, graph):
    ref_tokens, _ = oracle
    crossed = [b for b in plan_boundaries(model.cfg.max_seq) if len(PROMPT) <= b < len(ref_tokens) - 1]
    assert len(crossed) >= 2
    gen = DecodeEngine(model, FUSED.replace(graph=graph)).generate(PROMPT, N_TOKENS)
    np.testing.assert_array_equal(gen.tokens, ref_tokens)
    other = PROMPTS[1]
    want = reference.generate(model, model.tokenizer.encode(other), 40)
    np.testing.assert_array_equal(DecodeEngine(model, FUSED).generate(other, 40).tokens, want)


def test_fused_logits_within_float32_tolerance_of_the_oracle(model, oracle):
    ref_tokens, ref_logits = oracle
    got = stepped_logits(DecodeEngine(model, FUSED.replace(graph=False)), ref_tokens,
                         len(PROMPT), N_TOKENS)
    assert np.all(np.abs(got - ref_logits) <= logit_tol(ref_logits))


def test_on_the_simulator_fused_and_unfused_differ_in_rounding_only(model):
    """The fused twins sum in the fused kernels' association (the norm folded after the dot,
    attention's heads projected apart, then summed), so on the SIMULATOR too the two steps
    write different bits: the same tokens, logits within twice the oracle tolerance."""
    base = _decoded(model, SIM.replace(graph=False))
    arm = _decoded(model, FUSED.replace(graph=False))
    assert arm.tokens.tobytes() == base.tokens.tobytes()
    assert arm.logits.tobytes() != base.logits.tobytes()
    assert np.all(np.abs(arm.logits - base.logits) <= 2 * logit_tol(base.logits))


@pytest.mark.parametrize("tail", ["grid", "heads"])
def test_the_split_fused_attention_is_the_fused_kernel_bit_for_bit(model, tail):
    """LAB_SPLIT_COMBINE=1 under LAB_FUSION=1 runs the fused attention's phases as launches of
    their own, in the same order with the same device functions: the same bytes, eager and
    replayed, across plan boundaries (kernels.check's op fused holds the kernels to it). The
    grid tail's split is attn_partial + attn_combine, the heads tail's attn_fused's three
    phases."""
    fused_cfg = FUSED.replace(attn_tail=tail)
    base = _decoded(model, fused_cfg.replace(graph=False), steps=N_TOKENS)
    split, one = {"grid": ({"attn_partial", "attn_combine"}, "attn_fused_grid"),
                  "heads": ({"attn_partial_wide", "attn_merge", "attn_project_heads"},
                            "attn_fused")}[tail]
    for graph in (False, True):
        eng = DecodeEngine(model, fused_cfg.replace(graph=graph, split_combine=True))
        arm = decode_after_prompt(eng, model.tokenizer.encode(PROMPT), N_TOKENS, graph=graph)[0]
        assert arm.tokens.tobytes() == base.tokens.tobytes(), graph
        assert arm.logits.tobytes() == base.logits.tobytes(), graph
        names = {x.name for x in eng.step_launches(eng.plan(0))}
        assert split <= names and one not in names


def test_the_two_tails_differ_in_rounding_only(model):
    """The grid tail computes attention in the unfused kernels' order (attn_partial's 128-thread
    partials, attn_combine's merge and whole-row Wo dots); the heads tail in its own (512-thread
    partials, per-head projections summed in head order): the same tokens, other bits, logits
    within twice the oracle's tolerance of each other."""
    grid = _decoded(model, FUSED.replace(graph=False), steps=24)
    heads = _decoded(model, FUSED.replace(graph=False, attn_tail="heads"), steps=24)
    assert grid.tokens.tobytes() == heads.tokens.tobytes()
    assert grid.logits.tobytes() != heads.logits.tobytes()
    assert np.all(np.abs(grid.logits - heads.logits) <= 2 * logit_tol(heads.logits))


# ---- graph vs eager, toggles, orders ------------------------------------------------------------
def test_fused_replays_byte_identical_to_eager_across_plans_and_requests(model):
    eng = DecodeEngine(model, FUSED)
    report = replay_check(eng, PROMPTS, replays=N_TOKENS)
    assert report.ok, report.summary()
    assert len({e.plan_key for e in report.checks[0].ledger}) >= 3
    assert all(dict(zip(k[::2], k[1::2]))["fusion"] for k in eng.graphs)


def test_every_launch_toggle_is_byte_identical_under_fusion(model):
    """graph x PDL x overlap x split-combine with fusion on, against the fused all-off arm."""
    base = _decoded(model, FUSED.replace(graph=False))
    for bits in itertools.product((False, True), repeat=4):
        combo = dict(zip(("graph", "pdl", "overlap", "split_combine"), bits))
        arm = _decoded(model, FUSED.replace(**combo))
        assert arm.tokens.tobytes() == base.tokens.tobytes(), combo
        assert arm.logits.tobytes() == base.logits.tobytes(), combo


@pytest.mark.parametrize("order,seed", [("adversarial", 0), ("random", 1), ("random", 2)])
def test_pdl_and_overlap_under_fusion_in_any_order(model, order, seed):
    """The simulator runs queued work in an order the dependencies allow (adversarial: consumers
    first): a missing join or a read before a PDL wait would change the bytes here; with the
    attention split too (its three launches hand part_o and o over through device memory)."""
    base = _decoded(model, FUSED.replace(graph=False), steps=24,
                    backend=SimBackend(order="issue"))
    for graph, split in itertools.product((False, True), repeat=2):
        cfg = FUSED.replace(graph=graph, pdl=True, overlap=True, split_combine=split)
        be = SimBackend(order=order, seed=seed)
        arm = _decoded(model, cfg, steps=24, backend=be)
        assert arm.tokens.tobytes() == base.tokens.tobytes(), (graph, split, order, seed)
        assert arm.logits.tobytes() == base.logits.tobytes(), (graph, split, order, seed)
        assert be.races == []


def test_overlap_under_fusion_is_a_fork_and_join_of_one_kernel(model):
    eng = DecodeEngine(model, FUSED.replace(overlap=True))
    eng.generate(PROMPT, 2)
    graph = next(iter(eng.graphs.values()))
    names = [n.name for n in graph.nodes]
    kv, q, attn = 1, 2, 3                          # embed, then layer 0
    assert names[kv] == names[q] == "norm_qkv_rope" and names[attn] == "attn_fused_grid"
    assert graph.nodes[kv].stream == "side" and graph.nodes[q].stream == "main"
    D = model.cfg.d_model
    assert graph.nodes[kv].grid == fused.qkv_grid(D, 2)[0] and graph.nodes[q].grid == fused.qkv_grid(D, 1)[0]
    assert graph.deps[kv] == (0,) and graph.deps[q] == (0,)     # both wait for embed only
    assert set(graph.deps[attn]) == {kv, q}                      # attention joins the branches


# ---- plan keys, the live switch -----------------------------------------------------------------
def test_plan_keys_keep_fused_and_unfused_graphs_apart(model):
    plain, fused_plan = decode_plan(40, model.cfg, SIM), decode_plan(40, model.cfg, FUSED)
    assert plain.key != fused_plan.key and fused_plan.fusion and not plain.fusion
    assert ("fusion", True, "attn_tail", "grid") == fused_plan.key[-4:]
    heads = decode_plan(40, model.cfg, FUSED.replace(attn_tail="heads"))   # another kernel
    assert heads.key != fused_plan.key and heads.key[-1] == "heads"
    assert plain.key == decode_plan(40, model.cfg, SIM.replace(attn_tail="grid")).key
    # LAB_SPLIT_COMBINE splits the fused attention: another plan key, another graph
    split = decode_plan(40, model.cfg, FUSED.replace(split_combine=True))
    assert split.key != fused_plan.key and split.split_combine and split.fusion
    assert decode_plan(40, model.cfg, SIM.replace(split_combine=True)).split_combine


def test_fusion_switches_on_a_live_engine(model):
    eng = DecodeEngine(model, SIM)
    first = eng.generate(PROMPT, 8)
    eng.cfg = eng.cfg.replace(fusion=True)
    fused_gen = eng.generate(PROMPT, 8)
    eng.cfg = eng.cfg.replace(fusion=False)
    again = eng.generate(PROMPT, 8)
    np.testing.assert_array_equal(fused_gen.tokens, first.tokens)
    np.testing.assert_array_equal(again.tokens, first.tokens)
    counts = sorted(g.node_count for g in eng.graphs.values())
    assert counts == [18, 37]                      # one graph per key, both kept
    assert sum(e.outcome == "capture" for e in eng.ledger) == 2


def test_a_step_variant_must_match_the_fusion_toggle(model):
    class NoAdvance(Step):
        def advance(self):
            return []
    with pytest.raises(LabError, match="variant of the one-op-per-kernel step"):
        DecodeEngine(model, FUSED, step=NoAdvance)

    class MyFused(FusedStep):
        pass
    with pytest.raises(LabError, match="needs LAB_FUSION=1"):
        DecodeEngine(model, SIM, step=MyFused)
    eng = DecodeEngine(model, FUSED, step=MyFused)
    assert type(eng.pieces) is MyFused


# ---- deliberate bugs ----------------------------------------------------------------------------
WORKS = {"lazy_table", "lazy_scratch", "raw_array", "step_key"}
REFUSED = {"frozen_kv_row": "append_kv", "ctx_by_value": "attention",
           "pos_outside_graph": "advance", "late_wait": "attn_norm_kernel",
           "float_ids": "sample_next"}


def test_every_bug_is_either_working_or_refused_under_fusion():
    assert WORKS | set(REFUSED) == set(bugs.BUGS) and not WORKS & set(REFUSED)
    assert set(bugs.refusals(bugs.BUGS, FusedStep)) == set(REFUSED)
    assert bugs.refusals(bugs.BUGS, Step) == {}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_bug_the_fused_step_cannot_have_is_refused_with_the_reason(model, name):
    env = bugs.BUGS[name].env
    why = f"{env}=1 cannot exist in the fused step \\(LAB_FUSION=1\\): it overrides `{REFUSED[name]}`"
    with pytest.raises(LabError, match=why):
        LabConfig(backend="sim", fusion=True, bugs={name})
    with pytest.raises(LabError, match=why):
        from_env({"LAB_FUSION": "1", env: "1"})
    eng = DecodeEngine(model, SIM.replace(bugs={name}))
    with pytest.raises(LabError, match=why):
        eng.cfg = eng.cfg.replace(fusion=True)
    assert not eng.cfg.fusion                      # the engine is left as it was
    with pytest.raises(LabError, match=f"{env}=1 cannot exist in FusedStep"):
        compose_step(SIM.replace(bugs={name}), FusedStep)


def test_lazy_table_under_fusion(model):
    check_lazy_table(model, FUSED, "norm_qkv_rope")


def test_lazy_scratch_under_fusion(model):
    lazy = check_illegal(model, FUSED, "lazy_scratch", "scratch allocation",
                         "allocation of 'part_o'", first_step_fails=False)
    keys = {f.plan_key for f in lazy.illegal}
    assert all(k[1] > 1 for k in keys) and len(keys) >= 2
    assert all("grow_scratch" in f.site for f in lazy.illegal)


def test_raw_array_under_fusion(model):
    lazy = check_illegal(model, FUSED, "raw_array", "array-interface synchronisation", "raw",
                         first_step_fails=True)
    assert {f.kernel for f in lazy.illegal} == {"norm_qkv_rope"}


def test_the_clean_fused_step_freezes_nothing_and_initialises_nothing_lazily(model):
    rep = audit(DecodeEngine(model, FUSED))
    assert not rep.unhandled, rep.summary()
    assert not detect_lazy_init(model, FUSED).illegal


# ---- the device loop and plan switch by update --------------------------------------------------
@pytest.mark.parametrize("toggles", [{}, {"pdl": True}, {"overlap": True}], ids=["plain", "pdl", "overlap"])
def test_device_loop_with_fusion_is_byte_identical_to_the_host_loop(model, toggles):
    n = 70                                          # crosses the plan boundaries at 32 and 64
    host_eng = DecodeEngine(model, FUSED.replace(**toggles))
    host = host_eng.generate(PROMPT, n)
    eng = DecodeEngine(model, FUSED.replace(loop="device", **toggles))
    dev = eng.generate(PROMPT, n)
    assert not eng.warnings, eng.warnings
    np.testing.assert_array_equal(dev.tokens, host.tokens)
    assert eng.logits().tobytes() == host_eng.logits().tobytes()
    assert eng.ledger_summary() == {"device": len(PROMPT) - 1 + n}
    loop = eng.device_loop()
    assert loop.body_node_counts() == [len(eng.step_launches(eng.plan(p)))
                                       for p in [0] + plan_boundaries(model.cfg.max_seq)]
    assert set(loop.body_node_counts()) == {18 + toggles.get("overlap", 0) * model.cfg.n_layer}


def test_plan_switch_by_update_with_fusion(model):
    rec_eng = DecodeEngine(model, FUSED)
    rec = rec_eng.generate(PROMPT, 80)
    eng = DecodeEngine(model, FUSED.replace(plan_switch="update"))
    upd = eng.generate(PROMPT, 80)
    np.testing.assert_array_equal(upd.tokens, rec.tokens)
    assert eng.logits().tobytes() == rec_eng.logits().tobytes()
    crossed = [b for b in plan_boundaries(model.cfg.max_seq) if b < len(PROMPT) - 1 + 80]
    outcomes = [(e.position, e.outcome) for e in eng.ledger if e.outcome != "replay"]
    assert outcomes == [(0, "capture")] + [(b, "update") for b in crossed]
    assert len(eng.graphs) == 1
    # switching fusion on the live graph is a topology change: refused, a graph of its own
    eng.cfg = eng.cfg.replace(fusion=False)
    eng.generate(PROMPT, 4)
    refused = [e for e in eng.ledger if e.reason.startswith("update-refused")]
    assert refused and "topology changed: 37 nodes for 18" in refused[0].reason


def test_compare_holds_the_fused_step_against_the_oracle_with_its_evidence():
    from lab.measure import compare as C
    res = C.compare("reference", "FUSION=1,SPLIT_COMBINE=1", tokens=8, base=SIM)
    assert res["verdict"]["ok"], res["verdict"]
    checks = {c["claim"]: c for c in res["checks"] if c["side"] == "B"}
    assert checks["LAB_FUSION=1"]["ok"] and "rmsnorm x0" in checks["LAB_FUSION=1"]["evidence"]
    split = checks["LAB_SPLIT_COMBINE=1"]                       # the fused attention, split
    assert split["ok"] and "attn_fused_grid x0" in split["evidence"]


@pytest.mark.slow
def test_fused_arm_against_the_oracle_on_the_standard_prompts():
    """Lecture §8-§9: a path that sums in another order is judged by the float64 oracle, with
    decode-lab compare's float32 bar, on the five standard prompts x 256 tokens: mean KL <= 1e-6
    each way, max |Δlogit| <= 1e-3, every fed step's pick the oracle's, and decoding alone
    every greedy id the oracle's -- a flip at an oracle margin under 1e-3 excused, reported."""
    from lab.measure import compare as C
    res = C.compare_prompts("reference", "FUSION=1", C.STANDARD_PROMPTS, 256, base=SIM,
                            thresholds=C.Thresholds(tie_margin=1e-3))
    print(C.format_prompts(res))
    assert res["verdict"]["ok"], C.format_prompts(res)


# ---- the configuration --------------------------------------------------------------------------
def test_lab_fusion_2_is_a_clear_error():
    with pytest.raises(LabError, match="LAB_FUSION='2' is not allowed; use one of 0, 1"):
        from_env({"LAB_FUSION": "2"})
    with pytest.raises(LabError, match="LabConfig.fusion must be a bool"):
        LabConfig(fusion=1)
    assert from_env({}).fusion is False and from_env({"LAB_FUSION": "1"}).fusion is True


# ---- the kernels --------------------------------------------------------------------------------
def test_fused_kernels_follow_the_house_rules():
    """pdl_wait() first; the only atomics in kernels/ are the block counters of kernels/sync.py
    (release_add / acquire_load / acq_rel_add, under arrive_last, which elects the block that
    does the follow-on work, never what it computes, and count_arrival / wait_arrivals, with
    which attn_fused_grid's tail blocks wait for its partial blocks) and the megakernel's error
    word (record_give_up); every fused kernel that has a counter uses it through them; the
    twins leave the counter at 0."""
    assert set(FUSED_KERNELS) <= set(kernels.REGISTRY)
    assert not set(FUSED_KERNELS) & set(wait_first_violations())
    users = set()
    for path in sorted((ROOT / "kernels").glob("*.py")):
        tree = ast.parse(path.read_text())
        for fn in [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]:
            src = ast.unparse(fn)
            if any(isinstance(n, ast.Attribute) and n.attr == "atomic" for n in ast.walk(fn)):
                users.add(f"{path.name}:{fn.name}")
            if "arrive_last(" in src and fn.name != "arrive_last":
                users.add(f"calls:{fn.name}")
    assert users == {"sync.py:release_add", "sync.py:acquire_load", "sync.py:acq_rel_add",
                     "persistent.py:record_give_up",
                     "calls:attn_fused", "calls:attn_fused_grid", "calls:norm_lm_head_argmax",
                     "calls:head_tail",            # the heads tail: attn_fused's
                     "calls:persistent_body", "calls:_make_body"}   # LAB_PERSISTENT=1
    for name in ("attn_fused", "attn_fused_grid", "norm_lm_head_argmax"):
        spec = kernels.REGISTRY[name]
        assert spec.arg_names[-1] == "counter" and len(spec.arg_names) - 1 in spec.writes


def test_attention_threads_follow_the_head_dim():
    assert fused.attention_threads(64) == 512 and fused.attention_grid(4, 8, 64) == ((4, 8), (512,))
    for hd in (2, 6, 8, 48, 96, 128):
        t = fused.attention_threads(hd)
        assert t % 32 == 0 and t % hd == 0 and hd <= t <= fused.ATTN_THREADS
    with pytest.raises(ValueError, match="more than 512 threads"):
        fused.attention_threads(100)               # lcm(32, 100) = 800 threads: no registers
    with pytest.raises(ValueError):
        fused.attention_grid(2, 2, 8, threads=48)  # not whole warps


@pytest.mark.parametrize("tail,name", [("grid", "attn_fused_grid"), ("heads", "attn_fused")])
def test_attn_fused_reads_the_context_rows_like_attn_partial(model, tail, name):
    eng = DecodeEngine(model, FUSED.replace(attn_tail=tail))
    plan = eng.plan(100)
    attn = next(x for x in eng.step_launches(plan) if x.name == name)
    kv_row = model.cfg.d_model * 4
    assert launch_bytes(attn, 101) - launch_bytes(attn, 1) == 2 * 100 * kv_row


# ---- on a GPU -----------------------------------------------------------------------------------
@pytest.mark.gpu
def test_gpu_fused_kernels_match_their_twins():
    """kernels.check's fused op compiled for the device, at tiny and model dims."""
    from kernels import check
    res = check.run(["fused"], "gpu")
    assert res["ok"], res["ops"]["fused"]["error"]


@pytest.mark.gpu
def test_gpu_fused_and_unfused_tokens_equal_the_oracle_and_logits_agree(model, oracle):
    """Fused vs unfused on the GPU: the summation order differs (attention's partials), so the
    logits are held against the float64 oracle with the float32 tolerance (logit_tol), each
    side; both within it, they differ by at most twice it. Tokens are equal to the oracle's."""
    ref_tokens, ref_logits = oracle
    logits = {}
    for fusion in (False, True):
        eng = DecodeEngine(model, LabConfig(backend="cuda", graph=False, fusion=fusion))
        logits[fusion] = stepped_logits(eng, ref_tokens, len(PROMPT), N_TOKENS)
        np.testing.assert_array_equal(eng.tokens(len(ref_tokens)), ref_tokens)
        assert np.all(np.abs(logits[fusion] - ref_logits) <= logit_tol(ref_logits)), fusion
        assert not eng.backend.download(eng.buf.counters).any()    # every counter back to 0
    assert np.all(np.abs(logits[True] - logits[False]) <= 2 * logit_tol(ref_logits))


@pytest.mark.gpu
def test_gpu_fused_arm_against_the_oracle_on_the_standard_prompts():
    """The slow simulator test above with the kernels on the GPU (their own summation order)."""
    from lab.measure import compare as C
    for spec in ("FUSION=1", "FUSION=1,SPLIT_COMBINE=1", "FUSION=1,ATTN_TAIL=heads",
                 "FUSION=1,ATTN_TAIL=heads,SPLIT_COMBINE=1"):
        res = C.compare_prompts("reference", spec, C.STANDARD_PROMPTS, 256,
                                base=LabConfig(backend="cuda"),
                                thresholds=C.Thresholds(tie_margin=1e-3))
        print(C.format_prompts(res))
        assert res["verdict"]["ok"], C.format_prompts(res)


@pytest.mark.gpu
def test_gpu_fused_kernels_in_lockstep_with_their_twins(model):
    """Each fused launch on the GPU and on the simulator, outputs compared, the GPU's copied
    into the simulator so the next launch sees equal inputs (tests/_lockstep.py)."""
    def tokens_by_policy(pos, launch, i, a, b, gpu):
        # the twin picks on ITS logits: a near tie may go the other way; the GPU's pick must be
        # the policy's on the GPU's own logits
        if launch.kernel.arg_names[i] != "tokens":
            return False
        nxt = pos + 1
        if nxt >= gpu.n_prompt:
            want = argmax_twin_index(gpu.backend.download(launch.args[4]))
            assert a[nxt] == want, f"{launch.name} pos {pos}: token {a[nxt]}, want {want}"
        return True
    run_lockstep(model, LabConfig(graph=False, fusion=True), compare=tokens_by_policy)


@pytest.mark.gpu
def test_gpu_fused_graph_replays_are_bitwise_eager(model):
    eng = DecodeEngine(model, LabConfig(backend="cuda", fusion=True))
    report = replay_check(eng, PROMPTS, replays=100)
    assert report.ok, report.summary()
    n = len(eng.step_launches(eng.plan(0)))
    assert n == 18 and all(g.node_count == n for g in eng.graphs.values())
    assert not eng.backend.download(eng.buf.counters).any()


@pytest.mark.gpu
@pytest.mark.parametrize("tail", ["grid", "heads"])
def test_gpu_fused_pdl_overlap_and_split_are_byte_identical(model, tail):
    base = _decoded(model, LabConfig(backend="cuda", fusion=True, attn_tail=tail, graph=False))
    for combo in ({"pdl": True}, {"overlap": True}, {"pdl": True, "overlap": True},
                  {"split_combine": True}, {"split_combine": True, "pdl": True}):
        for graph in (False, True):
            arm = _decoded(model, LabConfig(backend="cuda", fusion=True, attn_tail=tail,
                                            graph=graph, **combo))
            assert arm.tokens.tobytes() == base.tokens.tobytes(), (combo, graph)
            assert arm.logits.tobytes() == base.logits.tobytes(), (combo, graph)


@pytest.mark.gpu
def test_gpu_fused_device_loop_is_byte_identical_to_the_host_loop(model):
    host = DecodeEngine(model, LabConfig(backend="cuda", fusion=True)).generate(PROMPT, 70)
    eng = DecodeEngine(model, LabConfig(backend="cuda", fusion=True, loop="device"))
    dev = eng.generate(PROMPT, 70)
    np.testing.assert_array_equal(dev.tokens, host.tokens)
    assert eng.ledger_summary() == {"device": len(PROMPT) - 1 + 70}
