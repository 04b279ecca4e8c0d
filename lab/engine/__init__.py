"""The engine: one DecodeEngine for any LAB_RANKS, read top to bottom as a model runner.

  runner       DecodeEngine: allocate, warm up, reset, step (eager or graph), capture
  devices      every rank's backend, log and buffers, allocated once (Devices)
  graph_cache  one graph per plan key: get or capture, update, fallback, clean-up (GraphCache)
  issuer       a step's items onto one device, or ranks in lockstep (Issuer)
  step         the path of one token in named pieces (Step; FusedStep for LAB_FUSION=1)
  compose      the step the configuration asks for (compose_step)
  bugs         each deliberate bug as an override of step pieces
  ranks        the rank step (RankStep), the split, the collectives' warm-up and bill
  draft        speculative decoding (LAB_DRAFT): the verify step (DraftStep), its rounds
  persistent   the whole step in one cooperative kernel (LAB_PERSISTENT): its step, its buffers
  device_loop  the whole generation in one launch (LAB_LOOP=device)
  requests     generate, decode, reading device memory

Imports: the ground floor (lab/*.py) and lab.backend only.
"""
