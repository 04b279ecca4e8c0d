"""Shared assertions for the one-file-per-bug tests (tests/test_bug_<name>.py)."""
from __future__ import annotations

import numpy as np

from lab.engine.runner import DecodeEngine
from lab.measure.audit import audit, detect_lazy_init
from lab.measure.replay_check import replay_check

PROMPT = "ROMEO.\n"


def clean_tokens(model, cfg, n=40):
    return DecodeEngine(model, cfg.replace(graph=False, bugs=frozenset())).generate(PROMPT, n).tokens


def check_frozen(model, cfg, bug: str, kernel: str, values: set[str]):
    """A frozen-value bug: the audit flags exactly it; 1 replay passes, 3 fail (from replay 2);
    the graph's text differs from the eager text; captures succeed; no lazy init fires."""
    bcfg = cfg.replace(bugs=frozenset({bug}))
    rep = audit(DecodeEngine(model, bcfg))
    flagged = {(v.kernel, v.what) for v in rep.unhandled}
    assert flagged and flagged == {(kernel, w) for w in values}, rep.summary()
    assert all(v.verdict == "promote to device memory" for v in rep.unhandled)
    one = replay_check(DecodeEngine(model, bcfg), [PROMPT], replays=1)
    three = replay_check(DecodeEngine(model, bcfg), [PROMPT], replays=3)
    assert one.ok, one.summary()
    assert not three.ok and three.checks[0].first_mismatch == 2, three.summary()
    eng = DecodeEngine(model, bcfg)
    gen = eng.generate(PROMPT, 40)
    assert set(eng.ledger_summary()) <= {"capture", "replay"}      # the capture itself is fine
    assert not np.array_equal(gen.tokens, clean_tokens(model, cfg))  # ... and the text is wrong
    assert not detect_lazy_init(model, bcfg).illegal


def check_illegal(model, cfg, bug: str, kind: str, reason: str, first_step_fails: bool):
    """An illegal-operation bug: the lazy-init detector flags it; the capture fails; the eager
    fallback keeps the tokens right; the ledger names the cause; the audit sees nothing."""
    bcfg = cfg.replace(bugs=frozenset({bug}))
    lazy = detect_lazy_init(model, bcfg)
    assert kind in {f.kind for f in lazy.illegal}, lazy.summary()
    assert any(o != "ok" for o in lazy.captures.values())
    eng = DecodeEngine(model, bcfg)
    gen = eng.generate(PROMPT, 40)
    np.testing.assert_array_equal(gen.tokens, clean_tokens(model, cfg))
    fallbacks = [e for e in eng.ledger if e.outcome == "fallback"]
    assert fallbacks and all(reason in e.reason for e in fallbacks), [e.reason for e in fallbacks]
    assert (eng.ledger[0].outcome == "fallback") == first_step_fails
    assert not audit(DecodeEngine(model, bcfg)).unhandled
    return lazy


def check_lazy_table(model, cfg, kernel: str):
    """LAB_BUG_LAZY_TABLE on `cfg`: the upload of the RoPE tables inside the first capture fails
    and is swallowed; the detector still names it, at `kernel` (the one that reads the tables),
    and the invalidated capture fails only at end_capture."""
    lazy = check_illegal(model, cfg, "lazy_table", "table upload",
                         "synchronous host-to-device copy into rope_cos", first_step_fails=True)
    (f,) = [f for f in lazy.illegal if f.kind == "table upload"]
    assert f.kernel == kernel and "upload_tables_on_first_use" in f.site
    assert f.surfaced_at == "end_capture" and f.shows_later
