"""Classes of names without an article read from where they stand (`reader.read`'s last step, issue 51).

A reader takes a name for a place or a character from its words and its neighbours, article or not:

  * `places`: a place word ends or opens the name ('Horseshoe Falls', 'Lake Erie', 'Strait of Magellan'): a
    place of the source's own region ('North American place' in the article on Niagara Falls), and a landform
    for 'geographic feature';
  * `nested_places`: a name placed inside an article's place ("the Great Pyramid of Cholula in Puebla, Mexico",
    "Stonehenge Aotearoa in the Wairarapa region of New Zealand") is a place of that place's regional classes
    (Puebla competes with Mexico for 'North American place'); a name a district noun follows with no place
    after it ("the Wairarapa region"), or a lower-case place noun and 'of' precede ("the state of Hidalgo", no
    mention of Miguel Hidalgo), is a place of the source's region;
  * `fiction`: a name whose sentence speaks of fiction ("In the Histeria! episode ..., Froggo is shown",
    "In the Cartoon series Futurama ... by Fry and Bender") may be a fictional character.
"""

import re

from data_pipeline import classes, entities
from data_pipeline import reader_lexicon as lex

_DISTRICT = r'(?:region|province|district|county|department|prefecture|municipality|governorate|oblast)'
_PLACE_NOUN = (r'(?:' + _DISTRICT[3:-1] + r'|state|city|town|village|area|' + '|'.join(sorted(lex.LANDFORMS))
               + r')')
_BEFORE = re.compile(r'(?<![\w-])(?:in|at|near|from|outside|around|of|to)\s+(?:the\s+)?$', re.I)
_OUTER = re.compile(r',\s+|\s+' + _PLACE_NOUN + r'\s+of\s+(?:the\s+)?')
_DISTRICT_AFTER = re.compile(r'\s+' + _DISTRICT + r'\b')
_PLACE_OF = re.compile(r'(?<![\w-])' + _PLACE_NOUN + r's?\s+of\s+(?:the\s+)?$')   # lower case: 'the state of'
FICTION_WINDOW = 120  # characters between a name and the nearest fiction word of its sentence
FICTION = re.compile(r'\b(?:episodes?|series|cartoons?|sitcoms?|comics?|animated|animation|characters?|'
                     r'superhero(?:es)?|movies?|films?|novels?|video games?|television|tv)\b', re.I)


def place_of(text: str, a: int) -> bool:
  """Whether the name at offset `a` follows a lower-case place noun and 'of' ('the state of Hidalgo', 'the city
  of Valdivia'): the name of a place, not of the person who shares it."""
  return bool(_PLACE_OF.search(text, max(0, a - 40), a))


def place_phrases(g, title: str | None) -> frozenset[str]:
  """The regional place classes of `title` ('North American place', 'place in Oceania'); empty for None."""
  return frozenset(p for p in g.class_phrases(title) if p.endswith(' place') or p.startswith('place in')
                   ) if title else frozenset()


def _add(m, phrases, why: str) -> None:
  if phrases and not phrases <= m.classes:
    m.classes = m.classes | frozenset(phrases)
    m.evidence.append(f"{why} ({', '.join(sorted(phrases))})")


def places(out: dict, g, src: str | None) -> None:
  """Names without an article that a place word ends or opens, or that open '<place word> of'
  ('Strait of Magellan'), are places of `src`'s own region (module docstring)."""
  region = place_phrases(g, src)
  for m in out.values():
    words = [entities.fold(w) for w in m.name.split()]
    if m.title is not None or m.person or len(words) < 2 or m.classes:
      continue
    first = words[0] in lex.PLACE_FIRST or (words[0] in lex.PLACE_LAST and words[1] == 'of')
    if words[-1] in lex.PLACE_LAST or first:
      land = words[-1] in lex.LANDFORMS or first and words[0] in lex.LANDFORMS | lex.PLACE_FIRST
      _add(m, region | ({'geographic feature'} if land else set()),
           f"place word: {m.name.split()[0 if first else -1]}")


def nested_places(text: str, at: dict, g, src: str | None) -> None:
  """Names without an article placed inside an article's place: "in Puebla, Mexico", "the Wairarapa region of
  New Zealand" (module docstring).

  Args:
    text: the text read; at: start offset -> (`reader.Mention`, end offset) of every place a name stands;
    g: the `wiki_graph.WikiGraph`; src: the article the text is from.
  """
  for a, (m, b) in sorted(at.items(), key=lambda kv: kv[0]):
    if m.title is not None or m.person:
      continue
    o = _OUTER.match(text, b)
    outer = at.get(o.end()) if o else None
    if outer and outer[0].title and (o.group(0).strip() != ',' or _BEFORE.search(text, max(0, a - 16), a)):
      _add(m, place_phrases(g, outer[0].title), f'place in {outer[0].name}')
    elif _DISTRICT_AFTER.match(text, b):
      _add(m, place_phrases(g, src), f'place noun: {_DISTRICT_AFTER.match(text, b).group(0).strip()}')
    elif place_of(text, a):
      _add(m, place_phrases(g, src), f"place noun: {_PLACE_OF.search(text, max(0, a - 40), a).group(0).strip()}")


def fiction(out: dict) -> None:
  """Names without an article and without a narrow class whose first sentence speaks of fiction (`FICTION`, a
  word within `FICTION_WINDOW` characters of the name) may be fictional characters (module docstring)."""
  for m in out.values():
    if (m.title is None and not m.plain and not (m.classes - set(classes.BROAD_PERSON))
        and not FICTION.fullmatch(m.name) and not re.fullmatch(r'[IVXLC]+', m.name)):   # 'Superman III'
      pos = max(0, m.sentence.find(m.forms[0] if m.forms else m.name))   # a name read only by 'called X': no form
      hits = sorted(FICTION.finditer(m.sentence), key=lambda h: min(abs(h.start() - pos), abs(h.end() - pos)))
      if hits and min(abs(hits[0].start() - pos), abs(hits[0].end() - pos)) <= FICTION_WINDOW:
        _add(m, {'fictional character'}, f'cue: {hits[0].group(0).lower()}')
