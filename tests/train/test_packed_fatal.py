"""The packed GRPO update with fatal trajectories (osvl_jax/train/update_rows.py, grpo_update.py; DESIGN.md §6).

The paper configs run `grpo.pack_rows` with `fatal_mode='mask_clamp'`: packed rows then hold fatal trajectories
whose post-fatal tokens are masked (Eq. 10) beside clamped ones (Â = max(r̃, 0) = 0, Eq. 11) and fatal-at-step-0
ones with no loss token at all. Two groups of G = 4 real trajectories through the tiny Qwen3-VL, fixed old
log-probs (ρ ≠ 1, so the clip acts): packed two per row, the loss and the gradient are the unpacked ones.
"""

import jax
import ml_collections
import numpy as np
import pytest
from flax import nnx

from osvl_jax import trajectory as tj
from osvl_jax.models.qwen3_vl import config as config_lib
from osvl_jax.models.qwen3_vl import model as model_lib
from osvl_jax.train import grpo_batch, grpo_update, update_rows
from tools import base

SEARCH = tj.render_assistant_text('Look it up.', tool_call={'name': 'text_search', 'arguments': {'query': 'Agra'}})
BAD = tj.render_assistant_text('Try.', tool_call={'name': 'browse', 'arguments': {'url': 'x'}})
RIGHT = tj.render_assistant_text('It is Agra.', response='Agra')
WRONG = tj.render_assistant_text('It is Delhi.', response='Delhi')
LENGTH = 256  # the one length bucket: the longest trajectory (220 tokens) fits, two short ones share a row


def _trajectory(g: int, i: int, kind: str) -> tj.Trajectory:
  """kind: 'fatal1' (a search, then two failing calls; f_i = 1, so the failing steps are masked), 'fatal0' (a
  failing call first: f_i = 0, no loss token), 'right' or 'wrong' (one answer)."""
  builder = tj.TrajectoryBuilder(tj.load_tokenizer(), tj.ImageProcessor(min_pixels=32 * 32, max_pixels=32 * 32), [])
  builder.start(f'Which city is shown, case {g}?', np.full((32, 32, 3), 10 * g, np.uint8))
  fatal_step = {'fatal1': 1, 'fatal0': 0}.get(kind)
  if kind == 'fatal1':
    builder.append_assistant_text(SEARCH)
    builder.append_observation(base.ToolResult(ok=True, text='[1] Agra: a city in India.'))
  if kind in ('fatal1', 'fatal0'):
    for _ in range(2 if kind == 'fatal1' else 1):
      builder.append_assistant_text(BAD)
      builder.append_observation(base.error('unknown_tool', 'no tool named browse'))
  else:
    builder.append_assistant_text(RIGHT if kind == 'right' else WRONG)
  return builder.finish(prompt_id=f'p{g}', sample_index=i, answers=['Agra'], fatal_step=fatal_step)


@pytest.fixture(scope='module')
def setup():
  kinds = [('fatal1', 'wrong', 'wrong', 'fatal0'), ('right', 'fatal1', 'wrong', 'fatal0')]
  trajectories = [_trajectory(g, i, k) for g, group in enumerate(kinds) for i, k in enumerate(group)]
  cfg = ml_collections.ConfigDict(dict(alpha=0.8, num_generations=4, fatal_mode='mask_clamp', delta=1e-6,
                                       eps_low=0.2, eps_high=0.28, beta=0.0, length_buckets=(LENGTH,),
                                       loss_bucket=16))
  batch, grid, _, _ = grpo_batch.prepare_batch(trajectories, cfg)
  fatal = batch.pop('fatal_steps') >= 0
  batch.pop('rewards')
  masked = batch['loss_mask'].sum(1) < batch['completion_mask'].sum(1)
  adv = batch['advantages']
  # what the test is about: a fatal row kept (Â > 0) with masked tokens, a clamped fatal row with loss tokens,
  # fatal rows without any loss token, and non-fatal rows of both signs
  assert np.any(fatal & masked & (adv > 0) & (batch['loss_mask'].sum(1) > 0))
  assert np.any(fatal & (adv == 0) & (batch['loss_mask'].sum(1) > 0))
  assert np.any(fatal & (batch['loss_mask'].sum(1) == 0))
  assert np.any(~fatal & (adv > 0)) and np.any(~fatal & (adv < 0))
  rng = np.random.default_rng(0)
  batch['old_logprobs'] = (-11.0 + rng.normal(0, 0.3, batch['loss_mask'].shape)).astype(np.float32)
  model = model_lib.Qwen3VLModel(config_lib.Qwen3VLConfig.tiny(), rngs=nnx.Rngs(0))
  return model, batch, grid, cfg


@pytest.mark.parametrize('aggregation', ['seq_mean_token_sum', 'seq_mean_token_mean'])
def test_packed_fatal_masked_clamped_rows_give_the_unpacked_loss_and_gradient(setup, aggregation):
  model, batch, grid, cfg = setup
  grad_fn = grpo_update.make_grad_fn(ml_collections.ConfigDict(dict(cfg.to_dict(), aggregation=aggregation)))
  place = grpo_update.default_place(model.config.vision)
  rows, tokens = len(batch['advantages']), float(batch['loss_mask'].sum())

  plain_grads, plain = grpo_update.accumulate_grads(model, [place(grpo_update.with_grid(batch, grid))], grad_fn,
                                                    rows, tokens)
  parts = update_rows.pack_parts(batch, grid, np.arange(rows), update_rows.Packing(2, LENGTH, LENGTH // 2))
  assert any(len(row) == 2 for _, _, packed_rows in parts for row in packed_rows)   # rows really share a row
  packed_grads, packed = grpo_update.accumulate_grads(
      model, [place(grpo_update.with_grid(b, g)) for b, g, _ in parts], grad_fn, rows, tokens)

  assert packed['loss'] == pytest.approx(plain['loss'], rel=1e-5)
  assert abs(plain['loss']) > 1e-3 and plain['clipped_tokens'] > 0
  assert packed['num_tokens'] == plain['num_tokens'] == tokens
  assert packed['num_sequences_with_tokens'] == plain['num_sequences_with_tokens'] == 6   # not the two f_i = 0 rows
  assert packed['clipped_tokens'] == plain['clipped_tokens']
  for a, b in zip(jax.tree.leaves(jax.device_get(packed_grads)), jax.tree.leaves(jax.device_get(plain_grads))):
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * np.abs(b).max())
  norm = lambda g: np.sqrt(sum(float(np.sum(np.square(x))) for x in jax.tree.leaves(jax.device_get(g))))
  assert norm(packed_grads) == pytest.approx(norm(plain_grads), rel=1e-5) and norm(plain_grads) > 0
