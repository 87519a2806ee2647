"""Compile once (issue 22): no jitted training program is keyed by what a batch holds.

Three batches whose images have different grids (one image; two of other sizes in one row; images in both rows),
and a batch without images, all with the same budgets (rows B, tokens T, loss positions K, patches per batch shard
P = `sft.patches_per_shard`), go through the SFT step and the GRPO gradient on the tiny Qwen3-VL: the steps after the
first compile nothing (`compile_cache.counts()['compiles_total']`), because the images reach the step as arrays
(`placement.shard_batch` -> `vision_layout.shard_vision_inputs`: patches and their geometry per shard), never as a
static grid. A batch whose images need more patches than the budget fails on the host, naming the need and the budget.
"""

import ml_collections
import numpy as np
import pytest

from osvl_jax import compile_cache
from osvl_jax.models.qwen3_vl import config as config_lib
from osvl_jax.models.qwen3_vl import rope
from osvl_jax.models.qwen3_vl import sharding
from osvl_jax.train import grpo_update, placement, policy, sft

B, T, K, BUDGET = 2, 32, 8, 48
IMAGE = config_lib.Qwen3VLConfig.tiny().image_token_id
# Each batch: per row, the (t, h, w) grids of its images, in order.
BATCH_GRIDS = [
    [[(1, 4, 4)], []],
    [[(1, 2, 8), (1, 2, 2)], []],
    [[(1, 6, 2)], [(1, 4, 6), (1, 2, 4)]],
    [[], []],
]


def _config() -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict({
      'seed': 0, 'model': {'name': 'tiny', 'hf_path': '', 'text': {'num_hidden_layers': 1}},
      'sft': {'lr': 1e-3, 'steps': 10, 'warmup_steps': 0, 'weight_decay': 0.0, 'grad_clip': 1.0,
              'patches_per_shard': BUDGET},
      'grpo': {'lr': 1e-3, 'steps': 10, 'eps_low': 0.2, 'eps_high': 0.28, 'beta': 0.0}})


def _batch(row_grids, seed: int) -> dict:
  """A collated batch (flat pixel_values [N, 1536], image_grid_thw [I, 3]) of B rows with the given images."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(0, 1000, (B, T)).astype(np.int32)
  for row, grids in enumerate(row_grids):
    start = 2
    for _, h, w in grids:
      ids[row, start:start + h * w // 4] = IMAGE
      start += h * w // 4 + 1
  grid = np.array([g for row in row_grids for g in row], np.int32).reshape(-1, 3)
  mask = np.ones((B, T), bool)
  pos, _ = rope.get_rope_index(ids, grid if len(grid) else None, mask, image_token_id=IMAGE)
  loss_positions = np.sort(rng.choice(np.arange(14, T - 1), (B, K), replace=False), axis=1).astype(np.int32)
  n = int(np.prod(grid, axis=1).sum()) if len(grid) else 0
  completion = np.ones((B, K), bool)
  return {
      'input_ids': ids, 'attention_mask': mask, 'position_ids': np.asarray(pos, np.int32),
      'pixel_values': rng.standard_normal((n, 1536)).astype(np.float32) if n else None,
      'image_grid_thw': grid if n else None,
      'loss_positions': loss_positions, 'loss_targets': np.take_along_axis(ids, loss_positions + 1, axis=1),
      'completion_mask': completion, 'loss_mask': completion.astype(np.float32),
      'advantages': rng.normal(0, 1, B).astype(np.float32),
      'old_logprobs': (-7.0 + rng.normal(0, 0.3, (B, K))).astype(np.float32)}


def _compiles() -> int:
  """Programs this process built: compiled, or read back from a persistent cache (`make test` shares one between
  its workers, so a program another test compiled first is a hit here, not a compile)."""
  counts = compile_cache.counts()
  return counts['compiles_total'] + counts['compile_cache_hits']


def test_sft_step_and_grpo_gradient_compile_once_for_batches_of_different_grids():
  config = _config()
  mesh = sharding.make_mesh()
  model, optimizer = policy.create(config, mesh, 'sft')
  step, grad_fn = sft.make_train_step(), grpo_update.make_grad_fn(config.grpo)
  compiles, losses = [], []
  for i, row_grids in enumerate(BATCH_GRIDS):
    placed = placement.shard_batch(_batch(row_grids, i), mesh, vision_config=model.config.vision,
                                patches_per_shard=config.sft.patches_per_shard)
    assert placed['pixel_values'].shape == (1, BUDGET, 1536) and 'image_grid_thw' not in placed
    before = _compiles()
    with sharding.use_mesh(mesh):
      out = step(model, optimizer, placed)
      _, metrics = grad_fn(model, placed, np.float32(B), np.float32(B * K))
      losses.append((float(out['loss']), float(metrics['loss'])))
    compiles.append(_compiles() - before)
  assert compiles[0] >= 2 and compiles[1:] == [0, 0, 0], compiles   # SFT step + GRPO gradient, compiled once
  assert all(np.isfinite(losses).ravel())
  # The count can fail: without the budget (P = each batch's fullest shard: 16, then 20 patches) the step recompiles.
  for i in (0, 1):
    placed = placement.shard_batch(_batch(BATCH_GRIDS[i], i), mesh, vision_config=model.config.vision)
    before = _compiles()
    with sharding.use_mesh(mesh):
      step(model, optimizer, placed)
    assert _compiles() - before >= 1


def test_a_batch_over_the_patch_budget_fails_naming_the_budget():
  mesh = sharding.make_mesh()
  vision = config_lib.Qwen3VLConfig.tiny().vision
  batch = _batch(BATCH_GRIDS[2], 0)   # 12 + 24 + 8 = 44 patches in one shard (the trivial mesh)
  with pytest.raises(ValueError, match='needs 44 image patches, over the budget patches_per_shard=40'):
    placement.shard_batch(batch, mesh, vision_config=vision, patches_per_shard=40)
  with pytest.raises(ValueError, match='needs the vision config'):
    placement.shard_batch(batch, mesh)


def test_program_bound_counts_the_k_rungs_of_each_length_bucket():
  """By hand: T 2048 and 4096 with K capped at 1280 on rungs of 256 take K in {256, 512, 1024, 1280} each (8);
  without a cap, T 2048 takes {256, ..., 2048} (4) and T 4096 one more (5); a cap below the first rung is one K."""
  from osvl_jax.train import batching  # pylint: disable=g-import-not-at-top
  assert batching.program_bound((2048, 4096), 1280, 256) == 8
  assert batching.program_bound((2048, 4096), None, 256) == 9
  assert batching.program_bound((100,), None, 256) == 1
  assert [batching.ladder(n, 256) for n in (0, 1, 256, 257, 1025)] == [256, 256, 256, 512, 2048]
