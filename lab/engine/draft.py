"""Speculative decoding by drafting (LAB_DRAFT=k): draft k tokens on the device, verify them
with ONE step of the model over k + 1 positions, accept on the device -- and replay all of it
from one graph.

The verify step at position p (the device's `pos`; the host does not know it between its reads):

  draft_lookup      cols[0] = tokens[p]; cols[1..k] = the drafts for positions p+1 .. p+k:
                    prompt lookup (kernels/draft.py): the latest earlier occurrence of the
                    last n tokens (n = 3, then 2, then 1), and the k tokens that followed it;
                    a prompt position's own token where p+i is still inside the prompt
  (or draft_ngram   with LAB_DRAFTER=ngram: each draft the token the model's training corpus
                    most often writes after the last 4 tokens (drafts included), from
                    `corpus_table`, built here once per vocabulary and uploaded with the
                    step's buffers)
  embed_cols        X [T, D] = the embeddings of the T = k + 1 columns
  per layer         rmsnorm_cols, matmat (qkv: each weight row loaded once for all T columns,
                    matvec's bits per column),
                    rope_kv_append_cols (T positions' RoPE, KV rows p .. p+k appended),
                    verify_partial (split-K over the cache rows [0, p) in NSPLIT slices + the
                    causal block over the rows appended this step), verify_merge,
                    matmat_residual (Wo), rmsnorm_cols, swiglu_cols, matmat_residual (W_down)
  head              rmsnorm_cols, matmat (LM head: logits [T, V]), argmax_cols (pred [T])
  accept            the longest prefix of drafts the model agrees with (cols[i] == pred[i-1]),
                    then the model's own next token: tokens written, pos += accepted + 1;
                    the counts added to `stats` (read by the host once, at the end)

2 + 9 * n_layer + 4 = 42 launches for the tiny model, whatever k (the one-token step: 37). A
rejected draft's KV row is simply overwritten by a later step (the next step starts at the
first rejected position). The split count is fixed (LAB_DRAFT_SPLITS, `decode_plan`): the
host cannot choose a plan from a position it does not know, so ONE graph per (splits, k) serves
the whole generation; every slice's length grows with the context on the device.

`decode_rounds` (below, called by `decode`) runs a speculative decode in ROUNDS: it sets the
device's `limit` to the target position, issues the fewest steps that could reach it
(ceil(remaining / (k + 1)): no step of a round can be idle), then reads `pos` once; a step at the
limit does nothing. So the host syncs once per round (about log of the tokens), never between
steps. Between two reads the host's `position` (and so each ledger entry's) is a lower bound:
it counts one position per step, and each read sets it to the device's.
Greedy tokens equal LAB_DRAFT=0's up to the order of a few sums (the products are matvec's bits
per column; the verify attention slices the context differently and runs its softmax in its own
order): a difference shows only at a near-tie, which tests and `lab.measure.spec` report with
the float64 oracle's margin.

LAB_BUG_SPEC_KEY (case study 004 on its own ground): the verify graph keyed on the position
read back after every step. Every step captures, successfully; no graph is replayed.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from kernels import draft, verify, verify_attention as va
from lab.errors import LabError
from lab.model import CORPUS
from lab.plan import Plan
from .step import Step, launch

STATS = ("verify steps", "tokens generated")   # what `stats` [2] int32 counts, in order


@dataclass
class DraftBuffers:
    """The verify step's own buffers ([T, .]: one row per column), allocated once."""
    cols: object = None      # [T] int32: the ids the step feeds: tokens[p], then the drafts
    pred: object = None      # [T] int32: the model's argmax after each column
    x: object = None         # [T, D] the residual streams
    h: object = None         # [T, D] normalised
    qkv: object = None       # [T, 3 D]
    q: object = None         # [T, D] after RoPE
    o: object = None         # [T, D] merged heads
    act: object = None       # [T, F]
    logits: object = None    # [T, V]
    part_o: object = None    # [H, T, splits + 1, hd] the verify attention's partials
    part_ml: object = None   # [H, T, splits + 1, 2]
    stats: object = None     # [2] int32: STATS
    table: object = None     # LAB_DRAFTER=ngram: [V**3, V] uint8, `corpus_table`


def ngram_table(ids, vocab: int, context: int = draft.NGRAM_CONTEXT) -> np.ndarray:
    """[vocab**(context-1), vocab] uint8, draft_ngram's table: entry [row, c] for the context
    c_1 .. c_n (row = ((c_1 vocab + c_2) vocab + ...) + c_{n-1}, c = c_n) is the token that
    follows that context most often in `ids` (a tie: the smallest id). A context `ids` never
    holds takes its shorter context's token (the oldest dropped), down to the most frequent
    token of all."""
    ids = np.asarray(ids, np.int64)
    if not 1 <= vocab <= 256:
        raise LabError(f"an n-gram table of uint8 ids needs a vocabulary of 1 to 256 tokens, "
                       f"not {vocab}")
    if ids.ndim != 1 or ids.size <= context:
        raise LabError(f"an n-gram table of context {context} needs more than {context} ids, "
                       f"got {ids.size}")
    if ids.min() < 0 or ids.max() >= vocab:
        raise LabError(f"n-gram table: ids must lie in [0, {vocab})")
    best = np.array([np.bincount(ids, minlength=vocab).argmax()], np.uint8)   # no context
    for n in range(1, context + 1):
        key = np.zeros(ids.size - n, np.int64)
        for m in range(n):
            key = key * vocab + ids[m:ids.size - n + m]
        pair, count = np.unique(key * vocab + ids[n:], return_counts=True)
        ctx, tok = np.divmod(pair, vocab)
        order = np.lexsort((tok, -count, ctx))     # per context: the most counts, then smallest
        ctx, tok = ctx[order], tok[order]
        first = np.r_[True, ctx[1:] != ctx[:-1]]
        table = np.tile(best, vocab)               # [vocab**n]: row r backs off to r % vocab**(n-1)
        table[ctx[first]] = tok[first]
        best = table
    return best.reshape(vocab ** (context - 1), vocab)


@functools.lru_cache(maxsize=2)
def corpus_table(vocab: str) -> np.ndarray:
    """`ngram_table` of the training corpus (data/corpus.txt) under the vocabulary `vocab` (a
    model's characters; a corpus character outside it is dropped). Built once per vocabulary in
    a process (0.24 s for its 1.2 M characters, measured on a 2-core machine)."""
    text = np.frombuffer(CORPUS.read_text(encoding="utf-8").encode("utf-32-le"), np.uint32)
    lut = np.full(max(int(text.max()), max(map(ord, vocab))) + 1, -1, np.int64)
    lut[[ord(ch) for ch in vocab]] = np.arange(len(vocab))
    ids = lut[text]
    return ngram_table(ids[ids >= 0], len(vocab))


def alloc_draft(be, model_cfg, draft_len: int, splits: int,
                drafter: str = "lookup") -> DraftBuffers:
    """The verify step's buffers for `draft_len` drafts and `splits` cache slices (and, for
    the n-gram drafter, its table, uploaded once)."""
    c, T, f32 = model_cfg, draft_len + 1, np.float32
    D, H, hd = c.d_model, c.n_head, c.head_dim
    if T > draft.MAX_COLS:     # (LabConfig refuses such a draft length first: lab/bugspec.py)
        raise LabError(f"LAB_DRAFT={draft_len}: a verify step of {T} columns is past the "
                       f"MAX_COLS = {draft.MAX_COLS} its kernels take (kernels/draft.py)")
    s = DraftBuffers()
    s.cols = be.alloc("draft_cols", (T,), np.int32)
    s.pred = be.alloc("draft_pred", (T,), np.int32)
    for name, width in (("x", D), ("h", D), ("qkv", 3 * D), ("q", D), ("o", D), ("act", c.d_ff),
                        ("logits", c.vocab_size)):
        setattr(s, name, be.alloc(f"draft_{name}", (T, width), f32))
    s.part_o = be.alloc("draft_part_o", (H, T, splits + 1, hd), f32)
    s.part_ml = be.alloc("draft_part_ml", (H, T, splits + 1, 2), f32)
    s.stats = be.alloc("draft_stats", (len(STATS),), np.int32)
    if drafter == "ngram":
        table = corpus_table(c.vocab)
        s.table = be.alloc("draft_table", table.shape, np.uint8)
        be.upload(s.table, table)
    return s


class DraftStep(Step):
    """The verify step (LAB_DRAFT=k): draft, the model over k + 1 columns, accept. Its pieces,
    in order: `draft` (the drafter's launch), `columns` (embed + every layer + the LM head's
    argmax over the k + 1 columns) and `accept` (the acceptance's launch); a variant (the
    hands-on exercise's, a deliberate bug) overrides one."""

    @classmethod
    def own_buffers(cls, dev, model, cfg, kv_init: str) -> None:
        super().own_buffers(dev, model, cfg, kv_init)      # `limit` among them
        dev.draft = alloc_draft(dev.backend, model.cfg, cfg.draft, cfg.draft_splits, cfg.drafter)

    def draft(self, plan: Plan):
        b, s = self.dev.buf, self.dev.draft
        if self.engine.cfg.drafter == "ngram":
            return launch(draft.draft_ngram, (draft.NGRAM_GRID, draft.NGRAM_BLOCK),
                          (b.tokens, b.pos, b.n_prompt, b.limit, s.table, s.cols))
        return launch(draft.draft_lookup, (draft.DRAFT_GRID, draft.DRAFT_BLOCK),
                      (b.tokens, b.pos, b.n_prompt, b.limit, s.cols))

    def columns(self, plan: Plan):
        c, b, w, s = self.engine.model.cfg, self.dev.buf, self.dev.w, self.dev.draft
        T, H, D = plan.draft + 1, c.n_head, c.d_model
        eps, scale = np.float32(c.norm_eps), np.float32(1.0 / np.sqrt(c.head_dim))
        norm = verify.cols_grid(T)
        yield launch(verify.embed_cols, verify.embed_cols_grid(D, T), (s.cols, w["tok_emb"], s.x))
        for i in range(c.n_layer):
            p = f"layers.{i}."
            yield launch(verify.rmsnorm_cols, norm, (s.x, w[p + "attn_norm"], s.h, eps), i)
            yield launch(verify.matmat, _ROWS(3 * D), (w[p + "wqkv"], s.h, s.qkv), i)
            yield launch(verify.rope_kv_append_cols, verify.rope_cols_grid(H, c.head_dim, T),
                         (s.qkv, b.pos, b.cos, b.sin, s.q, b.k_cache[i], b.v_cache[i]), i)
            yield launch(va.verify_partial, va.verify_grid(H, plan.splits, c.head_dim, T),
                         (s.q, b.k_cache[i], b.v_cache[i], b.pos, s.part_o, s.part_ml, scale), i)
            yield launch(va.verify_merge, va.merge_cols_grid(H, c.head_dim, T),
                         (s.part_o, s.part_ml, s.o), i)
            yield launch(verify.matmat_residual, _ROWS(D), (w[p + "wo"], s.o, s.x), i)
            yield launch(verify.rmsnorm_cols, norm, (s.x, w[p + "mlp_norm"], s.h, eps), i)
            yield launch(verify.swiglu_cols, _ROWS(c.d_ff),
                         (w[p + "w_gate"], w[p + "w_up"], s.h, s.act), i)
            yield launch(verify.matmat_residual, _ROWS(D), (w[p + "w_down"], s.act, s.x), i)
        yield launch(verify.rmsnorm_cols, norm, (s.x, w["final_norm"], s.h, eps))
        yield launch(verify.matmat, _ROWS(c.vocab_size), (w["lm_head"], s.h, s.logits))
        yield launch(verify.argmax_cols, verify.cols_grid(T), (s.logits, s.pred))

    def accept(self, plan: Plan):
        b, s = self.dev.buf, self.dev.draft
        return launch(draft.accept, (draft.ACCEPT_GRID, draft.ACCEPT_BLOCK),
                      (s.cols, s.pred, b.pos, b.n_prompt, b.limit, b.tokens, s.stats))

    def items(self, plan: Plan):
        yield self.draft(plan)
        yield from self.columns(plan)
        yield self.accept(plan)


class DraftKey(DraftStep):
    """LAB_BUG_SPEC_KEY: the verify graph filed under the plan key AND the position the device
    reached, read back after every step (a host sync the clean step never makes). Drafting
    moves the position by the accepted count, so no key comes back: every step captures a
    graph that is right, and no later step looks it up."""

    def graph_key(self, plan: Plan) -> tuple:
        return (*plan.key, "pos", self.engine.device_position())


_ROWS = verify.matmat_grid      # one warp per output row, as matvec


def decode_rounds(eng, steps: int, progress) -> float:
    """Advance the device position by `steps` (as `decode` does one step each), in rounds of
    ceil(remaining / (k + 1)) verify steps with one read of `pos` after each; the seconds on
    the group's clock."""
    start = eng.device_position()
    target = start + steps
    if target >= eng.model.cfg.max_seq:   # decode checked the host's lower bound only
        raise LabError(f"{steps} steps from position {start} would exceed max_seq "
                       f"{eng.model.cfg.max_seq}")
    eng.devices.upload("limit", np.array([target], np.int32))
    width, pos = eng.cfg.draft + 1, start
    bar = None
    if progress is not False:
        from tqdm.auto import tqdm
        bar = tqdm(total=steps, desc=f"decode (draft {eng.cfg.draft})", unit="pos",
                   disable=None if progress is None else False, delay=0.0 if progress else 1.0)
    t0 = eng.group.clock()
    while pos < target:
        for _ in range(-(-(target - pos) // width)):
            eng.step()
        new = eng.device_position()          # the round's one read
        if bar is not None:
            bar.update(new - pos)
        if new <= pos:
            raise LabError(f"speculative decode stalled at position {pos}: no step of the "
                           f"round advanced it (limit {target})")
        eng.track_position(new, 0)   # the steps were counted as they ran
        pos = new
    seconds = eng.group.clock() - t0
    if bar is not None:
        bar.close()
    return seconds


def clear_stats(eng) -> None:
    """Zero the device's counts (`stats`): a request, or a timed rep, starts from none."""
    eng.backend.upload(eng.devices[0].draft.stats, np.zeros(len(STATS), np.int32))


def read_stats(eng) -> dict:
    """{"verify steps": n, "tokens generated": m, "tokens per step": m / n} since the last
    reset (generated tokens only: prompt positions are not counted)."""
    if not eng.cfg.draft:
        raise LabError("draft_stats needs LAB_DRAFT=2, 4 or 8")
    steps, made = (int(v) for v in eng.backend.download(eng.devices[0].draft.stats))
    return {"verify steps": steps, "tokens generated": made,
            "tokens per step": made / steps if steps else float("nan")}
