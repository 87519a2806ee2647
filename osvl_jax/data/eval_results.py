"""Reading an evaluation workdir's stored results: the file names, the record key and the readers that
`osvl_jax.eval.results` (which writes the files) and `python -m osvl_jax.view` (which shows them) share.

`<workdir>/results.jsonl`: one judged record per line, keyed by (run, benchmark, item_key); a later line with the
same key (a re-judged or re-rolled item) replaces an earlier one; a torn line (a killed run) is skipped.
`<workdir>/trajectories.jsonl`: one line `{"run", "benchmark", "item_key", "trajectory": Trajectory.to_json}` per
new record; a torn line is skipped.
"""

import json
import pathlib
from collections.abc import Iterator
from typing import Any

RESULTS_FILE = 'results.jsonl'
TRAJECTORIES_FILE = 'trajectories.jsonl'

Key = tuple[str, str, str]


def record_key(record: dict) -> Key:
  """(run, benchmark, item_key) of a judged record or a trajectory line.

  Raises:
    KeyError: a field is missing; TypeError: `record` is not a mapping.
  """
  return str(record['run']), str(record['benchmark']), str(record['item_key'])


def read_records(workdir: str | pathlib.Path) -> dict[Key, dict]:
  """{key: the last record of that key} of `<workdir>/results.jsonl`, in order of first appearance; torn lines
  skipped; {} when there is no file."""
  path = pathlib.Path(workdir) / RESULTS_FILE
  records = {}
  if not path.is_file():
    return records
  with path.open(encoding='utf-8', errors='replace') as f:   # (a torn line may end inside a character)
    for line in f:
      try:
        record = json.loads(line)
        records[record_key(record)] = record  # a later line (re-judged) replaces an earlier one
      except (json.JSONDecodeError, KeyError, TypeError):
        continue  # a torn line: its item was redone
  return records


def trajectory_lines(workdir: str | pathlib.Path) -> Iterator[tuple[Key, dict]]:
  """Yields ((run, benchmark, item_key), the trajectory's record, not decoded) for each whole line of
  `<workdir>/trajectories.jsonl` (a torn line is skipped)."""
  path = pathlib.Path(workdir) / TRAJECTORIES_FILE
  if not path.is_file():
    return
  with path.open(encoding='utf-8', errors='replace') as f:   # (a torn line may end inside a character)
    for line in f:
      try:
        row = json.loads(line)
        key = record_key(row)
        traj = dict(row['trajectory'])
      except (json.JSONDecodeError, KeyError, TypeError, ValueError):
        continue  # a torn line (a killed run)
      yield key, traj


def read_trajectories(workdir: str | pathlib.Path) -> Iterator[tuple[Key, Any]]:
  """Yields ((run, benchmark, item_key), Trajectory) for each whole line of `<workdir>/trajectories.jsonl` that
  decodes."""
  from osvl_jax.trajectory import record  # pylint: disable=g-import-not-at-top
  for key, row in trajectory_lines(workdir):
    try:
      traj = record.Trajectory.from_record(row)
    except (KeyError, TypeError, ValueError):
      continue  # a line that parses but does not decode
    yield key, traj
