"""Sharded forward and gradient equal the unsharded ones on 8 simulated CPU devices (fsdp=8; fsdp=2 x tensor=4;
MoE with expert=4; scan_layers with fsdp=2 x tensor=4), the MoE block routed per device under a set mesh equals
the whole-batch routing (expert, tensor and fsdp splits; the batch split over 'expert' too), the rules map
parameters to the expected mesh axes, an orbax checkpoint saved on one mesh restores onto another, and an HF folder
loads straight into the shardings.

The multi-device tests need `XLA_FLAGS=--xla_force_host_platform_device_count=8` before jax starts; in a normal
(1-device) pytest run `test_sharded_numerics_on_8_simulated_devices` reruns this file in a subprocess with it.
"""

import contextlib
import dataclasses
import functools
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from osvl_jax.models.qwen3_vl import moe
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


# Matrices a rule deliberately leaves whole along one dim: the MoE router [hidden, E] (E is tiny), the patch
# embedding's and learned position table's input dims (1,536 patch values; grid cells).
HALF_SHARDED = ('mlp.gate.kernel', 'patch_embed.proj.kernel', 'pos_embed.embedding')


@pytest.mark.parametrize('config,scan', [(Qwen3VLConfig.tiny(tie_word_embeddings=False), False),
                                         (Qwen3VLConfig.tiny_moe(), False), (Qwen3VLConfig.tiny(), True)],
                         ids=['dense', 'moe', 'dense_scan_layers'])
def test_every_matrix_parameter_is_sharded_by_a_rule(config, scan):
  """No matrix (ndim >= 2) falls through the rules to replication: a misspelt rule (say `linear_fc2`, the k/v
  projections or a dense `down_proj`) would put a full copy of those weights on every device. Every dim of a
  linear layer's kernel is named, except the few listed in HALF_SHARDED, which still shard their other dim."""
  model = nnx.eval_shape(lambda: Qwen3VLModel(config, nnx.Rngs(0), scan_layers=scan))
  flat = nnx.to_flat_state(nnx.state(model, nnx.Param))
  matrices = {'.'.join(map(str, path)): v.get_value().shape for path, v in flat}
  matrices = {path: shape for path, shape in matrices.items() if len(shape) >= 2}
  assert any('linear_fc2' in p for p in matrices) and any('k_proj' in p for p in matrices)
  for path, shape in matrices.items():
    axes = sharding.logical_axes(path, len(shape))
    if axes[0] == 'layers':  # scan_layers' stacked axis stays whole (MaxText); the per-layer array is what counts
      axes, shape = axes[1:], shape[1:]
      if len(shape) < 2:
        continue
    named = [axis for axis in sharding.logical_to_spec(axes) if axis is not None]
    if path.endswith(HALF_SHARDED):
      assert len(named) == len(shape) - 1, (path, axes, named)
    else:
      assert len(named) == len(shape), (path, axes, named)


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


def _moe_block_loss(block, x):
  """A fixed, position-dependent weighting of the block's output [B, T, hidden] (so every output counts)."""
  y = block(x)
  return (y * jnp.sin(jnp.arange(y.size, dtype=jnp.float32).reshape(y.shape))).sum(), y


def _moe_block_outputs_and_grads(block, x, mesh=None, rules=sharding.LOGICAL_RULES):
  """Output, d/dx and d/dparams of `_moe_block_loss`; with `mesh` the block's parameters are placed by `rules` (as
  inside a decoder layer: path prefix `mlp.`), x split over the batch axes, and the step traced under `use_mesh`."""
  if mesh is not None:
    state = nnx.state(block, nnx.Param)
    placement = jax.tree_util.tree_map_with_path(
        lambda path, v: sharding.path_sharding('mlp.' + jax.tree_util.keystr(path, simple=True, separator='.')
                                               .removesuffix('.value'), v.shape, mesh, rules), state)
    nnx.update(block, jax.device_put(state, placement))
    x = jax.device_put(x, jax.sharding.NamedSharding(  # rows split over the batch axes where they divide
        mesh, sharding.logical_to_spec(('batch', None, None), x.shape, mesh, rules)))
  step = nnx.jit(nnx.value_and_grad(_moe_block_loss, argnums=(0, 1), has_aux=True))
  with sharding.use_mesh(mesh, rules) if mesh is not None else contextlib.nullcontext():
    (_, y), (grads, dx) = step(block, x)
  return [np.asarray(y), np.asarray(dx)] + [np.asarray(g) for g in jax.tree.leaves(grads)]


MOE_MESHES = [({'fsdp': 2, 'expert': 4}, ('data', 'fsdp')), ({'fsdp': 2, 'tensor': 2, 'expert': 2}, ('data', 'fsdp')),
              ({'fsdp': 2, 'tensor': 4}, ('data', 'fsdp')), ({'expert': 8}, ('data', 'fsdp')),
              ({'fsdp': 2, 'expert': 4}, ('data', 'fsdp', 'expert')),
              ({'data': 2, 'expert': 4}, ('data',)), ({'fsdp': 2, 'expert': 4}, ('data',)),   # tokens whole along fsdp
              ({'expert': 8}, ('expert',))]


@multi
@pytest.mark.parametrize('mesh_kw, batch_axes', MOE_MESHES,
                         ids=['x'.join(f'{a}{n}' for a, n in m.items()) + f'-batch_{"_".join(b)}'
                              for m, b in MOE_MESHES])
def test_moe_block_routed_per_device_equals_the_whole_batch_routing(mesh_kw, batch_axes):
  """8 experts, top-3: each device routes its own tokens to its local experts (2, 4 or 1 of them; with tensor, also
  its block of the intermediate dim) and a psum adds the parts; with the batch split over 'expert' too (the 30B-A3B
  rules) the expert group's tokens are gathered first and the sums reduce-scattered back. Output, input gradient
  and parameter gradients equal the one-device routing of the whole batch."""
  text = dataclasses.replace(MOE.text, num_experts=8, num_experts_per_tok=3)
  make = lambda: moe.SparseMoeBlock(text, rngs=nnx.Rngs(0), dtype=jnp.float32, param_dtype=jnp.float32)
  x = jnp.asarray(np.random.default_rng(0).standard_normal((16, 6, text.hidden_size)), jnp.float32)
  want = _moe_block_outputs_and_grads(make(), x)
  rules = sharding.rules_from_config({'sharding_rules': [('batch', batch_axes)]})
  block = make()
  got = _moe_block_outputs_and_grads(block, x, sharding.make_mesh(**mesh_kw), rules)
  assert block.experts.gate_up_proj[...].addressable_shards[0].data.shape[0] == 8 // mesh_kw.get('expert', 1)
  assert len(got) == len(want) == 5          # output, dx, router kernel, gate_up_proj, down_proj
  for g, w in zip(got, want):
    assert np.linalg.norm(g - w) <= 1e-5 * np.linalg.norm(w)


@multi
def test_moe_block_with_a_batch_that_does_not_split_over_the_mesh():
  """One row on fsdp=2 x expert=4: the rows stay whole (replicated over fsdp, as the dense layers leave them) and
  the per-device routing still equals the whole-batch one (it once failed to trace: the weights' fsdp gather
  typed the output as varying over fsdp)."""
  text = dataclasses.replace(MOE.text, num_experts=8, num_experts_per_tok=3)
  make = lambda: moe.SparseMoeBlock(text, rngs=nnx.Rngs(0), dtype=jnp.float32, param_dtype=jnp.float32)
  x = jnp.asarray(np.random.default_rng(1).standard_normal((1, 6, text.hidden_size)), jnp.float32)
  want = _moe_block_outputs_and_grads(make(), x)
  got = _moe_block_outputs_and_grads(make(), x, sharding.make_mesh(fsdp=2, expert=4), sharding.LOGICAL_RULES)
  for g, w in zip(got, want):
    assert np.linalg.norm(g - w) <= 1e-5 * np.linalg.norm(w)


def test_bf16_embedding_lookup_accumulates_its_gradient_in_float32():
  """float32 table, bfloat16 compute: the looked-up rows are the bf16-cast rows, and the table's gradient is the
  float32 sum of the rows' bf16 cotangents (a token repeated 600 times: a bf16 scatter-add would be off by ~1e-3)."""
  embed = nnx.Embed(16, 8, dtype=jnp.bfloat16, param_dtype=jnp.float32, rngs=nnx.Rngs(0))
  ids = jnp.asarray(np.where(np.arange(600) % 7 == 0, 5, 3)[None], jnp.int32)          # [1, 600]
  weight = jnp.asarray(np.random.default_rng(0).uniform(0.5, 1.5, (1, 600, 8)), jnp.bfloat16)
  rows = text_lib.embed_lookup(embed, ids)
  assert rows.dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(rows, np.float32),
                                np.asarray(embed.embedding[...][ids].astype(jnp.bfloat16), np.float32))
  grads = nnx.grad(lambda e: (text_lib.embed_lookup(e, ids) * weight).astype(jnp.float32).sum())(embed)
  grad = grads['embedding'][...]
  assert grad.dtype == jnp.float32
  w = np.asarray(weight, np.float64)[0]
  ids_np = np.asarray(ids)[0]
  np.testing.assert_allclose(np.asarray(grad)[3], w[ids_np == 3].sum(0), rtol=1e-6)
  np.testing.assert_allclose(np.asarray(grad)[5], w[ids_np == 5].sum(0), rtol=1e-6)
  assert not np.asarray(grad)[[0, 1, 2, 4, 6]].any()


@multi
def test_bf16_vocabulary_matrices_are_cast_before_their_gather():
  """fsdp=8, float32 parameters, bfloat16 compute, untied lm_head: the embedding table and the lm_head kernel
  [1024 vocab, 64] are laid out ('vocab', None) -- i.e. gathered over fsdp -- as their bf16 casts; the one float32
  [1024, 64] constraint is the embedding gradient, accumulated in float32. Read from the lowered program: XLA:CPU
  itself runs bf16 collectives in float32 (float normalisation), so the compiled one cannot show it."""
  config = dataclasses.replace(DENSE, tie_word_embeddings=False)
  mesh = sharding.make_mesh(fsdp=8)
  model = sharding.shard_model(Qwen3VLModel(config, nnx.Rngs(0), dtype=jnp.bfloat16), mesh)
  ids, pos, mask, _, _ = _inputs()
  ids = jax.device_put(jnp.asarray(ids, jnp.int32), sharding.data_sharding(mesh, 2))

  def loss(model, ids):
    hidden, _ = model(ids, pos, mask)
    return model.logits(hidden).mean()

  with jax.set_mesh(mesh):
    program = nnx.jit(nnx.grad(loss)).lower(model, ids).as_text()
  constrained = re.findall(r'sharding_constraint .*: tensor<1024x64x(\w+)>', program)
  assert constrained.count('bf16') >= 2 and constrained.count('f32') == 1, constrained


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
  from osvl_jax import checkpoints
  saved = sharding.shard_model(Qwen3VLModel(DENSE, nnx.Rngs(5)), sharding.make_mesh(fsdp=8))
  checkpoints.save(checkpoints.manager(tmp_path, 'ckpt'), 3, saved, None, {'stage': 'test'})
  target = sharding.shard_model(Qwen3VLModel(DENSE, nnx.Rngs(6)), sharding.make_mesh(fsdp=2, tensor=4))
  meta = checkpoints.restore(checkpoints.manager(tmp_path, 'ckpt'), target)
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
  assert '18 passed' in proc.stdout and 'skipped' not in proc.stdout, proc.stdout[-2000:]
