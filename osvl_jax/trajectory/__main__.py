"""`python -m osvl_jax.trajectory --check FILE.jsonl [...]`: validates stored trajectories (`check.main`).

Prints each problem as `FILE:LINE: who: problem`, then `trajectories=<n> invalid=<m>`; exit status 1 when any
trajectory is invalid.
"""

import sys

from osvl_jax.trajectory.check import main

if __name__ == '__main__':
  sys.exit(main())
