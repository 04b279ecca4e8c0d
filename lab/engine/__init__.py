"""The engine: one DecodeEngine for any LAB_RANKS, read top to bottom as a model runner.

  runner       allocate, warm up, reset, step, capture (DecodeEngine, make_engine)
  step         the path of one token in named pieces (Step; FusedStep for LAB_FUSION=1)
  ranks        the rank step (RankStep) and lockstep issue over ranks (LAB_RANKS=2)
  bugs         each deliberate bug as an override of step pieces
  buffers      every device buffer, allocated once before any capture
  graphs       the graph cache keyed by plan, and the plan switch by update
  device_loop  the whole generation in one launch (LAB_LOOP=device)
  spec         speculative decoding (LAB_DRAFT): the verify step, its buffers, decode in rounds
  persistent   the whole step in one cooperative kernel (LAB_PERSISTENT): its step, its buffers
  requests     prompts, generate, decode

Imports: the ground floor (lab/*.py) and lab.backend only.
"""
