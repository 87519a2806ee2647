"""Equal-reward groups and grouping by prompt_id (osvl_jax/rl/advantages.py; DESIGN.md §6, Eq. 11).

Equal rewards: a group whose G >= 2 rewards are all equal carries no learning signal; r̃ must be exactly 0 for
every estimator. In float32, μ_G of [0.9]*8 is not exactly 0.9, so r − μ_G is a rounding residue ε and σ_G is
|ε| too: r̃ = ε / (|ε| + δ) is O(1) (−0.056 was seen) unless the group is recognised as equal.

Neighbour (one reward differs), worked by hand, G = 8, rewards [0.9]*7 + [0.1]:
  μ = (7·0.9 + 0.1)/8 = 6.4/8 = 0.8;  r − μ = [0.1]*7 + [−0.7];  Σ(r − μ)² = 7·0.01 + 0.49 = 0.56
  σ (ddof 1) = sqrt(0.56/7) = sqrt(0.08) = 0.2828427;  r̃ = 0.1/0.2828437 = 0.3535521, −0.7/0.2828437 = −2.474865
  rloo: 0.9 − (6·0.9 + 0.1)/7 = 0.9 − 5.5/7 = 0.1142857;  0.1 − 6.3/7 = −0.8
  dr_grpo: r − μ = 0.1, −0.7
"""

import numpy as np
import pytest

from osvl_jax.rl import advantages

ESTIMATORS = ['grpo', 'rloo', 'dr_grpo']
VALUES = [0.0, 0.1, 0.9, 1 / 3, 1e6, -0.7]
SIZES = [2, 3, 5, 7, 8, 16]


@pytest.mark.parametrize('estimator', ESTIMATORS)
@pytest.mark.parametrize('group_size', SIZES)
@pytest.mark.parametrize('value', VALUES)
def test_equal_rewards_give_exactly_zero(estimator, group_size, value):
  rewards = np.full(group_size, value, np.float32)
  fatal = np.arange(group_size) % 3 == 1  # fatal samples too
  for clamp in (False, True):
    for std_ddof in (0, 1):
      adv, stats = advantages.group_advantages(rewards, fatal, group_size, clamp=clamp, estimator=estimator,
                                               std_ddof=std_ddof)
      assert np.asarray(adv).tolist() == [0.0] * group_size, (clamp, std_ddof)
      assert float(stats['num_zero_std_groups']) == 1
      assert float(stats['rtilde_mean']) == 0.0
      assert float(stats['num_fatal_clamped']) == 0  # r̃ = 0 is kept, never clamped
      assert float(stats['num_fatal_kept']) == fatal.sum()


@pytest.mark.parametrize('estimator', ESTIMATORS)
def test_equal_group_next_to_a_varied_group(estimator):
  # batch: [0.9]*8 (equal), then the neighbour group [0.9]*7 + [0.1] (module docstring), then [1/3]*8 fatal.
  rewards = np.array([0.9] * 8 + [0.9] * 7 + [0.1] + [1 / 3] * 8, np.float32)
  fatal = np.array([False] * 16 + [True] * 8)
  adv, stats = advantages.group_advantages(rewards, fatal, 8, clamp=True, estimator=estimator)
  adv = np.asarray(adv)
  assert adv[:8].tolist() == [0.0] * 8 and adv[16:].tolist() == [0.0] * 8
  hi, lo = {'grpo': (0.3535521, -2.474865), 'rloo': (0.1142857, -0.8), 'dr_grpo': (0.1, -0.7)}[estimator]
  np.testing.assert_allclose(adv[8:16], [hi] * 7 + [lo], rtol=2e-5)
  assert float(stats['num_zero_std_groups']) == 2


def test_singleton_group_keeps_the_verl_convention():
  # G = 1 is "all equal" trivially, but verl's μ = 0, σ = 1 applies: r̃ = r / (1 + δ) (module docstring).
  adv, stats = advantages.group_advantages(np.array([0.9, 0.2], np.float32), np.array([False, False]), 1)
  np.testing.assert_allclose(np.asarray(adv), [0.9, 0.2], rtol=1e-5)
  assert float(stats['num_zero_std_groups']) == 2


# Two groups worked by hand (G = 4, ddof 1, no fatal samples):
#   p0: [1.0, 0.2, 0.0, 0.6] -> r̃ = [1.240213, −0.563733, −1.014720, 0.338240] (tests/rl/test_advantages.py)
#   p1: [0.5, 0.5, 0.5, 0.9]: μ = 0.6, r − μ = [−0.1]*3 + [0.3], Σ² = 0.12, σ = sqrt(0.04) = 0.2
#       r̃ = [−0.1/0.200001]*3 + [0.3/0.200001] = [−0.4999975]*3 + [1.4999925]
P0 = [1.0, 0.2, 0.0, 0.6]
P1 = [0.5, 0.5, 0.5, 0.9]
A0 = [1.240213, -0.563733, -1.014720, 0.338240]
A1 = [-0.4999975] * 3 + [1.4999925]


def test_groups_by_id_whatever_the_row_order():
  ids = ['p0', 'p1'] * 4  # p0, p1, p0, p1, ...
  rewards = np.array([v for pair in zip(P0, P1) for v in pair], np.float32)
  adv, stats = advantages.group_advantages_by_id(rewards, np.zeros(8, bool), ids, clamp=False)
  want = [v for pair in zip(A0, A1) for v in pair]
  np.testing.assert_allclose(np.asarray(adv), want, atol=1e-5)
  # any permutation: each row keeps its own advantage
  perm = np.random.default_rng(0).permutation(8)
  adv_p, _ = advantages.group_advantages_by_id(rewards[perm], np.zeros(8, bool), [ids[i] for i in perm],
                                               clamp=False)
  np.testing.assert_allclose(np.asarray(adv_p), np.asarray(want)[perm], atol=1e-5)
  assert float(stats['num_zero_std_groups']) == 0


def test_groups_by_id_of_other_sizes():
  # p0 drawn twice (8 samples, one group: equal to group_advantages over the 8 alone), p2 a singleton (verl),
  # p3 two equal rewards (exactly 0).
  ids = ['p0'] * 4 + ['p2'] + ['p0'] * 4 + ['p3', 'p3']
  rewards = np.array(P0 + [0.7] + P1 + [1 / 3, 1 / 3], np.float32)
  fatal = np.array([False, True, False, False, False, True, False, False, False, True, False])
  adv, stats = advantages.group_advantages_by_id(rewards, fatal, ids, clamp=True)
  alone, _ = advantages.group_advantages(np.array(P0 + P1, np.float32), fatal[[0, 1, 2, 3, 5, 6, 7, 8]], 8)
  adv = np.asarray(adv)
  np.testing.assert_allclose(adv[[0, 1, 2, 3, 5, 6, 7, 8]], np.asarray(alone), atol=1e-6)
  np.testing.assert_allclose(adv[4], 0.7 / (1 + 1e-6), rtol=1e-6)
  assert adv[9:].tolist() == [0.0, 0.0]
  assert float(stats['num_zero_std_groups']) == 2  # the singleton and p3
  with pytest.raises(ValueError, match='group ids'):
    advantages.group_advantages_by_id(rewards, fatal, ids[:-1])
