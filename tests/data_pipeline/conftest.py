"""Shared fixtures: the real Wikispeedia corpus, its wiki-stage graph view and 6 real grounded items (once per
session)."""

import pytest


@pytest.fixture(scope='session')
def corpus():
  from tools import corpus as corpus_lib
  return corpus_lib.load_wikispeedia()


@pytest.fixture(scope='session')
def graph():
  """`wiki_graph.WikiGraph` over the Wikispeedia wiki stage (built in memory: `wiki_tsv` + `graph.build_csr`)."""
  from data_pipeline import graph as graph_lib
  from data_pipeline import wiki, wiki_graph, wiki_tsv
  data = wiki_tsv.read_wikispeedia()
  src, dst, _, _ = wiki.resolve_links(data)
  csr, _ = graph_lib.build_csr(src, dst, len(data.articles))
  return wiki_graph.WikiGraph(data, csr)


@pytest.fixture(scope='session')
def small_config():
  from data_pipeline import build
  c = build.wikispeedia_walks(build.default_config())
  c.num_items = 6
  c.seed = 0
  return c


@pytest.fixture(scope='session')
def grounded_items(graph, small_config):
  """paths -> qa -> rewrite -> ground on 6 real walks."""
  from data_pipeline import ground, paths, qa, rewrite
  from osvl_jax import paths as osvl_paths
  recs, _ = paths.sample_paths(graph, small_config, small_config.image_dir)
  recs, _ = qa.add_qa(recs, graph, small_config.seed)
  recs, _ = rewrite.rewrite(recs, graph)
  recs, _ = ground.ground(recs, graph, osvl_paths.data_dir(), small_config.image_dir)
  return recs


@pytest.fixture(scope='session')
def accepted_items(grounded_items):
  """The grounded items no stage rejected (qa refuses, e.g., the first walk's 'Born Spring 1480')."""
  return [r for r in grounded_items if not r['rejected']]


@pytest.fixture(scope='session')
def solvable_items(graph, accepted_items):
  """The accepted grounded items the offline oracle expert solves undegraded (its text_search does not find every
  hop: 'the Caribbean country mentioned in the article on Iran' is no query that retrieves Cuba)."""
  from data_pipeline import synthesize
  from osvl_jax import paths as osvl_paths
  records, _ = synthesize.synthesize(accepted_items, graph, osvl_paths.data_dir())
  kept = {r['prompt_id'] for r in records}
  return [r for r in accepted_items if r['prompt_id'] in kept]
