"""Format and composite rewards (osvl_jax/rl/rewards.py, DESIGN.md §6)."""

import numpy as np
import pytest

from osvl_jax.rl import rewards


@pytest.mark.parametrize('flags, fatal_step, expected', [
    ([True, True, False, True], None, 3 / 4),   # non-fatal: every step
    ([True, True, False, True], 2, 2 / 2),      # steps l < 2
    ([True, True, False, True], 3, 2 / 3),
    ([True, False, False], 0, 0.0),             # empty prefix -> 0
    ([], None, 0.0),
    ([False, False], None, 0.0),
])
def test_format_reward_is_mean_over_pre_fatal_steps(flags, fatal_step, expected):
  assert rewards.format_reward(flags, fatal_step) == pytest.approx(expected)


def test_composite_reward_examples():
  # r_fmt · (0.8 r_acc + 0.2 r_query)
  assert rewards.composite_reward(0.75, 1.0, 0.5) == pytest.approx(0.75 * (0.8 + 0.1))   # 0.675
  assert rewards.composite_reward(0.75, 0.0, 0.5) == pytest.approx(0.75 * 0.1)           # 0.075
  assert rewards.composite_reward(0.0, 1.0, 1.0) == 0.0
  assert rewards.composite_reward(1.0, 1.0, 0.0, alpha=0.5) == pytest.approx(0.5)
  np.testing.assert_allclose(
      rewards.composite_reward(np.array([1.0, 0.5]), np.array([1.0, 1.0]), np.array([0.0, 1.0])),
      [0.8, 0.5])
  with pytest.raises(ValueError):
    rewards.composite_reward(1.0, 1.0, 1.0, alpha=1.5)
