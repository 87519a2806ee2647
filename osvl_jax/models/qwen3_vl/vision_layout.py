"""A batch's image patches laid out for the vision tower as arrays: per batch shard (the trainers, each device's
rows' images) or for the whole batch as one shard (the embedded sampler's prefill), zero-padded to a patch budget,
with their host geometry (`vision.GEOMETRY_FIELDS`) beside them.

Nothing of the layout is static under jit (`vision.Qwen3VLVision`'s per-shard path, `model.scatter_shards`), so
batches of different image grids but the same budgets run one compiled program (DESIGN.md §3: shapes come from
budgets, never from the data).
"""

import numpy as np

from osvl_jax.models.qwen3_vl import vision
from osvl_jax.trajectory import tokens as tokens_lib


def row_patches(input_ids, merge_size: int = 2, image_token_id: int = tokens_lib.IMAGE_PAD_ID) -> np.ndarray:
  """int64 [B]: the image patches of each row, merge_size**2 per `image_token_id` token of input_ids [B, T]."""
  return merge_size ** 2 * np.sum(np.asarray(input_ids) == image_token_id, axis=1).astype(np.int64)


def patch_slots(num_patches: int, patch_bucket: int) -> int:
  """A patch budget P for `num_patches` patches from a ladder: `patch_bucket` times the smallest power of two that
  fits them (0 for none), so batches of any images take log2-many patch shapes (the sampler's prefills, a trainer
  without a fixed budget).

  Raises:
    ValueError: a patch_bucket that is not an int >= 1.
  """
  if not isinstance(patch_bucket, int) or isinstance(patch_bucket, bool) or patch_bucket < 1:
    raise ValueError(f'patch_bucket must be an integer >= 1, got {patch_bucket!r}')
  if num_patches <= 0:
    return 0
  blocks = -(-int(num_patches) // patch_bucket)
  return patch_bucket * (1 << (blocks - 1).bit_length())


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
                 image_token_id: int = tokens_lib.IMAGE_PAD_ID) -> tuple[np.ndarray, np.ndarray]:
  """Lays a batch's image patches out per batch shard, so each device's vision tower sees its own rows' images.

  Shard s holds rows [s*B/S, (s+1)*B/S) (the row blocks of `placement.shard_batch`); its rows' images are one
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
      `patch_multiple` times a power of two (`patch_slots`; default patch_multiple spatial_merge_size**2).
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
  per_row = np.asarray(per_row, np.int64)
  if not patches_per_shard and shards >= 1 and len(per_row) % shards == 0:   # else _shard_patch_index says why
    patches_per_shard = patch_slots(int(per_row.reshape(shards, -1).sum(1).max()), patch_multiple or merge2)
  index = _shard_patch_index(per_row, n, shards, patches_per_shard)
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
