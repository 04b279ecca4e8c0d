"""The mutation score of the hands-on checkers: every mutant of every exercise's reference
(lab/teach/mutate.py), checked as a student's solution would be, in parallel.

    .venv/bin/python scripts/mutation_score.py                  # all exercises, one worker a core
    .venv/bin/python scripts/mutation_score.py -j 2 -e accept -e loo
    .venv/bin/python scripts/mutation_score.py --table docs/mutation.md --json out/mutation.json

Each mutant is KILLED when its check fails with a verdict that names the mistake (one of the
words lab.teach.mutate.OPERATOR_WORDS gives its operator class), FAILED-BUT-UNNAMED when the
check fails without them, SURVIVED when it passes. A mutant listed in lab.teach.mutate.EQUIVALENT
is checked again with DECODE_LAB_FIXTURE=large (checkers may read lab.config.fixture_size() and
grow their random fixture); one that fails there is not equivalent, and is reported so. Per
exercise: mutants, killed, failed-unnamed, survived, equivalent, and the score
killed / (mutants - equivalent). The markdown table goes to --table (docs/mutation.md); every
surviving or unnamed mutant, with its diff and its verdict, to --json, for whoever kills it.

Each mutant's time limit is the exercise's own, capped at --timeout-factor times the time the
reference takes (a mutant that loops for ever costs that, not two minutes).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECORD = ROOT / "docs" / "mutation_verdicts.json"   # mutant id -> verdict, per exercise
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")     # the checks' tiny matrices: one thread


def run_one(name: str, label: str, source: str, timeout_s: float, large: bool):
    """Check one solution (in the check's own child process); (passed, message, seconds)."""
    from lab.teach.handson import Source, check
    from lab.teach.mutate import FIXTURE_ENV
    if large:
        os.environ[FIXTURE_ENV] = "large"
    else:
        os.environ.pop(FIXTURE_ENV, None)
    t0 = time.perf_counter()
    res = check(name, Source(source, label), timeout_s=timeout_s, echo=False)
    return res.passed, res.message, time.perf_counter() - t0


def run_all(args, names, all_mutants, equivalent, results, limits) -> None:
    """Check every reference, then every mutant, `args.jobs` at a time."""
    from tqdm import tqdm
    from lab.teach.handson import EXERCISES
    from lab.teach import mutate
    with ProcessPoolExecutor(args.jobs) as pool:
        # the references first: each must pass, and its time sets its mutants' limit
        refs = {pool.submit(run_one, n, f"{n} reference", EXERCISES[n].reference,
                            EXERCISES[n].timeout_s, False): n for n in names}
        for fut in tqdm(as_completed(refs), total=len(refs), desc="references", unit="check"):
            n = refs[fut]
            passed, message, secs = fut.result()
            if not passed:
                print(f"{n}: the reference FAILS its check ({message}); its mutants are skipped",
                      file=sys.stderr)
                continue
            limits[n] = min(EXERCISES[n].timeout_s,
                            max(args.min_timeout, args.timeout_factor * secs))
        jobs = {}
        for n in names:
            if n not in limits:
                continue
            for m in all_mutants[n]:
                large = m.signature in equivalent[n]
                jobs[pool.submit(run_one, n, f"{n} mutant {m.id}", m.source, limits[n],
                                 large)] = m
        for fut in tqdm(as_completed(jobs), total=len(jobs), desc="mutants", unit="mutant"):
            m = jobs[fut]
            passed, message, secs = fut.result()
            results[m.id] = {"passed": passed, "message": message, "seconds": round(secs, 2),
                             "verdict": mutate.verdict(m.exercise, m.op, passed, message)}


def table(rows: list[dict]) -> str:
    head = ("| exercise | mutants | killed | failed-unnamed | survived | equivalent | score |\n"
            "|---|---:|---:|---:|---:|---:|---:|\n")
    lines = []
    tot = dict.fromkeys(("mutants", "killed", "unnamed", "survived", "equivalent"), 0)
    for r in rows:
        lines.append(f"| {r['exercise']} | {r['mutants']} | {r['killed']} | {r['unnamed']} | "
                     f"{r['survived']} | {r['equivalent']} | {_pct(r)} |")
        for k in tot:
            tot[k] += r[k]
    lines.append(f"| **all** | {tot['mutants']} | {tot['killed']} | {tot['unnamed']} | "
                 f"{tot['survived']} | {tot['equivalent']} | {_pct(tot)} |")
    return head + "\n".join(lines) + "\n"


SLOW_S = 10.0    # a kill that took longer (a time limit met) is recorded as "killed:slow"


def _recorded(mutate, m, res) -> str:
    """A mutant's verdict as the record keeps it: "equivalent", a verdict, or "killed:slow" for a
    kill by a time limit (make test's sample leaves those out: each costs the limit)."""
    if mutate.is_equivalent(m) and res["passed"]:
        return "equivalent"
    if res["verdict"] == mutate.KILLED and res["seconds"] > SLOW_S:
        return f"{mutate.KILLED}:slow"
    return res["verdict"]


def _pct(r) -> str:
    live = r["mutants"] - r["equivalent"]
    return f"{100.0 * r['killed'] / live:.1f}%" if live else "-"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-e", "--exercise", action="append", help="only these exercises")
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--table", default=str(ROOT / "docs" / "mutation.md"))
    ap.add_argument("--json", default=str(ROOT / "out" / "mutation_survivors.json"))
    ap.add_argument("--record", default=str(RECORD),
                    help="every mutant's verdict, by exercise (merged: a run of some exercises "
                         "replaces only theirs); tests/teach/test_mutation.py holds the checkers to it")
    ap.add_argument("--timeout-factor", type=float, default=10.0)
    ap.add_argument("--min-timeout", type=float, default=30.0)
    ap.add_argument("--rescore", metavar="JSON",
                    help="run nothing: judge the verdicts a previous run stored in JSON again "
                         "(after a change to the words or the equivalents)")
    args = ap.parse_args(argv)

    from lab.teach.handson import EXERCISES
    from lab.teach import mutate

    names = args.exercise or list(EXERCISES)
    all_mutants = {n: mutate.exercise_mutants(n) for n in names}
    equivalent = {n: {m.signature for m in ms if mutate.is_equivalent(m)}
                  for n, ms in all_mutants.items()}
    stale = {n: sorted(set(mutate.EQUIVALENT.get(n, {})) - {m.signature for m in ms})
             for n, ms in all_mutants.items()}
    t_start = time.perf_counter()
    results: dict[str, dict] = {}
    limits: dict[str, float] = {}
    if args.rescore:
        old = json.loads(Path(args.rescore).read_text())
        stored = {r["id"]: r for r in old["all"]}
        args.jobs, t_start = old.get("jobs", args.jobs), t_start - old.get("wall_s", 0.0)
        for n in names:
            ms = all_mutants[n]
            if ms and all(m.id in stored for m in ms):
                limits[n] = 0.0
                for m in ms:
                    r = stored[m.id]
                    results[m.id] = {k: r[k] for k in ("passed", "message", "seconds")}
                    results[m.id]["verdict"] = mutate.verdict(n, m.op, r["passed"],
                                                              r["message"])
            else:
                print(f"{n}: its mutants are not all in {args.rescore}; skipped",
                      file=sys.stderr)
    else:
        run_all(args, names, all_mutants, equivalent, results, limits)
    wall = time.perf_counter() - t_start

    rows, survivors = [], []
    for n in names:
        if n not in limits:
            continue
        r = dict(exercise=n, mutants=len(all_mutants[n]), killed=0, unnamed=0, survived=0,
                 equivalent=0, refuted=[])
        for m in all_mutants[n]:
            res = results[m.id]
            eq = mutate.is_equivalent(m)
            if eq and res["passed"]:
                r["equivalent"] += 1
                continue
            if eq:
                r["refuted"].append(m.id)         # listed equivalent, yet a check fails it
            v = res["verdict"]
            r[{"killed": "killed", "failed-unnamed": "unnamed", "survived": "survived"}[v]] += 1
            if v != mutate.KILLED:
                survivors.append({"id": m.id, "exercise": n, "op": m.op, "where": m.where,
                                  "scope": m.scope, "desc": m.desc, "signature": m.signature,
                                  "verdict": v, "message": res["message"],
                                  "listed_equivalent": eq, "diff": m.diff()})
        rows.append(r)

    md = ["# Mutation score of the hands-on checkers", "",
          "Each exercise's reference solution, mutated one small mistake at a time "
          "(lab/teach/mutate.py: comparisons, constants, off-by-one, removed statements, swapped "
          "arguments, arithmetic, emptied or neutered kernels, wrong thread guards), and checked "
          "as a student's solution. A mutant is *killed* when the check fails with a verdict "
          "that names the mistake (the words lab.teach.mutate.OPERATOR_WORDS gives its operator "
          "class); *failed-unnamed* when it fails without them; *survived* when it passes. "
          "*Equivalent* mutants (lab.teach.mutate.EQUIVALENT, each with its reason) change "
          "nothing a check can see, and are checked again with DECODE_LAB_FIXTURE=large. "
          "Score = killed / (mutants - equivalent). Every mutant's verdict is recorded in "
          "docs/mutation_verdicts.json; `make test` (tests/teach/test_mutation.py) holds the checkers "
          "to it: the record covers today's mutants, every exercise keeps 95% killed, and a "
          "sample of the recorded kills, drawn afresh each run (its seed printed on failure), "
          "is killed again.", "",
          table(rows),
          f"Regenerate: `.venv/bin/python scripts/mutation_score.py` ({len(results)} mutants, "
          f"{args.jobs} workers, {wall / 60:.0f} min on the machine that wrote this table).", ""]
    md += ["## The equivalent mutants, and why no check can fail them", ""]
    for n in names:
        for m in all_mutants[n]:
            if mutate.is_equivalent(m) and results[m.id]["passed"]:
                md.append(f"- {n}, {m.op}: {m.desc} -- {mutate.EQUIVALENT[n][m.signature]}")
    md.append("")
    over = [f"{r['exercise']} ({r['equivalent']} of {r['mutants']})" for r in rows
            if r["equivalent"] > 0.1 * r["mutants"]]
    if over:
        md.append(f"Over the 10% allowance of equivalent mutants: {', '.join(over)}.\n")
    refuted = [i for r in rows for i in r["refuted"]]
    if refuted:
        md.append(f"Listed equivalent, yet failed by a check: {', '.join(refuted)}.\n")
    gone = [f"{n}: {s}" for n, ss in stale.items() for s in ss]
    if gone:
        md.append("Listed equivalent, but no longer a mutant of the reference: "
                  + "; ".join(gone) + ".\n")
    Path(args.table).parent.mkdir(parents=True, exist_ok=True)
    Path(args.table).write_text("\n".join(md))
    record = json.loads(Path(args.record).read_text()) if Path(args.record).is_file() else {}
    for n in names:
        if n in limits:
            record[n] = {m.id: _recorded(mutate, m, results[m.id]) for m in all_mutants[n]}
    Path(args.record).write_text(json.dumps(dict(sorted(record.items())), indent=0) + "\n")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    every = [{"id": m.id, "op": m.op, "desc": m.desc, **results[m.id]}
             for n in names if n in limits for m in all_mutants[n]]
    Path(args.json).write_text(json.dumps({"rows": rows, "mutants": survivors, "all": every,
                                           "wall_s": round(wall, 1), "jobs": args.jobs},
                                          indent=1))
    print(table(rows))
    print(f"{len(survivors)} mutants not killed: {args.json}; table: {args.table}; "
          f"{wall:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
