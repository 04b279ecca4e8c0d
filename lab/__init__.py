"""decode-lab: an instrumented engine for graph-resident LLM decode, and the tools around it.

The modules by floor; each imports only from the floors below it.

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
  base        Backend, Buffer, Launch, Graph; sim (+ sim_queue, sim_ranks): the CPU simulator;
  costmodel   cuda (+ cuda_launch, cuda_graph, cuda_ranks): numba.cuda + CuPy; costmodel: the
              simulator's costs from recorded GPU components
  instrument  the launch log and the launch bill

the engine: one DecodeEngine for any LAB_RANKS, read top to bottom as a model runner
  engine      allocate, warm up, reset, step, capture (DecodeEngine, make_engine)
  step        the path of one token in named pieces (Step; FusedStep for LAB_FUSION=1)
  ranks       the rank step (RankStep) and lockstep issue over ranks (LAB_RANKS=2)
  bugs        each deliberate bug as an override of step pieces
  buffers, graphs, device_loop, requests: allocation; the graph cache and plan switch; the
              whole generation in one launch (LAB_LOOP=device); prompts, generate, decode

measurement: what a run costs, and whether a prediction holds
  stats, bench, report, plots, conformance, precision, kernel_run,
  compare (+ compare_sides, compare_evidence): two runs of one prompt, step by step

teaching: finding a bug, and the student's own code checked against the engine
  verify      replay_check (graph replays byte-compared with eager), never_repeating
  audit       capture audit, lazy-initialisation detector, run checks, the bug table
  selfcheck/  the lecture's questions (answers after an attempt) and formula exercises
  handson/    the checklist's steps as exercises the student writes, run in the real engine

__main__: the command line (decode-lab)
"""
__version__ = "0.1.0"
