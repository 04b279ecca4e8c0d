"""PDL edge by edge: the unfused step captured as a chain, every launch programmatic but one
kernel's, so that an arm minus "every launch programmatic" is what the edges INTO that kernel
save (positive) or cost (negative: that kernel's early launch turns into a wait).

The step at `position` is captured STEPS times over into one graph, its `advance` left out, so
every step of the chain attends over the same context (the device position never moves); the
graph is replayed and timed on the backend's clock (wall time on a GPU, model time on the
simulator: the same protocol gives the simulator's prediction). The arms of one context are
interleaved in rotating order, round after round; mean and standard error over the rounds, and
each arm's difference to "graph+pdl" paired by round.

`decode-lab record pdl_context` records it on a GPU (data/gpu/pdl_context*.json); the
conformance lesson "pdl context" (lab/measure/conformance.py) re-runs its two whole-step arms,
graph and graph+pdl, on the simulator.

Measured this way, and not as a decode: a graph step WITHOUT PDL moves from engine to engine
(data/gpu/engine_instances.json: 80.8 to 81.6 us per token across four identical engines in one
pass, while the same step ran at 75 in another process), and PDL hides most of that; a chain on
one engine, replayed many times, repeated to 0.1 us across leases.
"""
from __future__ import annotations

import statistics

import numpy as np

from .stats import rotated

STEPS = 8          # steps per captured chain
REPLAYS = 100      # replays per timing
ROUNDS = 7         # rounds of every arm, in rotating order
PROMPT = "ROMEO.\n"


def chain_launches(eng, position: int) -> list:
    """The unfused step at `position` as the chain repeats it: without its `advance`."""
    eng.reset(eng.encode(PROMPT), 0)
    eng.seek(position)
    return [x for x in eng.step_launches(eng.plan(position)) if x.name != "advance"]


def capture(be, launches, programmatic) -> object:
    """STEPS copies of `launches` in one graph; a launch is programmatic when
    programmatic(its kernel name)."""
    be.begin_capture()
    try:
        for _ in range(STEPS):
            for x in launches:
                be.pdl = programmatic(x.name)
                be.launch(x)
    finally:
        be.pdl = False
        graph = be.end_capture()
    return graph


def replay_us(be, graph, reps: int) -> float:
    """us per replay of `graph` over `reps` replays, after one untimed, on the backend's clock."""
    graph.launch()
    t0 = be.clock()
    for _ in range(reps):
        graph.launch()
    return 1e6 * (be.clock() - t0) / reps


def arms_for(names, edges: bool = True) -> dict:
    """{arm: programmatic(kernel name)}: graph (none), graph+pdl (all) and, with `edges`, one
    arm per kernel of `names` with every launch programmatic but that kernel's."""
    arms = {"graph": lambda n: False, "graph+pdl": lambda n: True}
    if edges:
        for k in names:
            arms[f"pdl - {k}"] = (lambda k: lambda n: n != k)(k)
    return arms


def measure(eng, position: int, edges: bool = True, rounds: int = ROUNDS,
            replays: int = REPLAYS) -> dict:
    """One context: every arm's us per chained step, and each arm minus graph+pdl."""
    launches = chain_launches(eng, position)
    names = list(dict.fromkeys(x.name for x in launches))
    arms = arms_for(names, edges)
    graphs = {a: capture(eng.backend, launches, f) for a, f in arms.items()}
    times: dict = {a: [] for a in arms}
    for r in range(rounds):
        for a in rotated(arms, r):
            eng.backend.upload(eng.buf.pos, np.array([position], np.int32))
            times[a].append(replay_us(eng.backend, graphs[a], replays) / STEPS)
    pdl = times["graph+pdl"]
    rows = []
    for a, t in times.items():
        d = [x - y for x, y in zip(t, pdl)]     # paired by round
        n = len(t)
        rows.append({"arm": a, "us_per_step": statistics.fmean(t),
                     "sem_us": statistics.stdev(t) / n ** 0.5 if n > 1 else 0.0,
                     "minus_pdl_us": statistics.fmean(d),
                     "minus_pdl_sem_us": (statistics.stdev(d) / n ** 0.5
                                          if n > 1 and a != "graph+pdl" else 0.0),
                     "samples_us": [round(x, 4) for x in t]})
    return {"position": position, "context": position + 1, "launches": len(launches),
            "splits": eng.plan(position).splits, "kernels": names, "rows": rows}


def pdl_saving_us(context_result: dict) -> tuple[float, float]:
    """(graph+pdl - graph in us per step, its standard error) of one measured context."""
    row = {r["arm"]: r for r in context_result["rows"]}["graph"]
    return -row["minus_pdl_us"], row["minus_pdl_sem_us"]
