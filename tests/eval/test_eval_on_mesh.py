"""`python -m osvl_jax.evaluate` on a rollout mesh (issue 49, `rollout.mesh`): the evaluator's embedded sampler
runs on the layout, a checkpoint is read straight into the layout's shardings, and the greedy trajectories and
judged answers equal the unsharded evaluation's on the tiny model. Needs 8 (simulated) devices
(XLA_FLAGS=--xla_force_host_platform_device_count=8)."""

import json

import jax
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from osvl_jax import checkpoints
from osvl_jax.eval import policy, runner
from osvl_jax.models.qwen3_vl import sharding
from osvl_jax.rollout import factory
from osvl_jax.rollout.embedded import layout

from tests.eval.conftest import small_config

pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason='needs 8 (simulated) devices')


def _config(**kw):
  config = small_config(benchmarks=('fvqa',), max_items_per_benchmark=2, max_tool_calls=1,
                        system_prompt='agent_system_v3', **kw)
  config.rollout.max_new_tokens = 6
  config.rollout.max_total_tokens = 2048   # the system prompt and tool schemas are ~900 tokens
  config.model.text.num_hidden_layers = 1
  return config


def _trajectories(workdir) -> dict:
  lines = (workdir / 'trajectories.jsonl').read_text().splitlines()
  return {(r['run'], r['benchmark'], r['item_key']): r['trajectory'] for r in map(json.loads, lines)}


def _answers(workdir) -> dict:
  lines = (workdir / 'results.jsonl').read_text().splitlines()
  return {(r['run'], r['benchmark'], r['item_key']): (r.get('response'), r.get('correct'), r['error'])
          for r in map(json.loads, lines)}


def test_a_checkpoint_evaluated_on_a_rollout_mesh_equals_the_unsharded_evaluation(tmp_path, env):
  plain = runner.Evaluator(_config(), tmp_path / 'plain', env=env)   # rollout.mesh.tensor 0: one device
  plain.evaluate()
  assert plain.engine.layout is None
  # The same weights as a checkpoint, evaluated with tensor 2 x 4 replicas.
  checkpoints.save(checkpoints.manager(tmp_path, 'sft_ckpt'), 1, checkpoints.build_model(_config()), None, {})
  config = _config(checkpoint=str(tmp_path / 'sft_ckpt'))
  config.rollout.mesh.tensor = 2
  sharded = runner.Evaluator(config, tmp_path / 'mesh', env=env)
  sharded.evaluate()
  assert (sharded.engine.layout.tensor, sharded.engine.layout.replicas) == (2, 4)

  want, got = _trajectories(tmp_path / 'plain'), _trajectories(tmp_path / 'mesh')
  assert sorted(got) == sorted(want) and len(want) == 2
  assert any(t['images'] for t in want.values())   # the items' images went through the sampler
  for key, w in want.items():
    g = got[key]
    assert sum(w['gen_mask']) > 0   # the policy's greedy ids are in the comparison
    assert g['token_ids'] == w['token_ids'] and g['gen_mask'] == w['gen_mask']
    assert (g['final_response'], g['stop_reason']) == (w['final_response'], w['stop_reason'])
  assert _answers(tmp_path / 'mesh') == _answers(tmp_path / 'plain')


def test_the_checkpoint_is_read_into_the_rollout_layouts_shardings(tmp_path):
  model = checkpoints.build_model(_config())
  checkpoints.save(checkpoints.manager(tmp_path, 'sft_ckpt'), 1, model, None, {})
  config = _config(checkpoint=str(tmp_path / 'sft_ckpt'))
  config.rollout.mesh.tensor = 2
  mesh = factory.rollout_mesh(config.rollout, policy.shape(config))
  loaded, _ = policy.build(config, mesh=mesh)
  table = loaded.language_model.embed_tokens.embedding[...]
  assert table.sharding == NamedSharding(mesh, P('tensor', None))   # vocab over tensor, as the decode rules say
  kernel = loaded.language_model.layers[0].self_attn.k_proj.kernel[...]
  assert kernel.sharding == NamedSharding(mesh, P(None, 'tensor'))
  np.testing.assert_array_equal(np.asarray(table), np.asarray(model.language_model.embed_tokens.embedding[...]))
  # Every weight is where the sampler's layout puts it (`Layout.place_state` then moves nothing).
  state = nnx.state(loaded)
  want = sharding.state_shardings(state, mesh, layout.DECODE_RULES)
  leaves = jax.tree.leaves(state)
  assert len(leaves) > 20 and all(x.sharding == s for x, s in zip(leaves, jax.tree.leaves(want)))
