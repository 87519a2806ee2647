"""Classes of a person read from the person's own article, beside its Wikispeedia category (issue 51).

`categories.tsv` files people by one topic: William Howard Taft is under Political_People, not USA_Presidents,
though his infobox reads "27th President of the United States"; Winston Churchill, "an English statesman and
author", is under Political_People only. A reader knows both: in the article on Theodore Roosevelt, Taft (34
places) is a US president beside McKinley (16). `phrases` gives the classes a reader may take a person for from
the article itself, each only a competitor's class (`WikiGraph.class_members`, never a descriptor):

  * offices (`OFFICES`): 'US president' for an ordinal "Nth President of the United States" in the infobox or
    the defining sentence (no "Vice President"), 'British monarch' for "King / Queen of England / Great Britain /
    the United Kingdom / Scotland" in the infobox's caption (its first `CAPTION_LINES` lines: a spouse's title
    further down is no office of the person);
  * the person nouns of the defining sentence (`classes.definition`: "was a Scottish philosopher, economist, and
    historian"), up to its first relative or kinship word ("... the son of a painter" is no painter), mapped by
    `reader_lexicon.PERSON_NOUNS` to the narrow person classes (the broad ones hold every person already).
"""

import re

from data_pipeline import classes, entities
from data_pipeline import reader_lexicon as lex

CAPTION_LINES = 3  # infobox lines read for a monarch's office (the title's line, then the office)
OFFICES: dict[str, tuple[re.Pattern, bool]] = {   # phrase -> (pattern, caption lines only)
    'US president': (re.compile(r'\b\d{1,2}(?:st|nd|rd|th)\s+President\s+of\s+the\s+United\s+States\b'), False),
    'British monarch': (re.compile(r'^(?:King|Queen)\s+of\s+(?:England|Great\s+Britain|the\s+United\s+Kingdom|'
                                   r'Scotland)\b', re.M), True),
}
_NOUN = re.compile(r'(?<![\w-])(?<!martial\s)(' + lex.noun_pattern() + r')(?![\w-])', re.I)
_CUT = re.compile(r'\b(?:who|whose|whom|which|that|where|when|son|daughter|wife|husband|father|mother|brother|'
                  r'sister|widow|grandson|granddaughter|nephew|niece|pupil|student|friend|patron|teacher)\b|[;:()]',
                  re.I)


def is_person(title: str, categories) -> bool:
  """Whether a category of `title` files people (`classes.competitor_phrases` holds the broad person classes)."""
  return bool(set(classes.BROAD_PERSON) & classes.competitor_phrases(title, categories))


def phrases(title: str, categories, text: str, names=()) -> set[str]:
  """The classes a reader may take the person `title` for from its own article (module docstring), with their
  `classes.BROADER` phrases; empty for an article no category files as a person.

  Args:
    title: e.g. 'William_Howard_Taft'; categories: its category paths; text: its plain text;
    names: its names (`WikiGraph.aliases`, for `classes.definition`).
  """
  if not is_person(title, categories):
    return set()
  lines = entities.infobox_lines(text)
  sentence, predicate = classes.definition(text, names)
  out = set()
  for phrase, (pattern, caption) in OFFICES.items():
    where = '\n'.join(lines[:CAPTION_LINES]) if caption else '\n'.join(lines) + '\n' + sentence
    if pattern.search(where):
      out.add(phrase)
  for m in _NOUN.finditer(_CUT.split(predicate, 1)[0]):
    noun = lex.noun_of(m.group(1))
    if noun in lex.PERSON_NOUNS:
      out.update(p for p in lex.PERSON_NOUNS[noun] if p in lex.NARROW_PERSON)
  return out | {b for p in out for b in classes.BROADER.get(p, ())}
