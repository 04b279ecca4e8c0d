"""Conformance: does the simulator predict what the GPU measured?

Every lesson with a recorded GPU figure (the whole-step files in data/gpu/) is re-run on the
simulator with the recording's own settings, and each figure is put beside the recorded one.
The simulator's costs come from component measurements only (kernel_costs.json), so every
whole-step row is a prediction, not a fit. A row PASSES when the sign agrees and the simulated
value is within 25% of the GPU's; where the GPU effect itself is under 2 us, when it is within
1 us. (An effect that small can move, sign included, between processes on the same GPU: graph
fission measured -0.38, +0.6 and -0.84 us/token in three runs of an earlier build's kernels,
and +2.36 ± 0.03 with this build's (fission.json). So under 2 us only the absolute distance is
judged.) Counts (launches, nodes) must agree exactly.

The table shows each A/B figure's own standard error beside it. A recorded effect whose
standard error is a quarter of itself (eager fission: host-bound, its per-rep differences spread
widely) can miss a 25% band by noise alone; such a row also PASSES, marked `PASS (2 sem)`, when
the sign agrees and the simulated value lies within two of the recording's standard errors: the
recording cannot tell the two apart. The summary line counts those rows separately.

Host-paced rows (eager arms: the host's launch speed sets them) are scaled by the ratio of the
recording's host probe to the cost file's (lab/measure/registry.py's host_probe, in each file's
stamp), bounded to PROBE_BOUNDS and printed: a recording on a faster or slower host then judges
the lesson, not the host. Device-paced rows (graphs, counts, nodes) are never scaled; a file
without a probe leaves its rows unscaled, and the report says so. The A/B arms predicted here
are the ones the experiments record (lab/measure/arms.py: OVERLAP, FISSION, DEVICE_LOOP).

The lesson "megakernel" (megakernel_rows) is arithmetic on recordings, not a simulation: the
persistent graph arm's ms/token predicted from each phase's work and one counter hand-off per
phase (the stamped kernel's clocks, a launch of their own, persistent.json) plus one graph
node's floor (kernel_costs.json), against the arm the sweep measured; and, where
megakernel_bound.json is recorded, the same chain without the output projection's phases
against the body that leaves them out.

`decode-lab conformance` prints the table and exits non-zero when a row fails.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import pickle
import textwrap
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import bench, pdl_edges
from .arms import DEVICE_LOOP, FISSION, OVERLAP, Pair
from .megakernel import phase_kind, predicted_step_us
from .registry import probe_us
from lab.backend.costmodel import COSTS_FILE, WHOLE_STEP_KERNELS, CostModel
from lab.config import CONFORMANCE_CACHE_ENV, LabConfig, conformance_cache, lab_environment
from lab import schema
from lab.errors import LabError
from lab.files import atomic_write

DATA_GPU = COSTS_FILE.parent
REL_TOL = 0.25          # within 25% of the GPU's value ...
ABS_TOL_US = 1.0        # ... or within 1 us where the GPU effect is under SMALL_US
SMALL_US = 2.0
NOISE_SEMS = 2.0      # or within 2 of the recording's standard errors (A/B rows)
PROBE_BOUNDS = (0.5, 2.0)   # the host probe's ratio, bounded: a host-paced row scales by at most 2x


@dataclass(frozen=True)
class Row:
    lesson: str
    unit: str
    sim: float
    gpu: float
    exact: bool = False     # counts: must agree exactly
    note: str = ""          # where the GPU figure comes from
    gpu_sem: float | None = None   # the GPU figure's own standard error, where it has one
    finding: str = ""       # a recorded finding about this row (FINDINGS_FILE): why it fails
    host_paced: bool = False   # eager: the host's speed sets it (scaled by the host probe's ratio)
    scale: float = 1.0      # the factor `sim` was scaled by (host-paced rows only)
    consistency: bool = False   # not a prediction: the simulator's input for this figure is a
                                # recording of the same figure (a fit against its own points,
                                # a whole step priced from its own recorded node time)

    @property
    def ratio(self) -> float:
        return self.sim / self.gpu if self.gpu else float("nan")

    @property
    def within_band(self) -> bool:
        """Same sign and within 25%; within 1 us for a GPU effect under 2 us; counts exact."""
        if self.exact:
            return self.sim == self.gpu
        if not (math.isfinite(self.sim) and math.isfinite(self.gpu)):
            return False
        err = abs(self.sim - self.gpu)
        if abs(self.gpu) < SMALL_US and self.unit.startswith("us"):
            return err <= ABS_TOL_US
        return (self.sim > 0) == (self.gpu > 0) and err <= REL_TOL * abs(self.gpu)

    @property
    def within_noise(self) -> bool:
        """Outside the band, but the same sign and within NOISE_SEMS of the recording's own
        standard errors: the recording cannot tell the prediction from what it measured."""
        if self.exact or self.gpu_sem is None or not (
                math.isfinite(self.sim) and math.isfinite(self.gpu) and self.gpu_sem > 0):
            return False
        return (self.sim > 0) == (self.gpu > 0) and abs(self.sim - self.gpu) <= NOISE_SEMS * self.gpu_sem

    @property
    def ok(self) -> bool:
        """The verdict rule: within the band, or within the recording's noise."""
        return self.within_band or self.within_noise

    @property
    def verdict(self) -> str:
        kind = " [consistency check]" if self.consistency else ""
        if self.within_band:
            return "PASS" + kind
        if self.within_noise:
            return f"PASS ({NOISE_SEMS:g} sem)" + kind
        return ("FAIL (finding)" if self.finding else "FAIL") + kind


FINDINGS_FILE = "conformance_findings.json"
# the persistent rung's step is one kernel (step_persistent) whose node time the cost file
# records whole: its ladder row echoes that recording (lab/backend/costmodel.py)
WHOLE_STEP_PRICED = "step_persistent" in WHOLE_STEP_KERNELS


def findings_problems(report: dict) -> list[str]:
    """What makes a conformance report a failure: a row that fails with no recorded finding,
    and a recorded finding whose row passes or does not exist (a stale finding: the recording
    it was written for has been replaced). Empty: every row passes or is a recorded finding."""
    rows = {r.lesson: r for r in report["rows"]}
    out = [f"{r.lesson}: fails ({r.verdict})" for r in report["rows"] if not r.ok and not r.finding]
    for lesson in report.get("findings", {}):
        if lesson not in rows:
            if report.get("only_all", True):
                out.append(f"{lesson}: a recorded finding ({FINDINGS_FILE}) for no row of the table")
        elif rows[lesson].ok:
            out.append(f"{lesson}: a recorded finding ({FINDINGS_FILE}) for a row that passes")
    return out


MISSING = "no field {!r} (recorded by another version of the lab, or not this lesson's recording?)"


class _Recorded(dict):
    """A recorded file's JSON object: a missing field is a LabError naming the file and the
    field's path (a file of the wrong shape, `{}` say), not a KeyError from deep in a reader.
    Objects and lists inside it are wrapped as they are read."""

    def __init__(self, data: dict, file: str, path: str = ""):
        super().__init__(data)
        self.file, self.path = file, path

    def __getitem__(self, key):
        where = f"{self.path}.{key}" if self.path else str(key)
        if key not in self:
            raise LabError(f"{self.file}: " + MISSING.format(where))
        return _recorded(super().__getitem__(key), self.file, where)


class _RecordedList(list):
    """A list inside a recorded file, its objects wrapped as _Recorded when read."""

    def __init__(self, data: list, file: str, path: str):
        super().__init__(data)
        self.file, self.path = file, path

    def __getitem__(self, i):
        where = f"{self.path}[{i}]"     # the field paths of lab/schema.py: rows[0].arm
        try:
            return _recorded(super().__getitem__(i), self.file, where)
        except IndexError:
            raise LabError(f"{self.file}: no field {where!r} ({self.path} has {len(self)} "
                           f"entries)") from None

    def __iter__(self):
        return (self[i] for i in range(len(self)))


def _recorded(value, file: str, path: str):
    if isinstance(value, dict):
        return _Recorded(value, file, path)
    if isinstance(value, list):
        return _RecordedList(value, file, path)
    return value


def _load(data_dir: Path, name: str) -> dict:
    """A recording of the data folder, checked against its schema (lab/schema.py RECORDINGS: the
    fields conformance reads, their types and ranges) before any figure of it is judged: a
    string, null or NaN where a time goes, a negative mean, a dict for a list is a LabError
    naming the file and the field."""
    path = data_dir / name
    data = schema.read_json(path, absent="record it on a GPU with `decode-lab record`")
    if not isinstance(data, dict):
        raise LabError(f"{path}: expected a JSON object, got {type(data).__name__}")
    if name in schema.RECORDINGS:
        schema.check(data, schema.RECORDINGS[name], name, missing=MISSING)
    return _Recorded(data, name)


def _field(rec: dict, path: str, name: str):
    cur = rec
    for part in path.split("."):
        try:
            cur = cur[int(part)] if isinstance(cur, list) else cur[part]
        except (KeyError, IndexError, ValueError, TypeError):
            raise LabError(f"{name}: no field {path!r} (recorded by another version of the lab?)")
    return cur


def _arm(result: dict, name: str) -> dict:
    for a in result["arms"]:
        if a["name"] == name:
            return a
    where = getattr(result, "file", None) or result.get("what", "the result")
    raise LabError(f"no arm {name!r} in {where}")


def _ab_us(result: dict) -> float:
    return 1000.0 * result["diff_b_minus_a_ms"]


def _sweep_slope_us(result: dict, arm: str) -> tuple[float, int, int]:
    rows = [r for r in result["rows"] if r["arm"] == arm]
    lo, hi = min(rows, key=lambda r: r["context"]), max(rows, key=lambda r: r["context"])
    return 1000.0 * (hi["mean_ms"] - lo["mean_ms"]), lo["context"], hi["context"]


# the lessons, in the table's order: `run(only=...)` re-runs a subset (a notebook shows its own)
LESSONS = ("ladder", "megakernel", "overlap", "fission", "device loop", "context", "pdl context",
           "nodes", "spec")
_SIMULATED: dict = {}   # (what, model, costs, settings) -> result: see _once


def _digest(*arrays_or_bytes) -> str:
    h = hashlib.sha256()
    for a in arrays_or_bytes:
        h.update(a if isinstance(a, bytes) else np.ascontiguousarray(a).view(np.uint8).data)
    return h.hexdigest()


# a folder where simulated results are kept for other processes too (the test suite sets it: its
# conformance tests and notebook 05 then simulate the table once between them); unset: none kept
CACHE_ENV = CONFORMANCE_CACHE_ENV


@functools.lru_cache(maxsize=1)
def _code_digest() -> str:
    """sha256 of every .py under lab/ and kernels/: a simulated result is the code's as much as
    the data's, so a kept one is found only by the code that made it."""
    root = Path(__file__).resolve().parents[2]
    h = hashlib.sha256()
    for sub in ("lab", "kernels"):
        for path in sorted((root / sub).rglob("*.py")):
            h.update(str(path.relative_to(root)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def _kept(key, simulate):
    """simulate(), or its result kept in CACHE_ENV's folder under the key, this code and the
    LAB_* environment (written whole or not at all: a reader never sees half a file)."""
    folder = conformance_cache()
    if not folder:
        return simulate()
    env = lab_environment()
    name = hashlib.sha256(repr((key, env, _code_digest())).encode()).hexdigest()[:32]
    path = Path(folder) / f"{name}.pickle"
    try:
        return pickle.loads(path.read_bytes())
    except (OSError, EOFError, pickle.UnpicklingError):
        pass
    result = simulate()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, lambda tmp: tmp.write_bytes(pickle.dumps(result)))
    except OSError:
        pass                         # a folder that cannot be written keeps nothing: no harm
    return result


def _once(key, simulate):
    """`simulate()` once per process for a key: conformance runs the simulator without noise and
    with fixed seeds, so the same model, component costs and recorded settings give the same
    result; a second judgement (the CLI after a test, a notebook cell run again, another
    recording's figures held against the same prediction) re-uses it, and with CACHE_ENV set
    another process does too. No key (costs passed in by the caller): no re-use."""
    if key is None:
        return simulate()
    if key not in _SIMULATED:
        _SIMULATED[key] = _kept(key, simulate)
    return _SIMULATED[key]


def run(model, data_dir: Path | str | None = None, reps: int = 2, progress=False,
        cost: CostModel | None = None, only=None) -> dict:
    """Re-run the recorded lessons on the simulator (every one of LESSONS, or those in `only`);
    return {"rows": [...], "source": ...}."""
    only = LESSONS if only is None else tuple(only)
    unknown = sorted(set(only) - set(LESSONS))
    if unknown:
        raise LabError(f"unknown conformance lesson(s) {unknown}; known: {', '.join(LESSONS)}")
    data_dir = Path(data_dir) if data_dir is not None else DATA_GPU
    base = None
    if cost is None:
        cost = CostModel.load(data_dir / "kernel_costs.json")
        base = (_digest(*(model.weights[k] for k in sorted(model.weights))),
                _costs_digest(data_dir / "kernel_costs.json"), reps)
    # the model's EXPECTATION: means are compared, so the simulated runs carry no noise (the
    # noise model is checked on its own: the A/A false-alarm test in tests/measure/test_bench.py)
    cost = cost.replace(launch_jitter=0.0, drift=0.0, node_jitter=0.0)
    rec = {n: _load(data_dir, f"{n}.json") for n in
           ("ladder", "overlap", "fission", "bench_sweep", "kernel_costs")}
    loop_file = data_dir / "device_loop.json"    # recorded since LAB_LOOP: older sets lack it
    # first a dry pass that judges each recording against itself, so that a recording of the
    # wrong shape is reported before any simulation runs; then the real one
    for dry in (True, False):
        table = _table(model, data_dir, rec, loop_file, only, cost, base, reps, progress, dry)
    table["rows"], table["host_scaling"] = host_scaled(table["rows"], rec["kernel_costs"],
                                                       {n: _recording(data_dir, n) for n in
                                                        {r.note.split(";")[0] for r in table["rows"]
                                                         if r.host_paced}})
    findings = _findings(data_dir)
    table["rows"] = [dataclasses.replace(r, finding=findings.get(r.lesson, "")) for r in table["rows"]]
    table["findings"] = findings
    table["only_all"] = set(only) == set(LESSONS)
    return table


def _costs_digest(path: Path) -> str:
    """The cost file's digest without its stamp (the stamp changes no cost)."""
    data = json.loads(path.read_text())
    data.pop("provenance", None)
    return _digest(json.dumps(data, sort_keys=True).encode())


def _recording(data_dir: Path, name: str) -> dict:
    path = data_dir / name
    return _load(data_dir, name) if path.is_file() else {}


def host_scale(recorded: dict, costs: dict, name: str = "the recording") -> tuple[float, str]:
    """(factor, what it is): the recording's host probe over the cost file's, bounded to
    PROBE_BOUNDS; 1.0 when either has none (and the text says which)."""
    r, c = probe_us(recorded), probe_us(costs)
    if r is None or c is None:
        lacking = " and ".join(n for n, v in ((name, r), ("kernel_costs.json", c)) if v is None)
        return 1.0, f"{lacking} ha{'s' if ' and ' not in lacking else 've'} no host probe: not scaled"
    lo, hi = PROBE_BOUNDS
    raw = r / c
    factor = min(max(raw, lo), hi)
    return factor, (f"host probe {r:.3f} us per launch against the cost file's {c:.3f}: "
                    f"host-paced rows x{factor:.2f}"
                    + (f" (ratio {raw:.2f}, bounded to [{lo:g}, {hi:g}])" if factor != raw else ""))


def host_scaled(rows: list, costs: dict, recordings: dict) -> tuple[list, dict]:
    """The rows with each host-paced row's prediction scaled by its file's host_scale
    (`recordings`: file name -> its recording; a row's file is its note's first part); device-
    paced rows unchanged. And {file: what its scaling was}."""
    scales = {name: host_scale(rec, costs, name) for name, rec in recordings.items()}
    out = []
    for r in rows:
        factor = scales.get(r.note.split(";")[0], (1.0, ""))[0] if r.host_paced else 1.0
        out.append(dataclasses.replace(r, sim=r.sim * factor, scale=factor) if factor != 1.0 else r)
    return out, {name: text for name, (_, text) in sorted(scales.items())}


def _findings(data_dir: Path) -> dict[str, str]:
    """{lesson: reason} from the data folder's FINDINGS_FILE (none: {}): rows of this recording
    that the component costs do not predict, each with the measured reason. They still FAIL;
    the file makes them known, and a finding whose row passes is itself reported (stale)."""
    path = data_dir / FINDINGS_FILE
    if not path.is_file():
        return {}
    data = _load(data_dir, FINDINGS_FILE)
    return {str(f["lesson"]): str(f["reason"]) for f in data["findings"]}


def _table(model, data_dir, rec, loop_file, only, cost, base, reps, progress, dry) -> dict:
    """The table of run(); `dry`: each simulated result replaced by its recording (no run)."""
    from lab.backend.sim import SimBackend
    from lab.engine.runner import DecodeEngine
    factory = lambda cfg, index: SimBackend(cost, seed=1000 + index)  # noqa: E731
    sim = LabConfig(backend="sim")
    rows: list[Row] = []

    def result(key, simulate, recorded):
        return recorded if dry else _once(key, simulate)

    # the ladder: ms/token per rung, launches and nodes
    lad = rec["ladder"]
    if "ladder" in only:
        s_lad = result(base and (*base, "ladder", lad["tokens"], lad["prompt"]), lambda: bench.run_ladder(
            model, sim, reps=reps, tokens=lad["tokens"], prompt=lad["prompt"], progress=progress,
            backend_factory=factory), lad)
        ladder_rows(lad, s_lad, rows)
    per_file = data_dir / "persistent.json"      # its phases are recorded on a GPU only
    if "megakernel" in only and per_file.is_file():
        bound_file = data_dir / "megakernel_bound.json"       # recorded on a GPU only
        megakernel_rows(_load(data_dir, "persistent.json"), cost, rows,
                        _load(data_dir, "megakernel_bound.json") if bound_file.is_file()
                        else None)

    def ab(pair: Pair, recorded: dict):
        # both arms on ONE simulated engine, paired by rep, as the recording ran them: the
        # simulated host's drift then cancels in the paired difference as the GPU host's did
        rec_ab = _field(recorded, pair.path, pair.file.removesuffix(".json")) if pair.path else recorded
        a, b = pair.configs(sim)

        def simulate():
            pool = {bench.pool_key(a): DecodeEngine(model, a, backend=SimBackend(cost, seed=1000))}
            return bench.run_ab(model, a, b, reps=max(reps, 3), tokens=rec_ab["tokens"],
                                prompt=rec_ab["prompt"], aa=False, per_token=0,
                                progress=progress, pool=pool)
        s_ab = result(base and (*base, "ab", pair.lesson, rec_ab["tokens"], rec_ab["prompt"]),
                      simulate, rec_ab)
        note = pair.file if rec_ab.get("meaningful", True) is not False else (
            f"{pair.file}; its A/A gate failed")
        rows.append(Row(pair.lesson, "us/token", _ab_us(s_ab), _ab_us(rec_ab), note=note,
                        gpu_sem=1000.0 * rec_ab["diff_sem_ms"], host_paced=pair.host_paced))

    if "overlap" in only:
        ab(OVERLAP, rec["overlap"])
    if "fission" in only:
        # every pair the file holds (a file may lack the fused tails' parts)
        for pair in FISSION:
            if "." not in pair.path or pair.path.split(".")[0] in rec["fission"]:
                ab(pair, rec["fission"])
    if "device loop" in only and loop_file.is_file():
        ab(DEVICE_LOOP, _load(data_dir, "device_loop.json"))

    if "context" in only:   # how much the graph step grows from the shortest to the longest context
        sw = rec["bench_sweep"]
        arm = next((r["arm"] for r in sw["rows"] if r["toggles"].get("LAB_GRAPH") == "1"), None)
        if arm is None:
            raise LabError("bench_sweep.json has no graph arm (LAB_GRAPH=1)")
        g_slope, lo, hi = _sweep_slope_us(sw, arm)
        s_sw = result(base and (*base, "sweep", arm, lo, hi, sw["tokens"]), lambda: bench.run_sweep(
            model, {arm: sim}, [lo, hi], reps=reps, tokens=sw["tokens"], progress=progress,
            backend_factory=factory), sw)
        rows.append(Row(f"graph: context {lo} -> {hi}", "us/token", _sweep_slope_us(s_sw, arm)[0],
                        g_slope, note="bench_sweep.json"))

    pdl_file = data_dir / "pdl_context.json"    # recorded since PDL's long-context fix
    if "pdl context" in only and pdl_file.is_file():
        pc = _load(data_dir, "pdl_context.json")
        positions = tuple(int(c["position"]) for c in pc["contexts"])

        def simulate_pdl():
            # the recording's protocol (lab/measure/pdl_edges.py) on the simulator's clock; the
            # simulated runs carry no noise, so two rounds of two replays suffice
            eng = DecodeEngine(model, sim, backend=SimBackend(cost, seed=1000))
            return {"contexts": [pdl_edges.measure(eng, p, edges=False, rounds=2, replays=2)
                                 for p in positions]}
        s_pc = result(base and (*base, "pdl context", positions), simulate_pdl, pc)
        pdl_rows(pc, s_pc, rows)

    spec_file = data_dir / "spec.json"          # recorded since LAB_DRAFT: older sets lack it
    if "spec" in only and spec_file.is_file():
        whole = _load(data_dir, "spec.json")
        rec_sp = _field(whole, "curve", "spec")
        ctxs = tuple(sorted({r["context"] for r in rec_sp["rows"]}))

        def simulate_spec():
            from lab.measure import spec
            return spec.curve(model, drafts=(0, SPEC_DRAFT), contexts=ctxs,
                              new_tokens=rec_sp["new_tokens"], reps=reps, base=sim, bug=SPEC_DRAFT,
                              progress=progress, backend_factory=factory)
        s_sp = result(base and (*base, "spec", ctxs, rec_sp["new_tokens"]), simulate_spec, rec_sp)
        spec_rows(rec_sp, s_sp, ctxs, rows)
        if "break_even" in whole:                # recorded since the two texts
            rec_be = whole["break_even"]
            texts = tuple(rec_be["texts"])
            drafters = recorded_drafters(rec_be)

            def simulate_even():
                from lab.measure import spec
                return spec.break_even(model, texts=texts, drafts=(SPEC_DRAFT,),
                                       new_tokens=rec_be["new_tokens"], reps=reps,
                                       step_reps=min(rec_be["step_reps"], 4), base=sim,
                                       progress=progress, backend_factory=factory,
                                       drafters=drafters)
            s_be = result(base and (*base, "break even", texts, drafters, rec_be["new_tokens"]),
                          simulate_even, rec_be)
            break_even_rows(rec_be, s_be, rows)
    if "nodes" in only:
        node_rows(cost, rows)
    return {"rows": rows, "cost_source": cost.describe(), "gpu_source": lad["source"],
            "gpu_date": lad.get("date", "?"), "data_dir": str(data_dir)}


SPEC_DRAFT = 4    # the draft length whose lesson conformance re-runs (spec.json's bug arm's too)


def spec_rows(rec: dict, sim: dict, contexts, rows: list) -> None:
    """Speculative decoding (spec.json's curve): at each context, what drafting SPEC_DRAFT
    tokens saves per generated token, the tokens each verify step yields, and the replay share
    of LAB_BUG_SPEC_KEY's arm (0: no graph is ever replayed)."""
    def row(res, ctx, arm):
        for r in res["rows"]:
            if r["context"] == ctx and r["arm"] == arm:
                return r
        raise LabError(f"spec.json: no row for {arm!r} at context {ctx}")
    k, bug = f"draft {SPEC_DRAFT}", f"draft {SPEC_DRAFT} + LAB_BUG_SPEC_KEY"
    for ctx in contexts:
        def saved(res):
            return 1000.0 * (row(res, ctx, k)["ms_per_token"] - row(res, ctx, "draft 0")["ms_per_token"])
        rows.append(Row(f"spec (context {ctx}): draft {SPEC_DRAFT} - draft 0", "us/token",
                        saved(sim), saved(rec), note="spec.json"))
        rows.append(Row(f"spec (context {ctx}): tokens per verify step", "tokens",
                        row(sim, ctx, k)["tokens_per_step"], row(rec, ctx, k)["tokens_per_step"],
                        note="spec.json"))
        rows.append(Row(f"spec (context {ctx}): bug arm's replays", "% of steps",
                        100 * (row(sim, ctx, bug)["replay_fraction"] or 0),
                        100 * (row(rec, ctx, bug)["replay_fraction"] or 0), True, "spec.json"))


def recorded_drafters(rec: dict) -> tuple[str, ...]:
    """The drafters (LAB_DRAFTER) of break_even's recorded rows, in their order (a row recorded
    before the n-gram drafter names none: prompt lookup's)."""
    return tuple(dict.fromkeys(r.get("drafter", "lookup") for r in rec["rows"])) or ("lookup",)


def break_even_rows(rec: dict, sim: dict, rows: list) -> None:
    """When drafting pays (spec.json's break_even), for each recorded text and drafter at k =
    SPEC_DRAFT:
    V, the verify step's cost in one-token steps, PREDICTED from the component costs (the
    simulator's verify and one-token steps, node by node); what drafting saves per generated
    token, predicted from those costs and the simulator's own tokens per step; and E, the
    tokens per verify step, which the simulator gets by running the same model on the same
    text (its twins' tokens: the GPU's but at a near-tie). No row echoes its recording: E is
    the model's, recomputed, not a cost the simulator was given."""
    def row(res, text, drafter):
        for r in res["rows"]:
            if (r["text"] == text and r["draft"] == SPEC_DRAFT
                    and r.get("drafter", "lookup") == drafter):
                return r
        raise LabError(f"spec.json: break_even has no row for text {text!r}, drafter "
                       f"{drafter!r} at k = {SPEC_DRAFT}")
    for drafter in recorded_drafters(rec):
        # prompt lookup's rows keep their names (recorded before the n-gram drafter)
        by = "" if drafter == "lookup" else f" ({drafter} drafter)"
        for text in rec["texts"]:
            g, s = row(rec, text, drafter), row(sim, text, drafter)
            rows.append(Row(f"spec {text}{by}: verify step (k = {SPEC_DRAFT}) in one-token steps",
                            "x", s["verify_step_cost"], g["verify_step_cost"], note="spec.json",
                            gpu_sem=g["verify_step_cost_se"]))
            rows.append(Row(f"spec {text}{by}: draft {SPEC_DRAFT} - draft 0", "us/token",
                            1000.0 * (s["ms_per_token"] - s["ms_per_token_one"]),
                            1000.0 * (g["ms_per_token"] - g["ms_per_token_one"]),
                            note="spec.json"))
            rows.append(Row(f"spec {text}{by}: tokens per verify step", "tokens",
                            s["tokens_per_step"], g["tokens_per_step"], note="spec.json"))


def pdl_rows(rec: dict, sim: dict, rows: list) -> None:
    """PDL's effect at each context of pdl_context.json (lab/measure/pdl_edges.py: the unfused
    step chained without its advance, every launch programmatic or none): graph+pdl - graph,
    us per step (negative: PDL saves), with the recording's paired standard error. Not the
    decode's whole step, which adds the advance and the host. A graph step without PDL moves
    with buffer placement from engine to engine and PDL hides most of that (pdl_edges'
    docstring): on an engine where the step without PDL runs above its components, this row
    misses too, and conformance_findings.json says by how much."""
    by_pos = {int(c["position"]): c for c in sim["contexts"]}
    for c in rec["contexts"]:
        p = int(c["position"])
        if p not in by_pos:
            raise LabError(f"pdl_context.json: no simulated context {p + 1}")
        g, sem = pdl_edges.pdl_saving_us(c)
        rows.append(Row(f"PDL (context {c['context']}, chained step): graph+pdl - graph",
                        "us/step", pdl_edges.pdl_saving_us(by_pos[p])[0], g,
                        note="pdl_context.json", gpu_sem=sem))


def ladder_rows(lad: dict, s_lad: dict, rows: list) -> None:
    """ms/token per rung, launches per token, nodes per graph, and PDL's share of the graph step.
    A rung row only for the rungs the recording has (a ladder.json recorded before a rung
    existed, the persistent one, has no row for it)."""
    recorded = {a["name"] for a in lad["arms"]}
    rungs = {name: kw for name, kw, _ in bench.LADDER}
    for name in rungs:
        if name not in recorded:
            continue
        g, s = _arm(lad, name), _arm(s_lad, name)
        whole = rungs[name].get("persistent", False) and WHOLE_STEP_PRICED
        rows.append(Row(f"{name}: ms/token", "ms", s["mean_ms"], g["mean_ms"], note="ladder.json"
                        + ("; its one kernel is priced from its own recorded node time"
                           if whole else ""),
                        host_paced=not rungs[name].get("graph", True), consistency=whole))
    g, s = _arm(lad, "graph"), _arm(s_lad, "graph")
    rows.append(Row("launches per token", "count", s["launches_per_token"],
                    g["launches_per_token"], True, "ladder.json"))
    rows.append(Row("nodes per graph", "count", s["nodes_per_graph"], g["nodes_per_graph"], True,
                    "ladder.json"))

    # PDL's gain as a share of the graph step, from the ladder: recorded on the same engine
    # instance (same buffer placement) as the component costs. The graph step WITHOUT PDL moves
    # with placement from engine to engine (data/gpu/engine_instances.json) and PDL hides most
    # of that, so pdl.json -- another process, another placement -- may show a larger gain.
    def pdl_share(result):
        return 100 * (1 - _arm(result, "graph+pdl")["mean_ms"] / _arm(result, "graph")["mean_ms"])
    rows.append(Row("PDL: share of the graph step saved", "%", pdl_share(s_lad), pdl_share(lad),
                    note="ladder.json"))


MEGAKERNEL_ARM = "persistent graph"   # persistent.json's sweep arm of the default body


def megakernel_rows(per: dict, cost: CostModel, rows: list, bound: dict | None = None) -> None:
    """The persistent graph arm's ms/token at the context of persistent.json's phases,
    PREDICTED from parts measured apart (lab/measure/megakernel.py predicted_step_us): each
    phase's work by the stamped kernel's clocks (a launch of its own) and one counter hand-off
    per phase, as a chain, plus one graph node's floor from the cost file's empty-node chains
    (floors.empty: a replay's intercept and one node), against the arm the sweep measured
    there. What the chain leaves out (the slowest block of each phase) is the row's error. Not a consistency check: neither part
    is a recording of the arm's step (the ladder's persistent rung, priced from the kernel's
    own recorded node time, is). No row when the file has no phases (recorded before them, or
    on the simulator).

    With `bound` (megakernel_bound.json), one row more per body that leaves the output
    projection out: the same chain over the default's phases but the output projection's (its
    work and its hand-offs left out), plus the floor, against that body's arm in the bound's
    sweep at the same context: a prediction of what dropping the phase does, from phases the
    probe never ran."""
    if "phases" not in per:
        return
    ph = per["phases"]
    ctx = int(ph["context"])
    floor = cost.graph_launch_us + cost.empty_node_us

    def arm_at(file: str, sweep: dict, arm: str) -> dict:
        row = next((r for r in sweep["rows"] if int(r["context"]) == ctx and r["arm"] == arm),
                   None)
        if row is None:
            raise LabError(f"{file}: sweep.rows has no {arm!r} row at context {ctx}, the "
                           f"context of persistent.json's phases")
        return row

    def chain_row(lesson: str, phases: dict, arm: dict, what: str, where: str) -> None:
        pred = predicted_step_us(phases, floor)
        rows.append(Row(lesson, "ms", pred["step_us"] / 1000.0, float(arm["mean_ms"]),
                        gpu_sem=float(arm["sem_ms"]),
                        note=(f"{what}; predicted: every phase's work ({pred['work_us']:.2f} "
                              f"us) + {pred['handoffs']} counter hand-offs of "
                              f"{pred['handoff_us']:.2f} us (phases) + kernel_costs.json "
                              f"floors.empty intercept_us + per_node_us ({pred['floor_us']:.2f} "
                              f"us); measured: {where} at context {ctx}")))

    chain_row(f"{MEGAKERNEL_ARM} (context {ctx}): phase work + hand-offs + one node", ph,
              arm_at("persistent.json", per["sweep"], MEGAKERNEL_ARM), "persistent.json",
              f"sweep, {MEGAKERNEL_ARM}")
    for name, choice in (bound or {}).get("probes", {}).items():
        if not choice.get("noproj"):
            continue
        kept = {**ph, "rows": [r for r in ph["rows"] if phase_kind(r["phase"]) != "out proj"]}
        chain_row(f"persistent {name} (context {ctx}): less out proj", kept,
                  arm_at("megakernel_bound.json", bound["sweep"], f"persistent {name}"),
                  f"persistent.json's phases less its {len(ph['rows']) - len(kept['rows'])} "
                  f"output projection phases", f"megakernel_bound.json, persistent {name}")


def node_rows(cost: CostModel, rows: list) -> None:
    """Per-kernel node times: the fitted form against every measured point (the worst one)."""
    worst: dict[str, tuple] = {}
    for key, fit in cost.kernels.items():
        name = key.split(" ", 1)[0]
        for ctx, us, _ in fit.measured:
            err = abs(fit.node(ctx, False) - us)
            if name not in worst or err > worst[name][0]:
                worst[name] = (err, fit.node(ctx, False), us, ctx)
    for name, (_, model_us, us, ctx) in sorted(worst.items()):
        rows.append(Row(f"node: {name} (context {ctx}, worst fit)", "us", model_us, us,
                        note="kernel_costs.json", consistency=True))


def format_report(report: dict) -> str:
    rows = report["rows"]
    w = max(len(r.lesson) for r in rows)
    lines = [f"{'lesson':<{w}} {'unit':<8} {'simulated':>10} {'GPU':>10} {'± sem':>6} "
             f"{'ratio':>6}  verdict"]
    for r in rows:
        fmt = (lambda v: f"{v:>10.0f}") if r.exact else (
            lambda v: f"{v:>10.4f}" if r.unit == "ms" else f"{v:>+10.2f}")
        sem = f"{r.gpu_sem:>6.2f}" if r.gpu_sem is not None else f"{'':>6}"
        lines.append(f"{r.lesson:<{w}} {r.unit:<8} {fmt(r.sim)} {fmt(r.gpu)} {sem} "
                     f"{r.ratio:>6.2f}  {r.verdict}")
    for r in rows:
        if "A/A gate failed" in r.note:
            lines.append(f"  note, {r.lesson}: {r.note} (the recording marks that A/B not meaningful)")
    for r in rows:
        if r.finding and not r.ok:
            lines.append(textwrap.fill(f"finding, {r.lesson}: {r.finding}", 100,
                                       initial_indent="  ", subsequent_indent="    "))
    for problem in findings_problems(report):
        if "recorded finding" in problem:
            lines.append(f"  STALE: {problem}")
    passed, noisy = sum(r.ok for r in rows), sum(r.ok and not r.within_band for r in rows)
    echoes = sum(r.consistency for r in rows)
    known = sum(not r.ok and bool(r.finding) for r in rows)
    lines.append(f"{passed} of {len(rows)} rows pass (same sign and within {REL_TOL:.0%}; within "
                 f"{ABS_TOL_US:g} us where the GPU effect is under {SMALL_US:g} us; counts exact)"
                 + (f", {noisy} of them only within {NOISE_SEMS:g} standard errors of a noisy "
                    f"recording" if noisy else "")
                 + (f"; {known} fail{'s' if known == 1 else ''} as a recorded finding "
                    f"({FINDINGS_FILE})" if known else "")
                 + (f"; {echoes} of the rows are consistency checks, not predictions (the "
                    f"simulator's input for the figure is a recording of it)" if echoes else ""))
    for name, text in report.get("host_scaling", {}).items():
        lines.append(f"{name}: {text}")
    lines.append(f"GPU: {report['gpu_source']} ({report['gpu_date']}); simulator: "
                 f"{report['cost_source']}")
    return "\n".join(lines)
