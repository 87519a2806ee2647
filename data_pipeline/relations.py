"""Relations between consecutive path nodes, read from the link's own anchor text and sentence (DESIGN.md §7.2).

A hop v(i-1) -> vi is a wikilink in the article on v(i-1): its anchor text and the sentence it sits in
(`wiki.Link`; Wikispeedia has neither, so `mention_sentence` finds the sentence of v(i-1)'s text that names vi).
`extract` reads the words just before the anchor in that sentence and returns a short relation phrase
("The Taj Mahal was designed by [Ustad Ahmad Lahauri]" -> 'designed by'; "Agra is located on the [Yamuna]" ->
'located on') when that clause is about v(i-1) (it starts with v(i-1)'s name, a pronoun or 'the <noun>', with no
relative word or other name: "..., which was then part of [X]" is no fact about v(i-1)) and the relation suits
v(i-1)'s domain; otherwise `fallback` gives one by vi's domain ('named in' for a Person,
'referred to in' for a Building-Place, ...), all true of any link ("vi is <phrase> the article on v(i-1)").

`reference(relation, descriptor, previous, person)` renders the referring phrase the `rewrite` stage puts in
place of vi's name: 'the architect who designed {x}', 'the river on which lies {x}', and for a fallback
'the city mentioned in the article on {x}' ({x} = the reference to v(i-1), always last, so nesting reads left to
right; `reading_error` checks it).
"""

import bisect
import functools
import re
import unicodedata

import numpy as np

from data_pipeline import entities
from data_pipeline import wiki

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
# Every template ends with {x} (right-branching: the chain reads left to right, one relative clause per hop; a
# centre-embedded 'the {d} that {x} is located on' turns into a garden path once {x} holds a clause itself,
# `reading_error`).
TEMPLATES: dict[str, str] = {
    'designed by': 'the {d} {who} designed {x}',
    'built by': 'the {d} {who} built {x}',
    'commissioned by': 'the {d} {who} commissioned {x}',
    'founded by': 'the {d} {who} founded {x}',
    'written by': 'the {d} {who} wrote {x}',
    'ruled by': 'the {d} {who} ruled {x}',
    'named after': 'the {d} that gave its name to {x}',
    'born in': 'the {d} that is the birthplace of {x}',
    'died in': 'the {d} that is the place of death of {x}',
    'located on': 'the {d} on which lies {x}',
    'located in': 'the {d} containing {x}',
    'capital of': 'the {d} whose capital is {x}',
    'part of': 'the {d} that includes {x}',
}
# Domain (`wiki.DOMAINS`) -> fallback relation ("vi is <phrase> the article on v(i-1)"); '' = no domain.
FALLBACKS: dict[str, str] = {'Person': 'named in', 'Building-Place': 'referred to in', 'Location': 'mentioned in',
                             'Organism': 'described in', 'Artifact': 'cited in', '': 'mentioned in'}
FALLBACK_TEMPLATE = 'the {d} {rel} the article on {x}'
# The relation of a hop whose destination is not the only one of its class the source's text names but is named
# far more often than any other (`WikiGraph.referent_check`): "the chemical element mentioned most often in ...".
MOST_OFTEN = 'mentioned most often in'
_RELATIVE_WORDS = re.compile(r'\b(?:who|whom|that|which|whose|where)\b')
_SENTENCE_SPLIT = re.compile(r'(?<=[.!?])\s+(?=[A-Z0-9"\'(])|\n\s*\n')  # a line break alone is wrapping
_WINDOW = 8  # words before the anchor that the patterns see
# The clause `extract` checks starts after the last of these; words that make it about another entity; words it
# may start with besides a name of v(i-1) ('the city was ...', 'it lies on ...').
_CLAUSE_BREAK = re.compile(r'[,;:()\[\]]')
_RELATIVE = frozenset('which that who whom whose where when now whereas while'.split())
_SUBJECT_OPENERS = frozenset('the a an this it its he his she her they their'.split())
# Relation -> domains of v(i-1) it cannot hold for (a person is not 'part of' anything, an organism not 'located').
_SUBJECT_DOMAINS: dict[str, tuple[str, ...]] = {
    **{rel: ('Person', 'Organism') for rel in ('located on', 'located in', 'capital of', 'part of')},
    **{rel: ('Organism',) for rel in ('designed by', 'built by', 'commissioned by', 'founded by', 'written by')},
    **{rel: tuple(d for d in wiki.DOMAINS if d != 'Person') for rel in ('born in', 'died in')},
}


def extract(anchor: str, sentence: str, subject=(), subject_domain: str = '') -> str | None:
  """The relation phrase the sentence states between its article's topic v(i-1) and the anchor's target, or None.

  A pattern (`_PATTERNS`) must end right before the first occurrence of the anchor, within `_WINDOW` words, and
  its clause must be about v(i-1) (`_about_subject`): the clause (after the last ',', ';', ':', '(' or ')' before
  the pattern) holds no relative word (`_RELATIVE`: 'which', 'that', 'now', ...), starts with a name of v(i-1), a
  pronoun or a determiner ('the city'), or is empty at the sentence start ('Designed by X, it ...'), and every
  capitalised word in it belongs to a name of v(i-1). "... Algiers in 1541, which was then part of the Ottoman
  Empire" is no fact about Cortés. The relation must also suit v(i-1)'s domain (`_SUBJECT_DOMAINS`: no 'part of'
  for a Person).

  Args:
    anchor: the link's displayed text, e.g. 'Ustad Ahmad Lahauri'.
    sentence: the sentence it sits in, e.g. 'The Taj Mahal was designed by Ustad Ahmad Lahauri.'.
    subject: names of v(i-1) (`WikiGraph.aliases`), e.g. ('Taj Mahal',).
    subject_domain: v(i-1)'s domain (`wiki.DOMAINS` entry, '' = none).
  Returns:
    One of `RELATIONS` ('designed by'); None when the anchor is not in the sentence, no pattern matches, the
    clause is not about v(i-1), or the relation does not suit its domain.
  """
  if not anchor or not sentence:
    return None
  cased = _strip_accents(sentence)
  hay = cased.lower() if len(cased.lower()) == len(cased) else entities.fold(sentence)
  at = re.search(r'(?<!\w)' + re.escape(entities.fold(anchor)) + r'(?!\w)', hay)
  if at is None:
    return None
  words = list(re.finditer(r'\S+', re.sub(r'[^\w\s-]', ' ', hay[:at.start()])))[-_WINDOW:]
  before = ' '.join(w.group() for w in words)
  for rel, pattern in _PATTERNS:
    got = pattern.search(before)
    if got is None:
      continue
    if subject_domain in _SUBJECT_DOMAINS.get(rel, ()):
      return None
    start = words[len(before[:got.start()].split())].start()
    return rel if _about_subject(cased[:start] if len(hay) == len(cased) else hay[:start], subject) else None
  return None


def _strip_accents(text: str) -> str:
  """`text` without diacritics, case kept ('São Paulo' -> 'Sao Paulo'; `entities.fold` less the lower-casing)."""
  if text.isascii():
    return text
  return ''.join(c for c in unicodedata.normalize('NFKD', text) if not unicodedata.combining(c))


def _about_subject(prefix: str, subject) -> bool:
  """Whether the clause of `prefix` (the sentence up to the relation pattern) is about the entity named
  `subject` (the rule in `extract`)."""
  parts = _CLAUSE_BREAK.split(prefix)
  words = re.findall(r'[^\W_]+', parts[-1])
  if not words:
    return len(parts) == 1  # pattern at the sentence start: 'Designed by X, it ...'
  folded = [entities.fold(w) for w in words]
  if any(w in _RELATIVE for w in folded):
    return False
  names = {t for n in subject for t in entities.name_tokens(n)}
  if folded[0] not in names and folded[0] not in _SUBJECT_OPENERS:
    return False
  rest = words[1:] if folded[0] in _SUBJECT_OPENERS else words
  return all(entities.fold(w) in names for w in rest if w[0].isupper())


def fallback(domain: str) -> str:
  """The relation of a hop no pattern read, by the destination's domain (`FALLBACKS`; '' / unknown = 'mentioned
  in')."""
  return FALLBACKS.get(domain, FALLBACKS[''])


def relation(anchor: str, sentence: str, domain: str, subject=(), subject_domain: str = '') -> str:
  """`extract(anchor, sentence, subject, subject_domain)`, else `fallback(domain)` (domain = vi's)."""
  return extract(anchor, sentence, subject, subject_domain) or fallback(domain)


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
  if rel in FALLBACKS.values() or rel == MOST_OFTEN:
    return FALLBACK_TEMPLATE.format(d=descriptor, rel=rel, x=previous)
  raise ValueError(f'relation {rel!r}: expected one of '
                   f'{RELATIONS + tuple(sorted(set(FALLBACKS.values()))) + (MOST_OFTEN,)}')


def reading_error(ref: str, previous: str) -> str | None:
  """Why the hop's reference `ref` (`reference(...)`, built around `previous`) reads badly, or None.

  The rule the builder checks (readable questions): the previous reference comes last (right-branching, so a
  reader resolves the chain left to right; 'the Asian place that {x} is located on' with {x} = 'the Middle
  Eastern place mentioned in the article on ...' is a garden path), the hop adds at most one relative clause
  (who / that / which / whose / where) of its own, and its descriptor is one class, never 'X or Y'.
  """
  if not ref.endswith(previous):
    return 'garden path (the previous reference is embedded, not last)'
  own = ref[:len(ref) - len(previous)]
  if len(_RELATIVE_WORDS.findall(own)) > 1:
    return 'more than one relative clause in a hop'
  if ' or ' in f' {own} ':
    return "an 'X or Y' descriptor"
  return None


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
