"""Workdir paths that may be cloud URLs: `gs://bucket/run` stays a URL from the command line to orbax/tensorstore.

`pathlib.Path('gs://bucket/run')` is the local folder `gs:/bucket/run`; `etils.epath.Path` (orbax's own path
type) keeps the scheme, and its file operations go to GCS through fsspec (`gcsfs`, a pinned dependency;
tested against a local fake GCS server in `tests/distributed/test_gcs_checkpoint.py`). Local paths are made
absolute, as orbax wants them.
"""

from __future__ import annotations

import os
import re

from etils import epath

_URL = re.compile(r'^[a-zA-Z][a-zA-Z0-9+.-]*://')


def is_remote(path: str | os.PathLike) -> bool:
  """True for a URL (`gs://`, `s3://`, ...), False for a local path."""
  return bool(_URL.match(os.fspath(path)))


def path(value: str | os.PathLike) -> epath.Path:
  """`value` as an `epath.Path`: URLs unchanged (str(path(u)) == u without a trailing '/'), local paths absolute."""
  if isinstance(value, epath.Path) and is_remote(value):
    return value
  text = os.fspath(value)
  return epath.Path(text) if is_remote(text) else epath.Path(os.path.abspath(text))
