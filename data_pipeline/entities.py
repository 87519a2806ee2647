"""Entity helpers shared by the stages: names and aliases, infobox attributes.

Everything here is a pure function of a title, a text or category paths (the `wiki_graph.WikiGraph` view calls
these per node, for Wikispeedia and XML articles alike).

Names and aliases (Wikispeedia has no redirect table, so aliases are derived from the title):
  * the display title (`Great_Wall_of_China` -> `Great Wall of China`);
  * the title without a trailing disambiguation in parentheses (`Mercury_(planet)` -> `Mercury`);
  * the accent-folded forms of both (`Éire` -> `Eire`).

Descriptors (the class an entity is referred to by) are `classes.py`'s: category + evidence from the text.

Infobox attributes: the Wikispeedia plaintext keeps each infobox as `Key  value` lines above the prose
(`Capital\n(and largest city)  Maseru`, `Born  March 14, 1879`). `infobox_attributes` reads a whitelist of
keys whose values can be extracted reliably as a short answer (at most 6 whitespace tokens).
"""

import dataclasses
import functools
import re
import unicodedata

# Key regex -> attribute definition. Order = preference when a node has several.
@dataclasses.dataclass(frozen=True)
class AttributeSpec:
  """One answerable infobox attribute.

  Attributes:
    name: attribute id, e.g. `capital`.
    key: regex matching the infobox key at the start of a line.
    kind: `name` (a short text value without digits), `year` (a year, optionally `BC`), or `regex`.
    question: template with `{}` for the entity reference, e.g. `what is the capital of {}?` (the entity comes last, so nested
      descriptors read left to right).
    pattern: for kind `regex`, the value pattern.
    category: when set, only articles with a category path starting with it have this attribute (the key
      `Country` also appears in film and book infoboxes, where the question would read oddly).
    answer_type: the type an accepted answer must be a well-formed value of (`qa.ANSWER_VALIDATORS`): `place`,
      `person`, `currency`, `name`, `year`, `calling_code`, `tld`.
  """
  name: str
  key: str
  kind: str
  question: str
  pattern: str = ''
  category: str = ''
  answer_type: str = 'name'


ATTRIBUTES: tuple[AttributeSpec, ...] = (
    AttributeSpec('capital', r'Capital', 'name', 'what is the capital of {}?', answer_type='place'),
    AttributeSpec('currency', r'Currency', 'name', 'what is the currency of {}?', answer_type='currency'),
    AttributeSpec('author', r'Author', 'name', 'who is the author of {}?', answer_type='person'),
    AttributeSpec('largest_city', r'Largest city', 'name', 'what is the largest city of {}?', answer_type='place'),
    AttributeSpec('constellation', r'Constellation', 'name', 'which constellation contains {}?'),
    AttributeSpec('country', r'Country', 'name', 'which country contains {}?',
                  category='subject.Geography', answer_type='place'),
    AttributeSpec('born', r'Born', 'year', 'what is the birth year of {}?', answer_type='year'),
    AttributeSpec('died', r'Died', 'year', 'what is the year of death of {}?', answer_type='year'),
    AttributeSpec('founded', r'Founded', 'year', 'what is the founding year of {}?', answer_type='year'),
    AttributeSpec('calling_code', r'Calling code', 'regex', 'what is the international calling code of {}?',
                  r'\+\s?\d{1,4}', answer_type='calling_code'),
    AttributeSpec('tld', r'Internet TLD', 'regex', 'what is the internet country-code domain of {}?',
                  r'\.[a-z]{2,3}\b', answer_type='tld'),
)
ATTRIBUTE_BY_NAME = {a.name: a for a in ATTRIBUTES}

MAX_ANSWER_TOKENS = 6
_INFOBOX_MAX_LINES = 150


def fold(text: str) -> str:
  """Accent-folded, lower-cased text (`Éire` -> `eire`) for name matching."""
  if text.isascii():
    return text.lower()
  norm = unicodedata.normalize('NFKD', text)
  return ''.join(c for c in norm if not unicodedata.combining(c)).lower()


def display(title: str) -> str:
  """`Great_Wall_of_China` -> `Great Wall of China`."""
  return title.replace('_', ' ')


def aliases(title: str) -> list[str]:
  """Surface names of an article: display title, title without `(disambiguation)`, accent-folded forms.

  Args:
    title: Wikispeedia title, e.g. `Mercury_(planet)`.
  Returns:
    Distinct names, the display title first (case kept).
  """
  base = display(title)
  names = [base, re.sub(r'\s*\([^)]*\)\s*$', '', base)]
  names += [unicodedata.normalize('NFKD', n).encode('ascii', 'ignore').decode() for n in names]
  out = []
  for n in names:
    n = n.strip()
    if n and n not in out:
      out.append(n)
  return out


def name_tokens(text: str) -> list[str]:
  """Folded word tokens of a name or a text: accents and case folded, `&` read as `and`, any other punctuation a
  break (`St. Louis` -> ['st', 'louis'], `AT&T` -> ['at', 'and', 't'], `São Paulo` -> ['sao', 'paulo'])."""
  return re.findall(r'[^\W_]+', fold(text).replace('&', ' and '))


MAX_NAME_TOKENS = 8  # longest token run the name matcher compares


def _word_spans(text: str) -> list[tuple[int, int]]:
  """Character spans [start, end) of the words of `text`: runs of letters / digits and combining marks (so a
  decomposed 'São' — 'a' + U+0303 — is one word, as its folded form is), and each '&' alone."""
  spans, start = [], None
  for i, c in enumerate(text):
    inside = c.isalnum() or (start is not None and unicodedata.combining(c))
    if start is not None and not inside:
      spans.append((start, i))
      start = None
    if c == '&':
      spans.append((i, i + 1))
    elif inside and start is None:
      start = i
  if start is not None:
    spans.append((start, len(text)))
  return spans


def name_runs(text: str) -> dict[str, list[tuple[int, int]]]:
  """Every run of at most `MAX_NAME_TOKENS` consecutive words of `text` (`_word_spans`), keyed by its
  folded tokens joined without spaces (`name_tokens` of each token), -> its character spans [start, end)."""
  toks = [(a, b, ''.join(name_tokens(text[a:b]))) for a, b in _word_spans(text)]
  runs: dict[str, list[tuple[int, int]]] = {}
  for i in range(len(toks)):
    key = ''
    for j in range(i, min(i + MAX_NAME_TOKENS, len(toks))):
      key += toks[j][2]
      if key:
        runs.setdefault(key, []).append((toks[i][0], toks[j][1]))
  return runs


def names_in_text(text: str, names) -> list[str]:
  """The names of `names` that occur in `text` up to case, diacritics, punctuation and spacing (Eq. 6 (iii)).

  A name occurs when its tokens (`name_tokens`) joined without spaces equal the joined folded tokens of a run of
  at most `MAX_NAME_TOKENS` consecutive tokens of the text: 'Sao Paulo' is found in 'the São Paulo metro',
  'St Louis' in 'St. Louis', 'AT&T' in 'AT & T', 'Beijing' in 'Bei jing', 'Taj Mahal' in "the Taj Mahal's dome";
  a name is never found inside a longer word ('Ur' is not in 'Uruguay'). The same matcher as `name_spans`.

  Args:
    text: the question (any string).
    names: candidate names (titles, redirects, aliases).
  Returns:
    The names found, in the order given.
  """
  runs = name_runs(text)
  return [n for n in names if ''.join(name_tokens(n)) in runs]


def name_spans(text: str, names) -> list[tuple[int, int]]:
  """Character spans [start, end) of `text` where one of `names` occurs (the rule of `names_in_text`), longest
  first and non-overlapping, in text order: 'the eiffel tower' in 'Who designed the eiffel tower?' for the name
  'Eiffel Tower' -> [(17, 29)].

  Args:
    text: the question (any string).
    names: candidate names (`WikiGraph.aliases`).
  """
  runs = name_runs(text)
  found = [span for n in names for span in runs.get(''.join(name_tokens(n)), ())]
  spans: list[tuple[int, int]] = []
  for a, b in sorted(set(found), key=lambda ab: (ab[0] - ab[1], ab[0])):
    if all(b <= c or a >= d for c, d in spans):
      spans.append((a, b))
  return sorted(spans)


_YEARLIKE = re.compile(r'^(\d+(s|th|st|nd|rd)?(_century)?(_BC)?|\d+s_\w+|January|February|March|April|May|June|'
                       r'July|August|September|October|November|December)$')


def is_excluded(title: str) -> bool:
  """Titles the walks never visit: lists, years/decades/centuries, month names (calendar hubs)."""
  return title.startswith('List_of_') or bool(_YEARLIKE.match(title))


def infobox_lines(text: str) -> list[str]:
  """Lines above the first prose paragraph (two consecutive lines of >= 60 characters not starting with `^`)."""
  lines = text.split('\n')[:_INFOBOX_MAX_LINES]
  for i in range(len(lines) - 1):
    a, b = lines[i], lines[i + 1]
    if len(a) >= 60 and len(b) >= 60 and not a.startswith('^'):
      return lines[:i]
  return lines


def _clean_value(value: str) -> str:
  value = re.sub(r'\^(\[[^\]]*\]|\w+)', '', value)  # Footnote markers ^1, ^[a].
  if value.startswith('Flag of '):  # `Flag of United States United States` (flag icon caption + name).
    words = value[len('Flag of '):].split()
    half = len(words) // 2
    value = ' '.join(words[half:]) if len(words) % 2 == 0 and words[:half] == words[half:] else ''
  value = re.sub(r'\[[^\]]*\]', '', value)
  value = re.sub(r'\s+', ' ', value).strip(' ,;:')
  words = value.split()
  if len(words) % 2 == 0 and words[:len(words) // 2] == words[len(words) // 2:]:
    value = ' '.join(words[:len(words) // 2])  # `Italy Italy` (a flag icon's caption + the name).
  return value


def _extract(spec: AttributeSpec, raw: str) -> tuple[str, list[str]] | None:
  """(answer, aliases) from the raw infobox value, or None when not short and clean."""
  raw = _clean_value(raw)
  raw = re.sub(r'^\(?and largest city\)?\s*', '', raw)
  if not raw:
    return None
  if spec.kind == 'year':
    m = re.search(r'\b(\d{3,4})(\s*BC\b)?', raw)
    if not m:
      return None
    year = m.group(1) + (' BC' if m.group(2) else '')
    date = re.sub(r'\s*\(.*$', '', raw).strip(' ,')
    extra = [date] if re.fullmatch(r'[A-Za-z]+ \d{1,2}, \d{3,4}|\d{1,2} [A-Za-z]+ \d{3,4}', date) else []
    return year, extra
  if spec.kind == 'regex':
    m = re.search(spec.pattern, raw)
    if not m:
      return None
    val = m.group(0).replace(' ', '')
    return val, ([val.lstrip('+')] if val.startswith('+') and len(val) >= 4 else [])
  # kind == 'name': first comma/semicolon/slash segment, parenthetical dropped (kept as alias).
  seg = re.split(r'[,;/]| or ', raw)[0].strip()
  paren = re.findall(r'\(\s*([^)]*?)\s*\)', seg)
  main = re.sub(r'\s*\([^)]*\)?', '', seg).strip(' .')
  if (len(main) < 2 or not re.fullmatch(r"[\w .'ʻ-]+", main) or re.search(r'\d', main)
      or len(main.split()) > MAX_ANSWER_TOKENS):
    return None
  if not re.match(r'^[^\W\d_]', main):
    return None
  if main.lower() in ('none', 'n/a', 'unknown', 'various', 'see below', 'disputed', 'de facto'):
    return None
  alts = [p for p in paren if len(p) >= 2 and re.match(r'^[^\W\d_]', p) and p.lower() not in ('arabic',)
          and len(p.split()) <= MAX_ANSWER_TOKENS]
  return main, alts


def infobox_attributes(text: str, categories: list[str] | None = None) -> dict[str, dict]:
  """Answerable infobox attributes of one article.

  Args:
    text: cleaned article text (`WikiCorpus.text`), lines stripped.
    categories: the article's category paths; attributes with a `category` gate are skipped when None.
  Returns:
    attribute name -> {'answer': str, 'aliases': list[str], 'line': the source line}, in `ATTRIBUTES` order.
  """
  lines = infobox_lines(text)
  found = {}
  for spec in ATTRIBUTES:
    if spec.category and not any(c.startswith(spec.category) for c in categories or ()):
      continue
    key = re.compile(r'^(?:- )?' + spec.key + r'(?:\s*\(\d{4}\))?(?=\s|$)(.*)$')
    for i, line in enumerate(lines):
      m = key.match(line)
      if not m:
        continue
      raw = m.group(1).strip()
      if not raw or re.fullmatch(r'\(?and largest city\)?', raw):
        # Only the `Capital\n(and largest city)  Maseru` layout continues on the next line; other empty keys
        # belong to column-wise tables whose next line is another key (`Country\nDistrict\n...`).
        nxt = lines[i + 1] if i + 1 < len(lines) else ''
        raw = nxt if re.match(r'^\(?and largest city\)?\s+\S', nxt) else ''
      got = _extract(spec, raw)
      if got is not None:
        answer, alts = got
        found[spec.name] = {'answer': answer, 'aliases': [a for a in dict.fromkeys(alts) if a != answer],
                            'line': line if raw == m.group(1).strip() else line + ' / ' + raw}
      break
  return found


@functools.lru_cache(maxsize=None)
def _title_word_df(titles: tuple[str, ...]) -> dict[str, int]:
  df = {}
  for t in titles:
    for w in set(re.findall(r'[^\W_]+', fold(display(t)))):
      df[w] = df.get(w, 0) + 1
  return df


STOPWORDS = frozenset('the of and in on at to for a an de la le du des del von van der den by from with its'.split())


def distinctive_words(title: str, all_titles: tuple[str, ...], max_df: int = 3) -> list[str]:
  """Words of a title that identify it on their own (used by the leakage check).

  Rule: a folded word of the display title (without the parenthetical) that is at least 3 letters long, not a
  stopword, and occurs in at most `max_df` of the corpus titles (`Mahal`, `Agra`, `Pradesh`; not `River`,
  `Great`, `United`).
  """
  df = _title_word_df(all_titles)
  base = fold(aliases(title)[-1] if len(aliases(title)) > 1 else display(title))
  base = re.sub(r'\s*\([^)]*\)\s*$', '', base)
  words = re.findall(r'[^\W_]+', base)
  if len(words) <= 1:
    return []  # The whole-name match already covers one-word titles.
  return [w for w in dict.fromkeys(words)
          if len(w) >= 3 and w not in STOPWORDS and not w.isdigit() and df.get(w, 0) <= max_df]
