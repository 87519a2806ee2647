"""Model, optimizer and the one forward pass both trainers use (log-probs at loss positions only)."""

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

  Raises:
    ValueError: for an unknown `config.model.name`.
  """
  if config.model.get('hf_path'):
    model, _ = weights.load_hf_folder(config.model.hf_path)
    return model
  if config.model.name != 'tiny':
    raise ValueError(f"config.model.name={config.model.name!r}: only 'tiny' is built in; set model.hf_path")
  return model_lib.Qwen3VLModel(config_lib.Qwen3VLConfig.tiny(), rngs=nnx.Rngs(seed))


def make_optimizer(model: nnx.Module, lr: float, steps: int, warmup_steps: int = 0,
                   weight_decay: float = 0.0, grad_clip: float = 1.0) -> nnx.Optimizer:
  """AdamW with linear warmup then cosine decay to 10% of `lr`, global-norm clipping."""
  schedule = optax.warmup_cosine_decay_schedule(0.0, lr, max(warmup_steps, 1), max(steps, warmup_steps + 1),
                                                end_value=lr * 0.1)
  tx = optax.chain(optax.clip_by_global_norm(grad_clip),
                   optax.adamw(schedule, b1=0.9, b2=0.95, weight_decay=weight_decay))
  return nnx.Optimizer(model, tx, wrt=nnx.Param)


def loss_logprobs(model: model_lib.Qwen3VLModel, batch: dict) -> jax.Array:
  """Log-probs of the emitted tokens at the batch's loss positions.

  Args:
    model: the policy.
    batch: from `batching.collate` (jnp or np arrays).
  Returns:
    [B, K] float32: log pi(token t+1 | tokens <= t) at `loss_positions`; garbage where `loss_valid` is 0.
  """
  hidden, _ = model(batch['input_ids'], batch['position_ids'], batch['attention_mask'],
                    pixel_values=batch.get('pixel_values'), image_grid_thw=batch.get('image_grid_thw'))
  gathered = jnp.take_along_axis(hidden, batch['loss_positions'][..., None], axis=1)  # [B, K, H]
  return losses.token_logprobs(model.logits(gathered), batch['loss_targets'])


def device_batch(batch: dict) -> dict:
  """Moves array fields to the default device; `image_grid_thw` stays on host (it fixes static shapes)."""
  return {k: (v if k == 'image_grid_thw' or v is None else jnp.asarray(v)) for k, v in batch.items()}


def num_params(model: nnx.Module) -> int:
  return int(sum(np.prod(x.shape) for x in jax.tree.leaves(nnx.state(model, nnx.Param))))
