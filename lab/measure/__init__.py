"""Measurement: what a run costs, what a capture froze, and whether a prediction holds.

  audit        capture audit, lazy-initialisation detector, run checks, the bug table
  replay_check graph replays byte-compared with eager (replay_check, never_repeating,
               key_parts_beyond_plan, decode_after_prompt)
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
  spec         speculative decoding: the same tokens, the curve against context, NSPLIT,
               when drafting pays (E against V on two fixed texts)
  megakernel   where the megakernel's time goes: its phases by in-kernel clocks, its span,
               its body's variants as bench arms
  handoff      one hand-off between phases measured apart: a counter, a tag in the data, or
               a kernel boundary with and without PDL, on the same phase's work
  peer_torch   the PyTorch peer: the model in torch (+ peer_worker, its process; peer_result)
  chains       chains of graph nodes: the unit the cost file is measured in
  costfile     the cost file's recorder (kernel_costs.json, spec_costs.json, ladder, fission)
  experiment   one experiment as an experiment module declares it (Experiment, @experiment)
  registry     the experiments run in priority order, stamped, archived (decode-lab record)
  experiments/ the experiment modules: one recording (or a few close ones) each

Imports: the ground floor, lab.backend and lab.engine.
"""
