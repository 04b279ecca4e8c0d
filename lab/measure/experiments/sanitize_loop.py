"""sanitize_loop.txt: the device loop (LAB_LOOP=device) under compute-sanitizer racecheck, piece
by piece, every piece a process of its own, all at once (notebook 11). Each piece is this
module's `main(["--mode", MODE, ...])` in a process under racecheck (PIECE), in one of these modes:

  minimal  a WHILE node over a SWITCH node with ONE body, the `advance` kernel, built by the
           backend's build_loop: the conditional-node machinery with nothing of the model in it
  shared   the same with a kernel that uses shared memory in the body too (rmsnorm: a block
           reduction through shared memory, what racecheck instruments)
  one-body the engine's clean step for the first plan as the loop's ONLY body (positions in
           that plan only)
  kernel   `--kernel NAME`: the loop's one body is the step's first launch of NAME (the first
           plan's) and `advance`: which of the step's kernels, alone in a conditional body, the
           sanitizer cannot run
  kernels  `--kernels A,B,...`: the loop's one body is the step's first launch of each named
           kernel, in the order given, then `advance`: which combinations of kernels crash it
  prefix   `--count N`: the step's first N launches, then `advance` (a bisection by node count)
  loop     the engine's device loop: `--tokens` steps of the clean step in one graph launch
  body     the loop's bodies without the loop: the same step, captured into an ordinary graph
           per plan (LAB_LOOP=host) and replayed, at a position in every plan of the loop
           (plan_boundaries), 2 steps at each

`--warm` (modes one-body, kernel, kernels, prefix) launches the body's kernels once eagerly, and
puts the position back, before the loop is built: whether the crash needs a kernel's first run
to be inside a conditional body. Each piece prints one line `sanitize_loop <mode>: ok ...` when
its run completes and its results check out (exit 0), or says what failed (exit 1). The
experiment writes OUT/sanitize/<piece>.log and OUT/sanitize_loop.txt: per piece the exit status
(139 or 11: killed by a segmentation fault), the ok line's count and racecheck's summary line.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from lab.config import LabConfig
from lab.measure.experiment import experiment, run_child
from lab.model import load_model

PROMPT = "ROMEO.\n"
BACKEND = "cuda"      # --backend sim: a dry run of the script's logic on the simulator


def one_body_loop(be, issue, pos, plan_of, limit, start: int, steps: int, what: str) -> int:
    """Build a WHILE + SWITCH loop with ONE body (`issue(0)` captured into it), plan_of all 0,
    from position `start` for `steps` iterations; launch it once, wait, and check that the body
    advanced pos `steps` times (SystemExit naming `what` if not). Returns the final pos."""
    be.upload(plan_of, np.zeros(plan_of.shape[0], np.int32))
    be.upload(limit, np.array([start + steps], np.int32))
    loop = be.build_loop(1, issue, pos, plan_of, limit)
    loop.launch()
    be.synchronize()
    got = int(be.download(pos)[0])
    if got != start + steps:
        raise SystemExit(f"sanitize_loop {what}: pos {got} after the loop, expected "
                         f"{start + steps}")
    return got


def _engine():
    from lab.engine.runner import DecodeEngine
    return DecodeEngine(load_model(), LabConfig(backend=BACKEND, graph=True))


def _advance(pos):
    from kernels import position
    from lab.backend import Launch
    return Launch(position.advance, (1,), (1,), (pos,))


def minimal(steps: int, shared: bool = False) -> str:
    """The loop's body: advance on buffers of its own (and, `shared`, an rmsnorm before it)."""
    from kernels import position, rmsnorm
    from lab.backend import Launch
    eng = _engine()
    be = eng.backend
    pos = be.alloc("loop_pos", (1,), np.int32)
    plan_of = be.alloc("loop_plan_of", (eng.model.cfg.max_seq,), np.int32)
    limit = be.alloc("loop_limit", (1,), np.int32)
    be.upload(pos, np.zeros(1, np.int32))
    be.warm_up([position.advance, rmsnorm.rmsnorm])
    D = eng.model.cfg.d_model
    x, w, h = (be.alloc(f"loop_{n}", (D,), np.float32) for n in "xwh")
    be.upload(x, np.ones(D, np.float32))
    be.upload(w, np.ones(D, np.float32))

    def issue(k):
        if shared:
            be.launch(Launch(rmsnorm.rmsnorm, (1,), (256,), (x, w, h, np.float32(1e-5))))
        be.launch(_advance(pos))
    got = one_body_loop(be, issue, pos, plan_of, limit, 0, steps,
                        "shared" if shared else "minimal")
    return f"pos {got} after one launch of a {steps}-iteration loop"


def _warm(be, b, launches, start: int) -> None:
    """Launch `launches` once eagerly, wait, and put the position back at `start`."""
    for x in launches:
        be.launch(x)
    be.synchronize()
    be.upload(b.pos, np.array([start], np.int32))


def step_body(steps: int, kernel: str | None = None, prefix: int | None = None,
              repeat: int = 1, kernels: list[str] | None = None, warm: bool = False) -> str:
    """The loop's body: the engine's step for the first plan, as its own loop issues it; or,
    with `kernel`, the step's first launch of that kernel (`repeat` times), then advance; or,
    with `kernels`, the step's first launch of each named kernel in that order, then advance; or,
    with `prefix`, the step's first `prefix` launches in order, then advance (a bisection by
    node count)."""
    eng = _engine()
    be, b = eng.backend, eng.buf
    plan = eng.plan(0)
    eng.reset(eng.encode(PROMPT), 0)
    start = eng.position
    if kernel is None and prefix is None and kernels is None:
        def issue(k):
            for item in eng.issuer.items(plan):
                eng.issuer.issue(item)
        if warm:
            _warm(be, b, eng.step_launches(plan), start)
        got = one_body_loop(be, issue, b.pos, b.plan_of, b.limit, start, steps, "one-body")
        return f"pos {start} -> {got} in one launch of a loop whose one body is the step"
    if prefix is not None:
        launches = [x for x in eng.step_launches(plan) if x.name != "advance"][:prefix]
        what = f"the step's first {len(launches)} launches"
    else:   # --mode kernels, or --mode kernel: one kernel `repeat` times
        names = kernels if kernels is not None else [kernel] * repeat
        first = {}
        for x in eng.step_launches(plan):
            first.setdefault(x.name, x)
        missing = sorted({k for k in names if k not in first})
        if missing:
            mode = "kernels" if kernels is not None else "kernel"
            raise SystemExit(f"sanitize_loop {mode}: the step has no launch of {missing}")
        launches = [first[k] for k in names]
        what = (" + ".join(kernels) if kernels is not None
                else kernel if repeat == 1 else f"{kernel} x{repeat}")

    def issue_kernel(k):
        for x in launches:
            be.launch(x)
        be.launch(_advance(b.pos))
    if warm:
        _warm(be, b, launches + [_advance(b.pos)], start)
    got = one_body_loop(be, issue_kernel, b.pos, b.plan_of, b.limit, start, steps, what)
    return (f"{what} and advance as the loop's body{' (run once eagerly first)' if warm else ''}, "
            f"pos {start} -> {got}")


def tokens_of(loop: str, steps: int, positions=None) -> list[int]:
    from lab.engine.runner import DecodeEngine
    eng = DecodeEngine(load_model(), LabConfig(backend=BACKEND, graph=True, loop=loop))
    if positions is None:
        eng.reset(eng.encode(PROMPT), steps)
        eng.decode(steps)
        return [int(t) for t in eng.tokens()]
    out = []
    for p in positions:
        eng.reset(eng.encode(PROMPT), 0)
        eng.seek(p)
        eng.decode(2)
        out.append(int(eng.backend.download(eng.buf.pos)[0]))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="one piece of the device loop, for compute-sanitizer")
    ap.add_argument("--mode", required=True,
                    choices=("minimal", "shared", "one-body", "kernel", "kernels", "prefix", "loop",
                             "body"))
    ap.add_argument("--kernel", default=None, help="with --mode kernel: the step's kernel")
    ap.add_argument("--kernels", default=None,
                    help="with --mode kernels: the step's kernels, comma-separated, in body order")
    ap.add_argument("--count", type=int, default=None,
                    help="with --mode prefix: the step's first COUNT launches as the body; "
                         "with --mode kernel: the kernel COUNT times")
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--warm", action="store_true",
                    help="launch the body's kernels once eagerly before the loop is built")
    ap.add_argument("--backend", default="cuda", choices=("cuda", "sim"))
    args = ap.parse_args(argv)
    global BACKEND
    BACKEND = args.backend
    if args.tokens < 1:
        print("sanitize_loop: --tokens must be at least 1", file=sys.stderr)
        return 2
    if args.mode == "kernel" and not args.kernel:
        print("sanitize_loop: --mode kernel needs --kernel NAME", file=sys.stderr)
        return 2
    if args.mode == "kernels" and not args.kernels:
        print("sanitize_loop: --mode kernels needs --kernels A,B,...", file=sys.stderr)
        return 2
    if args.mode == "prefix" and args.count is None:
        print("sanitize_loop: --mode prefix needs --count N", file=sys.stderr)
        return 2
    if args.warm and args.mode not in ("one-body", "kernel", "kernels", "prefix"):
        print(f"sanitize_loop: --warm applies to the modes one-body, kernel, kernels and "
              f"prefix, not {args.mode}", file=sys.stderr)
        return 2
    if args.count is not None and args.count < 1:
        print("sanitize_loop: --count must be at least 1", file=sys.stderr)
        return 2
    if args.mode in ("minimal", "shared"):
        what = minimal(args.tokens, shared=args.mode == "shared")
    elif args.mode in ("one-body", "kernel"):
        what = step_body(args.tokens, args.kernel if args.mode == "kernel" else None,
                         repeat=args.count or 1, warm=args.warm)
    elif args.mode == "kernels":
        what = step_body(args.tokens, kernels=[k for k in args.kernels.split(",") if k],
                         warm=args.warm)
    elif args.mode == "prefix":
        what = step_body(args.tokens, prefix=args.count, warm=args.warm)
    elif args.mode == "loop":
        ids = tokens_of("device", args.tokens)
        what = f"{len(ids)} ids after a {args.tokens}-step device loop: {ids[-args.tokens:]}"
    else:
        from lab.plan import plan_boundaries
        starts = [1] + plan_boundaries(load_model().cfg.max_seq)
        ends = tokens_of("host", 2, starts)
        if ends != [s + 2 for s in starts]:
            print(f"sanitize_loop body: positions {ends} after 2 steps from {starts}")
            return 1
        what = f"2 graph steps from each of positions {starts}"
    print(f"sanitize_loop {args.mode}: ok, {what}", flush=True)
    return 0


KERNELS = ("embed", "rmsnorm", "matvec", "rope_kv_append", "attn_partial", "attn_combine",
           "swiglu_up", "matvec_residual", "argmax_next")
# 2, 3 and 4 different kernels (advance counted) in a body, in either order, one kernel thrice
KERNEL_SETS = ("embed,rmsnorm", "rmsnorm,embed", "rmsnorm,matvec", "matvec,rmsnorm",
               "matvec,matvec,matvec", "rmsnorm,matvec,swiglu_up")
PREFIXES = (2, 4, 8, 16, 36)
TOOL = ("compute-sanitizer", "--tool", "racecheck", "--report-api-errors", "no")
PIECE_LIMIT_S = 300
PIECE = ("import sys; from lab.measure.experiments.sanitize_loop import main; "
         "sys.exit(main(sys.argv[1:]))")


def pieces() -> dict[str, tuple[list[str], dict]]:
    """{piece: (this module's arguments, extra environment)}: every piece the experiment runs.
    Two try the smallest crashing body (the step's first two launches, then advance) with a
    workaround each: its kernels run once eagerly first, or every kernel loaded at module load."""
    out = {m: (["--mode", m], {}) for m in ("minimal", "shared", "one-body", "loop", "body")}
    out.update({f"kernel-{k}": (["--mode", "kernel", "--kernel", k], {}) for k in KERNELS})
    out.update({f"prefix-{n}": (["--mode", "prefix", "--count", str(n)], {}) for n in PREFIXES})
    out.update({f"kernels-{s.replace(',', '-')}": (["--mode", "kernels", "--kernels", s], {})
                for s in KERNEL_SETS})
    out["prefix-2-warm"] = (["--mode", "prefix", "--count", "2", "--warm"], {})
    out["prefix-2-eager"] = (["--mode", "prefix", "--count", "2"],
                             {"CUDA_MODULE_LOADING": "EAGER"})
    return out


def _piece(log: Path, argv: list[str], env: dict) -> int:
    """One piece under racecheck, its output to `log`: the exit status (124: past its limit)."""
    with open(log, "w") as f:
        return run_child([*TOOL, sys.executable, "-X", "faulthandler", "-c", PIECE, *argv],
                         PIECE_LIMIT_S, log=f, **env)


def _first_line(cmd: list[str], pattern: str) -> str:
    try:
        text = subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    m = re.search(pattern, text)
    return m.group(0) if m else text.strip().splitlines()[0] if text.strip() else "?"


@experiment("sanitize_loop", files=("sanitize_loop.txt",), priority=2, backends=("cuda",),
            check=True, doc="the device loop under compute-sanitizer racecheck, piece by piece "
                             "(notebook 11)")
def record(ctx) -> None:
    logs = ctx.out / "sanitize"
    logs.mkdir(exist_ok=True)
    todo = pieces()
    ctx.progress(f"{len(todo)} pieces under racecheck, all at once (each up to "
                 f"{PIECE_LIMIT_S} s)")
    with ThreadPoolExecutor(max_workers=len(todo)) as pool:
        codes = dict(zip(todo, pool.map(lambda kv: _piece(logs / f"{kv[0]}.log", *kv[1]),
                                        todo.items())))
    version = _first_line(["compute-sanitizer", "--version"], r"Version \S+")
    gpu = _first_line(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                      r".+")
    lines = [f"compute-sanitizer racecheck on the device loop, piece by piece ({version}; {gpu})",
             "piece exit ok-line / racecheck summary (exit 11 or 139: segmentation fault)"]
    for piece in sorted(codes):
        text = (logs / f"{piece}.log").read_text(errors="replace")
        ok = len(re.findall(r"^sanitize_loop .*: ok", text, re.M))
        summary = re.search(r"RACECHECK SUMMARY.*", text)
        lines.append(f"{piece} {codes[piece]} {ok} / "
                     f"{summary.group(0) if summary else 'no summary'}")
    ctx.write_text("sanitize_loop.txt", "\n".join(lines) + "\n")
    ctx.progress("\n".join(lines))

