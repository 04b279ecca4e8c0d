"""peer.json: the lab's graph arms against a PyTorch peer of the same model from the same weight
file (notebook 10). Needs PyTorch (the `peer` extra); without it, one line.

  lab arms     lab graph, graph+pdl, graph+pdl+fusion, graph+pdl+fusion+split and lab
               persistent (only where persistent.json's bit check in the same output held),
               on one engine where the toggles allow, in this process
  torch arms   eager, torch.cuda.CUDAGraph per attention-length bucket, torch.compile
               (reduce-overhead), in a worker process (lab/measure/peer_worker.py): once torch
               has run kernels in a process, every later CUDA graph node in it replays slower
Context c: the prompt is c + 1 characters of data/corpus.txt fed one position per step
(untimed), then `tokens` timed steps; reps interleave the two sides (the lab first on even
reps), each side's arm order rotated per rep. Every arm's ids are checked against the first lab
arm's and the float64 oracle's. On the simulator: a dry run against eager torch on the CPU.
"""
from __future__ import annotations

import dataclasses
import gc
import importlib.util
import sys
import time
from pathlib import Path

import numpy as np

from lab.errors import LabError
from lab.measure.experiments.persistent import held
from lab.measure.experiment import experiment
from lab.model import DATA_DIR

INSTALL_HINT = 'pip install -e ".[peer]"'
CORPUS = DATA_DIR / "corpus.txt"
LAB_ARMS = ("graph", "graph+pdl", "graph+pdl+fusion", "graph+pdl+fusion+split", "persistent")


@dataclasses.dataclass(frozen=True)
class Settings:
    """What one peer recording runs (peer_result.record writes these into peer.json)."""
    weights: str
    reps: int = 5
    tokens: int = 64
    contexts: tuple = (64, 900)
    torch_arms: tuple = ("eager", "graph", "compile")
    torch_device: str = "cuda"
    buckets: str = "pow2"
    prompt_offset: int = 0
    persistent: bool = True
    torch_python: str = sys.executable
    worker_timeout: float = 900.0


def settings_for(ctx) -> Settings:
    """The recording's settings: on the simulator a dry run against eager torch on the CPU; the
    persistent arm only where the output folder's persistent.json says its checks held."""
    quick = dict(reps=2, tokens=5, contexts=(8, 30)) if ctx.quick else {}
    dry = dict(torch_device="cpu", torch_arms=("eager",)) if ctx.backend == "sim" else {}
    return Settings(weights=str(ctx.weights), persistent=held(ctx.out), **quick, **dry)


def corpus_prompt(model, offset: int, context: int) -> tuple[str, np.ndarray]:
    """The prompt of context `context`: context + 1 characters of the corpus from `offset`."""
    text = CORPUS.read_text()[offset:offset + context + 1]
    if len(text) != context + 1:
        raise LabError(f"data/corpus.txt has no {context + 1} characters from offset {offset}")
    return text, model.tokenizer.encode(text)


def lab_configs(backend: str, persistent: bool = True) -> dict:
    """The lab arms: compare's arms of these names (compare_arms.ARMS), each `lab NAME`."""
    from lab.config import LabConfig
    from lab.measure.compare import parse_spec
    from lab.measure.experiments.compare_arms import ARMS
    base = LabConfig(backend=backend)
    names = LAB_ARMS if persistent else LAB_ARMS[:-1]
    return {f"lab {n}": parse_spec(ARMS[n], base).cfg for n in names}


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


def lab_arms(model, backend: str, contexts, prompts, tokens: int, persistent: bool,
             say) -> dict:
    """{(arm name, context): bench.Arm}, on ONE engine where the toggles allow, each warmed up
    once at each context."""
    from lab.measure import bench
    cfgs = lab_configs(backend, persistent)
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
    for c in contexts:
        _, ids = prompts[c]
        for name in cfgs:
            t0 = time.perf_counter()
            lab_run(ids, tokens)(arms[(name, c)].use())
            say(f"{name} warmed up at context {c} in {time.perf_counter() - t0:.1f} s")
    return arms


def interleave(s: Settings, arms, contexts, prompts, worker, torch_live, failed, say,
               run=lab_run):
    """The reps: rep i runs the lab arms here and the torch arms in the worker, the lab first on
    even reps; each side rotates its arm order per rep. A worker that fails stops its arms (they
    go to `failed`); the lab's reps go on. Returns (data, run order)."""
    from lab.measure.peer_worker import WorkerError
    from lab.measure.stats import rotated
    lab_names = list(dict.fromkeys(name for name, _ in arms))
    torch_live = [n for n in torch_live if n not in failed]
    data: dict = {n: {str(c): {"ms": [], "tokens": []} for c in contexts}
                  for n in lab_names + torch_live}
    run_order = []
    for rep in range(s.reps):
        lab_order = rotated(lab_names, rep)
        done = []
        for side in (("lab", "torch") if rep % 2 == 0 else ("torch", "lab")):
            if side == "lab":
                for c in contexts:
                    _, ids = prompts[c]
                    for name in lab_order:
                        arm = arms[(name, c)]
                        arm.timed(run(ids, s.tokens))
                        data[name][str(c)]["ms"].append(arm.ms[-1])
                        data[name][str(c)]["tokens"].append(arm.runs[-1])
                done.append("lab: " + ", ".join(lab_order))
                continue
            if not torch_live:
                continue
            try:
                worker.send({"cmd": "rep", "rep": rep})
                msg = worker.recv(s.worker_timeout, f"rep {rep}")
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
        say(f"rep {rep + 1}/{s.reps} done ({'; '.join(done)}); running mean ms/token at "
            f"context {contexts[0]}: {', '.join(cells)}")
    return data, run_order


def measure(ctx, s: Settings, run=lab_run, name: str = "peer.json") -> dict:
    """peer.json's content (written), from settings `s`; LabError when torch is missing or the
    worker cannot start; `run` makes the lab arms' timed run (a test perturbs it)."""
    from lab.measure import report
    from lab.measure.peer_result import record
    from lab.measure.peer_torch import TORCH_ARMS
    from lab.measure.peer_worker import Worker, WorkerError
    say = ctx.progress
    if s.torch_python == sys.executable and importlib.util.find_spec("torch") is None:
        raise LabError(f"PyTorch is not installed; install the peer extra: {INSTALL_HINT}")
    t_start = time.perf_counter()
    model = ctx.model
    contexts = sorted(s.contexts)
    for c in contexts:
        if c < 0 or c + 1 + s.tokens > model.cfg.max_seq:
            raise LabError(f"context {c} + {s.tokens} tokens needs {c + 1 + s.tokens} "
                           f"positions; max_seq is {model.cfg.max_seq}")
    prompts = {c: corpus_prompt(model, s.prompt_offset, c) for c in contexts}
    # the torch worker first: its import says at once whether torch is there, and its compiles
    # then overlap the lab's set-up
    worker = Worker(s.torch_python)
    try:
        try:
            hello = worker.recv(120.0, "imported")
        except WorkerError as exc:
            if exc.kind == "import":
                why = " ".join(str(exc).split())
                raise LabError(f"PyTorch is not importable ({why}); install the peer extra: "
                               f"{INSTALL_HINT}") from None
            raise LabError(f"the torch worker did not start: {exc}") from None
        say(f"torch worker started (torch {hello['torch']}); it builds its arms while the lab "
            f"sets up")
        worker.send({"cmd": "setup", "weights": str(Path(s.weights).resolve()),
                     "device": s.torch_device, "arms": list(s.torch_arms), "buckets": s.buckets,
                     "tokens": s.tokens, "contexts": contexts,
                     "prompts": {str(c): [int(i) for i in ids] for c, (_, ids) in prompts.items()}})
        arms = lab_arms(model, ctx.backend, contexts, prompts, s.tokens, s.persistent, say)
        from lab.reference import generate as oracle_generate
        oracle = {str(c): [int(t) for t in oracle_generate(model, ids, s.tokens)[ids.size:]]
                  for c, (_, ids) in prompts.items()}
        say("float64 oracle tokens computed")
        torch_names = [TORCH_ARMS[k] for k in s.torch_arms]
        failed: dict[str, str] = {}
        torch_info: dict = {"torch": hello["torch"]}
        try:
            say(f"waiting for the torch worker's warm-up (up to {s.worker_timeout:.0f} s)")
            torch_info.update(worker.recv(s.worker_timeout, "ready"))
            failed.update(torch_info["failed"])
        except WorkerError as exc:
            failed.update({n: f"torch worker: {exc}" for n in torch_names})
            torch_info["arms"] = []
            say(f"TORCH WORKER FAILED: {exc}")
        data, run_order = interleave(s, arms, contexts, prompts, worker, torch_info["arms"],
                                     failed, say, run)
        if [n for n in torch_info["arms"] if n not in failed]:
            try:
                worker.send({"cmd": "quit"})
                torch_info["compile_counters"] = worker.recv(60.0, "bye")["compile_counters"]
            except (WorkerError, OSError):
                pass
    finally:
        worker.stop()
    res = record(s, model, contexts, prompts, arms, data, oracle, failed, torch_names,
                 torch_info, run_order, t_start)
    ctx.write_json(name, res)
    say(f"== peer ==\n{report.format_peer(res)}")
    for p in res["problems"]:
        say(f"PROBLEM: {p}")
    if not res["tokens_check"]["ok"]:
        raise LabError("TOKENS MISMATCH: the arms did not all generate the same ids "
                       "(tokens_check in {name})")
    if not res["ok"]:
        raise LabError(f"FAIL: {'; '.join(res['problems']) or 'an arm failed'} ({name})")
    return res


@experiment("peer", files=("peer.json",), priority=200, isolated=True,
            doc="the lab's graph arms against a PyTorch peer of the same model (notebook 10)")
def record_peer(ctx) -> None:
    measure(ctx, settings_for(ctx))


@experiment("peer_reps", files=("peer_reps.json",), priority=250, isolated=True,
            doc="torch.compile alone over 15 reps against the lab's arms: its spread (notebook 10)")
def record_peer_reps(ctx) -> None:
    s = settings_for(ctx)
    if ctx.backend != "sim":
        s = dataclasses.replace(s, torch_arms=("compile",), reps=s.reps if ctx.quick else 15)
    measure(ctx, s, name="peer_reps.json")
