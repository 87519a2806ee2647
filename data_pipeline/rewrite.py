"""Stage `rewrite`: farthest-to-nearest fuzzy rewriting and the non-leakage check (DESIGN.md §7.4, Eq. 6).

Start from the attribute question about vh ("What is the birth year of Adolf Hitler?"). Then, for i = h, h-1,
..., 1, replace the name of vi by a referring phrase anchored on v(i-1), built from the hop's relation (read from
the link's anchor and sentence, `relations.py`) and vi's descriptor (`paths.check_path`):

  h:   What is the birth year of [the political figure named in the article on Luftwaffe]?
  h-1: What is the birth year of the political figure named in the article on
       [the architect who designed Taj Mahal]?

Relations give 'the architect who designed X', 'the river on which lies X', 'the city containing X' (each reference
ends with the previous one: no garden path, one relative clause per hop, checked by `reading_error`);
a hop without one reads 'the <descriptor> <fallback by domain> the article on X'. The descriptor picks vi out among
v(i-1)'s out-links (`WikiGraph.referent`), so every step keeps (i) the same answer (the attribute of the same node)
and (ii) a unique referent. v0 stays named here; `ground` replaces it by a reference to the image. Each
intermediate question is kept in `rewrite_trace`; the question is carried as a template with `{E0}` for v0.

(iii) Non-leakage, checked in code (`find_leaks`): the question must not contain, up to case, diacritics,
punctuation and spacing (`entities.names_in_text`: 'Sao Paulo' = 'São Paulo', 'St Louis' = 'St. Louis'):
  * any alias of any path node: its title, the title without its parenthetical, and every redirect to it
    (`WikiGraph.aliases`), the rule of DESIGN.md;
  * any distinctive word of a multi-word path title (`entities.distinctive_words`: >= 3 letters, not a
    stopword, in at most 3 titles; `mahal`, `hitler`, not `great` or `river`), which stops partial names;
  * the answer or one of its aliases.
Here the check reads the question without v0 (still named); `ground` runs it again over the whole path.
`data.rewrite=False` (the Table 3a "no fuzzy rewriting" ablation): the canonical question is the question (the
leak check then covers the answer only; `ground` still replaces v0's name, at the mentions `mention_template`
finds: any alias of v0 up to case and accents, not inside another path node's name; none found -> rejected).
"""


from data_pipeline import entities
from data_pipeline import relations


def find_leaks(question: str, path: list[str], graph, answers: list[str] = (), skip: tuple[str, ...] = ()) -> list[str]:
  """Names of path nodes (or the answer) that remain in `question`.

  Args:
    question: question text.
    path: titles v0..vh.
    graph: the `wiki_graph.WikiGraph` (aliases, all titles for the distinctive-word rule).
    answers: the answer and its aliases.
    skip: titles not to check (v0 before grounding).
  Returns:
    One reason per leak, e.g. `"alias of Taj_Mahal: 'Taj Mahal'"`; empty when the question is clean.
  """
  leaks = []
  for title in path:
    if title in skip:
      continue
    found = entities.names_in_text(question, graph.aliases(title))
    if found:
      leaks.append(f'alias of {title}: {found[0]!r}')
      continue
    found = entities.names_in_text(question, entities.distinctive_words(title, graph.titles))
    if found:
      leaks.append(f'distinctive word of {title}: {found[0]!r}')
  found = entities.names_in_text(question, [a for a in answers if a])
  if found:
    leaks.append(f'answer: {found[0]!r}')
  return leaks


def fuzzy_rewrite(path: list[str], descriptors: list[str], attribute: str, rels: list[str] | None = None,
                  persons: list[bool] | None = None) -> tuple[str, list[str]]:
  """Farthest-to-nearest rewrite.

  Args:
    path: titles v0..vh; descriptors: [h] of v1..vh; attribute: an `entities.ATTRIBUTES` name.
    rels: [h] relations of the hops (`relations.RELATIONS` or fallbacks); None = 'mentioned in' everywhere.
    persons: [h] whether vi is a person ('who' / 'that'); None = none is.
  Returns:
    (template with `{E0}` standing for v0, trace of rendered questions after each replacement).
  """
  h = len(path) - 1
  rels = list(rels) if rels is not None else [relations.fallback('')] * h
  persons = list(persons) if persons is not None else [False] * h
  names = [entities.display(t) for t in path]
  tmpl = entities.ATTRIBUTE_BY_NAME[attribute].question.format('{E%d}' % h)
  render = lambda t: t.format(**{f'E{i}': n for i, n in enumerate(names)})
  trace = [capitalize(render(tmpl))]
  for i in range(h, 0, -1):
    ref = relations.reference(rels[i - 1], descriptors[i - 1], '{E%d}' % (i - 1), persons[i - 1])
    tmpl = tmpl.replace('{E%d}' % i, ref)
    trace.append(capitalize(render(tmpl)))
  return capitalize(tmpl), trace


def reading_error(descriptors: list[str], rels: list[str], persons: list[bool] | None = None) -> str | None:
  """The first hop whose reference reads badly (`relations.reading_error`: a garden path, two relative clauses,
  an 'X or Y' descriptor), as 'hop i: why', or None.

  Args:
    descriptors, rels: [h] of the hops (`paths.check_path`); persons: [h] whether vi is a person.
  """
  persons = list(persons) if persons is not None else [False] * len(descriptors)
  for i, (d, rel, person) in enumerate(zip(descriptors, rels, persons), 1):
    why = relations.reading_error(relations.reference(rel, d, '{x}', person), '{x}')
    if why:
      return f'hop {i}: {why}'
  return None


def mention_template(question: str, path: list[str], graph) -> str | None:
  """`question` with each mention of v0 (`entities.name_spans` of `graph.aliases(path[0])`) replaced by `{E0}`, mentions
  inside the name of another path node skipped ('Paris' in 'Paris Metro'); None when no mention is left (the
  `data.rewrite=False` ablation's template).

  Args:
    question: the canonical question, e.g. 'In which year was Gustave Eiffel, who designed the eiffel tower,
      born?'.
    path: titles v0..vh; graph: the `wiki_graph.WikiGraph`.
  """
  others = [span for t in path[1:] if t != path[0] for span in entities.name_spans(question, graph.aliases(t))]
  spans = [(a, b) for a, b in entities.name_spans(question, graph.aliases(path[0]))
           if not any(c <= a and b <= d and (c, d) != (a, b) for c, d in others)]
  if not spans:
    return None
  for a, b in reversed(spans):
    question = question[:a] + '{E0}' + question[b:]
  return question


def capitalize(text: str) -> str:
  """Upper-cases the first character only."""
  return text[:1].upper() + text[1:]


def rewrite(records: list[dict], graph, enabled: bool = True) -> tuple[list[dict], dict]:
  """Adds question_template, question (v0 still named), rewrite_trace; rejects leaking items.

  Args:
    records: output of `qa.add_qa`.
    graph: the `wiki_graph.WikiGraph`.
    enabled: False = no fuzzy rewriting (the canonical question, v0 as `{E0}`).
  Returns:
    (records, counts {'in', 'rewritten', 'rejected_leak', 'rejected_unreadable' (`reading_error`),
    'rejected_unnamed' (disabled: v0 not found by `mention_template`), 'skipped', 'enabled'}).
  """
  out = []
  counts = {'in': len(records), 'rewritten': 0, 'rejected_leak': 0, 'rejected_unreadable': 0, 'rejected_unnamed': 0,
            'skipped': 0,
            'enabled': bool(enabled)}
  for rec in records:
    rec = dict(rec)
    if rec.get('rejected'):
      counts['skipped'] += 1
      rec.update(question_template='', question='', rewrite_trace=[])
      out.append(rec)
      continue
    path = rec['path']
    unreadable = None
    if enabled:
      persons = [graph.domain(t) == 'Person' for t in path[1:]]
      tmpl, trace = fuzzy_rewrite(path, rec['descriptors'], rec['answer_attribute'], rec.get('relations'), persons)
      unreadable = reading_error(rec['descriptors'], rec.get('relations') or [relations.fallback('')] * len(persons),
                                 persons)
      # v0 is still named (`ground` replaces it): checked without it, so a word v0's name shares with a later
      # node ('Eiffel Tower' -> 'Gustave Eiffel') is no leak here.
      leaks = find_leaks(tmpl.replace('{E0}', ''), path, graph, rec['answers'], skip=(path[0],))
    else:
      canonical = rec['canonical_question']
      tmpl, trace = mention_template(canonical, path, graph), [canonical]
      leaks = find_leaks(canonical, [], graph, rec['answers'])
    rec.update(question_template=tmpl or '', question=trace[-1], rewrite_trace=trace)
    if leaks:
      rec['rejected'] = 'rewrite: leak: ' + '; '.join(leaks)
      counts['rejected_leak'] += 1
    elif unreadable:
      rec['rejected'] = f'rewrite: unreadable: {unreadable}'
      counts['rejected_unreadable'] += 1
    elif tmpl is None:
      rec['rejected'] = f'rewrite: v0 not named in the question ({path[0]})'
      counts['rejected_unnamed'] += 1
    else:
      counts['rewritten'] += 1
    out.append(rec)
  return out, counts
