"""ranks.json: tensor-parallel decode on a GPU pair (LAB_RANKS=2) against one GPU (notebook 12).

  collectives  what one collective costs each rank, the figures the simulator's CollectiveCosts
               reads: as a graph node (chains of 8 and 24 per rank, slope of the medians), per
               op (all-reduce of the residual stream, all-gather of the logits), and the host
               time of one eager call per rank
  arms         1 rank eager / graph, 2 ranks eager / graph: ms/token, interleaved (reversed
               every other rep), one engine per arm warmed up over the timed length; every
               arm's tokens against the float64 oracle's
  bill         launches per rank, collectives per token, node types of each rank's graph
Needs two GPUs (on the simulator: simulated devices). Its own process: it closes its graphs and
NCCL communicators, then on a GPU ends the process at once (exit hooks can hang after NCCL).
"""
from __future__ import annotations

import os
import sys
import time

import numpy as np

from lab.config import LabConfig
from lab.errors import LabError
from lab.measure.experiment import experiment, now

PROMPT = "ROMEO.\n"
ARMS = (("1 rank eager", dict(ranks=1, graph=False)), ("1 rank graph", dict(ranks=1, graph=True)),
        ("2 ranks eager", dict(ranks=2, graph=False)), ("2 ranks graph", dict(ranks=2, graph=True)))
REPS, TOKENS = 5, 64
QUICK = dict(reps=2, tokens=40, rounds=1, replays=2)   # 40 tokens: past the first plan boundary


def collective_costs(group, ops, progress, rounds: int = 3, replays: int = 200) -> dict:
    """Per-op graph-node us (slope over chains of 8 and 24) and host us per eager call."""
    out = {"graph_us": {}, "eager_us": {}, "host_call_us": {}, "replay_us": {}}
    for op, make in ops.items():
        colls = [make(be) for be in group.backends]
        graphs = {}
        for n in (8, 24):
            for be in group.backends:
                be.begin_capture()
            for _ in range(n):
                with group.collectives():
                    for be, c in zip(group.backends, colls):
                        be.collective(c)
            graphs[n] = [be.instantiate(d) for be, d in zip(group.backends, group.end_captures())]
        med = {8: [], 24: []}
        for _ in range(rounds):
            for n in (8, 24):
                for g in graphs[n]:
                    g.launch()
                t0 = group.clock()
                for _ in range(replays):
                    for g in graphs[n]:
                        g.launch()
                med[n].append((group.clock() - t0) / replays * 1e6)
        per = {n: float(np.median(v)) for n, v in med.items()}
        out["graph_us"][op] = (per[24] - per[8]) / 16
        out["replay_us"][op] = {str(n): med[n] for n in med}
        out["eager_us"][op] = out["graph_us"][op]
        calls, t_host = 64, []
        for _ in range(rounds):
            group.clock()
            t0 = time.perf_counter()
            for _ in range(calls):
                with group.collectives():
                    for be, c in zip(group.backends, colls):
                        be.collective(c)
            t_host.append((time.perf_counter() - t0) / calls * 1e6 / group.ranks)
            group.clock()
        out["host_call_us"][op] = float(np.median(t_host))
        del graphs
        progress(f"  {op}: {out['graph_us'][op]:.2f} us per graph node, "
                 f"{out['host_call_us'][op]:.2f} us host per rank's eager call")
    return out


def timed_arms(engines: dict, reps: int, tokens: int, oracle, progress) -> tuple[dict, bool]:
    """The arms interleaved by lab/measure/bench.py (one warm-up generate over the timed length
    each, then the order reversed every other rep): ({name: ms/token, sem, captures in the timed
    reps}, whether every timed rep of every arm generated the oracle's tokens)."""
    from lab.measure import bench
    from lab.measure.stats import mean_sem
    arms = [bench.Arm(name, eng.cfg, eng) for name, eng in engines.items()]

    def run(eng):
        gen = eng.generate(PROMPT, tokens)
        return gen.ms_per_token, gen.tokens

    def rep_done(rep):
        progress(f"rep {rep + 1}/{reps}: " + ", ".join(f"{a.name} {a.ms[-1]:.4f}" for a in arms))
    # the warm-up covers the timed length: every plan the reps reach is captured there
    bench.interleave(arms, reps, run, before_rep=lambda rep: rep and rep_done(rep - 1))
    rep_done(reps - 1)
    oracle_ok = all(np.array_equal(toks, oracle) for a in arms for toks in a.runs)
    rows = {}
    for a in arms:
        m, s = mean_sem(a.ms)
        rows[a.name] = {"ms_per_token": a.ms, "mean_ms": m, "sem_ms": s,
                        "captures_in_timed_reps": a.outcomes.get("capture", 0)}
    return rows, bool(oracle_ok)


@experiment("ranks", files=("ranks.json",), priority=230, gpus=2, isolated=True,
            doc="tensor-parallel decode on two GPUs against one; the collectives' costs "
                "(notebook 12)")
def record(ctx) -> None:
    from lab.backend import Collective, make_ranks
    from lab.engine.runner import make_engine
    from lab.reference import generate as oracle_generate
    p = QUICK if ctx.quick else dict(reps=REPS, tokens=TOKENS, rounds=3, replays=200)
    model = ctx.model
    engines = {name: make_engine(model, LabConfig(backend=ctx.backend, **kw)) for name, kw in ARMS}
    try:
        two = engines["2 ranks graph"]
        source = two.describe()
        ctx.progress(f"ranks: {source}; collectives as graph nodes, and eager calls")
        group = (make_ranks(LabConfig(backend=ctx.backend), 2) if ctx.backend == "sim"
                 else two.group)
        c = model.cfg
        scratch = {id(be): (be.alloc("coll_x", (c.d_model,), np.float32),
                            be.alloc("coll_part", (36,), np.float32),
                            be.alloc("coll_all", (72,), np.float32)) for be in group.backends}
        ops = {"all_reduce": lambda be: Collective("all_reduce", scratch[id(be)][0],
                                                   scratch[id(be)][0], "x"),
               "all_gather": lambda be: Collective("all_gather", scratch[id(be)][1],
                                                   scratch[id(be)][2], "logits")}
        coll = collective_costs(group, ops, ctx.progress, p["rounds"], p["replays"])
        ctx.progress(f"arms: {', '.join(n for n, _ in ARMS)}; {p['reps']} reps x {p['tokens']} "
                     f"tokens, interleaved")
        oracle = np.asarray(oracle_generate(model, model.tokenizer.encode(PROMPT), p["tokens"]))
        arms, oracle_ok = timed_arms(engines, p["reps"], p["tokens"], oracle, ctx.progress)
        bill = two.bill(two.plan(0))
        bill["node_types"] = [g.node_types() for g in two.graphs[two.plan(0).key]]
        one = engines["1 rank graph"]
        bill["one_rank_launches"] = len(one.step_launches(one.plan(0)))
    finally:
        for eng in engines.values():
            if hasattr(eng, "close"):          # the ranked engines: graphs and communicators
                eng.close()
    r = lambda a, b: arms[a]["mean_ms"] / arms[b]["mean_ms"]  # noqa: E731
    result = {
        "what": "tensor-parallel decode on two GPUs (LAB_RANKS=2) against one, eager and graph; "
                "the collectives' costs for the simulator",
        "source": source, "date": now(), "recorded_by": "decode-lab record ranks",
        "collectives": {"source": f"{source} (decode-lab record ranks, {now()[:10]})",
                        "method": f"graph_us: chains of 8 and 24 collectives per rank, "
                                  f"{p['replays']} replays x {p['rounds']} rounds, slope of the "
                                  f"medians; eager_us: taken as graph_us; host_call_us: host "
                                  f"time of one NCCL group call / ranks",
                        "sizes": {"all_reduce": f"{c.d_model} float32",
                                  "all_gather": "36 float32 per rank"},
                        **coll},
        "arms": arms, "tokens_identical": oracle_ok, "oracle_tokens_equal": oracle_ok,
        "ratios": {"2 ranks graph / 1 rank graph": r("2 ranks graph", "1 rank graph"),
                   "2 ranks eager / 2 ranks graph": r("2 ranks eager", "2 ranks graph"),
                   "1 rank eager / 1 rank graph": r("1 rank eager", "1 rank graph")},
        "reps": p["reps"], "tokens": p["tokens"], "prompt": PROMPT, "bill": bill,
    }
    ctx.write_json("ranks.json", result)
    table = [f"{'arm':<15} {'ms/token':>9} {'± sem us':>9}"]
    table += [f"{n:<15} {a['mean_ms']:>9.4f} {1000 * a['sem_ms']:>9.2f}" for n, a in arms.items()]
    table += [f"{k}: {v:.2f}x" for k, v in result["ratios"].items()]
    ctx.progress("\n".join(table) + f"\nbill: {bill['launches_per_rank']} launches per rank, "
                 f"{bill['collectives_per_token']} collectives per token, rank graphs "
                 f"{bill['node_types']}; tokens == oracle in every arm and rep: {oracle_ok}")
    if not oracle_ok:
        raise LabError("FAIL: an arm's tokens differ from the float64 oracle's")
    if ctx.backend == "cuda":     # its own process (isolated): the communicators are destroyed;
        sys.stdout.flush()        # leave no exit hooks to hang in
        sys.stderr.flush()
        os._exit(0)
