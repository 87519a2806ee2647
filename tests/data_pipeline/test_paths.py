"""Walks: real links, no cycles, landmark roots, hub skipping, answerable last node."""

import numpy as np

from data_pipeline import entities
from data_pipeline import paths
from tools import landmarks


def test_walks_follow_real_links_without_cycles(graph, corpus, small_config):
  recs, counts = paths.sample_paths(graph, landmarks.LANDMARK_ARTICLES, small_config)
  assert counts['walked'] == len(recs) >= 5
  for r in recs:
    p = r['path']
    assert len(set(p)) == len(p), p
    for a, b in zip(p, p[1:]):
      assert b in corpus.links[a], (a, b)
    assert paths.is_valid_walk(corpus, p)
    assert r['hops'] == len(p) - 1 in (2, 3, 4)
    assert p[0] == landmarks.LANDMARK_ARTICLES[r['landmark']]
    assert r['image_path'] == f"images/landmarks/{r['landmark']}.jpg"


def test_walks_skip_hubs_and_end_on_an_answerable_node(graph, small_config):
  recs, _ = paths.sample_paths(graph, landmarks.LANDMARK_ARTICLES, small_config)
  for r in recs:
    for t in r['path'][1:]:
      assert graph.corpus.in_degree[t] <= small_config.hub_in_degree, t
      assert not entities.is_excluded(t)
    assert paths.answer_attribute(graph, r['path']) is not None


def test_is_valid_walk_rejects_cycles_and_non_links(corpus):
  assert paths.is_valid_walk(corpus, ['Taj_Mahal', 'Agra'] if 'Agra' in corpus else ['Taj_Mahal', 'Akbar'])
  assert not paths.is_valid_walk(corpus, ['Taj_Mahal', 'Akbar', 'Taj_Mahal'])
  assert not paths.is_valid_walk(corpus, ['Taj_Mahal', 'Zebra'])


def test_walks_are_deterministic_in_the_seed_and_differ_across_seeds(graph, small_config):
  """Same seed -> the same records; other seeds -> other paths (a sampler ignoring its seed fails here)."""
  sample = lambda seed: paths.sample_paths(graph, landmarks.LANDMARK_ARTICLES, _with_seed(small_config, seed))[0]
  seed = small_config.seed
  a, b = sample(seed), sample(seed)
  assert [r['path'] for r in a] == [r['path'] for r in b] and a
  assert [r['hops'] for r in a] == [r['hops'] for r in b]
  others = [sample(seed + 1), sample(seed + 2)]
  for other in others:
    assert other and [r['path'] for r in other] != [r['path'] for r in a]
  assert [r['path'] for r in others[0]] != [r['path'] for r in others[1]]
  assert {r['prompt_id'] for r in a}.isdisjoint(r['prompt_id'] for r in others[0])


def _with_seed(config, seed):
  c = config.copy_and_resolve_references()
  c.seed = seed
  return c


def test_hop_counts_follow_the_configured_categorical(graph, small_config):
  """h ~ Cat({2, 3, 4}; 0.4, 0.4, 0.2): over n items of the fixed seed, each count is within 4 binomial standard
  deviations of n p (the seed is fixed, so this is deterministic); `sample_paths` uses exactly these draws."""
  assert tuple(small_config.hop_choices) == (2, 3, 4) and tuple(small_config.hop_probs) == (0.4, 0.4, 0.2)
  n = 3000
  hops = [paths.draw_hops(small_config, paths.item_rng(small_config.seed, i)) for i in range(n)]
  for h, p in zip((2, 3, 4), (0.4, 0.4, 0.2)):
    count = hops.count(h)
    assert abs(count - n * p) <= 4 * np.sqrt(n * p * (1 - p)), (h, count, n * p)
  assert set(hops) == {2, 3, 4}
  other = [paths.draw_hops(small_config, paths.item_rng(small_config.seed + 1, i)) for i in range(n)]
  assert other != hops  # the draws depend on the seed
  recs, _ = paths.sample_paths(graph, landmarks.LANDMARK_ARTICLES, small_config)
  for r in recs:  # each record's h is its item's draw
    assert r['hops'] == hops[int(r['prompt_id'].rsplit('-', 1)[1])]


def test_unique_descriptor_picks_out_one_out_link(graph):
  # Every out-link of the source other than the destination lacks the chosen descriptor.
  rng = np.random.default_rng(0)
  got = next(g for g in (paths.walk_once(graph, 'Stonehenge', 2, rng) for _ in range(20)) if g is not None)
  path, descs = got
  for (src, dst), d in zip(zip(path, path[1:]), descs):
    assert d in graph.descriptors(dst)
    assert all(d not in graph.descriptors(w) for w in graph.out_links(src) if w != dst)
