"""Each device's vision tower encodes only its own rows' images (issue 11), and the step still equals the one-device
step.

A batch of 8 rows with images in several rows -- different grids, rows without images, one row with two -- is
placed by `placement.shard_batch` on meshes of 8 simulated CPU devices (fsdp=8, data=2 x fsdp=4, fsdp=2 x tensor=4):
the patches are laid out per batch shard with their geometry as arrays ([S, P, 1536], `vision_layout.shard_vision_inputs`).
The GRPO gradient and the SFT loss / gradient / step equal the one-device ones (one shard; its SFT loss and gradient
equal the flat patches' of the HF-parity path) to a relative 1e-5, the vision tower's own gradients included. The compiled vision tower does 1/S of the global work per device (within the
padding to the fullest shard), and no collective of the compiled step carries a patch array of more than one
shard; the old layout (all patches replicated) trips that same check.

Run with XLA_FLAGS=--xla_force_host_platform_device_count=8 (`make test`).
"""

import functools
import re

import jax
import ml_collections
import numpy as np
import pytest
from flax import nnx

from osvl_jax.models.qwen3_vl import config as config_lib
from osvl_jax.models.qwen3_vl import rope
from osvl_jax.models.qwen3_vl import sharding
from osvl_jax.models.qwen3_vl import vision_layout
from osvl_jax.train import grpo_update, placement, policy, sft

pytestmark = pytest.mark.skipif(jax.device_count() < 8,
                                reason='needs XLA_FLAGS=--xla_force_host_platform_device_count=8')

B, T, K = 8, 32, 8
IMAGE = config_lib.Qwen3VLConfig.tiny().image_token_id
# Row r's images (t, h, w): rows 1 and 4 have none, row 2 has two.
ROW_GRIDS = [[(1, 4, 4)], [], [(1, 4, 6), (1, 2, 2)], [(1, 2, 4)], [], [(1, 6, 4)], [(1, 4, 4)], [(1, 2, 6)]]
GRID = tuple(g for row in ROW_GRIDS for g in row)
N = sum(t * h * w for t, h, w in GRID)                        # 104 patches in all
# The losses and gradients on a mesh that splits every axis at once (4 batch shards over data x fsdp, the tower's
# weights over fsdp x tensor); the per-device work on the most split one (8 batch shards) and on one with 2.
MESHES = [{'data': 2, 'fsdp': 2, 'tensor': 2}]
ENCODE_MESHES = [{'fsdp': 8}, {'fsdp': 2, 'tensor': 4}]
IDS = ['x'.join(f'{a}{n}' for a, n in m.items()) for m in MESHES]
ENCODE_IDS = ['x'.join(f'{a}{n}' for a, n in m.items()) for m in ENCODE_MESHES]


def _config() -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict({
      'seed': 0, 'model': {'name': 'tiny', 'hf_path': '', 'text': {'num_hidden_layers': 1}},
      'sft': {'lr': 1e-3, 'steps': 10, 'warmup_steps': 0, 'weight_decay': 0.0, 'grad_clip': 1.0},
      'grpo': {'lr': 1e-3, 'steps': 10, 'eps_low': 0.2, 'eps_high': 0.28, 'beta': 0.0}})


def _batch() -> dict:
  """The collated batch (flat pixel_values [N, 1536]); each image's tokens follow one text token; row 3 right-padded."""
  rng = np.random.default_rng(1)
  ids = rng.integers(0, 1000, (B, T)).astype(np.int32)
  for row, grids in enumerate(ROW_GRIDS):
    start = 2
    for _, h, w in grids:
      ids[row, start:start + h * w // 4] = IMAGE
      start += h * w // 4 + 1
  mask = np.ones((B, T), bool)
  mask[3, -4:] = False
  pos, _ = rope.get_rope_index(ids, np.array(GRID), mask, image_token_id=IMAGE)
  loss_positions = np.sort(rng.choice(np.arange(12, T - 5), (B, K)), axis=1).astype(np.int32)
  completion = np.ones((B, K), bool)
  completion[5, -2:] = False
  return {
      'input_ids': ids, 'attention_mask': mask, 'position_ids': np.asarray(pos),
      'pixel_values': rng.standard_normal((N, 1536)).astype(np.float32),
      'loss_positions': loss_positions, 'loss_targets': np.take_along_axis(ids, loss_positions + 1, axis=1),
      'completion_mask': completion, 'loss_mask': completion.astype(np.float32),
      'advantages': rng.normal(0, 1, B).astype(np.float32),
      'old_logprobs': (-7.0 + rng.normal(0, 0.3, (B, K))).astype(np.float32)}


@nnx.jit(static_argnums=2)
def _sft_grads(model, batch, grid=()):
  """SFT loss and gradient; a static `grid` = the flat path (pixel_values [N, 1536], HF parity)."""
  batch = dict(batch, image_grid_thw=np.array(grid, np.int32)) if grid else batch
  (loss, _), grads = nnx.value_and_grad(sft.loss_fn, has_aux=True)(model, batch)
  return loss, sharding.constrain_state(grads)


def _leaves(tree, visual: bool | None = None) -> list[np.ndarray]:
  """Host copies of the leaves of `tree`; visual True / False: only those of the vision tower / the others."""
  flat = jax.tree_util.tree_leaves_with_path(jax.device_get(tree))
  return [np.asarray(x) for path, x in flat
          if visual is None or ('visual' in jax.tree_util.keystr(path)) == visual]


def _relative(a: list, b: list) -> float:
  diff = np.sqrt(sum(np.sum((x.astype(np.float64) - y) ** 2) for x, y in zip(a, b)))
  return diff / np.sqrt(sum(np.sum(x.astype(np.float64) ** 2) for x in a))


@functools.cache
def _run(mesh_items: tuple) -> dict:
  """GRPO gradient, SFT loss / gradient, then one SFT step on the mesh of `mesh_items` (() = one device)."""
  mesh = sharding.mesh_from_config(dict(mesh_items)) if mesh_items else sharding.make_mesh()
  config = _config()
  model, optimizer = policy.create(config, mesh, 'sft')
  batch = _batch()
  placed = placement.shard_batch(dict(batch, image_grid_thw=np.array(GRID)), mesh, vision_config=model.config.vision)
  out = {'pixel_values': placed['pixel_values']}
  with sharding.use_mesh(mesh):
    grads, metrics = grpo_update.make_grad_fn(config.grpo)(model, placed, np.float32(B),
                                                          np.float32(batch['loss_mask'].sum()))
    out['grpo_loss'], out['grpo_grads'] = float(metrics['loss']), grads
    out['sft_loss'], out['sft_grads'] = _sft_grads(model, placed, ())
    if not mesh_items:   # the flat patches (static grid, HF parity)
      out['flat_sft_loss'], out['flat_sft_grads'] = _sft_grads(model, placement.device_batch(batch), GRID)
    step = sft.make_train_step()(model, optimizer, placed)
  out['step_loss'], out['step_grad_norm'] = float(step['loss']), float(step['grad_norm'])
  out['params'] = _leaves(nnx.state(model, nnx.Param))
  return out


@pytest.mark.parametrize('mesh_kw', MESHES, ids=IDS)
def test_sharded_images_give_the_one_device_losses_and_gradients(mesh_kw):
  ref, got = _run(()), _run(tuple(mesh_kw.items()))
  shards = sharding.batch_shards(sharding.mesh_from_config(mesh_kw))
  assert ref['pixel_values'].shape == (1, vision_layout.patch_slots(N, 4), 1536)   # one device: one shard, padded
  assert ref['sft_loss'] == pytest.approx(ref['flat_sft_loss'], rel=1e-5)   # = the flat (HF-parity) path
  assert _relative(_leaves(ref['flat_sft_grads']), _leaves(ref['sft_grads'])) <= 1e-5
  assert got['pixel_values'].shape[0] == shards and got['pixel_values'].ndim == 3
  assert tuple(got['pixel_values'].sharding.spec) == (('data', 'fsdp'), None, None)
  assert got['grpo_loss'] == pytest.approx(ref['grpo_loss'], rel=1e-5)
  assert got['sft_loss'] == pytest.approx(ref['sft_loss'], rel=1e-5)
  for key in ('grpo_grads', 'sft_grads'):
    assert _relative(_leaves(ref[key]), _leaves(got[key])) <= 1e-5, key
    want = _leaves(ref[key], visual=True)
    assert _relative(want, [np.zeros_like(x) for x in want]) == 1.0    # the images reach the loss
    assert _relative(want, _leaves(got[key], visual=True)) <= 1e-5, key  # the tower's own gradient
  assert got['step_loss'] == pytest.approx(ref['step_loss'], rel=1e-5)
  assert got['step_grad_norm'] == pytest.approx(ref['step_grad_norm'], rel=1e-5)
  assert _relative(ref['params'], got['params']) <= 1e-5


def test_shard_images_lays_out_each_shards_patches_in_order():
  ids = _batch()['input_ids']
  flat = np.arange(N, dtype=np.float32)[:, None] * np.ones((1, 3), np.float32)
  pixels, index = vision_layout.shard_images(ids, flat, 2)
  # Rows 0-3: 16 + (24 + 4) + 8 = 52 patches, rows 4-7: 24 + 16 + 12 = 52.
  assert pixels.shape == (2, 52, 3) and index.shape == (2, 52)
  np.testing.assert_array_equal(index, np.arange(N).reshape(2, 52))
  pixels, index = vision_layout.shard_images(ids, flat, 8)
  counts = [16, 0, 28, 8, 0, 24, 16, 12]
  assert pixels.shape == (8, 28, 3)                                    # padded to the fullest shard (row 2)
  starts = np.cumsum(counts) - counts
  for s, (start, count) in enumerate(zip(starts, counts)):
    np.testing.assert_array_equal(index[s, :count], np.arange(start, start + count))
    assert (index[s, count:] == -1).all() and (pixels[s, count:] == 0).all()
    np.testing.assert_array_equal(pixels[s, :count, 0], np.arange(start, start + count))
  with pytest.raises(ValueError, match='need 80 patches, pixel_values has 104'):
    vision_layout.shard_images(np.where(np.arange(T) == 2, 0, ids), flat, 2)   # the first image token of the 6 rows with images gone
  with pytest.raises(ValueError, match='do not split into 3 shards'):
    vision_layout.shard_images(ids, flat, 3)


_COLLECTIVE = re.compile(r'=\s*(.*?)\s(?:all-gather|all-reduce|all-to-all|collective-permute|reduce-scatter)'
                         r'(?:-start)?\(')


def _patch_collectives(hlo: str, shards: int, width: int) -> list[str]:
  """Collectives of the compiled `hlo` whose result holds the patches of more than one shard: a dim of N or
  S * P, or a leading [S, P] (S > 1)."""
  found = []
  for line in hlo.splitlines():
    match = _COLLECTIVE.search(line)
    if not match:
      continue
    for dims in re.findall(r'[a-z]+\d*\[([\d,]*)\]', match.group(1)):
      shape = [int(d) for d in dims.split(',') if d]
      if N in shape or shards * width in shape or (shards > 1 and shape[:2] == [shards, width]):
        found.append(line.strip()[:160])
  return found


def _flops(compiled) -> float:
  cost = compiled.cost_analysis()
  return (cost[0] if isinstance(cost, list) else cost)['flops']


@pytest.mark.parametrize('mesh_kw', ENCODE_MESHES, ids=ENCODE_IDS)
def test_each_device_encodes_only_its_own_rows_images(mesh_kw):
  mesh = sharding.mesh_from_config(mesh_kw)
  shards = sharding.batch_shards(mesh)
  model, _ = policy.create(_config(), mesh, 'sft')
  batch = _batch()
  # The budget is exactly the fullest shard's patches: widths no other array of the step has (the collective
  # check below recognises the patch arrays by their shape).
  fullest = {8: 28, 2: 52}[shards]
  placed = placement.shard_batch(dict(batch, image_grid_thw=np.array(GRID)), mesh, vision_config=model.config.vision,
                              patches_per_shard=fullest)
  width = placed['pixel_values'].shape[1]
  assert width == fullest
  with pytest.raises(ValueError, match=f'needs {fullest} image patches, over the budget'):
    placement.shard_batch(dict(batch, image_grid_thw=np.array(GRID)), mesh, vision_config=model.config.vision,
                       patches_per_shard=fullest - 4)
  assert placed['pixel_values'].addressable_shards[0].data.shape == (1, width, 1536)

  encode_flat = nnx.jit(lambda m, pixels: m.visual(pixels, GRID)[0])
  encode = nnx.jit(lambda m, pixels, geometry: m.visual(pixels, vision_inputs=geometry)[0])
  alone, _ = policy.create(_config(), sharding.make_mesh(), 'sft')   # on one device: every image
  one_device = _flops(encode_flat.lower(alone, batch['pixel_values']).compile())
  with sharding.use_mesh(mesh):
    per_device = _flops(encode.lower(model, placed['pixel_values'], policy.vision_inputs(placed)).compile())
  assert per_device <= 1.02 * one_device * width / N                   # 1/S of the work, up to the padding

  grad_fn = grpo_update.make_grad_fn(_config().grpo)
  args = (np.float32(B), np.float32(batch['loss_mask'].sum()))
  with sharding.use_mesh(mesh):
    hlo = grad_fn.lower(model, placed, *args).compile().as_text()
    assert _patch_collectives(hlo, shards, width) == []
    # The check can fail: the old layout (every patch on every device, flat) moves patch activations between devices.
    replicated = {k: v for k, v in placed.items() if not k.startswith('vision_')}
    replicated['pixel_values'] = jax.device_put(batch['pixel_values'], jax.sharding.NamedSharding(
        mesh, jax.sharding.PartitionSpec()))
    old = _sft_grads.lower(model, replicated, GRID).compile().as_text()
  assert _patch_collectives(old, shards, width)
