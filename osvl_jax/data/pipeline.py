"""The datasets `python -m data_pipeline.build` writes: their format and their readers (DESIGN.md §7).

The pipeline writes, this module reads (and defines the format both agree on). A built dataset folder D
(`dataset_dir(config, workdir)`: `config.data.dir`, else `<workdir>/data`) holds one HF `datasets` folder per
stage (`Dataset.save_to_disk`) with its `counts.json` beside the data files:

  D/paths, D/qa, D/rewrite, D/ground   intermediate stage records (the pipeline's own, for resuming)
  D/items    the item table, `ITEM_FEATURES`: prompt_id, question, canonical_question, answers, image_path
             (relative to the shared data folder), path, hops, rejected (None when accepted, else the reason),
             landmark, descriptors, answer_attribute, answer_evidence, anchor_expression, rewrite_trace,
             degradation (None, or {kind, params (JSON text), repair_tool} of a degraded anchor image, whose
             `image_path` is then relative to D: 'degraded/<prompt_id>.png'), original_image_path
  D/degraded the degraded anchor PNGs
  D/sft      oracle expert trajectories, rows of `Trajectory.to_record()` (`trajectory.record_features()`)
  D/rl       the GRPO prompts, `RL_FEATURES`: prompt_id (of an accepted item with no SFT trajectory: the two
             splits are disjoint) and reason ('held_out' | 'no_trajectory', `data_pipeline.splits`)
  D/stats.json   every stage's counts and seconds

A split exists once its `counts.json` does (the pipeline writes it last, atomically with the data).

Paths are relative, so a built folder can be moved (and the shared data folder too): an image of the shared data
folder relative to it, one the pipeline wrote (a degraded image) relative to D (`image_file` resolves both). An
absolute path, which older builds wrote for degraded and merged items, is read as it is; a degraded one that no
longer exists is looked for under `D/degraded` (a moved older build).
"""

import json
import os
import pathlib

import ml_collections
import numpy as np

from tools import image_io

ITEMS = 'items'
SFT = 'sft'
RL = 'rl'
DEGRADED_DIR = 'degraded'  # `D/degraded/<prompt_id>.png`, the degraded anchor images
GENERATED_DIR = 'generated'  # `D/generated/...`: images a builder drew (the lookup world's squares)
COUNTS_FILE = 'counts.json'
VOCAB_FILE = 'vocab_ids.json'  # the Qwen ids a dataset's trajectories and prompts use (`model.vocab='dataset'`)
BUILD_COMMAND = 'python -m data_pipeline.build --config=configs/data_wikispeedia.py --workdir=W'

ITEM_COLUMNS = ('prompt_id', 'question', 'canonical_question', 'answers', 'image_path', 'path', 'hops',
                'rejected', 'landmark', 'descriptors', 'answer_attribute', 'answer_evidence', 'anchor_expression',
                'rewrite_trace', 'degradation', 'original_image_path', 'relations')


def items_features():
  """`datasets.Features` of the `items` split (columns `ITEM_COLUMNS`, in that order)."""
  import datasets
  v, seq = datasets.Value, lambda t: datasets.List(datasets.Value(t))
  return datasets.Features({
      'prompt_id': v('string'), 'question': v('string'), 'canonical_question': v('string'),
      'answers': seq('string'), 'image_path': v('string'), 'path': seq('string'), 'hops': v('int32'),
      'rejected': v('string'), 'landmark': v('string'), 'descriptors': seq('string'),
      'answer_attribute': v('string'), 'answer_evidence': v('string'), 'anchor_expression': v('string'),
      'rewrite_trace': seq('string'),
      'degradation': {'kind': v('string'), 'params': v('string'), 'repair_tool': v('string')},
      'original_image_path': v('string'), 'relations': seq('string'),
  })


def rl_features():
  """`datasets.Features` of the `rl` split: prompt_id, reason."""
  import datasets
  return datasets.Features({'prompt_id': datasets.Value('string'), 'reason': datasets.Value('string')})


def dataset_dir(config: ml_collections.ConfigDict, workdir: str | os.PathLike) -> pathlib.Path:
  """The dataset folder of a job: `config.data.dir` if set, else `<workdir>/data`."""
  return pathlib.Path(config.data.get('dir') or pathlib.Path(workdir) / 'data')


def has_split(folder: str | os.PathLike) -> bool:
  """Whether `folder` holds a finished split (its `counts.json` is written last, `publish_split`)."""
  return (pathlib.Path(folder) / COUNTS_FILE).is_file()


def read_split(folder: str | os.PathLike) -> tuple[list[dict], dict]:
  """(rows as dicts, counts) of one split folder; an empty split (no data file: a build with no item) has no rows."""
  import datasets
  folder = pathlib.Path(folder)
  counts = json.loads((folder / COUNTS_FILE).read_text())
  if not json.loads((folder / 'state.json').read_text()).get('_data_files'):
    return [], counts
  return datasets.load_from_disk(str(folder)).to_list(), counts


def fsync(path: str | os.PathLike) -> None:
  """Flushes one file, or one folder's entries, to disk."""
  fd = os.open(path, os.O_RDONLY)
  try:
    os.fsync(fd)
  finally:
    os.close(fd)


def fsync_tree(path: str | os.PathLike) -> None:
  """Flushes `path` to disk: every file and folder under it (deepest first), then `path` itself."""
  path = pathlib.Path(path)
  for p in sorted(path.rglob('*'), reverse=True) if path.is_dir() else []:
    fsync(p)
  fsync(path)


def write_durably(path: str | os.PathLike, text: str) -> None:
  """Writes `text` to `path` through `<path>.tmp` (fsynced, renamed into place, the folder fsynced): `path` is the
  old file or the whole new one, also after a kill or a power cut."""
  path = pathlib.Path(path)
  tmp = path.with_name(path.name + '.tmp')
  tmp.write_text(text, encoding='utf-8')
  fsync(tmp)
  os.replace(tmp, path)
  fsync(path.parent)


def publish_split(tmp: str | os.PathLike, folder: str | os.PathLike, counts: dict) -> None:
  """Makes the split written under `tmp` the finished split `folder`: its files fsynced, then `counts.json` written
  and fsynced last, then `tmp` renamed onto `folder` (an old one removed first) and the parent fsynced; so
  `has_split(folder)` holds only once every file of the split is on disk."""
  import shutil
  tmp, folder = pathlib.Path(tmp), pathlib.Path(folder)
  fsync_tree(tmp)
  (tmp / COUNTS_FILE).write_text(json.dumps(counts, indent=1, default=str))
  fsync(tmp / COUNTS_FILE)
  fsync(tmp)
  shutil.rmtree(folder, ignore_errors=True)
  os.replace(tmp, folder)
  fsync(folder.parent)


def _require(out_dir: str | os.PathLike, split: str, what: str) -> pathlib.Path:
  folder = pathlib.Path(out_dir) / split
  if not has_split(folder):
    raise FileNotFoundError(f'{folder}: no {what}; build them with `{BUILD_COMMAND} --config.data.dir={out_dir}` '
                            'or run `make demo`')
  return folder


def relative_to(path: str | os.PathLike, folder: str | os.PathLike) -> str:
  """`path` relative to `folder` ('/'-separated) when it lies inside it (symlinks resolved), else `path` as it is."""
  path, base = pathlib.Path(path), pathlib.Path(folder)
  try:
    return path.resolve().relative_to(base.resolve()).as_posix()
  except ValueError:
    return str(path)


def image_file(record: dict, data_dir: str | os.PathLike, dataset_dir: str | os.PathLike | None) -> pathlib.Path:
  """The file of an item's `image_path`: relative to `dataset_dir` (the built folder D) for a degraded item
  (`degradation` set) or a drawn one (under `generated/`), else to `data_dir` (the shared data folder); an absolute
  path as it is, except a degraded one that is gone, looked for in `D/degraded` (an older build that was moved).

  Raises:
    ValueError: naming the item, for a degraded item with a relative path and no `dataset_dir`.
  """
  path = pathlib.Path(record['image_path'])
  degraded = bool(record.get('degradation')) or (not path.is_absolute() and path.parts[:1] == (GENERATED_DIR,))
  if path.is_absolute():
    moved = pathlib.Path(dataset_dir or path.parent) / DEGRADED_DIR / path.name
    return moved if degraded and not path.exists() and moved.exists() else path
  if degraded and dataset_dir is None:
    raise ValueError(f"item {record.get('prompt_id')!r}: its degraded image_path {str(path)!r} is relative to the "
                     'dataset folder, which was not given (dataset_dir)')
  return pathlib.Path(dataset_dir if degraded else data_dir) / path


def load_image(data_dir: str | os.PathLike, rel_path: str) -> np.ndarray:
  """uint8 [H, W, 3] RGB of `data_dir / rel_path` (an absolute `rel_path` is read as is); `item_image` reads an
  item's image wherever it lies."""
  return image_io.load_image(pathlib.Path(data_dir) / rel_path)


def item_image(record: dict, data_dir: str | os.PathLike, dataset_dir: str | os.PathLike | None) -> np.ndarray:
  """uint8 [H, W, 3] RGB of an item's image (`image_file`)."""
  return image_io.load_image(image_file(record, data_dir, dataset_dir))


def load_sft(out_dir: str | os.PathLike) -> list:
  """The oracle expert trajectories (`osvl_jax.trajectory.Trajectory`) of `out_dir/sft`.

  Raises:
    FileNotFoundError: naming the folder when the `sft` split has not been built.
  """
  from osvl_jax import trajectory as traj_lib
  records, _ = read_split(_require(out_dir, SFT, 'SFT trajectories'))
  return [traj_lib.Trajectory.from_record(r) for r in records]


def load_prompts(out_dir: str | os.PathLike, data_dir: str | os.PathLike | None = None) -> list[dict]:
  """The RL prompts: the accepted items of `out_dir/items` named by the `rl` split (none has an SFT trajectory).

  Args:
    out_dir: the dataset folder.
    data_dir: the shared data folder the items' `image_path` is relative to (None: `osvl_jax.paths.data_dir()`);
      a degraded item's is relative to `out_dir` (`image_file`).
  Returns:
    dicts with prompt_id (str), question (str), image (uint8 [H, W, 3] RGB), answers (list[str]), image_path (as
    stored), in the items' order.
  Raises:
    FileNotFoundError: naming the folder when the `items` or the `rl` split has not been built (a build from
      before the `rl` split: rerun the build command on the folder, which adds it).
  """
  from osvl_jax import paths as osvl_paths
  records, _ = read_split(_require(out_dir, ITEMS, 'items'))
  rl, _ = read_split(_require(out_dir, RL, 'RL prompts (the `rl` split)'))
  wanted = {r['prompt_id'] for r in rl}
  data_dir = pathlib.Path(data_dir) if data_dir else osvl_paths.data_dir()
  return [{'prompt_id': r['prompt_id'], 'question': r['question'], 'answers': list(r['answers']),
           'image_path': r['image_path'], 'image': item_image(r, data_dir, out_dir)}
          for r in records if not r['rejected'] and r['prompt_id'] in wanted]
