"""Teaching: finding a bug, and the student's own code checked against the engine.

  verify      replay_check (graph replays byte-compared with eager), never_repeating
  audit       capture audit, lazy-initialisation detector, run checks, the bug table
  selfcheck/  the lecture's questions (answers after an attempt) and formula exercises
  handson/    the checklist's steps as exercises the student writes, run in the real engine
  mutate      the checkers' own check: mutants of each exercise's reference, and the words a
              verdict must hold to count as naming the mistake (scripts/mutation_score.py)

Imports: every floor below (ground, backend, engine, measure).
"""
