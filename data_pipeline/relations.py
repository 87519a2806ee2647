"""Relations between consecutive path nodes, read from the link's own anchor text and sentence (DESIGN.md §7.2).

A hop v(i-1) -> vi is a wikilink in the article on v(i-1): its anchor text and the sentence it sits in
(`wiki.Link`; Wikispeedia has neither, so `mention_sentence` finds the sentence of v(i-1)'s text that names vi).
`extract` reads the words just before the anchor in that sentence and returns a short relation phrase
("The Taj Mahal was designed by [Ustad Ahmad Lahauri]" -> 'designed by'; "Agra is located on the [Yamuna]" ->
'located on'); when no pattern matches, `fallback` gives one by vi's domain ('named in' for a Person,
'referred to in' for a Building-Place, ...), all true of any link ("vi is <phrase> the article on v(i-1)").

`reference(relation, descriptor, previous, person)` renders the referring phrase the `rewrite` stage puts in
place of vi's name: 'the architect who designed {x}', 'the river that {x} is located on', and for a fallback
'the city mentioned in the article on {x}' ({x} = the reference to v(i-1), so nesting reads left to right).
"""

import bisect
import functools
import re

import numpy as np

from data_pipeline import entities

# Relation -> pattern over the folded words right before the anchor (the sentence up to the anchor), first match
# wins. Each relation reads "v(i-1) <relation> vi" ("Taj Mahal designed by Lahauri").
_PATTERNS = tuple((rel, re.compile(p + r'\s*$')) for rel, p in (
    ('designed by', r'\b(designed|planned|architected) by( the)?'),
    ('built by', r'\b(built|constructed|erected) by( the)?'),
    ('commissioned by', r'\b(commissioned|ordered) by( the)?'),
    ('founded by', r'\b(founded|established|co-founded) by( the)?'),
    ('written by', r'\b(written|authored|composed) by( the)?'),
    ('ruled by', r'\b(ruled|governed) by( the)?'),
    ('named after', r'\bnamed (after|for)( the)?'),
    ('born in', r'\bborn (in|at)( the)?'),
    ('died in', r'\bdied (in|at)( the)?'),
    ('located on', r'\b((located|situated|lies|lying|sits|stands|standing|built) on|on the (banks?|shores?) of)'
                   r'( the)?'),
    ('located in', r'\b(located|situated|lies|lying|stands|standing) (in|within)( the)?'),
    ('capital of', r'\bcapital (city )?of( the)?'),
    ('part of', r'\b(part|member) of( the)?'),
))
RELATIONS = tuple(rel for rel, _ in _PATTERNS)

# Relation -> referring template ({d} = vi's descriptor, {x} = the reference to v(i-1), {who} = who / that).
TEMPLATES: dict[str, str] = {
    'designed by': 'the {d} {who} designed {x}',
    'built by': 'the {d} {who} built {x}',
    'commissioned by': 'the {d} {who} commissioned {x}',
    'founded by': 'the {d} {who} founded {x}',
    'written by': 'the {d} {who} wrote {x}',
    'ruled by': 'the {d} {who} ruled {x}',
    'named after': 'the {d} that {x} is named after',
    'born in': 'the {d} where {x} was born',
    'died in': 'the {d} where {x} died',
    'located on': 'the {d} that {x} is located on',
    'located in': 'the {d} in which {x} is located',
    'capital of': 'the {d} whose capital is {x}',
    'part of': 'the {d} that {x} is part of',
}
# Domain (`wiki.DOMAINS`) -> fallback relation ("vi is <phrase> the article on v(i-1)"); '' = no domain.
FALLBACKS: dict[str, str] = {'Person': 'named in', 'Building-Place': 'referred to in', 'Location': 'mentioned in',
                             'Organism': 'described in', 'Artifact': 'cited in', '': 'mentioned in'}
FALLBACK_TEMPLATE = 'the {d} {rel} the article on {x}'
_SENTENCE_SPLIT = re.compile(r'(?<=[.!?])\s+(?=[A-Z0-9"\'(])|\n\s*\n')  # a line break alone is wrapping
_WINDOW = 8  # words before the anchor that the patterns see


def extract(anchor: str, sentence: str) -> str | None:
  """The relation phrase the sentence states between its article and the anchor's target, or None.

  Args:
    anchor: the link's displayed text, e.g. 'Ustad Ahmad Lahauri'.
    sentence: the sentence it sits in, e.g. 'The Taj Mahal was designed by Ustad Ahmad Lahauri.'.
  Returns:
    One of `RELATIONS` ('designed by'), read from the `_WINDOW` words right before the first occurrence of the
    anchor (case- and accent-folded); None when the anchor is not in the sentence or no pattern matches.
  """
  if not anchor or not sentence:
    return None
  hay = entities.fold(sentence)
  at = re.search(r'(?<!\w)' + re.escape(entities.fold(anchor)) + r'(?!\w)', hay)
  if at is None:
    return None
  before = ' '.join(re.sub(r'[^\w\s-]', ' ', hay[:at.start()]).split()[-_WINDOW:])
  for rel, pattern in _PATTERNS:
    if pattern.search(before):
      return rel
  return None


def fallback(domain: str) -> str:
  """The relation of a hop no pattern read, by the destination's domain (`FALLBACKS`; '' / unknown = 'mentioned
  in')."""
  return FALLBACKS.get(domain, FALLBACKS[''])


def relation(anchor: str, sentence: str, domain: str) -> str:
  """`extract`, else `fallback(domain)`."""
  return extract(anchor, sentence) or fallback(domain)


def reference(rel: str, descriptor: str, previous: str, person: bool = False) -> str:
  """The phrase that refers to vi through v(i-1).

  Args:
    rel: a `RELATIONS` entry or a `FALLBACKS` value.
    descriptor: vi's descriptor ('architect').
    previous: the reference to v(i-1) (a name or a nested phrase; `{E0}` placeholders pass through).
    person: vi is a person ('who' instead of 'that').
  Raises:
    ValueError: naming an unknown relation.
  """
  if rel in TEMPLATES:
    return TEMPLATES[rel].format(d=descriptor, x=previous, who='who' if person else 'that')
  if rel in FALLBACKS.values():
    return FALLBACK_TEMPLATE.format(d=descriptor, rel=rel, x=previous)
  raise ValueError(f'relation {rel!r}: expected one of {RELATIONS + tuple(sorted(set(FALLBACKS.values())))}')


@functools.lru_cache(maxsize=1024)
def _sentences(text: str) -> tuple[tuple[str, ...], str, tuple[int, ...]]:
  """(sentences, their folded forms joined by newlines, start offset of each in the joined text), memoised."""
  sentences = tuple(s for s in _SENTENCE_SPLIT.split(text) if s.strip())
  folded = [entities.fold(s).replace('\n', ' ') for s in sentences]
  starts = tuple(np.cumsum([0] + [len(f) + 1 for f in folded[:-1]]).tolist()) if folded else ()
  return sentences, '\n'.join(folded), starts


def mention_sentence(text: str, names) -> tuple[str, str]:
  """(anchor, sentence): the first sentence of `text` that names one of `names` as whole words (case- and
  accent-folded) and the name as it reads there (folded when folding changed the sentence's length); ('', '')
  when none does (Wikispeedia's links carry no anchor or sentence).

  Args:
    text: the source article's plain text.
    names: the destination's names (title, redirects); at the same place the longest wins.
  """
  if not text:
    return '', ''
  sentences, joined, starts = _sentences(text)
  best, found = len(joined), ''
  for n in sorted({entities.fold(n) for n in names if n}, key=len, reverse=True):
    at = _find_word(joined, n)
    if at >= 0 and at < best:
      best, found = at, n
  if not found:
    return '', ''
  k = bisect.bisect_right(starts, best) - 1
  sentence, at = sentences[k], best - starts[k]
  same = len(entities.fold(sentence)) == len(sentence)
  anchor = sentence[at:at + len(found)] if same else found
  return anchor, ' '.join(sentence.split())


def _find_word(hay: str, needle: str) -> int:
  """Offset of the first occurrence of `needle` in `hay` not inside a longer word (`str.find`, then the
  neighbouring characters checked), -1 when none."""
  at = hay.find(needle)
  while at >= 0:
    end = at + len(needle)
    if (at == 0 or not hay[at - 1].isalnum()) and (end == len(hay) or not hay[end].isalnum()):
      return at
    at = hay.find(needle, at + 1)
  return -1
