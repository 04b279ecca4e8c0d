"""The command line: `decode-lab` (or `python -m lab`).

  decode-lab generate --prompt TEXT --tokens N [--backend auto|cuda|sim] [--eager] [--ledger]
  decode-lab demo [--backend ...] [--tokens N]
  decode-lab bench ab --a LAB_GRAPH=0 --b LAB_GRAPH=1 [--reps 5] [--json PATH] [--plot PATH]
  decode-lab bench loo --factors GRAPH,SPLIT_COMBINE
  decode-lab bench sweep --contexts 64,256,1000 --arms LAB_GRAPH=0 LAB_GRAPH=1 [--kv-init empty]
  decode-lab conformance [--data DIR] [--only LESSONS]   the simulator's predictions against
                                        the recorded GPU files
  decode-lab compare --a reference --b KV_DTYPE=float16 [--tokens N] [--json PATH]   two runs, step by step
  decode-lab spec [--draft 4] [--tokens 256] [--prompts standard] [--curve --contexts 64,900]
                                        speculative decoding: same tokens, or the curve
  decode-lab selfcheck [--answers answers.json] [--solutions my_solutions.py] [--explain]
                       [--student NAME] [--attempts PATH]
  decode-lab exercise list | show NAME [--stub] | check NAME --solution FILE [--backend sim|cuda]
  decode-lab record NAME [NAME ...] | --all --backend cuda|sim --out DIR [--archive F.tar.gz]
                                        [--quick]   the GPU recordings (lab/measure/registry.py)

Bad input (unknown characters, too many tokens, a corrupt weight file, an unknown LAB_* value,
--backend cuda without a GPU) prints one line `decode-lab: error: ...` and exits with status 2.
"""
from __future__ import annotations

import argparse
import math
import sys
import warnings

from lab import exits
from lab.config import describe, from_env
from lab.errors import LabError
from lab.files import atomic_write_text

DEMO_PROMPT = "ROMEO.\n"


def _engine(args, **overrides):
    """The engine the environment asks for (a DecodeEngine, for any LAB_RANKS)."""
    from lab.engine.runner import make_engine
    from lab.model import DEFAULT_WEIGHTS, load_model

    cfg = from_env()
    if getattr(args, "backend", None):
        cfg = cfg.replace(backend=args.backend)
    if overrides:
        cfg = cfg.replace(**overrides)
    model = load_model(args.weights or DEFAULT_WEIGHTS)
    return make_engine(model, cfg)


def _print_ledger(engine) -> None:
    from lab.ledger import key_text     # a part with no name too: `[10]=5`
    keys = [key_text(e.plan_key) for e in engine.ledger]
    w = max([4] + [len(k) for k in keys])
    print(f"step  pos  {'plan':<{w}} outcome   reason")
    for e, key in zip(engine.ledger, keys):
        print(f"{e.step:>4} {e.position:>4}  {key:<{w}} {e.outcome:<9} {e.reason}".rstrip())
    print("summary:", engine.ledger_summary())


def _weights_read(args, flag: str = "--weights", attr: str = "weights") -> dict:
    """The weights a command reads and the description beside them, by the flag that names
    them (lab.model.weights_read: an empty path or a folder is refused, not read as the
    default)."""
    from lab.model import weights_read
    return weights_read(flag, getattr(args, attr, None))


def _refuse_io(outputs: dict, inputs: dict) -> None:
    """Before any work: no output is an input, a file the lab reads, or another output."""
    from lab.files import refuse_overlap
    refuse_overlap(outputs, inputs)


def _numbered(path, count: int = 64) -> dict:
    """--save-dot's names when a run captures several graphs: NAME.0.dot, NAME.1.dot, ..."""
    from pathlib import Path
    base = Path(path)
    return {f"--save-dot (graph {i})": base.with_name(f"{base.stem}.{i}{base.suffix}")
            for i in range(count)}


def _positive_seconds(flag: str, value) -> None:
    if value is not None and not (math.isfinite(value) and value > 0):
        raise LabError(f"{flag} {value:g}: give a time limit in seconds, a finite number > 0")


def cmd_generate(args) -> int:
    if args.tokens < 1:
        raise LabError(f"--tokens {args.tokens}: give at least 1 token to generate")
    from lab.files import refuse_empty
    refuse_empty({"--save-dot": args.save_dot})
    if args.save_dot:                          # before the run, not after it; and before its
        from lab.files import check_output     # numbered names, which a folder ('.') has not
        check_output(args.save_dot, "--save-dot")
    outputs = {} if args.save_dot is None else {"--save-dot": args.save_dot,
                                                **_numbered(args.save_dot)}
    _refuse_io(outputs, _weights_read(args))
    eng = _engine(args, **({"graph": False} if args.eager else {}))
    gen = eng.generate(args.prompt, args.tokens, progress=args.progress)
    print(gen.prompt + gen.text)
    # a step decodes one position (a prompt token's or a new one's): per step is per token
    print(f"\n[{gen.steps - args.tokens} prompt steps + {args.tokens} tokens, "
          f"{gen.ms_per_token:.3f} ms/token (per step, prompt steps included), "
          f"{'graph' if eng.cfg.graph else 'eager'}; {gen.source}]")
    if getattr(gen, "draft", None):   # LAB_DRAFT: a step is a position here; the device's counts, read at the end
        print(f"[LAB_DRAFT={eng.cfg.draft}: {gen.draft['verify steps']} verify steps generated "
              f"{gen.draft['tokens generated']} tokens, {gen.draft['tokens per step']:.2f} per "
              f"step, after {len(eng.ledger) - gen.draft['verify steps']} step(s) of prompt alone]")
    if args.ledger:
        _print_ledger(eng)
    if args.save_dot:
        graphs = dict(eng.graphs)
        if eng.cfg.ranks > 1:                  # one graph per rank per plan key
            graphs = {(*key, f"rank {r}"): g for key, gs in graphs.items() for r, g in enumerate(gs)}
        if any(e.outcome == "device" for e in eng.ledger):        # LAB_LOOP=device ran
            graphs[("device loop",)] = eng.device_loop()
        if not graphs:
            raise LabError("--save-dot: no graph was captured (eager run, or every capture failed)")
        from pathlib import Path
        base = Path(args.save_dot)
        for i, (key, graph) in enumerate(graphs.items()):
            path = base if len(graphs) == 1 else base.with_name(f"{base.stem}.{i}{base.suffix}")
            atomic_write_text(path, graph.dot())
            n = graph.node_count
            print(f"graph for plan {key}: {n} node{'' if n == 1 else 's'} -> {path}")
    return 0


def cmd_audit(args) -> int:
    from lab.measure.audit import audit, detect_lazy_init, run_checks

    _weights_read(args)
    eng = _engine(args)
    if eng.cfg.ranks > 1:
        raise LabError("audit inspects one device's step: run it with LAB_RANKS=1 (for ranks, "
                       "`DecodeEngine.collective_order` checks what every rank must agree on)")
    report, lazy = audit(eng), detect_lazy_init(eng.model, eng.cfg)
    print(report.summary())
    print()
    print(lazy.summary())
    print()
    found = run_checks(eng.model, eng.cfg)
    print("a graph run and the step's kernels: " + ("nothing found" if not found else ""))
    for line in found:
        print(f"  {line}")
    return 1 if report.unhandled or lazy.illegal or found else 0


def cmd_selfcheck(args) -> int:
    from lab.teach.selfcheck.run import run_selfcheck

    _positive_seconds("--timeout", args.timeout)
    _refuse_io({"--attempts": args.attempts},
               {"--answers": args.answers, "--solutions": args.solutions})
    return run_selfcheck(args.answers, args.solutions, explain=args.explain,
                         attempts_path=args.attempts, student=args.student,
                         timeout_s=args.timeout)


def cmd_exercise(args) -> int:
    """`exercise list|show|check`: the hands-on exercises of lab/teach/handson (exit 1: not passed)."""
    from lab.teach import handson
    from lab.files import refuse_empty

    _positive_seconds("--timeout", args.timeout)
    refuse_empty({"--solution": args.solution})
    if args.action == "list":
        print(handson.listing())
        return 0
    if args.name is None:
        raise LabError(f"exercise {args.action}: name an exercise ({', '.join(handson.EXERCISES)})")
    if args.action == "show":
        if args.stub:               # the stub alone: `... show NAME --stub > mine.py`
            print(handson.exercise(args.name).stub.strip())
        else:
            handson.show(args.name)
        return 0
    if args.solution is None:
        raise LabError("exercise check: give --solution FILE (start from `decode-lab exercise "
                       f"show {args.name}`)")
    backend = args.backend if args.backend in ("sim", "cuda") else "sim"
    if args.backend in (None, "auto"):
        from lab.backend import gpu_status
        backend = "cuda" if gpu_status()[0] else "sim"
    res = handson.check(args.name, args.solution, backend=backend, timeout_s=args.timeout)
    return 0 if res.passed else 1


def _demo_ranks(eng, args) -> int:
    """LAB_RANKS=2: generate eagerly and with one graph per rank; the bill with ranks."""
    print(f"backend: {eng.describe()}")
    ms = {}
    for mode in ("eager", "graph"):
        eng.cfg = eng.cfg.replace(graph=mode == "graph")
        eng.generate(DEMO_PROMPT, args.tokens)             # warm-up: capture every plan
        gen = eng.generate(DEMO_PROMPT, args.tokens, progress=args.progress)
        ms[mode] = gen.ms_per_token
    print("\n--- greedy continuation ---")
    print(gen.prompt + gen.text)
    print("---------------------------")
    bill = eng.bill(eng.plan(0))
    print(f"\nlaunch bill with {bill['ranks']} ranks ({args.tokens} tokens after {DEMO_PROMPT!r}):")
    kinds = sorted(set(c.split(" (")[0] for c in bill["collectives"]))
    print(f"launches per rank per token {bill['launches_per_rank']}; nodes per rank graph "
          f"{bill['nodes_per_rank_graph']}")
    print(f"collectives per token {bill['collectives_per_token']}: {', '.join(kinds)}")
    print(f"eager {ms['eager']:.3f} ms/token, graph {ms['graph']:.3f} ms/token "
          f"({ms['eager'] / ms['graph']:.1f}x less with one graph per rank)")
    print(f"source: {gen.source}")
    eng.close()
    return 0


def cmd_demo(args) -> int:
    from lab.backend.instrument import launch_bill

    if args.tokens < 1:
        raise LabError("--tokens must be at least 1")
    _weights_read(args)
    if from_env().loop == "device":   # its bill would count every plan's body as one token's
        raise LabError("LAB_LOOP=device: demo bills the host loop's launch mechanisms, one token "
                       "at a time; the device loop runs a whole generation in one launch: see it "
                       "with `LAB_LOOP=device decode-lab generate --prompt ROMEO. --ledger`, and time it against "
                       "the host loop with `decode-lab bench ab --a LAB_LOOP=host --b "
                       "LAB_LOOP=device` (notebook 11)")
    eng = _engine(args, graph=False)
    if eng.cfg.ranks > 1:
        return _demo_ranks(eng, args)
    print(f"backend: {eng.backend.describe()}")
    print(f"model: {eng.model.source}, {eng.model.cfg.n_layer} layers, d_model "
          f"{eng.model.cfg.d_model}, vocab {eng.model.cfg.vocab_size}, max_seq {eng.model.cfg.max_seq}")
    bills = []
    # the launch-mechanism ladder: numba's dispatcher, pre-bound launches, one graph per token
    for mode, toggles in (("dispatcher", dict(graph=False, launch="dispatcher")),
                          ("prebound", dict(graph=False, launch="prebound")),
                          ("graph", dict(graph=True))):
        eng.cfg = eng.cfg.replace(**toggles)
        eng.generate(DEMO_PROMPT, args.tokens)             # warm-up: compile, capture every plan
        start = len(eng.ledger)
        gen = eng.generate(DEMO_PROMPT, args.tokens, progress=args.progress)
        # the newest step whose launches were issued one by one (eagerly, or into a capture)
        step = max(r.step for r in eng.log.records if r.kind in ("eager", "capture"))
        bills.append(launch_bill(eng.log, step, mode, gen.ms_per_token, gen.source))
        if mode == "dispatcher":
            print("\n--- greedy continuation ---")
            print(gen.prompt + gen.text)
            print("---------------------------")
    print(f"\nlaunch bill ({args.tokens} tokens after {DEMO_PROMPT!r}):")
    print(f"{'mode':<10} {'kernels/layer':>13} {'layers':>6} {'other':>5} {'launches/token':>14} "
          f"{'ms/token':>9} {'us/launch':>9}")
    for b in bills:
        print(f"{b.mode:<10} {b.kernels_per_layer:>13} {b.layers:>6} {b.other_kernels:>5} "
              f"{b.launches_per_token:>14} {b.ms_per_token:>9.3f} {b.us_per_launch:>9.2f}")
    print(f"graph replay: {bills[1].ms_per_token / bills[2].ms_per_token:.1f}x less time per token "
          f"than pre-bound eager launches ({bills[0].ms_per_token / bills[2].ms_per_token:.1f}x "
          f"less than numba's dispatcher)")
    print(f"source: {bills[0].source}")
    outcomes = {}
    for e in eng.ledger[start:]:
        outcomes[e.outcome] = outcomes.get(e.outcome, 0) + 1
    print(f"graph run's ledger: {outcomes}")
    return 0


def cmd_conformance(args) -> int:
    from lab.measure.conformance import findings_problems, format_report, run
    from lab.model import DEFAULT_WEIGHTS, load_model

    from lab.files import refuse_empty

    refuse_empty({"--data": args.data})
    if args.data is not None:                  # the folder, before any of its files is read
        from pathlib import Path
        if not Path(args.data).is_dir():
            raise LabError(f"--data {args.data}: not a folder (give a folder of GPU recordings)")
        if not (Path(args.data) / "kernel_costs.json").is_file():
            raise LabError(f"--data {args.data}: holds no kernel_costs.json (the simulator's "
                           f"cost file: record it on a GPU with decode-lab record costs)")
    _weights_read(args)
    only = [x.strip() for x in args.only.split(",")] if args.only else None
    report = run(load_model(args.weights or DEFAULT_WEIGHTS), data_dir=args.data,
                 progress=args.progress, only=only)
    print(format_report(report))
    # a row that fails is a failure unless the data folder records it as a finding (with its
    # measured reason); a recorded finding whose row passes is stale, and a failure too
    return 1 if findings_problems(report) else 0


def cmd_record(args) -> int:
    from lab.files import refuse_folder_over
    from lab.measure.registry import record
    if bool(args.names) == args.all:
        raise LabError("record: name experiments or give --all (not both)")
    weights = _weights_read(args)
    _refuse_io({"--archive": args.archive}, weights)
    refuse_folder_over("--out", args.out, weights)
    return record(args.names, args.backend, args.out, all_=args.all, quick=args.quick,
                  archive=args.archive, weights=args.weights, resume=args.resume,
                  replace=args.replace)


def _check_bench_args(args) -> None:
    """Every `bench` argument checked before any work: a bad one is a LabError (exit 2)."""
    from lab.files import check_output, plot_formats

    if args.reps < 2:
        raise LabError(f"--reps {args.reps}: a standard error needs at least 2 reps")
    if args.tokens < 1:
        raise LabError(f"--tokens {args.tokens}: give at least 1 decoded token per rep")
    if getattr(args, "per_token", 0) < 0:
        raise LabError(f"--per-token {args.per_token}: give 0 (skip) or more")
    threshold = getattr(args, "aa_threshold", None)
    if threshold is not None and not (math.isfinite(threshold) and threshold > 0):
        raise LabError(f"--aa-threshold {threshold}: must be a finite number > 0 (or leave it "
                       f"out: the t critical value for the reps at hand)")
    _refuse_io({"--json": args.json, "--plot": args.plot}, _weights_read(args))
    if args.json:
        check_output(args.json, "--json")
    if args.plot:
        check_output(args.plot, "--plot", plot_formats())


def bench_can_time(who: str, cfg, base) -> None:
    """A LabError, in the user's words, for an arm bench cannot time: several ranks (the command
    for them: `decode-lab demo`), or a draft length, drafter or verify split count other than
    the environment's (bench's arms share one engine, which allocates for one of each:
    `decode-lab spec --curve` compares draft lengths and, run once per LAB_DRAFTER, drafters).
    LAB_DRAFT in the environment times every arm drafting."""
    if cfg.ranks > 1:
        raise LabError(f"{who}: LAB_RANKS={cfg.ranks} runs on {cfg.ranks} devices, and "
                       f"bench times arms on one device each; time ranks with "
                       f"`LAB_RANKS={cfg.ranks} decode-lab demo` (eager and graph ms/token)")
    # (toggle, field, what the engine allocates for, how every arm then runs, what compares them)
    for var, fld, what, how, other in (
            ("LAB_DRAFT", "draft", "draft length", "drafting",
             "compare draft lengths with `decode-lab spec --curve` (k = 0, 2, 4, 8 against "
             "context)"),
            ("LAB_DRAFTER", "drafter", "drafter", "with it",
             f"compare drafters with `LAB_DRAFTER={cfg.drafter} decode-lab spec --curve` beside "
             f"`LAB_DRAFTER={base.drafter} decode-lab spec --curve`"),
            ("LAB_DRAFT_SPLITS", "draft_splits", "verify attention's split count", "with it",
             "compare split counts with `decode-lab record spec` (its splits sweep)")):
        if getattr(cfg, fld) != getattr(base, fld):
            raise LabError(f"{who}: {var}={getattr(cfg, fld)} where the environment has "
                           f"{var}={getattr(base, fld)}: bench's arms share one engine, "
                           f"allocated for one {what}; set {var} in the environment to time "
                           f"every arm {how}, or {other}")


def _bench_arms(args, base) -> dict:
    """The arms of `bench ab` (A, B) or `bench sweep` (each text), parsed and checked."""
    from lab.measure import bench

    texts = ({"--a": args.a, "--b": args.b} if args.bench == "ab" else
             {f"--arms {t}": t for t in args.arms} if args.bench == "sweep" else {})
    arms = {}
    for flag, text in texts.items():
        arms[flag] = bench.parse_arm(text, base, who=f"{flag.split()[0]} {text!r}")
        bench_can_time(f"{flag.split()[0]} {text!r}", arms[flag], base)
    return arms


def cmd_bench(args) -> int:
    """Run one `decode-lab bench` subcommand; print its table; save --json / --plot."""
    from lab.measure import bench, report
    from lab.model import DEFAULT_WEIGHTS, load_model

    _check_bench_args(args)
    base = from_env()
    if args.backend:
        base = base.replace(backend=args.backend)
    bench_can_time("the environment (LAB_*)", base, base)
    arms = _bench_arms(args, base)
    model = load_model(args.weights or DEFAULT_WEIGHTS)
    common = dict(progress=args.progress, kv_init=args.kv_init)   # progress None: on a terminal
    if args.bench == "ab":
        a, b = arms["--a"], arms["--b"]
        if a == b:
            raise LabError(f"--a {args.a!r} and --b {args.b!r} are the same configuration: an A/B "
                           f"of an arm against itself is the A/A gate, which every A/B runs "
                           f"first; give arms that differ")
        res = bench.run_ab(model, a, b, reps=args.reps, tokens=args.tokens, per_token=args.per_token,
                           aa_threshold=args.aa_threshold, names=("A", "B"), **common)
        print(report.format_ab(res))   # only the toggles that differ (the JSON: all)
    elif args.bench == "loo":
        res = bench.run_loo(model, args.factors, base=base, reps=args.reps, tokens=args.tokens, **common)
        print(report.format_loo(res))
    else:
        arms = {text: arms[f"--arms {text}"] for text in args.arms}
        res = bench.run_sweep(model, arms, bench.parse_contexts(args.contexts), reps=args.reps,
                              tokens=args.tokens, **common)
        print(report.format_sweep(res))
    for path in report.save(res, args.json, args.plot):
        print(f"wrote {path}")
    return 0


SPEC_TOKENS = 256          # `spec`: generated tokens per prompt
SPEC_CURVE_TOKENS = 64     # `spec --curve`: timed tokens per rep (context 900 + 64 fits max_seq)
SPEC_CURVE_CONTEXTS, SPEC_CURVE_REPS = "64,900", 3


def _spec_flags(args) -> None:
    """`spec`'s flags that mean something only with --curve (--contexts, --reps) or only
    without it (--prompts) are refused where they would be ignored; then the defaults."""
    if args.curve and args.prompts is not None:
        raise LabError(f"--prompts {args.prompts!r}: the curve decodes the corpus text at each of "
                       f"--contexts; --prompts is for the same-tokens check (without --curve)")
    if not args.curve:
        given = [f for f, v in (("--contexts", args.contexts), ("--reps", args.reps))
                 if v is not None]
        if given:
            raise LabError(f"{' and '.join(given)}: the curve's; add --curve, or leave "
                           f"{'them' if len(given) > 1 else 'it'} out for the same-tokens check")
    args.prompts = "standard" if args.prompts is None else args.prompts
    args.contexts = SPEC_CURVE_CONTEXTS if args.contexts is None else args.contexts
    args.reps = SPEC_CURVE_REPS if args.reps is None else args.reps


def _spec_curve_args(args) -> list[int]:
    """`spec --curve`'s contexts (whole numbers) and reps (at least 2), checked before the run."""
    if args.reps < 2:
        raise LabError(f"--reps {args.reps}: the curve's error bars need at least 2 reps")
    try:
        contexts = [int(x) for x in args.contexts.split(",") if x.strip()]
    except ValueError:
        raise LabError(f"--contexts {args.contexts!r}: give whole numbers separated by commas, "
                       f"e.g. 64,900") from None
    if not contexts:
        raise LabError(f"--contexts {args.contexts!r}: give at least one context, e.g. 64,900")
    return contexts


def cmd_spec(args) -> int:
    """Speculative decoding: the same greedy tokens as one token per step (exit 1 when a prompt
    parts from them above the tie margin), or with --curve ms per generated token against
    context."""
    from lab.bugspec import DRAFT_SPLITS_DEFAULT
    from lab.measure import report, spec
    from lab.measure.compare import _prompt_set
    from lab.model import DEFAULT_WEIGHTS, load_model

    _spec_flags(args)
    if args.tokens is None:
        args.tokens = SPEC_CURVE_TOKENS if args.curve else SPEC_TOKENS
    if args.tokens < 1:
        raise LabError(f"--tokens {args.tokens}: give at least 1 token to generate")
    contexts = _spec_curve_args(args) if args.curve else None
    _refuse_io({"--json": args.json}, _weights_read(args))
    if args.json:
        from lab.files import check_output
        check_output(args.json, "--json")
    # --draft is this command's LAB_DRAFT: the environment's LAB_DRAFT_SPLITS applies to it
    base = from_env(LAB_DRAFT=str(args.draft))
    if args.backend:
        base = base.replace(backend=args.backend)
    splits, drafter = base.draft_splits, base.drafter
    base = base.replace(draft=0, draft_splits=DRAFT_SPLITS_DEFAULT, drafter="lookup",
                        bugs=frozenset())
    model = load_model(args.weights or DEFAULT_WEIGHTS)
    if args.curve:
        limit = model.cfg.max_seq - args.tokens
        if any(not 1 <= c <= limit for c in contexts):
            raise LabError(f"--contexts {args.contexts!r} with --tokens {args.tokens}: each "
                           f"context in [1, {limit}] (max_seq {model.cfg.max_seq} minus --tokens);"
                           + (f" at context {max(contexts)} at most --tokens "
                              f"{model.cfg.max_seq - max(contexts)} fit"
                              if max(contexts) < model.cfg.max_seq else
                              f" each context must be below {model.cfg.max_seq}"))
        res = spec.curve(model, drafts=(0, 2, 4, 8), contexts=contexts, new_tokens=args.tokens,
                         reps=args.reps, base=base, bug=args.draft, splits=splits,
                         drafter=drafter, progress=args.progress)
        print(spec.format_curve(res))
        ok = True
    else:
        res = spec.same_tokens(model, args.draft, prompts=_prompt_set(args.prompts),
                               tokens=args.tokens, base=base, splits=splits, drafter=drafter)
        print(spec.format_same(res))
        ok = res["ok"]
    for path in report.save(res, args.json):
        print(f"wrote {path}")
    return 0 if ok else 1


def cmd_compare(args) -> int:
    from lab.measure.compare import main_compare

    cfg = from_env()
    if args.backend:
        cfg = cfg.replace(backend=args.backend)
    return main_compare(args, cfg)


def _bench_parsers(sub, common) -> None:
    """`bench ab|loo|sweep`: paired, interleaved measurement (see lab/measure/bench.py)."""
    bp = sub.add_parser("bench", help="paired interleaved A/B (behind an A/A gate), "
                        "leave-one-out, context sweep")
    bsub = bp.add_subparsers(dest="bench", required=True)

    def shared(sp, reps, tokens):
        sp.add_argument("--reps", type=int, default=reps, help="paired reps per arm")
        sp.add_argument("--tokens", type=int, default=tokens, help="decoded tokens per rep")
        sp.add_argument("--kv-init", choices=("zeros", "empty"), default="zeros",
                        help="KV cache zero-initialised or uninitialised")
        sp.add_argument("--json", default=None, metavar="PATH", help="write the result as JSON")
        sp.add_argument("--plot", default=None, metavar="PATH", help="save a plot (matplotlib)")
        common(sp)
        sp.set_defaults(fn=cmd_bench)

    ab = bsub.add_parser("ab", help="A vs B, interleaved and paired, after an A/A gate")
    ab.add_argument("--a", required=True, help="arm A, e.g. LAB_GRAPH=0 (comma-separate several)")
    ab.add_argument("--b", required=True, help="arm B, e.g. LAB_GRAPH=1")
    ab.add_argument("--per-token", type=int, default=1000,
                    help="tokens per arm for the per-token p50/p99 pass (0: skip)")
    ab.add_argument("--aa-threshold", type=float, default=None,
                    help="A/A fails when its paired |t| exceeds this (default: the t "
                    "distribution's critical value for the reps at hand, so that identical arms "
                    "fail 1%% of the time at any rep count)")
    shared(ab, 5, 128)
    lo = bsub.add_parser("loo", help="leave-one-out: what each factor is worth given the others")
    lo.add_argument("--factors", required=True, help="boolean toggles, e.g. GRAPH,SPLIT_COMBINE")
    shared(lo, 5, 64)
    sw = bsub.add_parser("sweep", help="ms/token and tok/s per context length per arm")
    sw.add_argument("--contexts", required=True, help="e.g. 64,256,1000 (reached with seek)")
    sw.add_argument("--arms", nargs="+", required=True, help="e.g. LAB_GRAPH=0 LAB_GRAPH=1")
    shared(sw, 3, 16)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="decode-lab", description=__doc__.split("\n")[0],
                                epilog="toggles (environment):\n" + describe(),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)

    def common(sp):
        sp.add_argument("--backend", choices=("auto", "cuda", "sim"), default=None,
                        help="overrides LAB_BACKEND")
        sp.add_argument("--weights", default=None, help="weights .npz (default: data/tiny_model.npz)")
        sp.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="progress bars (default: on a terminal only)")

    g = sub.add_parser("generate", help="greedy generation from a prompt")
    g.add_argument("--prompt", required=True)
    g.add_argument("--tokens", type=int, default=200)
    g.add_argument("--eager", action="store_true", help="do not capture (same as LAB_GRAPH=0)")
    g.add_argument("--ledger", action="store_true", help="print the per-step graph ledger")
    g.add_argument("--save-dot", metavar="PATH", help="write each captured graph as DOT text")
    common(g)
    g.set_defaults(fn=cmd_generate)

    d = sub.add_parser("demo", help="generate, then print the launch bill for eager and graph")
    d.add_argument("--tokens", type=int, default=200)
    common(d)
    d.set_defaults(fn=cmd_demo)
    a = sub.add_parser("audit", help="what a capture would freeze, lazy initialisation inside "
                       "a capture, PDL's wait-first rule, graphs never replayed, kernel faults "
                       "(set LAB_BUG_* to audit a deliberate bug; exit 1 when it finds one)")
    common(a)
    a.set_defaults(fn=cmd_audit)
    _bench_parsers(sub, common)
    c = sub.add_parser("conformance", help="re-run every recorded GPU lesson on the simulator "
                       "and compare (exit 1 when a row fails)")
    c.add_argument("--data", default=None, metavar="DIR",
                   help="recorded GPU files (default: data/gpu)")
    c.add_argument("--weights", default=None, help="weights .npz (default: data/tiny_model.npz)")
    c.add_argument("--only", default=None, metavar="LESSONS",
                   help="comma-separated lessons to re-run (default: all): ladder, megakernel, "
                        "overlap, fission, device loop, context, pdl context, nodes, spec")
    c.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bars (default: on a terminal only)")
    c.set_defaults(fn=cmd_conformance)
    sp = sub.add_parser("spec", help="speculative decoding (LAB_DRAFT): the same greedy tokens "
                        "as one token per step on several prompts (exit 1 when not, beyond "
                        "near-ties), or --curve: ms per generated token against context")
    sp.add_argument("--draft", type=int, choices=(2, 4, 8), default=4,
                    help="tokens drafted per step (the curve: its bug arm's)")
    sp.add_argument("--tokens", type=int, default=None, help="generated tokens per prompt "
                    f"(default {SPEC_TOKENS}; the curve: per rep, default {SPEC_CURVE_TOKENS})")
    sp.add_argument("--prompts", default=None,
                    help="'standard' (five prompts, the default) or prompts separated by ';' "
                    "(not with --curve, which decodes the corpus text)")
    sp.add_argument("--curve", action="store_true", help="time k = 0, 2, 4, 8 (and the "
                    "LAB_BUG_SPEC_KEY arm) at each of --contexts, interleaved")
    sp.add_argument("--contexts", default=None, help="the curve's contexts (corpus text; "
                    f"default {SPEC_CURVE_CONTEXTS})")
    sp.add_argument("--reps", type=int, default=None, help="the curve's interleaved reps (at "
                    f"least 2: its error bars; default {SPEC_CURVE_REPS})")
    sp.add_argument("--json", metavar="PATH", help="also write the result as JSON")
    common(sp)
    sp.set_defaults(fn=cmd_spec)
    from lab.measure.compare import add_parser as compare_parser
    compare_parser(sub, common).set_defaults(fn=cmd_compare)
    exits = ("exit 0 when all fifteen pass, 1 when any does not; with neither file it prints "
             "the questions and exits 0")
    r = sub.add_parser("record", help="run registered experiments (priority order) into a "
                       "folder, each file stamped with commit, host probe, date, versions")
    r.add_argument("names", nargs="*", metavar="NAME", help="experiments to run")
    r.add_argument("--all", action="store_true", help="every experiment, in priority order")
    r.add_argument("--backend", choices=("cuda", "sim"), required=True)
    r.add_argument("--out", required=True, help="output folder: written in a temporary folder "
                   "beside it and renamed to OUT when the run ends (an existing non-empty OUT is "
                   "refused unless --replace or --resume)")
    r.add_argument("--archive", default=None, help="pack the folder into this FILE.tar.gz")
    r.add_argument("--quick", action="store_true", help="fewer reps and tokens (a dry run)")
    r.add_argument("--resume", action="store_true",
                   help="keep what an earlier run into --out finished for this commit (clean "
                        "tree), backend and settings; run the rest (writes into --out as it "
                        "goes)")
    r.add_argument("--replace", action="store_true",
                   help="replace an existing --out whole when the run ends")
    r.add_argument("--weights", default=None, help="weights .npz (default: data/tiny_model.npz)")
    r.set_defaults(fn=cmd_record)

    s = sub.add_parser("selfcheck", help="check the lecture's ten questions (--answers JSON) "
                       f"and the five exercises (--solutions .py): {exits}",
                       description="Check the lecture's ten questions and the five exercises; "
                       f"{exits}. Each answer is a recorded attempt of yours; an answer and why "
                       "are shown only for a question you attempted. A self-assessment: the "
                       "record is yours, and a second name that attempts a question sees its "
                       "answer.")
    s.add_argument("--answers", metavar="PATH", help='JSON object {"q1": answer, ...}, in the '
                   "letters of your order of the options (printed with no arguments)")
    s.add_argument("--solutions", metavar="PATH", help="Python file defining the exercises' "
                   "functions (merge_partials, ..., replays_needed)")
    s.add_argument("--explain", action="store_true",
                   help="after each question answered in --answers, print its answer and why")
    s.add_argument("--student", metavar="NAME", help="your name or id: it seeds the order of "
                   "the options and keeps your attempts apart; given once (or asked on a "
                   "terminal) and remembered in ~/.decode-lab/student")
    s.add_argument("--attempts", metavar="PATH", help="the file that keeps your attempts "
                   "(default: ~/.decode-lab/selfcheck.json)")
    s.add_argument("--timeout", type=float, default=None, metavar="S",
                   help="each exercise's time limit in seconds, as `exercise check` (default: "
                   "the exercise's)")
    s.set_defaults(fn=cmd_selfcheck)
    x = sub.add_parser("exercise", help="hands-on exercises, one or more per checklist step: "
                       "list them, show one (spec + stub), check your solution (exit 1 when it "
                       "does not pass)")
    x.add_argument("action", choices=("list", "show", "check"))
    x.add_argument("name", nargs="?", help="the exercise (see `exercise list`)")
    x.add_argument("--solution", metavar="FILE", help="your solution: the stub, filled in")
    x.add_argument("--stub", action="store_true",
                   help="show: print the stub alone (redirect it into your solution file)")
    x.add_argument("--backend", choices=("auto", "cuda", "sim"), default=None,
                   help="where the check runs (default: the GPU when there is one)")
    x.add_argument("--timeout", type=float, default=None, metavar="S",
                   help="the check's time limit in seconds (default: the exercise's)")
    x.set_defaults(fn=cmd_exercise)
    return p


def _warning_line(message, category, filename, lineno, file=None, line=None) -> None:
    """A warning (LAB_LOOP=device refused, say: the lab falls back on purpose) as one line."""
    print(f"decode-lab: warning: {message}", file=sys.stderr)


def main(argv=None) -> int:
    """Parse `argv`, run the command; every way it can end is an exit code of lab/exits.py."""
    def command() -> int:
        args = build_parser().parse_args(argv)
        with warnings.catch_warnings():
            warnings.simplefilter("default")
            warnings.showwarning = _warning_line
            return args.fn(args)
    return exits.run(command, argv)


if __name__ == "__main__":
    sys.exit(main())
