"""decode-lab: an instrumented engine for graph-resident LLM decode, and the tools around it.

  config      LabConfig + from_env(): every LAB_* toggle, the only reader of the environment
  errors      LabError (bad input, clear message, exit 2) and CaptureError (with its reason)
  model       weights (validated), shapes, the character tokenizer
  reference   float64 NumPy forward pass: the oracle
  plan        decode_plan(position): splits, grids, kernel choice, the capture key
  engine      DecodeEngine: buffers, the step as launches, eager / graph / fallback, ledger
  backend/    cuda (numba.cuda + CuPy) and sim (CPU simulator) behind one interface
  instrument  the launch log and the launch bill
  verify      replay_check: graph replays byte-compared with eager steps
  audit       capture audit, lazy-initialisation detector, the bug table
  bugs        the deliberate bugs, one LAB_BUG_* switch each
  pdl_check   PDL safety: the wait-first rule and each kernel's pre-wait reads
  stats       mean / sem / paired t / percentiles / the A/A verdict / leave-one-out arithmetic
  bench       paired interleaved A/B behind an A/A gate, sweeps, leave-one-out
  plots       timelines and charts
  precision   summation orders (chain, tree, the kernels'), the argmax policy, KL, margins
  kernel_run  matvec, rmsnorm, argmax_next run by themselves (numba's CUDA simulator or a GPU)
  compare     two runs of one prompt, step by step: weights, path evidence, KL, top-1, verdict
  selfcheck/  self-check exercises: stubs + checkers against the project's own code
"""
__version__ = "0.1.0"
