"""The cost file's recorder: kernel_costs.json (+ ladder.json, fission.json) and spec_costs.json.

The COMPONENT costs the simulator's cost model (lab/backend/costmodel.py) is built from, measured
on the real engine's buffers and launches (nothing here decodes a token):
- every distinct kernel launch of the step (`step_configs`), at the first and last position of
  every attention plan for the attention kernels, as a NODE of a graph: chains cycling through
  the launch's instances in a step, captured n1 and n2 times (slope = per-node time, gap
  included; with and without PDL); the persistent step's one kernel (`measure_persistent`);
- the extra cost of a node whose predecessor runs another kernel (chains of adjacent pairs);
- the floors: empty nodes (per node, per replay), a node that depends on data (`relay`), a
  fork/join pair, the eager device time per kernel (behind the `spin` probe, CUDA events), a
  graph launch's host cost, the device loop's, a capture's and an instantiation's;
- the host cost of one eager launch per kernel and mechanism (dispatcher, prebound), alone and
  within a step's sequence, and the engine's own host work per step (launches stubbed);
- the relative spread of per-token and per-rep times (the noise model uses the spreads only).
Two whole-step files are recorded here, in the process whose host costs were measured (the
host's speed moves between processes): the launch-mechanism ladder (ladder.json, its reps
interleaved with rounds of the host costs) and fission (fission.json, arms.FISSION: its eager
half is host-bound). They are what the model must PREDICT; nothing of them enters the cost file.
The verify steps of speculative decoding (SPEC_STEPS) are the `spec_costs` experiment: the
supplement spec_costs.json beside the cost file.
"""
from __future__ import annotations

import gc
import statistics
import time

import numpy as np

from kernels import REGISTRY, position, probe
from lab import DecodeEngine
from lab.backend import Launch, StreamWait, make_backend
from lab.backend.costmodel import cost_key, launch_bytes
from lab.backend.instrument import LaunchLog
from lab.config import LabConfig
from lab.errors import LabError
from lab.measure import bench, report
from lab.measure.arms import FISSION
from lab.measure.chains import (BATCH_S, MIN_REPLAYS, N1, N2, REPLAYS, as_in_step, capture_chain,
                                chain_fit, distinct_launches, for_chains, host_per_call,
                                main_stream, set_pos, step_instances)
from lab.measure.experiment import today

PROMPT = "ROMEO.\n"
# first and last position of every attention plan (splits 1, 2, 4, 8, 16, 32) and the sweep's end
POSITIONS = (0, 31, 32, 63, 64, 127, 128, 255, 256, 511, 512, 1000)
BASE_POSITION = 64           # where the context-independent kernels are measured
LONG_POSITION = 1000         # where the unfused step's switches are measured again (PDL's sign)
# kernels whose time or shapes move with the plan or the context: measured at every POSITION
# (step_persistent, the whole step of LAB_PERSISTENT=1, walks the context in its attention)
ATTENTION = ("attn_partial", "attn_merge", "attn_combine", "attn_fused", "attn_fused_grid",
             "attn_partial_wide",
             "verify_partial", "draft_lookup", "step_persistent")
# the verify steps of speculative decoding (LAB_DRAFT, LAB_DRAFT_SPLITS, LAB_DRAFTER) the cost
# file covers: each draft length of lab.measure.spec's curve, its split-count sweep's verify
# attention, and the n-gram drafter's kernel (break_even's other drafter)
SPEC_STEPS = ((2, 16, "lookup"), (4, 16, "lookup"), (8, 16, "lookup"), (4, 1, "lookup"),
              (4, 4, "lookup"), (4, 64, "lookup"), (4, 16, "ngram"))


def step_configs(base: LabConfig) -> list[LabConfig]:
    """Every step whose launches the cost file covers: the unfused step, its combine split, its
    overlap; the fused step with each attention tail (LAB_ATTN_TAIL), its heads tail's split
    (LAB_SPLIT_COMBINE=1: the grid tail's split is the unfused step's attention), its
    overlap."""
    fused = base.replace(fusion=True)
    heads = fused.replace(attn_tail="heads")
    return [base, base.replace(split_combine=True), base.replace(overlap=True), fused, heads,
            heads.replace(split_combine=True), fused.replace(overlap=True)]


def kernel_launches(eng, cfgs):
    """(position, cost key, the key's instances in a step) for every launch the cost file
    records: each attention kernel at every POSITION, the others at BASE_POSITION."""
    for position in POSITIONS:
        eng.reset(eng.encode(PROMPT), 0)
        eng.seek(position)
        for key, same in step_instances(eng, cfgs, position).items():
            if position == BASE_POSITION or same[0].name in ATTENTION:
                yield position, key, same


def kernel_row(eng, position: int, key: str, same: list) -> dict:
    """What a kernel row of the cost file says of the launch before its times: its key, kernel,
    position and context, geometry, bytes and its instances in a step."""
    launch = same[0]
    return {"key": key, "kernel": launch.name, "position": position, "context": position + 1,
            "grid": list(launch.grid), "block": list(launch.block),
            "bytes": launch_bytes(as_in_step(eng, launch), position + 1), "instances": len(same)}


def measure_kernels(eng, cfgs, progress, seen: set | None = None) -> list[dict]:
    """Each launch of `kernel_launches` as a graph node (a (position, key) in `seen` is
    skipped, and every one measured is added to it)."""
    rows = []
    for position, key, same in kernel_launches(eng, cfgs):
        if seen is not None:
            if (position, key) in seen:
                continue
            seen.add((position, key))
        launch = same[0]
        row = kernel_row(eng, position, key, same)
        for pdl in (False, True):
            set_pos(eng, position)
            # the chain cycles through the key's instances (each layer's weights and cache),
            # as a step does: a chain of ONE instance re-reads data its SMs still cache
            fit = chain_fit(eng.backend, same, len(same), pdl)
            row["node_pdl_us" if pdl else "node_us"] = fit["per_node_us"]
            row["intercept_pdl_us" if pdl else "intercept_us"] = fit["intercept_us"]
            row["replays_pdl" if pdl else "replays"] = fit["replays"]
        rows.append(row)
        progress(f"  {launch.name:<16} pos {position:>4}: {row['node_us']:.3f} us/node, "
                 f"{row['node_pdl_us']:.3f} with PDL   [{key}]")
    set_pos(eng, 0)
    return rows


def measure_switches(eng, cfgs, kernels, progress, seen: set | None = None,
                     position: int = BASE_POSITION) -> list[dict]:
    """What a node costs beyond its own chain time when the node before it runs ANOTHER kernel
    (a chain of one launch keeps its code and constants cached; a step alternates kernels):
    chains of the pair [a, b] for every adjacent pair of launches in the steps of `cfgs` at
    `position` (a pair in `seen` skipped; each measured added to it). At another position than
    BASE_POSITION only the attention kernels' keys are new (their grid is the plan's), so the
    pairs there are the ones into and out of attention."""
    eng.reset(eng.encode(PROMPT), 0)
    eng.seek(position)
    alone = {(r["key"], pdl): r["node_pdl_us" if pdl else "node_us"]
             for r in kernels if r["position"] in (position, BASE_POSITION) for pdl in (False, True)}
    pairs = {}
    for cfg in cfgs:
        eng.cfg = cfg
        launches = eng.step_launches(eng.plan(position))
        for a, b in zip(launches, launches[1:]):   # keyed as the step's launches, chained as above
            if seen is not None and (cost_key(a), cost_key(b)) in seen:
                continue
            pairs.setdefault((cost_key(a), cost_key(b)), (for_chains(eng, a), for_chains(eng, b)))
    if seen is not None:
        seen.update(pairs)
    rows = []
    for (ka, kb), (a, b) in pairs.items():
        row = {"prev": ka, "key": kb, "position": position}
        for pdl in (False, True):
            set_pos(eng, position)
            fit = chain_fit(eng.backend, [a, b], 2, pdl)
            both = alone[(ka, pdl)] + alone[(kb, pdl)]
            # a chain of pairs switches kernel at every node: half the pair's extra per switch
            row["extra_pdl_us" if pdl else "extra_us"] = (2 * fit["per_node_us"] - both) / 2
        rows.append(row)
        progress(f"  {a.name:>16} -> {b.name:<16} switch {row['extra_us']:+.3f} us "
                 f"({row['extra_pdl_us']:+.3f} with PDL)")
    set_pos(eng, 0)
    return rows


def measure_spec(model, base: LabConfig, progress) -> tuple[list[dict], list[dict]]:
    """The verify steps' launches (SPEC_STEPS), as nodes and as switches, each on an engine of
    its own (a draft length is allocated, not switched): (kernel rows, switch rows). A key or
    pair already measured for another verify step is not measured again."""
    kernels, switches, seen_k, seen_s = [], [], set(), set()
    for draft, splits, drafter in SPEC_STEPS:
        cfg = base.replace(draft=draft, draft_splits=splits, drafter=drafter)
        eng = DecodeEngine(model, cfg)
        eng.log = LaunchLog()
        eng.bind()
        progress(f"  verify step: LAB_DRAFT={draft}, LAB_DRAFT_SPLITS={splits}, "
                 f"LAB_DRAFTER={drafter}")
        rows = measure_kernels(eng, [cfg], progress, seen_k)
        kernels += rows
        switches += measure_switches(eng, [cfg], kernels, progress, seen_s)
        del eng
        gc.collect()
    return kernels, switches


def measure_persistent(model, base: LabConfig, progress) -> tuple[list[dict], dict]:
    """step_persistent (LAB_PERSISTENT=1: the whole step in one cooperative kernel) as a graph
    node at every POSITION, on an engine of its own (the persistent step is allocated: stacked
    weights, one KV buffer): (kernel rows, the pos_set probe's own chain fit).

    The kernel advances `pos`, so a chain of it would walk the context (and run past max_seq).
    Its chain unit is therefore [step_persistent, pos_set(position)]: the probe puts the position
    back after every step, so every step of the chain runs at `position`. The unit's time is
    2 x the fit's per-node slope; the step's node time is that minus pos_set's node time, from
    pos_set ALONE in a chain (measured here, once: its work does not depend on the position).
    The two switches of the unit (step_persistent -> pos_set -> step_persistent) stay in the
    step's figure: a persistent step's graph has one node, so the cost model charges it no
    switch of its own. No PDL: LAB_PDL=1 is refused with LAB_PERSISTENT=1 (the row's PDL
    figures repeat the plain ones, so the cost model reads it like every other row)."""
    cfg = base.replace(persistent=True, graph=False, pdl=False)
    eng = DecodeEngine(model, cfg)
    eng.log = LaunchLog()
    eng.bind()
    be = eng.backend

    def pos_set(position):
        return Launch(REGISTRY["pos_set"], probe.POS_SET_GRID, probe.POS_SET_BLOCK,
                      (eng.buf.pos, np.int32(position)), None, "main")
    set_pos(eng, BASE_POSITION)
    probe_fit = chain_fit(be, [pos_set(BASE_POSITION)], 1, False)
    probe_us = probe_fit["per_node_us"]
    progress(f"  pos_set chain: {probe_us:.3f} us/node (subtracted from each persistent unit)")
    rows = []
    for position, key, same in kernel_launches(eng, [cfg]):
        launch = same[0]
        set_pos(eng, position)
        fit = chain_fit(be, [launch, pos_set(position)], 2, False)
        after = int(be.download(eng.buf.pos)[0])
        if after != position:   # every unit must end where it began: else the rows walk the context
            raise LabError(f"the persistent chain ended at position {after}, not {position}: "
                           f"pos_set did not put the position back")
        unit = 2 * fit["per_node_us"]
        node = unit - probe_us
        rows.append({**kernel_row(eng, position, key, same), "splits": eng.plan(position).splits,
                     "node_us": node, "node_pdl_us": node,
                     "intercept_us": fit["intercept_us"], "intercept_pdl_us": fit["intercept_us"],
                     "unit_us": unit, "pos_set_us": probe_us,
                     "chain": "[step_persistent, pos_set(position)] x n: node = unit - pos_set",
                     "pdl": "not measured: LAB_PDL=1 is refused with LAB_PERSISTENT=1 "
                            "(node_pdl_us = node_us)"})
        progress(f"  {launch.name:<16} pos {position:>4}: {node:.3f} us/node (unit with pos_set "
                 f"{unit:.3f} us; no PDL)   [{key}]")
    set_pos(eng, 0)
    del eng
    gc.collect()
    return rows, probe_fit


def measure_floors(eng, progress) -> dict:
    be = eng.backend
    flag = be.alloc("probe_flag", (1,), np.int32)
    empty = Launch(REGISTRY["empty"], probe.EMPTY_GRID, probe.EMPTY_BLOCK, (flag,))
    empty_side = Launch(REGISTRY["empty"], probe.EMPTY_GRID, probe.EMPTY_BLOCK, (flag,), None, "side")
    out = {}
    for pdl in (False, True):
        fit = chain_fit(be, [empty], 1, pdl, lengths=(8, 24, 37, 64))
        out["empty_pdl" if pdl else "empty"] = fit
        progress(f"  empty chain{' + PDL' if pdl else ''}: {fit['per_node_us']:.3f} us/node, "
                 f"{fit['intercept_us']:.3f} us per replay")
    out.update(relay_floor(be, progress))
    # a fork/join pair: [empty; fork; empty(side) || empty; join] vs [empty; empty]
    par = [empty, StreamWait("main", "side"), empty_side, empty, StreamWait("side", "main")]
    seq = [empty, empty]
    fj, sq = chain_fit(be, par, 2, False), chain_fit(be, seq, 2, False)
    out["fork_join"] = {"parallel": fj, "sequential": sq,
                        "extra_us_per_pair": 2 * (fj["per_node_us"] - sq["per_node_us"])}
    progress(f"  fork/join pair: +{out['fork_join']['extra_us_per_pair']:.3f} us")
    out["eager_device"] = eager_device_floor(eng, empty, progress)
    # host cost of one graph launch (1-node graph of the empty kernel: device time < host time)
    g1 = capture_chain(be, [empty], 1, False)
    out["graph_submit_us"] = host_per_call(be, g1.launch, 2000)
    progress(f"  graph launch, host: {out['graph_submit_us']:.3f} us")
    out["loop"] = loop_floor(eng, progress)
    out["capture"] = capture_floor(be, empty, progress)
    return out


def relay_floor(be, progress, lengths=(4, 12, 32)) -> dict:
    """{"relay": fit, "relay_pdl": fit}: the floor of a node that depends on data, from chains
    of [relay(a, b), relay(b, a)] (each node reads the 1 KB the node before it wrote), without
    and with PDL."""
    a, b = (be.alloc(f"probe_relay_{n}", (256,), np.float32) for n in "ab")
    relays = [Launch(REGISTRY["relay"], probe.RELAY_GRID, probe.RELAY_BLOCK, (a, b)),
              Launch(REGISTRY["relay"], probe.RELAY_GRID, probe.RELAY_BLOCK, (b, a))]
    out = {}
    for pdl in (False, True):
        fit = chain_fit(be, relays, 2, pdl, lengths=lengths)
        out["relay_pdl" if pdl else "relay"] = fit
        progress(f"  relay chain{' + PDL' if pdl else ''}: {fit['per_node_us']:.3f} us/node "
                 f"(a node that reads what the node before it wrote)")
    # every relay read the one before's output: a = b + 1 everywhere (both start at zero)
    va, vb = be.download(a), be.download(b)
    if not (np.all(va == va[0]) and np.all(va - vb == 1) and va[0] >= 2):
        raise RuntimeError(f"relay chains: a[0] {va[0]}, b[0] {vb[0]}: not a chain of relays")
    return out


def capture_floor(be, empty, progress, lengths=(8, 64), rounds: int = 15) -> dict:
    """Host time to capture a graph of n launches (begin_capture .. end_capture, not
    instantiated) and to instantiate it, for chains of n empty launches: medians over `rounds`,
    per node (slope over n) and per graph (intercept). What a step that captures instead of
    replaying pays on the host (the simulator charges it: LAB_BUG_STEP_KEY, LAB_BUG_SPEC_KEY)."""
    times = {what: {n: [] for n in lengths} for what in ("capture", "instantiate")}
    for _ in range(rounds):
        for n in lengths:
            t0 = time.perf_counter()
            be.begin_capture()
            for _ in range(n):
                be.launch(empty)
            source = be.end_capture(instantiate=False)
            t1 = time.perf_counter()
            graph = be.instantiate(source)
            t2 = time.perf_counter()
            times["capture"][n].append(1e6 * (t1 - t0))
            times["instantiate"][n].append(1e6 * (t2 - t1))
            del graph, source
    out = {}
    n1, n2 = lengths
    for what, by_n in times.items():
        med = {n: statistics.median(v) for n, v in by_n.items()}
        per_node = (med[n2] - med[n1]) / (n2 - n1)
        out[what] = {"per_node_us": per_node, "intercept_us": med[n1] - per_node * n1,
                     "median_us": {str(n): med[n] for n in lengths}}
        progress(f"  {what}: {per_node:.3f} us per node + {out[what]['intercept_us']:.1f} us "
                 f"per graph (host)")
    return out


def loop_floor(eng, progress, iterations=(200, 1000), rounds: int = 5) -> dict:
    """The device loop's own cost per iteration (LAB_LOOP=device): a WHILE-over-SWITCH graph
    whose one body is a single `advance` node, run for n iterations in ONE launch (wall time
    around a synchronize); the slope over n, minus the same node's cost in a plain chain, is
    what the conditional nodes and their two condition kernels add per iteration."""
    be = eng.backend
    why = ("the simulator's device loop costs what this file records, not a measurement"
           if be.simulated else be.loop_support())
    if why is not None:
        progress(f"  device loop: not measured ({why})")
        return {"why_not": why}
    n_max = max(iterations)
    table = be.alloc("loop_table", (n_max + 1,), np.int32)      # zeros: body 0 everywhere
    pos, limit = be.alloc("loop_pos", (1,), np.int32), be.alloc("loop_limit", (1,), np.int32)
    adv = Launch(position.advance, position.ADVANCE_GRID, position.ADVANCE_BLOCK, (pos,))
    loop = be.build_loop(1, lambda k: be.launch(adv), pos, table, limit)

    def wall_us(n):
        be.upload(pos, np.zeros(1, np.int32))
        be.upload(limit, np.array([n], np.int32))
        be.synchronize()
        t0 = time.perf_counter()
        loop.launch()
        be.synchronize()
        return 1e6 * (time.perf_counter() - t0)
    wall_us(n_max)                                            # first launch: warm
    med = {n: statistics.median(wall_us(n) for _ in range(rounds)) for n in iterations}
    n1, n2 = iterations
    per_iteration = (med[n2] - med[n1]) / (n2 - n1)
    node = chain_fit(be, [adv], 1, False)["per_node_us"]
    out = {"per_iteration_us": per_iteration, "advance_node_us": node,
           "overhead_us": per_iteration - node, "iterations": list(iterations),
           "wall_us": {str(n): med[n] for n in iterations}}
    progress(f"  device loop: {per_iteration:.3f} us per iteration with one advance node "
             f"({node:.3f} us as a chain node): +{out['overhead_us']:.3f} us of loop machinery")
    return out


def behind_spin(be, out_buf, iters: int, issue) -> tuple[float, float, float]:
    """(spin us, host us, device us) of the launches `issue()` makes queued behind the `spin`
    kernel of `iters` iterations (writing out_buf), timed by CUDA events: the device time is
    theirs alone when the spin outlasted the host's enqueueing (spin us > host us)."""
    cp = be.cp
    spin = Launch(REGISTRY["spin"], probe.SPIN_GRID, probe.SPIN_BLOCK, (np.int32(iters), out_buf))
    e0, e1, e2 = (cp.cuda.Event() for _ in range(3))
    e0.record(be.stream)
    be.launch(spin)
    e1.record(be.stream)
    t0 = time.perf_counter()
    issue()
    host_us = 1e6 * (time.perf_counter() - t0)
    e2.record(be.stream)
    e2.synchronize()
    return (1000 * cp.cuda.get_elapsed_time(e0, e1), host_us,
            1000 * cp.cuda.get_elapsed_time(e1, e2))


def eager_device_floor(eng, empty, progress) -> dict:
    """Device time per eager launch of the empty kernel: N launches queued behind a spinning
    kernel (the host enqueues them all while the device is held), timed by CUDA events."""
    be = eng.backend
    if be.name != "cuda":
        return {"skipped": "needs CUDA events"}
    out_buf = be.alloc("probe_spin", (1,), np.float32)
    n, iters = 400, 2_000_000
    res = []
    be.mechanism, be.pdl = "prebound", False

    def issue():
        for _ in range(n):
            be.launch(empty)

    for _ in range(3):
        spin_us, host_us, dev_us = behind_spin(be, out_buf, iters, issue)
        res.append({"spin_us": spin_us, "host_enqueue_us": host_us, "per_launch_us": dev_us / n,
                    "queued_behind": bool(spin_us > host_us)})
        if spin_us <= host_us:
            iters *= 4
    ok = [r["per_launch_us"] for r in res if r["queued_behind"]]
    progress(f"  eager empty kernel, device: {statistics.median(ok) if ok else float('nan'):.3f} us")
    return {"per_launch_us": statistics.median(ok) if ok else None, "runs": res}


def _issue_step(be, step):
    for launch in step:
        be.launch(launch)


def sequence_us(be, step, calls: int = 20) -> float:
    """Host us per launch of `step`'s launches issued straight to the backend (host time only),
    after one untimed issue: a step's launch sequence without the engine around it."""
    _issue_step(be, step)
    return host_per_call(be, lambda: _issue_step(be, step), calls, 1) / len(step)


def engine_host_us(eng, steps: int = 50) -> float:
    """Host us per step of the engine's own work (plan, ledger, issue loop): `steps` steps from
    where it stands, its backend's launches and stream waits and its graphs' launches stubbed
    out."""
    be = eng.backend
    stubs = [(be, "launch"), (be, "record_wait")] + [(g, "launch") for g in eng.graphs.values()]
    for obj, name in stubs:
        setattr(obj, name, lambda *a, **k: None)
    try:
        t0 = time.perf_counter()
        for _ in range(steps):
            eng.step()
        return 1e6 * (time.perf_counter() - t0) / steps
    finally:
        for obj, name in stubs:
            delattr(obj, name)


def host_alone(eng, cfgs, step, progress) -> dict:
    """Host us per eager launch of each kernel alone (loops of one launch), per mechanism: the
    relative weights of the kernels. The engine's launch log is attached, as in a real run."""
    be = eng.backend
    eng.reset(eng.encode(PROMPT), 0)
    eng.seek(BASE_POSITION)
    launches = distinct_launches(eng, cfgs, BASE_POSITION)
    out = {}
    for mech in ("dispatcher", "prebound"):
        eng.cfg = cfgs[0].replace(launch=mech)
        times: dict = {key: [] for key in launches}
        for _ in range(5):          # rounds over all kernels: drift hits every kernel alike
            for key, launch in launches.items():
                set_pos(eng, BASE_POSITION)
                be.launch(launch)                    # first launch: prepares (prebound)
                times[key].append(host_per_call(be, lambda: be.launch(launch), 100, 1))
        set_pos(eng, BASE_POSITION)
        per = out[mech] = {key: statistics.median(v) for key, v in times.items()}
        out[f"{mech}_alone_over_step_us"] = statistics.mean(per[cost_key(x)] for x in step)
        progress(f"  host per launch alone, {mech}: mean {statistics.mean(per.values()):.2f} us "
                 f"over {len(per)} kernels")
    # the launch log's share: one launch with and without the log attached
    launch = step[0]
    with_log, without = [], []
    for _ in range(3):
        be.log = eng.log
        with_log.append(host_per_call(be, lambda: be.launch(launch), 2000, 1))
        be.log = None
        without.append(host_per_call(be, lambda: be.launch(launch), 2000, 1))
    eng.bind()
    set_pos(eng, BASE_POSITION)
    out["instrumentation_us"] = statistics.median(with_log) - statistics.median(without)
    progress(f"  launch log: {out['instrumentation_us']:.3f} us per launch")
    return out


def host_round(eng, base: LabConfig, step, rounds: dict) -> None:
    """One round of the host costs that drift with the host's speed: a step's launches issued
    straight to the backend (host time only, per launch) for each mechanism, and the engine's
    own work per step with its launches stubbed out. Appends to `rounds`."""
    be = eng.backend
    for mech in ("dispatcher", "prebound"):
        eng.cfg = base.replace(graph=False, launch=mech)
        set_pos(eng, BASE_POSITION)
        rounds.setdefault(f"{mech}_step_sequence_us", []).append(sequence_us(be, step))
    for mode in ("eager", "graph"):
        eng.cfg = base.replace(graph=(mode == "graph"))
        eng.reset(eng.encode(PROMPT), 0)
        eng.seek(BASE_POSITION)
        eng.step()                                   # captures the plan's graph in graph mode
        eng.seek(BASE_POSITION)
        be.synchronize()
        rounds.setdefault(f"engine_{mode}_us", []).append(engine_host_us(eng))
    eng.cfg = base


def host_and_ladder(eng, model, base: LabConfig, cfgs, ctx, progress, reps=5,
                    rungs=None) -> tuple:
    """Host costs, measured in rounds INTERLEAVED with the ladder's reps (the host's speed moves
    from minute to minute and process to process; interleaving makes both see the same host).
    The ladder (whole steps; `rungs`: the names of bench.LADDER to run, all by default; the
    persistent rung on an engine of its own) goes to ladder.json: it is what the model must
    predict, and none of it enters kernel_costs.json."""
    eng.cfg = base
    eng.reset(eng.encode(PROMPT), 0)
    step = [main_stream(x) for x in eng.step_launches(eng.plan(BASE_POSITION))]
    host = host_alone(eng, cfgs, step, progress)
    rounds: dict = {}
    ladder = bench.run_ladder(model, base.replace(graph=True), reps=reps, tokens=64,
                              before_rep=lambda rep: host_round(eng, base, step, rounds),
                              pool={bench.pool_key(base): eng}, rungs=rungs)
    for k in ("dispatcher_step_sequence_us", "prebound_step_sequence_us"):
        host[k] = statistics.median(rounds[k])
    host["rounds"] = rounds
    engine_host = {m: statistics.median(rounds[f"engine_{m}_us"]) for m in ("eager", "graph")}
    progress(f"  host per launch in a step's sequence: dispatcher "
             f"{host['dispatcher_step_sequence_us']:.2f} us, prebound "
             f"{host['prebound_step_sequence_us']:.2f} us; engine per step: eager "
             f"{engine_host['eager']:.2f} us, graph {engine_host['graph']:.2f} us")
    ctx.write_json("ladder.json", ladder)
    progress("wrote ladder.json\n" + report.format_ladder(ladder))
    return host, engine_host


def _quiet_heap(eng) -> None:
    """Before a host-bound timing: a fresh launch log (the chains above logged ~10^5 launches)
    and the heap collected then frozen, so no full garbage collection of this process's large,
    long-lived heap lands inside a timed rep (one did: a 130 ms stall in one eager rep)."""
    eng.log = LaunchLog()
    eng.bind()
    gc.collect()
    gc.freeze()


def record_fission(model, base: LabConfig, eng, ctx, progress, reps=15, eager_reps=40,
                   tokens=64) -> None:
    """fission.json: the A/Bs of arms.FISSION on this engine (one-kernel combine vs merge +
    project; the fused step's heads tail, attn_fused vs its three phases; its grid tail,
    attn_fused_grid vs attn_partial + attn_combine), each eagerly and captured. Recorded here
    because its eager half is host-bound and the host's speed differs between processes (up to
    1.5x on one lease): the model's host costs come from this process. 15 reps captured (with
    5, the eager effect, about 4 launches' host time, had a standard error of a third of
    itself); 40 eager (a rep of 64 host-bound tokens takes about 20 ms)."""
    pool = {bench.pool_key(base): eng}
    fission: dict = {"what": "fission under capture: one-kernel combine (A) vs merge + project (B); "
                             "fused: attn_fused (A) vs partials + merge + per-head projection (B); "
                             "fused_grid: attn_fused_grid (A) vs attn_partial + attn_combine (B)"}
    for pair in FISSION:
        *keys, mode = pair.path.split(".")
        where = fission.setdefault(keys[0], {}) if keys else fission
        a, b = pair.configs(base)
        where[mode] = bench.run_ab(model, a, b, reps=eager_reps if pair.host_paced else reps,
                                   tokens=tokens, names=pair.names, per_token=200, pool=pool)
    fission.update(source=fission["graph"]["source"], date=fission["graph"]["date"])
    ctx.write_json("fission.json", fission)
    progress("wrote fission.json\n" + "\n".join(
        f"[{p.lesson}]\n{report.format_ab(_at(fission, p.path))}" for p in FISSION))
    eng.cfg = base


def _at(data: dict, path: str):
    for part in path.split("."):
        data = data[part]
    return data


def measure_noise(eng, base: LabConfig, progress, reps=5, tokens=64, per_token=200) -> dict:
    """Relative spreads: per-token times (clock per step) and ms/token of whole reps."""
    out = {}
    for name, cfg in (("dispatcher", base.replace(graph=False, launch="dispatcher")),
                      ("prebound", base.replace(graph=False, launch="prebound")),
                      ("graph", base.replace(graph=True))):
        eng.cfg = cfg
        be = eng.backend
        ids = eng.encode(PROMPT)
        reps_ms = []
        for _ in range(reps + 1):
            eng.reset(ids, tokens)
            t0 = be.clock()
            for _ in range(ids.size - 1 + tokens):
                eng.step()
            reps_ms.append(1000 * (be.clock() - t0) / (ids.size - 1 + tokens))
        reps_ms = reps_ms[1:]                        # the first is a warm-up
        eng.reset(ids, per_token)
        ts, t = [], be.clock()
        for _ in range(ids.size - 1 + per_token):
            eng.step()
            t1 = be.clock()
            ts.append(1000 * (t1 - t))
            t = t1
        ts = np.array(ts[ids.size:])
        med = float(np.median(ts))
        mad = float(np.median(np.abs(ts - med)))
        out[name] = {"rep_cv": float(np.std(reps_ms, ddof=1) / np.mean(reps_ms)),
                     "token_cv_robust": 1.4826 * mad / med,
                     "token_cv": float(np.std(ts, ddof=1) / np.mean(ts)),
                     "tokens_per_rep": tokens, "reps": reps,
                     "rep_seconds": float(np.mean(reps_ms)) * tokens / 1000}
        progress(f"  noise {name}: rep cv {out[name]['rep_cv']:.4f}, token cv (robust) "
                 f"{out[name]['token_cv_robust']:.4f}")
    eng.cfg = base
    return out


def _engine(ctx, base: LabConfig):
    eng = DecodeEngine(ctx.model, base)
    eng.log = LaunchLog()
    eng.bind()
    return eng


def record_costs(ctx) -> None:
    """The simulator's component costs (kernel_costs.json), and in the same process the ladder
    and fission, whose host-bound arms need this process's host (notebooks 03, 06, 10)."""
    base = LabConfig(backend=ctx.backend, graph=False)
    eng = _engine(ctx, base)
    cfgs = step_configs(base)
    progress = ctx.progress
    progress("floors")
    floors = measure_floors(eng, progress)
    progress("kernels as graph nodes")
    kernels = measure_kernels(eng, cfgs, progress)
    progress("kernel switches")
    seen_switches: set = set()
    switches = measure_switches(eng, cfgs, kernels, progress, seen_switches)
    progress(f"kernel switches at position {LONG_POSITION} (the pairs with attention's long plan)")
    switches += measure_switches(eng, cfgs[:1], kernels, progress, seen_switches, LONG_POSITION)
    progress("the persistent step (LAB_PERSISTENT=1), unit [step_persistent, pos_set]")
    rungs = None                     # the ladder's rungs: all, unless the persistent step failed
    try:
        persistent_kernels, floors["pos_set"] = measure_persistent(ctx.model, base, progress)
    except Exception as exc:         # noqa: BLE001 -- a refusal (no co-residency) or a compile
        persistent_kernels = []      # error must not cost the recording every other figure
        floors["persistent_not_measured"] = f"{type(exc).__name__}: {exc}"
        rungs = [name for name, _, _ in bench.LADDER if name != "persistent"]
        progress(f"  persistent step NOT measured, and left off the ladder: "
                 f"{floors['persistent_not_measured']}")
    kernels += persistent_kernels
    progress("host costs, interleaved with the ladder")
    _quiet_heap(eng)
    host, engine_host = host_and_ladder(eng, ctx.model, base, cfgs, ctx, progress, rungs=rungs)
    progress("fission, in this process (its eager half is host-bound)")
    _quiet_heap(eng)
    record_fission(ctx.model, base, eng, ctx, progress)
    progress("noise")
    noise = measure_noise(eng, base, progress)
    gc.unfreeze()
    eng.cfg = base
    ctx.write_json("kernel_costs.json", {
        "launches_per_token": len(eng.step_launches(eng.plan(BASE_POSITION))),
        "what": "component costs for the simulator's cost model (lab/backend/costmodel.py)",
        "source": eng.backend.describe(), "date": today(),
        "method": {"chains": f"graphs of n = {N1} and {N2} copies of one launch, replayed "
                             f"{REPLAYS}x (or fewer, at least {MIN_REPLAYS}, where that would "
                             f"last past {BATCH_S} s a batch: each row's `replays`), "
                             f"3 alternating rounds, medians; per-node time = slope",
                   "positions": list(POSITIONS), "base_position": BASE_POSITION},
        "floors": floors, "kernels": kernels, "switches": switches, "host": host,
        "engine_host_us": engine_host, "noise": noise})


def record_spec_costs(ctx) -> None:
    """The verify steps' component costs (SPEC_STEPS, LAB_DRAFT), the cost file's supplement
    (notebook 14)."""
    base = LabConfig(backend=ctx.backend, graph=False)
    kernels, switches = measure_spec(ctx.model, base, ctx.progress)
    ctx.write_json("spec_costs.json", {
        "what": "a supplement of kernel_costs.json: the verify steps' component costs (LAB_DRAFT)",
        "source": make_backend(base).describe(), "date": today(),
        "kernels": kernels, "switches": switches})
