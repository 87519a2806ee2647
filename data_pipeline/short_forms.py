"""Surname-only and first-name forms of the person articles, for the reader's resolution (`reader.py`): which
person a lone 'Eisenhower' or 'Galileo' names, read from the people's own articles."""

import functools
import re

from data_pipeline import entities
from data_pipeline import reader_lexicon as lex


class ShortForms:
  """Surname-only / first-name forms of the person articles: 'eisenhower' -> ('Dwight_D._Eisenhower',).

  A person's last name, or a first name no other person's title starts with (display title without its
  parenthetical, no particle, >= 3 letters; a title with ' of ' ('Louis XIV of France') by its first name only),
  is a short form when the person's own text uses it
  alone, capitalised, at least `MIN_OWN_USES` times (a first name: and more often than the last name, 'Galileo'
  in Galileo Galilei's text, not 'Jerry' in Jerry Fodor's).
  """
  MIN_OWN_USES = 3

  def __init__(self, people: list[str], text_of):
    self.text_of = text_of
    self.index: dict[str, list[str]] = {}
    firsts: dict[str, list[str]] = {}
    for title in people:
      toks = self.tokens(title)
      if toks:
        firsts.setdefault(entities.fold(toks[0]), []).append(title)
      for tok in toks[1:]:
        self.index.setdefault(entities.fold(tok), []).append(title)
    for tok, titles in firsts.items():   # a first name is a short form of one person only ('Galileo')
      if len(titles) == 1:
        self.index.setdefault(tok, []).append(titles[0])

  @staticmethod
  def tokens(title: str) -> list[str]:
    words = re.sub(r'\s*\([^)]*\)\s*$', '', entities.display(title)).replace(',', ' ').split()
    words = [w for w in words if w.lower() not in lex.PARTICLES and not re.fullmatch(r'[IVXL]+\.?|Jr\.?|Sr\.?', w)]
    if len(words) < 2:
      return []
    out = [words[0]] if ' of ' in entities.display(title) else [words[0], words[-1]]
    return [w for w in out if len(w) >= 3 and not w.endswith('.') and w.lower() not in lex.OPENERS]

  @functools.lru_cache(maxsize=None)
  def own_uses(self, title: str, token: str) -> int:
    """Capitalised places where `title`'s own text uses `token` with no other word of the title beside it."""
    others = {entities.fold(w) for w in entities.display(title).split()} - {entities.fold(token)}
    text, n = self.text_of(title), 0
    for m in re.finditer(r'(?<![\w-])' + re.escape(token) + r"(?![\w-])", text):
      before = re.findall(r"[\w.'’-]+", text[max(0, m.start() - 30):m.start()])[-1:]
      after = re.findall(r"[\w.'’-]+", text[m.end():m.end() + 30])[:1]
      if not ({entities.fold(w) for w in before + after} & others):
        n += 1
    return n

  def full_name(self, name: str) -> str | None:
    """The one person article whose first and last names `name` has ('Dwight Eisenhower' ->
    'Dwight_D._Eisenhower'), or None."""
    words = name.split()
    found = [t for t in self.index.get(entities.fold(words[-1]), ())
             if entities.fold(entities.display(t).split()[0]) == entities.fold(words[0])]
    return found[0] if len(found) == 1 else None

  def people(self, token: str) -> list[str]:
    """The person articles `token` (a capitalised word) is a short form of."""
    token = token if token[:1].isupper() else token.title()
    out = []
    for t in self.index.get(entities.fold(token), ()):
      toks = self.tokens(t)
      first = len(toks) == 2 and entities.fold(toks[0]) == entities.fold(token)
      uses = self.own_uses(t, token)
      if uses >= self.MIN_OWN_USES and (not first or uses > self.own_uses(t, toks[1])):
        out.append(t)   # a first name only when the person's text calls him so more than by the last name
    return out
