"""Sharded forward and gradient equal the unsharded ones on 8 simulated CPU devices (fsdp=8; fsdp=2 x tensor=4;
MoE with expert=4; scan_layers with fsdp=2 x tensor=4), the rules map parameters to the expected mesh axes, an
orbax checkpoint saved on one mesh restores onto another, and an HF folder loads straight into the shardings.

The multi-device tests need `XLA_FLAGS=--xla_force_host_platform_device_count=8` before jax starts; in a normal
(1-device) pytest run `test_sharded_numerics_on_8_simulated_devices` reruns this file in a subprocess with it.
"""

import contextlib
import dataclasses
import functools
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from osvl_jax.models.qwen3_vl import rope
from osvl_jax.models.qwen3_vl import sharding
from osvl_jax.models.qwen3_vl import text as text_lib
from osvl_jax.models.qwen3_vl.config import Qwen3VLConfig
from osvl_jax.models.qwen3_vl.model import Qwen3VLModel

multi = pytest.mark.skipif(jax.device_count() < 8, reason='needs 8 (simulated) devices')
IMAGE = 1000


def _small_vocab(config):
  """The tiny config with a 1,024-token vocabulary (image token 1000), so each compile stays small."""
  return dataclasses.replace(config, text=dataclasses.replace(config.text, vocab_size=1024), image_token_id=IMAGE)


DENSE, MOE = _small_vocab(Qwen3VLConfig.tiny()), _small_vocab(Qwen3VLConfig.tiny_moe())


def test_rules_map_parameters_to_mesh_axes():
  config = Qwen3VLConfig.tiny_moe(tie_word_embeddings=False)
  model = nnx.eval_shape(lambda: Qwen3VLModel(config, nnx.Rngs(0)))
  specs = sharding.param_specs(model)          # no mesh: no divisibility check
  layer = specs['language_model']['layers'][0]
  assert layer['self_attn']['q_proj']['kernel'] == P('fsdp', 'tensor')
  assert layer['self_attn']['o_proj']['kernel'] == P('tensor', 'fsdp')
  assert layer['mlp']['experts']['gate_up_proj'] == P('expert', 'fsdp', 'tensor')
  assert layer['mlp']['gate']['kernel'] == P('fsdp', None)
  assert layer['input_layernorm']['weight'] == P(None)
  assert specs['language_model']['embed_tokens']['embedding'] == P('tensor', 'fsdp')
  assert specs['lm_head']['kernel'] == P('fsdp', 'tensor')
  assert specs['visual']['blocks'][0]['attn']['qkv']['kernel'] == P('fsdp', 'tensor')
  # A dim not divisible by its mesh axes is replicated.
  assert sharding.logical_to_spec(('embed', 'kv_heads'), (64, 6), sharding.make_mesh()) == P('fsdp', 'tensor')


def test_stacked_layer_rules_hold_under_a_prefix_and_constrain_checks_its_axes():
  assert sharding.logical_axes('policy.language_model.layers.self_attn.q_proj.kernel', 3) == ('layers', 'embed',
                                                                                               'heads')
  assert sharding.logical_axes('language_model.layers.0.self_attn.q_proj.kernel', 2) == ('embed', 'heads')
  x = jnp.ones((2, 3, 4))
  with pytest.raises(ValueError, match='2 logical axes'):
    sharding.constrain(x, ('batch', 'length'))
  with jax.set_mesh(sharding.make_mesh()):
    assert sharding.constrain(x, text_lib.RESIDUAL_AXES) is x          # eager call: a no-op, not an error


def _inputs(batch=8, length=24):
  """ids [B, T] with one 4x4-patch image in row 0, positions, mask (row 1 left-padded), pixels, grid."""
  rng = np.random.default_rng(0)
  ids = rng.integers(0, 1000, size=(batch, length))
  ids[0, 2:6] = IMAGE                                             # grid (1, 4, 4) -> 4 merged tokens
  mask = np.ones((batch, length), bool)
  mask[1, :5] = False
  grid = np.array([[1, 4, 4]])
  pixels = rng.standard_normal((16, 1536)).astype(np.float32)
  pos, _ = rope.get_rope_index(ids, grid, mask, image_token_id=IMAGE)
  return ids, pos, mask, pixels, grid


def _loss_and_logits(model, ids, pos, mask, pixels, grid):
  hidden, _ = model(ids, pos, mask, pixels, grid)
  logits = model.logits(hidden)
  logp = jax.nn.log_softmax(logits[:, :-1])
  nll = -jnp.take_along_axis(logp, ids[:, 1:, None], axis=-1)[..., 0]
  return (nll * mask[:, 1:]).sum() / mask[:, 1:].sum(), logits


def _run(model, inputs, mesh=None, set_mesh=False):
  """Loss, logits and gradients; with `mesh` the model and inputs are placed on it, and with `set_mesh` the step is
  traced under `jax.set_mesh(mesh)` (activation constraints on)."""
  ids, pos, mask, pixels, grid = inputs
  ids, pos, mask = jnp.asarray(ids, jnp.int32), jnp.asarray(pos), jnp.asarray(mask)
  if mesh is not None:
    sharding.shard_model(model, mesh)
    ids = jax.device_put(ids, sharding.data_sharding(mesh, 2))
    mask = jax.device_put(mask, sharding.data_sharding(mesh, 2))
    pos = jax.device_put(pos, sharding.data_sharding(mesh, 3, batch_dim=1))
  step = nnx.jit(nnx.value_and_grad(_loss_and_logits, has_aux=True), static_argnums=5)
  with jax.set_mesh(mesh) if set_mesh else contextlib.nullcontext():
    (loss, logits), grads = step(model, ids, pos, mask, jnp.asarray(pixels), tuple(map(tuple, grid.tolist())))
  return float(loss), np.asarray(logits), jax.tree.map(np.asarray, nnx.to_pure_dict(grads))


@functools.cache
def _reference(config):
  return _run(Qwen3VLModel(config, nnx.Rngs(0)), _inputs())


def _unstack_layers(grads, num_layers):
  """Pure-dict gradients of a scan_layers model with the stacked layer subtree split into {n: subtree}."""
  stacked = grads['language_model']['layers']
  layers = {n: jax.tree.map(lambda x, n=n: x[n], stacked) for n in range(num_layers)}
  return {**grads, 'language_model': {**grads['language_model'], 'layers': layers}}


def _check_sharded_equals_unsharded(config, mesh_kw, expect_sharded, scan_layers=False, set_mesh=False):
  inputs = _inputs()
  ref_loss, ref_logits, ref_grads = _reference(config)
  model = Qwen3VLModel(config, nnx.Rngs(0), scan_layers=scan_layers)
  loss, logits, grads = _run(model, inputs, sharding.make_mesh(**mesh_kw), set_mesh)
  if scan_layers:
    grads = _unstack_layers(grads, config.text.num_hidden_layers)
  for path, spec in expect_sharded.items():
    leaf = nnx.state(model, nnx.Param)
    for key in path:
      leaf = leaf[key]
    got = tuple(leaf[...].sharding.spec)
    assert got + (None,) * (len(spec) - len(got)) == tuple(spec), (path, got)
  assert abs(loss - ref_loss) <= 1e-5
  assert np.abs(logits - ref_logits).max() <= 2e-5
  flat, ref_flat = jax.tree.leaves(grads), jax.tree.leaves(ref_grads)
  for g, r in zip(flat, ref_flat):
    np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-6)


@multi
def test_fsdp8_forward_and_gradient_equal_unsharded():
  _check_sharded_equals_unsharded(
      DENSE, {'fsdp': 8},
      {('language_model', 'layers', 0, 'mlp', 'up_proj', 'kernel'): P('fsdp', None)})


@multi
def test_fsdp2_tensor4_forward_and_gradient_equal_unsharded():
  _check_sharded_equals_unsharded(
      DENSE, {'fsdp': 2, 'tensor': 4},
      {('language_model', 'layers', 0, 'self_attn', 'q_proj', 'kernel'): P('fsdp', 'tensor'),
       ('language_model', 'embed_tokens', 'embedding'): P('tensor', 'fsdp')})


@multi
def test_moe_expert4_forward_and_gradient_equal_unsharded():
  _check_sharded_equals_unsharded(
      MOE, {'fsdp': 2, 'expert': 4},
      {('language_model', 'layers', 1, 'mlp', 'experts', 'down_proj'): P('expert', None, 'fsdp')})


@multi
def test_scan_layers_fsdp2_tensor4_forward_and_gradient_equal_unsharded():
  _check_sharded_equals_unsharded(
      DENSE, {'fsdp': 2, 'tensor': 4},
      {('language_model', 'layers', 'self_attn', 'q_proj', 'kernel'): P(None, 'fsdp', 'tensor')},
      scan_layers=True)


@multi
def test_fsdp2_tensor4_with_activation_constraints_equal_unsharded():
  _check_sharded_equals_unsharded(
      DENSE, {'fsdp': 2, 'tensor': 4},
      {('language_model', 'layers', 0, 'self_attn', 'q_proj', 'kernel'): P('fsdp', 'tensor')}, set_mesh=True)


@multi
def test_constrain_pins_the_residual_stream_to_the_batch_axes_under_a_set_mesh():
  x = jnp.ones((8, 4, 16))
  pin = jax.jit(lambda x: text_lib.sharding.constrain(x, text_lib.RESIDUAL_AXES) * 2)
  assert pin(x).sharding.is_fully_replicated                              # no mesh set: a no-op
  for mesh_kw, spec in (({'fsdp': 2, 'tensor': 4}, P(('data', 'fsdp'), None, None)),
                        ({'data': 8}, P(('data', 'fsdp'), None, None))):
    mesh = sharding.make_mesh(**mesh_kw)
    with jax.set_mesh(mesh):
      out = jax.jit(lambda x: text_lib.sharding.constrain(x, text_lib.RESIDUAL_AXES) * 2)(x)
    assert out.sharding.is_equivalent_to(jax.sharding.NamedSharding(mesh, spec), 3)
    assert out.sharding.shard_shape(x.shape) == (8 // mesh_kw.get('fsdp', 8), 4, 16)     # rows split, rest whole
  only_data = jax.sharding.Mesh(np.asarray(jax.devices()[:8]), ('data',))  # the trainers' data-parallel mesh
  assert sharding.logical_to_spec(text_lib.RESIDUAL_AXES, x.shape, only_data) == P('data', None, None)


@multi
def test_orbax_checkpoint_saved_on_one_mesh_restores_onto_another(tmp_path):
  """Saved from fsdp=8, restored into a model placed on fsdp=2 x tensor=4: same values, the new layout."""
  from osvl_jax.train import checkpoint
  saved = sharding.shard_model(Qwen3VLModel(DENSE, nnx.Rngs(5)), sharding.make_mesh(fsdp=8))
  checkpoint.save(checkpoint.manager(tmp_path, 'ckpt'), 3, saved, None, {'stage': 'test'})
  target = sharding.shard_model(Qwen3VLModel(DENSE, nnx.Rngs(6)), sharding.make_mesh(fsdp=2, tensor=4))
  meta = checkpoint.restore(checkpoint.manager(tmp_path, 'ckpt'), target)
  assert meta['stage'] == 'test' and meta['step'] == 3 and meta['scan_layers'] is False
  q = target.language_model.layers[0].self_attn.q_proj.kernel[...]
  assert tuple(q.sharding.spec) == ('fsdp', 'tensor') and q.sharding.mesh.shape['tensor'] == 4
  for got, want in zip(jax.tree.leaves(nnx.state(target, nnx.Param)), jax.tree.leaves(nnx.state(saved, nnx.Param))):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@multi
@pytest.mark.parametrize('scan_layers', [False, True])
def test_hf_folder_loads_each_tensor_into_its_sharding(tmp_path, scan_layers):
  """`weights.load_hf_folder(mesh=...)` (the trainers' `policy.create_model` for `model.hf_path`): every parameter
  arrives in the rules' sharding on fsdp=2 x tensor=4 (each device a 1/shards block), with the saved values."""
  from osvl_jax.models.qwen3_vl import weights
  source = Qwen3VLModel(MOE, nnx.Rngs(3))
  weights.save_hf_folder(source, tmp_path)
  mesh = sharding.make_mesh(fsdp=2, tensor=4)
  model, _ = weights.load_hf_folder(tmp_path, mesh=mesh, scan_layers=scan_layers)
  state = nnx.state(model, nnx.Param)
  want = sharding.state_shardings(state, mesh)
  for x, target in zip(jax.tree.leaves(state), jax.tree.leaves(want)):
    assert x.sharding.is_equivalent_to(target, x.ndim)
    assert x.addressable_shards[0].data.shape == target.shard_shape(x.shape)
  q = (model.language_model.layers.self_attn.q_proj.kernel[...] if scan_layers else
       model.language_model.layers[0].self_attn.q_proj.kernel[...])
  assert tuple(q.sharding.spec)[-2:] == ('fsdp', 'tensor') and q.addressable_shards[0].data.shape[-2:] == (32, 16)
  plain, _ = weights.load_hf_folder(tmp_path)
  for a, b in zip(jax.tree.leaves(weights.to_hf_state_dict(plain)), jax.tree.leaves(weights.to_hf_state_dict(model))):
    np.testing.assert_array_equal(a, b)


@pytest.mark.skipif(jax.device_count() >= 8, reason='already running with 8 devices')
def test_sharded_numerics_on_8_simulated_devices():
  env = {**os.environ, 'XLA_FLAGS': '--xla_force_host_platform_device_count=8', 'JAX_PLATFORMS': 'cpu'}
  proc = subprocess.run([sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', __file__,
                         '-k', 'not on_8_simulated_devices'],
                        env=env, capture_output=True, text=True, timeout=600, check=False)
  assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
  assert '11 passed' in proc.stdout and 'skipped' not in proc.stdout, proc.stdout[-2000:]
