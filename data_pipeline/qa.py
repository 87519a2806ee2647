"""Stage `qa`: the answer from the answer node's infobox and a canonical question naming every entity (§7.3).

The answer is the first answerable attribute of vh (`paths.answer_attribute`; preference order in
`entities.ATTRIBUTES`: capital, currency, author, largest city, constellation, country, birth year, death year,
founding year, calling code, TLD), at most 6 tokens, with aliases (`Cairo` / `Al-Qahirah`, `1879` /
`March 14, 1879`, `+33` / `33`). The canonical question is template-based (the offline default for the LLM of
the paper): one clause per hop, then the attribute question about vh, e.g.

  "The Wikipedia article on Taj Mahal mentions Luftwaffe, and Adolf Hitler is mentioned in the article on
   Luftwaffe. What is the birth year of Adolf Hitler?"
"""

import numpy as np

from data_pipeline import entities
from data_pipeline import paths as paths_lib

# Hop clause templates: {a} = source article name, {b} = the article it mentions.
HOP_TEMPLATES = (
    'the Wikipedia article on {a} mentions {b}',
    '{b} is mentioned in the article on {a}',
    'the article about {a} links to {b}',
)


def capitalize(text: str) -> str:
  """Upper-cases the first character only (`what is` -> `What is`; keeps `iPod`-style words after it)."""
  return text[:1].upper() + text[1:]


def canonical_question(path: list[str], attribute: str, rng: np.random.Generator) -> str:
  """Template question that names every node of `path` and asks for `attribute` of the last one."""
  names = [entities.display(t) for t in path]
  clauses = [HOP_TEMPLATES[int(rng.integers(len(HOP_TEMPLATES)))].format(a=a, b=b)
             for a, b in zip(names, names[1:])]
  chain = ', and '.join(clauses[:-1] + [clauses[-1]]) if len(clauses) <= 2 else (
      ', '.join(clauses[:-1]) + ', and ' + clauses[-1])
  ask = entities.ATTRIBUTE_BY_NAME[attribute].question.format(names[-1])
  return f'{capitalize(chain)}. {capitalize(ask)}'


def add_qa(records: list[dict], graph: paths_lib.Graph, seed: int) -> tuple[list[dict], dict]:
  """Adds answer_attribute, answers, answer_evidence and canonical_question to each walk record.

  Args:
    records: output of `paths.sample_paths`.
    graph: the `paths.Graph` the walks came from.
    seed: template choices are drawn from `default_rng([seed, 1, item index])`.
  Returns:
    (records with QA, counts {'in', 'answered', 'no_answer'}); a walk whose answer node lost its attribute is
    kept with `rejected='qa: no answerable attribute'`.
  """
  out, counts = [], {'in': len(records), 'answered': 0, 'no_answer': 0}
  for i, rec in enumerate(records):
    rec = dict(rec)
    got = paths_lib.answer_attribute(graph, rec['path'])
    if got is None:
      counts['no_answer'] += 1
      rec.update(answer_attribute='', answers=[], answer_evidence='', canonical_question='',
                 rejected='qa: no answerable attribute')
      out.append(rec)
      continue
    name, val = got
    rng = np.random.default_rng([seed, 1, i])
    rec.update(answer_attribute=name, answers=[val['answer']] + list(val['aliases']),
               answer_evidence=f"{rec['path'][-1]}: {val['line']}",
               canonical_question=canonical_question(rec['path'], name, rng), rejected=None)
    counts['answered'] += 1
    out.append(rec)
  return out, counts
