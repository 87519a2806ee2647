"""A dataset folder being built: the settings it records (`build_config.json`, compared on resume), the lock one build
holds on it (`build.lock`), and the durable write of a finished split (`save_split`). `build` (the Wikipedia
pipeline) and `lookup_world` both write their folders through it."""

import contextlib
import fcntl
import json
import os
import pathlib
from collections.abc import Sequence

from osvl_jax.data import pipeline as pipeline_data

BUILD_CONFIG_FILE = 'build_config.json'  # the settings a dataset folder was built with (compared on resume)
LOCK_FILE = 'build.lock'  # held by the build writing the folder (`locked`)


def check_settings(out: pathlib.Path, settings: dict, defaults: dict, stages: Sequence[str]) -> None:
  """Records `settings` in a new dataset folder, or one where none of `stages` has finished (a build that failed in
  its first stage left nothing built with the settings it recorded); refuses a folder built with other settings.

  Args:
    out: the dataset folder.
    settings: what decides the content, JSON values.
    defaults: the value of a field missing from an older build_config.json (a field added since).
    stages: the split folders whose finished presence (`pipeline_data.has_split`) means the folder was built.
  Raises:
    ValueError: the folder's build_config.json differs (naming each field, recorded vs asked), or the folder holds
      stage outputs but no build_config.json (a build whose settings are unknown).
  """
  path = out / BUILD_CONFIG_FILE
  built = any(pipeline_data.has_split(out / name) for name in stages)
  if path.is_file() and built:
    recorded = json.loads(path.read_text())
    recorded = {**{k: v for k, v in defaults.items() if k not in recorded}, **recorded}
    diff = {k: (recorded.get(k), settings.get(k)) for k in sorted(set(recorded) | set(settings))
            if recorded.get(k) != settings.get(k)}
    if diff:
      named = ', '.join(f'{k}: built with {a!r}, asked {b!r}' for k, (a, b) in diff.items())
      raise ValueError(f'{out} holds a dataset built with other settings ({named}); use another folder '
                       '(--config.data.dir or --workdir) or delete this one to rebuild')
    return
  if built:
    raise ValueError(f'{out} holds a dataset without {BUILD_CONFIG_FILE} (its settings are unknown); use another '
                     'folder or delete this one to rebuild')
  pipeline_data.write_durably(path, json.dumps(settings, indent=1, sort_keys=True))


def save_split(records: list[dict], folder: pathlib.Path, counts: dict, features=None) -> None:
  """Writes `records` as a dataset + counts.json under a temp folder, made the finished split `folder` once on disk
  (`pipeline_data.publish_split`); no records: one empty data file (which `datasets.load_from_disk` reads)."""
  import datasets
  import shutil
  tmp = folder.with_name(folder.name + '.tmp')
  shutil.rmtree(tmp, ignore_errors=True)
  if records:
    ds = datasets.Dataset.from_list(records, features=features)
  else:
    ds = datasets.Dataset.from_dict({'prompt_id': []} if features is None else {k: [] for k in features},
                                    features=features)
  ds.save_to_disk(str(tmp), num_shards=None if records else 1)
  pipeline_data.publish_split(tmp, folder, counts)


@contextlib.contextmanager
def locked(out: pathlib.Path):
  """Holds `<out>/build.lock` (an exclusive `fcntl.flock`, released when the build ends, also by a kill), the file
  holding the holder's pid.

  Raises:
    BlockingIOError: another process holds it (naming its pid and the lock file); nothing was written.
  """
  path = out / LOCK_FILE
  fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
  try:
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as e:
      holder = os.pread(fd, 32, 0).decode(errors='replace').strip() or '?'
      raise BlockingIOError(e.errno, f'{out} is being built by another process (pid {holder}, holding {path}); '
                            'wait for it to end, or stop it, before building this folder') from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f'{os.getpid()}\n'.encode(), 0)
    yield
  finally:
    os.close(fd)
