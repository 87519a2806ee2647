"""Training batches on the mesh: a collated batch's images laid out per batch shard (`vision_layout`), its fields
placed with the logical rules' shardings (`shard_batch`), and the multi-host form where each host collates only its
own rows (`host_batch`)."""

import jax
import jax.numpy as jnp
import numpy as np

from osvl_jax import distributed
from osvl_jax.models.qwen3_vl import config as config_lib
from osvl_jax.models.qwen3_vl import sharding
from osvl_jax.models.qwen3_vl import vision_layout as layout_lib
from osvl_jax.train import batching


def vision_layout(batch: dict, vision_config: config_lib.VisionConfig | None, shards: int = 1,
                  patches_per_shard: int = 0) -> dict:
  """On the host: a collated batch's flat images (pixel_values [N, D], image_grid_thw [I, 3]) laid out per batch
  shard with their geometry as arrays (`vision_layout.shard_vision_inputs`), image_grid_thw dropped: the form the jitted
  training steps take (nothing grid-shaped static). A batch already laid out (pixel_values [S, P, D]) or without
  images and budget is returned as it is, less image_grid_thw.

  Args:
    batch: `batching.collate`'s fields (+ per-row loss arrays), host arrays.
    vision_config: the policy's `VisionConfig` (needed when the batch has images or a budget is set).
    shards: S, the batch shards of the mesh (`sharding.batch_shards`).
    patches_per_shard: the patch budget P (config `sft.patches_per_shard` / `grpo.patches_per_shard`); 0 = the
      fullest shard of this batch.
  Raises:
    ValueError: images without vision_config; from `vision_layout.shard_vision_inputs` (a shard over the budget, ...).
  """
  batch = dict(batch)
  grid = batch.pop('image_grid_thw', None)
  pixels = batch.get('pixel_values')
  if (pixels is not None and np.ndim(pixels) == 3) or (pixels is None and not patches_per_shard):
    return batch
  if vision_config is None:
    raise ValueError('vision_layout: a batch with images (or a patch budget) needs the vision config')
  per_row = layout_lib.row_patches(np.asarray(batch['input_ids']), vision_config.spatial_merge_size)
  batch.update(layout_lib.shard_vision_inputs(None if pixels is None else np.asarray(pixels), grid, per_row, shards,
                                            vision_config, patches_per_shard))
  return batch


def device_batch(batch: dict) -> dict:
  """Moves array fields to the default device; `image_grid_thw` stays on host (it fixes static shapes)."""
  return {k: (v if k == 'image_grid_thw' or v is None else jnp.asarray(v)) for k, v in batch.items()}


# Batch fields whose row axis is not 0: position_ids [3, B, T] (rows on axis 1). pixel_values: flat [N, 1536]
# replicated, or per shard [S, P, 1536] (`vision_layout`) split like the rows, as the vision_* geometry [S, P, ...].
ROW_AXIS = {'position_ids': 1, 'image_grid_thw': None}


def batch_sharding(key: str, ndim: int, mesh: jax.sharding.Mesh,
                   rules=sharding.LOGICAL_RULES) -> tuple[jax.sharding.NamedSharding, int | None]:
  """(sharding, row axis or None) of batch field `key` with `ndim` dims: rows over the logical 'batch' axis
  (('data', 'fsdp')) on `ROW_AXIS` (default 0); flat pixel_values [N, D] and scalars replicated."""
  axis = ROW_AXIS.get(key, 0)
  if axis is None or ndim == 0 or (key == 'pixel_values' and ndim == 2):
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()), None
  return sharding.data_sharding(mesh, ndim, axis, rules), axis


def shard_batch(batch: dict, mesh: jax.sharding.Mesh, rules=sharding.LOGICAL_RULES,
                vision_config: config_lib.VisionConfig | None = None, patches_per_shard: int = 0) -> dict:
  """Puts a collated batch (host arrays, every row) on the mesh: the rows of input_ids, attention_mask, the loss
  arrays [B, ...] and position_ids [3, B, T] split over ('data', 'fsdp'). The images are laid out per batch shard
  (`vision_layout`: pixel_values [S, P, 1536] and the vision_* geometry [S, P, ...], split like the rows, S >= 1),
  so each device's vision tower encodes only its own rows' images and the step's program depends on the budgets
  only, not on the grids; image_grid_thw is dropped. Multi-host: SFT feeds only each host's rows
  (`host_batch`); GRPO gives every host the whole batch, of which each places its devices' slices.

  Args:
    batch: `batching.collate`'s fields (+ per-row loss arrays), host or jax arrays; pixel_values flat [N, 1536]
      with image_grid_thw [I, 3], or already laid out.
    mesh, rules: the trainer's mesh and logical rules.
    vision_config, patches_per_shard: as `vision_layout`.
  Raises:
    ValueError: naming the field, when its B rows do not split over the data x fsdp devices; from
      `vision_layout` (a shard over the patch budget, images without vision_config, ...).
  """
  shards = sharding.batch_shards(mesh, rules)
  if np.shape(batch['input_ids'])[0] % shards:
    raise ValueError(f"batch field 'input_ids' has {np.shape(batch['input_ids'])[0]} rows, not a multiple of "
                     f'the {shards} data x fsdp devices of the mesh')
  batch = vision_layout(batch, vision_config, shards, patches_per_shard)
  out = {}
  for key, value in batch.items():
    if key == 'image_grid_thw' or value is None:
      out[key] = value
      continue
    value = np.asarray(value) if not isinstance(value, jax.Array) else value
    target, axis = batch_sharding(key, value.ndim, mesh, rules)
    if axis is not None and value.shape[axis] % shards:
      raise ValueError(f'batch field {key!r} has {value.shape[axis]} rows, not a multiple of the {shards} '
                       'data x fsdp devices of the mesh')
    if isinstance(value, np.ndarray) and jax.process_count() > 1:
      # Every host holds the same whole batch (multi-host GRPO broadcasts it): each places only its devices'
      # slices (`jax.device_put` would first copy the whole array to every host to check that they agree).
      out[key] = jax.make_array_from_callback(value.shape, target, lambda index, value=value: value[index])
    else:
      out[key] = jax.device_put(value, target)
  return out


def host_batch(trajectories: list, mesh: jax.sharding.Mesh, length: int, num_loss: int, rules=None,
               vision_config=None, patches_per_shard: int = 0, rows: list[list[int]] | None = None) -> dict:
  """The global training batch of `trajectories`, of which this host collates only its own rows.

  Text fields (ids, masks, positions, loss gathers) are collated from this host's rows alone and become global
  arrays split over the batch axes ('data', 'fsdp') (`batch_sharding`). The images are laid out per batch
  shard with their geometry as arrays (`vision_layout.shard_vision_inputs`: pixel_values [S, P, 1536], vision_* [S, P,
  ...], split like the rows): each host lays out the whole batch's images from the trajectories (their grids give
  each row's patches; no tokenizing, no collation of other hosts' rows) and places its devices' shards. In a single
  process this is `collate` + `shard_batch`.

  Args:
    trajectories: the global batch's trajectories, the same list on every host.
    mesh: the trainer's mesh (`sharding.mesh_from_config`).
    length, num_loss: the run's fixed T and K (`batching.sft_buckets`, `batching.pack`'s budgets).
    rules: logical rules (`sharding.rules_from_config`); None = `sharding.LOGICAL_RULES`.
    vision_config: the policy's `VisionConfig` (needed when a trajectory has images or a patch budget is set).
    patches_per_shard: the patch budget P (`sft.patches_per_shard`); 0 = the fullest shard of this batch.
    rows: None (row b = trajectory b), or the packed rows (`batching.pack`, empty lists padding the row count):
      the batch's B rows, each a list of indices into `trajectories` (`batching.collate`).
  Returns:
    the batch of jax arrays (no image_grid_thw: nothing of it is static under jit).
  Raises:
    ValueError: B does not split over the mesh's batch axes; a shard over the patch budget.
  """
  rules = sharding.LOGICAL_RULES if rules is None else rules
  if jax.process_count() == 1:
    batch = batching.collate(trajectories, length=length, num_loss=num_loss, rows=rows)
    return shard_batch(batch, mesh, rules, vision_config, patches_per_shard)
  packed = rows is not None
  rows = rows if packed else [[i] for i in range(len(trajectories))]
  size = len(rows)
  mine = rows[distributed.host_rows(mesh, size, rules)]
  local = (batching.collate(trajectories, length=length, num_loss=num_loss, rows=mine) if packed else
           batching.collate([trajectories[r[0]] for r in mine], length=length, num_loss=num_loss))
  local.pop('image_grid_thw')
  local.pop('pixel_values')
  images = [image for row in rows for i in row for image in trajectories[i].images]
  per_row = np.array([sum(int(np.prod(im.grid_thw)) for i in row for im in trajectories[i].images) for row in rows],
                     np.int64)
  vision = layout_lib.shard_vision_inputs(
      np.concatenate([np.asarray(i.pixel_values, np.float32) for i in images]) if images else None,
      np.array([np.asarray(i.grid_thw) for i in images], np.int32).reshape(-1, 3), per_row,
      sharding.batch_shards(mesh, rules), vision_config, patches_per_shard) if images or patches_per_shard else {}
  out = {}
  for key, value in local.items():
    if value is None:
      out[key] = None
      continue
    target, row_axis = batch_sharding(key, np.ndim(value), mesh, rules)
    out[key] = distributed.global_array(target, value, row_axis, size)
  for key, value in vision.items():   # the whole batch's layout on every host: each places its devices' shards
    if value is None:
      out[key] = None
      continue
    target, _ = batch_sharding(key, value.ndim, mesh, rules)
    out[key] = jax.make_array_from_callback(value.shape, target, lambda index, value=value: value[index])
  if 'pixel_values' not in out:
    out['pixel_values'] = None
  return out
