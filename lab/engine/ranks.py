"""Tensor-parallel decode over ranks (LAB_RANKS=2): one GPU per rank, one process, one thread.

Megatron's split of the tiny model over R ranks (R = 2):
  attention  rank r owns heads [r H/R, (r+1) H/R): its rows of wq, wk, wv (column-parallel,
             no communication), its slice of the KV cache, its heads' attention; the output
             projection is row-parallel: rank r multiplies its heads' outputs by its columns of
             wo, and an ALL-REDUCE sums the ranks' partial products into every rank's x.
  MLP        gate/up column-parallel (rank r's d_ff/R rows), down row-parallel + ALL-REDUCE.
  LM head    vocabulary-parallel: rank r computes logits for its ceil(V/R) rows (the last rank's
             padded with zero rows), an ALL-GATHER gives every rank all of them, and every rank
             takes the same argmax on its own device: the ranks agree on the next token id with
             no host round trip.
The residual add rides on the all-reduce: rank 0 adds its partial product to x
(matvec_residual), every other rank writes its partial product over x (matvec), and the sum
over ranks is x + W0 o0 + W1 o1. Per token: 2 all-reduces per layer + 1 all-gather.

Every rank issues the same step (`RankStep`: lab/engine/step.py's Step with the pieces that differ
overridden -- the shard sizes, the projections into x, the all-reduces, the LM head's gather)
and every rank must issue the same collectives in the same order: NCCL matches them by order
alone. One host thread drives every rank, so the engine's issuer (lab/engine/issuer.py, the same
as on one device) issues the ranks in lockstep: each rank's launches up to its next
collective, then every rank's collective together (one NCCL group). Eager, that is the step;
captured, the same issue order fills one graph per rank (global mode, every rank's capture open
at once, ended before any is instantiated), and a token is one graph launch per rank. On a GPU
pair the engine checks the ranks' collective sequences before it issues anything (a mismatch
would hang both GPUs); the simulator lets them run and reports the deadlock as NCCL would meet it
(lab/backend/sim/ranks.py: SimRanks).

This module holds the split (`shard`, `check_divisible`), the rank step and its bug, and what an
engine with ranks adds: the collectives' warm-up and the bill (the order check is the issuer's,
lab/engine/issuer.py). The engine itself is lab.engine.runner's DecodeEngine, the same class for
any rank count.
"""
from __future__ import annotations

import numpy as np

from kernels import matvec
from lab.backend import Collective
from lab.errors import LabError
from lab.model import Model
from lab.plan import Plan
from .graph_cache import per_rank
from .step import Step, launch


def check_divisible(model_cfg, ranks: int) -> None:
    """Heads and d_ff must split evenly over the ranks (a LabError naming both numbers)."""
    if model_cfg.n_head % ranks:
        raise LabError(f"LAB_RANKS={ranks}: the model's {model_cfg.n_head} attention heads do not "
                       f"split evenly over {ranks} ranks (n_head % ranks = "
                       f"{model_cfg.n_head % ranks}); use a rank count that divides {model_cfg.n_head}")
    if model_cfg.d_ff % ranks:
        raise LabError(f"LAB_RANKS={ranks}: the MLP's d_ff {model_cfg.d_ff} does not split evenly "
                       f"over {ranks} ranks")


def vocab_rows(vocab: int, ranks: int) -> int:
    """Rows of the LM head per rank (the last rank's padded with zero rows)."""
    return -(-vocab // ranks)


def shard(model: Model, rank: int, ranks: int) -> dict[str, np.ndarray]:
    """Rank `rank`'s weights, each a contiguous float32 array (what its kernels read)."""
    c, w = model.cfg, model.weights
    D, F, V = c.d_model, c.d_ff, c.vocab_size
    d, f, v = D // ranks, F // ranks, vocab_rows(V, ranks)
    cols, ffc = slice(rank * d, (rank + 1) * d), slice(rank * f, (rank + 1) * f)
    out = {"tok_emb": w["tok_emb"], "final_norm": w["final_norm"]}
    head = np.zeros((v * ranks, D), np.float32)
    head[:V] = w["lm_head"]
    out["lm_head"] = head[rank * v:(rank + 1) * v]
    for i in range(c.n_layer):
        p = f"layers.{i}."
        qkv = w[p + "wqkv"]
        out[p + "wqkv"] = np.concatenate([qkv[k * D:(k + 1) * D][cols] for k in range(3)])
        out[p + "wo"] = w[p + "wo"][:, cols]
        out[p + "w_gate"], out[p + "w_up"] = w[p + "w_gate"][ffc], w[p + "w_up"][ffc]
        out[p + "w_down"] = w[p + "w_down"][:, ffc]
        out[p + "attn_norm"], out[p + "mlp_norm"] = w[p + "attn_norm"], w[p + "mlp_norm"]
    return {k: np.ascontiguousarray(a, dtype=np.float32) for k, a in out.items()}


class RankStep(Step):
    """One rank's decode step: the one-device step's kernels on the rank's shards, with the
    collectives (`Collective`) where the ranks meet."""

    def shard_sizes(self) -> tuple[int, int]:
        """(heads, d_ff) of this rank: its 1/R of each."""
        c, R = self.engine.model.cfg, self.engine.ranks
        return c.n_head // R, c.d_ff // R

    def combine(self, plan: Plan, layer: int, part_o, part_ml):
        """Always the merge, then the projection: the all-reduce sums the ranks' projections."""
        return self.merge_then_project(layer, part_o, part_ml)

    def project_into_x(self, W, vec, layer):
        """x gets this rank's partial product W @ vec: rank 0 adds it to x (the residual), the
        others write it over x; the all-reduce after it sums them."""
        kern = matvec.matvec_residual if self.rank == 0 else matvec.matvec
        return launch(kern, matvec.grid_for(W.shape[0]), (W, vec, self.dev.buf.x), layer)

    def all_reduce(self, plan: Plan, layer: int, what: str):
        """Sum every rank's x into every rank's x."""
        b = self.dev.buf
        yield Collective("all_reduce", b.x, b.x, what, layer)

    def lm_head(self):
        """This rank's rows of the LM head, then every rank's rows gathered on every rank."""
        b = self.dev.buf
        yield launch(matvec.matvec, matvec.grid_for(b.logits_part.shape[0]),
                     (self.dev.w["lm_head"], b.h, b.logits_part))
        yield from self.gather_logits()

    def gather_logits(self):
        b = self.dev.buf
        yield Collective("all_gather", b.logits_part, b.logits, "logits")

    def collectives(self, plan: Plan) -> list[Collective]:
        return [x for x in self.items(plan) if isinstance(x, Collective)]

    @classmethod
    def own_buffers(cls, dev, model, cfg, kv_init: str) -> None:
        """None beyond the common ones (x_shard and logits_part are among them with ranks)."""


class RankSkewStep(RankStep):
    """LAB_BUG_RANK_SKEW: rank 1 chooses its all-reduce algorithm by itself. From the plans of 4
    splits on (context 64 and more) it does reduce-scatter + all-gather (the same sum, another
    pair of collectives) where rank 0 still issues one all-reduce. Right at short context; at
    the first long-context step the ranks' collective #0 no longer match."""

    def all_reduce(self, plan: Plan, layer: int, what: str):
        if self.rank != 1 or plan.splits < 4:
            yield from super().all_reduce(plan, layer, what)
            return
        b = self.dev.buf
        yield Collective("reduce_scatter", b.x, b.x_shard, what + " (reduce-scatter)", layer)
        yield Collective("all_gather", b.x_shard, b.x, what + " (all-gather)", layer)


def warm_up_collectives(devices) -> None:
    """Run each kind of collective the step may issue once, eagerly, on buffers that hold
    zeros at start-up. NCCL sets up its connections lazily, at a communicator's first
    collective of a kind, and that setup (allocations, a proxy handshake) cannot happen
    inside a capture: on the H200 pair the first all-reduce issued inside a capture failed
    with NCCL_ERROR_INTERNAL_ERROR. The lab's lazy-initialisation lesson, for a library."""
    kinds = [lambda b: Collective("all_reduce", b.x, b.x, "warm-up"),
             lambda b: Collective("all_gather", b.logits_part, b.logits, "warm-up"),
             lambda b: Collective("reduce_scatter", b.x, b.x_shard, "warm-up")]
    for make in kinds:
        with devices.group.collectives():
            for d in devices:
                d.backend.collective(make(d.buf))
    devices.group.clock()


def bill(eng, plan: Plan | None = None) -> dict:
    """The launch bill with ranks: launches per rank per token, collectives per token."""
    plan = plan or eng.plan()
    launches = [len(eng.step_launches(plan, r)) for r in range(eng.ranks)]
    colls = eng.issuer.step_collectives(plan, 0)
    graphs = eng.graph_cache.graphs.get(plan.key)
    return {"ranks": eng.ranks, "launches_per_rank": launches,
            "launches_per_token": sum(launches),
            "collectives_per_token": len(colls),
            "collectives": [c.describe() for c in colls],
            "nodes_per_rank_graph": [g.node_count for g in per_rank(graphs)] if graphs else []}
