"""Environment errors in the fatal cascade and the advantages (`rl.fatal.cut_by_environment`,
`advantages.group_advantages_by_id(exclude=...)`; config rollout.env_errors): which trajectories are cut by
environment errors, and group baselines computed without the excluded ones, by hand."""

import numpy as np
import pytest

from osvl_jax.rl import advantages, fatal
from tools import base


def test_the_error_kinds_split_into_the_policys_and_the_environments():
  assert set(base.POLICY_ERROR_KINDS) | set(base.ENVIRONMENT_ERROR_KINDS) == base.EXECUTION_ERROR_KINDS
  assert not set(base.POLICY_ERROR_KINDS) & set(base.ENVIRONMENT_ERROR_KINDS)
  assert [base.error(k, 'x').is_environment_error for k in base.ERROR_KINDS] == [
      False, False, False, True, True, True, False]   # malformed, unknown, bad_arguments | timeout, http, backend | none
  assert not base.ToolResult(ok=True, text='fine').is_environment_error


@pytest.mark.parametrize('errors, k, want', [
    ([0, 1, 1, 1, 0], 3, (1, 3)),
    ([1, 1, 0, 1, 1, 1, 1], 3, (3, 5)),      # the first run of K; a longer run does not move it
    ([1, 1, 0, 1, 1], 3, None),
    ([1], 1, (0, 0)),
    ([], 3, None),
])
def test_fatal_cascade_is_the_first_run_of_k_errors(errors, k, want):
  assert fatal.fatal_cascade([bool(e) for e in errors], k) == want
  if want is not None:   # f_i is its first step ('first') or its last ('kth')
    assert fatal.fatal_step([bool(e) for e in errors], k, 'first') == want[0]
    assert fatal.fatal_step([bool(e) for e in errors], k, 'kth') == want[1]


# per step: '.' no error, 'p' a policy error (malformed_call, unknown_tool, bad_arguments), 'e' an environment error
@pytest.mark.parametrize('steps, want', [
    ('ppp', False),      # the policy's own cascade
    ('ppe', True),       # the environment's error completes it: two policy errors alone would not be fatal
    ('epp', True),
    ('eee', True),
    ('e.ppp', False),    # an environment error before a success, outside the cascade
    ('pp.eee', True),
    ('pe.ppp', False),   # an environment error in a run that reset; the fatal run is the policy's
    ('ee.e', False),     # not fatal: never cut
    ('', False),
])
def test_cut_by_environment_means_the_fatal_cascade_holds_an_environment_error(steps, want):
  execution = [c in 'pe' for c in steps]
  environment = [c == 'e' for c in steps]
  assert fatal.cut_by_environment(execution, environment, 3) is want
  with pytest.raises(ValueError, match='1 execution and 0 environment'):
    fatal.cut_by_environment([True], [], 3)


def test_excluded_rows_leave_their_groups_baselines_by_hand():
  """rloo, clamp on. Group a: rewards 1.0, 0.0, 0.5, 0.2 with row 1 excluded -> r̃ over (1.0, 0.5, 0.2):
  1.0 - 0.35 = 0.65, 0.5 - 0.6 = -0.1 (fatal: clamped to 0), 0.2 - 0.75 = -0.55. Group b: one of two excluded, the
  other has no baseline: 0. Group c: both excluded. Group d: none excluded, 0.1 / 0.4 -> -0.3 (fatal: 0), 0.3."""
  ids = ['a', 'a', 'a', 'a', 'b', 'b', 'c', 'c', 'd', 'd']
  rewards = np.array([1.0, 0.0, 0.5, 0.2, 0.3, 0.9, 0.7, 0.1, 0.1, 0.4], np.float32)
  is_fatal = np.array([0, 1, 1, 0, 1, 0, 0, 0, 1, 0], bool)
  exclude = np.array([0, 1, 0, 0, 1, 0, 1, 1, 0, 0], bool)
  adv, stats = advantages.group_advantages_by_id(rewards, is_fatal, ids, clamp=True, estimator='rloo',
                                                 exclude=exclude)
  np.testing.assert_allclose(np.asarray(adv), [0.65, 0, 0, -0.55, 0, 0, 0, 0, 0, 0.3], atol=1e-6)
  stats = {k: float(v) for k, v in stats.items()}
  assert (stats['num_excluded'], stats['num_groups_without_baseline']) == (4.0, 1.0)
  # a2 and d0 are the fatal rows counted (row 1 and b0 are excluded), both clamped
  assert (stats['num_fatal'], stats['num_fatal_clamped'], stats['num_fatal_kept']) == (2.0, 2.0, 0.0)
  assert stats['fatal_clamped_rtilde_mean'] == pytest.approx(-0.2, abs=1e-6)
  assert stats['reward_mean'] == pytest.approx((1.0 + 0.5 + 0.2 + 0.1 + 0.4) / 5, abs=1e-6)
  assert stats['rtilde_mean'] == pytest.approx((0.65 - 0.1 - 0.55 - 0.3 + 0.3) / 5, abs=1e-6)


@pytest.mark.parametrize('estimator', ['grpo', 'rloo', 'dr_grpo'])
def test_a_group_with_excluded_rows_gets_the_advantages_of_its_other_rows_alone(estimator):
  rng = np.random.default_rng(0)
  rewards = rng.uniform(0, 1, 8).astype(np.float32)
  is_fatal = np.array([1, 0, 0, 1, 0, 1, 0, 0], bool)
  ids = ['x'] * 5 + ['y'] * 3
  exclude = np.array([0, 1, 0, 0, 1, 0, 0, 0], bool)
  adv, _ = advantages.group_advantages_by_id(rewards, is_fatal, ids, estimator=estimator, exclude=exclude)
  kept = ~exclude
  alone, _ = advantages.group_advantages_by_id(rewards[kept], is_fatal[kept], np.array(ids)[kept].tolist(),
                                               estimator=estimator)
  np.testing.assert_array_equal(np.asarray(adv)[kept], np.asarray(alone))
  assert not np.asarray(adv)[exclude].any()
  # nothing excluded: today's advantages, the same statistics plus the two counts at 0
  none, none_stats = advantages.group_advantages_by_id(rewards, is_fatal, ids, estimator=estimator,
                                                       exclude=np.zeros(8, bool))
  plain, plain_stats = advantages.group_advantages_by_id(rewards, is_fatal, ids, estimator=estimator)
  np.testing.assert_array_equal(np.asarray(none), np.asarray(plain))
  assert {k: float(v) for k, v in none_stats.items()} == {**{k: float(v) for k, v in plain_stats.items()},
                                                         'num_excluded': 0.0, 'num_groups_without_baseline': 0.0}
  with pytest.raises(ValueError, match=r'exclude \(3,\) must be \[B\]'):
    advantages.group_advantages_by_id(rewards, is_fatal, ids, exclude=np.zeros(3, bool))
