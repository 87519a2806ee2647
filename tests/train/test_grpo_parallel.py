"""Micro-batching and sharding leave the GRPO gradient unchanged (DESIGN.md §6, osvl_jax/train/grpo.py).

A batch of 8 groups × G = 2 short trajectories (real tokenizer, images on every row and tool images on half of
them, one fatal sample in every other group) through the tiny Qwen3-VL: the gradient of −J (Eq. 12) w.r.t. the
parameters is computed in one step on one device, in 4 micro-batches, and on a data=2 x fsdp=4 mesh of 8 simulated
CPU devices (rows and parameters sharded; run with XLA_FLAGS=--xla_force_host_platform_device_count=8, as
`make test` does).
"""

import jax
import ml_collections
import numpy as np
import pytest
from flax import nnx

from osvl_jax import trajectory as tj
from osvl_jax.models.qwen3_vl import config as config_lib
from osvl_jax.models.qwen3_vl import model as model_lib
from osvl_jax.models.qwen3_vl import sharding
from osvl_jax.train import grpo_batch, grpo_update, placement, update_rows
from tools import base

LENGTH_BUCKETS = (64, 128, 256, 512, 1024, 2048, 4096, 8192)  # grpo.length_buckets (batching.bucket_sizes)

GROUPS, G = 8, 2
CROP = tj.render_assistant_text('Zoom in.', tool_call={'name': 'crop', 'arguments': {
    'image': 'img_1', 'x': 0, 'y': 0, 'width': 16, 'height': 16}})
SEARCH = tj.render_assistant_text('Look it up.', tool_call={'name': 'text_search', 'arguments': {'query': 'Agra'}})
BAD = tj.render_assistant_text('Try.', tool_call={'name': 'browse', 'arguments': {'url': 'x'}})
RIGHT = tj.render_assistant_text('It is Agra.', response='Agra')
WRONG = tj.render_assistant_text('It is Delhi.', response='Delhi')


def _trajectory(g: int, i: int) -> tj.Trajectory:
  tokenizer = tj.load_tokenizer()
  builder = tj.TrajectoryBuilder(tokenizer, tj.ImageProcessor(min_pixels=32 * 32, max_pixels=32 * 32), [])
  builder.start(f'Which city is shown, case {g}?', np.full((32, 32, 3), 10 * g, np.uint8))
  fatal_step = None
  if i == 0:  # crop (a tool image) then the right answer
    builder.append_assistant_text(CROP)
    builder.append_observation(base.ToolResult(ok=True, text='Cropped.', images=[np.zeros((32, 32, 3), np.uint8)]))
    builder.append_assistant_text(RIGHT)
  elif g % 2:  # search, then a failing call marked fatal (f_i = 1; the K-error run is cut short to stay small)
    builder.append_assistant_text(SEARCH)
    builder.append_observation(base.ToolResult(ok=True, text='[1] Agra: a city in India.'))
    builder.append_assistant_text(BAD)
    builder.append_observation(base.error('unknown_tool', 'no tool named browse'))
    fatal_step = 1
  else:  # search then a wrong answer
    builder.append_assistant_text(SEARCH)
    builder.append_observation(base.ToolResult(ok=True, text='[1] Delhi: a city in India.'))
    builder.append_assistant_text(WRONG)
  return builder.finish(prompt_id=f'p{g}', sample_index=i, answers=['Agra'], fatal_step=fatal_step)


@pytest.fixture(scope='module')
def setup():
  trajectories = [_trajectory(g, i) for g in range(GROUPS) for i in range(G)]
  cfg = ml_collections.ConfigDict(dict(
      alpha=0.8, num_generations=G, fatal_mode='mask_clamp', delta=1e-6, eps_low=0.2, eps_high=0.28, beta=0.0,
      aggregation='seq_mean_token_mean', length_buckets=LENGTH_BUCKETS, loss_bucket=16))
  batch, grid, _, stats = grpo_batch.prepare_batch(trajectories, cfg)
  batch.pop('rewards'), batch.pop('fatal_steps')
  assert float(stats['num_fatal']) == GROUPS // 2 and np.any(batch['advantages'] != 0)
  # fixed old log-probs (ρ ≠ 1, so clipping is exercised), identical for every way of splitting the batch
  rng = np.random.default_rng(0)
  batch['old_logprobs'] = (-11.0 + rng.normal(0, 0.3, batch['loss_mask'].shape)).astype(np.float32)
  model = model_lib.Qwen3VLModel(config_lib.Qwen3VLConfig.tiny(), rngs=nnx.Rngs(0))
  return model, batch, grid, cfg


def _grads(model, batch, grid, cfg, micro_batch_size, mesh):
  vision = model.config.vision
  parts = [placement.shard_batch(grpo_update.with_grid(b, g), mesh, vision_config=vision)
           for b, g in update_rows.split_micro_batches(batch, grid, micro_batch_size)]
  with sharding.use_mesh(mesh):
    grads, metrics = grpo_update.accumulate_grads(model, parts, grpo_update.make_grad_fn(cfg), len(batch['advantages']),
                                           float(batch['loss_mask'].sum()))
  return jax.tree.leaves(jax.device_get(grads)), metrics, len(parts)


def _relative_error(a, b):
  diff = np.sqrt(sum(np.sum((x - y).astype(np.float64) ** 2) for x, y in zip(a, b)))
  return diff / np.sqrt(sum(np.sum(x.astype(np.float64) ** 2) for x in a))


def test_split_micro_batches_keeps_each_rows_images(setup):
  _, batch, grid, _ = setup
  parts = update_rows.split_micro_batches(batch, grid, 4)
  assert len(parts) == 4 and all(b['input_ids'].shape == (4, batch['input_ids'].shape[1]) for b, _ in parts)
  assert sum(len(g) for _, g in parts) == len(grid) == GROUPS * G + GROUPS  # question images + crops
  np.testing.assert_array_equal(np.concatenate([b['pixel_values'] for b, _ in parts]), batch['pixel_values'])
  np.testing.assert_array_equal(np.concatenate([b['position_ids'] for b, _ in parts], axis=1),
                                batch['position_ids'])
  with pytest.raises(ValueError, match='does not divide'):
    update_rows.split_micro_batches(batch, grid, 3)


def test_gradient_is_the_same_in_one_step_in_micro_batches_and_sharded(setup):
  if jax.device_count() < 8:
    pytest.skip('needs XLA_FLAGS=--xla_force_host_platform_device_count=8')
  model, batch, grid, cfg = setup
  one = sharding.make_mesh()  # the trivial mesh: the first device
  full, full_metrics, n = _grads(model, batch, grid, cfg, 0, one)
  assert n == 1 and _relative_error(full, [np.zeros_like(x) for x in full]) == 1.0  # a non-zero gradient
  micro, micro_metrics, n = _grads(model, batch, grid, cfg, 4, one)
  assert n == 4
  # Sums in another order (micro-batches, devices): the gradient within 1e-5 of its norm, the loss (a mean of
  # ρÂ terms that nearly cancel) within 1e-5 of the terms' size, mean |Â|.
  scale = float(np.mean(np.abs(batch['advantages'])))
  assert _relative_error(full, micro) < 1e-5
  assert micro_metrics['loss'] == pytest.approx(full_metrics['loss'], abs=1e-5 * scale)
  assert micro_metrics['num_tokens'] == full_metrics['num_tokens']
  assert micro_metrics['clipped_tokens'] == full_metrics['clipped_tokens'] > 0

  mesh = sharding.mesh_from_config({'data': 2, 'fsdp': -1})
  sharding.shard_model(model, mesh)
  kernel = model.language_model.layers[0].mlp.up_proj.kernel[...]  # [64, 128]: embed over fsdp=4
  assert kernel.sharding.spec[0] == 'fsdp' and kernel.addressable_shards[0].data.shape == (16, 128)
  parallel, parallel_metrics, _ = _grads(model, batch, grid, cfg, 0, mesh)
  assert _relative_error(full, parallel) < 1e-5
  assert parallel_metrics['loss'] == pytest.approx(full_metrics['loss'], abs=1e-5 * scale)


def test_shard_batch_splits_rows_over_the_data_and_fsdp_axes(setup):
  if jax.device_count() < 8:
    pytest.skip('needs XLA_FLAGS=--xla_force_host_platform_device_count=8')
  model, batch, grid, _ = setup
  mesh = sharding.mesh_from_config({'data': 2, 'fsdp': 4})
  sharded = placement.shard_batch(grpo_update.with_grid(batch, grid), mesh, vision_config=model.config.vision)
  assert tuple(sharded['input_ids'].sharding.spec) == (('data', 'fsdp'), None)
  assert tuple(sharded['loss_mask'].sharding.spec) == (('data', 'fsdp'), None)
  assert tuple(sharded['position_ids'].sharding.spec) == (None, ('data', 'fsdp'), None)
  # Each shard's own rows' patches, padded to the fullest shard: [S, P, D] split like the rows (no replication).
  assert tuple(sharded['pixel_values'].sharding.spec) == (('data', 'fsdp'), None, None)
  assert sharded['pixel_values'].shape[0] == 8
  for key in ('vision_interp_indices', 'vision_interp_weights', 'vision_hw_positions', 'vision_segment_ids'):
    assert sharded[key].shape[:2] == sharded['pixel_values'].shape[:2], key
    assert tuple(sharded[key].sharding.spec)[0] == ('data', 'fsdp'), key
  assert 'image_grid_thw' not in sharded
  assert len(sharded['pixel_values'].addressable_shards) == 8
  assert len(sharded['input_ids'].addressable_shards) == 8
  assert sharded['input_ids'].addressable_shards[0].data.shape[0] == GROUPS * G // 8
  with pytest.raises(ValueError, match='not a multiple'):
    placement.shard_batch({k: v[:3] if k != 'position_ids' else v[:, :3] for k, v in batch.items()
                       if k not in ('pixel_values',)}, mesh)
