"""Shared fixtures: the real Wikispeedia corpus and its walk graph (loaded once per session)."""

import pytest


@pytest.fixture(scope='session')
def corpus():
  from tools import corpus as corpus_lib
  return corpus_lib.load_wikispeedia()


@pytest.fixture(scope='session')
def graph(corpus):
  from data_pipeline import paths
  return paths.Graph(corpus)


@pytest.fixture(scope='session')
def small_config():
  from data_pipeline import build
  c = build.default_config()
  c.num_items = 6
  c.seed = 0
  return c


@pytest.fixture(scope='session')
def grounded_items(graph, small_config):
  """paths -> qa -> rewrite -> ground on 6 real walks."""
  from data_pipeline import ground, paths, qa, rewrite
  from tools import landmarks
  recs, _ = paths.sample_paths(graph, landmarks.LANDMARK_ARTICLES, small_config)
  recs, _ = qa.add_qa(recs, graph, small_config.seed)
  recs, _ = rewrite.rewrite(recs, graph.all_titles, small_config.seed)
  recs, _ = ground.ground(recs, graph.all_titles)
  return recs
