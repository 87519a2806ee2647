"""GRPO curves (`train.curves`): per-step series, window means, the plotted mean and standard-error band; the
demo's last line and its reward plot; the held-out part of the RL prompts (`train.data.load_prompts`)."""

import pathlib
import sys

import ml_collections
import numpy as np
import pytest
from matplotlib import pyplot as plt

from osvl_jax import demo
from osvl_jax.train import curves, data

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / 'configs'))
import demo as demo_config  # noqa: E402


def _records(rewards, turns=None):
  turns = turns or [3.0] * len(rewards)
  return [{'step': i + 1, 'mean_reward': r, 'fatal_fraction': 0.25, 'mean_turns': t}
          for i, (r, t) in enumerate(zip(rewards, turns))]


def test_series_takes_each_steps_last_record_in_step_order_and_names_a_missing_key():
  records = _records([0.1, 0.2, 0.3])
  records = [records[2], records[0], records[1], {**records[1], 'mean_reward': 0.9}]   # step 2 resumed, rewritten
  np.testing.assert_array_equal(curves.series(records, 'mean_reward'), [0.1, 0.9, 0.3])
  with pytest.raises(KeyError, match="GRPO step 1 logged no 'r_acc'"):
    curves.series(records, 'r_acc')


def test_window_means_of_the_first_and_last_steps():
  assert curves.window_means([1, 2, 3, 4, 5, 6], 2) == (1.5, 5.5)
  assert curves.window_means([1, 2, 3], 10) == (2.0, 2.0)   # fewer than the window: all of them
  with pytest.raises(ValueError, match='0 values'):
    curves.window_means([], 3)


def test_plot_curves_draws_the_seed_mean_and_a_band_of_one_standard_error():
  runs = {'mask_clamp': [[0.0, 1.0, 2.0], [2.0, 1.0, 4.0], [1.0, 4.0, 3.0, 9.0]]}   # the last run cut to 3 steps
  fig, ax = plt.subplots()
  assert curves.plot_curves(runs, None, 'reward', ax=ax) is None
  np.testing.assert_allclose(ax.lines[0].get_ydata(), [1.0, 2.0, 3.0])
  # standard errors by hand: std (ddof 1) of (0, 2, 1), (1, 1, 4), (2, 4, 3) over sqrt(3)
  se = np.array([1.0, np.sqrt(3.0), 1.0]) / np.sqrt(3.0)
  band = ax.collections[0].get_paths()[0].vertices
  for x, mean, s in zip((1, 2, 3), (1.0, 2.0, 3.0), se):
    ys = band[np.isclose(band[:, 0], x), 1]
    np.testing.assert_allclose([ys.min(), ys.max()], [mean - s, mean + s], rtol=1e-12)
  plt.close(fig)
  with pytest.raises(ValueError, match="'x' has no steps"):
    curves.plot_curves({'x': [[]]}, 'unused.png', 'reward')


def test_plot_panels_and_histogram_write_images(tmp_path):
  out = curves.plot_panels([({'a': [[1.0, 2.0]]}, 'reward', 'R'), ({'a': [[3.0, 3.0]]}, 'turns', 'T')],
                           tmp_path / 'c.png')
  assert out.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
  hist = curves.plot_histogram({'kept': [0.1, 0.5], 'clamped': [-0.4], 'none': []}, tmp_path / 'h.png', 'r')
  assert hist.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
  with pytest.raises(ValueError, match='no values'):
    curves.plot_histogram({'kept': []}, tmp_path / 'e.png', 'r')


def test_the_demo_summary_reports_the_first_and_last_grpo_rewards_and_plots_them(tmp_path):
  config = demo_config.get_config()
  config.model.vocab = 'full'   # the tests' datasets list no vocab_ids.json
  rewards = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1]   # 12 steps: windows of 3
  line = demo.summary(config, {'sft_format_ok': 0.9}, _records(rewards), tmp_path)
  assert demo.report_window(12) == 3 and demo.report_window(2) == 1 and demo.report_window(100) == 5
  assert line == ('demo: sft_format_ok=0.900 grpo_steps=12 grpo_group_size=4 mean_reward=0.5500 '
                  'fatal_fraction=0.2500 grpo_reward_first=0.1000 grpo_reward_last=1.0000')
  assert (tmp_path / 'grpo_reward.png').read_bytes()[:4] == b'\x89PNG'


def test_heldout_prompts_are_the_rl_splits_last_and_never_trained_on(monkeypatch):
  prompts = [{'prompt_id': f'p{i}'} for i in range(5)]
  monkeypatch.setattr(data.pipeline_data, 'load_prompts', lambda folder: list(prompts))
  monkeypatch.setattr(data, '_check', lambda path: path)
  config = ml_collections.ConfigDict({'data': {'dir': '/unused'}, 'grpo': {'heldout_prompts': 2}})
  assert [p['prompt_id'] for p in data.load_prompts(config, None)] == ['p0', 'p1', 'p2']
  assert [p['prompt_id'] for p in data.load_prompts(config, None, 'heldout')] == ['p3', 'p4']
  config.grpo.heldout_prompts = 0
  assert len(data.load_prompts(config, None)) == 5 and data.load_prompts(config, None, 'heldout') == []
  for bad, why in ((5, 'must be < 5 .the dataset has 5 RL prompts'), (-1, 'must be >= 0'),
                   (1.5, 'expected a finite int')):
    config = ml_collections.ConfigDict({'data': {'dir': '/unused'}, 'grpo': {'heldout_prompts': bad}})
    with pytest.raises(ValueError, match=rf'grpo.heldout_prompts={bad}: {why}'):
      data.load_prompts(config, None)
  with pytest.raises(ValueError, match="part='test'"):
    data.load_prompts(config, None, 'test')
  prompts.clear()  # a build whose every accepted item went to SFT
  with pytest.raises(ValueError, match='/unused: the `rl` split holds no prompts'):
    data.load_prompts(config, None)
