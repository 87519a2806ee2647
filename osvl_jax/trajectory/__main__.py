"""`python -m osvl_jax.trajectory --check PATH [...]`: validates stored trajectories (`check.main`).

PATH: a JSON-lines file of `Trajectory.to_json` records, an HF datasets folder of `Trajectory.to_record` rows
(e.g. the data pipeline's `<dataset>/sft`) or one of its .arrow files. Prints each problem as
`PATH:WHERE: who: problem` (WHERE = line number, or `row i` in a dataset), then `trajectories=<n> invalid=<m>`;
exit status 1 when any trajectory is invalid, 2 when a PATH cannot be read (reason on stderr).
"""

import sys

from osvl_jax.trajectory.check import main

if __name__ == '__main__':
  sys.exit(main())
