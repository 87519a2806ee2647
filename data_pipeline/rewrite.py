"""Stage `rewrite`: farthest-to-nearest fuzzy rewriting and the non-leakage check (DESIGN.md §7.4).

Start from the attribute question about vh ("What is the birth year of Adolf Hitler?"). Then, for i = h, h-1,
..., 1, replace the name of vi by a relational descriptor anchored on v(i-1) by name:

  h:   What is the birth year of [the political figure mentioned in the article on Luftwaffe]?
  h-1: What is the birth year of the political figure mentioned in the article on
       [the Second World War subject that the article on Taj Mahal links to]?

The descriptor is vi's category phrase that no other out-link of v(i-1) shares (`paths.Graph.
unique_descriptor`), so every step keeps (i) the same answer (the attribute of the same node) and (ii) a
unique referent. v0 stays named here; the `ground` stage replaces it by a reference to the image. Each
intermediate question is kept in `rewrite_trace`. The question is carried as a template with `{E0}` for v0.

(iii) Non-leakage, checked in code (`find_leaks`), rejects an item whose question still contains, as whole
words after case- and accent-folding:
  * any alias of any path node (`entities.aliases`: display title, title without its parenthetical, ASCII
    folding), the rule of DESIGN.md;
  * any distinctive word of a multi-word path title (`entities.distinctive_words`: >= 3 letters, not a
    stopword, in at most 3 of the 4,598 titles; e.g. `mahal`, `hitler`, but not `great` or `river`), which
    stops partial names ("the Taj", "Hitler's") that the alias rule alone would let through;
  * the answer or one of its aliases (a question must not contain its answer).
Here the check covers v1..vh (v0 is still named); `ground` runs it again over the whole path.
"""

import re

import numpy as np

from data_pipeline import entities

# Relational reference templates: {d} = descriptor of vi, {x} = reference to v(i-1).
# Each ends with {x}, so that nesting reads left to right (no stacked trailing verbs).
REFERENCE_TEMPLATES = (
    'the {d} mentioned in the article on {x}',
    'the {d} linked from the article on {x}',
    'the {d} named in the Wikipedia article about {x}',
)


def _contains(folded_text: str, phrase: str) -> bool:
  return bool(re.search(r'(?<!\w)' + re.escape(entities.fold(phrase)) + r'(?!\w)', folded_text))


def find_leaks(question: str, path: list[str], all_titles: tuple[str, ...], answers: list[str] = (),
               skip: tuple[str, ...] = ()) -> list[str]:
  """Names of path nodes (or the answer) that remain in `question`.

  Args:
    question: question text.
    path: Wikispeedia titles v0..vh.
    all_titles: all corpus titles (document frequencies for the distinctive-word rule).
    answers: the answer and its aliases.
    skip: titles not to check (v0 before grounding).
  Returns:
    One reason per leak, e.g. `"alias of Taj_Mahal: 'taj mahal'"`; empty when the question is clean.
  """
  text = ' '.join(entities.fold(question).split())
  leaks = []
  for title in path:
    if title in skip:
      continue
    for name in entities.aliases(title):
      if _contains(text, name):
        leaks.append(f'alias of {title}: {entities.fold(name)!r}')
        break
    else:
      for word in entities.distinctive_words(title, all_titles):
        if _contains(text, word):
          leaks.append(f'distinctive word of {title}: {word!r}')
          break
  for ans in answers:
    if ans and _contains(text, ans):
      leaks.append(f'answer: {entities.fold(ans)!r}')
      break
  return leaks


def fuzzy_rewrite(path: list[str], descriptors: list[str], attribute: str,
                  rng: np.random.Generator) -> tuple[str, list[str]]:
  """Farthest-to-nearest rewrite.

  Returns:
    (template with `{E0}` standing for v0, trace of rendered questions after each replacement).
  """
  names = [entities.display(t) for t in path]
  tmpl = entities.ATTRIBUTE_BY_NAME[attribute].question.format('{E%d}' % (len(path) - 1))
  render = lambda t: t.format(**{f'E{i}': n for i, n in enumerate(names)})
  trace = [qa_capitalize(render(tmpl))]
  for i in range(len(path) - 1, 0, -1):
    ref = REFERENCE_TEMPLATES[int(rng.integers(len(REFERENCE_TEMPLATES)))]
    tmpl = tmpl.replace('{E%d}' % i, ref.format(d=descriptors[i - 1], x='{E%d}' % (i - 1)))
    trace.append(qa_capitalize(render(tmpl)))
  return qa_capitalize(tmpl), trace


def qa_capitalize(text: str) -> str:
  return text[:1].upper() + text[1:]


def rewrite(records: list[dict], all_titles: tuple[str, ...], seed: int) -> tuple[list[dict], dict]:
  """Adds question_template, question (v0 still named), rewrite_trace; rejects leaking items.

  Args:
    records: output of `qa.add_qa`.
    all_titles: corpus titles.
    seed: reference templates drawn from `default_rng([seed, 2, item index])`.
  Returns:
    (records, counts {'in', 'rewritten', 'rejected_leak', 'skipped'}).
  """
  out, counts = [], {'in': len(records), 'rewritten': 0, 'rejected_leak': 0, 'skipped': 0}
  for i, rec in enumerate(records):
    rec = dict(rec)
    if rec.get('rejected'):
      counts['skipped'] += 1
      rec.update(question_template='', question='', rewrite_trace=[])
      out.append(rec)
      continue
    rng = np.random.default_rng([seed, 2, i])
    tmpl, trace = fuzzy_rewrite(rec['path'], rec['descriptors'], rec['answer_attribute'], rng)
    rec.update(question_template=tmpl, question=trace[-1], rewrite_trace=trace)
    leaks = find_leaks(trace[-1], rec['path'], all_titles, rec['answers'], skip=(rec['path'][0],))
    if leaks:
      rec['rejected'] = 'rewrite: leak: ' + '; '.join(leaks)
      counts['rejected_leak'] += 1
    else:
      counts['rewritten'] += 1
    out.append(rec)
  return out, counts
