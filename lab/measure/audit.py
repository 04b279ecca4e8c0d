"""Capture audit and lazy-initialisation detector: what a capture would freeze, and which
first-use initialisation would fire inside one.

`audit(engine)` runs eager steps at different positions and tokens and records every
host-computed value that reaches a launch: kernel identity, grid and block, each pointer
(buffer + offset) and each value passed by value -- plus host writes into device memory made
between steps. A captured launch keeps these values until the graph's nodes are updated (the
memory they point to stays live), so every value that differs between steps is what a capture
would freeze:
  - pointers, by-value sizes and loop bounds, host writes  -> "promote to device memory"
  - grid / block dims, kernel identity                      -> "capture key" (decode_plan)
A capture-key value is HANDLED when it is constant within every plan key (the engine follows a
plan change with a graph for the new key: recaptured, or its live graph updated in place;
conditional nodes are CUDA's other way to follow a changing grid). A value to promote is never
handled: nothing updates a node between two steps of one plan. The clean engine has none
unhandled.

`detect_lazy_init(model, cfg)` decodes from a fresh engine whose warm-up is skipped, one step at
the start of each plan (each a capture, in global mode), and reports each initialisation that
fired inside a capture (table upload, scratch allocation, compilation, array-interface sync):
which kind of operation it was (`KIND_NOTES`: not every allocation is illegal in a capture --
a stream-ordered one is capturable, growing a pool through a synchronous allocator is not),
where it fired (caller site, which launch needed it) and where its error showed. An illegal call
in a capture fails at once (`cudaErrorStreamCaptureUnsupported`) and invalidates the capture, so
the error shows at that call -- or, when the code swallows it, only at end_capture
(`cudaErrorStreamCaptureInvalidated`). That is not CUDA's "sticky" error, which corrupts the
context; the stream and context stay usable, which is what makes an eager fallback possible.
Lecture 001 (section 3) uses "sticky" in a looser sense: an error that surfaces at a later call,
so that the failure is attributed to whatever ran next. That much is true of a swallowed
capture error too (it shows at end_capture, not at the call that caused it), which is why the
detector reports both where an initialisation fired and where its error showed.

Both use the engine's public API only: `step()`, `seek()`, `step_launches()`, the launch log,
the ledger, `capture_failures` and the backend's record of host operations (`backend.ops`).
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from lab.backend.costmodel import CONTEXT_KERNELS
from lab.config import LabConfig
from lab.plan import plan_boundaries

AUDIT_PROMPT = "ROMEO.\n"
_KINDS = {"upload": "table upload", "allocation": "scratch allocation",
          "compilation": "compilation", "array-interface sync": "array-interface synchronisation",
          "synchronize": "synchronisation", "download": "device-to-host copy"}
# A module load is not a stream operation: newer drivers allow a kernel compiled lazily, at its
# first call inside a capture; older drivers may refuse it. Either way it costs: warm up.
_LEGAL_IN_CAPTURE = {"compilation"}
# What each kind of finding is, for the detector's message (the kinds above are the labels the
# findings and the recorded GPU bug table carry, so they stay short and fixed).
KIND_NOTES = {
    "table upload": "a synchronous host-to-device copy: not capturable",
    "scratch allocation": "a synchronous allocator growing its pool (cudaMalloc): not capturable; "
                          "a stream-ordered allocation (cudaMallocAsync, captured as a graph "
                          "memory node) would be",
    "compilation": "a module load, not a stream operation: allowed in a capture on newer "
                   "drivers (the H200's 13.0 allowed it), older ones may refuse it; warm up anyway "
                   "(it costs)",
    "array-interface synchronisation": "a stream synchronisation: not capturable",
    "synchronisation": "a synchronisation: not capturable",
    "device-to-host copy": "a synchronous device-to-host copy: not capturable",
}


@dataclass(frozen=True)
class Varying:
    """One host-computed value that differs between steps."""
    index: int                 # launch index within the step (-1: host write before the step)
    kernel: str
    layer: int | None
    what: str                  # "grid", "block", "kernel", an argument name, or "host write"
    kind: str                  # "pointer", "by value", "grid", "block", "kernel", "host write"
    values: dict               # {step position: value}
    verdict: str               # "promote to device memory" or "capture key"
    handled: bool

    def row(self) -> dict:
        shown = list(self.values.items())
        sample = ", ".join(f"@{p}: {v}" for p, v in (shown[:2] + shown[-1:]))
        return {"launch": self.index, "kernel": self.kernel, "layer": self.layer, "value": self.what,
                "kind": self.kind, "distinct": len(set(map(str, self.values.values()))),
                "verdict": self.verdict, "handled": self.handled, "sample": sample}


@dataclass
class AuditReport:
    positions: list[int]
    varying: list[Varying]
    source: str

    @property
    def unhandled(self) -> list[Varying]:
        return [v for v in self.varying if not v.handled]

    def summary(self) -> str:
        lines = [f"capture audit over {len(self.positions)} eager steps (positions "
                 f"{self.positions[0]}..{self.positions[-1]}), {self.source}:",
                 f"  {len(self.varying)} values differ between steps, "
                 f"{len(self.unhandled)} unhandled"]
        for v in self.varying:
            r = v.row()
            flag = "ok " if v.handled else "BUG"
            lines.append(f"  [{flag}] #{r['launch']:>2} {r['kernel']:<20} {r['value']:<10} "
                         f"{r['kind']:<10} {r['distinct']:>4} values -> {r['verdict']}")
        return "\n".join(lines)


def arg_value(provenance: str) -> tuple[str, str]:
    """(kind, value) of one logged argument: a buffer label is a pointer, "value x" a by-value."""
    if provenance.startswith("value "):
        return "by value", provenance[len("value "):]
    return "pointer", provenance


def audit(engine, prompt: str = AUDIT_PROMPT, tokens: int | None = None) -> AuditReport:
    """Run eager steps across at least two plan changes and list what differs between them:
    every launch as the engine's launch log recorded it, and every host write into device
    memory made before a step's first launch (the backend's record of host operations)."""
    c = engine.model.cfg
    bounds = plan_boundaries(c.max_seq)
    if tokens is None:  # cross the first two plan boundaries
        tokens = max(bounds[1] + 4 - len(prompt) + 1, 8)
    saved = engine.cfg
    engine.cfg = saved.replace(graph=False)
    be = engine.backend
    try:
        engine.reset(engine.encode(prompt), tokens)
        steps: dict[int, list] = {}
        keys: dict[int, tuple] = {}
        writes: dict[int, list] = {}
        for _ in range(len(prompt) - 1 + tokens):
            n_ops = len(be.ops)
            entry = engine.step()
            keys[entry.position] = entry.plan_key
            steps[entry.position] = engine.log.for_step(entry.step)
            writes[entry.position] = [o.detail for o in be.ops[n_ops:]
                                      if o.kind == "upload" and o.issued == 0]
    finally:
        engine.cfg = saved
    positions = sorted(steps)
    # align by launch index (a changed launch count is a kernel-identity change by itself)
    observed: dict[tuple, dict] = defaultdict(dict)   # (index, what, kind) -> {pos: value}
    meta: dict[tuple, tuple] = {}
    for pos in positions:
        for i, rec in enumerate(steps[pos]):
            for what, kind, value in ([("kernel", "kernel", rec.kernel), ("grid", "grid", rec.grid),
                                       ("block", "block", rec.block)]
                                      + [(n, *arg_value(p)) for n, p in rec.args]):
                observed[(i, what, kind)][pos] = value
                meta.setdefault((i, what, kind), (rec.kernel, rec.layer))
        for j, detail in enumerate(writes[pos]):
            observed[(-1, f"host write {j}", "host write")][pos] = f"{detail} (upload)"
            meta.setdefault((-1, f"host write {j}", "host write"), ("(host)", None))
    varying = []
    for (i, what, kind), values in observed.items():
        if kind == "host write" or len(set(map(str, values.values()))) > 1 or len(values) < len(positions):
            key_like = kind in ("grid", "block", "kernel")
            if key_like:
                per_key = defaultdict(set)
                for pos, v in values.items():
                    per_key[keys[pos]].add(str(v))
                handled = len(values) == len(positions) and all(len(s) == 1 for s in per_key.values())
            else:
                handled = False
            name, layer = meta[(i, what, kind)]
            varying.append(Varying(i, name, layer, what, kind, values,
                                   "capture key" if key_like else "promote to device memory", handled))
    varying.sort(key=lambda v: (v.index, v.what))
    return AuditReport(positions, varying, be.describe())


# ---- lazy initialisation -----------------------------------------------------------------------
@dataclass(frozen=True)
class LazyInit:
    kind: str                  # table upload | scratch allocation | compilation | ...
    detail: str                # which buffer or kernel
    site: str                  # caller site, e.g. "bugs.py:123 in upload_tables_on_first_use"
    plan_key: tuple
    launch_index: int          # the launch that needed it (the next one issued)
    kernel: str
    legal: bool                # compilation: allowed in a capture on newer drivers (warm up anyway)
    surfaced_at: str           # where the capture error showed: "launch 4 (attn_partial)", "end_capture", "-"
    surfaced_index: int | None = None   # launches issued before it showed (None: end_capture or "-")

    @property
    def shows_later(self) -> bool:
        """The capture error showed after the launch that needed the initialisation."""
        if self.surfaced_at == "-":
            return False
        return self.surfaced_index is None or self.surfaced_index > self.launch_index


@dataclass
class LazyInitReport:
    findings: list[LazyInit]
    captures: dict             # plan key -> "ok" or the capture error
    source: str

    @property
    def illegal(self) -> list[LazyInit]:
        return [f for f in self.findings if not f.legal]

    def kinds(self) -> set[str]:
        return {f.kind for f in self.findings}

    def summary(self) -> str:
        lines = [f"lazy-init detector: {len(self.findings)} first-use initialisations inside "
                 f"captures ({len(self.illegal)} illegal), {self.source}"]
        for f in self.findings:
            lines.append(f"  {'illegal' if not f.legal else 'legal  '} {f.kind:<32} {f.detail:<18} "
                         f"for launch {f.launch_index} ({f.kernel}) at {f.site}; "
                         f"error shown at: {f.surfaced_at}")
        for kind in dict.fromkeys(f.kind for f in self.findings):   # each kind seen, once
            lines.append(f"  {kind}: {KIND_NOTES[kind]}")
        for key, outcome in self.captures.items():
            lines.append(f"  capture {key}: {outcome}")
        return "\n".join(lines)


def detect_lazy_init(model, cfg: LabConfig, prompt: str = AUDIT_PROMPT, backend=None) -> LazyInitReport:
    """Decode one step at the start of each plan from a fresh engine with warm-up skipped, as a
    generation would meet them (a failed capture falls back to eager, which then initialises),
    and list every host operation the backend saw inside a capture (global mode)."""
    from lab.engine.runner import DecodeEngine

    eng = DecodeEngine(model, cfg.replace(graph=True), backend=backend, warm_up=False)
    eng.reset(eng.encode(prompt), 0)
    be = eng.backend
    findings, captures = [], {}
    for position in [0] + plan_boundaries(model.cfg.max_seq):
        plan = eng.plan(position)
        launches = eng.step_launches(plan)            # a query: names the launch each op needed
        n_ops = len(be.ops)
        eng.seek(position)
        entry = eng.step()
        failure = eng.capture_failures.get(plan.key) if entry.outcome == "fallback" else None
        captures[plan.key] = "ok" if failure is None else f"failed: {failure.reason}"
        for op in be.ops[n_ops:]:
            if not op.capturing or op.kind not in _KINDS:
                continue
            legal = op.kind in _LEGAL_IN_CAPTURE
            shown = "-" if legal or failure is None else failure.shown_at
            kernel = launches[op.issued].name if op.issued < len(launches) else "(after the last launch)"
            findings.append(LazyInit(_KINDS[op.kind], op.detail, op.site, plan.key, op.issued,
                                     kernel, legal, shown, None if shown == "-" else failure.launch_index))
    return LazyInitReport(findings, captures, be.describe())


# ---- the run checks: what an audit of the step's launches cannot see -------------------------
def run_checks(model, cfg: LabConfig, prompt: str = AUDIT_PROMPT, step=None) -> list[str]:
    """Findings from a short graph run and the step's kernels, one line each (none: clean):
    kernels of the step that read before their pdl_wait (a race once LAB_PDL=1); graph-key
    parts, named or not, that take more values over the run than the plan does (a graph per
    value: `verify.key_parts_beyond_plan`); a kernel fault (reported by whichever later call
    waited for the device). The run is two requests on one engine (40 tokens, then 8), so a
    key part that changes between requests shows too. `step`: a variant of the step's pieces
    (DecodeEngine's `step`), for a key of its own."""
    from lab.engine.runner import DecodeEngine
    from lab.errors import DeviceFault
    from lab.ledger import values_sample
    from lab.pdl_check import wait_first_violations
    from .replay_check import graph_steps, key_parts_beyond_plan

    eng = DecodeEngine(model, cfg.replace(graph=True), **({} if step is None else {"step": step}))
    found = []
    late = sorted({x.name for x in eng.step_launches(eng.plan(0))} & set(wait_first_violations()))
    if late:
        found.append(f"[BUG] PDL: {', '.join(late)} read before their pdl_wait(): a race once "
                     f"LAB_PDL=1 lets them start before their predecessor ends")
    try:
        for tokens in (40, 8):
            eng.generate(prompt, tokens)
    except DeviceFault as exc:
        found.append(f"[BUG] a kernel faulted: {exc} (LAB_LAUNCH_BLOCKING=1 moves the report to "
                     f"the launch that faulted)")
        return found
    plans, steps = len({e.plan for e in eng.ledger}), graph_steps(eng.ledger)
    for part, row in key_parts_beyond_plan(eng.ledger).items():
        n, ledger = len(row["values"]), eng.ledger_summary()
        if n == steps:
            found.append(f"[BUG] graph key: its {part!r} differs at every step ({n} values over "
                         f"{steps} graph steps, where the plan key took {plans}), so every step "
                         f"captured a graph and none was replayed (ledger {ledger}); key the "
                         f"graphs on the plan key alone")
        else:
            found.append(f"[BUG] graph key: its {part!r} took {n} values over {steps} graph "
                         f"steps ({values_sample(row['values'])}), where the plan key took "
                         f"{plans}: each value files a plan under a graph of its own, captured "
                         f"once and replayed only if the value comes back (ledger {ledger}); key "
                         f"the graphs on the plan key alone")
    return found


# ---- the bug table: every deliberate bug, audited, replay-checked and captured -----------------
def bug_row(model, cfg: LabConfig, name: str | None, prompt: str = AUDIT_PROMPT) -> dict:
    """One row of the bug table for bug `name` (None: the clean engine) on cfg's backend."""
    from lab.engine.runner import DecodeEngine
    from .replay_check import replay_check

    bcfg = cfg.replace(bugs=frozenset({name}) if name else frozenset())
    from lab.bugspec import BUGS
    if name and BUGS[name].kind == "fault":
        return fault_row(model, bcfg, name, prompt)
    rep = audit(DecodeEngine(model, bcfg))
    lazy = detect_lazy_init(model, bcfg)
    one = replay_check(DecodeEngine(model, bcfg), [prompt], replays=1)
    three = replay_check(DecodeEngine(model, bcfg), [prompt], replays=3)
    eng = DecodeEngine(model, bcfg)
    gen = eng.generate(prompt, 40)
    fallbacks = [e.reason for e in eng.ledger if e.outcome == "fallback"]
    from lab.pdl_check import wait_first_violations
    used = {launch.name for launch in eng.step_launches(eng.plan(0))}
    pdl_eng = DecodeEngine(model, bcfg.replace(pdl=True))
    pdl_eng.generate(prompt, 4)
    races = getattr(pdl_eng.backend, "races", None)   # the simulator reports races; a GPU cannot
    return {
        "bug": name or "(clean)",
        "audit_flags": sorted({f"{v.kernel}.{v.what}" for v in rep.unhandled}),
        "lazy_init_flags": sorted({f"{f.kind}: {f.detail}" for f in lazy.illegal}),
        "replay_1": "pass" if one.ok else "FAIL",
        "replay_3": "pass" if three.ok else f"FAIL at replay {three.checks[0].first_mismatch}",
        "capture": "fallback: " + fallbacks[0] if fallbacks else "ok",
        "graph_ledger": eng.ledger_summary(),   # replayed, or captured again and again?
        "wait_first_violations": sorted(used & set(wait_first_violations())),
        "pdl_races": None if races is None else len(races),
        "graph_text": gen.text,
        "source": eng.backend.describe(),
    }


def fault_row(model, cfg: LabConfig, name: str, prompt: str = AUDIT_PROMPT) -> dict:
    """The bug table's row for a bug whose kernel faults: where the fault was reported, without
    and with LAB_LAUNCH_BLOCKING=1 (each run on a fresh engine: a fault is sticky). The checks
    that need a finished run have nothing to check."""
    from lab.engine.runner import DecodeEngine
    from lab.errors import DeviceFault

    where = {}
    for blocking in (False, True):
        eng = DecodeEngine(model, cfg.replace(graph=False, launch_blocking=blocking))
        try:
            eng.generate(prompt, 40)
            where[blocking] = "no fault"
        except DeviceFault as exc:
            where[blocking] = str(exc)
    return {"bug": name, "audit_flags": [], "lazy_init_flags": [], "replay_1": "-",
            "replay_3": "-", "capture": "-", "graph_ledger": {},
            "fault": where[False], "fault_blocking": where[True],
            "wait_first_violations": [], "pdl_races": None, "graph_text": "",
            "source": eng.backend.describe()}


def bug_table(model, cfg: LabConfig, prompt: str = AUDIT_PROMPT) -> list[dict]:
    """Rows for the clean engine and every deliberate bug (lab/engine/bugs.py), on cfg's backend. On
    a GPU a bug whose kernel faults is left out: the fault is sticky, it would leave the process's
    device unusable for every row after it (tests/engine/test_bug_float_ids.py runs it alone)."""
    from lab.backend import gpu_status
    from lab.engine.bugs import BUGS
    on_gpu = cfg.backend == "cuda" or (cfg.backend == "auto" and gpu_status()[0])
    names = [n for n in BUGS if not on_gpu or BUGS[n].kind != "fault"]
    return [bug_row(model, cfg, name, prompt) for name in (None, *names)]


# ---- the device loop (LAB_LOOP=device): what a conditional graph freezes and reads -------------
def loop_report(engine) -> str:
    """What the engine's device loop freezes and what its conditions read at run time: the
    WHILE and SWITCH values come from device memory (pos, limit, plan_of: pointers frozen,
    contents live), and each body is one plan's captured step (its grid frozen, as a capture of
    that plan would). Builds the loop if the engine has none yet (it needs LAB_LOOP=device)."""
    if engine.cfg.loop != "device":
        raise ValueError("loop_report needs an engine with LAB_LOOP=device")
    loop = engine.device_loop()
    if loop is None:
        return f"no device loop: {engine.device_loop_refusal() or engine.warnings[-1]}"
    c, b = engine.model.cfg, engine.buf
    first = [0] + plan_boundaries(c.max_seq)
    plans = [engine.plan(p) for p in first]
    lines = [f"device loop ({engine.backend.describe()}):",
             f"  WHILE  another step while pos[0] < limit[0]: reads {b.pos.label} (the step's "
             f"advance kernel",
             f"         writes it) and {b.limit.label} (uploaded per request), at run time",
             f"  SWITCH the body plan_of[pos[0]]: reads {b.plan_of.label} (uploaded at start-up) "
             f"at run time",
             "  frozen in the graph: those three pointers, and in each body its plan's grids:"]
    for k, (plan, counts) in enumerate(zip(plans, loop.body_node_counts())):
        last = first[k + 1] - 1 if k + 1 < len(first) else c.max_seq - 1
        attn = next(x for x in engine.step_launches(plan) if x.name in CONTEXT_KERNELS)
        lines.append(f"    body {k}: positions {first[k]:>4}..{last:<4} {counts} kernel nodes, "
                     f"attention grid {attn.grid}")
    return "\n".join(lines)
