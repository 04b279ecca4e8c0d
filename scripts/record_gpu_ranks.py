"""Record tensor-parallel decode on a GPU pair (LAB_RANKS=2), as JSON with source and date.

  python scripts/record_gpu_ranks.py --out DIR [--reps 5] [--tokens 64] [--backend cuda|sim]

Two measurements, in one process:
- "collectives": what one collective costs each rank, the figures the simulator's
  CollectiveCosts reads (lab/backend/costmodel.py): as a graph node (graphs of n = 8 and 24
  collectives on every rank, replayed 200x in 3 alternating rounds; per-node time = slope of
  the medians), per op (an all-reduce of the residual stream, an all-gather of the logits);
  and the host time of one eager call (each rank's call inside one NCCL group), per rank. The
  eager collective's device time is taken to be the graph node's (`eager_us`).
- "arms": 1 rank eager, 1 rank graph, 2 ranks eager, 2 ranks graph: ms/token over --tokens
  generated tokens, --reps reps, the arms interleaved (the order reversed every other rep), on
  one engine per arm, warmed up over the timed length (each arm records how many graphs it
  captured inside the timed reps: 0 when the warm-up reached every plan); every arm's tokens
  against the float64 oracle's.
Plus the bill: launches per rank, collectives per token, node types of each rank's graph.

Writes DIR/ranks.json. Needs two GPUs (or --backend sim: the same measurement on simulated
devices, for a dry run; it writes ranks_sim.json). Destroys its graphs and NCCL communicators
before it exits (a process that exits with them alive can hang).
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lab.backend import Collective, make_ranks  # noqa: E402
from lab.config import LabConfig  # noqa: E402
from lab.engine.runner import make_engine  # noqa: E402
from lab.errors import LabError  # noqa: E402
from lab.measure import bench  # noqa: E402
from lab.measure.stats import mean_sem  # noqa: E402
from lab.reference import generate as oracle_generate  # noqa: E402
from scripts import recorder  # noqa: E402

PROMPT = "ROMEO.\n"
ARMS = (("1 rank eager", dict(ranks=1, graph=False)), ("1 rank graph", dict(ranks=1, graph=True)),
        ("2 ranks eager", dict(ranks=2, graph=False)), ("2 ranks graph", dict(ranks=2, graph=True)))


log = recorder.stopwatch(7)      # seconds since the import, as the recorder starts


def collective_costs(group, ops, rounds: int = 3, replays: int = 200) -> dict:
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
        log(f"  {op}: {out['graph_us'][op]:.2f} us per graph node, {out['host_call_us'][op]:.2f} "
            f"us host per rank's eager call")
    return out


def timed_arms(engines: dict, reps: int, tokens: int, oracle) -> tuple[dict, bool]:
    """The arms interleaved by lab/measure/bench.py (one warm-up generate over the timed length
    each, then the order reversed every other rep): ({name: ms/token, sem, captures in the timed
    reps}, whether every timed rep of every arm generated the oracle's tokens)."""
    arms = [bench.Arm(name, eng.cfg, eng) for name, eng in engines.items()]

    def run(eng):
        gen = eng.generate(PROMPT, tokens)
        return gen.ms_per_token, gen.tokens

    def rep_done(rep):
        log(f"rep {rep + 1}/{reps}: " + ", ".join(f"{a.name} {a.ms[-1]:.4f}" for a in arms))
    # the warm-up covers the timed length: every plan the reps reach is captured there (a
    # shorter warm-up left the captures of the plans at 32 and 64 inside the first rep)
    bench.interleave(arms, reps, run, before_rep=lambda rep: rep and rep_done(rep - 1))
    rep_done(reps - 1)
    oracle_ok = all(np.array_equal(toks, oracle) for a in arms for toks in a.runs)
    rows = {}
    for a in arms:
        m, s = mean_sem(a.ms)
        rows[a.name] = {"ms_per_token": a.ms, "mean_ms": m, "sem_ms": s,
                        "captures_in_timed_reps": a.outcomes.get("capture", 0)}
    return rows, bool(oracle_ok)


def main(argv=None) -> int:
    args = recorder.arguments(__doc__, backends=("cuda", "sim"), reps=5, tokens=64).parse_args(argv)
    if args.reps < 2 or args.tokens < 1:
        return recorder.refuse("record_gpu_ranks", "--reps must be >= 2 and --tokens >= 1")
    out = recorder.out_dir(args.out)
    model = recorder.load(args)
    try:
        engines = {name: make_engine(model, LabConfig(backend=args.backend, **kw))
                   for name, kw in ARMS}
    except LabError as exc:
        print(f"record_gpu_ranks: {exc}", file=sys.stderr)
        return 2
    two = engines["2 ranks graph"]
    source = two.describe()
    log(f"ranks: {source}")

    log("collectives as graph nodes, and eager calls")
    group = make_ranks(LabConfig(backend=args.backend), 2) if args.backend == "sim" else two.group
    c = model.cfg
    scratch = [(be.alloc("coll_x", (c.d_model,), np.float32), be.alloc("coll_part", (36,), np.float32),
                be.alloc("coll_all", (72,), np.float32)) for be in group.backends]
    by_be = {id(be): s for be, s in zip(group.backends, scratch)}
    ops = {"all_reduce": lambda be: Collective("all_reduce", by_be[id(be)][0], by_be[id(be)][0], "x"),
           "all_gather": lambda be: Collective("all_gather", by_be[id(be)][1], by_be[id(be)][2], "logits")}
    coll = collective_costs(group, ops)

    log(f"arms: {', '.join(n for n, _ in ARMS)}; {args.reps} reps x {args.tokens} tokens, interleaved")
    oracle = np.asarray(oracle_generate(model, model.tokenizer.encode(PROMPT), args.tokens))
    arms, oracle_ok = timed_arms(engines, args.reps, args.tokens, oracle)
    bill = two.bill(two.plan(0))
    bill["node_types"] = [g.node_types() for g in two.graphs[two.plan(0).key]]
    one = engines["1 rank graph"]
    bill["one_rank_launches"] = len(one.step_launches(one.plan(0)))
    r = lambda a, b: arms[a]["mean_ms"] / arms[b]["mean_ms"]
    result = {
        "what": "tensor-parallel decode on two GPUs (LAB_RANKS=2) against one, eager and graph; "
                "the collectives' costs for the simulator",
        "source": source, "date": recorder.now(),
        "recorded_by": "scripts/record_gpu_ranks.py",
        "collectives": {"source": f"{source} (scripts/record_gpu_ranks.py, "
                                  f"{recorder.today()})",
                        "method": "graph_us: chains of 8 and 24 collectives per rank, 200 replays x 3 "
                                  "rounds, slope of the medians; eager_us: taken as graph_us; "
                                  "host_call_us: host time of one NCCL group call / ranks",
                        "sizes": {"all_reduce": f"{c.d_model} float32", "all_gather": "36 float32 per rank"},
                        **coll},
        "arms": arms, "tokens_identical": oracle_ok, "oracle_tokens_equal": oracle_ok,
        "ratios": {"2 ranks graph / 1 rank graph": r("2 ranks graph", "1 rank graph"),
                   "2 ranks eager / 2 ranks graph": r("2 ranks eager", "2 ranks graph"),
                   "1 rank eager / 1 rank graph": r("1 rank eager", "1 rank graph")},
        "reps": args.reps, "tokens": args.tokens, "prompt": PROMPT, "bill": bill,
    }
    name = "ranks.json" if args.backend == "cuda" else "ranks_sim.json"
    recorder.write_json(out / name, result)
    print(f"{'arm':<15} {'ms/token':>9} {'± sem us':>9}")
    for n, a in arms.items():
        print(f"{n:<15} {a['mean_ms']:>9.4f} {1000 * a['sem_ms']:>9.2f}")
    for k, v in result["ratios"].items():
        print(f"{k}: {v:.2f}x")
    print(f"bill: {bill['launches_per_rank']} launches per rank, {bill['collectives_per_token']} "
          f"collectives per token, rank graphs {bill['node_types']}; tokens == oracle in every "
          f"arm and rep: {oracle_ok}")
    print(f"source: {source}")
    log(f"wrote {out / name}")
    for eng in engines.values():
        if hasattr(eng, "close"):                # the ranked engines: graphs and communicators
            eng.close()
    if args.backend == "cuda":
        sys.stdout.flush()
        os._exit(0)      # the NCCL communicators are destroyed; leave no exit hooks to hang in
    return 0


if __name__ == "__main__":
    sys.exit(recorder.run(main))
