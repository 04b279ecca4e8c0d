"""Why a host-paced eager arm runs slower in one process than the cost model predicts: on a GPU,
the eager steps of the fission lessons measured three ways, printed with commit, GPU and versions.

    python3 scripts/eager_host_probe.py steps [--rounds 5]
    python3 scripts/eager_host_probe.py fission [--reps 40]
    python3 scripts/eager_host_probe.py where [--reps 40]

steps    in this process, per step of `CONFIGS` at position 64: the host us per pre-bound
         launch alone (loops of one launch, as the cost file's `host.prebound`) and in the step's
         sequence, the device time of an eager step (steps queued behind a spinning kernel,
         CUDA events), the engine's own host work per step (launches stubbed), and the eager
         decode's wall time per token; beside them, the cost model's figures for the same step
         (data/gpu/kernel_costs.json: host launches + engine, device), rounds interleaved.
fission  in this process, the eager A/Bs of arms.FISSION as the costs experiment records
         them (bench.run_ab: A/A then A/B, 64 tokens from the prompt), ms/token per arm.
where    `fission` in a fresh process, then the costs experiment (`decode-lab record costs`,
         which records fission.json after its kernel chains, floors and ladder) in three more
         processes: as it is, with gc.freeze a no-op, and without its kernel chains and
         switches; each one's fission arms side by side.

Needs a GPU (`--backend sim` runs the same on the simulator, whose clock makes it a dry run).
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# the eager steps of the fission lessons (arms.FISSION's arms), by name
CONFIGS = {"unfused": {}, "split combine": {"split_combine": True},
           "fused heads": {"fusion": True, "attn_tail": "heads"},
           "fused heads split": {"fusion": True, "attn_tail": "heads", "split_combine": True},
           "fused grid": {"fusion": True, "attn_tail": "grid"},
           "fused grid split": {"fusion": True, "attn_tail": "grid", "split_combine": True}}
# the costs experiment's variants `where` runs, each in a process of its own: code run first
VARIANTS = {"costs": "",
            "costs, gc.freeze a no-op": "import gc; gc.freeze = lambda: None",
            "costs, no kernel chains": ("from lab.measure import costfile; "
                                        "costfile.measure_kernels = lambda *a, **k: []; "
                                        "costfile.measure_switches = lambda *a, **k: []")}


def _device_step_us(eng, step, K=10) -> float | None:
    """Device us per eager step: K steps' launches queued behind a spinning kernel, timed by
    CUDA events (None on the simulator, or where the host could not queue them in time)."""
    import numpy as np
    from lab.measure.chains import set_pos
    from lab.measure.costfile import BASE_POSITION, behind_spin
    be = eng.backend
    if be.name != "cuda":
        return None
    buf = be.alloc("probe_spin", (1,), np.float32)

    def issue():
        for _ in range(K):
            for x in step:
                be.launch(x)

    for iters in (2_000_000, 8_000_000, 32_000_000):
        set_pos(eng, BASE_POSITION)
        spin_us, host_us, dev_us = behind_spin(be, buf, iters, issue)
        if spin_us > host_us:
            return dev_us / K
    return None


def steps(backend: str, rounds: int) -> dict:
    import numpy as np
    from lab import DecodeEngine
    from lab.backend.costmodel import CostModel, cost_key
    from lab.backend.instrument import LaunchLog
    from lab.config import LabConfig
    from lab.measure.chains import host_per_call, main_stream, set_pos
    from lab.measure.costfile import BASE_POSITION, PROMPT, engine_host_us, sequence_us
    from lab.measure.stats import collector_off
    from lab.model import load_model
    model = load_model()
    cm = CostModel.load(ROOT / "data" / "gpu" / "kernel_costs.json").replace(
        launch_jitter=0.0, drift=0.0, node_jitter=0.0)
    engines = {}
    for name, kw in CONFIGS.items():
        eng = DecodeEngine(model, LabConfig(backend=backend, graph=False, **kw))
        eng.log = LaunchLog()
        eng.bind()
        eng.reset(eng.encode(PROMPT), 0)
        eng.seek(BASE_POSITION)
        eng.decode(8)                    # compiles and prepares every launch of the plan
        engines[name] = eng
    res = {n: {"alone": {}, "sequence": [], "device_step": [], "engine": [], "wall": []}
           for n in CONFIGS}

    def step_of(eng):
        return [main_stream(x) for x in eng.step_launches(eng.plan(BASE_POSITION))]

    for _ in range(rounds):              # every step once a round: drift hits them alike
        for name, eng in engines.items():
            be, r, step = eng.backend, res[name], step_of(eng)
            set_pos(eng, BASE_POSITION)
            for launch in {cost_key(x): x for x in step}.values():
                be.launch(launch)
                r["alone"].setdefault(cost_key(launch), []).append(
                    host_per_call(be, lambda: be.launch(launch), 100, 1))
            set_pos(eng, BASE_POSITION)
            r["sequence"].append(sequence_us(be, step))
            dev = _device_step_us(eng, step)
            if dev is not None:
                r["device_step"].append(dev)
            eng.reset(eng.encode(PROMPT), 0)
            eng.seek(BASE_POSITION)
            be.synchronize()
            r["engine"].append(engine_host_us(eng))
            eng.reset(eng.encode(PROMPT), 0)
            eng.seek(BASE_POSITION)
            be.synchronize()
            with collector_off():
                r["wall"].append(1e6 * eng.decode(64) / 64)
    rng = np.random.default_rng(0)
    out = {}
    for name, eng in engines.items():
        r, step = res[name], step_of(eng)
        med = lambda v: statistics.median(v) if v else None  # noqa: E731
        alone = {k: med(v) for k, v in r["alone"].items()}
        dev_model, prev = 0.0, None
        for x in step:
            dev_model += cm.eager_us(x, BASE_POSITION + 1, prev)
            prev = x
        out[name] = {"launches": len(step),
                     "alone_us": statistics.mean(alone[cost_key(x)] for x in step),
                     "sequence_us": med(r["sequence"]), "engine_us": med(r["engine"]),
                     "device_step_us": med(r["device_step"]), "wall_us": med(r["wall"]),
                     "walls_us": r["wall"],
                     "model_host_us": sum(cm.host_launch(x, "prebound", rng) for x in step),
                     "model_engine_us": cm.engine_step("eager"), "model_device_us": dev_model}
    return out


def format_steps(rows: dict) -> list[str]:
    lines = [f"{'step':<18} {'n':>2} {'alone':>5} {'inseq':>5} {'engine':>6} {'device':>6} "
             f"{'wall':>6} | {'model: host + engine':>20} {'device':>6} {'wall/model':>10}"]
    for name, s in rows.items():
        model = s["model_host_us"] + s["model_engine_us"]
        dev = f"{s['device_step_us']:6.1f}" if s["device_step_us"] is not None else "     -"
        lines.append(f"{name:<18} {s['launches']:>2} {s['alone_us']:5.2f} {s['sequence_us']:5.2f} "
                     f"{s['engine_us']:6.1f} {dev} {s['wall_us']:6.1f} | "
                     f"{s['model_host_us']:11.1f} + {s['model_engine_us']:6.1f} "
                     f"{s['model_device_us']:6.1f} {s['wall_us'] / model:10.2f}")
    lines += ["n launches a step; alone, inseq: host us per launch alone and in the step's "
              "sequence;", "engine, device, wall: us per step (wall: the eager decode's median "
              "over the rounds,", "64 tokens from position 64)"]
    return lines


def fission(backend: str, reps: int) -> dict:
    from lab.config import LabConfig
    from lab.measure import bench
    from lab.measure.arms import FISSION
    from lab.model import load_model
    model = load_model()
    base = LabConfig(backend=backend, graph=False)
    out = {}
    for pair in FISSION:
        if not pair.host_paced:
            continue
        a, b = pair.configs(base)
        r = bench.run_ab(model, a, b, reps=reps, tokens=64, names=pair.names, per_token=0)
        out[pair.lesson] = {"aa_ms": [x["mean_ms"] for x in r["aa"]["arms"]],
                            "ab_ms": {x["name"]: x["mean_ms"] for x in r["arms"]}}
    return out


def _fission_file(path: Path) -> dict:
    """{lesson: {"aa_ms", "ab_ms"}} of a fission.json, as `fission` returns them."""
    from lab.measure.arms import FISSION
    data = json.loads(path.read_text())
    out = {}
    for pair in FISSION:
        if not pair.host_paced:
            continue
        d = data
        for k in pair.path.split("."):
            d = d[k]
        out[pair.lesson] = {"aa_ms": [x["mean_ms"] for x in d["aa"]["arms"]],
                            "ab_ms": {x["name"]: x["mean_ms"] for x in d["arms"]}}
    return out


def where(backend: str, reps: int) -> dict:
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "fresh.json"
        subprocess.run([sys.executable, __file__, "fission", "--backend", backend, "--reps",
                        str(reps), "--json", str(out)], check=True, cwd=ROOT,
                       stdout=subprocess.DEVNULL)
        runs["fresh process"] = json.loads(out.read_text())
        for i, (name, first) in enumerate(VARIANTS.items()):
            folder = Path(tmp) / f"costs{i}"
            code = (f"{first}\nimport sys\nfrom lab.__main__ import main\n"
                    f"sys.exit(main(['record', 'costs', '--backend', {backend!r}, '--out', "
                    f"{str(folder)!r}]))")
            subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT,
                           stdout=subprocess.DEVNULL)
            f = folder / "fission.json"
            runs[name] = _fission_file(f) if f.is_file() else {}   # the simulator skips costs
    return runs


def format_fission(runs: dict) -> list[str]:
    """Each process's A/As and A/Bs, ms/token per arm."""
    lines = []
    for run, rows in runs.items():
        lines.append(f"{run}:" + ("" if rows else " no fission.json (the simulator skips costs)"))
        for lesson, r in rows.items():
            aa = " ".join(f"{v:.4f}" for v in r["aa_ms"])
            ab = "  ".join(f"{k} {v:.4f}" for k, v in r["ab_ms"].items())
            lines.append(f"  {lesson:<42} A/A {aa}   A/B {ab}")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=("steps", "fission", "where"))
    ap.add_argument("--backend", choices=("cuda", "sim"), default="cuda")
    ap.add_argument("--rounds", type=int, default=5, help="steps: interleaved rounds")
    ap.add_argument("--reps", type=int, default=40, help="fission, where: reps of each A/B "
                    "(the costs experiment's own: 40)")
    ap.add_argument("--json", help="also write the figures to this file")
    a = ap.parse_args(argv)
    if a.rounds < 1 or a.reps < 2:
        ap.error("--rounds must be >= 1 and --reps >= 2")
    from lab.backend import make_backend
    from lab.config import LabConfig
    from lab.measure.registry import revision
    rev = revision()
    print(f"scripts/eager_host_probe.py {' '.join(argv if argv is not None else sys.argv[1:])}; "
          f"commit {rev['commit']}{' (dirty)' if rev['dirty'] else ''}; {datetime.date.today()}")
    print(make_backend(LabConfig(backend=a.backend)).describe())
    if a.what == "steps":
        res = steps(a.backend, a.rounds)
        lines = format_steps(res)
    elif a.what == "fission":
        res = fission(a.backend, a.reps)
        lines = format_fission({"this process": res})
    else:
        res = where(a.backend, a.reps)
        lines = format_fission(res)
    print("\n".join(lines))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
