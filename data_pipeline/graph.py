"""The link graph as CSR arrays and the constrained random walks on it (DESIGN.md §7.1-7.2), numpy only.

CSR: `indptr` [N+1] (int32, int64 when the edge count exceeds 2^31 - 1), `indices` [E] int32 (out-neighbours of
node i are `indices[indptr[i]:indptr[i+1]]`, sorted, no duplicates, no self-loops) and `in_degree` [N] int32.
`build_csr` sorts one int64 key per edge (src * N + dst) in place, so the cost is a few bytes per edge and
no Python object per edge: a synthetic graph of English-Wikipedia size (6.5 M nodes, 160 M edges) built in
84 s at 3.7 GB peak RSS and its arrays hold 0.64 GB (bench/paths_scale.py, BENCHMARKS.md). `save_csr` /
`load_csr` use `.npy` files opened with `mmap_mode='r'`.

Walks (`sample_walks`), all constraints of DESIGN.md §7.2 / Appendix D.1:
  * hubs skipped: a node with in-degree > `hub_in_degree` (tau, default 10,000) is never stepped onto;
  * namespace / list / disambiguation pages never visited (`excluded`, one bool per node, `wiki.exclusion_mask`);
  * redirects already dereferenced when the edges were made (`wiki.resolve_links`);
  * no revisits (all h+1 nodes distinct);
  * seeds: in-degree in [`min_seed_in_degree` (50), tau], not excluded, a domain, stratified over the five
    domains (`stratified_seeds`);
  * h ~ Cat({2, 3, 4}; 0.4, 0.4, 0.2) per item; a walk that dead-ends (no allowed unvisited out-neighbour) is
    retried from the same seed with the same h, up to `max_retries` (10) times, then the item is given up;
  * optional masks of the caller (the `paths` stage): `final` [N] (the h-th node, e.g. one with an answerable
    attribute) and `edge_ok` [E] (edges the walk may follow, e.g. those stated in a sentence of their source).
The next node is uniform over the current node's allowed, unvisited out-neighbours: each step draws uniform
out-edges for all walks at once and rejects disallowed / visited ones (`tries` rounds), and the few walks still
undecided scan their neighbour list exactly, so the choice stays exactly uniform and a dead end is real.
"""

import dataclasses
import pathlib

import numpy as np

_INT32_MAX = np.iinfo(np.int32).max
HOP_CHOICES = (2, 3, 4)
HOP_PROBS = (0.4, 0.4, 0.2)


@dataclasses.dataclass
class CSRGraph:
  """Directed graph in CSR form (see the module docstring for dtypes); arrays may be read-only memmaps."""
  indptr: np.ndarray
  indices: np.ndarray
  in_degree: np.ndarray

  @property
  def num_nodes(self) -> int:
    return len(self.indptr) - 1

  @property
  def num_edges(self) -> int:
    return len(self.indices)

  def neighbors(self, node: int) -> np.ndarray:
    """[deg] int32 out-neighbours of `node`, sorted."""
    return np.asarray(self.indices[self.indptr[node]:self.indptr[node + 1]])

  def out_degree(self) -> np.ndarray:
    """[N] int64 out-degrees."""
    return np.diff(np.asarray(self.indptr, np.int64))

  def nbytes(self) -> int:
    """Bytes of the three arrays."""
    return int(self.indptr.nbytes + self.indices.nbytes + self.in_degree.nbytes)


def build_csr(src: np.ndarray, dst: np.ndarray, num_nodes: int, chunk: int = 1 << 24) -> tuple[CSRGraph, dict]:
  """CSR graph from an edge list, self-loops and duplicate edges dropped.

  Args:
    src, dst: [E] integer node ids in [0, num_nodes).
    num_nodes: N.
    chunk: edges handled per vectorised pass (bounds the temporaries).
  Returns:
    (graph, counts) with counts = {'nodes', 'edges_in', 'self_loops', 'duplicates', 'edges'}.
  Raises:
    ValueError: src / dst of different lengths, or an id outside [0, num_nodes) (the first bad edge named).
  """
  src, dst = np.asarray(src), np.asarray(dst)
  if src.shape != dst.shape or src.ndim != 1:
    raise ValueError(f'build_csr: src {src.shape} and dst {dst.shape} must be 1-D arrays of one length')
  n, m = int(num_nodes), len(src)
  key = np.empty(m, np.int64)
  filled = 0
  for a in range(0, m, chunk):
    s, d = src[a:a + chunk].astype(np.int64), dst[a:a + chunk].astype(np.int64)
    bad = (s < 0) | (s >= n) | (d < 0) | (d >= n)
    if bad.any():
      i = a + int(np.argmax(bad))
      raise ValueError(f'build_csr: edge {i} ({src[i]} -> {dst[i]}) has a node id outside [0, {n})')
    keep = s != d
    k = s[keep] * n + d[keep]
    key[filled:filled + len(k)] = k
    filled += len(k)
  key = key[:filled]  # a view: no copy
  key.sort()
  unique = np.empty(filled, bool)
  if filled:
    unique[0] = True
    np.not_equal(key[1:], key[:-1], out=unique[1:])
  num_edges = int(unique.sum())
  indices = np.empty(num_edges, np.int32)
  out_degree = np.zeros(n, np.int64)
  in_degree = np.zeros(n, np.int64)
  pos = 0
  for a in range(0, filled, chunk):
    k = key[a:a + chunk][unique[a:a + chunk]]
    d = (k % n).astype(np.int32)
    indices[pos:pos + len(k)] = d
    out_degree += np.bincount(k // n, minlength=n)
    in_degree += np.bincount(d, minlength=n)
    pos += len(k)
  del key, unique
  indptr = np.zeros(n + 1, np.int64 if num_edges > _INT32_MAX else np.int32)
  np.cumsum(out_degree, out=indptr[1:])
  counts = {'nodes': n, 'edges_in': m, 'self_loops': m - filled, 'duplicates': filled - num_edges,
            'edges': num_edges}
  return CSRGraph(indptr, indices, in_degree.astype(np.int32)), counts


_FILES = ('indptr', 'indices', 'in_degree')


def save_csr(graph: CSRGraph, folder: str | pathlib.Path) -> None:
  """Writes `indptr.npy`, `indices.npy`, `in_degree.npy` under `folder` (created)."""
  folder = pathlib.Path(folder)
  folder.mkdir(parents=True, exist_ok=True)
  for name in _FILES:
    np.save(folder / f'{name}.npy', np.asarray(getattr(graph, name)))


def load_csr(folder: str | pathlib.Path, mmap: bool = True) -> CSRGraph:
  """Opens what `save_csr` wrote (read-only memmaps unless `mmap=False`).

  Raises:
    FileNotFoundError: naming the missing `.npy` file.
  """
  folder = pathlib.Path(folder)
  arrays = {}
  for name in _FILES:
    path = folder / f'{name}.npy'
    if not path.is_file():
      raise FileNotFoundError(f'{path}: no CSR array (data_pipeline.graph.save_csr)')
    arrays[name] = np.load(path, mmap_mode='r' if mmap else None)
  return CSRGraph(**arrays)


def draw_hops(num: int, rng: np.random.Generator, choices=HOP_CHOICES, probs=HOP_PROBS) -> np.ndarray:
  """[num] int8 hop counts h ~ Cat(choices; probs) (probs renormalised)."""
  p = np.asarray(probs, np.float64)
  return rng.choice(np.asarray(choices, np.int8), size=num, p=p / p.sum())


def stratified_seeds(domains: np.ndarray, candidates: np.ndarray, num: int,
                     rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
  """`num` seeds split as evenly as possible over the domains that have candidates, and within a domain over its
  candidates (shuffled passes over them: each is used floor or ceil of share / candidates times).

  Args:
    domains: [N] int8 domain index per node (`wiki.node_domains`; -1 = none).
    candidates: [N] bool nodes allowed as seeds.
    num: seeds to draw (a candidate repeats only once every candidate of its domain has been drawn).
  Returns:
    (seeds [num] int32, seed domains [num] int8), shuffled.
  Raises:
    ValueError: no candidate has a domain.
  """
  present = [d for d in np.unique(domains[candidates]) if d >= 0]
  if not present:
    raise ValueError('stratified_seeds: no seed candidate has a domain (check the in-degree window and masks)')
  share = np.full(len(present), num // len(present))
  share[rng.permutation(len(present))[:num % len(present)]] += 1
  seeds, doms = [], []
  for d, k in zip(present, share):
    pool = np.flatnonzero(candidates & (domains == d))
    laps = -(-int(k) // len(pool))  # shuffled passes over the pool: every candidate used equally (+-1)
    seeds.append(np.concatenate([rng.permutation(pool) for _ in range(laps)] or [pool[:0]])[:k])
    doms.append(np.full(k, d, np.int8))
  order = rng.permutation(num)
  return np.concatenate(seeds).astype(np.int32)[order], np.concatenate(doms)[order]


def _walk_once(graph: CSRGraph, allowed: np.ndarray, seeds: np.ndarray, hops: np.ndarray,
               rng: np.random.Generator, tries: int, final: np.ndarray,
               edge_ok: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
  """One walk per (seed, h), all at once (the h-th node also in `final`, every edge in `edge_ok`).

  Returns (paths [B, max h + 1] int32, -1 past h or after a dead end; ok [B] bool = reached h hops)."""
  b = len(seeds)
  path = np.full((b, int(hops.max()) + 1), -1, np.int32)
  path[:, 0] = seeds
  alive = np.ones(b, bool)
  for t in range(1, path.shape[1]):
    act = np.flatnonzero(alive & (hops >= t))
    if not act.size:
      break
    cur = path[act, t - 1]
    start = np.asarray(graph.indptr[cur], np.int64)
    deg = np.asarray(graph.indptr[cur + 1], np.int64) - start
    chosen = np.full(act.size, -1, np.int32)
    seen = path[act, :t]
    pend = np.flatnonzero(deg > 0)
    for _ in range(tries):  # Rejection rounds: a uniform out-edge, kept when allowed and unvisited.
      if not pend.size:
        break
      j = start[pend] + np.minimum((rng.random(pend.size) * deg[pend]).astype(np.int64), deg[pend] - 1)
      v = graph.indices[j]
      ok = allowed[v] & (final[v] | (hops[act[pend]] != t)) & ~(seen[pend] == v[:, None]).any(1)
      if edge_ok is not None:
        ok &= edge_ok[j]
      chosen[pend[ok]] = v[ok]
      pend = pend[~ok]
    for k in pend:  # Exact fallback: uniform over the allowed unvisited neighbours, or a real dead end.
      nb = np.asarray(graph.indices[start[k]:start[k] + deg[k]])
      keep = allowed[nb] & (final[nb] | (hops[act[k]] != t)) & ~np.isin(nb, seen[k])
      if edge_ok is not None:
        keep &= np.asarray(edge_ok[start[k]:start[k] + deg[k]])
      nb = nb[keep]
      if nb.size:
        chosen[k] = nb[rng.integers(nb.size)]
    path[act, t] = chosen
    alive[act[chosen < 0]] = False
  return path, alive


def sample_walks(graph: CSRGraph, allowed: np.ndarray, seeds: np.ndarray, hops: np.ndarray,
                 rng: np.random.Generator, max_retries: int = 10, tries: int = 8,
                 batch: int = 1 << 16, final: np.ndarray | None = None, edge_ok: np.ndarray | None = None
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict]:
  """Constrained walks for items (seed_i, h_i), each retried after a dead end up to `max_retries` times.

  Args:
    graph: the CSR graph.
    allowed: [N] bool nodes a walk may step onto (not excluded, in-degree <= tau).
    seeds: [M] int32 start nodes; hops: [M] int hop counts >= 1.
    rng: the random stream (same stream, same walks).
    max_retries: fresh walks after the first one before an item is given up.
    tries: rejection rounds per step before the exact neighbour scan.
    batch: walks advanced together.
    final: [N] bool nodes a walk may end on (its h-th node; the `paths` stage: nodes with an answerable infobox
      attribute); None = any allowed node.
    edge_ok: [E] bool edges (positions in `graph.indices`) a walk may follow (the `paths` stage: the link is
      stated in a sentence of its source and can pick its target out); None = every edge.
  Returns:
    (paths [M, max h + 1] int32 (-1 padded; all -1 past v0 for given-up items), ok [M] bool,
     attempts [M] int8 walks tried per item, counts {'attempted', 'walked', 'given_up', 'retries',
     'dead_ends'}).
  Raises:
    ValueError: seeds and hops differ in length, or a hop count < 1.
  """
  seeds, hops = np.asarray(seeds, np.int32), np.asarray(hops, np.int64)
  if seeds.shape != hops.shape or (hops < 1).any():
    raise ValueError(f'sample_walks: seeds {seeds.shape} and hops {hops.shape} must match and hops be >= 1')
  final = np.ones(len(allowed), bool) if final is None else np.asarray(final, bool)
  m = len(seeds)
  paths = np.full((m, int(hops.max(initial=1)) + 1), -1, np.int32)
  paths[:, 0] = seeds
  ok = np.zeros(m, bool)
  attempts = np.zeros(m, np.int8)
  pending = np.arange(m)
  for _ in range(max_retries + 1):
    if not pending.size:
      break
    attempts[pending] += 1
    done = np.zeros(pending.size, bool)
    for a in range(0, pending.size, batch):
      items = pending[a:a + batch]
      got, good = _walk_once(graph, allowed, seeds[items], hops[items], rng, tries, final, edge_ok)
      paths[items[good], :got.shape[1]] = got[good]
      done[a:a + batch] = good
    ok[pending[done]] = True
    pending = pending[~done]
  dead_ends = int(attempts.sum()) - int(ok.sum())
  counts = {'attempted': m, 'walked': int(ok.sum()), 'given_up': m - int(ok.sum()),
            'retries': int(attempts.sum()) - m, 'dead_ends': dead_ends}
  return paths, ok, attempts, counts


def sample_paths(graph: CSRGraph, domains: np.ndarray, excluded: np.ndarray, seedable: np.ndarray, num: int,
                 seed: int, hub_in_degree: int = 10_000, min_seed_in_degree: int = 50,
                 hop_choices=HOP_CHOICES, hop_probs=HOP_PROBS, max_retries: int = 10) -> dict:
  """`num` walk items: stratified seeds, h ~ Cat(hop_choices; hop_probs), `sample_walks` (DESIGN.md §7.2).

  Args:
    graph: the CSR graph (redirects already resolved).
    domains: [N] int8 (`wiki.node_domains`); excluded: [N] bool (`wiki.exclusion_mask`);
    seedable: [N] bool extra seed condition (`wiki.seed_mask`: infobox + image).
    num: items; seed: the random seed (same seed, same items).
    hub_in_degree: tau; min_seed_in_degree: lower end of the seed in-degree window.
  Returns:
    {'paths' [K, 5] int32 (-1 padded), 'hops' [K] int8, 'seeds' [K] int32, 'domains' [K] int8 for the K walked
     items, 'counts': sample_walks counts + 'seed_candidates' and 'walked_per_domain'}.
  """
  rng = np.random.default_rng(seed)
  in_degree = np.asarray(graph.in_degree)
  allowed = ~np.asarray(excluded, bool) & (in_degree <= hub_in_degree)
  candidates = allowed & (in_degree >= min_seed_in_degree) & np.asarray(seedable, bool) & (domains >= 0)
  seeds, seed_domains = stratified_seeds(domains, candidates, num, rng)
  hops = draw_hops(num, rng, hop_choices, hop_probs)
  paths, ok, _, counts = sample_walks(graph, allowed, seeds, hops, rng, max_retries)
  counts['seed_candidates'] = int(candidates.sum())
  counts['walked_per_domain'] = {int(d): int((seed_domains[ok] == d).sum()) for d in np.unique(seed_domains)}
  return {'paths': paths[ok], 'hops': hops[ok], 'seeds': seeds[ok], 'domains': seed_domains[ok],
          'counts': counts}
