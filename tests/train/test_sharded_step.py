"""The trainers' sharded step equals the one-device step (DESIGN.md §3: the training mains own the mesh).

The tiny Qwen3-VL, dense and MoE, is created directly sharded by `policy.create` on a mesh of 8 simulated CPU
devices (dense: fsdp=8, data=2 x fsdp=4, fsdp=2 x tensor=4; MoE: fsdp=2 x expert=4), the batch placed by
`placement.shard_batch` (rows over ('data', 'fsdp'), the image's patches on its row's shard); the same model is
created on the trivial one-device mesh as the reference. Then one GRPO update (`grpo_update.make_grad_fn` +
`policy.apply_grads`) and 3 SFT steps (`sft.make_train_step`) run in both (MoE: with the router losses): the losses and gradients agree to
a relative difference <= 1e-5,
the parameters after the 4 updates too, and every device holds exactly 1/shards of each sharded parameter
and Adam moment (read from `addressable_shards` against the PartitionSpec) -- after the updates as well.
An orbax checkpoint of the fsdp=8 policy and optimizer restores onto fsdp=2 x tensor=4. The SFT step donates the
parameters and Adam state (updated in place); GRPO's optimizer step donates the Adam state and the gradients
(checked in both runs of the step comparison).
The compiled MoE step routes per device: no buffer of the global batch's expert assignments.

Every mesh here uses all 8 devices: run with XLA_FLAGS=--xla_force_host_platform_device_count=8 (`make test`).
"""

import functools
import re

import jax
import ml_collections
import numpy as np
import pytest
from flax import nnx

from osvl_jax import checkpoints
from osvl_jax.models.qwen3_vl import config as config_lib
from osvl_jax.models.qwen3_vl import moe
from osvl_jax.models.qwen3_vl import rope
from osvl_jax.models.qwen3_vl import sharding
from osvl_jax.train import grpo_update, placement, policy, sft

pytestmark = pytest.mark.skipif(jax.device_count() < 8,
                                reason='needs XLA_FLAGS=--xla_force_host_platform_device_count=8')

B, T, K, STEPS = 8, 32, 8, 3
IMAGE = config_lib.Qwen3VLConfig.tiny().image_token_id
MOE = {'num_experts': 4, 'num_experts_per_tok': 2, 'moe_intermediate_size': 32}  # = Qwen3VLConfig.tiny_moe()


def _config(kind: str) -> ml_collections.ConfigDict:
  text = {'num_hidden_layers': 1, **(MOE if kind == 'moe' else {})}
  # MoE: with the paper's router losses (aux 0.01, z 1e-3), whose sums over the tokens cross the batch shards.
  router = {'router_aux_loss_coef': 0.01, 'router_z_loss_coef': 1e-3} if kind == 'moe' else {}
  return ml_collections.ConfigDict({
      'seed': 0, 'model': {'name': 'tiny', 'hf_path': '', 'text': text},
      'sft': {'lr': 1e-3, 'steps': 10, 'warmup_steps': 0, 'weight_decay': 0.0, 'grad_clip': 1.0, **router},
      'grpo': {'lr': 1e-3, 'steps': 10, 'eps_low': 0.2, 'eps_high': 0.28, 'beta': 0.0, **router}})


def _batch() -> tuple[dict, tuple]:
  """B rows of T tokens, one 4x4-patch image (4 merged tokens) in row 0, row 1 right-padded; K loss positions."""
  rng = np.random.default_rng(0)
  ids = rng.integers(0, 1000, (B, T)).astype(np.int32)
  ids[0, 3:7] = IMAGE
  mask = np.ones((B, T), bool)
  mask[1, -6:] = False
  grid = np.array([[1, 4, 4]])
  pos, _ = rope.get_rope_index(ids, grid, mask, image_token_id=IMAGE)
  loss_positions = np.sort(rng.choice(np.arange(8, T - 7), (B, K)), axis=1).astype(np.int32)
  completion = np.ones((B, K), bool)
  completion[2, -3:] = False
  batch = {
      'input_ids': ids, 'attention_mask': mask, 'position_ids': np.asarray(pos),
      'pixel_values': rng.standard_normal((16, 1536)).astype(np.float32),
      'loss_positions': loss_positions, 'loss_targets': np.take_along_axis(ids, loss_positions + 1, axis=1),
      'completion_mask': completion, 'loss_mask': completion.astype(np.float32),
      'advantages': rng.normal(0, 1, B).astype(np.float32),
      'old_logprobs': (-7.0 + rng.normal(0, 0.3, (B, K))).astype(np.float32)}  # ρ ≠ 1: the clip acts
  return batch, tuple(map(tuple, grid.tolist()))


def _place(batch: dict, grid: tuple, mesh, model) -> dict:
  """The batch on `mesh`, its image laid out per batch shard with its geometry as arrays (no static grid)."""
  return placement.shard_batch(dict(batch, image_grid_thw=np.array(grid)), mesh, vision_config=model.config.vision)


def _leaves(tree) -> list[np.ndarray]:
  return [np.asarray(x) for x in jax.tree.leaves(jax.device_get(tree))]


def _relative(a: list, b: list) -> float:
  diff = np.sqrt(sum(np.sum((x.astype(np.float64) - y) ** 2) for x, y in zip(a, b)))
  return diff / np.sqrt(sum(np.sum(x.astype(np.float64) ** 2) for x in a))


def _train(kind: str, mesh: jax.sharding.Mesh) -> dict:
  """On `mesh`: the GRPO loss and gradient at the initial parameters, its update, then 3 SFT steps' losses and the
  parameters after them."""
  config = _config(kind)
  model, optimizer = policy.create(config, mesh, 'sft')
  batch, grid = _batch()
  placed = _place(batch, grid, mesh, model)
  out = {'params_0': _leaves(nnx.state(model, nnx.Param)), 'sft_losses': []}
  with sharding.use_mesh(mesh):
    grads, metrics = grpo_update.make_grad_fn(config.grpo)(model, placed, np.float32(B),
                                                    np.float32(batch['loss_mask'].sum()))
    out['grpo_loss'], out['grpo_clipped'] = float(metrics['loss']), float(metrics['clipped_tokens'])
    out['router_aux_loss'] = float(metrics.get('router_aux_loss', 0.0))
    out['grpo_grads'] = _leaves(grads)
    policy.apply_grads(model, optimizer, grads)
    step = sft.make_train_step(config.sft)
    for k in range(STEPS):
      params, opt_state = jax.tree.leaves(nnx.state(model, nnx.Param)), jax.tree.leaves(nnx.state(optimizer))
      out['sft_losses'].append(float(step(model, optimizer, placed)['loss']))
      if k == 0:  # the SFT step donates the parameters and the Adam state: one copy per device, updated in place
        live = jax.tree.leaves(nnx.state(model)) + jax.tree.leaves(nnx.state(optimizer))
        out['sft_donated'] = (all(x.is_deleted() for x in params + opt_state), not any(x.is_deleted() for x in live))
    out['params'] = _leaves(nnx.state(model, nnx.Param))
    # GRPO's optimizer step donates the Adam state and the gradients, keeps the parameters (the embedded
    # sampler's snapshot shares them, `JaxSampler.set_model`).
    params, opt_state = jax.tree.leaves(nnx.state(model, nnx.Param)), jax.tree.leaves(nnx.state(optimizer))
    grads = jax.tree.map(lambda x: x * 0 + 0.01, nnx.state(model, nnx.Param))   # placed like the parameters
    grad_leaves = jax.tree.leaves(grads)
    policy.apply_grads(model, optimizer, grads)
    out['apply_donated'] = (all(x.is_deleted() for x in opt_state + grad_leaves),
                            not any(x.is_deleted() for x in params))
  out['model'], out['optimizer'] = model, optimizer
  return out


@functools.cache
def _reference(kind: str) -> dict:
  return _train(kind, sharding.make_mesh())  # the trivial mesh: the first device


def _check_every_device_holds_its_shard(tree, mesh: jax.sharding.Mesh, rules=sharding.LOGICAL_RULES) -> int:
  """Asserts each array of `tree` has the rules' PartitionSpec and each device a 1/shards block; returns how many
  arrays are sharded."""
  expected = sharding.state_shardings(tree, mesh, rules)
  sharded = 0
  for (path, x), want in zip(jax.tree_util.tree_leaves_with_path(tree), jax.tree.leaves(expected)):
    assert x.sharding.is_equivalent_to(want, x.ndim), (jax.tree_util.keystr(path), x.sharding, want.spec)
    block = list(x.shape)
    for dim, axes in enumerate(want.spec):
      for axis in (axes,) if isinstance(axes, str) else axes or ():
        block[dim] //= mesh.shape[axis]
    assert len(x.addressable_shards) == mesh.size
    assert all(tuple(s.data.shape) == tuple(block) for s in x.addressable_shards), jax.tree_util.keystr(path)
    sharded += tuple(block) != tuple(x.shape)
  return sharded


# One dense mesh that splits every dense axis at once (rows over data x fsdp, parameters over fsdp x tensor) and
# the MoE mesh with experts over their own axis.
CASES = [('dense', {'data': 2, 'fsdp': 2, 'tensor': 2}), ('moe', {'fsdp': 2, 'expert': 4})]


@pytest.mark.parametrize('kind, mesh_kw', CASES, ids=[f'{k}-{"x".join(f"{a}{n}" for a, n in m.items())}'
                                                      for k, m in CASES])
def test_sharded_sft_and_grpo_steps_equal_the_one_device_steps(kind, mesh_kw):
  ref = _reference(kind)
  mesh = sharding.mesh_from_config(mesh_kw)
  assert mesh.size == 8
  got = _train(kind, mesh)
  assert _relative(ref['params_0'], got['params_0']) == 0.0   # created sharded: the same initial values
  assert got['grpo_loss'] == pytest.approx(ref['grpo_loss'], rel=1e-5)
  assert got['grpo_clipped'] == ref['grpo_clipped'] > 0
  assert got['router_aux_loss'] == pytest.approx(ref['router_aux_loss'], rel=1e-5)
  assert (ref['router_aux_loss'] > 1.0) == (kind == 'moe')     # uniform routing: k = 2
  assert _relative(ref['grpo_grads'], got['grpo_grads']) <= 1e-5
  np.testing.assert_allclose(got['sft_losses'], ref['sft_losses'], rtol=1e-5)
  assert ref['sft_losses'][-1] < ref['sft_losses'][0]         # the steps learn
  assert _relative(ref['params'], got['params']) <= 1e-5     # after 1 GRPO + 3 SFT updates
  assert got['apply_donated'] == got['sft_donated'] == ref['apply_donated'] == ref['sft_donated'] == (True, True)
  assert int(got['optimizer'].step[...]) == 2 + STEPS
  # Placement after the updates: parameters and Adam moments still in the rules' shardings, 1/shards per device.
  params = nnx.state(got['model'], nnx.Param)
  n_params = len(jax.tree.leaves(params))
  assert _check_every_device_holds_its_shard(params, mesh) >= n_params // 3
  opt_state = nnx.state(got['optimizer'])
  assert _check_every_device_holds_its_shard(opt_state, mesh) >= 2 * (n_params // 3)   # mu and nu
  if 'expert' in mesh_kw:
    experts = got['model'].language_model.layers[0].mlp.experts.gate_up_proj[...]
    assert tuple(experts.sharding.spec)[:2] == ('expert', 'fsdp')     # [E, hidden, 2I]: one expert per device
    assert experts.addressable_shards[0].data.shape == (1, 32, 64)


def test_compiled_moe_step_routes_only_each_devices_tokens(monkeypatch):
  """fsdp=2 x expert=4: each device sorts and runs only its batch shard's B/2*T*k = 256 expert assignments through
  its one local expert; no buffer of the global batch's B*T*k = 512 assignments (the sort keys s32[512], the
  gathered tokens f32[512, hidden], the ragged matmul's f32[1, 512, 2I]) is left in the compiled SFT step. The
  same step with the whole-batch routing (the path without a mesh) does hold them: the check can fail."""
  mesh = sharding.mesh_from_config({'fsdp': 2, 'expert': 4})
  model, optimizer = policy.create(_config('moe'), mesh, 'sft')
  batch, grid = _batch()
  placed = _place(batch, grid, mesh, model)
  k, two_i = MOE['num_experts_per_tok'], 2 * MOE['moe_intermediate_size']
  hidden = config_lib.Qwen3VLConfig.tiny().text.hidden_size

  def shapes() -> set[str]:
    with sharding.use_mesh(mesh):
      hlo = sft.make_train_step(_config('moe').sft).lower(model, optimizer, placed).compile().as_text()
    return set(re.findall(r'[a-z]+\d*\[[\d,]*\]', hlo))

  def routed(rows: int) -> set[str]:
    return {f's32[{rows}]', f'f32[{rows},{hidden}]', f'f32[1,{rows},{two_i}]'}

  per_device, whole = B // 2 * T * k, B * T * k
  got = shapes()
  assert routed(per_device) <= got and not routed(whole) & got
  monkeypatch.setattr(moe.Experts, '_per_device', lambda self, mesh, *args: self._whole_batch(*args))
  assert routed(whole) <= shapes()


def test_checkpoint_of_a_sharded_policy_restores_onto_another_mesh(tmp_path):
  """Policy + optimizer saved from fsdp=8, restored into `policy.create` on fsdp=2 x tensor=4: same values, the new
  placement (orbax reads each array into the target's sharding)."""
  config = _config('dense')
  saved_mesh, target_mesh = sharding.mesh_from_config({'fsdp': 8}), sharding.mesh_from_config({'fsdp': 2,
                                                                                               'tensor': 4})
  model, optimizer = policy.create(config, saved_mesh, 'sft')
  grads = jax.tree.map(lambda x: 0.01 * np.sign(np.asarray(x) + 0.5), nnx.state(model, nnx.Param))
  policy.apply_grads(model, optimizer, grads)   # non-zero Adam moments and a step count of 1
  checkpoints.save(checkpoints.manager(tmp_path, 'ckpt'), 1, model, optimizer, {'stage': 'test'})
  config.seed = 1
  target, target_opt = policy.create(config, target_mesh, 'sft')
  assert _relative(_leaves(nnx.state(model)), _leaves(nnx.state(target))) > 0.1
  meta = checkpoints.restore(checkpoints.manager(tmp_path, 'ckpt'), target, target_opt)
  assert meta['step'] == 1 and int(target_opt.step[...]) == 1
  for want, got in ((nnx.state(model), nnx.state(target)), (nnx.state(optimizer), nnx.state(target_opt))):
    for a, b in zip(_leaves(want), _leaves(got)):
      np.testing.assert_array_equal(a, b)
  q = target.language_model.layers[0].self_attn.q_proj.kernel[...]
  assert q.sharding.spec == jax.sharding.PartitionSpec('fsdp', 'tensor') and q.sharding.mesh.shape['tensor'] == 4
  _check_every_device_holds_its_shard(nnx.state(target, nnx.Param), target_mesh)
  _check_every_device_holds_its_shard(nnx.state(target_opt), target_mesh)
