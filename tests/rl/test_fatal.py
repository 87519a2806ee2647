"""Fatal-step detection and the Eq. 10 loss mask for every fatal_mode (osvl_jax/rl/fatal.py)."""

import numpy as np
import pytest

from osvl_jax.rl import fatal

E, S = True, False  # tool-execution error / success


@pytest.mark.parametrize('errors, first, kth', [
    ([], None, None),
    ([S, S, S], None, None),
    ([E, E], None, None),                      # run of 2 < K
    ([E, E, S, E, E], None, None),             # success resets n_err
    ([E, E, E], 0, 2),
    ([E, E, E, E, E], 0, 2),                   # fatal where n_err first reaches K
    ([S, E, S, E, E, E, S], 3, 5),
    ([S, E, E, S, E, E, E, E], 4, 6),
])
def test_fatal_step_k3_first_and_kth(errors, first, kth):
  assert fatal.fatal_step(errors, k=3, index='first') == first
  assert fatal.fatal_step(errors, k=3, index='kth') == kth


def test_fatal_step_other_k_and_bad_arguments():
  assert fatal.fatal_step([S, E], k=1, index='first') == 1
  assert fatal.fatal_step([S, E], k=1, index='kth') == 1
  assert fatal.fatal_step([E, E, S, E, E], k=2, index='first') == 0
  with pytest.raises(ValueError):
    fatal.fatal_step([E], k=0)
  with pytest.raises(ValueError):
    fatal.fatal_step([E], index='last')


def test_fatal_step_array_uses_minus_one_for_non_fatal():
  out = fatal.fatal_step_array([None, 2, 0])
  assert out.dtype == np.int32
  np.testing.assert_array_equal(out, [-1, 2, 0])


# One trajectory: prompt (step -1), then steps 0, 1, 2; each step = one emitted token + one observation token.
STEP = np.array([[-1, -1, 0, 0, 1, 1, 2]] * 2, np.int32)
GEN = np.array([[0, 0, 1, 0, 1, 0, 1]] * 2, bool)
FATAL = np.array([1, -1], np.int32)  # row 0 fatal at step 1, row 1 not fatal
PRE_FATAL_ONLY = [0, 0, 1, 0, 0, 0, 0]  # M_gen · 1[s(t) < 1]
ALL_GEN = [0, 0, 1, 0, 1, 0, 1]


@pytest.mark.parametrize('mode, row0', [
    ('none', ALL_GEN),                # vanilla GRPO: M = M_gen
    ('hard', [0] * 7),                # the whole fatal trajectory is masked
    ('mask', PRE_FATAL_ONLY),         # Eq. 10
    ('mask_clamp', PRE_FATAL_ONLY),   # Eq. 10 (the clamp is in the advantage)
])
def test_loss_mask_per_mode(mode, row0):
  m = np.asarray(fatal.loss_mask(GEN, STEP, FATAL, fatal.FATAL_MODES.get(mode).mask_fn))
  assert m.dtype == np.float32
  np.testing.assert_array_equal(m[0], row0)
  np.testing.assert_array_equal(m[1], ALL_GEN)  # non-fatal rows are M_gen in every mode


def test_loss_mask_fatal_at_step_zero_masks_everything():
  m = np.asarray(fatal.loss_mask(GEN[:1], STEP[:1], np.array([0], np.int32), fatal.mask_post_fatal))
  np.testing.assert_array_equal(m, [[0] * 7])


def test_fatal_mode_registry():
  assert fatal.FATAL_MODES.names() == ['hard', 'mask', 'mask_clamp', 'none']
  assert fatal.FATAL_MODES.get('mask_clamp').clamp_fatal_advantage
  assert not any(fatal.FATAL_MODES.get(m).clamp_fatal_advantage for m in ('none', 'hard', 'mask'))
  with pytest.raises(ValueError):
    fatal.FATAL_MODES.get('soft')
