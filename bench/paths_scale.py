"""Link graph + constrained walks at English-Wikipedia scale (data_pipeline/graph.py, DESIGN.md §7.1-7.2).

Command: `nice .venv/bin/python bench/paths_scale.py [--nodes 6500000] [--edges 160000000] [--paths 200000]`
(`--nodes 100000 --edges 2000000` for a quick run).

A synthetic power-law link graph of `--nodes` nodes and `--edges` edges, made with numpy in chunks:
out-degrees ~ multinomial(edges; Pareto(alpha=2) + 1 weights) (heavy-tailed like article lengths); targets drawn
from a continuous Zipf law over a random popularity ranking, P(rank r) ~ r^-0.8 (preferential in-degrees: the top
node gets ~1 % of all links, ~500 nodes exceed tau = 10,000, as Wikipedia's hubs do). Edges come ordered by
source, as a dump is read. Per node: a domain (70 % one of the five, uniform), 1 % excluded pages.

Measures:
  graph_build_s  seconds of `graph.build_csr` (sort + dedupe + CSR + in-degree) on the edge list
  graph_rss_gb   resident memory of this process (psutil, else /proc) after the graph was saved, freed, opened
                 again with mmap_mode='r' and walked: the graph's pages plus the interpreter and the node masks
  paths_per_s    walked items per second of `graph.sample_paths` on one core (stratified seeds, tau = 10,000,
                 seed in-degree in [50, tau], h ~ Cat({2,3,4}; .4,.4,.2), up to 10 retries)
Prints exactly `graph_build_s=<x> graph_rss_gb=<y> paths_per_s=<z>` on stdout; details on stderr.
Feeds BENCHMARKS.md, "Graph scale".
"""

import os

os.environ.setdefault('OMP_NUM_THREADS', '1')  # one core (numpy's element-wise ops are single-threaded anyway)
os.environ.setdefault('OPENBLAS_NUM_THREADS', '1')

import argparse  # noqa: E402
import gc  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from data_pipeline import graph  # noqa: E402

_CHUNK = 1 << 24


def rss_bytes() -> int:
  """Current resident set size of this process in bytes (psutil when installed, else /proc/self/statm)."""
  try:
    import psutil
    return psutil.Process().memory_info().rss
  except ImportError:
    with open('/proc/self/statm') as f:
      return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')


def synthetic_edges(nodes: int, edges: int, rng: np.random.Generator,
                    zipf: float = 0.8) -> tuple[np.ndarray, np.ndarray]:
  """(src [edges] int32 sorted, dst [edges] int32) of the power-law graph described in the module docstring."""
  weights = rng.pareto(2.0, nodes) + 1.0
  out_degree = rng.multinomial(edges, weights / weights.sum())
  src = np.repeat(np.arange(nodes, dtype=np.int32), out_degree)
  popularity = rng.permutation(nodes).astype(np.int32)  # rank r -> node id
  dst = np.empty(edges, np.int32)
  top = float(nodes + 1) ** (1.0 - zipf) - 1.0
  for a in range(0, edges, _CHUNK):
    u = rng.random(min(_CHUNK, edges - a))
    rank = np.power(top * u + 1.0, 1.0 / (1.0 - zipf)).astype(np.int64) - 1  # inverse CDF of x^-zipf on [1, N+1)
    dst[a:a + len(u)] = popularity[np.minimum(rank, nodes - 1)]
  return src, dst


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--nodes', type=int, default=6_500_000)
  parser.add_argument('--edges', type=int, default=160_000_000)
  parser.add_argument('--paths', type=int, default=200_000, help='walk items sampled for the rate')
  parser.add_argument('--hub_in_degree', type=int, default=10_000)
  parser.add_argument('--min_seed_in_degree', type=int, default=50)
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--dir', default='', help='where the .npy arrays go (default: a temporary folder)')
  args = parser.parse_args()
  if args.nodes < 2 or args.edges < 1 or args.paths < 1:
    parser.error(f'--nodes={args.nodes} (>= 2), --edges={args.edges} (>= 1), --paths={args.paths} (>= 1)')
  log = lambda *a: print('[paths_scale]', *a, file=sys.stderr, flush=True)  # noqa: E731
  rng = np.random.default_rng(args.seed)
  rss0 = rss_bytes()

  t0 = time.perf_counter()
  src, dst = synthetic_edges(args.nodes, args.edges, rng)
  log(f'edges generated in {time.perf_counter() - t0:.1f}s, rss={rss_bytes() / 2**30:.2f} GB')
  t0 = time.perf_counter()
  g, counts = graph.build_csr(src, dst, args.nodes)
  build_s = time.perf_counter() - t0
  del src, dst
  log(f'build_csr {build_s:.1f}s {counts} indptr={g.indptr.dtype} arrays={g.nbytes() / 2**30:.3f} GB '
      f'peak_rss={resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GB')
  deg = np.asarray(g.in_degree)
  log(f'in-degree max={deg.max()} hubs(>{args.hub_in_degree})={(deg > args.hub_in_degree).sum()} '
      f'seed window={((deg >= args.min_seed_in_degree) & (deg <= args.hub_in_degree)).sum()}')

  with tempfile.TemporaryDirectory(dir=args.dir or None) as folder:
    graph.save_csr(g, folder)
    del g, deg
    gc.collect()
    rss_freed = rss_bytes()
    g = graph.load_csr(folder)
    domains = np.where(rng.random(args.nodes) < 0.7, rng.integers(0, 5, args.nodes), -1).astype(np.int8)
    excluded = rng.random(args.nodes) < 0.01
    seedable = np.ones(args.nodes, bool)
    kw = dict(hub_in_degree=args.hub_in_degree, min_seed_in_degree=args.min_seed_in_degree)
    graph.sample_paths(g, domains, excluded, seedable, 1000, args.seed, **kw)  # warm-up
    t0 = time.perf_counter()
    out = graph.sample_paths(g, domains, excluded, seedable, args.paths, args.seed + 1, **kw)
    walk_s = time.perf_counter() - t0
    rss = rss_bytes()
    log(f'sample_paths {walk_s:.2f}s {out["counts"]} hops={np.bincount(out["hops"]).tolist()}')
    log(f'rss: start={rss0 / 2**30:.2f} GB, after freeing the build={rss_freed / 2**30:.2f} GB, '
        f'graph mmapped + walked={rss / 2**30:.2f} GB')
    print(f'graph_build_s={build_s:.2f} graph_rss_gb={rss / 2**30:.3f} '
          f'paths_per_s={out["counts"]["walked"] / walk_s:.0f}')


if __name__ == '__main__':
  main()
