"""Every named entity a text mentions, counted and classed the way a reader sees them (issue 51; Eq. 6 (ii)).

`mentions.mention_counts` finds an article only where its full name stands. A reader sees more: "President
Eisenhower" twice beside "US President Jimmy Carter" once (Dwight D. Eisenhower, by his surname); "Galileo"
beside Carl Sagan; "the historian Jacob Burckhardt", named four times, who has no article; "a local instrument
called the cajón" beside the guitar. `read(text, graph)` gives every such mention (`Mention`):

  * article names: `mentions.mention_spans` (longest name wins a place);
  * name-like runs: capitalised words (particles and initials inside, quotes around a nickname allowed), split
    where an article's name stands, leading openers / demonyms / titles stripped ('US President', 'Soviet
    cosmonaut' ...: a title is class evidence), a possessive 's dropped, split before a known given name;
  * surname-only and title forms resolved to the full name the text gives ('Burckhardt' -> the text's 'Jacob
    Burckhardt'; 'Einstein' -> the text's Albert Einstein), else the corpus's (`short_forms.ShortForms`: a
    person article whose first or last name its own text uses alone: 'Eisenhower' -> Dwight_D._Eisenhower,
    'Galileo' -> Galileo_Galilei; several -> the one the source links to, else all of their classes);
  * class evidence of names without an article (`reader_lexicon`): appositives before ("the historian X",
    "novelists A, B and C", "instrument called the cajón") and after ("X, an Argentine writer", "X was the author
    of"), titles, and, for a person with none of these, the cue words of its sentences (`CUES`); a name classed
    so is also counted where the text writes it in lower case ('the cajon'); where a name stands
    (`reader_context`): a place word ('Horseshoe Falls'), a place around it ('in Puebla, Mexico'), a sentence on
    fiction ('Froggo' in an episode);
  * a name after '<thing or place word> of' is part of that thing's name ('Strait of Magellan': no mention of
    Ferdinand Magellan) or a place ('the state of Hidalgo': not Miguel Hidalgo); a first name alone counts for
    the text's person only when the corpus knows the person by it ('Galileo'; not 'Ferdinand', heir to a king,
    for Ferdinand Magellan);
  * prominence: places of the text that name the entity, its full and short forms together.

A run with no article, no class evidence and no person evidence is unclassified (`Mention.classes` empty): the
review lists those it could not class; the build's check counts only classed mentions.
"""

import bisect
import dataclasses
import re

from data_pipeline import classes, entities
from data_pipeline import mentions as mentions_lib
from data_pipeline import reader_context
from data_pipeline import reader_lexicon as lex


_WORD = re.compile(r"(?:[^\W\d_]\.){1,3}(?![^\W\d_])|[^\W\d_](?:[\w'’-]*[^\W_])?")
_SENTENCE = re.compile(r'(?<=[.!?])\s+(?=[A-Z0-9"\'(])|\n\s*\n|\n(?=[*+#•]\s)')   # a list item opens one
_NOUN_BEFORE = re.compile(r'(?<![\w-])(' + lex.noun_pattern() + r')(?![\w-])(?P<gap>[^.;()!?"]*)$', re.I)
_NOUN_AFTER = re.compile(r"^(?:,\s+(?:the|a|an)\s+|\s+(?:is|was)\s+(?:also\s+)?(?:the|a|an|one of the|"
                         r"[A-Z][\w'’.-]*['’]s)\s+)((?:[\w-]+\s+){0,4}?)(" + lex.noun_pattern() + r')(?![\w-])',
                         re.I)
_CALLED = re.compile(r'(?<![\w-])(' + lex.noun_pattern() + r')\s+(?:[—–]\s+)?(?:(?:later|also|now|locally|simply)\s+)?'
                     r'(?:called|named|known\s+as)\s+(?:the\s+)?'
                     r"([^\W\d_][\w'’-]*)", re.I)
_GAP_STOP = frozenset('the a an of in on to by with from for at as who which that whom whose is was were are had has '
                      'have be been his her their its this these when while after before not than'.split())
_LIST_GAP = re.compile(r'^(?:\s*,\s*(?:and\s+)?|\s+and\s+|\s*;\s*)$')
# A surname before these is the name of a thing ('the Nobel committee'), no mention of the person.
_ATTRIBUTIVE = re.compile(r'\s+(?:prizes?|committee|laureates?|awards?|medals?|foundation|institute|lectures?)\b')
_OF_GAP = re.compile(r'\s+of\s+(?:the\s+)?')
_WINDOW = 90  # characters before a run the appositive is looked for in
CUE_WINDOW = 60  # characters either side of a person's name its sentence cues are looked for in


@dataclasses.dataclass
class Mention:
  """One entity a text names.

  Attributes:
    key: the article's title, or '?Name' for an entity without one ('?Jacob Burckhardt').
    name: its fullest name in the text (or the title's display form).
    title: the article, None when it has none.
    count: the places of the text that name it (full, surname-only and title forms; lower case too for a
      classed name without an article).
    classes: descriptor phrases a reader may take it for (an article's: `classes.descriptors` + `competitor_phrases`;
      else from the evidence, with `BROADER` and, for a person, `BROAD_PERSON`); empty = unclassified.
    evidence: how it was classed / resolved ('article', 'appositive: historian', 'title: president', 'surname of
      Dwight_D._Eisenhower (corpus)', 'cue: x-rays', ...).
    sentence: the first sentence that names it.
    person: the text or the corpus marks it as a person.
    forms: the surface forms that named it.
    first: the offset of its first place; plain: a one-word name the text also writes in lower case (a common
      word opening a sentence, most likely).
  """
  key: str
  name: str
  title: str | None
  count: int = 0
  classes: frozenset = frozenset()
  evidence: list = dataclasses.field(default_factory=list)
  sentence: str = ''
  person: bool = False
  forms: list = dataclasses.field(default_factory=list)
  first: int = -1
  plain: bool = False


def _runs(text: str) -> list[list[tuple[int, int]]]:
  """Name-like runs: lists of word spans, capitalised words joined by spaces (a nickname's quotes allowed) with
  particles and initials inside."""
  words = [(m.start(), m.end()) for m in _WORD.finditer(text)]
  runs, cur = [], []
  for k, (a, b) in enumerate(words):
    w = text[a:b]
    cap = w[:1].isupper()
    particle = (w in lex.PARTICLES and cur and k + 1 < len(words) and text[words[k + 1][0]].isupper())
    gap = text[cur[-1][1]:a] if cur else ''
    joined = cur and len(gap) <= 3 and not gap.strip(' \n\'"‘’“”') and '\n\n' not in gap
    if (cap or particle) and (joined or not cur):
      cur.append((a, b))
    elif cap:
      runs.append(cur)
      cur = [(a, b)]
    else:
      if cur:
        runs.append(cur)
      cur = []
  if cur:
    runs.append(cur)
  return [[(a, b) for a, b in r] for r in runs if r]


def _strip(text: str, run: list[tuple[int, int]], given: frozenset) -> list[tuple[list, list[str]]]:
  """Pieces of one run: (word spans of a name, title words before it), openers / demonyms / titles stripped,
  split before a given name inside the run ('Command Module Pilot Michael Collins')."""
  pieces, titles, cur = [], [], []
  for a, b in run:
    w = text[a:b]
    f = entities.fold(w).rstrip('.')
    if not cur and (f in lex.OPENERS or f in lex.DEMONYMS or f in lex.TITLES or lex.noun_of(w)):
      titles.append(f)
      continue
    if (cur and f in given and not any(entities.fold(text[x:y]) in given for x, y in cur)
        and len(text[cur[-1][0]:cur[-1][1]].rstrip('.')) > 2):   # not after an initial ('H.J.P Arnold')
      pieces.append((cur, titles))
      cur, titles = [], [entities.fold(text[x:y]).rstrip('.') for x, y in cur]
    cur.append((a, b))
  while cur and entities.fold(text[cur[-1][0]:cur[-1][1]]) in lex.PARTICLES:
    cur.pop()
  if cur:
    pieces.append((cur, titles))
  return pieces


def _name(text: str, spans) -> str:
  words = [text[a:b] for a, b in spans]
  words[-1] = re.sub(r"['’]s?$", '', words[-1])
  return ' '.join(words)


def _sentence_at(text: str, starts: list[int], pos: int) -> str:
  k = bisect.bisect_right(starts, pos) - 1
  end = starts[k + 1] if k + 1 < len(starts) else len(text)
  return ' '.join(text[starts[k]:end].split())


def _noun_evidence(text: str, a: int, b: int) -> tuple[str, bool] | None:
  """(class noun, plural) of an appositive before [a, b) ('the historian ', 'novelists ', "1947 novel ") or after it
  (', an Argentine writer', ' was the author'), or None."""
  m = _NOUN_BEFORE.search(text[max(0, a - _WINDOW):a])
  if m:
    gap = m.group('gap')
    words = re.findall(r"[^\W\d_][\w'’-]*", gap)
    coordinated = re.fullmatch(r'\s*(?:,|and\b|&)[\s\w,&\'’-]*?:?\s*', gap) and len(words) <= 5 and not any(
        w.lower() in _GAP_STOP or w[:1].isupper() for w in words)
    if (not gap.strip(' \n:') or coordinated) and '\n\n' not in gap and lex.noun_of(m.group(1)):
      noun = lex.noun_of(m.group(1))
      return noun, m.group(1).lower().endswith('s') and not noun.endswith('s')
  m = _NOUN_AFTER.match(text[b:b + 120])
  if m and lex.noun_of(m.group(2)):
    return lex.noun_of(m.group(2)), False
  return None


def _person_shape(name: str, g, lower: set) -> bool:
  """Whether a name without an article can be a person's by its shape alone: 2-4 words, each capitalised then
  lower case (no acronym, digit or hyphen), none a word of things' names (`THING_WORDS`) or one the text also
  writes in lower case ('Economic Freedom', 'Armed Forces'), the last no other article's name ('Blue Marble')."""
  words = name.split()
  return (2 <= len(words) <= 4 and not any(entities.fold(w) in lower for w in words)
          and all(re.fullmatch(r"[^\W\d_][^\W\d_A-Z]+|(?:[^\W\d_]\.)+", w) for w in words)
          and _no_thing(name) and mentions_lib.name_key(words[-1]) not in g.alias_index)


def _no_thing(name: str) -> bool:
  """No word of `name` names a kind of thing (`THING_WORDS`) or is a function word ('U.S. For')."""
  return not any(entities.fold(w).rstrip('.') in lex.THING_WORDS or entities.fold(w) in lex.OPENERS
                 or entities.fold(w) in lex.DEMONYMS for w in name.split())


def read(text: str, g, src: str | None = None) -> dict[str, Mention]:
  """key -> `Mention` for every entity `text` names (module docstring).

  Args:
    text: an article's plain text or one sentence.
    g: the `wiki_graph.WikiGraph` (alias index, given names, class phrases, short forms, out-links).
    src: the article the text is from (its own name is read like any other; ambiguous short forms prefer the
      people it links to).
  """
  starts = [0] + [m.end() for m in _SENTENCE.finditer(text)]
  out: dict[str, Mention] = {}
  at: dict[int, tuple[Mention, int]] = {}   # start offset -> (mention, end offset) of each place a name stands

  def get(key, name, title):
    if key not in out:
      out[key] = Mention(key, name, title)
    return out[key]

  def place(m: Mention, a: int, form: str, why: str = '', end: int | None = None):
    m.count += 1
    at[a] = (m, a + len(form) if end is None else end)
    if m.first < 0 or a < m.first:
      m.first, m.sentence = a, _sentence_at(text, starts, a)
    if form not in m.forms:
      m.forms.append(form)
    if why and why not in m.evidence:
      m.evidence.append(why)

  taken = bytearray(len(text))
  for title, spans in mentions_lib.mention_spans(text, g.alias_index).items():
    m = get(title, entities.display(title), title)
    m.person = g.is_person(title)
    for a, b in spans:
      place(m, a, text[a:b], 'article')
      taken[a:b] = b'\x01' * (b - a)
      found = _noun_evidence(text, a, b) if m.person else None
      if found and found[0] in lex.PERSON_NOUNS and f'appositive: {found[0]}' not in m.evidence:
        m.evidence.append(f'appositive: {found[0]}')       # 'Soviet cosmonaut Yuri Gagarin'
        m.classes = m.classes | frozenset(lex.NOUNS[found[0]])
  pieces = []
  for run in _runs(text):
    free, cur = [], []
    for a, b in run:
      if any(taken[a:b]):
        free += [cur] if cur else []
        cur = []
      else:
        cur.append((a, b))
    free += [cur] if cur else []
    for part in free:   # a piece beside an article's name in one run ('Jerry' of 'Jerry Seinfeld') is no short form
      pieces += [(spans, titles, len(free) > 1 or len(part) < len(run))
                 for spans, titles in _strip(text, part, g.given_names)]
  pieces = _merge_of(text, pieces)
  # Pass 1: each piece's name and class evidence (titles, appositives, lists).
  read_pieces, list_class, prev_end = [], None, -1
  for spans, titles, fragment in pieces:
    a, b = spans[0][0], spans[-1][1]
    ev, phrases = [], set()
    for t in titles:
      if t in lex.TITLES:
        ev.append(f'title: {t}')
        phrases.update(lex.TITLES[t])
        if t == 'president' and any(u in titles for u in lex.US_WORDS):
          phrases.add('US president')
      elif lex.noun_of(t):
        ev.append(f'appositive: {lex.noun_of(t)}')
        phrases.update(lex.NOUNS[lex.noun_of(t)])
    found = _noun_evidence(text, a, b)
    if found:
      ev.append(f'appositive: {found[0]}')
      phrases.update(lex.NOUNS[found[0]])
      list_class = (found[0], set(lex.NOUNS[found[0]])) if found[1] else None
    elif list_class and _LIST_GAP.match(text[prev_end:a]):
      ev.append(f'appositive: {list_class[0]} (list)')
      phrases.update(list_class[1])
    else:
      list_class = None
    prev_end = b
    person = any(e.startswith('title') or lex.noun_of(e.split(': ')[1].split(' (')[0]) in lex.PERSON_NOUNS
                 for e in ev)
    read_pieces.append((spans, _name(text, spans), ev, phrases, person, fragment))
  # Pass 2: full names without an article, merged by last word when one's words hold the other's or both start
  # alike ('Buzz Aldrin', 'Edwin Buzz Aldrin', 'Edwin E. Aldrin'); a person by evidence, given name, initials.
  fulls: dict[str, list[str]] = {}
  is_person: dict[str, bool] = {}
  for spans, name, ev, phrases, person, _ in read_pieces:
    if len(spans) >= 2:
      names = fulls.setdefault(entities.fold(name.split()[-1]), [])
      names += [name] if name not in names else []
      is_person[name] = is_person.get(name, False) or person or (_no_thing(name) and (
          entities.fold(name.split()[0]) in g.given_names or bool(re.search(r'^(?:[^\W\d_]\.\s*)+\s[A-Z]', name))))
  lower = {entities.fold(w) for w in re.findall(r"(?<![\w'’-])[^\W\d_A-Z][\w'’-]*", text)}
  people_here = {}   # surname (or a first name the person goes by) -> the text's person article
  for t, mm in out.items():
    toks = g.short_forms.tokens(t) if mm.person else []
    for k, tok in enumerate(toks):
      if k or len(toks) == 1 or t in g.short_forms.people(tok):
        people_here[entities.fold(tok)] = t
  singles = {entities.fold(name) for spans, name, *_ in read_pieces if len(spans) == 1}
  canon = {}
  for last, names in fulls.items():
    for n in sorted(names, key=lambda x: -len(x.split())):
      canon[n] = next((c for c in names if canon.get(c) == c and (set(n.split()) <= set(c.split())
                                                                   or n.split()[0] == c.split()[0])), n)
    reused = last in singles and last not in people_here and not g.short_forms.people(names[0].split()[-1])
    for n in names:
      again = sum(1 for _, name, *_ in read_pieces if name == n) >= 2
      is_person[canon[n]] = is_person.get(canon[n], False) or is_person[n] or (
          (reused or again) and _person_shape(n, g, lower))
  # Pass 3: places, resolved (module docstring).
  for spans, name, ev, phrases, person, fragment in read_pieces:
    a, end = spans[0][0], spans[-1][1]
    tok = entities.fold(name)
    if len(spans) >= 2 and (full := g.short_forms.full_name(name)):   # 'Dwight Eisenhower'
      m = get(full, entities.display(full), full)
      place(m, a, name, f'other form of {full} (corpus)', end=end)
    elif len(spans) >= 2:
      home = canon[name]
      m = get('?' + home, home, None)
      place(m, a, name, end=end)
      m.person |= is_person[home]
    elif reader_context.place_of(text, a):           # 'the state of Hidalgo': a place, no person
      m = get('?' + name, name, None)
      place(m, a, name, end=end)
    elif tok in people_here:                         # 'Einstein' beside the text's Albert Einstein
      m = out[people_here[tok]]
      place(m, a, name, 'surname in the text', end=end)
    elif tok in fulls and (named := [n for n in fulls[tok] if is_person[canon[n]]]):
      home = canon[max(named, key=lambda n: len(n.split()))]   # 'Burckhardt': the text's Jacob Burckhardt
      m = get('?' + home, home, None)
      place(m, a, name, 'surname in the text', end=end)
      m.person = True
    elif (not fragment and name[:1].isupper() and len(name) >= 3 and not _ATTRIBUTIVE.match(text, spans[-1][1])
          and (people := g.short_forms.people(name))):
      linked = [t for t in people if src and t in g.out_links_set(src)]
      pick = linked if len(linked) == 1 else people
      if len(pick) == 1:                             # 'President Eisenhower', 'Galileo'
        m = get(pick[0], entities.display(pick[0]), pick[0])
        place(m, a, name, f'short form of {pick[0]} (corpus)', end=end)
      else:
        m = get('?' + name, name, None)
        place(m, a, name, 'short form of ' + ' / '.join(pick) + ' (corpus)', end=end)
        phrases = phrases | {p for t in pick for p in g.class_phrases(t)}
      m.person = True
    else:
      m = get('?' + name, name, None)
      place(m, a, name, end=end)
      m.person |= person
      m.plain = m.plain or (len(spans) == 1 and tok in lower)   # 'Construction' opening a sentence
    if m.person:   # a person takes no thing's class ('the novel Napoleon' is about him, he is no novel)
      ev = [e for e in ev if not lex.noun_of(e.split(': ')[1].split(' (')[0]) in lex.THING_NOUNS]
      phrases = {p for p in phrases if p in lex.PERSON_PHRASES}
    m.evidence += [e for e in ev if e not in m.evidence]
    m.classes = m.classes | frozenset(phrases)
  for c in _CALLED.finditer(text):                   # 'an instrument called the cajón'
    noun, word = lex.noun_of(c.group(1)), c.group(2)
    article, end = at.get(c.start(2), (None, 0))
    if (noun and article is not None and article.title and (noun in lex.PERSON_NOUNS) == article.person
            and not re.match(r"\s+[A-Z0-9]", text[end:end + 2])):   # not 'a team named Manchester United'
      # 'an alien planet — later named Krypton' (Superman's; Krypton's article is the element's): the text's class
      article.evidence += [f'named: {noun}'] if f'named: {noun}' not in article.evidence else []
      article.classes = article.classes | frozenset(lex.NOUNS[noun])
    elif noun and not any(taken[c.start(2):c.end(2)]) and entities.fold(word) not in lex.OPENERS:
      m = next((v for k, v in out.items() if v.title is None and entities.fold(v.name) == entities.fold(word)),
               None) or get('?' + word, word, None)
      m.evidence += [f'named: {noun}'] if f'named: {noun}' not in m.evidence else []
      m.classes = m.classes | frozenset(lex.NOUNS[noun])
      m.person |= noun in lex.PERSON_NOUNS
  _finish(text, starts, out, taken, g)
  reader_context.places(out, g, src)
  reader_context.nested_places(text, at, g, src)
  reader_context.fiction(out)
  return out


def _merge_of(text: str, pieces: list) -> list:
  """Pieces joined across '<thing or place word> of (the)': 'Strait' + 'Magellan' -> 'Strait of Magellan', the
  name of a thing, no mention of the person its last word names."""
  out = []
  for spans, titles, fragment in pieces:
    if out:
      prev, ptitles, pfragment = out[-1]
      gap = text[prev[-1][1]:spans[0][0]]
      head = entities.fold(text[prev[-1][0]:prev[-1][1]])
      if _OF_GAP.fullmatch(gap) and (head in lex.THING_WORDS | lex.PLACE_LAST
                                     or head.rstrip('s') in lex.THING_WORDS | lex.PLACE_LAST):
        mid = [(prev[-1][1] + w.start(), prev[-1][1] + w.end()) for w in _WORD.finditer(gap)]
        out[-1] = (prev + mid + spans, ptitles, pfragment or fragment)
        continue
    out.append((spans, titles, fragment))
  return out


def _finish(text: str, starts: list[int], out: dict[str, Mention], taken: bytearray, g) -> None:
  """Classes of the article mentions; lower-case places of classed non-person names; the cues near a person
  with no class noun or title (an article's person only when filed under no narrow person class: Yuri Gagarin,
  a 'historical figure', is an explorer beside 'the first human in space'; `CUE_WINDOW` characters either side,
  same sentence); `BROADER` / `BROAD_PERSON`."""
  runs = None
  for m in out.values():
    if m.title is not None:
      m.classes = m.classes | frozenset(g.class_phrases(m.title))
      if not m.person or m.classes & lex.NARROW_PERSON:   # only a person filed under a broad class is cued
        m.classes = m.classes | frozenset(b for p in m.classes for b in classes.BROADER.get(p, ()))
        continue
    if m.classes and not m.person and ' ' not in m.name:   # 'the cajon' beside 'the Cajon drum'
      runs = runs if runs is not None else entities.name_runs(text)
      m.count += sum(1 for a, b in runs.get(mentions_lib.name_key(m.name), ())
                     if not any(taken[a:b]) and not text[a].isupper())
    if m.person and not any(e.startswith(('appositive', 'named', 'title')) for e in m.evidence):
      for f in m.forms:
        for x in re.finditer(r'(?<![\w-])' + re.escape(f) + r'(?![\w-])', text):
          k = bisect.bisect_right(starts, x.start()) - 1
          lo, hi = max(starts[k], x.start() - CUE_WINDOW), x.end() + CUE_WINDOW
          hi = min(hi, starts[k + 1]) if k + 1 < len(starts) else hi
          for phrase, cue in lex.CUES.items():
            hit = cue.search(text, lo, hi)
            if hit and phrase not in m.classes:
              m.classes = m.classes | {phrase}
              m.evidence.append(f'cue: {hit.group(0).lower()} ({phrase})')
    if m.person:
      m.classes = m.classes | frozenset(classes.BROAD_PERSON)
    m.classes = m.classes | frozenset(b for p in m.classes for b in classes.BROADER.get(p, ()))


def classed(found: dict[str, Mention], phrase: str, exclude: str | None = None) -> list[Mention]:
  """The mentions of `phrase`'s class, most prominent first (key order among equals), `exclude` left out."""
  return sorted((m for k, m in found.items() if phrase in m.classes and k != exclude),
                key=lambda m: (-m.count, m.key))


def unclassified(found: dict[str, Mention], person: bool | None = None) -> list[Mention]:
  """The mentions without an article no evidence classed (people only when `person`), most prominent first."""
  return sorted((m for m in found.values() if m.title is None and not m.plain
                 and not (set(m.classes) - set(classes.BROAD_PERSON))
                 and (person is None or m.person == person)), key=lambda m: (-m.count, m.key))
