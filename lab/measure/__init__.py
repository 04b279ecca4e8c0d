"""Measurement: what a run costs, and whether a prediction holds.

  stats        mean and standard error, the paired t-test, the A/A gate, leave-one-out rows
  bench        the experiments: A/A, A/B behind the A/A gate, ladder, sweeps, leave-one-out
  arms         their machinery: arms, the replay gate, one timed run, interleaved reps
  aa_noise     the A/A gate's false-alarm rate under the simulator's noise
  report       tables and JSON records that say where their numbers came from
  plots        the figures the notebooks and data/gpu show
  conformance  the simulator's predictions held against the GPU recordings
  pdl_edges    PDL edge by edge: a chained step with one kernel's launches left plain
  precision    float32/float16 KV and reductions against the float64 oracle
  kernel_run   one kernel on its own, eager or captured, for costs and checks
  compare      two runs of one prompt, step by step (+ compare_sides, compare_evidence)
  spec         speculative decoding: the same tokens, the curve against context, NSPLIT

Imports: the ground floor, lab.backend and lab.engine.
"""
