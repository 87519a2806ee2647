"""grpo_loss's clip statistics by side, approx_kl (verl's ppo_kl) and truncated importance sampling weights
(osvl_jax/rl/losses.py; DESIGN.md §6)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from osvl_jax.rl import losses

LOG = np.log

# The hand example of test_losses.py, ε_low = 0.2, ε_high = 0.28 (clip range [0.8, 1.28]):
#   row 0: Â = +1, ρ = [1.5, 0.5, (masked)]: 1.5 -> clipped to 1.28 (HIGH side active); 0.5 -> unclipped 0.5 is
#          the smaller (clip inactive).
#   row 1: Â = −2, ρ = [1.5, 0.5, 1.1]: 1.5 -> unclipped −3 is the smaller (inactive); 0.5 -> clipped −1.6 (LOW
#          side active); 1.1 -> inside the range.
#   5 tokens: clip_frac_low = 1/5, clip_frac_high = 1/5, clip_frac = 2/5.
#   approx_kl = mean(old − new) = −(2 log 1.5 + 2 log 0.5 + log 1.1) / 5 = 0.0960108.
OLD = jnp.zeros((2, 3))
NEW = jnp.array([[LOG(1.5), LOG(0.5), 7.0], [LOG(1.5), LOG(0.5), LOG(1.1)]], jnp.float32)
ADV = jnp.array([1.0, -2.0])
MASK = jnp.array([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])


def test_clip_fractions_by_side_and_approx_kl():
  _, m = losses.grpo_loss(NEW, OLD, ADV, MASK)
  assert float(m['clip_frac_low']) == pytest.approx(0.2)
  assert float(m['clip_frac_high']) == pytest.approx(0.2)
  assert float(m['clip_frac']) == pytest.approx(0.4)
  assert float(m['approx_kl']) == pytest.approx(0.0960108, abs=1e-6)
  assert float(m['ratio_max']) == pytest.approx(1.5, abs=1e-6)  # the masked ρ = e^7 does not count
  # ε_low = 0.6: the range [0.4, 1.28] holds ρ = 0.5, so only the low side goes inactive
  _, m = losses.grpo_loss(NEW, OLD, ADV, MASK, eps_low=0.6)
  assert float(m['clip_frac_low']) == 0.0 and float(m['clip_frac_high']) == pytest.approx(0.2)


def test_rho_one_has_no_clipping_and_zero_approx_kl():
  _, m = losses.grpo_loss(NEW, NEW, ADV, MASK)
  for key in ('clip_frac', 'clip_frac_low', 'clip_frac_high', 'approx_kl'):
    assert float(m[key]) == 0.0, key
  assert float(m['ratio_mean']) == 1.0


# TIS weights w (the masked entry 9.0 is garbage and must not count):
#   row 0: surrogates [1.28, 0.5] × [2, 0.5] = [2.56, 0.25]           -> token mean 1.405
#   row 1: surrogates [−3, −1.6, −2.2] × [1, 3, 0.25] = [−3, −4.8, −0.55] -> token mean −8.35 / 3 = −2.783333
#   J = (1.405 − 2.783333) / 2 = −0.689167, loss = 0.689167
TIS = jnp.array([[2.0, 0.5, 9.0], [1.0, 3.0, 0.25]], jnp.float32)


def test_tis_weights_scale_each_token_of_the_loss():
  loss, m = losses.grpo_loss(NEW, OLD, ADV, MASK, tis_weights=TIS)
  assert float(loss) == pytest.approx(0.689167, abs=1e-5)
  assert float(m['clip_frac']) == pytest.approx(0.4)  # clip statistics are those of ρ, not of the weights
  unweighted, _ = losses.grpo_loss(NEW, OLD, ADV, MASK, tis_weights=jnp.ones_like(TIS))
  assert float(unweighted) == pytest.approx(0.688333, abs=1e-5)  # weights of 1 = Eq. 12


def test_tis_weights_carry_no_gradient_and_scale_the_token_gradient():
  grad_w = jax.grad(lambda w: losses.grpo_loss(NEW, OLD, ADV, MASK, tis_weights=w)[0])(TIS)
  assert np.all(np.asarray(grad_w) == 0.0)
  grad = np.asarray(jax.grad(lambda x: losses.grpo_loss(x, OLD, ADV, MASK, tis_weights=TIS)[0])(NEW))
  # row 0 token 1: unclipped branch, ∂(−w ρ Â / (2 rows · 2 tokens)) / ∂log π = −0.5 · 0.5 · 1 / 4 = −0.0625
  assert grad[0, 1] == pytest.approx(-0.0625, abs=1e-6)
  assert grad[0, 0] == 0.0 and grad[0, 2] == 0.0  # clipped (high side) and masked tokens: no gradient


def test_tis_weights_of_another_shape_are_refused():
  with pytest.raises(ValueError, match='tis_weights'):
    losses.grpo_loss(NEW, OLD, ADV, MASK, tis_weights=TIS[:, :2])
