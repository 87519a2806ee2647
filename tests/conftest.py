"""Suite-wide collection order: the heaviest folders first.

`make test` runs the files on two pytest-xdist workers (`--dist loadfile`: a file's tests stay on one worker, so
its module fixtures are built once). With `--no-loadscope-reorder` (xdist otherwise puts the files with the most
tests first) workers take files in collection order, so the order decides how the run
ends: with the multi-process jobs of tests/distributed and the long training files first, the short files of
the other folders fill the end and the two workers finish close together. The multi-process jobs also run while
the workers are young and small (a worker's memory grows with the programs it has compiled), which keeps their
extra processes within the machine's memory.
"""

FIRST = ('tests/distributed/', 'tests/train/', 'tests/models/', 'tests/serve/', 'tests/rollout/')


def _rank(item) -> int:
  path = item.nodeid
  return next((i for i, prefix in enumerate(FIRST) if path.startswith(prefix)), len(FIRST))


def pytest_collection_modifyitems(session, config, items):  # pylint: disable=unused-argument
  items.sort(key=_rank)   # stable: within a folder, the files and their tests keep their order
