"""The invariants the trainer relies on: `check_trajectory`, `validate_trajectory`, `check_jsonl` (DESIGN.md §4).

`train.batching.collate` validates every trajectory; `python -m osvl_jax.trajectory --check PATH` (`main`)
checks stored trajectories in the formats the project writes (`check_file`, `FORMATS`): JSON lines of
`Trajectory.to_json`, and HF datasets folders / .arrow files of `Trajectory.to_record` rows (the data
pipeline's `<dataset>/sft`).
"""

import argparse
import os
import pathlib
import sys
from collections.abc import Sequence

import numpy as np

from osvl_jax.trajectory.record import STOP_REASONS, Trajectory, TrajectoryError
from osvl_jax.trajectory.tokens import (
    ASSISTANT_ID, ENDOFTEXT_ID, IM_END_ID, IM_START_ID, IMAGE_PAD_ID, NEWLINE_ID, VISION_END_ID, VISION_IDS,
    VISION_START_ID, VOCAB_SIZE, _encode, model_input_ids)


def check_trajectory(traj: Trajectory, max_problems: int = 20, tokenizer=None) -> list[str]:
  """Checks the invariants every consumer relies on; returns the problems found ([] when sound).

  - token_ids / gen_mask / step_of_token (/ rollout_logprobs / token_versions) are 1-D of equal length T;
    token_versions is -1 off gen_mask, >= 0 on it, and its minimum is policy_version;
  - in the model's input (`tokens.model_input_ids`: a vision id the policy emitted is text there), each image
    appears as <|vision_start|> + num_tokens × <|image_pad|> + <|vision_end|>, in order, one per ImageRef, and
    pixel_values has prod(grid_thw) rows; no stray pad/vision tokens;
  - gen_mask is 1 only inside assistant turns (after '<|im_start|>assistant\\n', up to its <|im_end|>) and
    never on an image span;
  - step_of_token starts at -1, is non-decreasing by steps of at most 1, ends at exactly L (every step has
    tokens), and prompt tokens (-1) are never generated; fatal_step (if any) is a valid step index;
  - each grid is (1, h, w) with h, w multiples of merge_size, pixel_values is [prod(grid), 3*T*P*P];
  - stop_reason is None or one of `STOP_REASONS`;
  - each step l's tokens (step_of_token == l) begin right after '<|im_start|>assistant\n' with the turn the
    policy emitted: gen_mask is one contiguous run of 1s at the start of the step (a 0 inside a turn is refused),
    and the turn ends in <|im_end|>: either the run's last id, or (a turn cut at max_new_tokens, or one that
    stopped at <|endoftext|>) the id right after the run, which the builder adds with gen_mask 0
    (`TrajectoryBuilder.append_assistant`). Budget cuts (`TrajectoryBuilder.truncate`) drop whole steps, so no
    trajectory ends inside a turn;
  - with `tokenizer`: each step's generated ids (without the closing <|im_end|> / <|endoftext|>) decode to the
    step's stored text (`Step.text`, which was parsed into its action), or the text encodes to exactly those ids
    (expert text from SFT data, whose decoding may differ by the tokenizer's NFC normalisation).

  Args:
    traj: the trajectory.
    max_problems: at most this many problems are returned.
    tokenizer: the Qwen3-VL tokenizer (`tokens.load_tokenizer()`) for the text check; None skips it (the
      `--check` command passes it).

  `validate_trajectory` raises `TrajectoryError` with these problems; `batching.collate` calls it on every
  trajectory before an update.
  """
  problems: list[str] = []
  ids = np.asarray(traj.token_ids)
  gen = np.asarray(traj.gen_mask)
  sot = np.asarray(traj.step_of_token)
  if ids.ndim != 1 or gen.ndim != 1 or sot.ndim != 1:
    return [f'arrays must be 1-D: token_ids {ids.shape}, gen_mask {gen.shape}, step_of_token {sot.shape}']
  t = ids.shape[0]
  if gen.shape[0] != t or sot.shape[0] != t:
    return [f'lengths differ: token_ids {t}, gen_mask {gen.shape[0]}, step_of_token {sot.shape[0]}']
  if traj.rollout_logprobs is not None and np.asarray(traj.rollout_logprobs).shape != (t,):
    problems.append(f'rollout_logprobs shape {np.asarray(traj.rollout_logprobs).shape} != ({t},)')
  versions = getattr(traj, 'token_versions', None)
  if versions is not None:
    versions, g = np.asarray(versions), gen.astype(bool)
    if versions.shape != (t,):
      problems.append(f'token_versions shape {versions.shape} != ({t},)')
    elif (versions[g] < 0).any() or (versions[~g] != -1).any():
      problems.append('token_versions must be >= 0 on emitted tokens and -1 elsewhere')
    elif g.any() and int(versions[g].min()) != int(traj.policy_version):
      problems.append(f'policy_version {traj.policy_version} is not the oldest token version '
                      f'{int(versions[g].min())}')
  if t and (ids.min() < 0 or ids.max() >= VOCAB_SIZE):
    problems.append(f'token ids outside [0, {VOCAB_SIZE})')
  gen = gen.astype(bool)
  # Images, in the model's input: vision ids the policy emitted (gen_mask 1) are text there (DESIGN §4).
  model_ids = model_input_ids(ids, gen)
  starts = np.flatnonzero(model_ids == VISION_START_ID)
  if len(starts) != len(traj.images):
    problems.append(f'{len(starts)} <|vision_start|> tokens for {len(traj.images)} images')
  covered = np.zeros(t, bool)
  for i, (pos, im) in enumerate(zip(starts, traj.images)):
    n = im.num_tokens
    end = pos + 1 + n
    if end >= t or not np.all(model_ids[pos + 1:end] == IMAGE_PAD_ID) or model_ids[end] != VISION_END_ID:
      run = int(np.argmax(model_ids[pos + 1:] != IMAGE_PAD_ID)) if pos + 1 < t else 0
      problems.append(f'image {i + 1}: {run} <|image_pad|> tokens after <|vision_start|> at {pos}, '
                      f'grid {np.asarray(im.grid_thw).tolist()} needs {n}')
    else:
      covered[pos:end + 1] = True
  for i, im in enumerate(traj.images):
    grid = np.asarray(im.grid_thw).reshape(-1)
    pv = np.asarray(im.pixel_values)
    width = 3 * im.temporal_patch_size * im.patch_size ** 2
    if grid.shape != (3,) or grid[0] != 1 or grid[1] % im.merge_size or grid[2] % im.merge_size or grid.min() <= 0:
      problems.append(f'image {i + 1}: grid {grid.tolist()} is not (1, h, w) with h, w multiples of '
                      f'merge_size={im.merge_size}')
    elif pv.ndim != 2 or pv.shape != (int(np.prod(grid)), width):
      problems.append(f'image {i + 1}: pixel_values has shape {pv.shape}, grid {grid.tolist()} needs '
                      f'({int(np.prod(grid))}, {width})')
  vision = np.isin(model_ids, VISION_IDS)
  if np.any(vision & ~covered) and len(starts) == len(traj.images):
    problems.append(f'stray vision tokens at {np.flatnonzero(vision & ~covered)[:5].tolist()}')
  if np.any(gen & covered):
    problems.append(f'gen_mask on an image span at {np.flatnonzero(gen & covered)[:5].tolist()}')
  # Assistant turns.
  in_assistant = np.zeros(t, bool)
  heads = np.flatnonzero(ids == IM_START_ID)
  for h in heads:
    if h + 2 < t and ids[h + 1] == ASSISTANT_ID and ids[h + 2] == NEWLINE_ID:
      ends = np.flatnonzero(ids[h + 3:] == IM_END_ID)
      stop = h + 3 + int(ends[0]) + 1 if len(ends) else t
      in_assistant[h + 3:stop] = True
  bad = gen & ~in_assistant
  if np.any(bad):
    problems.append(f'gen_mask outside assistant turns at {np.flatnonzero(bad)[:5].tolist()}')
  # Steps.
  if t:
    if sot[0] != -1:
      problems.append(f'step_of_token starts at {sot[0]}, expected -1')
    d = np.diff(sot)
    if np.any(d < 0):
      problems.append(f'step_of_token decreases at {np.flatnonzero(d < 0)[:5].tolist()}')
    if np.any(d > 1):
      problems.append(f'step_of_token skips a step at {np.flatnonzero(d > 1)[:5].tolist()}')
    if sot.max() != len(traj.steps) - 1:
      problems.append(f'step_of_token reaches {sot.max()} with {len(traj.steps)} steps (expected '
                      f'{len(traj.steps) - 1})')
    if np.any(gen & (sot < 0)):
      problems.append('gen_mask on prompt tokens (step -1)')
    if not problems:  # the per-turn checks assume sound steps and images
      problems.extend(_check_turns(ids, gen, sot, traj.steps, tokenizer))
  if traj.fatal_step is not None and not 0 <= traj.fatal_step < len(traj.steps):
    problems.append(f'fatal_step {traj.fatal_step} outside the {len(traj.steps)} steps')
  stop_reason = getattr(traj, 'stop_reason', None)
  if stop_reason is not None and stop_reason not in STOP_REASONS:
    problems.append(f'stop_reason {stop_reason!r} is not one of {STOP_REASONS}')
  return problems[:max_problems]


def _check_turns(ids: np.ndarray, gen: np.ndarray, sot: np.ndarray, steps: Sequence, tokenizer) -> list[str]:
  """The per-step assistant-turn checks of `check_trajectory` (its docstring); ids/gen/sot are [T] arrays."""
  problems = []
  head = [IM_START_ID, ASSISTANT_ID, NEWLINE_ID]
  for l, step in enumerate(steps):
    seg = np.flatnonzero(sot == l)
    if not len(seg):
      continue  # reported by the step_of_token checks
    g = gen[seg]
    k = len(g) if g.all() else int(np.argmin(g))  # length of the leading run of emitted tokens
    if g[k:].any():
      problems.append(f'step {l}: gen_mask is not one contiguous run: 0 at {int(seg[k])} inside the assistant '
                      f'turn, 1 again at {int(seg[k + int(np.argmax(g[k:]))])}')
      continue
    start = int(seg[0])
    if start < 3 or ids[start - 3:start].tolist() != head:
      problems.append(f"step {l}: its tokens do not start right after '<|im_start|>assistant\\n' (at {start})")
      continue
    run = ids[seg[:k]]
    if k and run[-1] == IM_END_ID:
      body = run[:-1]
    elif k < len(seg) and ids[seg[k]] == IM_END_ID:  # cut turn, or stopped at <|endoftext|>: builder's im_end
      body = run[:-1] if k and run[-1] == ENDOFTEXT_ID else run
    else:
      last = f'id {int(run[-1])} at {int(seg[k - 1])}' if k else f'no generated token (at {start})'
      problems.append(f'step {l}: the assistant turn does not end in <|im_end|> (it ends with {last})')
      continue
    if np.any(body == IM_END_ID):
      problems.append(f'step {l}: <|im_end|> inside the assistant turn at '
                      f'{int(seg[int(np.flatnonzero(body == IM_END_ID)[0])])}')
      continue
    if tokenizer is not None:
      text = tokenizer.decode(body.tolist(), skip_special_tokens=False)
      if text != step.text and _encode(tokenizer, step.text) != body.tolist():
        at = next((i for i, (a, b) in enumerate(zip(text, step.text)) if a != b), min(len(text), len(step.text)))
        problems.append(f'step {l}: its generated ids decode to a text that differs from the stored step text at '
                        f'character {at}: {text[max(at - 20, 0):at + 20]!r} vs '
                        f'{step.text[max(at - 20, 0):at + 20]!r}')
  return problems


def validate_trajectory(traj: Trajectory, tokenizer=None) -> Trajectory:
  """`check_trajectory`, raising: returns `traj` when sound.

  Args:
    traj: the trajectory.
    tokenizer: passed to `check_trajectory` (None: no decoding check).
  Raises:
    TrajectoryError: naming the trajectory (prompt_id, sample_index) and every problem found.
  """
  problems = check_trajectory(traj, tokenizer=tokenizer)
  if problems:
    raise TrajectoryError(f'trajectory prompt_id={traj.prompt_id!r} sample_index={traj.sample_index} is invalid: '
                          + '; '.join(problems))
  return traj


def check_jsonl(path: str | os.PathLike,
                tokenizer=None) -> tuple[int, list[tuple[int, str, list[str]]]]:
  """Checks every trajectory of a JSON-lines file.

  Returns:
    (number of trajectories, [(line number, 'prompt_id=... sample_index=...', problems)] for the invalid ones);
    a line that does not decode into a Trajectory is invalid with the decoding error as its problem.
  Raises:
    UnsupportedFormatError: the file is not UTF-8 text.
  """
  n, invalid = 0, []
  try:
    with open(path, encoding='utf-8') as f:
      lines = list(enumerate(f, 1))
  except UnicodeDecodeError as e:
    raise UnsupportedFormatError(f'{path}: not a UTF-8 JSON-lines file ({e.reason} at byte {e.start}); '
                                 + FORMATS) from None
  first = next((line.lstrip() for _, line in lines if line.strip()), '{')
  if not first.startswith('{'):
    raise UnsupportedFormatError(f'{path}: not JSON lines (the first line does not start with "{{"); ' + FORMATS)
  for line_no, line in lines:
    if not line.strip():
      continue
    n += 1
    try:
      traj = Trajectory.from_json(line)
    except Exception as e:  # pylint: disable=broad-except  # a broken line is reported, not fatal
      invalid.append((line_no, '?', [f'cannot decode: {type(e).__name__}: {e}']))
      continue
    problems = check_trajectory(traj, tokenizer=tokenizer)
    if problems:
      invalid.append((line_no, f'prompt_id={traj.prompt_id!r} sample_index={traj.sample_index}', problems))
  return n, invalid


FORMATS = ('--check reads: JSON-lines files of Trajectory.to_json() records (.jsonl, .json, or any UTF-8 text '
           'file of JSON objects); HF datasets folders of Trajectory.to_record() rows written by '
           'Dataset.save_to_disk (e.g. the data pipeline\'s <dataset>/sft), or one of their .arrow files')


class UnsupportedFormatError(ValueError):
  """A `--check` input in none of the formats in `FORMATS`; the message names the file and the formats."""


_RECORD_COLUMNS = ('prompt_id', 'sample_index', 'token_ids', 'gen_mask', 'step_of_token', 'images', 'steps')


def _check_rows(path, rows, tokenizer) -> tuple[int, list[tuple[str, str, list[str]]]]:
  columns = set(rows.column_names)
  missing = [c for c in _RECORD_COLUMNS if c not in columns]
  if missing:
    raise UnsupportedFormatError(f'{path}: a dataset without the Trajectory record column(s) {missing} (it has '
                                 f'{sorted(columns)}); ' + FORMATS)
  n, invalid = 0, []
  for i, record in enumerate(rows):
    n += 1
    try:
      traj = Trajectory.from_record(record)
    except Exception as e:  # pylint: disable=broad-except  # a broken row is reported, not fatal
      invalid.append((f'row {i}', '?', [f'cannot decode: {type(e).__name__}: {e}']))
      continue
    problems = check_trajectory(traj, tokenizer=tokenizer)
    if problems:
      invalid.append((f'row {i}', f'prompt_id={traj.prompt_id!r} sample_index={traj.sample_index}', problems))
  return n, invalid


def check_file(path: str | os.PathLike, tokenizer=None) -> tuple[int, list[tuple[int | str, str, list[str]]]]:
  """Checks every trajectory stored at `path`, in any of the formats the project writes (`FORMATS`).

  Args:
    path: a JSON-lines file; an HF datasets folder (`Dataset.save_to_disk`: has state.json / dataset_info.json;
      a `DatasetDict` folder is checked split by split); or a datasets `.arrow` file.
    tokenizer: passed to `check_trajectory`.
  Returns:
    (number of trajectories, [(where, 'prompt_id=... sample_index=...', problems)] for the invalid ones); where
    is the 1-based line number in a JSON-lines file, 'row i' (0-based) in a dataset, '<split> row i' in a
    DatasetDict.
  Raises:
    FileNotFoundError: no such path.
    UnsupportedFormatError: anything else (names the file and the formats accepted).
  """
  path = pathlib.Path(path)
  if not path.exists():
    raise FileNotFoundError(f'{path}: no such file or folder')
  if path.is_dir():
    import datasets  # pylint: disable=g-import-not-at-top
    if (path / 'dataset_dict.json').is_file():
      n, invalid = 0, []
      for split, rows in datasets.load_from_disk(str(path)).items():
        m, bad = _check_rows(path, rows, tokenizer)
        n += m
        invalid += [(f'{split} {where}', who, problems) for where, who, problems in bad]
      return n, invalid
    if not (path / 'state.json').is_file() and not (path / 'dataset_info.json').is_file():
      raise UnsupportedFormatError(f'{path}: a folder that is not a datasets folder (no state.json / '
                                   'dataset_info.json / dataset_dict.json); ' + FORMATS)
    return _check_rows(path, datasets.load_from_disk(str(path)), tokenizer)
  with open(path, 'rb') as f:
    head = f.read(8)
  if path.suffix == '.arrow' or head.startswith(b'\xff\xff\xff\xff') or head.startswith(b'ARROW1'):
    import datasets  # pylint: disable=g-import-not-at-top
    try:
      rows = datasets.Dataset.from_file(str(path))
    except Exception as e:  # pylint: disable=broad-except
      raise UnsupportedFormatError(f'{path}: not a readable datasets .arrow file ({type(e).__name__}: {e}); '
                                   + FORMATS) from None
    return _check_rows(path, rows, tokenizer)
  if path.suffix in ('.parquet', '.gz', '.zip', '.tar', '.npz', '.pkl') or head.startswith(b'PAR1'):
    raise UnsupportedFormatError(f'{path}: {path.suffix or "binary"} files are not read; ' + FORMATS)
  return check_jsonl(path, tokenizer)


def main(argv: Sequence[str] | None = None) -> int:
  """`python -m osvl_jax.trajectory --check PATH [...]`: prints each problem, then `trajectories=<n> invalid=<m>`.

  Exit status: 0 when every trajectory is sound, 1 when any is invalid, 2 when a PATH cannot be read (missing, or
  not in one of `FORMATS`: the reason goes to stderr, the other paths are still checked).
  """
  parser = argparse.ArgumentParser(
      prog='python -m osvl_jax.trajectory',
      description='Validates stored trajectories (DESIGN.md §4). ' + FORMATS + '.')
  parser.add_argument('--check', nargs='+', required=True, metavar='PATH',
                      help='JSON-lines files, datasets folders or .arrow files of trajectory records')
  parser.add_argument('--no-decode', action='store_true',
                      help='skip the check that each step\'s generated ids decode to its stored text (needs the '
                      'tokenizer files of the data folder)')
  args = parser.parse_args(argv)
  tokenizer = None
  if not args.no_decode:
    from osvl_jax.trajectory.tokens import load_tokenizer  # pylint: disable=g-import-not-at-top
    tokenizer = load_tokenizer()
  total, bad, unreadable = 0, 0, 0
  for path in args.check:
    try:
      n, invalid = check_file(path, tokenizer)
    except (OSError, UnsupportedFormatError) as e:
      print(f'error: {e}', file=sys.stderr)
      unreadable += 1
      continue
    total, bad = total + n, bad + len(invalid)
    for where, who, problems in invalid:
      for problem in problems:
        print(f'{path}:{where}: {who}: {problem}')
  print(f'trajectories={total} invalid={bad}' + (f' unreadable={unreadable}' if unreadable else ''))
  return 2 if unreadable else 1 if bad else 0
