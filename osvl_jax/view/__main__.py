"""`python -m osvl_jax.view PATH --out=DIR [--limit=N]`: writes a static page of the trajectories under PATH.

PATH: an evaluation workdir, GRPO rollout dumps (a workdir with rollouts/, a folder of <step>.pkl, or one), a built
dataset (its sft split is shown) or a workdir holding one, a datasets folder / .arrow / JSON-lines file of
trajectory records. Prints `view: <DIR>/index.html trajectories=<n> (<source>: <count>, ...)`; exit status 2 when
PATH holds nothing the viewer reads (the reason on stderr).
"""

import argparse
import sys

from osvl_jax import view


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog='python -m osvl_jax.view', description=__doc__.split('\n\n')[0])
  parser.add_argument('path', metavar='PATH', help=view.FORMATS)
  parser.add_argument('--out', required=True, help='output folder (index.html and images/ are written there)')
  parser.add_argument('--limit', type=int, default=500, help='at most this many trajectories per source')
  args = parser.parse_args(argv)
  try:
    page, found = view.view(args.path, args.out, args.limit)
  except (OSError, view.ViewError) as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  counts = ', '.join(f'{k}: {len(v) if k == "unreadable" else v}' for k, v in found.items())
  print(f'view: {page} trajectories={sum(v for k, v in found.items() if k in ("eval", "rollout", "records"))} '
        f'({counts})')
  return 0


if __name__ == '__main__':
  sys.exit(main())
