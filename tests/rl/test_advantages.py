"""Group advantages with one-sided fatal clamping, Eq. 11 (osvl_jax/rl/advantages.py).

The example group, worked by hand:
  rewards r = [1.0, 0.2, 0.0, 0.6], fatal = [no, YES, no, YES]
  μ_G = 1.8 / 4 = 0.45;  r − μ = [0.55, −0.25, −0.45, 0.15];  Σ(r − μ)² = 0.3025 + 0.0625 + 0.2025 + 0.0225 = 0.59
  σ (ddof=1, default) = sqrt(0.59 / 3) = 0.443471;  σ (ddof=0) = sqrt(0.59 / 4) = 0.384057
  r̃ (ddof=1) = (r − μ) / (σ + 1e-6) = [1.240213, −0.563733, −1.014720, 0.338240]
  r̃ (ddof=0)                       = [1.432074, −0.650943, −1.171697, 0.390566]
  fatal sample 1 is below the mean (r̃ < 0), fatal sample 3 above it (r̃ > 0):
  Â (mask_clamp) = [1.240213, max(−0.563733, 0) = 0, −1.014720, max(0.338240, 0) = 0.338240]
  Â (none | hard | mask) = r̃
"""

import numpy as np
import pytest

from osvl_jax.rl import advantages
from osvl_jax.rl import fatal as fatal_lib

REWARDS = np.array([1.0, 0.2, 0.0, 0.6], np.float32)
FATAL = np.array([False, True, False, True])
R_TILDE_DDOF1 = [1.240213, -0.563733, -1.014720, 0.338240]
R_TILDE_DDOF0 = [1.432074, -0.650943, -1.171697, 0.390566]


def _clamp(mode):
  return fatal_lib.FATAL_MODES.get(mode).clamp_fatal_advantage


@pytest.mark.parametrize('mode, expected', [  # Â per fatal_mode, through its clamp flag
    ('none', R_TILDE_DDOF1),
    ('hard', R_TILDE_DDOF1),
    ('mask', R_TILDE_DDOF1),
    ('mask_clamp', [1.240213, 0.0, -1.014720, 0.338240]),
])
def test_group_advantages_hand_example_every_mode(mode, expected):
  adv, _ = advantages.group_advantages(REWARDS, FATAL, group_size=4, clamp=_clamp(mode))
  assert adv.dtype == np.float32
  np.testing.assert_allclose(np.asarray(adv), expected, atol=1e-5)


def test_clamped_fatal_advantage_is_exactly_zero():
  adv, _ = advantages.group_advantages(REWARDS, FATAL, group_size=4, clamp=True)
  assert float(adv[1]) == 0.0


def test_population_std_option():
  adv, _ = advantages.group_advantages(REWARDS, FATAL, group_size=4, clamp=False, std_ddof=0)
  np.testing.assert_allclose(np.asarray(adv), R_TILDE_DDOF0, atol=1e-5)


def test_clamp_stats_hand_example():
  _, stats = advantages.group_advantages(REWARDS, FATAL, group_size=4, clamp=True)
  assert float(stats['num_fatal']) == 2
  assert float(stats['num_fatal_clamped']) == 1
  assert float(stats['num_fatal_kept']) == 1
  assert float(stats['fatal_clamped_frac']) == pytest.approx(0.5)
  assert float(stats['fatal_clamped_rtilde_mean']) == pytest.approx(-0.563733, abs=1e-5)
  assert float(stats['fatal_kept_rtilde_mean']) == pytest.approx(0.338240, abs=1e-5)
  assert float(stats['num_zero_std_groups']) == 0


def test_groups_are_contiguous_and_independent():
  # Group 0 = the hand example; group 1 = [0.5, 0.5, 0.5, 0.5]: zero std -> r̃ = 0 (0 / (0 + δ)).
  rewards = np.concatenate([REWARDS, np.full(4, 0.5, np.float32)])
  fatal = np.concatenate([FATAL, [True, False, False, False]])
  adv, stats = advantages.group_advantages(rewards, fatal, group_size=4, clamp=True)
  np.testing.assert_allclose(np.asarray(adv), [1.240213, 0.0, -1.014720, 0.338240, 0, 0, 0, 0], atol=1e-5)
  assert float(stats['num_zero_std_groups']) == 1
  assert float(stats['num_fatal']) == 3
  assert float(stats['num_fatal_kept']) == 2  # r̃ = 0 is kept (not clamped)


def test_rloo_hand_example():
  # r_i − mean of the other three:
  #   1.0 − (0.2+0.0+0.6)/3 = 0.733333;  0.2 − (1.0+0.0+0.6)/3 = −0.333333
  #   0.0 − (1.0+0.2+0.6)/3 = −0.6;      0.6 − (1.0+0.2+0.0)/3 = 0.2
  adv, _ = advantages.group_advantages(REWARDS, FATAL, 4, clamp=False, estimator='rloo')
  np.testing.assert_allclose(np.asarray(adv), [0.733333, -0.333333, -0.6, 0.2], atol=1e-5)
  adv, _ = advantages.group_advantages(REWARDS, FATAL, 4, clamp=True, estimator='rloo')
  np.testing.assert_allclose(np.asarray(adv), [0.733333, 0.0, -0.6, 0.2], atol=1e-5)


def test_dr_grpo_is_mean_centred():
  adv, _ = advantages.group_advantages(REWARDS, FATAL, 4, clamp=False, estimator='dr_grpo')
  np.testing.assert_allclose(np.asarray(adv), [0.55, -0.25, -0.45, 0.15], atol=1e-6)


def test_singleton_group_follows_verl():
  adv, _ = advantages.group_advantages(np.array([0.7], np.float32), np.array([False]), 1, clamp=True)
  np.testing.assert_allclose(np.asarray(adv), [0.7], atol=1e-6)  # μ = 0, σ = 1


def test_bad_arguments():
  with pytest.raises(ValueError):
    advantages.group_advantages(REWARDS, FATAL, group_size=3)
  with pytest.raises(ValueError):
    advantages.group_advantages(REWARDS, FATAL, group_size=4, estimator='ppo')
