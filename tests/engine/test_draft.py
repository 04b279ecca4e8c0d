"""Speculative decoding (LAB_DRAFT): the same greedy tokens as one token per step, one graph
replayed for the whole generation, no host read between the steps of a round, eager and graph
byte-identical, the cache never written past; LAB_BUG_SPEC_KEY caught by the ledger; bad
toggle combinations refused in one line."""
import numpy as np
import pytest

from lab.config import LabConfig, from_env
from lab.engine.runner import DecodeEngine
from lab.engine.draft import DraftStep
from lab.errors import LabError
from lab.measure.arms import replay_fraction
from lab.plan import plan_boundaries
from lab.measure.replay_check import never_repeating

PROMPTS = ("ROMEO.\n", "To be, or not to be")
N = 40                     # from a short prompt: crosses the one-token plan boundary at 32


@pytest.fixture(scope="module")
def one_token(model):
    """One token per step's generation of each prompt (LAB_DRAFT=0), shared by the tests."""
    return {p: _gen(model, prompt=p)[0] for p in PROMPTS}


def _gen(model, n=N, prompt=PROMPTS[0], backend="sim", **toggles):
    eng = DecodeEngine(model, LabConfig(backend=backend, **toggles))
    return eng.generate(prompt, n), eng


@pytest.mark.parametrize("k", [2, 4, 8])
def test_drafting_keeps_the_greedy_tokens(model, k, one_token):
    for prompt in PROMPTS:
        one = one_token[prompt]
        spec, eng = _gen(model, prompt=prompt, draft=k)
        np.testing.assert_array_equal(spec.tokens, one.tokens)
        stats = spec.draft
        assert stats["tokens generated"] == N
        # every verify step yields between 1 and k + 1 tokens, so fewer steps than tokens
        # whenever a draft was accepted, never fewer than N / (k + 1)
        assert -(-N // (k + 1)) <= stats["verify steps"] <= N
        assert eng.device_position() == len(prompt) - 1 + N


def test_a_text_that_repeats_itself_is_verified_several_tokens_a_step(model):
    """Prompt lookup pays where the text repeats itself: this prompt's continuation names its
    speakers again and again (2 tokens per verify step, simulated)."""
    prompt = "First Citizen:\nBefore we"
    one, _ = _gen(model, prompt=prompt, n=128)
    spec, _ = _gen(model, prompt=prompt, n=128, draft=4)
    np.testing.assert_array_equal(spec.tokens, one.tokens)
    assert spec.draft["tokens per step"] > 1.8, spec.draft


@pytest.mark.parametrize("k", [4, 8])
def test_the_ngram_drafter_keeps_the_greedy_tokens_and_drafts_what_the_model_writes(
        model, k, one_token):
    """LAB_DRAFTER=ngram: the same tokens, and on these prompts more tokens a verify step than
    prompt lookup (the model writes what its corpus writes; it repeats its prompt less)."""
    for prompt in PROMPTS:
        one = one_token[prompt]
        look, _ = _gen(model, prompt=prompt, draft=k)
        spec, eng = _gen(model, prompt=prompt, draft=k, drafter="ngram")
        np.testing.assert_array_equal(spec.tokens, one.tokens)
        assert spec.draft["tokens generated"] == N
        assert spec.draft["tokens per step"] > look.draft["tokens per step"], (spec.draft,
                                                                              look.draft)
        names = [ln.kernel.name for ln in eng.step_launches(eng.plan())]
        assert names[0] == "draft_ngram" and "draft_lookup" not in names


def test_the_ngram_drafters_table_is_the_corpus_and_changes_allocation(model):
    from lab.engine.draft import corpus_table
    _, eng = _gen(model, n=4, draft=4, drafter="ngram")
    table = eng.backend.download(eng.devices[0].draft.table)
    np.testing.assert_array_equal(table, corpus_table(model.cfg.vocab))
    V = model.cfg.vocab_size
    assert table.shape == (V ** 3, V)
    # the corpus's commonest continuation of "Firs" is "t"
    enc = model.tokenizer.encode
    row = lambda s: int(((enc(s[0])[0] * V + enc(s[1])[0]) * V) + enc(s[2])[0])
    assert model.tokenizer.decode([table[row("Fir"), enc("s")[0]]]) == "t"
    with pytest.raises(LabError, match="drafter"):
        eng.cfg = eng.cfg.replace(drafter="lookup")


def test_one_graph_serves_the_whole_generation(model):
    _, eng = _gen(model, draft=4)
    assert set(eng.graphs) == {eng.plan().key}          # one plan key, whatever the position
    assert eng.ledger_summary() == {"capture": 1, "replay": len(eng.ledger) - 1}
    assert eng.plan().key[-2:] == ("draft", 4)
    assert len(eng.step_launches(eng.plan())) == 2 + 9 * model.cfg.n_layer + 4


def test_the_host_reads_the_position_once_per_round_only(model):
    eng = DecodeEngine(model, LabConfig(backend="sim", draft=4))
    ids = eng.encode(PROMPTS[0])
    eng.reset(ids, N)
    be = eng.backend
    first = len(be.ops)
    eng.decode(ids.size - 1 + N)
    reads = [o for o in be.ops[first:] if o.kind == "download"]
    # a round issues ceil(remaining / 5) steps and reads pos once; the first read is the start
    assert all(o.detail.startswith("pos") for o in reads), [o.detail for o in reads]
    rounds = len(reads) - 1
    steps = len(eng.ledger)
    assert 1 <= rounds < steps / 2, (rounds, steps)
    # no download between two launches of one round: ops between consecutive reads are replays
    kinds = [o.kind for o in be.ops[first:]]
    assert kinds.count("upload") == 1                      # the limit, once


def test_eager_and_graph_are_byte_identical(model):
    eager, e_eng = _gen(model, draft=4, graph=False)
    graph, g_eng = _gen(model, draft=4)
    np.testing.assert_array_equal(eager.tokens, graph.tokens)
    for name in ("logits", "x", "pred", "cols", "stats"):
        a = e_eng.backend.download(getattr(e_eng.draft_buffers, name))
        b = g_eng.backend.download(getattr(g_eng.draft_buffers, name))
        assert a.tobytes() == b.tobytes(), name
    assert e_eng.ledger_summary() == {"eager": len(e_eng.ledger)}


def test_pdl_keeps_the_bytes(model):
    plain, p_eng = _gen(model, draft=4)
    pdl, d_eng = _gen(model, draft=4, pdl=True)
    np.testing.assert_array_equal(pdl.tokens, plain.tokens)
    assert (d_eng.backend.download(d_eng.draft_buffers.logits).tobytes()
            == p_eng.backend.download(p_eng.draft_buffers.logits).tobytes())


def test_generation_up_to_the_end_of_the_cache(model):
    """The last steps draft past max_seq: the step verifies fewer, never writes past the cache,
    and the tokens are still one-token greedy's."""
    c = model.cfg
    prompt = "ROMEO.\n"
    n = c.max_seq - len(prompt)                          # the last position is max_seq - 1
    eng = DecodeEngine(model, LabConfig(backend="sim", draft=8))
    ids = eng.encode(prompt)
    eng.reset(ids)
    eng.seek(c.max_seq - 40)                            # skip most of the way (zeros in the cache)
    one = DecodeEngine(model, LabConfig(backend="sim"))
    one.reset(ids)
    one.seek(c.max_seq - 40)
    one.decode(39)
    eng.decode(39)
    assert eng.device_position() == c.max_seq - 1
    np.testing.assert_array_equal(eng.tokens(c.max_seq), one.tokens(c.max_seq))
    with pytest.raises(LabError, match="max_seq"):
        eng.decode(1)
    del n


def test_spec_key_bug_captures_every_step_and_replays_none(model, one_token):
    clean = one_token[PROMPTS[0]]
    buggy, eng = _gen(model, draft=4, bugs={"spec_key"})
    np.testing.assert_array_equal(buggy.tokens, clean.tokens)        # right tokens: it hides
    outcomes = eng.ledger_summary()
    assert outcomes == {"capture": len(eng.ledger)}
    assert replay_fraction(outcomes) == 0.0
    assert never_repeating(eng.ledger) == {"pos"}
    assert len(eng.graphs) == len(eng.ledger)


@pytest.mark.parametrize("env, words", [
    ({"LAB_DRAFT": "3"}, "LAB_DRAFT='3' is not allowed; use one of 0, 2, 4, 8"),
    ({"LAB_DRAFT": "4", "LAB_FUSION": "1"}, "LAB_FUSION=1 cannot combine with it"),
    ({"LAB_DRAFT": "4", "LAB_RANKS": "2"}, "LAB_RANKS=2 cannot combine with it"),
    ({"LAB_DRAFT": "4", "LAB_LOOP": "device"}, "LAB_LOOP=device cannot combine with it"),
    ({"LAB_DRAFT": "2", "LAB_BUG_FROZEN_KV_ROW": "1"}, "LAB_BUG_FROZEN_KV_ROW=1 cannot combine"),
    ({"LAB_BUG_SPEC_KEY": "1"}, "needs LAB_DRAFT=2, 4 or 8"),
    ({"LAB_DRAFTER": "ngram"}, "LAB_DRAFTER=ngram chooses speculative decoding's drafter: it "
                               "needs LAB_DRAFT=2, 4 or 8"),
    ({"LAB_DRAFT": "4", "LAB_DRAFTER": "bigram"}, "LAB_DRAFTER='bigram' is not allowed; use one "
                                                  "of lookup, ngram"),
    ({"LAB_DRAFT": "4", "LAB_DRAFT_SPLITS": "3"}, "LAB_DRAFT_SPLITS='3' is not allowed"),
    ({"LAB_DRAFT": "16"}, "LAB_DRAFT=16 would verify 17 columns a step: the verify kernels take "
                          "at most MAX_COLS = 9"),
])
def test_bad_toggles_are_refused_in_one_line(env, words):
    with pytest.raises(LabError) as exc:
        from_env(env)
    assert words in str(exc.value) and "\n" not in str(exc.value)


def test_a_draft_length_past_the_verify_kernels_is_refused_before_anything_is_built(model):
    """LAB_DRAFT=16 (17 columns) is refused by LabConfig in one line naming the kernels' limit,
    so no engine, buffer or kernel is half-built for it; the limit is kernels/draft.py's."""
    from kernels.draft import MAX_COLS
    from lab.bugspec import VERIFY_MAX_COLS
    assert VERIFY_MAX_COLS == MAX_COLS
    with pytest.raises(LabError) as exc:
        DecodeEngine(model, LabConfig(backend="sim", draft=16), warm_up=False)
    assert "MAX_COLS = 9" in str(exc.value) and "\n" not in str(exc.value)


def test_draft_changes_allocation_so_a_live_switch_is_refused(model):
    eng = DecodeEngine(model, LabConfig(backend="sim"), warm_up=False)
    with pytest.raises(LabError, match="draft"):
        eng.cfg = eng.cfg.replace(draft=4)


def test_the_split_count_is_fixed_and_names_the_workspace(model):
    one, _ = _gen(model, n=12)
    for s in (1, 64):
        gen, eng = _gen(model, n=12, draft=4, draft_splits=s)
        np.testing.assert_array_equal(gen.tokens, one.tokens)
        assert eng.plan().splits == s and eng.draft_buffers.part_o.shape[2] == s + 1
    assert plan_boundaries(model.cfg.max_seq)          # the one-token step has plan changes ...
    assert {DecodeEngine(model, LabConfig(backend="sim", draft=2), warm_up=False).plan(p).key
            for p in (0, 100, 900)} == {("splits", 16, "split_combine", False, "pdl", False,
                                         "overlap", False, "fusion", False, "draft", 2)}


def test_a_variant_of_the_one_token_step_is_refused(model):
    from lab.engine.step import FusedStep
    with pytest.raises(LabError, match="DraftStep"):
        DecodeEngine(model, LabConfig(backend="sim", draft=2), step=FusedStep, warm_up=False)
    eng = DecodeEngine(model, LabConfig(backend="sim", draft=2), warm_up=False)
    assert isinstance(eng.pieces, DraftStep)


@pytest.mark.gpu
def test_gpu_drafting_keeps_the_tokens_and_graph_equals_eager(model):
    """On a GPU the verify attention runs its softmax in its own order (the products keep
    matvec's bits): drafting's tokens are LAB_DRAFT=0's but where the float64 oracle calls the
    first difference a near-tie (lab.measure.spec.same_tokens' rule), graphs on and off, with
    either drafter."""
    from lab.measure import spec
    for drafter in spec.DRAFTERS:
        for graph in (False, True):
            res = spec.same_tokens(model, 4, prompts=PROMPTS, tokens=N, drafter=drafter,
                                   base=LabConfig(backend="cuda", graph=graph))
            assert res["ok"], spec.format_same(res)
        eager, e = _gen(model, backend="cuda", draft=4, graph=False, drafter=drafter)
        graph, g = _gen(model, backend="cuda", draft=4, drafter=drafter)
        assert (e.backend.download(e.draft_buffers.logits).tobytes()
                == g.backend.download(g.draft_buffers.logits).tobytes())
        assert eager.draft == graph.draft and (eager.tokens == graph.tokens).all()


def test_the_curve_reports_each_arms_replays_and_the_bug_arm_has_none(model):
    from lab.measure import spec
    res = spec.curve(model, drafts=(0, 4), contexts=(40,), new_tokens=16, reps=2,
                     base=LabConfig(backend="sim"), progress=False)
    rows = {r["arm"]: r for r in res["rows"]}
    assert set(rows) == {"draft 0", "draft 4", "draft 4 + LAB_BUG_SPEC_KEY"}
    assert rows["draft 4"]["replay_fraction"] == 1.0          # captured while ingesting the prompt
    assert rows["draft 0"]["replay_fraction"] >= 0.99
    # every rep of the bug arm starts with no graph, as a server's ever-new positions would
    assert rows["draft 4 + LAB_BUG_SPEC_KEY"]["replay_fraction"] == 0.0
    assert rows["draft 4"]["tokens_per_step"] >= 1.0 and rows["draft 0"]["tokens_per_step"] == 1.0
    assert rows["draft 4"]["text"] == rows["draft 4 + LAB_BUG_SPEC_KEY"]["text"]
    assert "context" in spec.format_curve(res) and "simulated" in res["source"]


def test_decode_checks_max_seq_against_the_device_position_not_the_hosts_lower_bound(model):
    """After verify steps issued one by one the host's position counts one per step; decode
    reads the device's before it sets the limit, and refuses a limit past the cache."""
    eng = DecodeEngine(model, LabConfig(backend="sim", draft=8))
    eng.reset(eng.encode("First Citizen:\nBefore we"))
    for _ in range(6):
        eng.step()                       # the prompt's 24 positions: 9 a step
    ahead = eng.device_position() - eng.position
    assert ahead > 0
    steps = model.cfg.max_seq - 1 - eng.position    # fits the host's bound, not the device's
    with pytest.raises(LabError, match="max_seq"):
        eng.decode(steps)


def test_copy_reach_measures_how_far_the_model_follows_the_repeat(model, monkeypatch):
    """copy_reach: the oracle's greedy continuation of the repeating text against the text the
    prompt repeats, character by character. This model parts from the copy within a few
    characters (it does not copy: E stays low on the repeat); a continuation that IS the copy
    reaches every token, and one that parts at character 5 reaches 5."""
    from lab import reference
    from lab.measure import spec
    real = spec.copy_reach(model, "repeating", 32)
    assert real["generated"] != real["copy"] and real["reach"] < 8
    assert real["copy"] == spec.text_prompt(model, "repeating")[32:64]
    for cut, want in ((None, 32), (5, 5)):
        def copying(m, ids, n, cut=cut):
            other = "Z" if cut is None or real["copy"][cut] != "Z" else "Q"   # not the copy's
            text = real["copy"] if cut is None else real["copy"][:cut] + other * (n - cut)
            return np.concatenate([ids, m.tokenizer.encode(text)])
        monkeypatch.setattr(reference, "generate", copying)
        assert spec.copy_reach(model, "repeating", 32)["reach"] == want


def test_the_break_even_verdict_is_the_measured_speed_up_beside_the_rule():
    """A row where E > V but the measured round lost says so (the H200's prose, lookup, k = 8:
    E / V 1.00, speed-up 0.93), not 'pays'; the other three cases read as the rule does."""
    from lab.measure import spec

    def row(speedup, E, V):
        return {"speedup": speedup, "pays": E > V}
    assert spec.verdict(row(1.12, 1.60, 1.37)) == "pays (E > V)"
    assert spec.verdict(row(0.90, 1.28, 1.42)) == "does not pay (E <= V)"
    assert spec.verdict(row(0.93, 1.391, 1.389)) == "does not pay (E > V: the round costs more)"
    assert spec.verdict(row(1.01, 1.30, 1.31)) == "pays (E <= V)"
