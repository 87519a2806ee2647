"""What an article's text mentions: every article named in it, with counts (the text side of Eq. 6 (ii)).

"The chemical element mentioned in the article on the Taj Mahal" has one referent only if the Taj Mahal's text
names one chemical element: the text names gold 8 times and copper twice, so it has none, whatever the link
table says. `mention_counts` reads a text once and counts, for every article, the places where one of its names
(title, title without its parenthetical, redirects: `WikiGraph.aliases`) occurs, by the matcher of the leak check
(`entities.names_in_text`: up to case, accents, punctuation and spacing, whole words only), each place given to
the longest name found there ('New Mexico' is no mention of Mexico; 'Mexico City' none of Mexico either), a place
where two articles share the name counted for both (Georgia the country and the US state). The class filter is
the caller's (`WikiGraph.competitors`).

People without an article are readers' candidates too: "the historical figure named in the article on Mexico"
is not Hernán Cortés alone when the text also names Miguel Hidalgo and Santa Anna, who have none.
`unnamed_people` counts such names: a capitalised given name (a first word of a person's title: 'Miguel' from
Miguel de Cervantes, 'Benito' from Benito Mussolini) followed by one or two capitalised words, when the pair is no
article's name.
"""

import re

from data_pipeline import entities

_NAME_PAIR = re.compile(r"(?<![\w'’-])([A-Z][^\W\d_]+)\s+((?:[A-Z]\.|[A-Z][^\W\d_]+)\s+)?[A-Z][^\W\d_'’]+")

def name_key(name: str) -> str:
  """The folded tokens of a name joined without spaces (`entities.name_tokens`: 'St. Louis' -> 'stlouis'), the
  key of `entities.name_runs`."""
  return ''.join(entities.name_tokens(name))


def alias_index(names_by_title) -> dict[str, tuple[str, ...]]:
  """name key -> the titles with a name of that key.

  Args:
    names_by_title: iterable of (title, names), e.g. [('Copper', ('Copper',)), ('Georgia_(country)',
      ('Georgia (country)', 'Georgia'))].
  """
  index: dict[str, list[str]] = {}
  for title, names in names_by_title:
    for key in dict.fromkeys(name_key(n) for n in names):
      if key:
        index.setdefault(key, []).append(title)
  return {k: tuple(v) for k, v in index.items()}


def mention_spans(text: str, index: dict[str, tuple[str, ...]]) -> dict[str, list[tuple[int, int]]]:
  """title -> the character spans [start, end) of `text` that name it (module docstring: longest name wins a
  place; a place two articles share the name of is listed for both).

  Args:
    text: an article's plain text (or one sentence).
    index: `alias_index` of every article.
  """
  runs = entities.name_runs(text)
  found = [(a, b, key) for key in runs.keys() & index.keys() for a, b in runs[key]]
  taken = bytearray(len(text))
  spans: dict[str, list[tuple[int, int]]] = {}
  for a, b, key in sorted(found, key=lambda f: (f[0] - f[1], f[0])):
    if any(taken[a:b]):
      continue
    taken[a:b] = b'\x01' * (b - a)
    for title in index[key]:
      spans.setdefault(title, []).append((a, b))
  return spans


def mention_counts(text: str, index: dict[str, tuple[str, ...]]) -> dict[str, int]:
  """title -> how many places of `text` name it (`mention_spans`, counted).

  Args:
    text: an article's plain text (or one sentence).
    index: `alias_index` of every article.
  Returns:
    Counts of the titles mentioned at least once.
  """
  return {t: len(s) for t, s in mention_spans(text, index).items()}


def unnamed_people(text: str, given_names: frozenset[str], index: dict[str, tuple[str, ...]]) -> dict[str, int]:
  """'Given Surname' -> count, for the person-like names of `text` that are no article's (module docstring).

  Args:
    text: an article's plain text (or one sentence).
    given_names: folded given names (`WikiGraph.given_names`), e.g. frozenset({'miguel', 'benito'}).
    index: `alias_index` of every article (a pair it holds is an article's name, counted by `mention_counts`).
  """
  counts: dict[str, int] = {}
  for m in _NAME_PAIR.finditer(text):
    words = m.group(0).split()
    if (entities.fold(words[0]) not in given_names or name_key(' '.join(words)) in index
        or name_key(' '.join(words[:2])) in index):
      continue
    counts[' '.join(words)] = counts.get(' '.join(words), 0) + 1
  return counts
