"""Record decode-lab's graph arms against a PyTorch peer of the SAME model from the SAME weight
file, as JSON with source and date.

  python scripts/record_gpu_peer.py --out DIR [--reps 7] [--tokens 64] [--contexts 64,900]

Needs PyTorch (the optional extra: pip install -e ".[peer]"); without it the script says so in
one line and exits 2. Writes DIR/peer.json and prints a table.

Arms (float32 everywhere, greedy argmax on the device inside the step):
  decode-lab (this process)   lab graph (LAB_GRAPH=1), lab graph+pdl (LAB_PDL=1) and, when
                              lab/config.py has a `fusion` toggle, lab graph+pdl+fusion, and
                              lab persistent (LAB_PERSISTENT=1, left out where refused); the
                              arms share ONE engine, switched per run (as lab/measure/bench.py does)
  PyTorch (a worker process)  torch eager: the step as eager torch ops on a static,
                              preallocated KV cache (index_copy_, no torch.cat);
                              torch cudagraph: that step captured with torch.cuda.CUDAGraph,
                              one graph per attention-length bucket;
                              torch.compile: torch.compile(step, mode="reduce-overhead"),
                              one specialisation per bucket (dynamic=False)
The torch step keeps its state on the device as the lab's does: token ids [max_seq], the
position [1] (advanced inside the step) and the prompt length [1]; so one graph replays every
step of a request, prompt and generation alike. Its attention reads the first L cache rows and
masks those past the position; L is the bucket: max(128, the next power of two >= position + 1)
(`--buckets pow2`, the default), or max_seq for every position (`--buckets full`: one graph).
TF32 is OFF for matmuls (torch.backends.cuda.matmul.allow_tf32 = False, float32 matmul
precision "highest"), so the torch arms' tokens stay comparable with the lab's.

Context c: the prompt is c + 1 characters of data/corpus.txt; every arm feeds it one position
per step through a decode step (untimed: the lab arms each through their own; the torch arms
share one such prefill per context per rep, run by the cudagraph arm's graphs on a GPU), then
times `--tokens` steps at positions c .. c + tokens - 1 (ms/token over the window, synchronised
at its two ends only, garbage collector off). Every arm runs one untimed warm-up per context
first (captures, compiles). Reps are interleaved: rep i runs the lab arms here and the torch arms
in the worker, the lab first on even reps and the worker first on odd ones, each side's arm
order rotated per rep.

The torch arms run in their OWN process (this script re-invoked with --torch-worker, JSON lines
over a pipe): once torch has run kernels in a process, every later CUDA graph node in it
(numba's too) replays about 0.18 us slower, so torch never runs in the lab's process.

Every arm's generated ids are checked against the first lab arm's, at every context and rep,
and against the float64 oracle's (lab/reference.py, for information). A mismatch is printed
loudly and recorded; the file is still written and the exit status is 1. A torch arm that could
not be built (a failed capture or compile) is recorded with its error, likewise exit 1.

Most of the wall time is torch.compile's compiles (one per bucket the windows meet: two with
the defaults), which overlap the lab's set-up; the reps themselves take seconds.

A dry run without a GPU: --backend sim --torch-device cpu --torch-arms eager (the simulator's
lab arms against eager torch on the CPU; --torch-python PYTHON runs the worker in another
interpreter, e.g. one with torch when this one has none).
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import importlib.util
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# numpy only: the worker imports no numba or CuPy
from lab.errors import LabError  # noqa: E402
from lab.measure import report  # noqa: E402
from lab.model import load_model  # noqa: E402
from scripts import recorder  # noqa: E402
from scripts.peer_result import record  # noqa: E402
from scripts.peer_torch import TORCH_ARMS  # noqa: E402
from scripts.peer_worker import Worker, WorkerError, worker_main  # noqa: E402

PROG = "record_gpu_peer"
INSTALL_HINT = 'pip install -e ".[peer]"'
CORPUS = recorder.REPO / "data" / "corpus.txt"


def corpus_prompt(model, offset: int, context: int) -> tuple[str, np.ndarray]:
    """The prompt of context `context`: context + 1 characters of the corpus from `offset`."""
    text = CORPUS.read_text()[offset:offset + context + 1]
    if len(text) != context + 1:
        raise LabError(f"data/corpus.txt has no {context + 1} characters from offset {offset}")
    return text, model.tokenizer.encode(text)


def lab_fusion_config(cfg):
    """cfg + LAB_FUSION=1 when lab/config.py has a `fusion` toggle, else None."""
    from lab.config import TOGGLES, LabConfig
    if "fusion" not in {f.name for f in dataclasses.fields(LabConfig)}:
        return None
    if any(row[0] == "LAB_FUSION" for row in TOGGLES):
        return cfg.with_toggles({"LAB_FUSION": "1"})
    return cfg.replace(fusion=True)


def lab_configs(backend: str) -> dict:
    from lab.config import LabConfig
    base = LabConfig(backend=backend, graph=True)
    cfgs = {"lab graph": base, "lab graph+pdl": base.replace(pdl=True)}
    fused = lab_fusion_config(base.replace(pdl=True))
    if fused is not None:
        cfgs["lab graph+pdl+fusion"] = fused
        cfgs["lab graph+pdl+fusion+split"] = fused.replace(split_combine=True)
    if "persistent" in {f.name for f in dataclasses.fields(LabConfig)}:
        cfgs["lab persistent"] = base.replace(persistent=True)
    return cfgs


def lab_run(ids: np.ndarray, tokens: int):
    """A run for bench.Arm.timed: reset, the prompt one position per step (untimed), then the
    timed window; (ms/token, generated ids)."""
    def run(engine):
        engine.reset(ids, tokens)
        engine.decode(ids.size - 1)
        gc.collect()
        gc.disable()
        try:
            seconds = engine.decode(tokens)
        finally:
            gc.enable()
        generated = engine.tokens(ids.size + tokens)[ids.size:]
        return 1000.0 * seconds / tokens, [int(t) for t in generated]
    return run



def say(msg: str) -> None:
    print(f"[peer] {msg}", flush=True)



def fail_line(msg: str, code: int = 2) -> int:
    return recorder.refuse(PROG, msg, code)


def parse_args(argv=None):
    ap = recorder.arguments(__doc__, backends=recorder.BACKENDS, weights=True, reps=7, tokens=64,
                            out_required=False, out_help="folder for peer.json (created)",
                            helps={"--backend": "the lab arms' backend (sim: a dry run on the "
                                                "simulator)",
                                   "--reps": "interleaved reps (>= 2; record with >= 5)",
                                   "--tokens": "timed tokens per arm, context and rep"})
    ap.description += f" Needs the peer extra: {INSTALL_HINT}"
    ap.add_argument("--contexts", default="64,900",
                    help="context lengths: the timed window starts at this position")
    ap.add_argument("--prompt-offset", type=int, default=0,
                    help="where in data/corpus.txt the prompts start")
    ap.add_argument("--torch-arms", default="eager,graph,compile",
                    help=f"comma-separated subset of {','.join(TORCH_ARMS)}")
    ap.add_argument("--torch-device", default="cuda", help="cuda, or cpu for a dry run")
    ap.add_argument("--no-persistent", action="store_true",
                    help="leave the lab persistent arm out (gpu_run.sh: when its check failed)")
    ap.add_argument("--buckets", default="pow2", choices=("pow2", "full"),
                    help="torch attention length: pow2 = max(128, next power of two >= "
                         "position + 1), one graph per bucket; full = max_seq, one graph")
    ap.add_argument("--torch-python", default=sys.executable,
                    help="the interpreter that runs the torch worker (default: this one)")
    ap.add_argument("--worker-timeout", type=float, default=900.0,
                    help="seconds to wait for the worker's setup (compiles) and for each rep")
    ap.add_argument("--torch-worker", action="store_true", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.torch_worker:
        return worker_main()
    if not args.out:
        return fail_line("--out DIR is required")
    try:
        contexts = sorted({int(x) for x in args.contexts.split(",") if x.strip()})
    except ValueError:
        return fail_line(f"--contexts must be comma-separated integers, got {args.contexts!r}")
    arm_keys = [k.strip() for k in args.torch_arms.split(",") if k.strip()]
    if not arm_keys or len(set(arm_keys)) < len(arm_keys) or set(arm_keys) - set(TORCH_ARMS):
        return fail_line(f"--torch-arms: give distinct names from {', '.join(TORCH_ARMS)}")
    if args.reps < 2 or args.tokens < 1 or not contexts:
        return fail_line("need --reps >= 2, --tokens >= 1 and at least one context")
    if args.torch_python == sys.executable and importlib.util.find_spec("torch") is None:
        return fail_line(f"PyTorch is not installed; install the peer extra: {INSTALL_HINT}")
    t_start = time.perf_counter()
    try:
        model = load_model(args.weights)
        max_seq = model.cfg.max_seq
        for c in contexts:
            if c < 0 or c + 1 + args.tokens > max_seq:
                raise LabError(f"context {c} + {args.tokens} tokens needs {c + 1 + args.tokens} "
                               f"positions; max_seq is {max_seq}")
        prompts = {c: corpus_prompt(model, args.prompt_offset, c) for c in contexts}
        out_dir = recorder.out_dir(args.out)
    except LabError as exc:
        return fail_line(str(exc))

    # the torch worker first: its import says at once whether torch is there, and its
    # compiles then overlap the lab's set-up
    worker = Worker(args.torch_python, Path(__file__).resolve())
    try:
        return _run(args, model, contexts, prompts, arm_keys, worker, out_dir, t_start)
    finally:
        worker.stop()


def _run(args, model, contexts, prompts, arm_keys, worker, out_dir, t_start) -> int:
    try:
        hello = worker.recv(120.0, "imported")
    except WorkerError as exc:
        if exc.kind == "import":
            return fail_line(f"PyTorch is not importable ({exc}); install the peer extra: "
                             f"{INSTALL_HINT}")
        return fail_line(f"the torch worker did not start: {exc}")
    say(f"torch worker started (torch {hello['torch']}); it builds its arms while the lab "
        f"sets up")
    worker.send({"cmd": "setup", "weights": str(Path(args.weights).resolve()),
                 "device": args.torch_device, "arms": arm_keys, "buckets": args.buckets,
                 "tokens": args.tokens, "contexts": contexts,
                 "prompts": {str(c): [int(i) for i in ids] for c, (_, ids) in prompts.items()}})
    try:
        arms = lab_arms(model, args.backend, contexts, prompts, args.tokens,
                        persistent=not args.no_persistent)
    except LabError as exc:
        return fail_line(f"the lab arms could not be built: {exc}")
    from lab.reference import generate as oracle_generate
    oracle = {str(c): [int(t) for t in oracle_generate(model, ids, args.tokens)[ids.size:]]
              for c, (_, ids) in prompts.items()}
    say("float64 oracle tokens computed")

    torch_names = [TORCH_ARMS[k] for k in arm_keys]
    failed: dict[str, str] = {}
    torch_info: dict = {"torch": hello["torch"]}
    try:
        say(f"waiting for the torch worker's warm-up (compiles; up to {args.worker_timeout:.0f} s)")
        torch_info.update(worker.recv(args.worker_timeout, "ready"))
        failed.update(torch_info["failed"])
    except WorkerError as exc:
        failed.update({n: f"torch worker: {exc}" for n in torch_names})
        torch_info["arms"] = []
        say(f"TORCH WORKER FAILED: {exc}")
    data, run_order = interleave(args, arms, contexts, prompts, worker, torch_info["arms"],
                                 failed)
    if [n for n in torch_info["arms"] if n not in failed]:
        try:
            worker.send({"cmd": "quit"})
            torch_info["compile_counters"] = worker.recv(60.0, "bye")["compile_counters"]
        except (WorkerError, OSError):
            pass
    res = record(args, model, contexts, prompts, arms, data, oracle, failed, torch_names,
                 torch_info, run_order, t_start)
    path = recorder.write_json(out_dir / "peer.json", res)
    print(f"\n== peer ==\n{report.format_peer(res)}", flush=True)
    if not res["tokens_check"]["ok"]:
        print("TOKENS MISMATCH: the arms did not all generate the same ids (see above and "
              "tokens_check in peer.json)", flush=True)
    for p in res["problems"]:
        print(f"PROBLEM: {p}", flush=True)
    print(f"wrote {path} in {res['wall_s']:.0f} s", flush=True)
    return 0 if res["ok"] else 1


def lab_arms(model, backend: str, contexts, prompts, tokens: int, persistent: bool = True) -> dict:
    """{(arm name, context): bench.Arm}, all on ONE engine where the toggles allow (as
    lab/measure/bench.py's arms share one), each warmed up once at each context."""
    from lab.measure import bench
    cfgs = lab_configs(backend)
    if not persistent:
        cfgs.pop("lab persistent", None)
    pool: dict = {}
    arms = {}
    for i, (name, cfg) in enumerate(list(cfgs.items())):
        try:
            for c in contexts:
                arm = bench.make_arm(model, name, cfg, i, pool=pool)
                try:
                    arm.use()
                except LabError:           # a toggle that changes allocation: its own engine
                    arm = bench.make_arm(model, name, cfg, i)
                arms[(name, c)] = arm
        except LabError as exc:
            if name != "lab persistent":
                raise
            # the device refuses the cooperative kernel: the peer goes on without that arm
            say(f"lab persistent left out: {exc}")
            del cfgs[name]
            for c in contexts:
                arms.pop((name, c), None)
    say(f"lab arms: {', '.join(cfgs)} on {next(iter(arms.values())).engine.backend.describe()}")
    if "lab graph+pdl+fusion" not in cfgs:
        say("lab/config.py has no fusion toggle: no graph+pdl+fusion arm")
    for c in contexts:
        _, ids = prompts[c]
        for name in cfgs:
            t0 = time.perf_counter()
            lab_run(ids, tokens)(arms[(name, c)].use())
            say(f"{name} warmed up at context {c} in {time.perf_counter() - t0:.1f} s")
    return arms


def interleave(args, arms, contexts, prompts, worker, torch_live, failed):
    """The reps: rep i runs the lab arms here and the torch arms in the worker, the lab first on
    even reps; each side rotates its arm order per rep. A worker that fails stops its arms (they
    go to `failed`); the lab's reps go on. Returns (data, run order)."""
    lab_names = list(dict.fromkeys(name for name, _ in arms))
    torch_live = [n for n in torch_live if n not in failed]
    data: dict = {n: {str(c): {"ms": [], "tokens": []} for c in contexts}
                  for n in lab_names + torch_live}
    run_order = []
    for rep in range(args.reps):
        lab_order = recorder.rotated(lab_names, rep)
        done = []
        for side in (("lab", "torch") if rep % 2 == 0 else ("torch", "lab")):
            if side == "lab":
                for c in contexts:
                    _, ids = prompts[c]
                    for name in lab_order:
                        arm = arms[(name, c)]
                        arm.timed(lab_run(ids, args.tokens))
                        data[name][str(c)]["ms"].append(arm.ms[-1])
                        data[name][str(c)]["tokens"].append(arm.runs[-1])
                done.append("lab: " + ", ".join(lab_order))
                continue
            if not torch_live:
                continue
            try:
                worker.send({"cmd": "rep", "rep": rep})
                msg = worker.recv(args.worker_timeout, f"rep {rep}")
            except (WorkerError, OSError) as exc:
                for n in torch_live:
                    failed[n] = f"torch worker at rep {rep}: {exc}"
                    data.pop(n, None)
                torch_live = []
                say(f"TORCH WORKER FAILED: {exc}")
                continue
            for n, per_ctx in msg["data"].items():
                for c, d in per_ctx.items():
                    data[n][c]["ms"].append(d["ms"])
                    data[n][c]["tokens"].append(d["tokens"])
            done.append("torch: " + ", ".join(msg["order"]))
        run_order.append(done)
        first = str(contexts[0])
        cells = [f"{n} {np.mean(d[first]['ms']):.4f}" for n, d in data.items() if d[first]["ms"]]
        say(f"rep {rep + 1}/{args.reps} done ({'; '.join(done)}); running mean ms/token at "
            f"context {contexts[0]}: {', '.join(cells)}")
    return data, run_order


if __name__ == "__main__":
    sys.exit(recorder.run(main))
