"""The capture audit and the lazy-init detector on the clean engine (the bugs have their own
files): what differs between steps is only what decode_plan keys; warm-up leaves nothing."""
from lab.engine.runner import DecodeEngine
from lab.plan import plan_boundaries
from lab.measure.audit import audit, detect_lazy_init


def test_clean_engine_audit_reports_only_plan_keyed_grids(model, sim_cfg):
    rep = audit(DecodeEngine(model, sim_cfg))
    assert not rep.unhandled, rep.summary()
    assert {(v.kernel, v.what, v.verdict) for v in rep.varying} == {("attn_partial", "grid", "capture key")}
    assert len(rep.varying) == model.cfg.n_layer          # one attention launch per layer
    crossed = [b for b in plan_boundaries(model.cfg.max_seq) if b <= rep.positions[-1]]
    assert len(crossed) >= 2
    for v in rep.varying:                                  # one grid per plan met
        assert len(set(v.values.values())) == len(crossed) + 1


def test_audit_classifies_pointer_and_by_value_differences(model, sim_cfg):
    rep = audit(DecodeEngine(model, sim_cfg.replace(bugs={"frozen_kv_row", "ctx_by_value"})))
    kinds = {(v.kind, v.verdict) for v in rep.unhandled}
    assert kinds == {("pointer", "promote to device memory"), ("by value", "promote to device memory")}


def test_detector_after_warm_up_finds_nothing_to_fix(model, sim_cfg):
    rep = detect_lazy_init(model, sim_cfg)
    assert not rep.illegal and set(rep.captures.values()) == {"ok"}
    # warm-up skipped: every kernel compiles inside the first capture -- legal, but reported
    assert rep.kinds() == {"compilation"}
    assert {f.detail for f in rep.findings} >= {"embed", "attn_partial", "advance"}
    assert all(f.legal and f.surfaced_at == "-" for f in rep.findings)


def test_detector_reports_site_and_launch_of_each_init(model, sim_cfg):
    rep = detect_lazy_init(model, sim_cfg.replace(bugs={"lazy_table", "lazy_scratch"}))
    by_kind = {f.kind: f for f in rep.illegal}
    assert by_kind["table upload"].launch_index == 3          # needed by rope_kv_append, layer 0
    assert by_kind["scratch allocation"].launch_index == 4    # needed by attn_partial, layer 0
    assert "grow_scratch" in by_kind["scratch allocation"].site


def test_failed_capture_restores_lazy_state(model, sim_cfg):
    """The lazy table's flag is set before its upload fails inside the capture; the fallback
    must restore it, or the eager re-issue would run with a table that was never uploaded."""
    eng = DecodeEngine(model, sim_cfg.replace(bugs={"lazy_table"}))
    graph, failure = eng.capture(eng.plan(0))
    assert graph is None and "rope_cos" in failure.reason and failure.shown_at == "end_capture"
    assert eng.pieces.lazy["rope_uploaded"] is False
