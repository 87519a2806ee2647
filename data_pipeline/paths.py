"""Stage `paths`: Appendix D.1's constrained random walks on the `wiki` stage's graph (DESIGN.md §7.2).

Walks run on the CSR link graph (`graph.sample_walks`) through the `wiki_graph.WikiGraph` view, for either source:
  * seeds: every candidate alike when there are no more candidates than items (`spread_seeds`: Wikispeedia's 12
    landmarks), else `graph.stratified_seeds` over the five domains (`wiki.DOMAINS`, from infobox type and
    categories), among the articles with an image (`wiki.seed_mask`: XML an infobox + image; Wikispeedia the 12 landmark
    articles with a photo under images/landmarks), not excluded, in-degree in [`min_seed_in_degree`, tau];
  * h ~ Cat(`hop_choices`; `hop_probs`) = Cat({2, 3, 4}; 0.4, 0.4, 0.2) per item;
  * hubs skipped: a node with in-degree > tau = `hub_in_degree` (10,000 for the full English Wikipedia, the
    paper's value; a config value so a small graph uses a smaller one); namespace / list / disambiguation pages
    and calendar titles never visited (`wiki.exclusion_mask`); redirects dereferenced before the checks (the
    CSR edges point at the redirect targets); no revisits; the next node uniform over the allowed ones;
  * nodes stepped onto have text and a descriptor (`WikiGraph.usable`), the last one a typed infobox attribute
    (`WikiGraph.answerable`, `graph.sample_walks(final=...)`), and edges followed are stated in a sentence of
    their source with a descriptor or relation that can single the target out (`WikiGraph.walk_edges`,
    `graph.sample_walks(edge_ok=...)`: the old per-step walker's filters as an edge mask, so the walk stays
    uniform over the edges that can make an item).
Then the per-path semantic checks (each failure counted by reason, the item retried with a fresh walk, at most
`max_retries` (10) retries in all, dead ends included; an attempt is a dead end when `DEAD_END_RETRIES` + 1 walks
died before h hops (that seed is not tried again for h: the Great Wall's text names a rival of every class its
links could be described by, so no walk leaves it, nor Stonehenge's, where New Zealand has Wairarapa beside it);
after a failed attempt the item starts again from the seed with the fewest items so far, so the walks spread over
every seed that has any left):
  * 'not mentioned': a hop's destination is not named in a sentence of its source (`WikiGraph.link`), so
    neither its relation nor the oracle's search can be read;
  * 'no unique referent: <why>': no descriptor of the destination picks it out (`WikiGraph.referent_check`,
    Eq. 6 (ii) in code): 'another of its class in the text' (the source's text names another entity of every
    descriptor's class: gold beside copper in the Taj Mahal's), 'another of its class among the links', 'not
    named as itself', 'no descriptor' (the destination's class has no evidence: abstain);
  * 'descriptor leak': a descriptor names a path node (it would fail the rewrite's leak check);
  * 'no answer': the answer node has no attribute whose value is not a name of a path node ('no answer: a value
    of the past': one it has is refused by `historical`, Söğüt as the Ottoman Empire's capital);
  * 'duplicate': the same path as an earlier item; 'path used from another seed': the same walk after v0 as an
    earlier item's from another landmark;
  * 'answer used': `MAX_PER_ANSWER` (2) items already have the answer (`answer_key`), or one has and the item has
    attempts left (a second use only on its last attempt, so new answers come first);
  * 'answer chain used': `MAX_PER_CHAIN` (2) items already end with the same last hop v(h-1) -> vh (so at most
    2 items share an answer chain v1..vh, and near-duplicates 'Mars -> Milan' under other starts are capped too).
Each hop's relation ('designed by', 'located in', or a fallback by domain, `relations.py`) is recorded.
Wikispeedia figures (4,598 articles, 119,769 edges): in-degree p50 = 10, p95 = 106, p99 = 294, max = 1,551
(United_States); the landmark articles have in-degree 2 (Giza_pyramid_complex, Leaning_Tower_of_Pisa) to 76
(Toronto), so configs/data_wikispeedia.py walks with tau = 600 (the 8 largest hubs skipped; at 300 four landmarks'
only uniquely named neighbours, Egypt, London, New Zealand and Canada, were hubs) and a seed window [2, 600].
"""

import re

import numpy as np

from data_pipeline import classes
from data_pipeline import entities
from data_pipeline import graph as graph_lib
from data_pipeline import wiki


MAX_PER_CHAIN = 2  # items per answer chain (the last hop v(h-1) -> vh)
MAX_PER_ANSWER = 2  # items per answer (Havana answered 9 of 75 items before issue 51)
DEAD_END_RETRIES = 20  # fresh walks after a dead end within one attempt (they cost no check)


def answer_chain(path: list[str]) -> tuple[str, ...]:
  """The key `MAX_PER_CHAIN` counts: the last hop (v(h-1), vh) of the path, which fixes the answer."""
  return tuple(path[-2:])


# Attributes asked in the present tense ('what is the capital of X?'): a value of the past is no answer to them.
PRESENT_TENSE = ('capital', 'currency', 'largest_city', 'country', 'calling_code', 'tld')
_PERIOD = re.compile(r'\b\d{3,4}\b')
_EXISTED = re.compile(r'\b(?:existed|lasted) from (?:AD\s+)?\d{3,4} (?:to|until) (?:AD\s+)?\d{3,4}')
_EXISTED_CHARS = 4000  # the head of the text `historical` reads for 'existed from 1299 to 1922'



def historical(g, title: str, attribute: str, line: str) -> str | None:
  """Why `attribute`'s infobox value of `title` is a value of the past (refused: the question asks 'what is'),
  or None.

  A present-tense attribute (`PRESENT_TENSE`) whose value carries a period ('Capital  Söğüt (1299-1326)': the
  Ottoman Empire's first capital, not the one a reader knows) or lists several ('Akçe, Kuruş, Lira': the first
  is no answer; 'Balboa and US Dollar', but not 'Trinidad and Tobago dollar', a name of the node's own), or of
  an entity its text puts in the past ('The Roman Empire was ...': `classes.definition`; '... existed from AD
  1299 to AD 1922'). Years of birth or death are not concerned.

  Args:
    g: the `wiki_graph.WikiGraph`; title: the answer node; attribute: an `entities.ATTRIBUTES` name;
    line: the infobox line the value came from.
  """
  if attribute not in PRESENT_TENSE:
    return None
  raw = re.sub(r'^(?:- )?' + entities.ATTRIBUTE_BY_NAME[attribute].key + r'(?:\s*\(\d{4}\))?', '',
               line.split(' / ')[-1]).strip()
  if _PERIOD.search(re.sub(r'\^\w+', '', raw)):
    return 'a value with a period'
  value = re.sub(r'\([^)]*\)|\^\w+', '', raw)
  first = entities.name_tokens(entities.display(title))[:1]
  if re.search(r'[,;/]|\bor\b', value) or (re.search(r'\band\b', value)
                                            and entities.name_tokens(value)[:1] != first):
    return 'one of several values'
  if (re.match(r'(?:was|were)\b', classes.definition(g.text(title), g.aliases(title))[1])
      or _EXISTED.search(g.text(title)[:_EXISTED_CHARS])):
    return 'an entity of the past'
  return None


def answer_attributes(g, path: list[str]) -> list[tuple[str, dict]]:
  """The typed attributes of the last node, in `entities.ATTRIBUTES` order, whose answer is not a name of a path
  node nor a value of the past (`historical`), each answer's aliases extended with the names of the article it
  names ('Moscow' -> the article's).

  Args:
    g: the `wiki_graph.WikiGraph`; path: titles v0..vh.
  Returns:
    [(attribute name, {'answer', 'aliases', 'line'})], possibly empty.
  """
  names = [n for t in path for n in g.aliases(t)]
  out = []
  for name, val in g.attributes(path[-1]).items():
    if entities.names_in_text(val['answer'], names) or historical(g, path[-1], name, val['line']):
      continue
    title = val['answer'].replace(' ', '_')
    more = [a for a in (g.aliases(title) if title in g else ()) if a != val['answer'] and a not in val['aliases']]
    out.append((name, dict(val, aliases=list(val['aliases']) + more)))
  return out


def answer_attribute(g, path: list[str]) -> tuple[str, dict] | None:
  """The first of `answer_attributes` (the item's answer), or None."""
  got = answer_attributes(g, path)
  return got[0] if got else None


def check_path(g, path: list[str]) -> tuple[list[str], list[str]] | str:
  """The semantic checks of one walk (module docstring).

  Returns:
    (descriptors [h] of v1..vh, relations [h] of the hops), or the reason the path fails.
  """
  descs, rels = [], []
  for src, dst in zip(path, path[1:]):
    if not g.link(src, dst)[1]:
      return 'not mentioned'
    d, rel, why = g.referent_check(src, dst)
    if d is None:
      return f'no unique referent: {why}'
    descs.append(d)
    rels.append(rel)
  if any(g.names_in(d, t) for d in descs for t in path):
    return 'descriptor leak'
  if answer_attribute(g, path) is None:
    past = any(historical(g, path[-1], n, v['line']) for n, v in g.attributes(path[-1]).items())
    return 'no answer: a value of the past' if past else 'no answer'
  return descs, rels


def seed_candidates(g, hub_in_degree: int, min_seed_in_degree: int, require_infobox_image: bool) -> np.ndarray:
  """[N] bool: articles a walk may start from (image, not excluded, a domain, text, in-degree in the window)."""
  deg = g.in_degree
  text = np.fromiter((bool(a.text) for a in g.data.articles), bool, len(g.titles))
  return (wiki.seed_mask(g.data, require_infobox_image) & ~g.excluded & (g.domains >= 0) & text
          & (deg >= min_seed_in_degree) & (deg <= hub_in_degree))


def sample_paths(g, config, image_dir: str) -> tuple[list[dict], dict]:
  """`config.num_items` walk items (module docstring), deterministic in `config.seed`.

  Args:
    g: the `wiki_graph.WikiGraph`.
    config: the `data` section: num_items, seed, hop_choices, hop_probs, max_retries, hub_in_degree,
      min_seed_in_degree, source ('wikispeedia' seeds need an image only, XML an infobox image).
    image_dir: folder of the seed images (relative to the data folder, or absolute).
  Returns:
    (records, counts): each record has prompt_id (`wiki-s{seed}-{item:05d}`), landmark (the image file stem),
    image_path (`{image_dir}/{file}`), path, hops, descriptors, relations, domain (of v0); counts has
    attempted, walked, given_up, retries, seed_candidates, seeds_per_domain, walked_per_domain, answer_chains
    (distinct `answer_chain`s), max_items_per_chain, distinct_paths, distinct_answers, max_items_per_answer,
    seeds_used (candidates with an item), items_per_seed (title -> items), seeds_without_walk (candidates every
    walk of which died: the Great Wall, Stonehenge) and rejected (reason -> walks: 'dead end', 'not mentioned', 'no unique
    referent: another of its class in the text', ...). No seed candidate = no item (counted), not an error.
  """
  num, tau = int(config.num_items), int(config.hub_in_degree)
  cand = seed_candidates(g, tau, int(config.min_seed_in_degree), config.source != 'wikispeedia')
  counts = {'attempted': num, 'walked': 0, 'given_up': num, 'retries': 0, 'seed_candidates': int(cand.sum()),
            'seeds_per_domain': {}, 'walked_per_domain': {}, 'rejected': {}}
  if not cand.any():
    counts['rejected']['no seed candidate'] = num
    return [], counts
  rng = np.random.default_rng(config.seed)
  seeds, seed_domains = (spread_seeds(g.domains, cand, num, rng) if cand.sum() <= num
                         else graph_lib.stratified_seeds(g.domains, cand, num, rng))
  hops = graph_lib.draw_hops(num, rng, tuple(config.hop_choices), tuple(config.hop_probs)).astype(np.int64)
  allowed = g.usable & (g.in_degree <= tau)
  final = g.answerable
  found, pending, last = {}, np.arange(num), int(config.max_retries)
  seen, suffixes, chains, answers = set(), set(), {}, {}
  pool, dead, used = np.flatnonzero(cand).tolist(), set(), {}
  for attempt in range(last + 1):
    if not pending.size:
      break
    if attempt:
      counts['retries'] += int(pending.size)
    walks, ok, _, _ = graph_lib.sample_walks(g.csr, allowed, seeds[pending], hops[pending], rng,
                                             max_retries=DEAD_END_RETRIES,
                                             final=final, edge_ok=g.walk_edges)
    for k, item in enumerate(pending):
      if not ok[k]:
        why = 'dead end'   # DEAD_END_RETRIES + 1 walks of h hops died: no h-hop walk from that seed, most likely
        dead.add((int(seeds[item]), int(hops[item])))
      else:
        path = [g.titles[int(v)] for v in walks[k, :hops[item] + 1]]
        why = check_path(g, path)
        if not isinstance(why, str):
          answer = answer_key(g, path)
          if tuple(path) in seen:
            why = 'duplicate'
          elif tuple(path[1:]) in suffixes:
            why = 'path used from another seed'
          elif chains.get(answer_chain(path), 0) >= MAX_PER_CHAIN:
            why = 'answer chain used'
          elif answers.get(answer, 0) >= MAX_PER_ANSWER or (answers.get(answer) and attempt < last):
            why = 'answer used'   # a second use only on an item's last attempt: new answers first
      if isinstance(why, str):
        counts['rejected'][why] = counts['rejected'].get(why, 0) + 1
        live = [c for c in pool if (c, int(hops[item])) not in dead]
        if live:   # the next attempt starts from the least used seed with h-hop walks left (ties drawn)
          fewest = min(used.get(c, 0) for c in live)
          seeds[item] = rng.choice([c for c in live if used.get(c, 0) == fewest])
        continue
      seen.add(tuple(path))
      suffixes.add(tuple(path[1:]))
      chains[answer_chain(path)] = chains.get(answer_chain(path), 0) + 1
      answers[answer] = answers.get(answer, 0) + 1
      used[int(seeds[item])] = used.get(int(seeds[item]), 0) + 1
      found[int(item)] = (path, *why)
    pending = np.asarray([i for i in pending if int(i) not in found], np.int64)
  records = []
  for i in sorted(found):
    path, descs, rels = found[i]
    image = g.images(path[0])[0]
    records.append({'prompt_id': f'wiki-s{config.seed}-{i:05d}', 'landmark': image.rsplit('.', 1)[0],
                    'image_path': f'{image_dir.rstrip("/")}/{image}', 'path': path, 'hops': len(path) - 1,
                    'descriptors': descs, 'relations': rels, 'domain': g.domain(path[0])})
  name = lambda d: wiki.DOMAINS[int(d)]
  per_seed = {g.titles[c]: sum(r['path'][0] == g.titles[c] for r in records) for c in pool}
  counts.update(walked=len(records), given_up=num - len(records), answer_chains=len(chains),
                max_items_per_chain=max(chains.values(), default=0),
                distinct_paths=len(seen), distinct_answers=len(answers),
                max_items_per_answer=max(answers.values(), default=0),
                seeds_used=sum(n > 0 for n in per_seed.values()), items_per_seed=per_seed,
                seeds_without_walk=sorted({g.titles[c] for c, _ in dead if not per_seed[g.titles[c]]}),
                seeds_per_domain={name(d): int((seed_domains == d).sum()) for d in np.unique(seed_domains)},
                walked_per_domain={name(d): sum(r['domain'] == name(d) for r in records)
                                   for d in np.unique(seed_domains)})
  counts['rejected'] = dict(sorted(counts['rejected'].items(), key=lambda kv: -kv[1]))
  return records, counts


def spread_seeds(domains: np.ndarray, candidates: np.ndarray, num: int,
                 rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
  """`num` seeds over every candidate alike (shuffled passes: each used floor or ceil of num / candidates times),
  for a graph with no more seed candidates than items (Wikispeedia's 12 landmarks).

  Args:
    domains: [N] int8 domain per node; candidates: [N] bool seed candidates (at least one); num: seeds to draw.
  Returns:
    (seeds [num] int32, their domains [num] int8), the order shuffled.
  """
  pool = np.flatnonzero(candidates)
  seeds = rng.permutation(np.concatenate([rng.permutation(pool) for _ in range(-(-num // len(pool)))])[:num])
  return seeds.astype(np.int32), np.asarray(domains)[seeds].astype(np.int8)


def answer_key(g, path: list[str]) -> str:
  """The folded answer of a path (`answer_attribute`), the key `MAX_PER_ANSWER` counts ('' when none)."""
  got = answer_attribute(g, path)
  return ' '.join(entities.name_tokens(got[1]['answer'])) if got else ''


def is_valid_walk(g, path: list[str]) -> bool:
  """True when `path` has no repeated node and every step is an edge of the CSR graph."""
  return len(set(path)) == len(path) and all(b in g.out_links(a) for a, b in zip(path, path[1:]))
