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
from osvl_jax.models.qwen3_vl import vision

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


def row_patches(input_ids, merge_size: int = 2, image_token_id: int = traj_lib.IMAGE_PAD_ID) -> np.ndarray:
  """int64 [B]: the image patches of each row, merge_size**2 per `image_token_id` token of input_ids [B, T]."""
  return merge_size ** 2 * np.sum(np.asarray(input_ids) == image_token_id, axis=1).astype(np.int64)


def patch_budget(trajectories, rows_per_shard: int, multiple: int = 4) -> int:
  """The image patches per batch shard that fit any `rows_per_shard` rows of `trajectories`: the fullest row's
  patches (Σ t·h·w of its images' grids) × rows_per_shard, rounded up to `multiple` (spatial_merge_size**2); 0 when
  no trajectory has an image. The SFT trainer's default for `sft.patches_per_shard`, so that, as T and K
  (`padded_sizes`), the run's images take one shape: one compiled step whatever a batch's images."""
  fullest = max((sum(int(np.prod(i.grid_thw)) for i in t.images) for t in trajectories), default=0)
  return _round_up(fullest * int(rows_per_shard), multiple) if fullest else 0


def _shard_patch_index(per_row: np.ndarray, num_patches: int, shards: int, patches_per_shard: int = 0,
                       multiple: int = 1) -> np.ndarray:
  """int32 [S, P]: the flat index of each shard's patches (shard s = rows [s*B/S, (s+1)*B/S), whose images are one
  contiguous run of the flat patches), -1 on padding. P = `patches_per_shard` when > 0, else the fullest shard's
  count rounded up to `multiple`.

  Raises:
    ValueError: S does not divide B, the rows need a different number of patches than `num_patches`, or a shard
      needs more patches than `patches_per_shard`.
  """
  rows = len(per_row)
  if shards < 1 or rows % shards:
    raise ValueError(f'shard_images: {rows} rows do not split into {shards} shards')
  per_shard = np.asarray(per_row, np.int64).reshape(shards, -1).sum(1)
  if per_shard.sum() != num_patches:
    raise ValueError(f'shard_images: the image tokens of input_ids need {int(per_shard.sum())} patches, '
                     f'pixel_values has {num_patches}')
  fullest = int(per_shard.max())
  if patches_per_shard and fullest > patches_per_shard:
    raise ValueError(f'shard_images: a batch shard needs {fullest} image patches, over the budget '
                     f'patches_per_shard={patches_per_shard}')
  width = int(patches_per_shard) if patches_per_shard else -(-fullest // multiple) * multiple
  starts = np.cumsum(per_shard) - per_shard
  index = np.full((shards, width), -1, np.int32)
  for s, (start, count) in enumerate(zip(starts, per_shard)):
    index[s, :count] = np.arange(start, start + count)
  return index


def shard_images(input_ids, pixel_values, shards: int, merge_size: int = 2,
                 image_token_id: int = traj_lib.IMAGE_PAD_ID) -> tuple[np.ndarray, np.ndarray]:
  """Lays a batch's image patches out per batch shard, so each device's vision tower sees its own rows' images.

  Shard s holds rows [s*B/S, (s+1)*B/S) (the row blocks of `policy.shard_batch`); its rows' images are one
  contiguous run of the flat patches (images follow the rows), which becomes its block of the output, zero-padded
  to the patch count P of the fullest shard.

  Args:
    input_ids: int [B, T]; a row's images have merge_size**2 patches per `image_token_id` token.
    pixel_values: float32 [N, D], all images of all rows in row order (`collate`).
    shards: S, the number of batch shards (`sharding.batch_shards`); must divide B.
    merge_size: the vision tower's spatial_merge_size.
    image_token_id: the `<|image_pad|>` id.
  Returns:
    pixel_values float32 [S, P, D] and patch_index int32 [S, P]: the flat index of each patch, -1 on padding.
  Raises:
    ValueError: S does not divide B, or the image tokens need a different number of patches than N.
  """
  pixel_values = np.asarray(pixel_values, np.float32)
  index = _shard_patch_index(row_patches(input_ids, merge_size, image_token_id), pixel_values.shape[0], shards)
  out = np.where(index[..., None] >= 0, pixel_values[np.maximum(index, 0)], np.float32(0)) if index.size else \
      np.zeros((*index.shape, pixel_values.shape[1]), np.float32)
  return out, index


def shard_vision_inputs(pixel_values, image_grid_thw, per_row, shards: int, vision_config,
                        patches_per_shard: int = 0, patch_multiple: int | None = None) -> dict:
  """The per-shard vision inputs of a batch: each shard's patches and their host geometry, as arrays.

  Nothing of it is static under jit (`vision.Qwen3VLVision` per-shard path): batches of different images but the
  same budgets run one compiled program. Padding patches (zero pixels, geometry index 0 / weight 0, segment id -1)
  attend only among themselves and their merged tokens land on no image token, so they change no real output.

  Args:
    pixel_values: float32 [N, D] all images of all rows in row order (`collate`), or None (no images).
    image_grid_thw: int [I, 3] their grids, in order, or None.
    per_row: int [B] image patches of each row (`row_patches`); shard s = rows [s*B/S, (s+1)*B/S).
    shards: S (`sharding.batch_shards`); must divide B.
    vision_config: the tower's `VisionConfig` (spatial_merge_size, num_position_embeddings, patch_dim).
    patches_per_shard: P, a fixed budget (a multiple of spatial_merge_size**2; the batch's images then always
      give [S, P, ...], and a batch without images all padding); 0 = the fullest shard's count rounded up to
      `patch_multiple` (default spatial_merge_size**2: exactly the fullest shard, as `shard_images`).
  Returns:
    {'pixel_values': float32 [S, P, D], 'vision_interp_indices': int32 [S, P, 4], 'vision_interp_weights': float32
    [S, P, 4], 'vision_hw_positions': int32 [S, P, 2], 'vision_segment_ids': int32 [S, P] (-1 on padding)}; or
    {'pixel_values': None} for a batch without images and no budget.
  Raises:
    ValueError: S does not divide B; the rows, pixel_values and grids disagree on the patch count; a budget not a
      multiple of spatial_merge_size**2; a shard needing more patches than the budget (naming both).
  """
  if vision_config is None:
    raise ValueError('shard_vision_inputs: images (or a patch budget) need the vision config')
  merge2 = vision_config.spatial_merge_size ** 2
  if patches_per_shard and patches_per_shard % merge2:
    raise ValueError(f'patches_per_shard={patches_per_shard} is not a multiple of spatial_merge_size**2={merge2}')
  n = 0 if pixel_values is None else int(np.shape(pixel_values)[0])
  if n == 0 and not patches_per_shard:
    if np.sum(per_row):
      raise ValueError(f'shard_vision_inputs: the rows need {int(np.sum(per_row))} patches, there are no images')
    return {'pixel_values': None}
  meta = vision.vision_metadata(image_grid_thw, vision_config) if n else None
  if n and meta.num_patches != n:
    raise ValueError(f'shard_vision_inputs: the grids have {meta.num_patches} patches, pixel_values {n}')
  index = _shard_patch_index(np.asarray(per_row), n, shards, patches_per_shard, patch_multiple or merge2)
  valid, flat = index >= 0, np.maximum(index, 0)

  def take(values, fill, dtype):
    shape = (*index.shape, *np.shape(values)[1:])
    if not n:
      return np.full(shape, fill, dtype)
    return np.where(valid.reshape(*index.shape, *(1,) * (len(shape) - 2)), np.asarray(values)[flat],
                    np.asarray(fill, dtype)).astype(dtype)

  pixels = np.asarray(pixel_values, np.float32) if n else np.zeros((0, vision_config.patch_dim), np.float32)
  out = {'pixel_values': take(pixels, 0, np.float32)}
  geometry = ((meta.interp_indices, meta.interp_weights, meta.hw_positions, meta.segment_ids) if n else
              (np.zeros((0, 4)), np.zeros((0, 4)), np.zeros((0, 2)), np.zeros((0,))))
  for field, values, fill, dtype in zip(vision.GEOMETRY_FIELDS, geometry, (0, 0, 0, -1),
                                        (np.int32, np.float32, np.int32, np.int32)):
    out[f'vision_{field}'] = take(values, fill, dtype)
  return out
