"""Read the verify steps' component costs (and the capture floor) from the log of a
scripts/record_gpu_costs.py run that did not reach the end, into a supplement of the cost file.

  python scripts/costs_from_log.py LOG --out data/gpu/spec_costs.json [--source TEXT] [--date D]

record_gpu_costs.py prints every measurement as it makes it (each launch's per-node time, with
and without PDL, and its cost key; each switch; the capture floor), and writes kernel_costs.json
only at its end. A run cut by its time limit therefore leaves measurements that are whole in its
log. This reads the part of the log that the committed kernel_costs.json lacks -- everything after
"the verify steps of speculative decoding", and the `capture:` / `instantiate:` floor lines --
and writes them in kernel_costs.json's own shapes (`kernels`, `switches`, `floors.capture`),
which lab/backend/costmodel.py merges when it finds the supplement beside the cost file. A
row's bytes and instances and each switch's keys come from the engine's own launches for the
same verify step (built here on the simulator, which allocates the same shapes); a switch line
names kernels only, so the pairs are re-derived in the order measure_switches measured them.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lab.backend.costmodel import cost_key, launch_bytes  # noqa: E402
from lab.config import LabConfig  # noqa: E402
from lab.engine.runner import DecodeEngine  # noqa: E402
from lab.errors import LabError  # noqa: E402
from lab.model import load_model  # noqa: E402
from scripts import recorder  # noqa: E402

SECTION = "the verify steps of speculative decoding"
STEP = re.compile(r"verify step: LAB_DRAFT=(\d+), LAB_DRAFT_SPLITS=(\d+)")
NODE = re.compile(r"^\[[ \d.]+s\]\s+(\w+)\s+pos\s+(\d+): ([\d.]+) us/node, ([\d.]+) with PDL\s+\[(.+)\]$")
SWITCH = re.compile(r"^\[[ \d.]+s\]\s+(\w+) -> (\w+)\s+switch ([+-][\d.]+) us \(([+-][\d.]+) with PDL\)$")
FLOOR = re.compile(r"^\[[ \d.]+s\]\s+(capture|instantiate): ([\d.]+) us per node \+ ([\d.]+) us per graph")


def step_engine(model, draft: int, splits: int):
    """An engine of the verify step (on the simulator: the same shapes), for its launches."""
    eng = DecodeEngine(model, LabConfig(backend="sim", graph=False, draft=draft,
                                        draft_splits=splits), warm_up=False)
    eng.reset(eng.encode("ROMEO.\n"), 0)
    return eng


def step_launches(eng, position: int):
    """The verify step's launches at `position` (a query: nothing is issued)."""
    eng.seek(position)
    return eng.step_launches(eng.plan(position))


def parse(log: str, model) -> dict:
    lines = log.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if SECTION in line)
    except StopIteration:
        raise LabError(f"the log has no {SECTION!r} section: not a record_gpu_costs.py log of "
                       f"this version") from None
    floors = {}
    for line in lines:
        m = FLOOR.match(line)
        if m:
            floors[m.group(1)] = {"per_node_us": float(m.group(2)), "intercept_us": float(m.group(3))}
    kernels, switches, seen_pairs, step = [], [], set(), None
    pending_pairs: list = []
    for line in lines[start + 1:]:
        m = STEP.search(line)
        if m:
            step = (int(m.group(1)), int(m.group(2)))
            eng = step_engine(model, *step)
            launches = step_launches(eng, 64)
            keys = [cost_key(x) for x in launches]
            pending_pairs = [p for p in dict.fromkeys(zip(keys, keys[1:])) if p not in seen_pairs]
            continue
        m = NODE.match(line)
        if m and step is not None:
            name, pos, node, node_pdl, key = m.groups()
            pos = int(pos)
            same = [x for x in step_launches(eng, pos) if cost_key(x) == key]
            if not same:
                raise LabError(f"{key}: no launch of LAB_DRAFT={step[0]}, LAB_DRAFT_SPLITS="
                               f"{step[1]} has this key (another version's log?)")
            kernels.append({"key": key, "kernel": name, "position": pos, "context": pos + 1,
                            "grid": list(same[0].grid), "block": list(same[0].block),
                            "bytes": launch_bytes(same[0], pos + 1), "instances": len(same),
                            "node_us": float(node), "node_pdl_us": float(node_pdl)})
            continue
        m = SWITCH.match(line)
        if m and step is not None:
            a, b, extra, extra_pdl = m.groups()
            if not pending_pairs:
                raise LabError(f"switch {a} -> {b}: more switches than the step has pairs")
            prev, key = pending_pairs.pop(0)
            if not (prev.startswith(a + " ") and key.startswith(b + " ")):
                raise LabError(f"switch {a} -> {b} does not follow the step's order ({prev} -> {key})")
            seen_pairs.add((prev, key))
            switches.append({"prev": prev, "key": key, "extra_us": float(extra),
                             "extra_pdl_us": float(extra_pdl)})
    if not kernels:
        raise LabError("no verify-step launch was measured in the log")
    return {"kernels": kernels, "switches": switches, "floors": {"capture": floors} if floors else {}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("log")
    ap.add_argument("--out", required=True)
    ap.add_argument("--source", required=True, help="where the run was measured (GPU, versions)")
    ap.add_argument("--date", required=True)
    ap.add_argument("--note", default="", help="what cut the run, and anything else to know")
    args = ap.parse_args(argv)
    res = parse(Path(args.log).read_text(), load_model())
    res = {"what": "a supplement of kernel_costs.json: the verify steps' component costs "
                   "(LAB_DRAFT) and the capture floor, read from a record_gpu_costs.py log",
           "source": args.source, "date": args.date, "recorded_by": "scripts/record_gpu_costs.py",
           "read_by": "scripts/costs_from_log.py", "note": args.note, **res}
    path = recorder.write_json(args.out, res, indent=1)
    print(f"{len(res['kernels'])} launches, {len(res['switches'])} switches, floors "
          f"{sorted(res['floors'].get('capture', {}))} -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(recorder.run(main))
