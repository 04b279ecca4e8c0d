"""The A/A gate's false-alarm rate under the simulator's noise, measured fast.

`aa_noise_times` draws the very lognormals the cost model would draw for many A/A pairs at once
(`_LognormalArgs` reads what each cost-model draw asks for, so the cost model stays the one place
the noise is defined); `aa_false_alarm_table` turns them into the gate's measured false-alarm
rate against the nominal AA_ALPHA at each rep count (notebook 05 plots it).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from lab.config import LabConfig
from lab.engine.runner import DecodeEngine
from lab.errors import LabError
from .arms import BENCH_PROMPT
from .stats import AA_ALPHA, aa_verdict


# ---- the A/A gate's false-alarm rate, drawn straight from the simulator's noise ---------------
class _LognormalArgs:
    """Stands in for a SimBackend's random generator to read what one cost-model draw asks for:
    `args` = (mean, sigma) of its lognormal (sigma 0: no draw); the factor it returns is 1, so
    the call returns the cost the noise spreads. The shortcut below then draws those very
    lognormals for many A/As at once: the cost model stays the one place the noise is defined."""

    def __init__(self):
        self.args = (0.0, 0.0)

    def read(self, draw: Callable) -> tuple[float, tuple[float, float]]:
        self.args = (0.0, 0.0)
        return draw(self), self.args

    def lognormal(self, mean: float, sigma: float) -> float:
        self.args = (float(mean), float(sigma))
        return 1.0


def _eager_costs(model, cfg: LabConfig, cost, prompt: str, tokens: int) -> list:
    """Per step of one decode_run(prompt, tokens) on SimBackend: (engine host us, [(host us,
    its lognormal, device us)] per launch), every figure from the cost model's own functions
    (host_launch, eager_us, engine_step) for the step's launches at that position."""
    from lab.backend.costmodel import launch_context
    from lab.backend.sim import SimBackend

    eng = DecodeEngine(model, cfg, backend=SimBackend(cost, seed=0))
    rng = _LognormalArgs()
    n = eng.encode(prompt).size - 1 + tokens
    steps = []
    for pos in range(n):
        prev, launches = None, []
        for ln in eng.step_launches(eng.plan(pos)):
            host, jitter = rng.read(lambda r: cost.host_launch(ln, eng.backend.mechanism, r))
            args = [np.array([pos]) if name == "pos" else a
                    for name, a in zip(ln.kernel.arg_names, ln.args)]
            launches.append((host, jitter, cost.eager_us(ln, launch_context(ln, args), prev)))
            prev = ln
        steps.append((cost.engine_step("eager"), launches))
    return steps


def aa_noise_times(model, reps: int, tokens: int = 24, draws: int = 2000, seed=0,
                   cfg: LabConfig | None = None, cost=None,
                   prompt: str = BENCH_PROMPT) -> tuple[np.ndarray, np.ndarray]:
    """ms/token of A and of A' ([draws, reps] each) for `draws` independent eager A/As as
    `run_aa` times them on a SimBackend -- one shared engine, a warm-up run per arm, then
    `reps` rounds A A', A' A, ... of decode_run(prompt, tokens) -- drawn straight from the
    simulator's noise model instead of running the engine: per launch the host pays
    `CostModel.host_launch` (its mean-1 lognormal jitter) times the host speed, per step
    `CostModel.engine_step`; the host speed is `CostModel.host_speed`'s lognormal, redrawn once
    `drift_us` of model time has passed (as SimBackend's `_host_speed` does); the device runs
    each kernel for `CostModel.eager_us` once the host has submitted it and the kernel before it
    is done; a run's time is clock() to clock(), each of which waits for the device.
    Thousands of A/As take seconds, where the engine would run every kernel's NumPy twin for
    each; tests/measure/test_bench.py checks that both give the same false-alarm rates."""
    from lab.backend.costmodel import CostModel

    cfg = (cfg or LabConfig(graph=False)).replace(backend="sim")
    if cfg.graph or cfg.overlap or cfg.ranks != 1 or cfg.loop != "host" or cfg.pdl or cfg.bugs:
        raise LabError("aa_noise_times draws the clean eager one-stream step's noise: give a "
                       "config with LAB_GRAPH=0, LAB_OVERLAP=0, LAB_PDL=0, LAB_RANKS=1, "
                       "LAB_LOOP=host and no LAB_BUG_*")
    if reps < 2 or draws < 1:
        raise LabError(f"reps must be >= 2 and draws >= 1, got reps={reps}, draws={draws}")
    cost = cost or CostModel.load()
    steps = _eager_costs(model, cfg, cost, prompt, tokens)
    speed_mean, speed_sigma = _LognormalArgs().read(cost.host_speed)[1]
    rng = np.random.default_rng(seed)
    host, dev = np.zeros(draws), np.zeros(draws)
    speed, until = np.ones(draws), np.zeros(draws)

    def host_speed():          # redrawn where drift_us of model time has passed
        due = host >= until
        if due.any():
            speed[due] = rng.lognormal(speed_mean, speed_sigma, int(due.sum()))
            until[due] = host[due] + cost.drift_us
        return speed

    def run() -> np.ndarray:   # one decode run: ms per step
        nonlocal host, dev
        t0 = host = np.maximum(host, dev)
        for step_us, launches in steps:
            host = host + step_us * host_speed()
            for us, (mean, sigma), dev_us in launches:
                jitter = rng.lognormal(mean, sigma, draws)
                host = host + us * jitter * host_speed()
                dev = np.maximum(dev, host) + dev_us
        host = np.maximum(host, dev)
        return (host - t0) / 1000.0 / len(steps)

    run(), run()               # the warm-up run of each arm
    a, a2 = np.empty((draws, reps)), np.empty((draws, reps))
    for r in range(reps):      # A A', A' A, ... (interleave's order)
        if r % 2 == 0:
            a[:, r], a2[:, r] = run(), run()
        else:
            a2[:, r] = run()
            a[:, r] = run()
    return a, a2


def aa_false_alarm_table(model=None, reps=(2, 3, 5, 8), tokens: int = 24, draws: int = 4000,
                         seed: int = 0, alpha: float = AA_ALPHA, cfg: LabConfig | None = None,
                         cost=None) -> list[dict]:
    """How often the A/A gate fails identical arms, per rep count, under the simulator's noise
    model (the H200's recorded spreads in data/gpu/kernel_costs.json): `draws` eager A/As of
    `tokens` tokens per rep drawn by aa_noise_times (default model: the shipped one; its
    launches decide the costs, its widths nothing), each judged by stats.aa_verdict. One row
    per rep count: {"reps", "tokens", "draws", "alarms", "rate", "sem" (binomial standard
    error of the rate), "nominal" (the gate's alpha), "gate"}.

    To print it: `for r in rows: print(f"{r['reps']:>4} {r['rate']:.2%} ± {r['sem']:.2%}
    (nominal {r['nominal']:.0%})")`; to plot it: `ax.errorbar([r["reps"] for r in rows],
    [r["rate"] for r in rows], yerr=[r["sem"] for r in rows], fmt="o")` against
    `ax.axhline(alpha)`. Each rep count has its own draws (seeded by `seed` and the count)."""
    if model is None:
        from lab.model import DEFAULT_WEIGHTS, load_model
        model = load_model(DEFAULT_WEIGHTS)
    rows = []
    for r in reps:
        a, a2 = aa_noise_times(model, r, tokens, draws, seed=(seed, r), cfg=cfg, cost=cost)
        verdicts = [aa_verdict(x, y, alpha=alpha) for x, y in zip(a, a2)]
        alarms = sum(not v.ok for v in verdicts)
        rate = alarms / draws
        rows.append({"reps": r, "tokens": tokens, "draws": draws, "alarms": alarms, "rate": rate,
                     "sem": float(np.sqrt(rate * (1 - rate) / draws)), "nominal": alpha,
                     "gate": verdicts[0].method})
    return rows
