"""rollout.env_errors='exclude' in the GRPO update (`grpo_batch.environment_cut`, `prepare_batch(exclude=...)`,
`grpo_update`'s loss_rows): a trajectory whose fatal cascade holds an environment error leaves its group's
advantages and the loss, so the step equals the one taken on the batch without it; 'count' keeps it as today; the
rollout metrics split the errors into the policy's and the environment's. Two prompts x G = 4 real trajectories
through the tiny Qwen3-VL."""

import pathlib
import sys

import jax
import ml_collections
import numpy as np
import optax
import pytest
from absl import flags
from flax import nnx
from ml_collections import config_flags

from osvl_jax import trajectory as tj
from osvl_jax.models.qwen3_vl import config as config_lib
from osvl_jax.models.qwen3_vl import model as model_lib
from osvl_jax.rl import fatal as fatal_lib
from osvl_jax.train import grpo, grpo_batch, grpo_update
from tools import base

SEARCH = tj.render_assistant_text('Look it up.', tool_call={'name': 'text_search', 'arguments': {'query': 'Agra'}})
RIGHT = tj.render_assistant_text('It is Agra.', response='Agra')
WRONG = tj.render_assistant_text('It is Delhi, in the north.', response='Delhi')
RESULTS = {'.': base.ToolResult(ok=True, text='[1] Agra: a city in India.'),
           'e': base.error('backend_error', 'text_search failed: the backend reported an internal error.'),
           't': base.error('timeout', 'text_search timed out after 10 s.'),
           'p': base.error('unknown_tool', "Unknown tool 'browse'.")}
LENGTH = 288
# per trajectory: its tool results in order, then R (right answer), W (wrong) or nothing (fatal, stopped)
GROUPS = (('eet', 'R', 'W', '.R'),          # p0: row 0 cut by the environment (backend, backend, timeout)
          ('R', '.ppe', 'W', 'ppp'))        # p1: row 5 cut (its cascade ends on a backend error), row 7 the policy's
CUT = [True, False, False, False, False, True, False, False]


def _trajectory(g: int, i: int, plan: str) -> tj.Trajectory:
  builder = tj.TrajectoryBuilder(tj.load_tokenizer(), tj.ImageProcessor(min_pixels=32 * 32, max_pixels=32 * 32), [])
  builder.start(f'Which city is shown, case {g}?', np.full((32, 32, 3), 40 * g + 10 * i, np.uint8))
  for c in plan:
    if c in RESULTS:
      builder.append_assistant_text(SEARCH)
      builder.append_observation(RESULTS[c])
    else:
      builder.append_assistant_text(RIGHT if c == 'R' else WRONG)
  f = fatal_lib.fatal_step([s.is_execution_error for s in builder.steps], 3)
  return builder.finish(prompt_id=f'p{g}', sample_index=i, answers=['Agra'], fatal_step=f)


def _cfg(**kw) -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(dict(
      alpha=0.8, num_generations=4, fatal_mode='mask_clamp', delta=1e-6, eps_low=0.2, eps_high=0.28, beta=0.0,
      estimator='rloo', aggregation='seq_mean_token_sum', length_buckets=(LENGTH,), loss_bucket=LENGTH,
      max_loss_tokens=LENGTH, mini_batch_prompts=0, ppo_epochs=1, micro_batch_size=0, tis_cap=None, **kw))


@pytest.fixture(scope='module')
def trajectories():
  return [_trajectory(g, i, plan) for g, group in enumerate(GROUPS) for i, plan in enumerate(group)]


def test_environment_cut_is_the_trajectories_whose_cascade_holds_an_environment_error(trajectories):
  rollout = ml_collections.ConfigDict({'fatal_k': 3, 'env_errors': 'exclude'})
  np.testing.assert_array_equal(grpo_batch.environment_cut(trajectories, rollout), CUT)
  assert [t.fatal_step for t in trajectories] == [0, None, None, None, None, 1, None, 0]
  assert grpo_batch.env_errors(rollout) == 'exclude' and grpo_batch.env_errors(ml_collections.ConfigDict()) == 'count'


def test_exclude_gives_the_advantages_and_the_update_of_the_batch_without_the_cut_trajectories(trajectories):
  cut = np.array(CUT)
  kept = [t for t, c in zip(trajectories, CUT) if not c]
  batch, grid, scores, stats = grpo_batch.prepare_batch(trajectories, _cfg(), exclude=cut)
  alone, alone_grid, _, alone_stats = grpo_batch.prepare_batch(kept, _cfg())
  counted, _, _, _ = grpo_batch.prepare_batch(trajectories, _cfg())                        # 'count': today's
  np.testing.assert_array_equal(batch['advantages'][~cut], alone['advantages'])
  assert not batch['advantages'][cut].any() and not batch['loss_mask'][cut].any()
  assert batch['loss_mask'][~cut].sum() == alone['loss_mask'].sum() > 0
  np.testing.assert_array_equal(batch['loss_rows'], ~cut)
  assert 'loss_rows' not in counted and counted['loss_mask'][cut].sum() > 0                # row 5's prefix counts
  assert not np.array_equal(counted['advantages'][~cut], alone['advantages'])              # the baselines moved
  assert float(stats['num_excluded']) == 2.0 and float(stats['num_fatal']) == float(alone_stats['num_fatal']) == 1.0
  metrics = grpo_batch.rollout_metrics(trajectories, scores, batch['fatal_steps'], stats, batch['loss_mask'], cut)
  assert (metrics['policy_errors'], metrics['env_errors'], metrics['env_retries']) == (5, 4, 0)
  assert metrics['tool_errors'] == {'backend_error': 3, 'timeout': 1, 'unknown_tool': 5}
  assert (metrics['env_cut_trajectories'], metrics['num_excluded']) == (2, 2.0)

  model = model_lib.Qwen3VLModel(config_lib.Qwen3VLConfig.tiny(), rngs=nnx.Rngs(0))
  update = grpo_update.make_update_fn(_cfg())
  outs, params = [], []
  for b, g, rows in ((batch, grid, trajectories), (alone, alone_grid, kept)):
    m = nnx.clone(model)
    opt = nnx.Optimizer(m, optax.sgd(1.0), wrt=nnx.Param)   # SGD: equal gradients give equal parameters
    b = {k: v for k, v in b.items() if k not in ('rewards', 'fatal_steps')}
    outs.append(update(m, opt, b, g, [t.prompt_id for t in rows])[0])
    params.append(jax.tree.leaves(jax.device_get(nnx.state(m, nnx.Param))))
  assert outs[0]['loss'] == pytest.approx(outs[1]['loss'], rel=1e-5) and abs(outs[1]['loss']) > 1e-4
  assert outs[0]['num_tokens'] == outs[1]['num_tokens']
  before = jax.tree.leaves(jax.device_get(nnx.state(model, nnx.Param)))
  moved = max(float(np.abs(a - b).max()) for a, b in zip(params[1], before))
  assert moved > 0
  for a, b in zip(params[0], params[1]):
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * moved)


@pytest.mark.parametrize('mode', ['count', 'retry', 'exclude'])
def test_the_lookup_world_and_the_paper_files_take_each_mode_on_the_command_line(monkeypatch, mode):
  """`--config.rollout.env_errors=<mode>` parses (config_flags, locked as the trainers' mains lock it) for the
  lookup world's config (bench/learning_world.py's; it injects backend_error) and the paper files, and passes
  `grpo.check_config`; a bad value or retry without retries is refused naming the field."""
  configs = pathlib.Path(__file__).resolve().parents[2] / 'configs'

  def parse(name, *overrides):
    fv = flags.FlagValues()
    config_flags.DEFINE_config_file('config', str(configs / name), flag_values=fv, lock_config=True)
    argv = ['prog', f'--config={configs / name}', *overrides]
    monkeypatch.setattr(sys, 'argv', argv)
    fv(argv)
    return fv.config

  config = parse('lookup.py', f'--config.rollout.env_errors={mode}', '--config.rollout.env_retries=2',
                 '--config.rollout.env_retry_backoff_s=0.1')
  assert (config.rollout.env_errors, config.rollout.env_retries, config.rollout.env_retry_backoff_s) == (
      mode, 2, 0.1)
  assert config.tools.failure_injection.kind == 'backend_error'   # what the lookup world injects: an env error
  grpo.check_config(config)
  paper = parse('qwen3vl_paper.py:grpo_8b', f'--config.rollout.env_errors={mode}')
  assert paper.rollout.env_errors == mode and parse('qwen3vl_paper.py:grpo_8b').rollout.env_errors == 'count'
  config.rollout.env_errors, config.rollout.env_retries = 'retry', 0
  with pytest.raises(ValueError, match=r'rollout.env_retries=0: must be >= 1'):
    grpo.check_config(config)
  config.rollout.env_errors = 'skip'
  with pytest.raises(ValueError, match=r"rollout.env_errors='skip': expected one of \('count', 'retry', 'exclude'\)"):
    grpo.check_config(config)


def test_a_batch_with_no_token_in_the_loss_takes_no_optimizer_step(trajectories):
  """Every row cut (a host stalled past rollout.max_seconds leaves no token either): AdamW with weight decay would
  still move the weights on a zero gradient (its momentum, the decay), so the update takes no step."""
  batch, grid, _, _ = grpo_batch.prepare_batch(trajectories, _cfg(), exclude=np.ones(len(trajectories), bool))
  assert not batch['loss_mask'].any()
  model = model_lib.Qwen3VLModel(config_lib.Qwen3VLConfig.tiny(), rngs=nnx.Rngs(0))
  before = jax.tree.leaves(jax.device_get(nnx.state(model, nnx.Param)))
  opt = nnx.Optimizer(model, optax.adamw(1e-2, weight_decay=0.1), wrt=nnx.Param)
  b = {k: v for k, v in batch.items() if k not in ('rewards', 'fatal_steps')}
  out, steps = grpo_update.make_update_fn(_cfg())(model, opt, b, grid, [t.prompt_id for t in trajectories])
  assert out['optimizer_steps'] == 0 and [s['grad_norm'] for s in steps] == [0.0] and int(opt.step[...]) == 0
  for a, c in zip(jax.tree.leaves(jax.device_get(nnx.state(model, nnx.Param))), before):
    np.testing.assert_array_equal(a, c)
