"""Variety (issue 51): walks over every landmark seed, at most 2 items per answer, no walk repeated from another
seed, and the counts that show it."""

import collections

import numpy as np

from data_pipeline import entities, paths, qa


def test_spread_seeds_use_every_candidate_alike():
  cand = np.zeros(40, bool)
  cand[[3, 7, 11, 20, 33]] = True
  seeds, doms = paths.spread_seeds(np.arange(40, dtype=np.int8) % 3, cand, 12, np.random.default_rng(0))
  used = collections.Counter(seeds.tolist())
  assert set(used) == {3, 7, 11, 20, 33} and sorted(used.values()) == [2, 2, 2, 3, 3]
  assert doms.tolist() == [s % 3 for s in seeds.tolist()]


def test_a_build_spreads_over_the_landmarks_with_new_answers_and_paths(graph, small_config):
  c = small_config.copy_and_resolve_references()
  c.num_items, c.seed = 36, 3
  recs, counts = paths.sample_paths(graph, c, c.image_dir)
  assert len(recs) == counts['walked'] >= 20
  answers = collections.Counter(paths.answer_key(graph, r['path']) for r in recs)
  assert max(answers.values()) <= paths.MAX_PER_ANSWER == 2 == counts['max_items_per_answer']
  assert counts['distinct_answers'] == len(answers) >= 0.8 * len(recs)
  suffixes = [tuple(r['path'][1:]) for r in recs]
  assert len(set(suffixes)) == len(suffixes) == counts['distinct_paths']
  # Every landmark but the Great Wall, whose text names a rival of every class its links could be described by,
  # and Stonehenge, whose one such hop (New Zealand, "the place in Oceania") has Wairarapa beside it
  # ("Stonehenge Aotearoa in the Wairarapa region of New Zealand").
  starts = collections.Counter(r['path'][0] for r in recs)
  assert counts['seeds_used'] == len(starts) == counts['seed_candidates'] - 2 == 10
  assert counts['seeds_without_walk'] == ['Great_Wall_of_China', 'Stonehenge']
  assert not {'Great_Wall_of_China', 'Stonehenge'} & set(starts)
  assert counts['items_per_seed'] == {t: starts.get(t, 0) for t in counts['items_per_seed']}
  assert max(starts.values()) <= 2 * min(starts.values()) + 2
  recs, _ = qa.add_qa(recs, graph, c.seed)
  ok = [r for r in recs if not r['rejected']]
  got = collections.Counter(' '.join(entities.name_tokens(r['answers'][0])) for r in ok)
  assert max(got.values()) <= 2
