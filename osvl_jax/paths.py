"""Where the real data lives: one setting, `OSVL_DATA_DIR` (default `../shared/data` beside the repo)."""

import os
import pathlib

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent


def data_dir() -> pathlib.Path:
  """The read-only data folder.

  Returns:
    `$OSVL_DATA_DIR` if set, else `<repo>/../shared/data`.
  Raises:
    FileNotFoundError: naming the path and the variable when the folder does not exist.
  """
  path = pathlib.Path(os.environ.get('OSVL_DATA_DIR', REPO_ROOT.parent / 'shared' / 'data'))
  if not path.is_dir():
    raise FileNotFoundError(f'data folder {path} does not exist; set OSVL_DATA_DIR to the shared data folder')
  return path
