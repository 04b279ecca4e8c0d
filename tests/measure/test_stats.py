"""The A/A gate's statistics: Student's t without scipy (p-value and critical value, checked
against scipy), and a gate whose critical value follows the reps at hand."""
import math

import numpy as np
import pytest

from lab.measure import stats


@pytest.mark.parametrize("df", [1, 2, 3, 4, 5, 7, 8, 31])
def test_t_p_and_critical_value_match_scipy(df):
    st = pytest.importorskip("scipy.stats")
    for t in (0.0, 0.3, 1.0, 2.5, 3.0, 12.7, 80.0):
        assert stats.t_p(t, df) == pytest.approx(2 * st.t.sf(t, df), abs=1e-12)
        assert stats.t_p(-t, df) == stats.t_p(t, df)
    for alpha in (0.01, 0.05, 0.2):
        assert stats.t_critical(alpha, df) == pytest.approx(st.t.ppf(1 - alpha / 2, df), rel=1e-9)


def test_t_p_edges_and_bad_input():
    assert stats.t_p(math.inf, 3) == 0.0 and math.isnan(stats.t_p(math.nan, 3))
    with pytest.raises(ValueError, match="df must be a positive integer"):
        stats.t_p(1.0, 0)
    with pytest.raises(ValueError, match="alpha must be in"):
        stats.t_critical(0.0, 3)


def test_aa_gate_critical_value_follows_the_reps():
    """The same paired |t| = 5 passes at 2 and 3 reps (critical 63.7, 9.9) and fails at 5 and
    8 (4.6, 3.5): a fixed |t| > 3 would fail 20% of correct A/As at 2 reps and 2% at 8."""
    rng = np.random.default_rng(0)
    for reps, crit in ((2, 63.657), (3, 9.925), (5, 4.604), (8, 3.499)):
        a = rng.normal(1.0, 0.01, reps)
        d = rng.normal(0.0, 1.0, reps)
        d = d - d.mean()
        d = d / (d.std(ddof=1) / math.sqrt(reps))          # sem 1, mean 0
        v = stats.aa_verdict(a, a + (d + 5.0) * 1e-4)        # paired t = 5 exactly
        assert v.t == pytest.approx(5.0) and v.threshold == pytest.approx(crit, abs=1e-3)
        assert (v.alpha, v.df, v.ok) == (stats.AA_ALPHA, reps - 1, crit > 5)
        assert v.p == pytest.approx(stats.t_p(5.0, reps - 1))
        assert set(v.to_dict()) >= {"ok", "t", "diff_ms", "sem_ms", "threshold",
                                    "outputs_identical", "reason"}     # recorded files' keys
    fixed = stats.aa_verdict([1.0, 1.1, 0.9], [1.0, 1.1, 0.9], threshold=3.0)
    assert fixed.threshold == 3.0 and fixed.alpha == pytest.approx(stats.t_p(3.0, 2))
    assert "fixed" in fixed.method
    with pytest.raises(ValueError, match="at least 2 reps"):
        stats.aa_verdict([1.0], [1.0])


def test_timed_steps_hold_the_collector_off_and_never_collect(monkeypatch):
    """A timed run on a device: the collector off inside the window and as it was after, and no
    collection first (a full one walks the recording process's whole heap). Also when the
    window raises, and when the collector was off."""
    import gc
    from types import SimpleNamespace
    from lab.measure import arms

    def no_collect(*_a, **_k):
        raise AssertionError("gc.collect() before a timed run")
    monkeypatch.setattr(gc, "collect", no_collect)
    seen = []

    def decode(steps, fail=False):
        seen.append(gc.isenabled())
        if fail:
            raise RuntimeError("step failed")
        return 0.002 * steps
    eng = SimpleNamespace(backend=SimpleNamespace(simulated=False), decode=decode)
    was = gc.isenabled()
    try:
        gc.enable()
        assert arms._timed_steps(eng, 4) == pytest.approx(2.0) and gc.isenabled()
        eng.decode = lambda steps: decode(steps, fail=True)
        with pytest.raises(RuntimeError, match="step failed"):
            arms._timed_steps(eng, 4)
        assert gc.isenabled()
        gc.disable()
        with stats.collector_off():
            seen.append(gc.isenabled())
        assert not gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()
    assert seen == [False, False, False]
