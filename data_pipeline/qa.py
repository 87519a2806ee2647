"""Stage `qa`: the answer from the answer node's infobox and a canonical question naming every entity (§7.3).

The answer is the first answerable attribute of vh (`paths.answer_attribute`; preference order in
`entities.ATTRIBUTES`: capital, currency, author, largest city, constellation, country, birth year, death year,
founding year, calling code, TLD), at most 6 tokens, with aliases (`Cairo` / `Al-Qahirah`, `1879` /
`March 14, 1879`, `+33` / `33`). The canonical question is template-based (the offline default for the LLM of
the paper): one clause per hop, then the attribute question about vh, e.g.

  "The Wikipedia article on Taj Mahal mentions Luftwaffe, and Adolf Hitler is mentioned in the article on
   Luftwaffe. What is the birth year of Adolf Hitler?"

Typed answers: every answered item's answer must be a well-formed value of its attribute's type
(`AttributeSpec.answer_type`, checked by `answer_type_error`), else the item is kept with
`rejected='answer_type:<attribute> (<why>)'`:
  place / person / name  capitalised name-like text: <= 6 tokens, no digits, no markup, the first word upper-case
                         and not a function word (`of the Nation` from Mexico City's "Capital of the Nation",
                         `district Libreville`, `budgeting` are fragments), inner lower-case words only
                         connectives (`Dar es Salaam`, `Vasco da Gama`), no vague word (`Many`), no doubled
                         name (`Italy Italy`, a flag caption);
  currency               the same, but lower-case allowed (`rouble`), or an ISO 4217 code (`USD`);
  year                   3-4 digits (+ ` BC`), AD <= `MAX_YEAR`, BC <= `MAX_BC_YEAR`, stated exactly: an infobox
                         value qualified as approximate or uncertain (`c. 1451`, `circa 1810 BC`, `before 1020`,
                         `1030x1038`, `1336 BC or 1334 BC`, `1483?`, a decade `c. 1450s`) or dated by a season
                         only (`Spring 1480`: Magellan's birth, c. 1480 in other sources) is rejected, since no
                         single year is the answer and a judge could not tell a right reply from a wrong one;
  calling_code / tld     `+<1-4 digits>` / `.<2-3 lower-case letters>`.
Each descriptor must also be one of its own node's category descriptors (else `descriptor:<title>`).
"""

import re

import numpy as np

from data_pipeline import entities
from data_pipeline import paths as paths_lib
from data_pipeline import splits

# Hop clause templates: {a} = source article name, {b} = the article it mentions.
HOP_TEMPLATES = (
    'the Wikipedia article on {a} mentions {b}',
    '{b} is mentioned in the article on {a}',
    'the article about {a} links to {b}',
)


MAX_YEAR = 2026      # latest plausible AD year
MAX_BC_YEAR = 3500   # earliest plausible BC year (Wikispeedia's oldest dated people are ~2500 BC)
# Lower-case words allowed inside a name; a name never starts (capitalised or not) with the first group.
_LEADING_BAD = frozenset('of and or in on at to for by from with as a an'.split())
_CONNECTIVES = _LEADING_BAD | frozenset('the de la le du des del da di do dos das von van der den y e es al el '
                                        'upon sur'.split())
_VAGUE = frozenset(('many', 'none', 'n/a', 'unknown', 'various', 'several', 'see below', 'disputed', 'de facto',
                    'other', 'others', 'multiple', 'tbd', 'na'))
_MARKUP = re.compile(r'[\[\]{}|=<>*#^_~@\\/"]|&\w+;|https?:')
_SEASONS = 'spring|summer|autumn|fall|winter|midsummer|midwinter'
_UNCERTAIN = re.compile(r'(?<![.\w])(?:ca?|est)\.|(?i:\b(?:circa|about|around|approx|approximately|before|after|'
                        r'probably|possibly|perhaps|likely|presumably|reportedly|traditionally|allegedly|estimated|'
                        r'between|early|late|mid|or|' + _SEASONS + r')\b)|~|\?|\d\s*(?:x|–|—|/)\s*\d|\d0s\b')


def _name_error(answer: str, lower_ok: bool = False) -> str | None:
  tokens = answer.split()
  if not tokens or len(tokens) > entities.MAX_ANSWER_TOKENS:
    return f'{len(tokens)} tokens, expected 1 to {entities.MAX_ANSWER_TOKENS}'
  if _MARKUP.search(answer):
    return 'markup'
  if re.search(r'\d', answer):
    return 'digits in a name'
  if tokens[0].lower() in _LEADING_BAD or tokens[-1].lower() in _CONNECTIVES:
    return 'a fragment (starts or ends with a function word)'
  if not lower_ok and not tokens[0][:1].isupper():
    return 'not capitalised'
  for t in tokens[1:]:
    if not (t[:1].isupper() or t.lower() in _CONNECTIVES or re.fullmatch(r"[a-z]{1,3}['’-]\w+", t) or lower_ok):
      return f'lower-case word {t!r} inside a name'
  if answer.lower() in _VAGUE:
    return 'vague'
  half = len(tokens) // 2
  if len(tokens) % 2 == 0 and tokens[:half] == tokens[half:]:
    return 'doubled name'
  return None


def _year_error(answer: str, raw: str) -> str | None:
  m = re.fullmatch(r'(\d{3,4})( BC)?', answer)
  if not m:
    return 'not a 3-4 digit year'
  year, bc = int(m.group(1)), bool(m.group(2))
  if year > (MAX_BC_YEAR if bc else MAX_YEAR):
    return f'implausible year {answer}'
  at = re.search(r'\b' + m.group(1) + r'(?!\d)', raw)
  if at is None:  # Not from a raw value (a test, a hand-made item): the answer alone decides.
    return None
  window = raw[:at.end()] + re.split(r'[,(;]|\bin\b', raw[at.end():])[0]  # up to the place / note after it
  if _UNCERTAIN.search(window):
    return f'approximate or uncertain ({window.strip()!r})'
  return None


ANSWER_VALIDATORS = {
    'place': lambda answer, raw: _name_error(answer),
    'person': lambda answer, raw: _name_error(answer),
    'name': lambda answer, raw: _name_error(answer),
    'currency': lambda answer, raw: None if re.fullmatch(r'[A-Z]{3}', answer) else _name_error(answer, True),
    'year': _year_error,
    'calling_code': lambda answer, raw: None if re.fullmatch(r'\+\d{1,4}', answer) else 'not +<1-4 digits>',
    'tld': lambda answer, raw: None if re.fullmatch(r'\.[a-z]{2,3}', answer) else 'not .<2-3 letters>',
}


def answer_type_error(attribute: str, answer: str, raw: str = '') -> str | None:
  """Why `answer` is not a well-formed value of `attribute`'s type (see the module docstring), or None.

  Args:
    attribute: an `entities.ATTRIBUTES` name, e.g. 'capital', 'born'.
    answer: the extracted answer, e.g. 'Tokyo', '1879'.
    raw: the infobox value it came from (e.g. 'c. 1451'), read for the year's qualifiers; '' = none.
  Raises:
    KeyError: naming an unknown attribute.
  """
  if attribute not in entities.ATTRIBUTE_BY_NAME:
    raise KeyError(f'unknown attribute {attribute!r}; known: {sorted(entities.ATTRIBUTE_BY_NAME)}')
  return ANSWER_VALIDATORS[entities.ATTRIBUTE_BY_NAME[attribute].answer_type](answer, raw)


def raw_value(attribute: str, line: str) -> str:
  """The infobox value of `line` (`Born c. 1451` -> `c. 1451`)."""
  spec = entities.ATTRIBUTE_BY_NAME[attribute]
  return re.sub(r'^(?:- )?' + spec.key + r'(?:\s*\(\d{4}\))?', '', line).strip()


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


def add_qa(records: list[dict], graph, seed: int, attributes_per_path: int = 1) -> tuple[list[dict], dict]:
  """Adds answer_attribute, answers, answer_evidence and canonical_question to each walk record.

  Args:
    records: output of `paths.sample_paths`.
    graph: the `wiki_graph.WikiGraph` the walks came from.
    seed: template choices are drawn from `default_rng([seed, 1, item index])`.
    attributes_per_path: items per accepted walk (`data.attributes_per_path`): the first answerable attribute's,
      then up to this - 1 more of the next well-typed attributes of vh with new answers (Egypt: capital Cairo, then
      currency Egyptian pound), each `splits.item_id` ('<prompt_id>-<attribute>'; `splits.walk_id` keeps them in
      one split).
  Returns:
    (records with QA, counts {'in', 'answered', 'no_answer', 'accepted', 'rejected_answer_type' (attribute ->
    n), 'rejected_descriptor', 'more_attributes'}); a walk whose answer node lost its attribute is kept with
    `rejected='qa: no answerable attribute'`, one whose answer is not a value of its type with
    `'answer_type:<attribute> (<why>)'`, one with a descriptor not of its node with `'descriptor:<title>'`.
  """
  out = []
  counts = {'in': len(records), 'answered': 0, 'no_answer': 0, 'accepted': 0, 'rejected_answer_type': {},
            'rejected_descriptor': 0, 'more_attributes': 0}

  def type_error(name, val):
    return answer_type_error(name, val['answer'], raw_value(name, val['line'].split(' / ')[-1]))

  def with_answer(rec, name, val, rng):
    return dict(rec, answer_attribute=name, answers=[val['answer']] + list(val['aliases']),
                answer_evidence=f"{rec['path'][-1]}: {val['line']}",
                canonical_question=canonical_question(rec['path'], name, rng), rejected=None)

  for i, rec in enumerate(records):
    got = paths_lib.answer_attributes(graph, rec['path'])
    if not got:
      counts['no_answer'] += 1
      out.append(dict(rec, answer_attribute='', answers=[], answer_evidence='', canonical_question='',
                      rejected='qa: no answerable attribute'))
      continue
    (name, val), more = got[0], got[1:]
    rec = with_answer(rec, name, val, np.random.default_rng([seed, 1, i]))
    counts['answered'] += 1
    why = type_error(name, val)
    wrong = [t for t, d in zip(rec['path'][1:], rec.get('descriptors') or ()) if d not in graph.descriptors(t)]
    if why is not None:
      rec['rejected'] = f'answer_type:{name} ({why})'
      counts['rejected_answer_type'][name] = counts['rejected_answer_type'].get(name, 0) + 1
    elif wrong:
      rec['rejected'] = f'descriptor:{wrong[0]}'
      counts['rejected_descriptor'] += 1
    else:
      counts['accepted'] += 1
    out.append(rec)
    used = {entities.fold(val['answer'])}
    for j, (name, val) in enumerate(more):
      if rec['rejected'] or len(used) >= attributes_per_path:
        break
      if entities.fold(val['answer']) in used or type_error(name, val):
        continue
      used.add(entities.fold(val['answer']))
      out.append(with_answer(dict(rec, prompt_id=splits.item_id(rec['prompt_id'], name)), name, val,
                             np.random.default_rng([seed, 1, i, j + 1])))
      counts['accepted'] += 1
      counts['more_attributes'] += 1
  return out, counts
