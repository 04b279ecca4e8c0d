"""decode-lab: an instrumented engine for graph-resident LLM decode, and the tools around it.

The modules by floor (a folder per floor above the ground); each imports only from its own
floor or the floors below it.

ground: what everything reads
  errors      LabError (bad input, clear message, exit 2), CaptureError, DeviceFault
  config      LabConfig + from_env(): every LAB_* toggle, the only reader of the environment
  bugspec     the deliberate bugs as data (what each breaks, the fix, the pieces it overrides)
  files       files written whole, output paths checked before a run
  model       weights (validated), shapes, the character tokenizer
  reference   float64 NumPy forward pass: the oracle
  plan        decode_plan(position): splits, grids, kernel choice, the capture key
  pdl_check   PDL safety: the wait-first rule and each kernel's pre-wait reads
  ledger      one entry per step: capture, replay, eager, fallback, and why

the devices: backend/ (one interface)
  base        Backend, Buffer, Launch, Graph; sim/: the CPU simulator (device, queue, ranks);
  costmodel   cuda/: numba.cuda + CuPy (device, launch, graph, ranks); costmodel: the
  instrument  simulator's costs from recorded GPU components; instrument: the launch log and bill

the engine: engine/ -- one DecodeEngine for any LAB_RANKS, read top to bottom as a model runner
  runner (DecodeEngine, make_engine) owning devices, graph_cache, issuer; compose (the step from
  the config); step (Step, FusedStep), persistent, draft, ranks, bugs; drivers: requests,
  device_loop, draft's rounds, ranks' bill

measurement: measure/ -- what a run costs, what a capture froze, whether a prediction holds
  audit, replay_check, stats, bench, arms, report, plots, conformance, precision, compare,
  kernel_run, costfile; the recordings: experiment, registry, experiments/ (decode-lab record)

teaching: teach/ -- the exercises, the student's own code checked against the engine
  exercise, selfcheck/, handson/, mutate

Each folder's __init__ says what it owns.

__main__: the command line (decode-lab)
"""
__version__ = "0.1.0"

# The public surface that notebooks and exercise stubs import (`from lab import DecodeEngine`),
# resolved by name on first use (PEP 562): `import lab.config` and `decode-lab --help` load no numba.
_PUBLIC = {"DecodeEngine": "lab.engine.runner", "make_engine": "lab.engine.runner",
           "LabConfig": "lab.config", "load_model": "lab.model", "LabError": "lab.errors",
           # the step's pieces, for a variant of the step (an experiment, an exercise)
           "Step": "lab.engine.step", "FusedStep": "lab.engine.step", "HostWork": "lab.engine.step",
           "launch": "lab.engine.step", "DraftStep": "lab.engine.draft"}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'lab' has no attribute {name!r}")
    import importlib
    value = getattr(importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value
    return value
