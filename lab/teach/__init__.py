"""Teaching: the exercises, the student's own code checked against the engine.

  exercise      Exercise, CheckResult, Fail: what an exercise of selfcheck/ and handson/ is
  selfcheck/    the lecture's questions (answers after an attempt) and formula exercises
  handson/      the checklist's steps as exercises the student writes, run in the real engine
  mutate        the checkers' own check: mutants of each exercise's reference, and the words a
                verdict must hold to count as naming the mistake (scripts/mutation_score.py)

Imports: every floor below (ground, backend, engine, measure).
"""
