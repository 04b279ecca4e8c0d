"""The speculative-decoding kernels' twins (kernels/draft.py, kernels/verify.py) on hand-made
cases, NumPy only (no simulator, no GPU): the drafter's and the acceptance's rules, greedy decoding
with drafts equal to one token per step, and the verify step's column kernels against the
one-token twins and against float64 causal attention. The kernels themselves run against these
twins under numba's CUDA simulator in kernels/check.py (op "spec")."""
import re

import numpy as np
import pytest

from kernels.attention import attn_merge_twin
from kernels.draft import (NGRAM, NGRAM_CONTEXT, accept_twin, draft_lookup_twin, draft_ngram_twin,
                           latest_match)
from lab.engine.draft import ngram_table
from kernels.matvec import matvec_residual_twin, matvec_twin
from kernels.mlp import swiglu_up_twin
from kernels.rmsnorm import rmsnorm_twin
from kernels.rope import rope_kv_append_twin
from kernels import verify as V
from kernels import verify_attention as VA
from kernels.verify_attention import causal_attention64 as causal64

EPS32 = float(np.finfo(np.float32).eps)
I32 = np.int32


def rng():
    return np.random.default_rng(20240921)


def f32(r, *shape, scale=1.0):
    return (r.standard_normal(shape) * scale).astype(np.float32)


def one(v):
    return np.array([v], I32)


# ------------------------------------------------------------------ draft_lookup


def draft(tokens, p, T, n_prompt=0, limit=None, max_seq=32):
    """The drafter's columns for a text `tokens` (known up to p) padded to max_seq with -7."""
    buf = np.full(max_seq, -7, I32)
    buf[:len(tokens)] = tokens
    cols = np.full(T, -99, I32)
    draft_lookup_twin((1,), (128,), buf, one(p), one(n_prompt),
                      one(max_seq - 1 if limit is None else limit), cols)
    return cols.tolist()


def test_draft_takes_the_latest_match():
    # the 3-gram (5, 1, 2) ends at j = 2 (followed by 9) and at j = 6 (followed by 7): the latest
    # wins; its continuation runs 7, 5, 1, 2 and then into the draft itself (cols[1] = 7)
    text = [5, 1, 2, 9, 5, 1, 2, 7, 5, 1, 2]
    assert latest_match(np.array(text, I32), 10) == (3, 6)
    assert draft(text, 10, 6) == [2, 7, 5, 1, 2, 7]


def test_draft_prefers_the_longest_ngram_over_a_later_short_one():
    text = [1, 2, 3, 8, 4, 3, 6, 1, 2, 3]      # '3' last seen at 5 (then 6); (1, 2, 3) at 2 (then 8)
    assert latest_match(np.array(text, I32), 9) == (NGRAM, 2)
    assert draft(text, 9, 3) == [3, 8, 4]
    text = [7, 3, 5, 9, 3, 4, 7, 3]            # no (4, 7, 3) before; (7, 3) at 1 (then 5); '3' at 4
    assert latest_match(np.array(text, I32), 7) == (2, 1)
    assert draft(text, 7, 2) == [3, 5]


def test_draft_continues_a_periodic_loop_into_its_own_drafts():
    text = [9, 1, 2, 3, 1, 2, 3]               # (1, 2, 3) at j = 3: period p - j = 3
    assert draft(text, 6, 8) == [3, 1, 2, 3, 1, 2, 3, 1]
    assert draft([4, 4, 4], 2, 5) == [4, 4, 4, 4, 4]    # period 1, via (4, 4) at j = 1


def test_draft_fallback_repeats_the_current_token():
    assert draft([1, 2, 3, 4], 3, 4) == [4, 4, 4, 4]    # '4' never seen before
    assert draft([6], 0, 3) == [6, 6, 6]                # p = 0: nothing to match


def test_draft_reads_only_known_tokens_and_short_prefixes():
    # p = 1 < NGRAM - 1: only n = 1 can match; tokens past p (here a tempting match) are unknown
    assert draft([3, 9, 3, 9, 3, 9], 1, 4) == [9, 9, 9, 9]
    assert draft([6, 8, 6], 2, 4) == [6, 8, 6, 8]       # '6' at j = 0


def test_draft_prompt_positions_are_forced_and_limit_fills():
    text = [1, 2, 3, 1, 2, 3, 50, 51]         # prompt of 8; p = 5: (1, 2, 3) at j = 2 says 1, 2, 3, ...
    # positions 6, 7 are prompt (50, 51), forced; 8 .. drafted from the match: j + 3 = 5 <= p ->
    # tokens[5] = 3, then cols[j + 4 - p] = cols[1] = 50 (the forced token the loop runs into)
    assert draft(text, 5, 6, n_prompt=8) == [3, 50, 51, 3, 50, 51]
    # positions past limit (here 7) are filled with tokens[p]; the prompt rule does not override it
    assert draft(text, 5, 6, n_prompt=8, limit=7) == [3, 50, 51, 3, 3, 3]
    assert draft(text, 5, 4, n_prompt=8, limit=5) == [3, 3, 3, 3]


# ------------------------------------------------------------------ draft_ngram and its table


def ngram_draft(tokens, p, T, table, n_prompt=0, limit=None, max_seq=32):
    buf = np.full(max_seq, -7, I32)
    buf[:len(tokens)] = tokens
    cols = np.full(T, -99, I32)
    draft_ngram_twin((1,), (1,), buf, one(p), one(n_prompt),
                     one(max_seq - 1 if limit is None else limit), table, cols)
    return cols.tolist()


def successor_table(V):
    """A table whose answer is (the context's last token + 1) mod V: drafts count up."""
    t = np.zeros((V ** (NGRAM_CONTEXT - 1), V), np.uint8)
    t[:, :] = (np.arange(V) + 1) % V
    return t


def test_ngram_drafts_chain_on_their_own_drafts():
    assert NGRAM_CONTEXT == 4
    assert ngram_draft([2, 3], 1, 5, successor_table(7)) == [3, 4, 5, 6, 0]


def test_ngram_draft_reads_the_whole_context_in_its_order():
    V = 5
    t = np.zeros((V ** 3, V), np.uint8)
    t[((1 * V + 2) * V + 3), 4] = 3       # after 1 2 3 4: 3
    t[((2 * V + 3) * V + 4), 3] = 1       # after 2 3 4 3: 1
    t[((4 * V + 3) * V + 2), 1] = 2       # the reverse order of a context is another row
    assert ngram_draft([0, 1, 2, 3, 4], 4, 4, t) == [4, 3, 1, 0]
    # positions before 0 read as token 0: p = 1, context (0, 0, 2, 3)
    t[((0 * V + 0) * V + 2), 3] = 4
    assert ngram_draft([2, 3], 1, 2, t) == [3, 4]


def test_ngram_draft_forces_prompt_tokens_and_fills_past_limit():
    t = successor_table(60)
    text = [1, 2, 3, 1, 2, 3, 50, 51]
    # positions 6, 7 are prompt (50, 51), forced; they join the context: then 52, 53
    assert ngram_draft(text, 5, 5, t, n_prompt=8) == [3, 50, 51, 52, 53]
    assert ngram_draft(text, 5, 5, t, n_prompt=8, limit=7) == [3, 50, 51, 3, 3]
    assert ngram_draft(text, 5, 3, t, n_prompt=1, limit=5) == [3, 3, 3]


def test_ngram_table_takes_the_most_frequent_successor_and_the_smallest_at_a_tie():
    V = 4
    ids = [0, 1, 2, 3, 1] * 3 + [0, 1, 2, 3, 2] * 2 + [3, 3, 2, 1, 0] + [3, 3, 2, 1, 3]
    t = ngram_table(ids, V)
    assert t.shape == (V ** 3, V) and t.dtype == np.uint8
    row = lambda a, b, c: (a * V + b) * V + c
    assert t[row(0, 1, 2), 3] == 1          # 0 1 2 3 -> 1 three times, -> 2 twice
    assert t[row(3, 2, 1), 0] == 3          # 3 2 1 0 -> 3 once (then the stream runs on)
    assert t[row(3, 3, 2), 1] == 0          # 3 3 2 1 -> 0 once, -> 3 once: the smaller id


def test_ngram_table_backs_off_to_shorter_contexts():
    V = 5                                   # token 4 never occurs
    ids = [1, 2, 0, 0, 1, 2, 0, 3, 3, 3]   # 0 and 3 three times each, 1 and 2 twice
    t = ngram_table(ids, V)
    row = lambda a, b, c: (a * V + b) * V + c
    # (3, 3, 1, 2) never occurs, nor (3, 1, 2); (1, 2) is followed by 0 twice
    assert t[row(3, 3, 1), 2] == 0
    # (1, 1, 0, 3) nor (1, 0, 3) occur; (0, 3) is followed by 3 once
    assert t[row(1, 1, 0), 3] == 3
    # 4 is never a context: the most frequent token of all (0 and 3 tie: the smaller, 0)
    assert t[row(3, 3, 3), 4] == 0
    # seen whole: (0, 1, 2, 0) -> 3, where its shorter (2, 0) says 0 (0 and 3 tie)
    assert t[row(0, 1, 2), 0] == 3 and t[row(2, 0, 3), 3] == 3


@pytest.mark.parametrize("ids, vocab, words", [
    ([0, 1, 2, 3, 4], 300, "1 to 256"),
    ([0, 1, 2], 4, "more than 4 ids"),
    ([0, 1, 2, 5, 1, 1], 4, "[0, 4)"),
])
def test_ngram_table_refuses_what_it_cannot_hold(ids, vocab, words):
    from lab.errors import LabError
    with pytest.raises(LabError, match=re.escape(words)):
        ngram_table(ids, vocab)


# ------------------------------------------------------------------ accept


def run_accept(cols, pred, p, n_prompt, limit, max_seq=16, stats=(0, 0)):
    tokens = np.arange(max_seq, dtype=I32) + 100          # recognisable untouched values
    pos, st = one(p), np.array(stats, I32)
    accept_twin((1,), (1,), np.array(cols, I32), np.array(pred, I32), pos, one(n_prompt),
                one(limit), tokens, st)
    return tokens, int(pos[0]), st.tolist()


def test_accept_all_drafts_and_the_bonus():
    tokens, pos, st = run_accept([0, 7, 8, 9], [7, 8, 9, 4], p=3, n_prompt=2, limit=15)
    assert tokens[4:8].tolist() == [7, 8, 9, 4] and pos == 7 and st == [1, 4]
    assert tokens[8] == 108 and tokens[3] == 103


def test_accept_stops_at_the_first_mismatch():
    tokens, pos, st = run_accept([0, 7, 8, 9], [7, 5, 9, 4], p=3, n_prompt=2, limit=15, stats=(2, 6))
    assert tokens[4:6].tolist() == [7, 5] and tokens[6] == 106 and pos == 5 and st == [3, 8]
    tokens, pos, st = run_accept([0, 7, 8, 9], [6, 8, 9, 4], p=3, n_prompt=2, limit=15)
    assert tokens[4] == 6 and tokens[5] == 105 and pos == 4 and st == [1, 1]   # a = 0: the bonus only


def test_accept_takes_prompt_positions_whatever_the_model_says():
    # p = 2, prompt of 5: columns 1, 2 (positions 3, 4) are prompt, accepted though pred disagrees;
    # column 3 (position 5) is a draft the model confirms; the bonus lands at 6
    tokens, pos, st = run_accept([102, 103, 104, 9], [0, 0, 9, 4], p=2, n_prompt=5, limit=15)
    assert tokens[3:5].tolist() == [103, 104], "prompt slots are never written"
    assert tokens[5:7].tolist() == [9, 4] and pos == 6 and st == [1, 2]
    # the whole step inside the prompt: nothing written, no generated token, no counted step
    tokens, pos, st = run_accept([100, 101, 102, 103], [5, 5, 5, 5], p=0, n_prompt=10, limit=15)
    assert np.array_equal(tokens, np.arange(16) + 100) and pos == 4 and st == [0, 0]
    # the bonus is the first generated token
    tokens, pos, st = run_accept([100, 101, 102, 103], [5, 5, 5, 8], p=0, n_prompt=4, limit=15)
    assert tokens[4] == 8 and tokens[:4].tolist() == [100, 101, 102, 103] and pos == 4 and st == [1, 1]


def test_accept_leaves_room_for_the_bonus_at_limit():
    # limit 6, p = 4: only draft 1 (position 5 <= limit - 1) may be taken; the bonus lands on 6
    tokens, pos, st = run_accept([0, 7, 8, 9], [7, 8, 9, 4], p=4, n_prompt=2, limit=6)
    assert tokens[5:7].tolist() == [7, 8] and tokens[7] == 107 and pos == 6 and st == [1, 2]
    tokens, pos, st = run_accept([0, 7, 8, 9], [7, 8, 9, 4], p=5, n_prompt=2, limit=6)
    assert tokens[6] == 7 and pos == 6 and st == [1, 1]   # p = limit - 1: the bonus only


def test_accept_after_limit_is_a_no_op():
    for p in (6, 9):
        tokens, pos, st = run_accept([0, 7, 8, 9], [7, 8, 9, 4], p=p, n_prompt=2, limit=6, stats=(3, 5))
        assert np.array_equal(tokens, np.arange(16) + 100) and pos == p and st == [3, 5]


def _toy_next(ctx) -> int:
    """A deterministic 'model': the greedy next token after ctx, periodic stretches and all."""
    a, b = int(ctx[-1]), int(ctx[-2]) if len(ctx) > 1 else 0
    return (a * 3 + b + (len(ctx) % 5 == 0)) % 7


@pytest.mark.parametrize("T", [3, 5, 9])
@pytest.mark.parametrize("n_prompt, limit", [(1, 40), (6, 40), (6, 23), (12, 12), (3, 47)])
def test_drafting_with_acceptance_writes_exactly_the_greedy_sequence(T, n_prompt, limit):
    """draft_lookup + a greedy pred per column + accept == one greedy token per step, position
    for position, whatever the drafter guesses; and the stats count those tokens."""
    S = 48
    prompt = (np.arange(n_prompt) * 5 % 7).astype(I32)
    one_step = np.zeros(S, I32)
    one_step[:n_prompt] = prompt
    for p in range(limit):          # the one-token path: step p writes p + 1 (unless prompt)
        if p + 1 >= n_prompt:
            one_step[p + 1] = _toy_next(one_step[:p + 1])
    tokens = np.zeros(S, I32)
    tokens[:n_prompt] = prompt
    pos, stats, steps, drafted = one(0), np.zeros(2, I32), 0, 0
    while pos[0] < limit:
        cols, pred = np.zeros(T, I32), np.zeros(T, I32)
        draft_lookup_twin((1,), (128,), tokens, pos, one(n_prompt), one(limit), cols)
        ctx = tokens[:pos[0]].tolist()
        for t in range(T):          # the model's greedy choice after each column
            ctx.append(int(cols[t]))
            pred[t] = _toy_next(ctx)
        before = int(pos[0])
        accept_twin((1,), (1,), cols, pred, pos, one(n_prompt), one(limit), tokens, stats)
        assert before < pos[0] <= limit
        drafted += int(pos[0]) - before - 1
        steps += 1
    assert np.array_equal(tokens[:limit + 1], one_step[:limit + 1])
    assert not tokens[limit + 1:].any(), "nothing past limit"
    gen = limit + 1 - max(n_prompt, 1)
    assert stats[1] == gen and (stats[0] > 0) == (gen > 0) and stats[0] <= gen
    if T > 3 and limit == 40 and n_prompt == 1:
        assert steps < limit, "the drafts are sometimes accepted (the toy model has loops)"


# ------------------------------------------------------------------ the column kernels


def test_embed_and_argmax_cols():
    r = rng()
    wte, cols = f32(r, 11, 8), np.array([3, 0, 10, 3], I32)
    X = np.zeros((4, 8), np.float32)
    V.embed_cols_twin(*V.embed_cols_grid(8, 4), cols, wte, X)
    assert np.array_equal(X, wte[[3, 0, 10, 3]])
    logits = np.array([[0.1, 3.0, -1.0, 3.0], [np.nan, 1, 5, 5], [np.nan] * 4,
                       [-np.inf, np.nan, -np.inf, -5]], np.float32)
    pred = np.full(4, -1, I32)
    V.argmax_cols_twin(*V.cols_grid(4), logits, pred)
    assert pred.tolist() == [1, 2, 0, 3]


def test_matmat_and_swiglu_cols_are_the_one_token_twins_per_column():
    r = rng()
    T, N, K = 5, 7, 40
    W, Xc, res = f32(r, N, K, scale=K ** -0.5), f32(r, T, K), f32(r, T, N)
    out = np.zeros((T, N), np.float32)
    V.matmat_twin(*V.matmat_grid(N), W, Xc, out)
    out_r = res.copy()
    V.matmat_residual_twin(*V.matmat_grid(N), W, Xc, out_r)
    Wg, Wu = f32(r, N, K, scale=K ** -0.5), f32(r, N, K, scale=K ** -0.5)
    act = np.zeros((T, N), np.float32)
    V.swiglu_cols_twin(*V.matmat_grid(N), Wg, Wu, Xc, act)
    for t in range(T):
        y, y_r, a = np.zeros(N, np.float32), res[t].copy(), np.zeros(N, np.float32)
        matvec_twin((2,), (128,), W, Xc[t], y)
        matvec_residual_twin((2,), (128,), W, Xc[t], y_r)
        swiglu_up_twin((2,), (128,), Wg, Wu, Xc[t], a)
        # another BLAS call (gemm, not gemv) may sum in another order: a few ulp of sum|w x|
        np.testing.assert_allclose(out[t], y, rtol=0, atol=1e-5)
        np.testing.assert_allclose(out_r[t], y_r, rtol=0, atol=1e-5)
        np.testing.assert_allclose(act[t], a, rtol=0, atol=1e-5)
    assert np.abs(out).max() > 0.1 and np.abs(act).max() > 0.05   # not vacuous


def test_rmsnorm_cols_is_rmsnorm_per_row():
    r = rng()
    X, w = f32(r, 3, 300), f32(r, 300)
    out = np.zeros((3, 300), np.float32)
    V.rmsnorm_cols_twin(*V.cols_grid(3), X, w, out, np.float32(1e-5))
    for t in range(3):
        x64 = X[t].astype(np.float64)
        np.testing.assert_allclose(out[t], x64 / np.sqrt(np.mean(x64 * x64) + 1e-5) * w,
                                   rtol=32 * EPS32, atol=1e-6)
        y = np.zeros(300, np.float32)
        rmsnorm_twin((1,), (256,), X[t], w, y, np.float32(1e-5))
        assert np.array_equal(out[t].view(np.uint32), y.view(np.uint32))


def _tables(max_seq, hd):
    ang = np.arange(max_seq)[:, None] * (10000.0 ** (-np.arange(hd // 2) / (hd // 2)))[None, :]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


@pytest.mark.parametrize("cache_dtype", [np.float32, np.float16])
@pytest.mark.parametrize("p", [0, 5, 13])
def test_rope_cols_is_rope_per_column_and_stops_at_max_seq(cache_dtype, p):
    r = rng()
    H, hd, S, T = 2, 6, 16, 5
    D = H * hd
    cos, sin = _tables(S, hd)
    qkv = f32(r, T, 3 * D)
    kc0, vc0 = f32(r, S, D).astype(cache_dtype), f32(r, S, D).astype(cache_dtype)
    q, kc, vc = np.full((T, D), np.nan, np.float32), kc0.copy(), vc0.copy()
    V.rope_kv_append_cols_twin(*V.rope_cols_grid(H, hd, T), qkv, one(p), cos, sin, q, kc, vc)
    kc1, vc1 = kc0.copy(), vc0.copy()
    for t in range(T):
        if p + t >= S:              # past the cache: q is zeros, nothing written
            assert not q[t].any() and not np.isnan(q[t]).any()
            continue
        q1 = np.zeros(D, np.float32)
        rope_kv_append_twin((H,), (hd,), qkv[t], one(p + t), cos, sin, q1, kc1, vc1)
        assert np.array_equal(q[t].view(np.uint32), q1.view(np.uint32))
    assert np.array_equal(kc, kc1) and np.array_equal(vc, vc1)   # the same rows, nothing else
    written = min(p + T, S) - p
    assert written == T or p == 13
    assert not np.array_equal(kc[p:p + written], kc0[p:p + written])


@pytest.mark.parametrize("cache_dtype", [np.float32, np.float16])
@pytest.mark.parametrize("p, splits", [(0, 1), (0, 4), (1, 2), (6, 2), (7, 2), (9, 3), (12, 5),
                                       (14, 1), (15, 2)])
def test_verify_attention_twins_are_causal_softmax(cache_dtype, p, splits):
    """verify_partial + verify_merge == softmax over rows 0 .. p+t for column t: at p = 0 (every
    cache slice empty), p on and inside slice boundaries, more slices than rows, and columns
    past max_seq (p = 14, 15 with T = 4, max_seq 16)."""
    r = rng()
    H, hd, S, T = 2, 8, 16, 4
    D = H * hd
    q = f32(r, T, D, scale=2.0)
    kc, vc = f32(r, S, D).astype(cache_dtype), f32(r, S, D).astype(cache_dtype)
    scale = np.float32(1 / np.sqrt(hd))
    part_o = np.full((H, T, splits + 1, hd), np.nan, np.float32)   # NaN: an unwritten slot shows
    part_ml = np.full((H, T, splits + 1, 2), np.nan, np.float32)
    grid, block = VA.verify_grid(H, splits, hd, T)
    VA.verify_partial_twin(grid, block, q, kc, vc, one(p), part_o, part_ml, scale)
    for s in range(splits):        # the cache slices: rows [0, p) cut in `splits`
        r0, r1 = VA.verify_rows(p, splits, s, T, S)
        assert r1 - r0 == (min(-(-p // splits) * (s + 1), p) - min(-(-p // splits) * s, p))
        if r0 >= r1:
            assert np.all(part_ml[:, :, s, 0] == -np.inf) and not part_ml[:, :, s, 1].any()
            assert not part_o[:, :, s].any()
    assert np.all(np.isfinite(part_ml[:, :, splits])), "the causal slice is never empty"
    o = np.full((T, D), np.nan, np.float32)
    with np.errstate(all="raise"):  # exp(-inf - M) must be a clean 0
        VA.verify_merge_twin(*VA.merge_cols_grid(H, hd, T), part_o, part_ml, o)
    np.testing.assert_allclose(o, causal64(q, kc, vc, p, H, hd, scale), rtol=64 * EPS32, atol=1e-5)
    for t in range(T):             # the merge is attn_merge's, column by column
        o1 = np.zeros(D, np.float32)
        attn_merge_twin((H,), (hd,), np.ascontiguousarray(part_o[:, t]),
                        np.ascontiguousarray(part_ml[:, t]), o1)
        np.testing.assert_allclose(o[t], o1, rtol=4 * EPS32, atol=1e-7)


def test_verify_attention_sees_each_row_it_should():
    """A key that wins the softmax outright, row by row: column t's output is that row's value
    exactly when the row is in 0 .. p + t (causal), whichever slice holds it."""
    H, hd, S, T, p = 1, 4, 16, 3, 7
    q = np.zeros((T, hd), np.float32)
    q[:, 0] = 1.0
    for row in range(S):
        kc = np.zeros((S, hd), np.float32)
        kc[row, 0] = 60.0                                  # exp(60 * 0.5) dominates
        vc = np.zeros((S, hd), np.float32)
        vc[row] = 1.0
        for splits in (1, 2, 4):
            part_o = np.zeros((H, T, splits + 1, hd), np.float32)
            part_ml = np.zeros((H, T, splits + 1, 2), np.float32)
            VA.verify_partial_twin(*VA.verify_grid(H, splits, hd, T), q, kc, vc, one(p), part_o, part_ml,
                                  np.float32(0.5))
            o = np.zeros((T, hd), np.float32)
            VA.verify_merge_twin(*VA.merge_cols_grid(H, hd, T), part_o, part_ml, o)
            seen = o[:, 0] > 0.99
            assert seen.tolist() == [row <= p + t for t in range(T)], (row, splits)


def test_geometry_helpers():
    assert VA.verify_grid(4, 8, 64, 5) == ((4, 9), (32 * 5,))          # one warp per column
    assert V.cols_grid(9) == ((9,), (256,)) and V.rope_cols_grid(4, 64, 5) == ((4, 5), (64,))
    assert V.embed_cols_grid(256, 3) == ((2, 3), (128,)) and VA.merge_cols_grid(4, 64, 3) == ((4, 3), (64,))
    assert V.matmat_grid(10) == ((3,), (128,))
    assert VA.workspace_bytes(4, 9, 8, 64) == 4 * 4 * 9 * 9 * 66
    for bad in (lambda: V.cols_grid(V.MAX_COLS + 1), lambda: V.cols_grid(0),
                lambda: VA.verify_grid(4, 0, 64, 5), lambda: VA.verify_grid(4, 8, 130, 5),
                lambda: VA.verify_grid(4, 8, 64, V.MAX_COLS + 1)):
        with pytest.raises(ValueError):
            bad()


@pytest.mark.parametrize("slots", [16, 32])
def test_the_column_reduce_scatter_is_warp_sums_tree_in_every_lane(slots):
    """lane_sums16 / lane_sums32's dataflow (the butterfly that keeps half the slots at each
    stride) leaves, in lane l, slot l // (32 // slots)'s total in warp_sum's tree order: the bits
    of one warp_sum per slot (matvec's per column), whichever lane holds it."""
    from kernels.reduce import warp_sum_shuffle_twin, warp_sum_tree_twin
    r = rng()
    v = (r.standard_normal((32, slots)) * 10.0 ** r.integers(-3, 4, (32, slots))).astype(np.float32)
    # the reduce-scatter, simulated lane by lane: vals[lane] holds the lane's current slots
    vals = [v[lane].copy() for lane in range(32)]
    n, s = slots, 16
    while n > 1:
        half = n // 2
        new = []
        for lane in range(32):
            upper = bool(lane & s)
            keep = vals[lane][half:n] if upper else vals[lane][:half]
            got = vals[lane ^ s][half:n] if upper else vals[lane ^ s][:half]
            new.append(np.concatenate([keep + got, vals[lane][n:]]).astype(np.float32))
        vals, n, s = new, half, s // 2
    out = np.array([x[0] for x in vals], np.float32)
    while s > 0:                                   # the strides left: a plain butterfly
        out = out + out[np.arange(32) ^ s]
        s //= 2
    want = warp_sum_tree_twin(v.T)[np.arange(32) // (32 // slots)]
    assert np.array_equal(out.view(np.uint32), want.view(np.uint32))
    assert np.array_equal(VA.lane_sums_twin(v).view(np.uint32), want.view(np.uint32))
    assert np.array_equal(warp_sum_shuffle_twin(v.T)[:, 0].view(np.uint32),
                          warp_sum_tree_twin(v.T).view(np.uint32))
