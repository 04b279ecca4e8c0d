"""Typed loading of the lab's own files: each file's fields declared once, checked on load.

A schema is built from the rules below and names only the fields the lab reads (a file may hold
more); `load(path, SCHEMA)` parses a JSON file and returns its data, or raises a `LabError` in
one line naming the file, the field's path and the rule:

    kernel_costs.json: kernels[3].node_us: must be a finite number >= 0, got nan

  Num(...)     a finite number (JSON's NaN and Infinity are refused), with bounds; integer=True
               for a count
  Str(...)     a string, non-empty unless allow_empty, containing `contains` when given
  Bool()       true or false
  Null(rule)   null, or what `rule` accepts
  List(item)   a list of `item`s, non-empty unless allow_empty
  Rows(item, by, need)  a list of `item`s holding, for each name in `need`, the row whose `by`
               field is that name (which also follows need[name])
  Map(value)   an object of any keys whose values are `value`s, non-empty unless allow_empty
  Obj(fields)  an object with these fields; Opt(rule) marks one that may be absent
  Any()        anything (a field that must be present, whatever it holds)

No dependency beyond the standard library: the GPU host runs the same loaders.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from lab.errors import LabError


class SchemaError(LabError):
    """A file's field that breaks its declared rule (a LabError: the CLI prints one line)."""


def _shown(value) -> str:
    text = "nan" if isinstance(value, float) and math.isnan(value) else (
        json.dumps(value) if isinstance(value, (dict, list)) else repr(value))
    return text if len(text) <= 40 else text[:37] + "..."


def finite(value) -> bool:
    """A finite number: an int past float's range (10**400 in a JSON file) is not one (math.isfinite
    raises on it)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _got(value) -> str:
    kind = {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            type(None): "null"}.get(type(value))
    return f"{kind} {_shown(value)}" if kind and kind != "null" else (kind or _shown(value))


class Rule:
    """One field's rule: `check(value, where, fail)` returns when `value` (at the field path
    `where`) follows it, else calls fail(where, what it must be), which raises."""

    def check(self, value, where: str, fail) -> None:  # pragma: no cover - abstract
        raise NotImplementedError


@dataclass(frozen=True)
class Num(Rule):
    ge: float | None = None           # value >= ge
    gt: float | None = None           # value > gt
    le: float | None = None           # value <= le
    integer: bool = False

    def describe(self) -> str:
        bounds = [f"{op} {b:g}" for op, b in ((">=", self.ge), (">", self.gt), ("<=", self.le))
                  if b is not None]
        return ("an integer" if self.integer else "a finite number") + (
            " " + " and ".join(bounds) if bounds else "")

    def check(self, value, where, fail):
        ok = (isinstance(value, int) if self.integer else isinstance(value, (int, float)))
        ok = ok and not isinstance(value, bool) and finite(value)
        ok = ok and (self.ge is None or value >= self.ge) and (self.gt is None or value > self.gt) \
            and (self.le is None or value <= self.le)
        if not ok:
            fail(where, f"must be {self.describe()}, got {_got(value)}")


@dataclass(frozen=True)
class Str(Rule):
    allow_empty: bool = False
    contains: str | None = None

    def check(self, value, where, fail):
        if not isinstance(value, str):
            fail(where, f"must be a string, got {_got(value)}")
        if not value and not self.allow_empty:
            fail(where, "must be a non-empty string, got ''")
        if self.contains is not None and self.contains not in value:
            fail(where, f"must be a string containing {self.contains!r}, got {_shown(value)}")


@dataclass(frozen=True)
class Bool(Rule):
    def check(self, value, where, fail):
        if not isinstance(value, bool):
            fail(where, f"must be true or false, got {_got(value)}")


@dataclass(frozen=True)
class Any(Rule):
    def check(self, value, where, fail):
        pass


@dataclass(frozen=True)
class Null(Rule):
    rule: Rule

    def check(self, value, where, fail):
        if value is not None:
            self.rule.check(value, where, fail)


@dataclass(frozen=True)
class List(Rule):
    item: Rule
    allow_empty: bool = False

    def check(self, value, where, fail):
        if not isinstance(value, list):
            fail(where, f"must be a list, got {_got(value)}")
        if not value and not self.allow_empty:
            fail(where, "must be a non-empty list, got []")
        for i, v in enumerate(value):
            self.item.check(v, f"{where}[{i}]", fail)


@dataclass(frozen=True)
class Rows(Rule):
    """A non-empty list of `item`s, among them, for each name in `need`, one whose `by` field is
    that name and which follows need[name] too (the row a reader looks up by name)."""
    item: Rule
    by: str
    need: dict

    def check(self, value, where, fail):
        List(self.item).check(value, where, fail)
        for name, rule in self.need.items():
            i = next((i for i, r in enumerate(value) if r.get(self.by) == name), None)
            if i is None:
                fail(where, f"must hold a row whose {self.by} is {name!r}")
            rule.check(value[i], f"{where}[{i}]", fail)


@dataclass(frozen=True)
class Map(Rule):
    value: Rule
    allow_empty: bool = False

    def check(self, value, where, fail):
        if not isinstance(value, dict):
            fail(where, f"must be an object, got {_got(value)}")
        if not value and not self.allow_empty:
            fail(where, "must be a non-empty object, got {}")
        for k, v in value.items():
            self.value.check(v, f"{where}[{k!r}]", fail)


@dataclass(frozen=True)
class Opt:
    """A field of an Obj that may be absent (when present, `rule` holds)."""
    rule: Rule


@dataclass(frozen=True)
class Obj(Rule):
    fields: dict = field(default_factory=dict)

    def check(self, value, where, fail):
        if not isinstance(value, dict):
            fail(where, f"must be an object, got {_got(value)}")
        for name, rule in self.fields.items():
            at = f"{where}.{name}" if where else name
            if name not in value:
                if isinstance(rule, Opt):
                    continue
                fail(_first_leaf(rule, at), "missing")
            (rule.rule if isinstance(rule, Opt) else rule).check(value[name], at, fail)


def _first_leaf(rule: Rule, at: str) -> str:
    """The path of the first field a missing object's rule requires (what the reader looks up
    first): `floors.empty_pdl.per_node_us` for a missing `floors.empty_pdl`."""
    while isinstance(rule, Obj):
        required = [(n, r) for n, r in rule.fields.items() if not isinstance(r, Opt)]
        if not required:
            break
        name, rule = required[0]
        at = f"{at}.{name}"
    return at


def check(data, schema: Rule, name: str, missing: str = "missing key {!r}"):
    """`data` if it follows `schema`; else a SchemaError `<name>: <field>: <rule>, got ...`, or
    for an absent field `<name>: ` + `missing` formatted with the field's path (a reader's own
    wording and advice: what records the file)."""
    def fail(where: str, what: str):
        if what == "missing":
            raise SchemaError(f"{name}: " + missing.format(where))
        raise SchemaError(f"{name}: {where or 'the file'}: {what}")
    schema.check(data, "", fail)
    return data


def read_json(path: Path, absent: str = "", what: str = ""):
    """A JSON file's content; a LabError naming the file (after `what`, e.g. "the simulator's
    cost file ") when it is absent or not JSON (`absent`: what to do about an absent file,
    appended to its message)."""
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise LabError(f"{what}{path} is missing" + (f": {absent}" if absent else "")) from None
    except IsADirectoryError:
        raise LabError(f"{what}{path} is a folder, not a JSON file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise LabError(f"{what}{path} is unreadable: {exc}") from None
    except ValueError as exc:
        raise LabError(f"{what}{path} is unreadable: not valid JSON ({exc})") from None


def load(path, schema: Rule, absent: str = ""):
    """The parsed JSON at `path`, checked against `schema` (errors name the file by its name)."""
    path = Path(path)
    return check(read_json(path, absent), schema, path.name)


# ---- the lab's files -------------------------------------------------------------------------
US = Num(ge=0)                 # a measured time
US_POS = Num(gt=0)             # a measured time that cannot be zero (a floor, a step)
SIGNED = Num()                 # a fitted intercept, a difference of two measurements
CV = Num(ge=0, le=10)          # a coefficient of variation (std / mean) of measured times: past
                               # 10 it is no measurement, and the simulator's noise overflows
COUNT = Num(ge=0, integer=True)
LINE_FIT = Obj({"intercept_us": SIGNED, "per_node_us": SIGNED})

KERNEL_ROW = Obj({"key": Str(contains=" ["), "context": Num(ge=1, integer=True),
                  "node_us": US, "node_pdl_us": US, "bytes": Num(gt=0, integer=True)})
SWITCH_ROW = Obj({"prev": Str(contains=" ["), "key": Str(contains=" ["),
                  "extra_us": SIGNED, "extra_pdl_us": SIGNED})
CAPTURE = Obj({"capture": Opt(LINE_FIT), "instantiate": Opt(LINE_FIT)})

# data/gpu/kernel_costs.json (decode-lab record costs): what CostModel reads
KERNEL_COSTS = Obj({
    "source": Str(), "date": Opt(Str(allow_empty=True)), "supplement": Opt(Str(allow_empty=True)),
    "launches_per_token": Num(gt=0),
    "kernels": List(KERNEL_ROW),
    "switches": List(SWITCH_ROW),
    "floors": Obj({
        "empty": Obj({"per_node_us": US_POS, "intercept_us": SIGNED}),
        "empty_pdl": Obj({"per_node_us": US_POS}),
        "fork_join": Obj({"extra_us_per_pair": SIGNED}),
        "eager_device": Obj({"per_launch_us": US_POS}),
        "graph_submit_us": US_POS,
        "loop": Opt(Obj({"overhead_us": Opt(SIGNED)})),
        "capture": Opt(CAPTURE)}),
    "host": Obj({**{f"{m}_{k}": US_POS for m in ("dispatcher", "prebound")
                    for k in ("step_sequence_us", "alone_over_step_us")},
                 "dispatcher": Map(US), "prebound": Map(US)}),
    "noise": Obj({"prebound": Obj({"token_cv_robust": CV, "rep_cv": CV, "rep_seconds": US_POS,
                                   "tokens_per_rep": Opt(Num(gt=0))}),
                  "graph": Obj({"rep_cv": CV, "tokens_per_rep": Num(gt=0)})}),
    "engine_host_us": Obj({"eager": US_POS, "graph": US_POS}),
})

# data/gpu/spec_costs.json (decode-lab record spec_costs): rows merged into the cost file's
SPEC_COSTS = Obj({"source": Str(), "date": Opt(Str(allow_empty=True)),
                  "kernels": List(KERNEL_ROW, allow_empty=True),
                  "switches": List(SWITCH_ROW, allow_empty=True),
                  "floors": Opt(Obj({"capture": Opt(CAPTURE)}))})

# data/gpu/ranks.json's collectives (decode-lab record ranks)
COLLECTIVES = Obj({"source": Str(), "graph_us": Map(US), "eager_us": Map(US),
                   "host_call_us": Map(US)})
RANKS = Obj({"collectives": COLLECTIVES})

# the whole-step recordings conformance judges (lab/measure/conformance.py)
AB = Obj({"tokens": Num(ge=1, integer=True), "prompt": Str(), "meaningful": Opt(Bool()),
          "diff_b_minus_a_ms": SIGNED, "diff_sem_ms": Num(ge=0)})
LADDER = Obj({"tokens": Num(ge=1, integer=True), "prompt": Str(),
              "source": Str(), "date": Opt(Str(allow_empty=True)),
              "arms": Rows(Obj({"name": Str(), "mean_ms": Num(gt=0)}), "name", {
                  "graph": Obj({"launches_per_token": COUNT, "nodes_per_graph": COUNT}),
                  "graph+pdl": Obj({})})})
OVERLAP = AB
FISSION = Obj({"eager": AB, "graph": AB, "fused": Opt(Obj({"eager": AB, "graph": AB})),
               "fused_grid": Opt(Obj({"eager": AB, "graph": AB}))})
DEVICE_LOOP = Obj({"plain": AB})
BENCH_SWEEP = Obj({"rows": List(Obj({"toggles": Map(Any(), allow_empty=True), "arm": Str(),
                                     "context": Num(ge=1, integer=True), "mean_ms": Num(gt=0)})),
                   "tokens": Num(ge=1, integer=True)})
PDL_CONTEXT = Obj({"contexts": List(Obj({
    "position": COUNT, "context": Num(ge=1, integer=True),
    "rows": Rows(Obj({"arm": Str()}), "arm", {
        "graph": Obj({"minus_pdl_us": SIGNED, "minus_pdl_sem_us": Num(ge=0)})})}))})
SPEC_TEXT = Obj({"offset": COUNT, "length": Num(ge=1, integer=True), "primed": COUNT,
                 "what": Str(), "source": Str(contains="data/corpus.txt["),
                 "prompt_chars": Num(ge=1, integer=True)})
BREAK_EVEN_ROW = Obj({
    "text": Str(), "drafter": Opt(Str()),   # LAB_DRAFTER, recorded since the n-gram drafter
    "draft": Num(ge=1, integer=True), "tokens_per_step": Num(ge=1),
    "verify_steps": Num(ge=1, integer=True), "verify_step_cost": Num(gt=0),
    "verify_step_cost_se": Num(ge=0), "verify_step_us": US_POS, "one_step_us": US_POS,
    "ms_per_token": Num(gt=0), "se": Num(ge=0), "ms_per_token_one": Num(gt=0),
    "se_one": Num(ge=0), "speedup": Num(gt=0), "predicted_speedup": Num(gt=0), "pays": Bool(),
    "generated": Str(allow_empty=True)})
# spec.json's break_even (lab.measure.spec.break_even): recorded since the two texts; older
# recordings lack it
BREAK_EVEN = Obj({"texts": Map(SPEC_TEXT), "new_tokens": Num(ge=1, integer=True),
                  "reps": Num(ge=1, integer=True), "step_reps": Num(ge=1, integer=True),
                  "source": Str(), "rows": List(BREAK_EVEN_ROW),
                  "copy_reach": Opt(Obj({"text": Str(), "tokens": Num(ge=1, integer=True),
                                         "reach": COUNT, "source": Str()}))})
SPEC = Obj({"curve": Obj({"new_tokens": Num(ge=1, integer=True), "rows": List(Obj({
    "arm": Str(), "context": Num(ge=1, integer=True), "ms_per_token": Num(gt=0),
    "tokens_per_step": Num(ge=0), "replay_fraction": Null(Num(ge=0, le=1))}))}),
    "break_even": Opt(BREAK_EVEN)})
FINDINGS = Obj({"findings": List(Obj({"lesson": Str(), "reason": Str()}), allow_empty=True)})
# data/gpu/megakernel_bound.json (decode-lab record megakernel_bound): the probes' arms
MEGAKERNEL_BOUND = Obj({
    "source": Str(), "probes": Map(Obj({"noproj": Bool()})),
    "sweep": Obj({"rows": List(Obj({"arm": Str(), "context": Num(ge=1, integer=True),
                                    "mean_ms": Num(gt=0), "sem_ms": Num(ge=0)}))}),
    "ratio_to_best_multi_node": Map(Obj({"best_ms": Num(gt=0), "gate_reachable": Bool()}))})

# file name -> its schema, for the recordings conformance reads
RECORDINGS = {"kernel_costs.json": KERNEL_COSTS, "ladder.json": LADDER, "overlap.json": OVERLAP,
              "fission.json": FISSION, "device_loop.json": DEVICE_LOOP,
              "bench_sweep.json": BENCH_SWEEP, "pdl_context.json": PDL_CONTEXT, "spec.json": SPEC,
              "conformance_findings.json": FINDINGS, "megakernel_bound.json": MEGAKERNEL_BOUND}
