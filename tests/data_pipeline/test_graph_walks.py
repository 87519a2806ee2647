"""CSR link graph and each walk constraint of DESIGN.md §7.2 on hand-made graphs (data_pipeline/graph.py)."""

import numpy as np
import pytest

from data_pipeline import graph


def _csr(edges, n):
  src, dst = zip(*edges)
  return graph.build_csr(np.array(src), np.array(dst), n)


def test_csr_build_and_mmap_round_trip(tmp_path):
  # 0->1, 0->2 (twice), 1->2, 2->0, 3->3 (self-loop), 3->0; node 4 isolated.
  g, counts = _csr([(2, 0), (0, 2), (0, 1), (1, 2), (0, 2), (3, 3), (3, 0)], 5)
  assert counts == {'nodes': 5, 'edges_in': 7, 'self_loops': 1, 'duplicates': 1, 'edges': 5}
  assert g.indptr.tolist() == [0, 2, 3, 4, 5, 5] and g.indptr.dtype == np.int32
  assert g.indices.tolist() == [1, 2, 2, 0, 0] and g.indices.dtype == np.int32
  assert g.in_degree.tolist() == [2, 1, 2, 0, 0] and g.in_degree.dtype == np.int32
  graph.save_csr(g, tmp_path)
  back = graph.load_csr(tmp_path)
  assert isinstance(back.indices, np.memmap) and not back.indices.flags.writeable
  for name in ('indptr', 'indices', 'in_degree'):
    np.testing.assert_array_equal(getattr(back, name), getattr(g, name))
  got = {(u, int(v)) for u in range(5) for v in back.neighbors(u)}
  assert got == {(0, 1), (0, 2), (1, 2), (2, 0), (3, 0)}


def test_csr_large_indptr_dtype_and_bad_ids(monkeypatch):
  monkeypatch.setattr(graph, '_INT32_MAX', 2)  # pretend 3 edges exceed 2^31 - 1
  g, _ = _csr([(0, 1), (1, 2), (2, 0)], 3)
  assert g.indptr.dtype == np.int64 and g.indptr.tolist() == [0, 1, 2, 3]
  with pytest.raises(ValueError, match=r'edge 1 \(1 -> 7\)'):
    _csr([(0, 1), (1, 7)], 3)
  with pytest.raises(FileNotFoundError, match='indptr.npy'):
    graph.load_csr('/nonexistent')


def _walk(g, seeds, hops, allowed=None, seed=0, **kw):
  allowed = np.ones(g.num_nodes, bool) if allowed is None else allowed
  return graph.sample_walks(g, allowed, np.asarray(seeds), np.asarray(hops), np.random.default_rng(seed), **kw)


def test_hubs_and_excluded_never_visited_and_choice_uniform():
  # Seed 0 links to hub 1 (in-degree 11 from nodes 10..19 + 0), excluded 2, and the plain nodes 3, 4, 5;
  # 3, 4, 5 link back to the hub / excluded node and to node 6.
  edges = [(0, 1), (0, 2), (0, 3), (0, 4), (0, 5)] + [(u, 1) for u in range(10, 20)]
  edges += [(v, w) for v in (3, 4, 5) for w in (1, 2, 6)]
  g, _ = _csr(edges, 20)
  hub_tau = 10
  allowed = np.ones(20, bool)
  allowed[2] = False
  allowed &= np.asarray(g.in_degree) <= hub_tau
  assert not allowed[1]
  n = 6000
  paths, ok, attempts, counts = _walk(g, np.zeros(n, np.int32), np.full(n, 2), allowed)
  assert ok.all() and counts['given_up'] == 0 and (attempts == 1).all()
  assert not np.isin(paths[:, 1:], [1, 2]).any()
  assert (paths[:, 2] == 6).all()
  # v1 is uniform over the three allowed neighbours {3, 4, 5} (the hub and the excluded page rejected).
  freq = np.bincount(paths[:, 1], minlength=6)[3:6] / n
  np.testing.assert_allclose(freq, [1 / 3] * 3, atol=0.03)


def test_no_revisits():
  # Complete digraph on 5 nodes, h = 4: every walk is a permutation of all 5 nodes (a Hamiltonian path), so
  # late steps must reject the visited nodes (including by the exact neighbour scan).
  g, _ = _csr([(u, v) for u in range(5) for v in range(5) if u != v], 5)
  paths, ok, _, _ = _walk(g, np.arange(2000) % 5, np.full(2000, 4))
  assert ok.all()
  assert all(sorted(p) == [0, 1, 2, 3, 4] for p in paths.tolist())


def test_dead_end_seed_retried_then_given_up():
  # 0 <-> 1 and 0 -> 2 (2 has no out-links): from 0 with h = 2 the only continuations revisit 0 or stop at 2.
  # Seed 3 -> 4 -> 5 always succeeds.
  g, _ = _csr([(0, 1), (1, 0), (0, 2), (3, 4), (4, 5)], 6)
  paths, ok, attempts, counts = _walk(g, [0, 3], [2, 2], max_retries=10)
  assert ok.tolist() == [False, True]
  assert attempts.tolist() == [11, 1]  # the first walk + 10 retries, then given up
  assert counts == {'attempted': 2, 'walked': 1, 'given_up': 1, 'retries': 10, 'dead_ends': 11}
  assert paths[1].tolist() == [3, 4, 5] and paths[0].tolist() == [0, -1, -1]


def test_retry_succeeds_when_a_later_walk_finds_a_way():
  # From 0: half the first steps go to dead end 1, half to 2 -> 3. P(all 11 attempts fail) = 2^-11.
  g, _ = _csr([(0, 1), (0, 2), (2, 3)], 4)
  paths, ok, attempts, counts = _walk(g, np.zeros(400, np.int32), np.full(400, 2), seed=1)
  assert (paths[ok] == [0, 2, 3]).all()
  assert ok.sum() >= 399
  # Attempts per item are geometric with p = 1/2: mean 2 (+- 0.2 at 400 items).
  assert abs(attempts.mean() - 2.0) < 0.2 and counts['retries'] == int(attempts.sum()) - 400


def test_seed_window_and_strata():
  # Nodes 0..9 with in-degrees 0..9 (node k gets links from k distinct sources 10..18); domains k % 5.
  # Each k links on to 20 + k -> 30 + k; node 5 also links to node 9.
  n = 40
  edges = [(10 + j, k) for k in range(10) for j in range(k)]
  edges += [(k, 20 + k) for k in range(10)] + [(20 + k, 30 + k) for k in range(10)] + [(5, 9)]
  g, _ = _csr(edges, n)
  assert np.asarray(g.in_degree)[:10].tolist() == list(range(9)) + [10]  # 9: from 10..18 and from 5
  domains = np.full(n, -1, np.int8)
  domains[:10] = np.arange(10) % 5
  out = graph.sample_paths(g, domains, np.zeros(n, bool), np.ones(n, bool), 1000, seed=0, hub_in_degree=8,
                           min_seed_in_degree=3, hop_choices=(2,), hop_probs=(1.0,))
  # Seeds: in-degree in [3, 8] -> nodes 3..8; the hub 9 (in-degree 10 > 8) is never a seed nor visited.
  assert set(np.unique(out['seeds']).tolist()) == {3, 4, 5, 6, 7, 8}
  assert out['counts']['seed_candidates'] == 6
  assert not (out['paths'] == 9).any()
  assert (out['paths'][:, 1:3] == out['seeds'][:, None] + [20, 30]).all()
  # Strata: 1000 seeds over the 5 domains (3..8 cover all five), 200 each.
  assert np.bincount(out['domains']).tolist() == [200] * 5


def test_stratified_seeds_even_split_and_error():
  domains = np.array([0, 0, 0, 1, 2, 2, -1], np.int8)
  cand = np.array([1, 1, 1, 1, 1, 0, 1], bool)
  seeds, doms = graph.stratified_seeds(domains, cand, 10, np.random.default_rng(0))
  assert sorted(np.bincount(doms).tolist()) == [3, 3, 4]  # 10 over the 3 domains with candidates
  assert set(seeds.tolist()) <= {0, 1, 2, 3, 4} and (domains[seeds] == doms).all()
  # Within a domain every candidate is drawn equally often (+-1): domain 0's 3 or 4 seeds use 0, 1, 2 each once+.
  for d in (0, 1, 2):
    uses = np.bincount(seeds[doms == d], minlength=7)[np.flatnonzero(cand & (domains == d))]
    assert uses.max() - uses.min() <= 1 and uses.sum() == (doms == d).sum()
  with pytest.raises(ValueError, match='no seed candidate'):
    graph.stratified_seeds(domains, np.zeros(7, bool), 5, np.random.default_rng(0))


def test_hop_distribution_chi_square():
  # h ~ Cat({2,3,4}; .4, .4, .2): chi-square with 2 degrees of freedom below 13.82 (p = 0.001).
  n = 20000
  hops = graph.draw_hops(n, np.random.default_rng(3))
  observed = np.array([(hops == h).sum() for h in (2, 3, 4)])
  expected = n * np.array([0.4, 0.4, 0.2])
  assert ((observed - expected) ** 2 / expected).sum() < 13.82
  # The walks keep each item's h: on a complete graph (no dead end) path lengths follow the same law.
  g, _ = _csr([(u, v) for u in range(6) for v in range(6) if u != v], 6)
  paths, ok, _, _ = _walk(g, np.arange(n) % 6, hops)
  assert ok.all()
  np.testing.assert_array_equal((paths >= 0).sum(1) - 1, hops)


def test_sample_walks_bad_input():
  g, _ = _csr([(0, 1)], 2)
  with pytest.raises(ValueError, match='hops'):
    _walk(g, [0, 1], [2])
  with pytest.raises(ValueError, match='hops'):
    _walk(g, [0], [0])
