"""Writing an export folder safely: the one rule set for every folder the project exports into (an HF folder from
`python -m osvl_jax.export_hf`, a weight version of `rollout.weight_publish`).

An export never deletes what it did not write:
  - it writes into a new or empty folder, or over a previous export of the same kind only when asked
    (`overwrite`); a previous export is recognised by its marker file `MARKER` (JSON: the tool, the kind, the
    format version and the files it wrote), and it is refused when it holds any file the marker does not list;
  - it refuses a folder that is, or is an ancestor of, a protected path (the workdir, the checkpoint folder being
    exported; symlinks resolved), or that lies inside a checkpoint folder, and any other non-empty folder;
  - every file is written into a temporary folder beside the target (same parent, so the rename is atomic), the
    marker last; the finished folder is renamed into place as the last operation, so the target name is never
    visible with part of its files. A replaced previous export is moved aside first and then only the files its
    marker lists are removed.
Exported files get the modes ordinary files get (0666 / 0777 less the umask); some writers (safetensors) create
0600 files.

  check_target(out, kind, overwrite=False, protect=(workdir, ckpt_folder))   # before any work: raises UnsafeTarget
  write(out, lambda tmp: write_files(tmp), kind, overwrite=False, protect=...)
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import tempfile
from collections.abc import Callable, Iterable

from absl import logging

MARKER = 'osvl_export.json'
FORMAT_VERSION = 1
TOOL = 'osvl_jax'


class UnsafeTarget(ValueError):
  """An export target that the export refuses to write (the message names the path and why)."""


def _resolve(path: str | os.PathLike) -> pathlib.Path:
  return pathlib.Path(path).expanduser().absolute().resolve()


def read_marker(folder: str | os.PathLike) -> dict | None:
  """The marker of a previous export in `folder` ({'tool', 'kind', 'format_version', 'files', ...}), or None when
  `folder` has no readable marker."""
  try:
    marker = json.loads((pathlib.Path(folder) / MARKER).read_text())
  except (OSError, ValueError):
    return None
  if not isinstance(marker, dict) or marker.get('tool') != TOOL or not isinstance(marker.get('files'), list):
    return None
  return marker


def _listing(folder: pathlib.Path) -> set[str]:
  """Every file and symlink (to a folder too: never followed) below `folder`, relative, '/'-separated; empty
  sub-folders as 'name/'."""
  out = set()
  for root, dirs, files in os.walk(folder):
    rel = pathlib.Path(root).relative_to(folder)
    out.update((rel / f).as_posix() for f in files)
    out.update((rel / d).as_posix() for d in dirs if os.path.islink(os.path.join(root, d)))
    out.update(f'{(rel / d).as_posix()}/' for d in dirs
               if not os.path.islink(os.path.join(root, d)) and not os.listdir(pathlib.Path(root) / d))
  return out


def _inside(folder: pathlib.Path, name) -> bool:
  """Whether marker entry `name` is a plain relative path that stays inside `folder` (no '..', not absolute, no
  symlinked folder on the way): a marker someone edited must not make an overwrite delete files elsewhere."""
  if not isinstance(name, str) or not name or name.startswith('/') or '..' in pathlib.PurePosixPath(name).parts:
    return False
  parent = (folder / name).parent
  return os.path.realpath(parent) == os.path.join(os.path.realpath(folder), *pathlib.PurePosixPath(name).parts[:-1])


def is_export(folder: str | os.PathLike, kind: str) -> bool:
  """Whether `folder` is a previous export of `kind` holding nothing but the files its marker lists."""
  folder = pathlib.Path(folder)
  marker = read_marker(folder) if folder.is_dir() and not folder.is_symlink() else None
  return (marker is not None and marker.get('kind') == kind
          and all(_inside(folder, name) for name in marker['files'])
          and _listing(folder) <= set(marker['files']) | {MARKER})


def check_target(out: str | os.PathLike, kind: str, overwrite: bool = False,
                 protect: Iterable[str | os.PathLike | None] = (), checkpoint_dirs: Iterable = ()) -> pathlib.Path:
  """Checks that `out` may receive an export of `kind`; touches nothing.

  Args:
    out: the target folder (local path).
    kind: the export kind ('hf_export', 'weight_version'); a previous export of another kind is refused.
    overwrite: allow replacing a previous export of `kind`.
    protect: folders that must survive (the workdir, the checkpoint folder): `out` may be none of them nor an
      ancestor of one. None entries are skipped.
    checkpoint_dirs: folders `out` may not lie inside (checkpoint folders, whose contents orbax owns).
  Returns:
    `out` resolved (symlinks followed), the folder the export will be renamed to.
  Raises:
    UnsafeTarget: naming `out` and the reason (protected path or its ancestor, inside a checkpoint folder, not a
      folder, a non-empty folder that is not a previous export, a previous export of another kind or with foreign
      files, a previous export without `overwrite`).
  """
  target = _resolve(out)
  guarded = [_resolve(p) for p in protect if p is not None]
  for g in sorted(guarded, key=lambda g: g != target):   # 'is' before 'contains'
    if target == g or target in g.parents:
      raise UnsafeTarget(f'{out}: refused, it {"is" if target == g else "contains"} {g}, which the export must '
                         'not replace; choose a new or empty folder')
  for c in checkpoint_dirs:
    if c is not None and _resolve(c) in target.parents:
      raise UnsafeTarget(f'{out}: refused, it lies inside the checkpoint folder {_resolve(c)}')
  if not target.exists():
    return target
  if not target.is_dir():
    raise UnsafeTarget(f'{out}: refused, it exists and is not a folder')
  if not any(target.iterdir()):
    return target
  marker = read_marker(target)
  if marker is None:
    raise UnsafeTarget(f'{out}: refused, it is a non-empty folder that is not a previous export (no '
                       f'{MARKER}); choose a new or empty folder')
  if marker.get('kind') != kind:
    raise UnsafeTarget(f"{out}: refused, it is an export of kind {marker.get('kind')!r}, not {kind!r}")
  outside = [name for name in marker['files'] if not _inside(target, name)]
  if outside:
    raise UnsafeTarget(f'{out}: refused, its marker {MARKER} lists {outside[:3]}, which lie outside it (an edited '
                       'marker, or a folder replaced by a symlink)')
  foreign = sorted(_listing(target) - set(marker['files']) - {MARKER})
  if foreign:
    raise UnsafeTarget(f'{out}: refused, this previous export holds files it did not write: '
                       f'{", ".join(foreign[:5])}{" ..." if len(foreign) > 5 else ""}')
  if not overwrite:
    raise UnsafeTarget(f'{out}: refused, it holds a previous export; pass --overwrite to replace it')
  return target


def _umask() -> int:
  try:  # Linux: read it without changing it (os.umask would, for a moment, for every thread)
    for line in pathlib.Path('/proc/self/status').read_text().splitlines():
      if line.startswith('Umask:'):
        return int(line.split()[1], 8)
  except (OSError, ValueError, IndexError):
    pass
  mask = os.umask(0o022)
  os.umask(mask)
  return mask


def _apply_modes(folder: pathlib.Path) -> None:
  umask = _umask()
  for root, dirs, files in os.walk(folder):
    for f in files:
      if not os.path.islink(os.path.join(root, f)):
        os.chmod(os.path.join(root, f), 0o666 & ~umask)
    for d in dirs:
      os.chmod(os.path.join(root, d), 0o777 & ~umask)
  os.chmod(folder, 0o777 & ~umask)


def remove_export(folder: str | os.PathLike, kind: str) -> bool:
  """Deletes a previous export of `kind`: the files its marker lists, then the marker and the emptied folders.

  Returns:
    True when the folder is gone; False (it is left as it is, with a warning) when it is not an export of `kind`
    or holds a file its marker does not list.
  """
  folder = pathlib.Path(folder)
  if not is_export(folder, kind):
    logging.warning('export: %s is not an export of kind %r with only its own files; left in place', folder, kind)
    return False
  for name in read_marker(folder)['files']:
    path = folder / name
    if path.is_file() or path.is_symlink():
      path.unlink()
  (folder / MARKER).unlink()
  for root, _, _ in sorted(os.walk(folder), key=lambda w: -len(w[0])):  # deepest first
    try:
      os.rmdir(root)
    except OSError:
      logging.warning('export: %s is not empty after removing the export; left in place', root)
      return False
  return True


def write(out: str | os.PathLike, write_files: Callable[[pathlib.Path], None], kind: str, overwrite: bool = False,
          protect: Iterable = (), checkpoint_dirs: Iterable = (), info: dict | None = None) -> pathlib.Path:
  """Writes an export of `kind` to `out` (module docstring): `check_target`, then `write_files(tmp)` into a fresh
  temporary folder beside `out`, the marker, the modes, and the rename into place.

  Args:
    out, kind, overwrite, protect, checkpoint_dirs: as `check_target`.
    write_files: writes every file of the export into the folder it is given.
    info: extra JSON fields recorded in the marker (checkpoint, step, version).
  Returns:
    The written folder (resolved).
  Raises:
    UnsafeTarget: from `check_target` (nothing is written then).
    Whatever `write_files` raises (the temporary folder is removed, `out` is left as it was).
  """
  target = check_target(out, kind, overwrite, protect, checkpoint_dirs)
  target.parent.mkdir(parents=True, exist_ok=True)
  tmp = pathlib.Path(tempfile.mkdtemp(prefix=f'.{target.name}.tmp-', dir=target.parent))
  aside = None
  try:
    write_files(tmp)
    files = sorted(_listing(tmp) - {MARKER})
    marker = {'tool': TOOL, 'kind': kind, 'format_version': FORMAT_VERSION, **(info or {}), 'files': files}
    (tmp / MARKER).write_text(json.dumps(marker, indent=1))
    _apply_modes(tmp)
    if target.exists():
      if any(target.iterdir()):  # a previous export, checked again now that the new one is complete
        check_target(target, kind, overwrite, protect, checkpoint_dirs)
        aside = pathlib.Path(tempfile.mkdtemp(prefix=f'.{target.name}.old-', dir=target.parent))
        os.replace(target, aside / target.name)  # an empty folder made by mkdtemp: renamed into, not onto
      else:
        target.rmdir()
    os.replace(tmp, target)   # the last operation on `target`: it appears complete
  except BaseException:
    if aside is not None and not target.exists():   # put the previous export back
      os.replace(aside / target.name, target)
      aside.rmdir()
    shutil.rmtree(tmp, ignore_errors=True)   # made by mkdtemp above: only what `write_files` wrote
    raise
  if aside is not None and remove_export(aside / target.name, kind):
    aside.rmdir()
  return target
