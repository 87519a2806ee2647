"""token_logprobs, the SFT loss (Eq. 8) and the fatal-aware GRPO loss (Eq. 12) (osvl_jax/rl/losses.py)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from osvl_jax.rl import advantages as adv_lib
from osvl_jax.rl import fatal
from osvl_jax.rl import losses

LOG = np.log


def test_token_logprobs_is_log_softmax_gather():
  logits = jnp.log(jnp.array([[[1.0, 2.0, 3.0, 4.0], [4.0, 3.0, 2.0, 1.0]]]))  # softmax = [.1 .2 .3 .4], reversed
  out = losses.token_logprobs(logits.astype(jnp.bfloat16), jnp.array([[2, 0]]))
  assert out.shape == (1, 2) and out.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(losses.token_logprobs(logits, jnp.array([[2, 0]]))),
                             [[LOG(0.3), LOG(0.4)]], rtol=1e-6)
  # temperature 2: softmax(log p / 2) ∝ sqrt(p) -> sqrt(.3) / Σ sqrt(.1 .2 .3 .4)
  p = np.sqrt([0.1, 0.2, 0.3, 0.4])
  np.testing.assert_allclose(np.asarray(losses.token_logprobs(logits, jnp.array([[2, 0]]), 2.0))[0, 0],
                             LOG(p[2] / p.sum()), rtol=1e-6)


def test_sft_loss_is_token_mean_over_mask():
  logprobs = jnp.array([[-1.0, -2.0, -3.0], [-0.5, -9.0, -9.0]])
  mask = jnp.array([[1, 1, 0], [1, 0, 0]])
  loss, m = losses.sft_loss(logprobs, mask)
  assert float(loss) == pytest.approx((1.0 + 2.0 + 0.5) / 3)  # 1.166667
  assert float(m['num_tokens']) == 3
  # micro-batches with the global token count sum to the full loss
  l0, _ = losses.sft_loss(logprobs[:1], mask[:1], num_tokens=3)
  l1, _ = losses.sft_loss(logprobs[1:], mask[1:], num_tokens=3)
  assert float(l0 + l1) == pytest.approx(float(loss))
  zero, _ = losses.sft_loss(logprobs, jnp.zeros_like(mask))
  assert float(zero) == 0.0


# Hand example for Eq. 12, ε_low = 0.2, ε_high = 0.28 (clip range [0.8, 1.28]):
#   row 0: Â = +1, ratios [1.5, 0.5, (masked)]  -> min(1.5, 1.28) = 1.28 (clipped), min(0.5, 0.8) = 0.5
#          token mean = (1.28 + 0.5) / 2 = 0.89
#   row 1: Â = −2, ratios [1.5, 0.5, 1.1]       -> min(−3, −2.56) = −3, min(−1, −1.6) = −1.6 (clipped),
#          min(−2.2, −2.2) = −2.2;  token mean = −6.8 / 3 = −2.266667
#   J = (0.89 − 2.266667) / 2 = −0.688333, loss = 0.688333; clipped tokens 2 of 5.
OLD = jnp.zeros((2, 3))
NEW = jnp.array([[LOG(1.5), LOG(0.5), 7.0], [LOG(1.5), LOG(0.5), LOG(1.1)]], jnp.float32)
ADV = jnp.array([1.0, -2.0])
MASK = jnp.array([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])


def test_grpo_loss_hand_example():
  loss, m = losses.grpo_loss(NEW, OLD, ADV, MASK)
  assert float(loss) == pytest.approx(0.688333, abs=1e-5)
  assert float(m['clipped_tokens']) == 2
  assert float(m['clip_frac']) == pytest.approx(0.4)
  assert float(m['num_tokens']) == 5
  assert float(m['kl']) == 0.0


def test_grpo_loss_normalises_by_given_num_sequences():
  loss, _ = losses.grpo_loss(NEW, OLD, ADV, MASK, num_sequences=4)
  assert float(loss) == pytest.approx((2.266667 - 0.89) / 4, abs=1e-5)  # 0.344167


def test_grpo_loss_token_mean_aggregation():
  # Σ surrogate = 1.28 + 0.5 − 3 − 1.6 − 2.2 = −5.02 over 5 tokens
  loss, _ = losses.grpo_loss(NEW, OLD, ADV, MASK, aggregation='token_mean')
  assert float(loss) == pytest.approx(5.02 / 5, abs=1e-5)


def test_zero_mask_row_contributes_zero_and_no_nan():
  new = jnp.concatenate([NEW, jnp.full((1, 3), 50.0)])
  old = jnp.concatenate([OLD, jnp.full((1, 3), -1e30)])  # garbage under a zero mask
  mask = jnp.concatenate([MASK, jnp.zeros((1, 3))])
  adv = jnp.array([1.0, -2.0, 3.0])
  loss, m = losses.grpo_loss(new, old, adv, mask)
  assert float(loss) == pytest.approx((2.266667 - 0.89) / 3, abs=1e-5)  # 3 sequences, one empty
  assert float(m['num_sequences_with_tokens']) == 2
  grad = jax.grad(lambda x: losses.grpo_loss(x, old, adv, mask)[0])(new)
  assert np.all(np.isfinite(np.asarray(grad)))
  assert np.all(np.asarray(grad)[2] == 0.0)


def test_kl_k3_and_beta():
  # d = log π_ref − log π_θ = log 2: k3 = e^d − d − 1 = 2 − 0.693147 − 1 = 0.306853
  assert float(losses.kl_k3(jnp.array(0.0), jnp.array(LOG(2.0)))) == pytest.approx(0.306853, abs=1e-6)
  # one token, ρ = 1, Â = 1: J = 1 − 0.1 · 0.306853 = 0.969315
  loss, m = losses.grpo_loss(jnp.zeros((1, 1)), jnp.zeros((1, 1)), jnp.ones((1,)), jnp.ones((1, 1)),
                             ref_logprobs=jnp.full((1, 1), LOG(2.0)), beta=0.1)
  assert float(loss) == pytest.approx(-0.969315, abs=1e-6)
  assert float(m['kl']) == pytest.approx(0.306853, abs=1e-6)
  with pytest.raises(ValueError):
    losses.grpo_loss(jnp.zeros((1, 1)), jnp.zeros((1, 1)), jnp.ones((1,)), jnp.ones((1, 1)), beta=0.1)


def test_dual_clip_floors_negative_advantage():
  # ρ = 5, Â = −1: min(−5, −1.28) = −5; dual clip c = 3 -> max(−5, −3) = −3
  args = (jnp.full((1, 1), LOG(5.0)), jnp.zeros((1, 1)), -jnp.ones((1,)), jnp.ones((1, 1)))
  assert float(losses.grpo_loss(*args)[0]) == pytest.approx(5.0, abs=1e-5)
  assert float(losses.grpo_loss(*args, clip_ratio_c=3.0)[0]) == pytest.approx(3.0, abs=1e-5)


# ---------------------------------------------------------------------------------------------------------------
# Gradients through token_logprobs: a group of G = 4 with the rewards of test_advantages.py.
#   rewards [1.0, 0.2, 0.0, 0.6]; row 1 fatal at step 1 with r̃ = −0.56 (clamped); row 3 fatal at step 1 with
#   r̃ = +0.34 (kept). Tokens: 2 prompt tokens (step −1), then per step one emitted + one observation token.
# ---------------------------------------------------------------------------------------------------------------
B, T, V = 4, 8, 11
STEP = np.tile(np.array([-1, -1, 0, 0, 1, 1, 2, 2], np.int32), (B, 1))
GEN = np.tile(np.array([0, 0, 1, 0, 1, 0, 1, 0], np.float32), (B, 1))
FATAL_STEP = np.array([-1, 1, -1, 1], np.int32)
REWARDS = np.array([1.0, 0.2, 0.0, 0.6], np.float32)
POST_FATAL = STEP >= 1  # for rows 1 and 3


@functools.cache
def _grads(mode):
  k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
  logits = jax.random.normal(k1, (B, T, V))
  targets = jax.random.randint(k2, (B, T), 0, V)
  old = losses.token_logprobs(logits + 0.1 * jax.random.normal(k3, (B, T, V)), targets)
  fatal_mode = fatal.FATAL_MODES.get(mode)
  mask = fatal.loss_mask(GEN, STEP, FATAL_STEP, fatal_mode.mask_fn)
  adv, _ = adv_lib.group_advantages(REWARDS, FATAL_STEP >= 0, B, fatal_mode.clamp_fatal_advantage)
  loss_fn = lambda x: losses.grpo_loss(losses.token_logprobs(x, targets), old, adv, mask)[0]
  return np.asarray(jax.jit(jax.grad(loss_fn))(logits))


def _token_has_grad(grad):
  return np.any(grad != 0.0, axis=-1)  # [B, T]


def test_mask_clamp_post_fatal_tokens_get_exactly_zero_gradient():
  g = _grads('mask_clamp')
  for row in (1, 3):
    assert np.all(g[row][POST_FATAL[row]] == 0.0)
  # the kept fatal sample still learns from its pre-fatal emitted token (step 0)
  assert _token_has_grad(g)[3, 2]


def test_mask_clamp_fatal_sample_below_mean_gets_exactly_zero_gradient():
  g = _grads('mask_clamp')
  assert np.all(g[1] == 0.0)
  # non-fatal rows: gradient exactly on their emitted tokens
  np.testing.assert_array_equal(_token_has_grad(g)[[0, 2]], GEN[[0, 2]] > 0)


def test_mask_mode_keeps_negative_pre_fatal_gradient():
  g = _grads('mask')
  assert np.all(g[1][POST_FATAL[1]] == 0.0)
  assert _token_has_grad(g)[1, 2]  # Eq. 10 without the clamp: negative Â pushes the pre-fatal token down


def test_hard_mode_zeroes_whole_fatal_trajectories():
  g = _grads('hard')
  assert np.all(g[[1, 3]] == 0.0)
  assert _token_has_grad(g)[0, 2]


def test_none_mode_trains_post_fatal_tokens():
  has = _token_has_grad(_grads('none'))
  np.testing.assert_array_equal(has, GEN > 0)


@pytest.mark.parametrize('aggregation', ['seq_mean_token_mean', 'token_mean'])
def test_micro_batches_sum_to_full_batch_loss_and_grad(aggregation):
  k1, k2, k3, k4 = jax.random.split(jax.random.key(1), 4)
  n, t, v = 8, 6, 7
  logits = jax.random.normal(k1, (n, t, v))
  targets = jax.random.randint(k2, (n, t), 0, v)
  old = losses.token_logprobs(logits + 0.3 * jax.random.normal(k3, (n, t, v)), targets)
  adv = jax.random.normal(k4, (n,))
  mask = (jnp.arange(t)[None, :] < jnp.array([6, 1, 3, 0, 5, 2, 4, 6])[:, None]).astype(jnp.float32)
  total_tokens = jnp.sum(mask)

  def loss_fn(x, rows):
    sl = slice(*rows)
    return losses.grpo_loss(losses.token_logprobs(x, targets[sl]), old[sl], adv[sl], mask[sl],
                            aggregation=aggregation, num_sequences=n, num_tokens=total_tokens)[0]

  value_and_grad = jax.jit(jax.value_and_grad(loss_fn), static_argnums=1)
  full, full_grad = value_and_grad(logits, (0, 8))
  a, grad_a = value_and_grad(logits[:4], (0, 4))
  b, grad_b = value_and_grad(logits[4:], (4, 8))
  assert float(a + b) == pytest.approx(float(full), abs=1e-6)
  np.testing.assert_allclose(np.concatenate([grad_a, grad_b]), full_grad, atol=1e-7)


@pytest.mark.parametrize('aggregation', ['seq_mean_token_mean', 'seq_mean_token_sum', 'token_mean'])
def test_packed_rows_give_the_unpacked_loss_metrics_and_gradient(aggregation):
  """Packed rows (several trajectories per row): per-token advantages and each token's trajectory size
  (`sequence_tokens`) give the loss, gradient and metrics of one trajectory per row, every aggregation; a trajectory
  masked out entirely (fatal at step 0) still counts in G and nowhere else."""
  rng = np.random.default_rng(3)
  lengths, k = [4, 2, 3, 3], 5
  new = rng.normal(-2.0, 0.5, (4, k)).astype(np.float32)
  old = (new + rng.normal(0.0, 0.3, (4, k))).astype(np.float32)
  adv = np.array([1.3, -0.4, 0.0, 0.8], np.float32)
  mask = np.zeros((4, k), np.float32)
  for i, n in enumerate(lengths):
    mask[i, :n] = rng.integers(0, 2, n) if i != 3 else 0.0     # row 3: nothing in the loss
  mask[0, 0] = mask[1, 0] = mask[2, 0] = 1.0
  rows = [[0, 1], [2, 3]]                                         # packed: 6 entries per row
  kp = 6
  packed = {name: np.zeros((2, kp), np.float32) for name in ('new', 'old', 'adv', 'mask', 'seq')}
  for r, members in enumerate(rows):
    at = 0
    for i in members:
      n = lengths[i]
      for name, value in (('new', new[i, :n]), ('old', old[i, :n]), ('adv', adv[i]), ('mask', mask[i, :n]),
                          ('seq', mask[i].sum())):
        packed[name][r, at:at + n] = value
      at += n
  counts = dict(num_sequences=4.0, num_tokens=float(mask.sum()))
  plain = lambda lp: losses.grpo_loss(lp, old, jnp.asarray(adv), mask, aggregation=aggregation, **counts)  # noqa: E731
  packed_fn = lambda lp: losses.grpo_loss(  # noqa: E731
      lp, packed['old'], packed['adv'], packed['mask'], aggregation=aggregation, sequence_tokens=packed['seq'],
      **counts)
  (loss_u, m_u), g_u = jax.value_and_grad(plain, has_aux=True)(jnp.asarray(new))
  (loss_p, m_p), g_p = jax.value_and_grad(packed_fn, has_aux=True)(jnp.asarray(packed['new']))
  scale = float(np.mean(np.abs(adv)))     # the loss is a sum of ρ Â terms of this size
  assert float(loss_p) == pytest.approx(float(loss_u), abs=1e-6 * scale)
  for key in ('num_tokens', 'num_sequences_with_tokens', 'clipped_tokens', 'clip_frac', 'approx_kl', 'ratio_max'):
    assert float(m_p[key]) == pytest.approx(float(m_u[key]), rel=1e-6, abs=1e-7), key
  assert float(m_p['num_sequences_with_tokens']) == 3.0
  for r, members in enumerate(rows):   # each trajectory's gradient, entry by entry
    at = 0
    for i in members:
      n = lengths[i]
      np.testing.assert_allclose(g_p[r, at:at + n], g_u[i, :n], rtol=1e-6, atol=1e-8)
      at += n
