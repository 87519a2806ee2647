"""Stage `paths`: constrained random walks on the Wikispeedia link graph (DESIGN.md §7.2).

A walk v0 -> v1 -> ... -> vh starts at a landmark article that has a photo (`tools.landmarks.LANDMARK_ARTICLES`)
and follows real out-links (`links.tsv`). Constraints, each checked at every step:
  * h ~ Cat({2, 3, 4}; 0.4, 0.4, 0.2) (`config.hop_choices`, `config.hop_probs`); up to `config.max_retries`
    (10) fresh walks per item with the same h; an item with no valid walk is dropped and counted;
  * no cycles (every node distinct); no lists, years, decades, centuries or months (`entities.is_excluded`);
  * hubs skipped: in-degree > `config.hub_in_degree` (default 300). DESIGN.md's 10,000 is for the full English
    Wikipedia (6.7M articles), where it cuts roughly the top 0.05%; on this 4.6k-article, 120k-link graph the
    in-degree percentiles are p50 = 10, p95 = 106, p99 = 294, max = 1551 (`United_States`), so 300 cuts the
    top ~1% (United States, France, India, Europe, English language, ...), the nodes through which any two
    articles are two clicks apart;
  * the next node is *mentioned* in the current node's text (one of its names occurs as whole words), so that
    "the X mentioned in the article on Y" is true, and the oracle can read it in a search snippet;
  * unique referent (invariant ii, checked in code instead of by an LLM judge): the next node has a category
    descriptor (`entities.descriptors`) that no other out-link of the current node shares, so "the <descriptor>
    mentioned in the article on <current>" picks out exactly one article;
  * the answer node vh has an answerable infobox attribute (`entities.infobox_attributes`) whose value is not a
    name of a path node.
The landmark article itself may have any in-degree (Toronto: 76).
"""

import dataclasses
import functools
import re

import numpy as np

from data_pipeline import entities


@dataclasses.dataclass(eq=False)
class Graph:
  """The corpus plus the per-node facts the walks test (memoised).

  Attributes:
    corpus: `tools.corpus.WikiCorpus`.
    hub_in_degree: nodes with in-degree above this are skipped.
  """
  corpus: object
  hub_in_degree: int = 300

  def __post_init__(self):
    self.all_titles = tuple(self.corpus.titles)

  @functools.lru_cache(maxsize=None)
  def text(self, title: str) -> str:
    """Cleaned text, '' when the article has no plaintext."""
    return self.corpus.text(title) if self.corpus.has_text(title) else ''

  @functools.lru_cache(maxsize=None)
  def folded_text(self, title: str) -> str:
    return ' '.join(entities.fold(self.text(title)).split())

  @functools.lru_cache(maxsize=None)
  def descriptors(self, title: str) -> tuple[str, ...]:
    return tuple(entities.descriptors(self.corpus.categories.get(title, [])))

  @functools.lru_cache(maxsize=None)
  def attributes(self, title: str) -> dict:
    return entities.infobox_attributes(self.text(title), self.corpus.categories.get(title, []))

  def usable(self, title: str) -> bool:
    """Whether a walk may step onto `title` (article with text, not excluded, not a hub, has a descriptor)."""
    return (title in self.corpus and not entities.is_excluded(title)
            and self.corpus.in_degree.get(title, 0) <= self.hub_in_degree
            and bool(self.descriptors(title)) and bool(self.text(title)))

  @functools.lru_cache(maxsize=None)
  def out_links(self, title: str) -> tuple[str, ...]:
    """Distinct out-links that are articles, in links.tsv order."""
    return tuple(t for t in dict.fromkeys(self.corpus.links.get(title, [])) if t in self.corpus and t != title)

  def mentions(self, src: str, dst: str) -> bool:
    """Whether a name of `dst` occurs in the text of `src` as whole words (accent- and case-folded)."""
    hay = self.folded_text(src)
    return any(re.search(r'(?<!\w)' + re.escape(entities.fold(n)) + r'(?!\w)', hay)
               for n in entities.aliases(dst))

  @functools.lru_cache(maxsize=None)
  def names_in(self, phrase: str, title: str) -> bool:
    """Whether `phrase` contains an alias or a distinctive word of `title` (the leak rule of `rewrite`)."""
    hay = entities.fold(phrase)
    words = entities.aliases(title) + entities.distinctive_words(title, self.all_titles)
    return any(re.search(r'(?<!\w)' + re.escape(entities.fold(w)) + r'(?!\w)', hay) for w in words)

  @functools.lru_cache(maxsize=None)
  def unique_descriptor(self, src: str, dst: str) -> str | None:
    """The most specific descriptor of `dst` that no other out-link of `src` has, or None."""
    others = [w for w in self.out_links(src) if w != dst]
    taken = set()
    for w in others:
      taken.update(self.descriptors(w))
    for d in self.descriptors(dst):
      if d not in taken:
        return d
    return None


def answer_attribute(graph: Graph, path: list[str]) -> tuple[str, dict] | None:
  """The first answerable attribute of the last node whose answer is not a name of a path node."""
  names = {entities.fold(n) for t in path for n in entities.aliases(t)}
  for name, val in graph.attributes(path[-1]).items():
    if entities.fold(val['answer']) not in names:
      return name, val
  return None


def walk_once(graph: Graph, root: str, hops: int, rng: np.random.Generator) -> tuple[list[str], list[str]] | None:
  """One constrained random walk of `hops` steps from `root`.

  Returns:
    (path [h+1 titles], descriptors [h] of v1..vh), or None when the walk got stuck.
  """
  path, descs = [root], []
  for step in range(1, hops + 1):
    cur, last = path[-1], step == hops
    cands = []
    for v in graph.out_links(cur):
      if v in path or not graph.usable(v) or not graph.mentions(cur, v):
        continue
      d = graph.unique_descriptor(cur, v)
      if d is None or any(graph.names_in(x, t) for x in descs + [d] for t in path + [v]):
        continue  # A descriptor that names a path node ("food or crop" for Food) would fail the leak check.
      if last and answer_attribute(graph, path + [v]) is None:
        continue
      cands.append((v, d))
    if not cands:
      return None
    v, d = cands[int(rng.integers(len(cands)))]
    path.append(v)
    descs.append(d)
  return path, descs


def item_rng(seed: int, index: int) -> np.random.Generator:
  """The random stream of item `index` (its hop count, then its walks): independent of the other items."""
  return np.random.default_rng([seed, index])


def draw_hops(config, rng: np.random.Generator) -> int:
  """h ~ Cat(config.hop_choices; config.hop_probs), the first draw of an item's stream (`item_rng`)."""
  probs = np.asarray(config.hop_probs, np.float64)
  return int(rng.choice(list(config.hop_choices), p=probs / probs.sum()))


def sample_paths(graph: Graph, landmarks: dict[str, str], config, image_dir: str = 'images/landmarks') -> tuple[list[dict], dict]:
  """Samples `config.num_items` walks, landmarks taken round-robin (sorted by file stem), deterministic in seed.

  Item i draws its hop count and then its walks from `item_rng(config.seed, i)` (`draw_hops` first), so the
  same seed gives the same records and another seed other ones.

  Args:
    graph: the `Graph`.
    landmarks: photo file stem -> root article (`tools.landmarks.LANDMARK_ARTICLES`).
    config: needs num_items, seed, hop_choices, hop_probs, max_retries.
    image_dir: photo folder relative to the data folder.
  Returns:
    (records, counts): each record has prompt_id, landmark, image_path (relative to the data folder, `.jpg`),
    path, hops, descriptors (for v1..vh); counts has attempted / walked / no_walk / retries.
  """
  stems = sorted(s for s, t in landmarks.items() if t in graph.corpus)
  records, seen = [], set()
  counts = {'attempted': 0, 'walked': 0, 'no_walk': 0, 'retries': 0}
  for i in range(config.num_items):
    rng = item_rng(config.seed, i)
    stem = stems[i % len(stems)]
    hops = draw_hops(config, rng)
    counts['attempted'] += 1
    got = None
    for attempt in range(config.max_retries + 1):
      got = walk_once(graph, landmarks[stem], hops, rng)
      if got is not None and tuple(got[0]) not in seen:
        break
      got = None
      counts['retries'] += attempt < config.max_retries
    if got is None:
      counts['no_walk'] += 1
      continue
    path, descs = got
    seen.add(tuple(path))
    counts['walked'] += 1
    records.append({'prompt_id': f'wiki-s{config.seed}-{i:05d}', 'landmark': stem,
                    'image_path': f'{image_dir}/{stem}.jpg', 'path': path, 'hops': hops, 'descriptors': descs})
  return records, counts


def is_valid_walk(corpus, path: list[str]) -> bool:
  """True when `path` has no repeated node and every step is a real out-link in `links.tsv`."""
  return len(set(path)) == len(path) and all(b in corpus.links.get(a, []) for a, b in zip(path, path[1:]))
