"""The item stages' view of the `wiki` stage's output (DESIGN.md §7.1-7.5), for either source.

`WikiGraph.open(<dataset>/wiki)` reads the articles, redirects and links (`wiki.load`) and the CSR link graph
(`graph.load_csr`, memory-mapped); `WikiGraph(data, csr)` wraps ones in memory (tests). Per node it gives what
`paths`, `qa`, `rewrite`, `ground` and the oracle expert read:

  titles / ids      node id <-> title (Wikispeedia `Taj_Mahal`, XML `Computer accessibility`)
  aliases           the title's surface forms (`entities.aliases`) + the redirects that lead to it (dereferenced)
  text              the plain text the wiki stage kept
  descriptors       class phrases with evidence (`classes.descriptors`: category + definition / infobox), the
                    XML infobox type, else (XML, typed infobox) a domain noun; none = abstain (never stepped on)
  mentions          title -> count of the articles a text names (`mentions.mention_counts`)
  competitors       the entities of a descriptor's class the source's text (or the link sentence) names
  attributes        typed infobox attributes (`entities.infobox_attributes`): Wikispeedia reads the plaintext's
                    infobox lines; XML renders its parsed infobox parameters as `Key value` lines first
  out_links         CSR out-neighbours as titles
  link(src, dst)    (anchor, sentence) of the link: the first one with a sentence in the links table, else the
                    first sentence of src's text that names dst (`relations.mention_sentence`; all Wikispeedia)
  relation          `relations.relation` of that anchor and sentence, by dst's domain when none is read
  domain            `wiki.DOMAINS` name from infobox type and categories ('' = none)
  images            image file names (XML: infobox image first; Wikispeedia: the landmark photo)
and the [N] masks the walks need: `excluded`, `usable` (text + descriptor) and `answerable` (an attribute).
"""

import functools
import pathlib

import numpy as np

from data_pipeline import classes
from data_pipeline import entities
from data_pipeline import graph as graph_lib
from data_pipeline import mentions as mentions_lib
from data_pipeline import person_classes
from data_pipeline import reader
from data_pipeline import reader_lexicon
from data_pipeline import short_forms as short_forms_lib
from data_pipeline import relations
from data_pipeline import wiki

# XML infobox parameter -> the key `entities.ATTRIBUTES` reads (`Capital  Montgomery`).
XML_ATTRIBUTE_KEYS: dict[str, str] = {
    'capital': 'Capital', 'currency': 'Currency', 'author': 'Author', 'largest city': 'Largest city',
    'constellation': 'Constellation', 'country': 'Country', 'birth date': 'Born', 'death date': 'Died',
    'founded': 'Founded', 'established': 'Founded', 'foundation': 'Founded', 'calling code': 'Calling code',
    'cctld': 'Internet TLD'}
# Domain -> descriptor of an article that has no more specific one.
DOMAIN_NOUNS: dict[str, str] = {'Person': 'person', 'Building-Place': 'building', 'Location': 'place',
                                'Organism': 'organism', 'Artifact': 'work'}


class WikiGraph:
  """Read-only view of a wiki stage folder (see the module docstring); per-node facts memoised.

  Attributes:
    data: the `wiki.WikiData`; csr: the `graph.CSRGraph`; titles: tuple of N titles; ids: title -> id;
    domains: [N] int8 (`wiki.node_domains`); excluded: [N] bool (`wiki.exclusion_mask`); in_degree: [N] int32.
  """

  def __init__(self, data: wiki.WikiData, csr: graph_lib.CSRGraph):
    if csr.num_nodes != len(data.articles):
      raise ValueError(f'WikiGraph: the CSR graph has {csr.num_nodes} nodes but the wiki data '
                       f'{len(data.articles)} articles')
    self.data, self.csr = data, csr
    self.titles = tuple(a.title for a in data.articles)
    self.ids = {t: i for i, t in enumerate(self.titles)}
    self.domains = wiki.node_domains(data)
    self.excluded = wiki.exclusion_mask(data)
    self.in_degree = np.asarray(csr.in_degree)
    self._redirects = {}
    for alias, target in data.redirects.items():
      t = wiki.resolve_title(target, data.redirects, self.ids)
      if t is not None:
        self._redirects.setdefault(t, []).append(alias)
    self._links = {}  # (src id, dst id) -> (anchor, sentence), the first link with a sentence
    memo = {}
    for link in data.links:
      if not link.sentence:
        continue
      if link.dst not in memo:
        memo[link.dst] = wiki.resolve_title(link.dst, data.redirects, self.ids)
      if memo[link.dst] is not None:
        self._links.setdefault((link.src, self.ids[memo[link.dst]]), (link.anchor, link.sentence))

  @classmethod
  def open(cls, folder: str | pathlib.Path) -> 'WikiGraph':
    """The view of `<dataset>/wiki` (`wiki.save` tables + `graph/` CSR arrays, memory-mapped).

    Raises:
      FileNotFoundError: naming the missing table or array.
    """
    folder = pathlib.Path(folder)
    return cls(wiki.load(folder), graph_lib.load_csr(folder / 'graph'))

  def __contains__(self, title: str) -> bool:
    return title in self.ids

  def article(self, title: str) -> wiki.Article:
    """The `wiki.Article` of `title`.

    Raises:
      KeyError: naming an unknown title.
    """
    if title not in self.ids:
      raise KeyError(f'{title!r}: no such article in the wiki stage output')
    return self.data.articles[self.ids[title]]

  def text(self, title: str) -> str:
    """The article's plain text ('' when it has none)."""
    return self.article(title).text

  @functools.lru_cache(maxsize=None)
  def aliases(self, title: str) -> tuple[str, ...]:
    """Surface names: `entities.aliases(title)` then those of each redirect to it (chains dereferenced)."""
    names = list(entities.aliases(title))
    for alias in sorted(self._redirects.get(title, ())):
      names += [n for n in entities.aliases(alias) if n not in names]
    return tuple(names)

  def domain(self, title: str) -> str:
    """The `wiki.DOMAINS` name of `title`, '' when none."""
    d = int(self.domains[self.ids[title]])
    return wiki.DOMAINS[d] if d >= 0 else ''

  @functools.lru_cache(maxsize=None)
  def descriptors(self, title: str) -> tuple[str, ...]:
    """Descriptor phrases, most specific first: the classes whose evidence holds (`classes.descriptors`), the
    infobox type (XML), else the domain noun of an article with a typed infobox; () = abstain. Never 'X or Y'."""
    art = self.article(title)
    out = classes.descriptors(title, art.categories, art.text, self.aliases(title))
    kind = art.infobox_type.strip()
    if kind and kind.isascii() and len(kind.split()) <= 3 and kind not in out and ' or ' not in kind:
      out.append(kind)
    noun = DOMAIN_NOUNS.get(self.domain(title))
    if not out and noun and kind:
      out.append(noun)
    return tuple(out)

  @functools.cached_property
  def _classes(self) -> dict[str, frozenset[str]]:
    """phrase -> the titles of its class: those it describes and those a reader may take for one
    (`classes.competitor_phrases`; a person also by its own article's offices and definition,
    `person_classes.phrases`: Taft, a political figure by category, is a US president too)."""
    index: dict[str, set[str]] = {}
    for a in self.data.articles:
      for p in (set(self.descriptors(a.title)) | classes.competitor_phrases(a.title, a.categories)
                | person_classes.phrases(a.title, a.categories, a.text, self.aliases(a.title))):
        index.setdefault(p, set()).add(a.title)
    return {p: frozenset(ts) for p, ts in index.items()}

  def class_members(self, phrase: str) -> frozenset[str]:
    """The titles of the class `phrase` names (empty for an unknown phrase)."""
    return self._classes.get(phrase, frozenset())

  def class_phrases(self, title: str) -> frozenset[str]:
    """Every phrase whose class holds `title` (`class_members` the other way round)."""
    return self._phrases_of.get(title, frozenset())

  @functools.cached_property
  def _phrases_of(self) -> dict[str, frozenset[str]]:
    out: dict[str, set[str]] = {}
    for p, ts in self._classes.items():
      for t in ts:
        out.setdefault(t, set()).add(p)
    return {t: frozenset(ps) for t, ps in out.items()}

  @functools.cached_property
  def alias_index(self) -> dict[str, tuple[str, ...]]:
    """`mentions.alias_index` of every article."""
    return mentions_lib.alias_index((t, self.aliases(t)) for t in self.titles)

  @functools.lru_cache(maxsize=4096)
  def mentions(self, text: str) -> dict[str, int]:
    """title -> count of its mentions in `text` (an article's text or a sentence; `mentions.mention_counts`)."""
    return mentions_lib.mention_counts(text, self.alias_index)

  def is_person(self, title: str) -> bool:
    """Whether a reader takes `title` for a person (a class of people holds it: `reader_lexicon.PERSON_PHRASES`)."""
    return bool(self.class_phrases(title) & reader_lexicon.PERSON_PHRASES)

  @functools.cached_property
  def short_forms(self) -> short_forms_lib.ShortForms:
    """The people's surname-only / first-name forms (`short_forms.ShortForms`)."""
    return short_forms_lib.ShortForms([t for t in self.titles if self.is_person(t)], self.text)

  @functools.lru_cache(maxsize=None)
  def out_links_set(self, title: str) -> frozenset[str]:
    return frozenset(self.out_links(title))

  @functools.lru_cache(maxsize=2048)
  def reading(self, text: str, src: str | None = None) -> dict[str, reader.Mention]:
    """key -> `reader.Mention` of every entity `text` names, as a reader counts and classes them (`reader.read`)."""
    return reader.read(text, self, src)

  @functools.cached_property
  def given_names(self) -> frozenset[str]:
    """Folded first words of the people's titles ('miguel' from Miguel_de_Cervantes) that start more people's
    titles than other titles and are no stopword (`mentions.unnamed_people`)."""
    people, others = {}, {}
    for a in self.data.articles:
      words = entities.name_tokens(entities.display(a.title))
      if len(words) < 2:
        continue
      person = bool(set(classes.BROAD_PERSON) & classes.competitor_phrases(a.title, a.categories))
      bucket = people if person else others
      bucket[words[0]] = bucket.get(words[0], 0) + 1
    return frozenset(w for w, n in people.items()
                     if len(w) >= 3 and w not in entities.STOPWORDS and n > others.get(w, 0))

  def competitor_text(self, src: str, dst: str) -> str:
    """The text the hop's referent is read against: the link sentence for a relation `relations.extract` read
    ("the architect who designed X" singles dst out among the rest of the text), else src's whole text."""
    return self.link(src, dst)[1] if self.relation(src, dst) in relations.RELATIONS else self.text(src)

  def competitor_mentions(self, src: str, dst: str, phrase: str) -> list[reader.Mention]:
    """The mentions of `phrase`'s class in `competitor_text` besides src, most prominent first (`reader.read`:
    surname-only and title forms counted, entities without an article classed from their context)."""
    return reader.classed(self.reading(self.competitor_text(src, dst), src), phrase, exclude=src)

  def competitors(self, src: str, dst: str, phrase: str) -> list[tuple[str, int]]:
    """(key, count) of `competitor_mentions`: an article's title, '?Name' for an entity without one ('?Jacob
    Burckhardt'); dst among them when named."""
    return [(m.key, m.count) for m in self.competitor_mentions(src, dst, phrase)]

  @functools.lru_cache(maxsize=None)
  def attributes(self, title: str) -> dict:
    """Typed infobox attributes, name -> {'answer', 'aliases', 'line'} (`entities.infobox_attributes`)."""
    art = self.article(title)
    if art.infobox_type or art.attributes:
      lines = [f'{XML_ATTRIBUTE_KEYS[k]}  {v}' for k, v in (
          (' '.join(key.replace('_', ' ').split()).lower(), val) for key, val in art.attributes.items())
               if k in XML_ATTRIBUTE_KEYS]
      return entities.infobox_attributes('\n'.join(lines), art.categories)
    return entities.infobox_attributes(art.text, art.categories)

  @functools.lru_cache(maxsize=None)
  def out_links(self, title: str) -> tuple[str, ...]:
    """Out-neighbours in the CSR graph (redirects resolved, no self-loops), as titles."""
    return tuple(self.titles[int(v)] for v in self.csr.neighbors(self.ids[title]))

  @functools.lru_cache(maxsize=None)
  def link(self, src: str, dst: str) -> tuple[str, str]:
    """(anchor, sentence) of the link src -> dst; ('', '') when src's text never names dst."""
    got = self._links.get((self.ids[src], self.ids[dst]))
    if got is not None:
      return got
    return relations.mention_sentence(self.text(src), list(self.aliases(dst)))

  def relation(self, src: str, dst: str) -> str:
    """The relation phrase of the hop src -> dst (`relations.relation`, src's names and domain as the subject)."""
    anchor, sentence = self.link(src, dst)
    return relations.relation(anchor, sentence, self.domain(dst), self.aliases(src), self.domain(src))

  def referent(self, src: str, dst: str) -> str | None:
    """A descriptor that picks `dst` out (unique referent, Eq. 6 (ii)), or None: `referent_check`'s."""
    return self.referent_check(src, dst)[0]

  @functools.lru_cache(maxsize=None)
  def referent_check(self, src: str, dst: str) -> tuple[str | None, str, str]:
    """(descriptor, relation, '') of the hop src -> dst, or (None, '', why no descriptor picks dst out).

    The most specific descriptor d of dst (never 'X or Y') that passes both:
      * the text: dst is the only entity of d's class that src's text names besides src (`competitors`; the link
        sentence for a hop with a read relation);
      * the links: no other out-link of src is of d's class, or, for a read relation, none is said to stand
        in the same relation ("the architect who designed X": no other architect linked from X's article
        designed it);
    the relation is then the hop's (`relation`). Else, for a hop without a read relation, the most specific d
    whose class dst leads in src's text by a margin (`dominates`): the relation is then
    `relations.MOST_OFTEN` ("the chemical element mentioned most often in the article on X"), true whatever
    else the text or the links hold.
    Reasons: 'no descriptor' (dst abstains), 'not named as itself' (only inside a longer name: 'New Mexico'),
    'another of its class in the text', 'another of its class among the links'.
    """
    descs = [d for d in self.descriptors(dst) if ' or ' not in d]
    if not descs:
      return None, '', 'no descriptor'
    rel = self.relation(src, dst)
    others = [w for w in self.out_links(src) if w != dst]
    why = 'not named as itself'
    for d in descs:
      found = self.competitors(src, dst, d)
      if dst not in dict(found):
        continue
      if len(found) > 1:
        why = 'another of its class in the text'
        continue
      members = self.class_members(d)
      if any(w in members and (rel not in relations.RELATIONS or self.relation(src, w) == rel) for w in others):
        why = 'another of its class among the links'
        continue
      return d, rel, ''
    if rel not in relations.RELATIONS:
      for d in descs:
        if dominates(dst, self.competitors(src, dst, d)):
          return d, relations.MOST_OFTEN, ''
    return None, '', why

  def names_in(self, phrase: str, title: str) -> bool:
    """Whether `phrase` holds an alias or a distinctive word of `title` (the leak rule, `rewrite.find_leaks`)."""
    return bool(entities.names_in_text(phrase, self.aliases(title) +
                                       tuple(entities.distinctive_words(title, self.titles))))

  def images(self, title: str) -> list[str]:
    """The article's image file names (XML: infobox image fields first)."""
    return list(self.article(title).images)

  @functools.cached_property
  def usable(self) -> np.ndarray:
    """[N] bool: nodes a walk may step onto besides the hub rule: not excluded, with text and a descriptor."""
    return np.fromiter((not self.excluded[i] and bool(a.text) and bool(self.descriptors(a.title))
                        for i, a in enumerate(self.data.articles)), bool, len(self.titles))

  @functools.cached_property
  def answerable(self) -> np.ndarray:
    """[N] bool: usable nodes with a typed infobox attribute (where a walk may end)."""
    usable = self.usable
    return np.fromiter((bool(usable[i]) and bool(self.attributes(t)) for i, t in enumerate(self.titles)), bool,
                       len(self.titles))

  @functools.cached_property
  def walk_edges(self) -> 'EdgeMask':
    """[E] bool (positions in `csr.indices`), read lazily: edges src -> dst a walk may follow: dst usable, named
    in a sentence of src (`link`), and with a descriptor no other out-link of src has and whose class src's text
    names no other entity of (`mentions`) or whose class dst `dominates` in the text, or a relation
    `relations.extract` reads (the cheap part of `referent`, which `paths.check_path` then applies in full).
    A source's out-edges are decided the first time a walk stands on it (`EdgeMask`), so a build reads the
    sentences of the few hundred articles its walks visit, not of every link in the graph."""
    return EdgeMask(self)

  def out_edges_ok(self, i: int) -> np.ndarray:
    """[out-degree of node i] bool: `walk_edges` over node i's out-edges, in CSR order."""
    art, nbrs = self.data.articles[i], self.out_links(self.titles[i])
    if not art.text or not nbrs:
      return np.zeros(len(nbrs), bool)
    linked = {}
    for w in nbrs:
      for d in self.descriptors(w):
        linked[d] = linked.get(d, 0) + 1
    found = self.reading(art.text, art.title)
    named = {k for k, m in found.items() if m.title is not None}
    in_text = {}  # phrase -> (key, count) of the entities of its class the text names, most first
    for m in sorted(found.values(), key=lambda m: (-m.count, m.key)):
      if m.key != art.title:
        for d in m.classes:
          in_text.setdefault(d, []).append((m.key, m.count))
    ok = np.zeros(len(nbrs), bool)
    usable = self.usable
    for k, w in enumerate(nbrs):
      if not usable[self.ids[w]]:
        continue
      anchor, sentence = self.link(art.title, w)
      ok[k] = bool(sentence) and (
          any(w in named and ((linked[d] == 1 and len(in_text[d]) == 1) or dominates(w, in_text[d]))
              for d in self.descriptors(w))
          or relations.extract(anchor, sentence, self.aliases(art.title), self.domain(art.title)) is not None)
    return ok


# The margin of a "mentioned most often" hop: the leader named at least MOST_OFTEN_RATIO times as often as the
# runner-up and at least MOST_OFTEN_LEAD places more. A reader's count is off by a place or two (a surname inside
# a place's name, a caption), so a lead of one never makes the claim: 4 vs 2 and 3 vs 1 hold, 3 vs 2, 2 vs 1 and
# 5 vs 3 do not (Magellan 4 vs Almagro 2 in Chile's text held only while 'Strait of Magellan' counted for him).
MOST_OFTEN_RATIO = 2
MOST_OFTEN_LEAD = 2


def dominates(title: str, found: list[tuple[str, int]]) -> bool:
  """Whether `title` leads `found` ((title, count), most first: `WikiGraph.competitors`) by the margin
  `MOST_OFTEN_RATIO` / `MOST_OFTEN_LEAD` (gold 7 vs copper 2: gold dominates; 3 vs 2 does not; alone, 2 places
  do and 1 does not)."""
  if not found or found[0][0] != title:
    return False
  second = found[1][1] if len(found) > 1 else 0
  return found[0][1] >= max(MOST_OFTEN_RATIO * second, second + MOST_OFTEN_LEAD)


class EdgeMask:
  """A [E] bool edge mask over `graph.csr` whose values are computed per source node on first read
  (`WikiGraph.out_edges_ok`); indexing (an int array of edge positions, or a slice) returns a numpy bool array
  equal to what the whole mask computed at once would give."""

  def __init__(self, graph: WikiGraph):
    self.graph = graph
    self.indptr = np.asarray(graph.csr.indptr, np.int64)
    self.values = np.zeros(int(self.indptr[-1]), bool)
    self.done = np.zeros(len(self.indptr) - 1, bool)

  def __len__(self) -> int:
    return len(self.values)

  def _fill(self, positions: np.ndarray) -> None:
    nodes = np.unique(np.searchsorted(self.indptr, positions, side='right') - 1)
    for i in nodes[~self.done[nodes]]:
      self.values[self.indptr[i]:self.indptr[i + 1]] = self.graph.out_edges_ok(int(i))
      self.done[i] = True

  def __getitem__(self, index) -> np.ndarray:
    positions = np.arange(*index.indices(len(self.values))) if isinstance(index, slice) else np.asarray(index)
    if positions.size:
      self._fill(np.atleast_1d(positions))
    return self.values[index]

  def __array__(self, dtype=None, copy=None) -> np.ndarray:
    """The whole mask (every source node decided)."""
    self._fill(np.arange(len(self.values)))
    self.done[:] = True   # nodes without out-edges have nothing to decide
    return self.values if dtype is None else self.values.astype(dtype)
