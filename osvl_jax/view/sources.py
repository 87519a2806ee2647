"""What `python -m osvl_jax.view` reads: stored trajectories, each with what is known about it (`Entry`).

`load(path)` finds every source under `path` (a path may hold several: a demo workdir has its dataset and, with
`grpo.dump_rollouts`, its rollout dumps):
- evaluation: a folder with `results.jsonl` and `trajectories.jsonl` (`data.eval_results`): each trajectory joined to its
  judged record by (run, benchmark, item_key): benchmark, mode, verdict, judge score;
- GRPO rollout dumps (`grpo.dump_rollouts`): a `<step>.pkl` file, a folder of them, or a workdir with `rollouts/`;
  each trajectory with its reward parts (`train.rollouts.score`) and the loss mask of the dump's `fatal_mode`.
  A pickle runs code when it is read: view only dumps you wrote;
- trajectory records: a built dataset (`<dataset>/sft`), a workdir holding one (`<workdir>/data/sft`), any HF
  datasets folder or `.arrow` file of `Trajectory.to_record` rows, or a JSON-lines file of `Trajectory.to_json`.
What cannot be read (a torn line, a record with a corrupt PNG, a half-written dump, a dump's unknown fatal_mode) is
named in `found['unreadable']` ('<where>: <why>'), and the rest is shown.
"""

import dataclasses
import pathlib
import pickle

import numpy as np

from osvl_jax.data import eval_results as results_lib
from osvl_jax.trajectory import record as record_lib

DEFAULT_FATAL_MODE = 'mask_clamp'  # the mask shown for a dump written before dumps named their fatal_mode


class ViewError(ValueError):
  """A path holds nothing the viewer reads; the message names it and the formats."""


FORMATS = ('an evaluation workdir (results.jsonl + trajectories.jsonl), GRPO rollout dumps (<workdir>/rollouts/'
           '<step>.pkl, a folder of them, or one), a built dataset (<dataset>/sft or <workdir>/data/sft), a datasets '
           'folder or .arrow file of Trajectory.to_record rows, or a JSON-lines file of Trajectory.to_json records')


@dataclasses.dataclass
class Entry:
  """One trajectory to show.

  Attributes:
    traj: the trajectory.
    source: 'eval', 'rollout' or 'records' (a dataset or a file of records).
    where: the file (and row / step) it came from.
    benchmark: the evaluation benchmark, '' elsewhere.
    mode: the evaluation mode (agentic / direct / rag / degrade...), '' elsewhere.
    verdict: 'correct', 'wrong', 'judge_error' or '' (not judged).
    scores: named figures: the reward parts (reward, r_fmt, r_acc, r_query) of a rollout, the judge score of an
      evaluation record.
    judge_error: the judge's error text, or None.
    fatal_mode: the `grpo.fatal_mode` whose loss mask is shown ('none' for SFT records: every emitted token is
      supervised; rollouts: the dump's; '' for an evaluation: no loss).
  """
  traj: record_lib.Trajectory
  source: str
  where: str
  benchmark: str = ''
  mode: str = ''
  verdict: str = ''
  scores: dict = dataclasses.field(default_factory=dict)
  judge_error: str | None = None
  fatal_mode: str = 'none'


def _is_datasets_folder(path: pathlib.Path) -> bool:
  return path.is_dir() and any((path / f).is_file() for f in ('state.json', 'dataset_info.json', 'dataset_dict.json'))


# What a stored trajectory that cannot be read raises (a torn line, a corrupt PNG, a half-written pickle).
_UNREADABLE = (ValueError, KeyError, TypeError, IndexError, EOFError, OSError, pickle.UnpicklingError)


def _why(e: BaseException) -> str:
  return f'{type(e).__name__}: {e}'[:300]


def _records(path: pathlib.Path, limit: int, unreadable: list[str]) -> list[Entry]:
  """Trajectory records of a datasets folder, an .arrow file or a JSON-lines file (what does not decode named in
  `unreadable`)."""
  if path.is_file() and path.suffix != '.arrow':
    out = []
    with path.open(encoding='utf-8', errors='surrogateescape') as f:
      for line_no, line in enumerate(f, 1):
        if line.strip() and len(out) < limit:
          try:
            out.append(Entry(record_lib.Trajectory.from_json(line), 'records', f'{path}:{line_no}'))
          except _UNREADABLE as e:
            unreadable.append(f'{path}:{line_no}: {_why(e)}')
    return out
  import datasets  # pylint: disable=g-import-not-at-top
  rows = datasets.Dataset.from_file(str(path)) if path.is_file() else datasets.load_from_disk(str(path))
  if isinstance(rows, datasets.DatasetDict):
    splits = list(rows.items())
  else:
    splits = [('', rows)]
  out = []
  for split, table in splits:
    for i in range(min(len(table), limit - len(out))):
      where = f'{path} {split} row {i}'.replace('  ', ' ')
      try:
        out.append(Entry(record_lib.Trajectory.from_record(table[i]), 'records', where))
      except _UNREADABLE as e:
        unreadable.append(f'{where}: {_why(e)}')
  return out


def _rollout_dump(path: pathlib.Path, limit: int, unreadable: list[str]) -> list[Entry]:
  """The trajectories of one `grpo.dump_rollout_batch` pickle with their scores; a dump that does not unpickle (a
  half-written file) is named in `unreadable`, and one of an unknown fatal_mode is shown without the loss mask."""
  from osvl_jax.rl import fatal as fatal_lib  # pylint: disable=g-import-not-at-top
  try:
    batch = pickle.loads(path.read_bytes())
  except _UNREADABLE as e:
    unreadable.append(f'{path}: {_why(e)}')
    return []
  if not isinstance(batch, dict) or 'trajectories' not in batch:
    unreadable.append(f'{path}: not a GRPO rollout dump (a pickled dict with trajectories and scores)')
    return []
  scores = batch.get('scores') or [{}] * len(batch['trajectories'])
  mode = str(batch.get('fatal_mode') or DEFAULT_FATAL_MODE)
  if mode not in fatal_lib.FATAL_MODES.names():
    unreadable.append(f'{path}: fatal_mode {mode!r} is not one of {fatal_lib.FATAL_MODES.names()}: its '
                      'trajectories are shown without the loss mask')
    mode = ''
  out = []
  for traj, score in list(zip(batch['trajectories'], scores))[:limit]:
    parts = {k: float(score[k]) for k in ('reward', 'r_fmt', 'r_acc', 'r_query') if k in score}
    out.append(Entry(traj, 'rollout', f'{path.name} sample {traj.sample_index}', scores=parts, fatal_mode=mode))
  return out


def _eval(folder: pathlib.Path, limit: int, unreadable: list[str]) -> tuple[list[Entry], dict]:
  """(the stored trajectories of an evaluation workdir joined to their records, {'eval_records_past_limit': records
  whose trajectory is past `limit`, 'eval_records_without_trajectory': the others not shown}); a trajectory that
  does not decode is named in `unreadable`."""
  records = results_lib.read_records(folder)
  out, shown, past_limit = [], set(), set()
  for key, row in results_lib.trajectory_lines(folder):
    record = records.get(key)
    if record is None or key in shown:
      continue
    if len(out) >= limit:
      past_limit.add(key)  # not decoded (an evaluation writes its page after every run)
      continue
    try:
      traj = record_lib.Trajectory.from_record(row)
    except _UNREADABLE as e:
      unreadable.append(f"{folder / results_lib.TRAJECTORIES_FILE} {'/'.join(key)}: {_why(e)}")
      continue
    shown.add(key)
    verdict = ('judge_error' if record.get('judge_error') else 'correct' if record.get('correct') else 'wrong')
    out.append(Entry(traj, 'eval', f"{record['run']} / {record['benchmark']} / {record['id']}",
                     benchmark=str(record['benchmark']), mode=str(record.get('mode', '')), verdict=verdict,
                     scores={'judge_score': float(record.get('judge_score') or 0.0)},
                     judge_error=record.get('judge_error'), fatal_mode=''))
  return out, {'eval_records_past_limit': len(past_limit),
               'eval_records_without_trajectory': len(records) - len(shown) - len(past_limit)}


def load(path: str | pathlib.Path, limit: int = 500) -> tuple[list[Entry], dict]:
  """Every readable trajectory under `path` (at most `limit` per source), and what was found: {source: count, ...,
  'eval_records_past_limit': n, 'eval_records_without_trajectory': n, 'unreadable': ['<where>: <why>', ...] (only
  when something could not be read)}.

  Raises:
    FileNotFoundError: no such path.
    ViewError: nothing under `path` is in one of the formats (`FORMATS`).
  """
  path = pathlib.Path(path)
  if not path.exists():
    raise FileNotFoundError(f'{path}: no such file or folder')
  entries, found, unreadable = [], {}, []
  if path.is_file():
    entries = (_rollout_dump(path, limit, unreadable) if path.suffix == '.pkl' else
               _records(path, limit, unreadable))
  else:
    if (path / results_lib.RESULTS_FILE).is_file():
      got, counts = _eval(path, limit, unreadable)
      entries += got
      found.update(counts)
    dumps = sorted((path / 'rollouts').glob('*.pkl')) or sorted(path.glob('*.pkl'))
    for dump in dumps:
      entries += _rollout_dump(dump, limit - sum(e.source == 'rollout' for e in entries), unreadable)
    for split in (path / 'sft', path / 'data' / 'sft', path):
      if _is_datasets_folder(split):
        entries += _records(split, limit, unreadable)
        break
  if not entries and not found and not unreadable:
    raise ViewError(f'{path}: no trajectories found; the viewer reads ' + FORMATS)
  for e in entries:
    found[e.source] = found.get(e.source, 0) + 1
  if unreadable:
    found['unreadable'] = unreadable
  return entries, found


def prompt_image_count(traj: record_lib.Trajectory) -> int:
  """How many of `traj.images` came with the prompt (the rest are the tools' outputs, in step order)."""
  tool_images = sum(len(s.result.images) for s in traj.steps if s.result is not None)
  return max(0, len(traj.images) - tool_images)


def step_token_counts(entry: Entry) -> list[tuple[int, int | None]]:
  """Per step l: (tokens the policy emitted, of them in the loss under `entry.fatal_mode` (Eq. 10's M; None for
  an evaluation's trajectory, which no loss sees))."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from osvl_jax.rl import fatal as fatal_lib  # pylint: disable=g-import-not-at-top
  traj = entry.traj
  gen = np.asarray(traj.gen_mask, np.float32)[None]
  sot = np.asarray(traj.step_of_token, np.int32)[None]
  if not entry.fatal_mode:
    return [(int(gen[0][sot[0] == s.index].sum()), None) for s in traj.steps]
  fatal = fatal_lib.fatal_step_array([traj.fatal_step])
  mask = np.asarray(fatal_lib.loss_mask(jnp.asarray(gen), jnp.asarray(sot), jnp.asarray(fatal),
                                        fatal_lib.FATAL_MODES.get(entry.fatal_mode).mask_fn))[0]
  return [(int(gen[0][sot[0] == s.index].sum()), int(mask[sot[0] == s.index].sum())) for s in traj.steps]
