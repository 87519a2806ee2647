"""Trajectories -> padded training arrays, token-exact (no re-rendering, no re-tokenization).

The loss only needs next-token log-probs where the policy emitted a token, so besides the full sequence the
batch carries the gathered *loss positions*: position t predicts token t+1, and is kept when gen_mask[t+1] = 1.
Computing the vocabulary projection only there keeps a 152k vocabulary from dominating time and memory.

The model reads `trajectory.model_input_ids(token_ids, gen_mask)` (a vision id the policy emitted is text, as in
the rollout's contexts: it can never break the pad/feature count); the loss targets are the emitted ids themselves.
"""

import numpy as np

from osvl_jax import trajectory as traj_lib
from osvl_jax.models.qwen3_vl import rope

PAD_ID = traj_lib.ENDOFTEXT_ID  # <|endoftext|>


def _round_up(n: int, multiple: int) -> int:
  return max(multiple, -(-n // multiple) * multiple)


def num_loss_tokens(trajectory) -> int:
  """The loss positions of a `Trajectory`: its policy-emitted tokens after the first (Σ M_gen of its row in
  `collate`'s completion_mask)."""
  return int(np.count_nonzero(np.asarray(trajectory.gen_mask, bool)[1:]))


def padded_sizes(trajectories, length_multiple: int = 256, loss_multiple: int = 64) -> tuple[int, int]:
  """(T, K) that `collate` pads `trajectories` to: the longest sequence and the most emitted tokens, rounded up."""
  length = _round_up(max(len(t.token_ids) for t in trajectories), length_multiple)
  k = _round_up(max(num_loss_tokens(t) for t in trajectories), loss_multiple)
  return length, k


def bucket_sizes(trajectories, length_buckets, max_loss_tokens: int | None = None,
                 loss_bucket: int = 64) -> tuple[int, int]:
  """(T, K) of a batch on the config's ladders, never the data's own sizes: T is the smallest of `length_buckets`
  that holds the batch's longest trajectory; K (loss positions per row) is `loss_bucket` times the smallest power of
  two that holds its most emitted tokens, capped at min(T, max_loss_tokens). A run therefore compiles at most
  len(length_buckets) × (log2(K_max / loss_bucket) + 1) update programs, a number fixed by the config
  (`program_bound`; DESIGN.md §3), while K follows the policy's emitted tokens (the vocabulary projection runs
  only there).

  Args:
    trajectories: the batch's `Trajectory` records.
    length_buckets: increasing ints >= 1, tokens per row (`grpo.length_buckets`).
    max_loss_tokens: the cap on K (`grpo.max_loss_tokens`), or None / 0 (T).
    loss_bucket: the K ladder's first rung, an int >= 1.
  Raises:
    ValueError: an empty batch; a trajectory longer than the largest bucket, or emitting more tokens than the cap
      (naming its prompt_id, its size and the budget).
  """
  if not trajectories:
    raise ValueError('bucket_sizes: trajectories is empty')
  longest = max(trajectories, key=lambda t: len(t.token_ids))
  fits = [int(b) for b in length_buckets if int(b) >= len(longest.token_ids)]
  if not fits:
    raise ValueError(f'trajectory {longest.prompt_id!r} has {len(longest.token_ids)} tokens, over the largest '
                     f'length bucket {max(length_buckets)} (length_buckets={tuple(length_buckets)})')
  length = fits[0]
  cap = min(length, int(max_loss_tokens)) if max_loss_tokens else length
  most = max(trajectories, key=num_loss_tokens)
  need = num_loss_tokens(most)
  if need > cap:
    raise ValueError(f'trajectory {most.prompt_id!r} has {need} loss tokens, over the budget '
                     f'max_loss_tokens={max_loss_tokens}')
  return length, min(cap, ladder(need, loss_bucket))


def ladder(n: int, base: int) -> int:
  """`base` times the smallest power of two whose product holds n (n >= 1; `base` for n <= base)."""
  blocks = max(1, -(-int(n) // int(base)))
  return int(base) * (1 << (blocks - 1).bit_length())


def program_bound(length_buckets, max_loss_tokens: int | None = None, loss_bucket: int = 64) -> int:
  """The most (T, K) pairs `bucket_sizes` can return for these budgets: the update programs a run can compile."""
  total = 0
  for length in length_buckets:
    cap, k = min(length, int(max_loss_tokens)) if max_loss_tokens else length, 1
    sizes = set()
    while True:
      sizes.add(min(cap, ladder(k, loss_bucket)))
      if ladder(k, loss_bucket) >= cap:
        break
      k = ladder(k, loss_bucket) + 1
    total += len(sizes)
  return total


def collate(trajectories, *, length_multiple: int = 256, loss_multiple: int = 64, length: int | None = None,
            num_loss: int | None = None) -> dict[str, np.ndarray]:
  """Pads a list of `Trajectory` into model inputs and gathered loss targets.

  Args:
    trajectories: `osvl_jax.trajectory.Trajectory` records (token_ids, gen_mask, step_of_token, images).
    length_multiple: T is padded up to a multiple of this (limits recompiles).
    loss_multiple: K (loss positions per row) is padded up to a multiple of this.
    length, num_loss: fixed T and K instead (one compiled program for a whole run), at least the batch's own.
  Returns:
    input_ids [B, T] int32 (`trajectory.model_input_ids` of each row, right padded with <|endoftext|>),
    attention_mask [B, T] bool,
    position_ids [3, B, T] int32 (3-D MRoPE positions, `rope.get_rope_index`),
    pixel_values [N, 1536] float32 (all images of all rows, in order), image_grid_thw [I, 3] int32,
    loss_positions [B, K] int32 (t such that token t+1 was emitted by the policy; 0 on padding),
    loss_targets [B, K] int32 (token t+1), completion_mask [B, K] bool (M_gen at the loss positions: True on the
    policy's emitted tokens, False on padding), loss_step [B, K] int32 (step of token t+1; -1 on padding),
    rollout_logprobs [B, K] float32 (0 where unknown).
  Raises:
    ValueError: on an empty list, or a fixed `length` / `num_loss` smaller than the batch needs.
    trajectory.TrajectoryError: (a ValueError) when a trajectory breaks an invariant (`validate_trajectory`:
      pads per image, gen_mask only on assistant tokens, step_of_token order, ...); nothing is repaired here.
  """
  if not trajectories:
    raise ValueError('collate: trajectories is empty')
  for traj in trajectories:
    traj_lib.validate_trajectory(traj)
  batch = len(trajectories)
  need_length, need_loss = padded_sizes(trajectories, length_multiple, loss_multiple)
  if (length is not None and length < need_length) or (num_loss is not None and num_loss < need_loss):
    raise ValueError(f'collate: fixed length={length} / num_loss={num_loss} is below the batch\'s '
                     f'{need_length} / {need_loss}')
  length = length or need_length
  k = num_loss or need_loss

  input_ids = np.full((batch, length), PAD_ID, np.int32)
  attention_mask = np.zeros((batch, length), bool)
  loss_positions = np.zeros((batch, k), np.int32)
  loss_targets = np.zeros((batch, k), np.int32)
  completion_mask = np.zeros((batch, k), bool)
  loss_step = np.full((batch, k), -1, np.int32)
  rollout_logprobs = np.zeros((batch, k), np.float32)
  pixel_values, grids = [], []
  for i, traj in enumerate(trajectories):
    ids = np.asarray(traj.token_ids, np.int32)
    input_ids[i, :len(ids)] = traj_lib.model_input_ids(ids, traj.gen_mask)
    attention_mask[i, :len(ids)] = True
    targets = np.nonzero(np.asarray(traj.gen_mask, bool)[1:])[0] + 1  # emitted tokens (index >= 1)
    n = len(targets)
    loss_positions[i, :n] = targets - 1
    loss_targets[i, :n] = ids[targets]
    completion_mask[i, :n] = True
    loss_step[i, :n] = np.asarray(traj.step_of_token)[targets]
    if traj.rollout_logprobs is not None:
      rollout_logprobs[i, :n] = np.asarray(traj.rollout_logprobs)[targets]
    for image in traj.images:
      pixel_values.append(np.asarray(image.pixel_values, np.float32))
      grids.append(np.asarray(image.grid_thw, np.int32))
  image_grid_thw = np.stack(grids).astype(np.int32) if grids else np.zeros((0, 3), np.int32)
  position_ids, _ = rope.get_rope_index(input_ids, image_grid_thw if grids else None, attention_mask)
  return {
      'input_ids': input_ids,
      'attention_mask': attention_mask,
      'position_ids': np.asarray(position_ids, np.int32),
      'pixel_values': np.concatenate(pixel_values) if pixel_values else None,
      'image_grid_thw': image_grid_thw if grids else None,
      'loss_positions': loss_positions,
      'loss_targets': loss_targets,
      'completion_mask': completion_mask,
      'loss_step': loss_step,
      'rollout_logprobs': rollout_logprobs,
  }


def patch_budget(trajectories, rows_per_shard: int, multiple: int = 4) -> int:
  """The image patches per batch shard that fit any `rows_per_shard` rows of `trajectories`: the fullest row's
  patches (Σ t·h·w of its images' grids) × rows_per_shard, rounded up to `multiple` (spatial_merge_size**2); 0 when
  no trajectory has an image. The SFT trainer's default for `sft.patches_per_shard`, so that, as T and K
  (`padded_sizes`), the run's images take one shape: one compiled step whatever a batch's images."""
  fullest = max((sum(int(np.prod(i.grid_thw)) for i in t.images) for t in trajectories), default=0)
  return _round_up(fullest * int(rows_per_shard), multiple) if fullest else 0
