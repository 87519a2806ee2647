"""The RL choices reach the trainer from the config (osvl_jax/train/grpo.py, configs/demo.py).

fatal_mode, estimator, std_ddof -> prepare_batch; eps_low / eps_high / beta / aggregation -> make_grad_fn;
beta > 0 -> a frozen reference policy from the SFT checkpoint; judge.name -> the judge; per-step metrics.
"""

import dataclasses
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from osvl_jax import checkpoints
from osvl_jax import trajectory as tj
from osvl_jax.models.qwen3_vl import config as config_lib
from osvl_jax.models.qwen3_vl import model as model_lib
from osvl_jax.models.qwen3_vl import sharding
from osvl_jax.rl import losses
from osvl_jax.train import grpo, grpo_batch, grpo_update, placement, policy
from tools import base

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / 'configs'))
import demo as demo_config  # noqa: E402

LENGTH_BUCKETS = (64, 128, 256, 512, 1024, 2048, 4096, 8192)  # grpo.length_buckets (batching.bucket_sizes)

SEARCH = tj.render_assistant_text('Look.', tool_call={'name': 'text_search', 'arguments': {'query': 'Agra'}})
BAD = tj.render_assistant_text('Try.', tool_call={'name': 'browse', 'arguments': {'url': 'x'}})
RIGHT = tj.render_assistant_text('Agra.', response='Agra')
WRONG = tj.render_assistant_text('Delhi.', response='Delhi')


def _trajectory(steps, fatal_step=None):
  builder = tj.TrajectoryBuilder(tj.load_tokenizer(), tj.ImageProcessor(min_pixels=32 * 32, max_pixels=32 * 32), [])
  builder.start('Which city?', None)
  for text, result in steps:
    builder.append_assistant_text(text)
    if result is not None:
      builder.append_observation(result)
  return builder.finish(answers=['Agra'], fatal_step=fatal_step)


OK = base.ToolResult(ok=True, text='[1] Agra: a city.')
ERR = base.error('unknown_tool', 'no tool named browse')


@pytest.fixture(scope='module')
def group():
  """G = 4: search then right, wrong without search (r = 0), fatal at step 1 (below the mean), fatal at 0 (r = 0)."""
  return [_trajectory([(SEARCH, OK), (RIGHT, None)]), _trajectory([(WRONG, None)]),
          _trajectory([(SEARCH, OK)] + [(BAD, ERR)] * 3, fatal_step=1), _trajectory([(BAD, ERR)] * 3, fatal_step=0)]


def _cfg(**overrides):
  cfg = demo_config.get_config().grpo
  cfg.update(dict(num_generations=4, length_buckets=LENGTH_BUCKETS, loss_bucket=16, **overrides))
  return cfg


def test_demo_config_names_every_choice():
  c = demo_config.get_config()
  c.model.vocab = 'full'   # the tests' datasets list no vocab_ids.json
  assert (c.grpo.fatal_mode, c.rollout.fatal_index, c.grpo.estimator, c.grpo.aggregation) == (
      'mask_clamp', 'first', 'grpo', 'seq_mean_token_mean')
  assert (c.grpo.eps_low, c.grpo.eps_high, c.grpo.beta, c.grpo.micro_batch_size) == (0.2, 0.28, 0.0, 0)
  assert (c.grpo.mini_batch_prompts, c.grpo.ppo_epochs, c.grpo.tis_cap, c.grpo.max_staleness) == (0, 1, None, 0)
  assert c.judge.name == 'rule' and c.judge.temperature == 0.0
  grpo.check_config(c)


@pytest.mark.parametrize('path, value, match', [
    ('grpo.fatal_mode', 'soft', 'fatal_mode'), ('grpo.estimator', 'ppo', 'estimator'),
    ('grpo.aggregation', 'sum', 'aggregation'), ('rollout.fatal_index', 'last', 'fatal_index'),
    ('judge.name', 'gpt', 'judge'), ('grpo.micro_batch_size', 3, 'does not divide'),
])
def test_check_config_rejects_unknown_choices(path, value, match):
  c = demo_config.get_config()
  c.model.vocab = 'full'   # the tests' datasets list no vocab_ids.json
  section, field = path.split('.')
  c[section][field] = value
  with pytest.raises(ValueError, match=match):
    grpo.check_config(c)


def test_check_config_rejects_micro_batches_that_do_not_shard():
  if len(jax.devices()) < 8:
    pytest.skip('needs 8 (simulated) devices')
  c = demo_config.get_config()
  c.model.vocab = 'full'   # the tests' datasets list no vocab_ids.json
  c.grpo.update(prompts_per_step=2, micro_batch_size=4)  # batch 2 x 4 = 8 rows, micro-batches of 4
  c.mesh.fsdp = 8
  with pytest.raises(ValueError, match='not a multiple of the 8 data x fsdp devices'):
    grpo.check_config(c)


@pytest.mark.parametrize('mode', ['none', 'hard', 'mask', 'mask_clamp'])
@pytest.mark.parametrize('estimator', ['grpo', 'rloo'])
def test_prepare_batch_follows_fatal_mode_and_estimator(group, mode, estimator):
  batch, _, scores, stats = grpo_batch.prepare_batch(group, _cfg(fatal_mode=mode, estimator=estimator))
  r = np.array([s['reward'] for s in scores])
  assert r[1] == r[3] == 0.0 and 0 < r[2] < r[0]  # fatal at 0: empty prefix; fatal at 1: r_acc = 0
  if estimator == 'grpo':
    r_tilde = (r - r.mean()) / (r.std(ddof=1) + 1e-6)
  else:
    r_tilde = r - (r.sum() - r) / 3
  want = r_tilde.copy()
  if mode == 'mask_clamp':  # Eq. 11: Â = max(r̃, 0) for the fatal rows 2 and 3
    want[2:] = np.maximum(want[2:], 0.0)
  np.testing.assert_allclose(batch['advantages'], want, rtol=1e-5, atol=1e-6)
  mask, valid, step = batch['loss_mask'], batch['completion_mask'], batch['loss_step']
  np.testing.assert_array_equal(mask[:2], valid[:2])
  fatal_rows = {'none': valid[2:], 'hard': np.zeros_like(valid[2:]),
                'mask': valid[2:] & (step[2:] < np.array([[1], [0]])),
                'mask_clamp': valid[2:] & (step[2:] < np.array([[1], [0]]))}[mode]
  np.testing.assert_array_equal(mask[2:], fatal_rows.astype(np.float32))
  assert float(stats['num_fatal']) == 2


def test_population_std_reaches_the_advantages(group):
  a1 = grpo_batch.prepare_batch(group, _cfg(fatal_mode='none'))[0]['advantages']
  a0 = grpo_batch.prepare_batch(group, _cfg(fatal_mode='none', std_ddof=0))[0]['advantages']
  np.testing.assert_allclose(a0, a1 * np.sqrt(4 / 3), rtol=1e-4)


def test_rollout_metrics_by_hand(group):
  batch, _, scores, stats = grpo_batch.prepare_batch(group, _cfg())
  m = grpo_batch.rollout_metrics(group, scores, batch['fatal_steps'], stats, batch['loss_mask'])
  assert m['fatal_fraction'] == 0.5
  assert m['fatal_clamped_fraction'] == 1.0 and m['fatal_kept_fraction'] == 0.0  # both fatal r̃ < 0
  assert m['fatal_kept_rtilde_mean'] == 0.0
  assert m['mean_turns'] == (2 + 1 + 4 + 3) / 4
  assert m['tool_calls'] == {'text_search': 2, 'browse': 6}
  assert m['tool_errors'] == {'unknown_tool': 6}
  assert m['unmasked_tokens'] == int(batch['loss_mask'].sum())
  assert m['mean_reward'] == pytest.approx(np.mean([s['reward'] for s in scores]))
  assert {'r_fmt', 'r_acc', 'r_query', 'judge_errors'} <= set(m)


def _small_model(seed=0):
  cfg = config_lib.Qwen3VLConfig.tiny()
  cfg = dataclasses.replace(cfg, text=dataclasses.replace(cfg.text, vocab_size=512))
  return model_lib.Qwen3VLModel(cfg, rngs=nnx.Rngs(seed))


def _params(model):
  return jax.tree.leaves(jax.device_get(nnx.state(model, nnx.Param)))


def test_reference_policy_is_the_frozen_sft_checkpoint_only_when_beta_positive(tmp_path, monkeypatch):
  monkeypatch.setattr(checkpoints, 'build_model', lambda config, seed=0, workdir=None: _small_model(seed + 1))
  sft_model = _small_model(0)
  checkpoints.save(checkpoints.manager(tmp_path, 'sft_ckpt'), 7, sft_model, None, {'stage': 'sft'})
  c = demo_config.get_config()
  c.model.vocab = 'full'   # the tests' datasets list no vocab_ids.json
  mesh = sharding.mesh_from_config(c.mesh)   # the run's mesh (grpo.train builds it once and passes it down)
  assert grpo.init_reference(c, tmp_path, mesh) is None  # beta = 0: no second model
  c.grpo.beta = 0.04
  ref = grpo.init_reference(c, tmp_path, mesh)
  for a, b in zip(_params(ref), _params(sft_model)):
    np.testing.assert_array_equal(a, b)
  with pytest.raises(FileNotFoundError, match='reference policy'):
    grpo.init_reference(c, tmp_path / 'empty', mesh)


def test_grad_fn_uses_clip_range_beta_and_aggregation_from_config():
  """Text-only rows through a 512-token-vocabulary tiny model: the loss equals `losses.grpo_loss` of its log-probs."""
  model = _small_model()
  rng = np.random.default_rng(0)
  b, t, k = 2, 12, 6
  ids = rng.integers(0, 512, (b, t)).astype(np.int32)
  batch = {
      'input_ids': ids, 'attention_mask': np.ones((b, t), bool),
      'position_ids': np.broadcast_to(np.arange(t, dtype=np.int32), (3, b, t)).copy(),
      'pixel_values': None,
      'loss_positions': np.tile(np.arange(5, 5 + k, dtype=np.int32), (b, 1)),
      'loss_targets': ids[:, 6:6 + k], 'loss_mask': np.array([[1] * 6, [1] * 3 + [0] * 3], np.float32),
      'advantages': np.array([1.0, -0.5], np.float32)}
  logprobs = np.asarray(policy.loss_logprobs(model, placement.device_batch(dict(batch, image_grid_thw=None))))
  batch['old_logprobs'] = logprobs + rng.normal(0, 0.4, (b, k)).astype(np.float32)
  batch['ref_logprobs'] = logprobs + rng.normal(0, 0.2, (b, k)).astype(np.float32)
  settings = dict(eps_low=0.1, eps_high=0.5, beta=0.3, aggregation='seq_mean_token_sum')
  cfg = _cfg(**settings)
  _, metrics = grpo_update.make_grad_fn(cfg)(model, placement.device_batch(batch), jnp.float32(4.0), jnp.float32(9.0))
  want, want_metrics = losses.grpo_loss(jnp.asarray(logprobs), batch['old_logprobs'], batch['advantages'],
                                        batch['loss_mask'], ref_logprobs=batch['ref_logprobs'],
                                        num_sequences=4.0, num_tokens=9.0, **settings)
  assert float(metrics['loss']) == pytest.approx(float(want), rel=1e-5)
  assert float(metrics['kl']) == pytest.approx(float(want_metrics['kl']), rel=1e-5) and float(metrics['kl']) > 0
  assert float(metrics['clipped_tokens']) == float(want_metrics['clipped_tokens'])
