"""The invariants the trainer relies on: `check_trajectory`, `validate_trajectory`, `check_jsonl` (DESIGN.md §4).

`train.batching.collate` validates every trajectory; `python -m osvl_jax.trajectory --check FILE.jsonl` (`main`)
checks a file of `Trajectory.to_json` lines.
"""

import argparse
import os
from collections.abc import Sequence

import numpy as np

from osvl_jax.trajectory.record import STOP_REASONS, Trajectory, TrajectoryError
from osvl_jax.trajectory.tokens import (
    ASSISTANT_ID, IM_END_ID, IM_START_ID, IMAGE_PAD_ID, NEWLINE_ID, VISION_END_ID, VISION_START_ID, VOCAB_SIZE)

def check_trajectory(traj: Trajectory, max_problems: int = 20) -> list[str]:
  """Checks the invariants every consumer relies on; returns the problems found ([] when sound).

  - token_ids / gen_mask / step_of_token (/ rollout_logprobs) are 1-D of equal length T;
  - each image appears as <|vision_start|> + num_tokens × <|image_pad|> + <|vision_end|>, in order, one per
    ImageRef, and pixel_values has prod(grid_thw) rows; no stray pad/vision tokens;
  - gen_mask is 1 only inside assistant turns (after '<|im_start|>assistant\\n', up to its <|im_end|>) and
    never on vision tokens;
  - step_of_token starts at -1, is non-decreasing by steps of at most 1, ends at exactly L (every step has
    tokens), and prompt tokens (-1) are never generated; fatal_step (if any) is a valid step index;
  - each grid is (1, h, w) with h, w multiples of merge_size, pixel_values is [prod(grid), 3*T*P*P];
  - stop_reason is None or one of `STOP_REASONS`.

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
  if t and (ids.min() < 0 or ids.max() >= VOCAB_SIZE):
    problems.append(f'token ids outside [0, {VOCAB_SIZE})')
  gen = gen.astype(bool)
  # Images.
  starts = np.flatnonzero(ids == VISION_START_ID)
  if len(starts) != len(traj.images):
    problems.append(f'{len(starts)} <|vision_start|> tokens for {len(traj.images)} images')
  covered = np.zeros(t, bool)
  for i, (pos, im) in enumerate(zip(starts, traj.images)):
    n = im.num_tokens
    end = pos + 1 + n
    if end >= t or not np.all(ids[pos + 1:end] == IMAGE_PAD_ID) or ids[end] != VISION_END_ID:
      run = int(np.argmax(ids[pos + 1:] != IMAGE_PAD_ID)) if pos + 1 < t else 0
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
  vision = np.isin(ids, (VISION_START_ID, VISION_END_ID, IMAGE_PAD_ID))
  if np.any(vision & ~covered) and len(starts) == len(traj.images):
    problems.append(f'stray vision tokens at {np.flatnonzero(vision & ~covered)[:5].tolist()}')
  if np.any(gen & vision):
    problems.append(f'gen_mask on vision tokens at {np.flatnonzero(gen & vision)[:5].tolist()}')
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
  if traj.fatal_step is not None and not 0 <= traj.fatal_step < len(traj.steps):
    problems.append(f'fatal_step {traj.fatal_step} outside the {len(traj.steps)} steps')
  stop_reason = getattr(traj, 'stop_reason', None)
  if stop_reason is not None and stop_reason not in STOP_REASONS:
    problems.append(f'stop_reason {stop_reason!r} is not one of {STOP_REASONS}')
  return problems[:max_problems]


def validate_trajectory(traj: Trajectory) -> Trajectory:
  """`check_trajectory`, raising: returns `traj` when sound.

  Raises:
    TrajectoryError: naming the trajectory (prompt_id, sample_index) and every problem found.
  """
  problems = check_trajectory(traj)
  if problems:
    raise TrajectoryError(f'trajectory prompt_id={traj.prompt_id!r} sample_index={traj.sample_index} is invalid: '
                          + '; '.join(problems))
  return traj


def check_jsonl(path: str | os.PathLike) -> tuple[int, list[tuple[int, str, list[str]]]]:
  """Checks every trajectory of a JSON-lines file.

  Returns:
    (number of trajectories, [(line number, 'prompt_id=... sample_index=...', problems)] for the invalid ones);
    a line that does not decode into a Trajectory is invalid with the decoding error as its problem.
  """
  n, invalid = 0, []
  with open(path, encoding='utf-8') as f:
    for line_no, line in enumerate(f, 1):
      if not line.strip():
        continue
      n += 1
      try:
        traj = Trajectory.from_json(line)
      except Exception as e:  # pylint: disable=broad-except  # a broken line is reported, not fatal
        invalid.append((line_no, '?', [f'cannot decode: {type(e).__name__}: {e}']))
        continue
      problems = check_trajectory(traj)
      if problems:
        invalid.append((line_no, f'prompt_id={traj.prompt_id!r} sample_index={traj.sample_index}', problems))
  return n, invalid


def main(argv: Sequence[str] | None = None) -> int:
  """`python -m osvl_jax.trajectory --check FILE.jsonl [...]`: prints each problem, then
  `trajectories=<n> invalid=<m>`; exit status 1 when any trajectory is invalid."""
  parser = argparse.ArgumentParser(
      prog='python -m osvl_jax.trajectory',
      description='Validates JSON lines of Trajectory.to_json() records (DESIGN.md §4).')
  parser.add_argument('--check', nargs='+', required=True, metavar='FILE.jsonl',
                      help='JSON-lines files of Trajectory.to_json() records to validate')
  args = parser.parse_args(argv)
  total, bad = 0, 0
  for path in args.check:
    n, invalid = check_jsonl(path)
    total, bad = total + n, bad + len(invalid)
    for line_no, who, problems in invalid:
      for problem in problems:
        print(f'{path}:{line_no}: {who}: {problem}')
  print(f'trajectories={total} invalid={bad}')
  return 1 if bad else 0
