"""Eq. 10-12 end to end for every fatal_mode: advantages AND loss of one group of G = 4, written out by hand.

The group (rewards and fatal flags of test_advantages.py):
  r = [1.0, 0.2, 0.0, 0.6];  rows 1 and 3 fatal with f_i = 1;  r̃ (ddof 1) = [1.240213, −0.563733, −1.014720, 0.338240]
  Â: none | hard | mask = r̃;  mask_clamp = [1.240213, 0, −1.014720, 0.338240]  (row 1 clamped, row 3 kept)

Tokens, the same in every row (T = 6):
  s(t)   = [0, 0, 1, 1, 2, 2]
  M_gen  = [1, 1, 1, 0, 1, 1]           (token 3 is an observation)
  ρ      = [1.1, 0.9, 1.5, 1.0, 0.5, 1.2]   (log π_θ − log π_old)
Clip range [1 − 0.2, 1 + 0.28] = [0.8, 1.28]. Per token min(ρÂ, clip(ρ)Â) = Â·c(ρ) with
  c = min(ρ, clip ρ) for Â > 0:  [1.1, 0.9, 1.28, –, 0.5, 1.2]   sum over M_gen = 4.98, mean 0.996
  c = max(ρ, clip ρ) for Â < 0:  [1.1, 0.9, 1.5,  –, 0.8, 1.2]   sum over M_gen = 5.5,  mean 1.1
  pre-fatal prefix (s(t) < 1: tokens 0, 1), either sign:          sum 2.0, mean 1.0

Per-row token means (Eq. 12 inner term), row 0 and row 2 (non-fatal) in every mode:
  row 0 = 1.240213 · 0.996 = 1.235252;   row 2 = −1.014720 · 1.1 = −1.116192
Fatal rows:
  none        row 1 = −0.563733 · 1.1 = −0.620106    row 3 = 0.338240 · 0.996 = 0.336887   (whole row, Â = r̃)
  hard        row 1 = 0 (masked)                     row 3 = 0 (masked)
  mask        row 1 = −0.563733 · 1.0 = −0.563733    row 3 = 0.338240 · 1.0 = 0.338240     (prefix, Â = r̃)
  mask_clamp  row 1 = 0 (Â = 0)                      row 3 = 0.338240                      (prefix, Â = max(r̃, 0))
J = (1/4) Σ rows;  loss = −J:
  none        (1.235252 − 0.620106 − 1.116192 + 0.336887) / 4 = −0.041040  -> loss  0.041040
  hard        (1.235252 + 0        − 1.116192 + 0       ) / 4 =  0.029765  -> loss −0.029765
  mask        (1.235252 − 0.563733 − 1.116192 + 0.338240) / 4 = −0.026608  -> loss  0.026608
  mask_clamp  (1.235252 + 0        − 1.116192 + 0.338240) / 4 =  0.114325  -> loss −0.114325
Other aggregations, mask_clamp:
  seq_mean_token_sum: row sums 1.240213·4.98 = 6.176261, 0, −1.014720·5.5 = −5.580960, 0.338240·2 = 0.676480;
                      J = 1.271781 / 4 = 0.317945
  token_mean:         Σ M = 5 + 2 + 5 + 2 = 14 (row 1's prefix is in the mask, with Â = 0); J = 1.271781 / 14 = 0.090842
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from osvl_jax.rl import advantages, fatal, losses

REWARDS = np.array([1.0, 0.2, 0.0, 0.6], np.float32)
FATAL_STEP = np.array([-1, 1, -1, 1], np.int32)
STEP = np.tile(np.array([0, 0, 1, 1, 2, 2], np.int32), (4, 1))
GEN = np.tile(np.array([1, 1, 1, 0, 1, 1], np.float32), (4, 1))
RATIO = np.array([1.1, 0.9, 1.5, 1.0, 0.5, 1.2])
OLD = np.tile(np.array([-2.0, -1.0, -3.0, -0.5, -1.5, -2.5], np.float32), (4, 1))
NEW = (OLD + np.log(RATIO)).astype(np.float32)

R_TILDE = [1.240213, -0.563733, -1.014720, 0.338240]
EXPECTED = {  # mode: (Â, loss)
    'none': (R_TILDE, 0.041040),
    'hard': (R_TILDE, -0.029765),
    'mask': (R_TILDE, 0.026608),
    'mask_clamp': ([1.240213, 0.0, -1.014720, 0.338240], -0.114325),
}


def _loss(mode, aggregation='seq_mean_token_mean', new=NEW):
  fatal_mode = fatal.FATAL_MODES.get(mode)
  adv, _ = advantages.group_advantages(REWARDS, FATAL_STEP >= 0, 4, clamp=fatal_mode.clamp_fatal_advantage)
  mask = fatal.loss_mask(GEN, STEP, FATAL_STEP, fatal_mode.mask_fn)
  loss, metrics = losses.grpo_loss(jnp.asarray(new), OLD, adv, mask, aggregation=aggregation)
  return adv, loss, metrics


@pytest.mark.parametrize('mode', sorted(EXPECTED))
def test_advantages_and_loss_equal_hand_values_for_every_fatal_mode(mode):
  adv, loss, _ = _loss(mode)
  want_adv, want_loss = EXPECTED[mode]
  np.testing.assert_allclose(np.asarray(adv), want_adv, atol=1e-5)
  assert float(loss) == pytest.approx(want_loss, abs=1e-5)


@pytest.mark.parametrize('aggregation, want_j', [('seq_mean_token_sum', 0.317945), ('token_mean', 0.090842)])
def test_other_aggregations_hand_values(aggregation, want_j):
  _, loss, metrics = _loss('mask_clamp', aggregation)
  assert float(loss) == pytest.approx(-want_j, abs=1e-5)
  assert float(metrics['num_tokens']) == 14


def test_seq_mean_token_sum_micro_batches_sum_to_full_batch():
  mask = fatal.loss_mask(GEN, STEP, FATAL_STEP, fatal.mask_post_fatal)
  adv = jnp.asarray(R_TILDE)
  full, _ = losses.grpo_loss(NEW, OLD, adv, mask, aggregation='seq_mean_token_sum')
  parts = [losses.grpo_loss(NEW[s], OLD[s], adv[s], mask[s], aggregation='seq_mean_token_sum', num_sequences=4)[0]
           for s in (slice(0, 1), slice(1, 4))]
  assert float(sum(parts)) == pytest.approx(float(full), abs=1e-6)


def _dloss_dlogprob(mode):
  return np.asarray(jax.grad(lambda x: _loss(mode, new=x)[1])(jnp.asarray(NEW)))


def test_mask_mode_negative_advantage_gradient_is_on_the_prefix_only():
  # ∂(−J)/∂log π_t = −(1/G)(1/Σ_t M)·Â·ρ_t on unclipped tokens: row 1, prefix of 2 tokens, Â = −0.563733:
  #   token 0: 0.563733 · 1.1 / (4 · 2) = 0.077513;  token 1: 0.563733 · 0.9 / 8 = 0.063420; the rest 0.
  g = _dloss_dlogprob('mask')[1]
  np.testing.assert_allclose(g, [0.077513, 0.063420, 0, 0, 0, 0], atol=1e-6)
  assert np.all(g[2:] == 0.0)  # exactly zero after the fatal step
  # the kept positive row 3 gets the opposite sign on its prefix
  np.testing.assert_allclose(_dloss_dlogprob('mask')[3], [-0.046508, -0.038052, 0, 0, 0, 0], atol=1e-6)


def test_gradients_per_mode_on_the_fatal_rows():
  g = {mode: _dloss_dlogprob(mode) for mode in EXPECTED}
  assert np.all(g['hard'][[1, 3]] == 0.0)  # hard: nothing from fatal trajectories
  assert np.all(g['mask_clamp'][1] == 0.0)  # mask_clamp: the clamped fatal sample (r̃ < 0) contributes exactly 0
  assert np.all(g['mask_clamp'][3, 2:] == 0.0) and np.all(g['mask_clamp'][3, :2] < 0)  # kept: prefix only
  # none: every emitted token, post-fatal ones included, except where the clipped branch is taken
  # (Â < 0 with ρ = 0.5 < 0.8; Â > 0 with ρ = 1.5 > 1.28): there the objective is constant in ρ
  np.testing.assert_array_equal(g['none'][1] != 0, (GEN[1] > 0) & (RATIO > 0.8))
  np.testing.assert_array_equal(g['none'][3] != 0, (GEN[3] > 0) & (RATIO < 1.28))
  for mode in EXPECTED:  # non-fatal rows are the same in every mode
    np.testing.assert_allclose(g[mode][[0, 2]], g['none'][[0, 2]], atol=1e-7)
