"""Chains of graph nodes, the unit the cost experiment (experiments/costs.py) measures with: a
step's launches made chainable (main stream; a tokens buffer long enough for a chain), captured
n times over into one graph, replayed; per-node time and per-replay overhead fitted over the chain lengths. And
the host time of a call, the other unit.
"""
from __future__ import annotations

import statistics
import time

import numpy as np

from lab.backend import Launch
from lab.backend.costmodel import cost_key

N1, N2 = 8, 24               # chain lengths (both long enough to keep the device busy)
REPLAYS = 200                # replays per timed batch ...
MIN_REPLAYS = 20             # ... or fewer, never below this, where REPLAYS of the longest
BATCH_S = 0.05               # chain would last past BATCH_S (a 300 us node: 20 replays, not 200)
CHAIN_TOKENS = 1 << 17       # token slots for chains of a launch that advances pos (below)
_chain_tokens: dict = {}     # backend id -> that tokens buffer, allocated on first need


def main_stream(launch: Launch) -> Launch:
    return Launch(launch.kernel, launch.grid, launch.block, launch.args, launch.layer, "main")


def for_chains(eng, launch: Launch) -> Launch:
    """`launch` as a chain replays it: on the main stream; and when it advances `pos` and
    writes the next token (the fused step's norm_lm_head_argmax), with a tokens buffer of
    CHAIN_TOKENS slots: it picks a token only while pos + 1 < len(tokens), and a chain advances
    pos some 20,000 times, so with the step's max_seq slots most of a chain would skip the
    argmax. Its work does not depend on the buffer's length; the row keeps the step's key."""
    names = launch.kernel.arg_names
    args = list(launch.args)
    if "pos" in names and "tokens" in names and names.index("pos") in launch.kernel.writes:
        be = eng.backend
        if id(be) not in _chain_tokens:
            _chain_tokens[id(be)] = be.alloc("chain_tokens", (CHAIN_TOKENS,), np.int32)
        args[names.index("tokens")] = _chain_tokens[id(be)]
    return Launch(launch.kernel, launch.grid, launch.block, tuple(args), launch.layer, "main")


def as_in_step(eng, launch: Launch) -> Launch:
    """A chain's launch with the step's tokens buffer back (its bytes are the step's)."""
    chain = _chain_tokens.get(id(eng.backend))
    args = tuple(eng.buf.tokens if a is chain else a for a in launch.args)
    return Launch(launch.kernel, launch.grid, launch.block, args, launch.layer, launch.stream)


def capture_chain(be, items, repeat: int, pdl: bool):
    """One graph of `items` captured `repeat` times over (launches and stream waits)."""
    be.pdl = pdl
    be.begin_capture()
    try:
        for _ in range(repeat):
            for item in items:
                be.issue(item)
    finally:
        graph = be.end_capture()
    return graph


def replay_us(be, graph, reps: int) -> float:
    """us per replay of `graph` over `reps` replays, after one untimed."""
    graph.launch()
    be.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        graph.launch()
    be.synchronize()
    return 1e6 * (time.perf_counter() - t0) / reps


def batch_replays(be, graph, reps: int = REPLAYS) -> int:
    """Replays per timed batch of `graph`: `reps`, or as many as fill BATCH_S (at least
    MIN_REPLAYS) where one replay is long. Sized by one untimed replay (which also warms it).
    A long node's slope is large against the timer's resolution and the host's noise, so a
    batch of BATCH_S fixes it as well as 200 replays do; the cost file's slowest rows (verify
    attention at position 1000, ~0.3 ms a node) took minutes at a fixed 200."""
    be.synchronize()
    t0 = time.perf_counter()
    graph.launch()
    be.synchronize()
    one = time.perf_counter() - t0
    return max(min(MIN_REPLAYS, reps), min(reps, int(BATCH_S / max(one, 1e-9))))


def chain_fit(be, items, nodes_per_unit: int, pdl: bool, reps: int = REPLAYS, rounds: int = 3,
              lengths=(N1, N2)) -> dict:
    """Per-node time (slope) and per-replay overhead (intercept) of chains of `items`: each
    length's graph replayed in `rounds` alternating batches (`batch_replays` of the longest)."""
    graphs = {n: capture_chain(be, items, n, pdl) for n in lengths}
    reps = batch_replays(be, graphs[max(lengths)], reps)
    times = {n: [] for n in lengths}
    for _ in range(rounds):                    # alternate the lengths: drift hits all alike
        for n in lengths:
            times[n].append(replay_us(be, graphs[n], reps))
    med = {n: statistics.median(v) for n, v in times.items()}
    x = np.array([n * nodes_per_unit for n in lengths], float)
    y = np.array([med[n] for n in lengths])
    slope, intercept = np.polyfit(x, y, 1)
    be.pdl = False
    return {"per_node_us": float(slope), "intercept_us": float(intercept), "replays": reps,
            "replay_us": {str(n): [round(t, 4) for t in times[n]] for n in lengths}}


def step_instances(eng, cfgs, position):
    """{cost_key: [launch, ...]} over the steps of `cfgs` at `position`, all on the main
    stream: every instance of a key in a step (one per layer, each on its own weights and cache)."""
    out: dict = {}
    for cfg in cfgs:
        eng.cfg = cfg
        for launch in eng.step_launches(eng.plan(position)):
            same = out.setdefault(cost_key(launch), [])
            chained = for_chains(eng, launch)
            if not any(x.args == chained.args for x in same):
                same.append(chained)
    return out


def distinct_launches(eng, cfgs, position):
    """{cost_key: its first launch} over the steps of `cfgs` at `position`."""
    return {k: v[0] for k, v in step_instances(eng, cfgs, position).items()}


def set_pos(eng, position):
    eng.backend.upload(eng.buf.pos, np.array([position], np.int32))


def host_per_call(be, fn, calls: int, rounds: int = 3) -> float:
    """Median over `rounds` of the host us per call of `fn` (the device is synchronised after
    each round's calls, outside the timing)."""
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        t1 = time.perf_counter()
        be.synchronize()
        times.append(1e6 * (t1 - t0) / calls)
    return statistics.median(times)
