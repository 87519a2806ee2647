"""The policy both trainers train: model, optimizer, the one forward pass (log-probs at loss positions only), and
its placement for data parallelism (mesh, replicated parameters, row-sharded batches)."""

import dataclasses

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import nnx

from osvl_jax.models.qwen3_vl import config as config_lib
from osvl_jax.models.qwen3_vl import model as model_lib
from osvl_jax.models.qwen3_vl import weights
from osvl_jax.rl import losses


def build_model(config: ml_collections.ConfigDict, seed: int = 0) -> model_lib.Qwen3VLModel:
  """The policy named by `config.model`: `hf_path` (an HF Qwen3-VL folder) if set, else `name` ('tiny').

  `config.model.text` (optional) overrides fields of the tiny text config, e.g. `num_hidden_layers`.
  `config.model.scan_layers` / `config.model.remat` (optional, default False): run the decoder layers under
  `jax.lax.scan` (stacked parameter layout) / rematerialise each layer in the backward pass (`text.Qwen3VLText`).
  Checkpoints keep the layout they were written with: resume with the same `scan_layers`.

  Raises:
    ValueError: for an unknown `config.model.name`.
  """
  scan_layers = bool(config.model.get('scan_layers', False))
  if config.model.get('hf_path'):
    model, _ = weights.load_hf_folder(config.model.hf_path, scan_layers=scan_layers)
  elif config.model.name != 'tiny':
    raise ValueError(f"config.model.name={config.model.name!r}: only 'tiny' is built in; set model.hf_path")
  else:
    model_config = config_lib.Qwen3VLConfig.tiny()
    if config.model.get('text'):
      model_config = dataclasses.replace(model_config,
                                         text=dataclasses.replace(model_config.text, **config.model.text.to_dict()))
    model = model_lib.Qwen3VLModel(model_config, rngs=nnx.Rngs(seed), scan_layers=scan_layers)
  model.language_model.remat = bool(config.model.get('remat', False))
  return model


def make_schedule(lr: float, steps: int, warmup_steps: int = 0) -> optax.Schedule:
  """Learning rate per optimizer step: linear warmup from 0 over `warmup_steps`, then cosine decay to 10% of `lr`
  at `steps`; without warmup the first step already uses `lr`.

  Raises:
    ValueError: steps < 1, warmup_steps < 0 or warmup_steps >= steps (optax's cosine decay needs >= 1 step).
  """
  if steps < 1:
    raise ValueError(f'steps={steps}: the schedule needs at least one step')
  if not 0 <= warmup_steps < steps:
    raise ValueError(f'warmup_steps={warmup_steps} must lie in [0, steps={steps})')
  if warmup_steps == 0:
    return optax.cosine_decay_schedule(lr, decay_steps=steps, alpha=0.1)
  return optax.warmup_cosine_decay_schedule(0.0, lr, warmup_steps, steps, end_value=lr * 0.1)


def make_optimizer(model: nnx.Module, lr: float, steps: int, warmup_steps: int = 0,
                   weight_decay: float = 0.0, grad_clip: float = 1.0) -> nnx.Optimizer:
  """AdamW on `make_schedule(lr, steps, warmup_steps)`, global-norm clipping at `grad_clip`.

  Raises:
    ValueError: from `make_schedule`.
  """
  tx = optax.chain(optax.clip_by_global_norm(grad_clip),
                   optax.adamw(make_schedule(lr, steps, warmup_steps), b1=0.9, b2=0.95, weight_decay=weight_decay))
  return nnx.Optimizer(model, tx, wrt=nnx.Param)


def loss_logprobs(model: model_lib.Qwen3VLModel, batch: dict) -> jax.Array:
  """Log-probs of the emitted tokens at the batch's loss positions.

  Args:
    model: the policy.
    batch: from `batching.collate` (jnp or np arrays).
  Returns:
    [B, K] float32: log pi(token t+1 | tokens <= t) at `loss_positions`; garbage where `completion_mask` is 0.
  """
  hidden, _ = model(batch['input_ids'], batch['position_ids'], batch['attention_mask'],
                    pixel_values=batch.get('pixel_values'), image_grid_thw=batch.get('image_grid_thw'))
  gathered = jnp.take_along_axis(hidden, batch['loss_positions'][..., None], axis=1)  # [B, K, H]
  return losses.token_logprobs(model.logits(gathered), batch['loss_targets'])


def device_batch(batch: dict) -> dict:
  """Moves array fields to the default device; `image_grid_thw` stays on host (it fixes static shapes)."""
  return {k: (v if k == 'image_grid_thw' or v is None else jnp.asarray(v)) for k, v in batch.items()}


# ----------------------------------------------------------------------------------------------------------------
# Data parallelism: a 1-D `jax.sharding.Mesh` with axis 'data'; the batch is split over it, parameters replicated.
# ----------------------------------------------------------------------------------------------------------------

DATA_AXIS = 'data'


def make_mesh(num_devices: int = 0) -> jax.sharding.Mesh | None:
  """A ('data',) mesh over the first `num_devices` devices (0 = all); None for a single device (no sharding).

  Raises:
    ValueError: more devices asked for than exist.
  """
  devices = jax.devices()
  n = len(devices) if num_devices in (0, None) else int(num_devices)
  if n > len(devices) or n < 1:
    raise ValueError(f'data parallelism over {n} devices, but {len(devices)} exist (XLA_FLAGS='
                     '--xla_force_host_platform_device_count=N simulates N CPU devices)')
  if n == 1:
    return None
  return jax.sharding.Mesh(np.asarray(devices[:n]), (DATA_AXIS,))


def replicate(tree_or_module, mesh: jax.sharding.Mesh | None):
  """Places every array of an nnx Module / Optimizer (in place) or of a pytree (returned) on all mesh devices."""
  if mesh is None:
    return tree_or_module
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  if isinstance(tree_or_module, nnx.Pytree):
    nnx.update(tree_or_module, jax.device_put(nnx.state(tree_or_module), replicated))
    return tree_or_module
  return jax.device_put(tree_or_module, replicated)


# Batch fields whose leading axis is not the row axis: position_ids [3, B, T] (rows on axis 1), pixel_values
# [N, 1536] (patches of all rows' images: replicated; the vision tower sees every image, the text model its rows).
_ROW_AXIS = {'position_ids': 1, 'pixel_values': None, 'image_grid_thw': None}


def shard_batch(batch: dict, mesh: jax.sharding.Mesh | None) -> dict:
  """Puts a collated batch on the mesh: row-major fields split over 'data' (NamedSharding), the rest replicated.

  Without a mesh this is `device_batch`. Rows per device = B / mesh size (B must divide).

  Raises:
    ValueError: B is not a multiple of the mesh size.
  """
  if mesh is None:
    return device_batch(batch)
  size = mesh.shape[DATA_AXIS]
  out = {}
  for key, value in batch.items():
    if key == 'image_grid_thw' or value is None:
      out[key] = value
      continue
    value = jnp.asarray(value)
    axis = _ROW_AXIS.get(key, 0)
    if axis is None or value.ndim == 0:
      spec = jax.sharding.PartitionSpec()
    else:
      if value.shape[axis] % size:
        raise ValueError(f'batch field {key!r} has {value.shape[axis]} rows, not a multiple of the {size} '
                         'data-parallel devices')
      spec = jax.sharding.PartitionSpec(*([None] * axis + [DATA_AXIS]))
    out[key] = jax.device_put(value, jax.sharding.NamedSharding(mesh, spec))
  return out
