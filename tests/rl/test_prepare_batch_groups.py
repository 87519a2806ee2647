"""`grpo_batch.prepare_batch` forms the advantage groups by prompt_id, never by row position (DESIGN.md §6, Eq. 11).

Two prompts of G = 4 samples with different rewards; their rows interleaved p0, p1, p0, p1, ... (or shuffled)
must get the advantages each group gets alone, and the per-row arrays (loss mask, rewards, fatal steps) stay in
the rows' order. By row position, the interleaved batch would pair p0's and p1's samples (up to 0.8 off).
"""

import dataclasses
import pathlib
import sys

import numpy as np
import pytest

from osvl_jax import trajectory as tj
from osvl_jax.rl import advantages
from osvl_jax.train import grpo_batch
from tools import base

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / 'configs'))
import demo as demo_config  # noqa: E402

LENGTH_BUCKETS = (64, 128, 256, 512, 1024, 2048, 4096, 8192)  # grpo.length_buckets (batching.bucket_sizes)

SEARCH = tj.render_assistant_text('Look.', tool_call={'name': 'text_search', 'arguments': {'query': 'Agra'}})
BAD = tj.render_assistant_text('Try.', tool_call={'name': 'browse', 'arguments': {'url': 'x'}})
RIGHT = tj.render_assistant_text('Agra.', response='Agra')
WRONG = tj.render_assistant_text('Delhi.', response='Delhi')
OK = base.ToolResult(ok=True, text='[1] Agra: a city.')
ERR = base.error('unknown_tool', 'no tool named browse')


def _trajectory(prompt_id, index, steps, fatal_step=None):
  builder = tj.TrajectoryBuilder(tj.load_tokenizer(), tj.ImageProcessor(min_pixels=32 * 32, max_pixels=32 * 32), [])
  builder.start('Which city?', None)
  for text, result in steps:
    builder.append_assistant_text(text)
    if result is not None:
      builder.append_observation(result)
  return builder.finish(prompt_id=prompt_id, sample_index=index, answers=['Agra'], fatal_step=fatal_step)


@pytest.fixture(scope='module')
def groups():
  p0 = [[(SEARCH, OK), (RIGHT, None)], [(WRONG, None)], [(SEARCH, OK)] + [(BAD, ERR)] * 3, [(BAD, ERR)] * 3]
  p1 = [[(RIGHT, None)], [(RIGHT, None)], [(SEARCH, OK), (WRONG, None)], [(WRONG, None)]]
  fatal0 = [None, None, 1, 0]
  g0 = [_trajectory('p0', i, s, f) for i, (s, f) in enumerate(zip(p0, fatal0))]
  g1 = [_trajectory('p1', i, s) for i, s in enumerate(p1)]
  return g0, g1


def _cfg(**overrides):
  cfg = demo_config.get_config().grpo
  cfg.update(dict(num_generations=4, length_buckets=LENGTH_BUCKETS, loss_bucket=16, **overrides))
  return cfg


def _rows(batch, key, order):
  """Row i of the result = row of trajectory order[i] (undo a permutation)."""
  return np.asarray(batch[key])[np.argsort(order)]


@pytest.mark.parametrize('estimator', ['grpo', 'rloo', 'dr_grpo'])
@pytest.mark.parametrize('order', ['interleaved', 'shuffled'])
def test_rows_in_any_order_equal_each_group_alone(groups, estimator, order):
  g0, g1 = groups
  cfg = _cfg(estimator=estimator)
  alone0, alone1 = (grpo_batch.prepare_batch(g, cfg)[0] for g in (g0, g1))
  want_adv = np.concatenate([alone0['advantages'], alone1['advantages']])
  want_r = np.concatenate([alone0['rewards'], alone1['rewards']])
  assert np.ptp(alone0['advantages']) > 0 and not np.allclose(alone0['rewards'], alone1['rewards'])
  everything = g0 + g1
  perm = ([0, 4, 1, 5, 2, 6, 3, 7] if order == 'interleaved'
          else list(np.random.default_rng(3).permutation(8)))
  batch, _, _, stats = grpo_batch.prepare_batch([everything[i] for i in perm], cfg)
  np.testing.assert_array_equal(batch['rewards'], want_r[perm])
  np.testing.assert_allclose(batch['advantages'], want_adv[perm], rtol=1e-6, atol=1e-7)
  # the hand formula (Eq. 11) on p0's rewards, as in tests/train/test_grpo_config.py
  r = want_r[:4].astype(np.float64)
  if estimator == 'grpo':
    r_tilde = (r - r.mean()) / (r.std(ddof=1) + 1e-6)
  elif estimator == 'rloo':
    r_tilde = r - (r.sum() - r) / 3
  else:
    r_tilde = r - r.mean()
  r_tilde[2:] = np.maximum(r_tilde[2:], 0.0)  # mask_clamp: rows 2, 3 fatal
  np.testing.assert_allclose(_rows(batch, 'advantages', perm)[:4], r_tilde, rtol=1e-5, atol=1e-6)
  # per-row arrays follow their trajectory
  assert _rows(batch, 'fatal_steps', perm).tolist() == [-1, -1, 1, 0, -1, -1, -1, -1]
  assert float(stats['num_fatal']) == 2


def test_group_of_another_size_is_used_as_it_is(groups, caplog):
  # p0 twice (8 samples of one prompt_id: one group of 8) and a single p1 sample (a singleton group).
  g0, g1 = groups
  trajs = g0 + [dataclasses.replace(t, sample_index=t.sample_index + 4) for t in g0] + g1[:1]
  with caplog.at_level('WARNING'):
    batch, _, _, _ = grpo_batch.prepare_batch(trajs, _cfg())
  assert "'p0': 8" in caplog.text and "'p1': 1" in caplog.text
  r = batch['rewards']
  fatal = batch['fatal_steps'] >= 0
  want, _ = advantages.group_advantages(r[:8], fatal[:8], 8, clamp=True)
  np.testing.assert_allclose(batch['advantages'][:8], np.asarray(want), rtol=1e-6)
  np.testing.assert_allclose(batch['advantages'][8], r[8] / (1 + 1e-6), rtol=1e-6)  # verl singleton
