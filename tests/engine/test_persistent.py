"""LAB_PERSISTENT=1: the whole step in one cooperative kernel (kernels/persistent.py,
lab/engine/persistent.py).

Device-free: greedy tokens and logits byte-identical to LAB_FUSION=1's (grid tail) on the
simulator, eager and graph alike and over the plan boundaries; eager == graph byte-identical over
many replays; 1 launch per token in the ledger, the launch log and the bill; the counters as
clean launches leave them (`settled`); the kernel's error word read after a decode (a DeviceFault naming the wait), reported once; every refusal naming its reason, before anything is allocated; the cuda backend's
co-residency refusal on fake occupancy numbers; the cost recorder's rows for the kernel (chains
of [step_persistent, pos_set] at every recorded position, on the simulator); the kernel under
numba's CUDA simulator (slow: a subprocess, kernels.check's op persistent) against its twin and
bit for bit against the fused kernels. The counter protocol under adversarial block orders:
tests/kernels/test_megakernel_protocol.py.
Marked `gpu` (skipped without one): LAB_PERSISTENT=1's tokens and logits equal to
LAB_FUSION=1's (the kernel against its twin on the device: tests/kernels/test_megakernel_protocol.py).
"""
from pathlib import Path

import numpy as np
import pytest

from kernels import check, persistent
from lab.backend.cuda import cooperative_limit, cooperative_refusal
from lab.backend.instrument import launch_bill
from lab.bugspec import BUGS
from lab.config import LabConfig, from_env
from lab.engine import bugs
from lab.engine.persistent import PersistentStep, launch_geometry, variant_step
from lab.engine.runner import DecodeEngine
from lab.errors import LabError
from lab.measure.audit import audit, detect_lazy_init
from lab.measure.replay_check import decode_after_prompt, replay_check

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "ROMEO.\n"
SIM = LabConfig(backend="sim")
PERSIST = SIM.replace(persistent=True)
FUSED = SIM.replace(fusion=True)   # the persistent step runs the grid tail (the default)
N = 72                        # crosses the plans at positions 32 and 64


def _settled(eng, model) -> bool:
    c = model.cfg
    adds = persistent.launch_adds(c.n_layer, c.d_model, c.d_ff, c.vocab_size, c.n_head,
                                  c.head_dim)
    word = eng.backend.download(eng.devices[0].persistent.counter)
    return word[persistent.SLOT_ERR] == 0 and persistent.settled(word, adds)


def _decoded(model, cfg, steps=N):
    eng = DecodeEngine(model, cfg)
    return eng, decode_after_prompt(eng, model.tokenizer.encode(PROMPT), steps, graph=cfg.graph)[0]


# ---- the fused step's bits, eager and graph ------------------------------------------------------
@pytest.fixture(scope="module")
def fused_run(model):
    return _decoded(model, FUSED.replace(graph=False))[1]


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_tokens_and_logits_are_the_fused_steps_bytes(model, fused_run, graph):
    eng, run = _decoded(model, PERSIST.replace(graph=graph))
    assert run.tokens.tobytes() == fused_run.tokens.tobytes()
    assert run.logits.tobytes() == fused_run.logits.tobytes()
    assert _settled(eng, model)   # every count as a whole launch leaves it
    if graph:   # one graph per plan key, each replayed: 3 plans over 72 tokens
        summary = eng.ledger_summary()
        assert summary.get("capture") == 3 and summary["replay"] == len(eng.ledger) - 3 - summary.get("eager", 0)


@pytest.mark.parametrize("name", [n for n in persistent.VARIANTS
                                  if n != persistent.DEFAULT_VARIANT])
def test_a_variant_step_launches_its_own_kernel(model, fused_run, name):
    """variant_step(name): the engine launches step_persistent[name] (one launch a token), the
    fused step's bytes over the plan boundaries in graph replay, the counter as its exit form
    leaves it (the arrive form's zeros)."""
    assert variant_step(persistent.DEFAULT_VARIANT) is PersistentStep
    eng = DecodeEngine(model, PERSIST.replace(graph=True), step=variant_step(name))
    run = decode_after_prompt(eng, model.tokenizer.encode(PROMPT), N, graph=True)[0]
    assert run.tokens.tobytes() == fused_run.tokens.tobytes()
    assert run.logits.tobytes() == fused_run.logits.tobytes()
    assert {x.name for x in eng.step_launches(eng.plan(0))} == {f"step_persistent[{name}]"}
    assert _settled(eng, model)
    if not persistent.VARIANTS[name]["epochs"]:
        assert not eng.backend.download(eng.devices[0].persistent.counter).any()


def test_a_probe_body_is_timing_only_and_says_so():
    """PROBES leave work out: each is a VARIANTS body plus noproj, none is a variant (kernels.check
    holds only variants to the step's bits), and its spec has no twin, so no backend stands in
    for it (the simulator's run of the kernel itself: kernels.check's check_probes)."""
    assert persistent.PROBES and not set(persistent.PROBES) & set(persistent.VARIANTS)
    for name, choice in persistent.PROBES.items():
        assert choice["noproj"] and any({**v, "noproj": True} == choice
                                        for v in persistent.VARIANTS.values()), name
        spec = persistent.variant_spec(name)
        assert spec.name == f"step_persistent[{name}]"
        with pytest.raises(ValueError, match="leaves work out .* runs on a GPU only"):
            spec.twin()
    with pytest.raises(ValueError, match="the probes \\(timing only\\): tails-noproj"):
        persistent.variant_spec("no-such-body")


def test_graph_replays_are_bitwise_eager(model):
    eng = DecodeEngine(model, PERSIST)
    report = replay_check(eng, [PROMPT, "To be, or not to be"], replays=N)
    assert report.ok, report.summary()
    assert all(dict(zip(k[::2], k[1::2]))["persistent"] for k in eng.graphs)
    assert all(g.node_count == 1 for g in eng.graphs.values())


def test_one_launch_per_token(model):
    eng = DecodeEngine(model, PERSIST.replace(graph=False))
    eng.generate(PROMPT, 4)
    launches = eng.step_launches(eng.plan(0))
    assert [x.name for x in launches] == ["step_persistent"]
    assert launches[0].grid == (persistent.SIM_GRID,) and launches[0].block == (128,)
    for step in range(len(eng.ledger)):
        assert [r.kernel for r in eng.log.for_step(step)] == ["step_persistent"]
    bill = launch_bill(eng.log, 0, "eager", 0.1, "simulated")
    assert (bill.launches_per_token, bill.kernels_per_layer, bill.other_kernels) == (1, 0, 1)
    # the plan still chooses the split count: the scratch view's shape, one graph per plan key
    late = eng.step_launches(eng.plan(100))[0]
    assert late.args[19].shape == (model.cfg.n_head, eng.plan(100).splits, model.cfg.head_dim)
    assert eng.plan(100).key != eng.plan(0).key and eng.plan(0).key[-2:] == ("persistent", True)


def test_stacked_buffers_and_per_layer_views_share_memory(model):
    eng = DecodeEngine(model, PERSIST.replace(graph=False))
    eng.generate(PROMPT, 3)
    be, pb = eng.backend, eng.devices[0].persistent
    whole = be.download(pb.k_cache)
    for i, view in enumerate(eng.buf.k_cache):
        assert view.shape == (model.cfg.max_seq, model.cfg.d_model)
        assert be.download(view).tobytes() == whole[i].tobytes()
    assert be.download(pb.wqkv)[2].tobytes() == model.weights["layers.2.wqkv"].tobytes()
    assert be.download(pb.w_gu)[1, 1].tobytes() == model.weights["layers.1.w_up"].tobytes()


def test_the_step_freezes_nothing_and_initialises_nothing_lazily(model):
    rep = audit(DecodeEngine(model, PERSIST))
    assert not rep.unhandled, rep.summary()
    assert not detect_lazy_init(model, PERSIST).illegal


def test_compare_holds_it_to_the_fused_step_with_its_evidence():
    from lab.measure import compare as C
    res = C.compare("FUSION=1", "PERSISTENT=1", tokens=8, base=SIM)
    assert res["verdict"]["ok"], res["verdict"]
    checks = {c["claim"]: c for c in res["checks"] if c["side"] == "B"}
    assert checks["LAB_PERSISTENT=1"]["ok"] and "step_persistent x" in checks["LAB_PERSISTENT=1"]["evidence"]
    assert checks["LAB_FUSION=0"]["ok"] is None          # not read: one kernel whatever it says
    a = {c["claim"]: c for c in res["checks"] if c["side"] == "A"}
    assert a["LAB_PERSISTENT=0"]["ok"]


def test_bench_arms_build_their_own_engine(model):
    from lab.measure.arms import pool_key
    assert pool_key(PERSIST) != pool_key(FUSED)
    eng = DecodeEngine(model, FUSED)
    with pytest.raises(LabError, match="persistent change what the engine allocates"):
        eng.cfg = PERSIST


# ---- the cost recorder ------------------------------------------------------------------------------
def test_the_cost_recorder_measures_the_step_at_every_plan_and_position(model, monkeypatch):
    """lab/measure/costfile.py's measure_persistent, on the simulator with short chains:
    a row per recorded position, covering every plan's key of the step, each chain of
    [step_persistent, pos_set(position)] ending at the position it began at, the node time the
    unit's less pos_set's, no PDL of its own; rows the cost model then prices the step from."""
    import json
    from lab.backend.costmodel import COSTS_FILE, CostModel, cost_key
    from lab.plan import plan_boundaries
    from lab.measure import chains as costs_chains
    from lab.measure import costfile as rgc

    def quick(be, items, nodes, pdl, **kw):
        return costs_chains.chain_fit(be, items, nodes, pdl, reps=2, rounds=1, lengths=(2, 3))
    monkeypatch.setattr(rgc, "chain_fit", quick)
    rows, probe = rgc.measure_persistent(model, SIM.replace(graph=False), lambda line: None)
    assert [r["position"] for r in rows] == list(rgc.POSITIONS)
    eng = DecodeEngine(model, PERSIST.replace(graph=False))
    keys = {cost_key(eng.step_launches(eng.plan(p))[0])
            for p in [0, *plan_boundaries(model.cfg.max_seq)]}
    assert {r["key"] for r in rows} == keys
    for r in rows:
        assert r["kernel"] == "step_persistent" and r["instances"] == 1
        assert r["node_us"] == pytest.approx(r["unit_us"] - probe["per_node_us"])
        assert r["node_pdl_us"] == r["node_us"] and r["pos_set_us"] == probe["per_node_us"]
        assert r["splits"] == eng.plan(r["position"]).splits
    data = json.loads(COSTS_FILE.read_text())
    # the simulator's wall clock can put a row below zero (unit minus probe); the cost file's
    # schema refuses a negative node time, so the rows enter it clamped
    clamped = [{**r, "node_us": max(r["node_us"], 0.0), "node_pdl_us": max(r["node_pdl_us"], 0.0)}
               for r in rows]
    data["kernels"] = [r for r in data["kernels"] if r["kernel"] != "step_persistent"] + clamped
    cost = CostModel.from_dict(data)
    (launch,) = eng.step_launches(eng.plan(600))
    assert cost_key(launch) in cost.kernels       # (the times are the simulator's wall clock)
    assert cost.node_us(launch, 601, False) == max(cost.kernels[cost_key(launch)].node(601, False), 0.0)
    assert not cost.misses


# ---- refusals ---------------------------------------------------------------------------------------
REFUSED_TOGGLES = {
    "LAB_FUSION=1": dict(fusion=True), "LAB_SPLIT_COMBINE=1": dict(split_combine=True),
    "LAB_OVERLAP=1": dict(overlap=True), "LAB_PDL=1": dict(pdl=True), "LAB_RANKS=2": dict(ranks=2),
    "LAB_DRAFT>0": dict(draft=4), "LAB_LOOP=device": dict(loop="device"),
    "LAB_PLAN_SWITCH=update": dict(plan_switch="update"),
}
WORKS = {"lazy_table", "lazy_scratch", "step_key"}     # host work and the graph key: still there


@pytest.mark.parametrize("var", sorted(REFUSED_TOGGLES))
def test_a_toggle_it_cannot_combine_with_is_refused_with_the_reason(var):
    with pytest.raises(LabError, match=f"LAB_PERSISTENT=1 .*: {var.replace('>', '.')} cannot "
                                       f"combine with it \\(.+\\)"):
        PERSIST.replace(**REFUSED_TOGGLES[var])


def test_every_one_gpu_bug_works_or_is_refused_naming_the_piece(model):
    assert WORKS | set(bugs.refusals(BUGS, PersistentStep)) == set(BUGS)
    for name in sorted(set(BUGS) - WORKS):
        with pytest.raises(LabError, match=f"{BUGS[name].env}=1 cannot combine with it \\(it "
                                           f"overrides `"):
            from_env({"LAB_PERSISTENT": "1", BUGS[name].env: "1"})
    for name in sorted(WORKS):
        eng = DecodeEngine(model, PERSIST.replace(bugs={name}), warm_up=False)
        assert isinstance(eng.pieces, PersistentStep)


def test_lazy_table_under_persistent_falls_back_and_keeps_the_tokens(model):
    """The upload inside the first capture fails; the lazy-init detector names it at the one
    kernel; the eager fallback keeps the tokens (the fused step's). (The capture audit also
    lists the upload, as a host write before the step: here no launch comes before it.)"""
    bcfg = PERSIST.replace(bugs={"lazy_table"})
    lazy = detect_lazy_init(model, bcfg)
    (f,) = [f for f in lazy.illegal if f.kind == "table upload"]
    assert f.kernel == "step_persistent" and f.surfaced_at == "end_capture"
    gen = DecodeEngine(model, bcfg).generate(PROMPT, 20)
    np.testing.assert_array_equal(gen.tokens, DecodeEngine(model, FUSED).generate(PROMPT, 20).tokens)


def test_refused_before_anything_is_allocated(model):
    class NoCoop:                    # a backend whose device co-schedules no block of it
        def __init__(self, why, blocks):
            self.why, self.blocks = why, blocks

        def cooperative_limits(self, kernel, threads):
            return 132, self.blocks, self.why

        def alloc(self, *a, **k):
            raise AssertionError("allocated before refusing")
    with pytest.raises(LabError, match="LAB_PERSISTENT=1 refused on this device: .*does not support"):
        launch_geometry(NoCoop(cooperative_refusal("step_persistent", 1, 512, 4, False), 4), model.cfg)
    with pytest.raises(LabError, match="cannot hold one block"):
        launch_geometry(NoCoop("", 0), model.cfg)
    assert launch_geometry(NoCoop("", 66), model.cfg) == ((66,), (128,))    # capped: co-resident
    assert launch_geometry(NoCoop("", 528), model.cfg) == ((132,), (128,))  # one block per SM


def test_cooperative_refusal_on_fake_occupancy():
    class Overload:
        def __init__(self, coop, per_sm):
            self.cooperative, self.per_sm = coop, per_sm

        def max_cooperative_grid_blocks(self, threads):
            return self.per_sm * 132 if threads <= 512 else 0

    class Disp:
        def __init__(self, *overloads):
            self.overloads = dict(enumerate(overloads))
    assert cooperative_limit(Disp(Overload(False, 4)), 512) is None        # not cooperative
    assert cooperative_limit(Disp(Overload(True, 1), Overload(True, 2)), 512) == 132   # the fewest
    assert cooperative_refusal("k", 132, 512, 132, True) is None
    why = cooperative_refusal("k", 133, 512, 132, True)
    assert why and "133 blocks of 512 threads co-resident" in why and "at most 132" in why
    assert "does not support" in cooperative_refusal("k", 1, 512, 132, False)


def test_persistent_geometry_limits():
    assert persistent.persistent_geometry(64, 132, 528) == ((132,), (128,))
    with pytest.raises(ValueError, match="a block of 128 threads"):
        persistent.persistent_geometry(64, 132, 528, threads=512)     # attn_partial's 4 warps
    with pytest.raises(ValueError, match="even head_dim"):
        persistent.persistent_geometry(256, 132, 528)
    assert persistent.waits_per_token(4) == 20 and persistent.phase_count(4) == 22   # arrive
    assert persistent.waits_per_token(4, epochs=True) == 21


def test_the_error_word_is_read_after_the_decode_and_reported_once(model):
    """A wait that gave up leaves its code in the counter's error word; the host reads it once
    the decode's steps are done (never inside a step), zeroes the counter and raises a
    DeviceFault naming the wait; the next request decodes the fused step's tokens."""
    from lab.errors import DeviceFault
    eng = DecodeEngine(model, PERSIST)
    ids = model.tokenizer.encode(PROMPT)
    eng.reset(ids, 4)
    counter = eng.devices[0].persistent.counter
    word = np.zeros(persistent.counter_slots(model.cfg.n_head), np.int32)
    word[persistent.SLOT_ERR] = persistent.wait_code(1, 3, 0)
    eng.backend.upload(counter, word)
    with pytest.raises(DeviceFault, match=r"layer 1: mlp up waits for x: every output-projection "
                                          r"row\).*read after the decode"):
        eng.decode(ids.size - 1 + 2)
    assert not eng.backend.download(counter).any()          # the host's reset
    gen = eng.generate(PROMPT, 8)
    assert _settled(eng, model)
    np.testing.assert_array_equal(gen.tokens, DecodeEngine(model, FUSED).generate(PROMPT, 8).tokens)
    assert persistent.describe_wait(persistent.wait_code(2, 1, 3)) == \
        "layer 2: attention waits for head 3's q, k and v rows"
    assert persistent.describe_wait(persistent.wait_code(4, persistent.PHASE_LM, 0)).startswith(
        "the LM head waits")


def test_the_toggle_reads_and_rejects():
    assert from_env({"LAB_PERSISTENT": "1"}).persistent is True and from_env({}).persistent is False
    with pytest.raises(LabError, match="LAB_PERSISTENT='2' is not allowed; use one of 0, 1"):
        from_env({"LAB_PERSISTENT": "2"})


# ---- the kernel under numba's CUDA simulator, and on a GPU ----------------------------------------
@pytest.mark.slow
def test_kernel_under_cudasim_is_its_twin_and_the_fused_kernels_bits():
    """One block (the simulator runs blocks one after another: a wait for a later block would
    never be met), 1 layer at tiny dims (2 on a GPU): against the twin, bit for bit against embed
    + the fused kernels (grid tail) run one after another, the stamped form, every variant's
    bits, every probe's clean counts and its x not the step's, the timeout path (kernels.check's
    op persistent)."""
    res = check.run(["persistent"], "cudasim")
    assert res["ok"] and res["mode"] == "cudasim trees", res["ops"]["persistent"]["error"]


@pytest.mark.gpu
def test_gpu_tokens_and_logits_equal_the_fused_steps(model):
    base = _decoded(model, LabConfig(backend="cuda", fusion=True, graph=False))[1]
    for graph in (False, True):
        eng, run = _decoded(model, LabConfig(backend="cuda", persistent=True, graph=graph))
        assert run.tokens.tobytes() == base.tokens.tobytes(), graph
        assert run.logits.tobytes() == base.logits.tobytes(), graph
        assert _settled(eng, model)
