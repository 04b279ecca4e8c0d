"""The device loop (LAB_LOOP=device) under compute-sanitizer, piece by piece: run this script
under `compute-sanitizer --tool racecheck` (or synccheck, memcheck) in one of three modes.

  python scripts/sanitize_loop.py --mode minimal|loop|body [--tokens N]

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
  loop     the engine's device loop: `--tokens` steps of the clean step in one graph launch
  body     the loop's bodies without the loop: the same step, captured into an ordinary graph
           per plan (LAB_LOOP=host) and replayed, at a position in every plan of the loop
           (plan_boundaries), 2 steps at each

`--warm` (modes one-body, kernel, kernels, prefix) launches the body's kernels once eagerly, and
puts the position back, before the loop is built: whether the crash needs a kernel's first run
to be inside a conditional body.

Each mode prints one line `sanitize_loop <mode>: ok ...` when the run completes and its
results check out (exit 0), or says what failed (exit 1). What the sanitizer reports, it
prints itself.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lab.config import LabConfig  # noqa: E402
from lab.model import load_model  # noqa: E402

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
            for item in eng._items(plan):
                eng._issue(item)
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
    ap = argparse.ArgumentParser(description="the device loop under compute-sanitizer, piece by piece")
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


if __name__ == "__main__":
    sys.exit(main())
