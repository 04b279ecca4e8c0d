"""The bank: the lecture's ten self-check questions, as the program reads them (questions.py asks
them), from the sealed bank in sealed_bank.py.

The right answers follow the lecture's corrected edition; each question has an explanation in
this project's words and a note for each tempting wrong option. All of that is sealed
(grading.py says how; seal.py writes the sealed bank from a plain one kept out of the
repository): what is written here in plain words is each question, its options (none marked)
and its hint.

  q1  choices         right first token, wrong later: the causes                (lecture section 4)
  q2  choice          must the position advance inside the graph?                (section 2)
  q3  choice          a loop bound vs a grid size: what to do with each          (section 2)
  q4  number+choices  standard error 0.55 -> 0.02 ms: variance, consequences     (section 1)
  q5  choice          why the error names the wrong kernel                       (section 3)
  q6  choice          two runs of one build differ at 128k: the likely cause     (section 5)
  q7  choices         what else gains value once the step is captured            (section 6)
  q8  choices         which reductions reorder bit-identically                   (section 8)
  q9  choice          more KV precision, worse parity with the reference         (section 9)
  q10 choice          the comparator fails one file against itself               (section 9)
"""
from __future__ import annotations

from .grading import Question, questions_from
from .sealed_bank import SEALED

QUESTIONS: dict[str, Question] = questions_from(SEALED)
