"""peer.json: the lab's graph arms against a PyTorch peer of the same model from the same weight
file (notebook 10). Needs PyTorch (the `peer` extra); without it, one line.

  lab arms     lab graph, graph+pdl, graph+pdl+fusion, graph+pdl+fusion+split and lab
               persistent (only where persistent.json's bit check in the same output held),
               on one engine where the toggles allow, in this process
  torch arms   eager, torch.cuda.CUDAGraph per attention-length bucket, torch.compile
               (reduce-overhead), and inductor's kernels captured in one torch.cuda.CUDAGraph
               per bucket (the strongest), each in a worker process of its own
               (lab/measure/peer_worker.py): once torch has run kernels in a process, every
               later CUDA graph node in it replays slower
Context c: the prompt is c + 1 characters of data/corpus.txt fed one position per step
(untimed), then `tokens` timed steps; reps interleave the two sides (the lab first on even
reps), each side's arm order rotated per rep. Every arm's ids are checked against the first lab
arm's and the float64 oracle's. On the simulator: a dry run against eager torch on the CPU.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import sys
import time
from pathlib import Path

import numpy as np

from lab.errors import LabError
from lab.measure.experiments.persistent import held
from lab.measure.experiment import experiment
from lab.measure.stats import collector_off
from lab.model import CORPUS

INSTALL_HINT = 'pip install -e ".[peer]"'
LAB_ARMS = ("graph", "graph+pdl", "graph+pdl+fusion", "graph+pdl+fusion+split", "persistent")


@dataclasses.dataclass(frozen=True)
class Settings:
    """What one peer recording runs (peer_result.record writes these into peer.json)."""
    weights: str
    reps: int = 5
    tokens: int = 64
    contexts: tuple = (64, 900)
    torch_arms: tuple = ("eager", "graph", "compile", "inductor")
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
        with collector_off():
            seconds = engine.decode(tokens)
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


class TorchArms:
    """The torch arms, EACH in a worker process of its own (lab/measure/peer_worker.py): torch
    slows later CUDA graph nodes of its process, and torch.compile's modes share dynamo's cache
    of one step function. `start` launches them all (their imports and compiles overlap the
    lab's set-up); `ready` waits for each; `rep` asks each live one in turn (never two at once:
    an idle worker waits on its pipe and runs nothing on the GPU); `quit` ends them."""

    def __init__(self, s: Settings, say):
        from lab.measure.peer_torch import TORCH_ARMS
        from lab.measure.peer_worker import Worker
        self.s, self.say = s, say
        self.workers = {TORCH_ARMS[k]: (k, Worker(s.torch_python)) for k in s.torch_arms}
        self.live: list[str] = []
        self.failed: dict[str, str] = {}
        self.info: dict[str, dict] = {}

    def start(self, setup: dict) -> str:
        """Each worker's import, then its setup (its one arm); the torch version. A LabError when
        torch is not importable or a worker does not start."""
        from lab.measure.peer_worker import WorkerError
        version = None
        for name, (key, w) in self.workers.items():
            try:
                version = w.recv(120.0, "imported")["torch"]
            except WorkerError as exc:
                if exc.kind == "import":
                    why = " ".join(str(exc).split())
                    raise LabError(f"PyTorch is not importable ({why}); install the peer extra: "
                                   f"{INSTALL_HINT}") from None
                raise LabError(f"the torch worker of {name} did not start: {exc}") from None
            w.send({**setup, "arms": [key]})
        self.say(f"{len(self.workers)} torch worker(s) started (torch {version}), one per arm; "
                 f"they build their arms while the lab sets up")
        return version

    def ready(self) -> None:
        from lab.measure.peer_worker import WorkerError
        self.say(f"waiting for the torch workers' warm-ups (up to {self.s.worker_timeout:.0f} s "
                 f"each)")
        for name, (_, w) in self.workers.items():
            try:
                self.info[name] = msg = w.recv(self.s.worker_timeout, "ready")
            except WorkerError as exc:
                self.failed[name] = f"torch worker: {exc}"
                self.say(f"TORCH WORKER FAILED ({name}): {exc}")
                continue
            self.failed.update(msg["failed"])
            self.live += [n for n in msg["arms"] if n not in self.failed]

    def rep(self, rep: int, order: list[str]) -> dict:
        """{arm: {context: {"ms", "host_ms", "tokens"}}} of the live arms, in `order`; a worker
        that fails leaves `live` with its reason in `failed`."""
        from lab.measure.peer_worker import WorkerError
        out = {}
        for name in order:
            w = self.workers[name][1]
            try:
                w.send({"cmd": "rep", "rep": rep})
                out.update(w.recv(self.s.worker_timeout, f"rep {rep}")["data"])
            except (WorkerError, OSError) as exc:
                self.failed[name] = f"torch worker at rep {rep}: {exc}"
                self.live.remove(name)
                self.say(f"TORCH WORKER FAILED ({name}): {exc}")
        return out

    def quit(self) -> dict:
        """Each live worker's last torch.compile counters, {arm: counters}."""
        from lab.measure.peer_worker import WorkerError
        counters = {}
        for name in self.live:
            w = self.workers[name][1]
            try:
                w.send({"cmd": "quit"})
                counters[name] = w.recv(60.0, "bye")["compile_counters"]
            except (WorkerError, OSError):
                pass
        return counters

    def stop(self) -> None:
        for _, w in self.workers.values():
            w.stop()

    def merged_info(self, version: str) -> dict:
        """What peer_result.record reads of the workers: the first ready worker's versions and
        settings, and per arm its build, warm-up and compile seconds and its counters."""
        from lab.measure.peer_torch import COMPILE_ARM, TORCH_ARMS
        first = next(iter(self.info.values()), {})
        keep = ("torch_cuda", "device", "device_name", "settings", "python")
        out = {"torch": version, **{k: first[k] for k in keep if k in first},
               "arms": list(self.live), "failed": dict(self.failed)}
        for field in ("warmup_s", "build_s", "compile_s"):
            out[field] = {n: v for i in self.info.values() for n, v in i.get(field, {}).items()}
        graph = self.info.get(TORCH_ARMS["graph"], {})
        out["cudagraph_buckets"] = graph.get("cudagraph_buckets", [])
        out["compile_counters"] = self.info.get(COMPILE_ARM, {}).get("compile_counters", {})
        return out


def interleave(s: Settings, arms, contexts, prompts, torch_arms: TorchArms, say, run=lab_run):
    """The reps: rep i runs the lab arms here and the torch arms in their workers, the lab first
    on even reps; each side rotates its arm order per rep. A worker that fails stops its arm (it
    goes to `torch_arms.failed`); the other arms' reps go on. Returns (data, run order)."""
    from lab.measure.stats import rotated
    lab_names = list(dict.fromkeys(name for name, _ in arms))
    data: dict = {n: {str(c): {"ms": [], "tokens": []} for c in contexts} for n in lab_names}
    data.update({n: {str(c): {"ms": [], "host_ms": [], "tokens": []} for c in contexts}
                 for n in torch_arms.live})
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
            if not torch_arms.live:
                continue
            order = rotated(list(torch_arms.live), rep)
            for n, per_ctx in torch_arms.rep(rep, order).items():
                for c, d in per_ctx.items():
                    for field in ("ms", "host_ms", "tokens"):
                        data[n][c][field].append(d[field])
            for n in [n for n in list(data) if n in torch_arms.failed]:
                data.pop(n)
            done.append("torch: " + ", ".join(n for n in order if n in torch_arms.live))
        run_order.append(done)
        first = str(contexts[0])
        cells = [f"{n} {np.mean(d[first]['ms']):.4f}" for n, d in data.items() if d[first]["ms"]]
        say(f"rep {rep + 1}/{s.reps} done ({'; '.join(done)}); running mean ms/token at "
            f"context {contexts[0]}: {', '.join(cells)}")
    return data, run_order


def measure(ctx, s: Settings, run=lab_run, name: str = "peer.json") -> dict:
    """peer.json's content (written), from settings `s`; LabError when torch is missing or a
    worker cannot start; `run` makes the lab arms' timed run (a test perturbs it)."""
    from lab.measure import report
    from lab.measure.peer_result import record
    from lab.measure.peer_torch import TORCH_ARMS
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
    # the torch workers first: their imports say at once whether torch is there, and their
    # compiles then overlap the lab's set-up
    torch_arms = TorchArms(s, say)
    try:
        version = torch_arms.start(
            {"cmd": "setup", "weights": str(Path(s.weights).resolve()), "device": s.torch_device,
             "buckets": s.buckets, "tokens": s.tokens, "contexts": contexts,
             "prompts": {str(c): [int(i) for i in ids] for c, (_, ids) in prompts.items()}})
        arms = lab_arms(model, ctx.backend, contexts, prompts, s.tokens, s.persistent, say)
        from lab.reference import generate as oracle_generate
        oracle = {str(c): [int(t) for t in oracle_generate(model, ids, s.tokens)[ids.size:]]
                  for c, (_, ids) in prompts.items()}
        say("float64 oracle tokens computed")
        torch_names = [TORCH_ARMS[k] for k in s.torch_arms]
        torch_arms.ready()
        data, run_order = interleave(s, arms, contexts, prompts, torch_arms, say, run)
        counters = torch_arms.quit()
        torch_info = torch_arms.merged_info(version)
        torch_info["compile_counters_by_arm"] = counters
        torch_info["compile_counters"] = counters.get(TORCH_ARMS["compile"],
                                                      torch_info["compile_counters"])
    finally:
        torch_arms.stop()
    res = record(s, model, contexts, prompts, arms, data, oracle, dict(torch_arms.failed),
                 torch_names, torch_info, run_order, t_start)
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
