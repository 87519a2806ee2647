"""`sampling`: the draw of the next id (two-level inverse-CDF categorical, temperature, top-p, banned ids)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from osvl_jax.rollout.embedded import sampling

DRAWS = 20000


def _chi2(ids, probs):
  """Chi-square of the id counts against probs [V] (cells with expected count >= 5; the rest pooled)."""
  expected = probs * len(ids)
  observed = np.bincount(ids, minlength=len(probs)).astype(np.float64)
  big = expected >= 5
  obs = np.append(observed[big], observed[~big].sum())
  exp = np.append(expected[big], expected[~big].sum())
  keep = exp > 0
  return float(np.sum((obs[keep] - exp[keep]) ** 2 / exp[keep])), int(keep.sum()) - 1


@pytest.mark.parametrize('v', [37, 60])  # 37: prime, ids padded to 6 blocks of 7; 60: 6 blocks of 10, no padding
def test_categorical_draws_follow_softmax_and_never_masked_ids(v):
  rng = np.random.default_rng(v)
  logits = (2.0 * rng.standard_normal(v)).astype(np.float32)
  logits[[0, v // 2, v - 1]] = -np.inf   # masked ids, also the first and the last (the rounding edge's clamp)
  keys = jax.random.split(jax.random.key(0), DRAWS)
  ids = np.asarray(jax.jit(jax.vmap(lambda k: sampling.categorical(k, jnp.asarray(logits)[None])[0]))(keys))
  assert not np.isin(ids, [0, v // 2, v - 1]).any()
  probs = np.exp(logits.astype(np.float64) - logits[np.isfinite(logits)].max())
  probs /= probs.sum()
  chi2, dof = _chi2(ids, probs)
  assert chi2 < dof + 4.0 * np.sqrt(2.0 * dof)   # ~p 0.001; a sampler off by one id or block fails by far
  assert _chi2(ids, np.roll(probs, 1))[0] > dof + 4.0 * np.sqrt(2.0 * dof)


def test_block_size_divides_the_real_vocabulary():
  assert sampling._block_size(151936) == 1187   # 128 blocks, no padding at Qwen's vocabulary
  assert sampling._block_size(37) == 7          # prime: ceil(sqrt(37)), padded


def test_sample_logits_returns_the_log_softmax_at_its_temperature_of_the_draw():
  """Sampled at T: log_softmax(logits / T) of the id, before top-p and the ban (SGLang 0.5.23's default, what the
  trainer recomputes at grpo.temperature); greedy: temperature 1. Log-probs of size ~10 in float32: atol 1e-5."""
  rng = np.random.default_rng(0)
  logits = jnp.asarray(5.0 * rng.standard_normal((4, 1000)), jnp.float32)
  for t in (0.7, 1.0, 1.3):
    for greedy, use_top_p in [(True, False), (False, False), (False, True)]:
      ref = np.asarray(jax.nn.log_softmax(np.float64(logits) / (1.0 if greedy else t), axis=-1))
      ids, lp = sampling.sample_logits(logits, jax.random.key(1), jnp.float32(t), jnp.float32(0.9), greedy,
                                       use_top_p, banned=(3, 5))
      ids = np.asarray(ids)
      np.testing.assert_allclose(np.asarray(lp), ref[np.arange(4), ids], atol=1e-5, rtol=0)
      assert not np.isin(ids, (3, 5)).any()
      if not greedy and t != 1.0:   # not the untempered one (a sampler that reported T = 1 fails here)
        untempered = np.asarray(jax.nn.log_softmax(logits, axis=-1))[np.arange(4), ids]
        assert np.abs(np.asarray(lp) - untempered).max() > 0.1


def test_sampling_draws_from_the_model_distribution():
  """Top-p=1 sampling frequencies follow softmax(logits / T); top-p removes the tail."""
  logits = jnp.log(jnp.asarray([[0.5, 0.3, 0.15, 0.05]], jnp.float32))
  keys = jax.random.split(jax.random.key(0), 4000)
  draw = jax.vmap(lambda k, tp: sampling.sample_logits(logits, k, 1.0, tp, False, True)[0][0],
                  in_axes=(0, None))
  ids = np.asarray(draw(keys, 1.0))
  np.testing.assert_allclose(np.bincount(ids, minlength=4) / len(ids), [0.5, 0.3, 0.15, 0.05], atol=0.03)
  ids = np.asarray(draw(keys, 0.7))  # nucleus {0, 1}: mass before id 2 is 0.8 >= 0.7
  assert set(ids.tolist()) == {0, 1}
  tok, lp = sampling.sample_logits(logits, keys[0], 0.5, 0.7, False, True)  # warped draw: p_T, before top-p
  tempered = np.asarray([0.5, 0.3, 0.15, 0.05]) ** 2 / np.sum(np.asarray([0.5, 0.3, 0.15, 0.05]) ** 2)
  np.testing.assert_allclose(np.exp(lp), tempered[np.asarray(tok)], rtol=1e-5)


def test_sample_logits_bans_ids_in_greedy_top_p_and_plain_sampling():
  logits = jnp.asarray([[9.0, 1.0, 0.5, 0.0]], jnp.float32)
  keys = jax.random.split(jax.random.key(0), 200)
  for greedy, use_top_p in [(True, False), (False, False), (False, True)]:
    ids = jax.vmap(lambda k: sampling.sample_logits(logits, k, 1.0, 0.4, greedy, use_top_p, banned=(0,))[0][0])(
        keys)
    assert 0 not in set(np.asarray(ids).tolist())
    if greedy or use_top_p:
      assert set(np.asarray(ids).tolist()) == {1}  # the best allowed id (the nucleus of the allowed ids)


def test_zero_weight_ids_are_never_drawn_even_where_the_cumsum_rounds_up(monkeypatch):
  """XLA's blockwise cumsum is not exactly monotone: a zero-weight (banned / outside top-p) id can sit above a
  1-ulp step of the running sum. Simulated here by a cumsum that steps at the banned id; a uniform landing in that
  step must still draw the next allowed id, never the banned one."""
  import jax
  import jax.numpy as jnp
  from osvl_jax.rollout.embedded import sampling
  logits = jnp.zeros((1, 9), jnp.float32).at[0, 4].set(-jnp.inf)  # 9 ids (block 3), id 4 banned
  real = jnp.cumsum

  def rounding_cumsum(x, axis=-1):
    out = real(x, axis=axis)
    if x.shape[-1] == 3 and x.ndim == 2:  # inside block 1 (ids 3, 4, 5): a spurious step at the banned id 4
      out = out.at[:, 1:].add(jnp.float32(1e-3))
    return out

  monkeypatch.setattr(jnp, 'cumsum', rounding_cumsum)
  # u[0] picks block 1 (mass 2 of 8 ... cdf 3, 5, 8); u[1] lands inside the spurious step after id 3.
  monkeypatch.setattr(jax.random, 'uniform', lambda key, shape, dtype=jnp.float32: jnp.asarray(
      [[[0.5]], [[(1.0 + 5e-4) / (2.0 + 1e-3)]]], jnp.float32))
  assert int(sampling.categorical(jax.random.key(0), logits)[0]) == 5


def _sorted_nucleus_threshold(logits: np.ndarray, top_p: float) -> tuple[np.ndarray, np.ndarray]:
  """The sorted definition in float64 (HF TopPLogitsWarper): descending order, keep while the mass before an id is
  below top_p; per row the smallest kept logit and the distance of the nearest mass-before to top_p."""
  s = np.sort(logits.astype(np.float64), axis=-1)[:, ::-1]
  probs = np.exp(s - s[:, :1])
  probs /= probs.sum(-1, keepdims=True)
  before = np.cumsum(probs, -1) - probs
  return np.array([row[b < top_p].min() for row, b in zip(s, before)]), np.abs(before - top_p).min(-1)


def test_the_nucleus_threshold_is_the_sorted_definitions_smallest_kept_logit():
  """Bisection over the float order, no sort: the same smallest kept logit as sorting (ties, -inf ids, peaked and
  flat rows), away from masses within float32 rounding of top_p."""
  rng = np.random.default_rng(0)
  compared = 0
  for trial in range(24):
    logits = (rng.standard_normal((6, 3000)) * [0.1, 1.0, 3.0, 10.0][trial % 4]).astype(np.float32)
    if trial % 3 == 0:
      logits[:, :50] = -np.inf
    if trial % 2 == 0:
      logits = np.round(logits)   # ties
    top_p = [0.1, 0.5, 0.8, 0.95][trial % 4 - 1]
    got = np.asarray(sampling.nucleus_threshold(jnp.asarray(logits), jnp.float32(top_p)))[:, 0]
    want, margin = _sorted_nucleus_threshold(logits, top_p)
    clear = margin > 1e-5
    np.testing.assert_array_equal(got[clear], want[clear].astype(np.float32))
    compared += int(clear.sum())
  assert compared >= 100   # of 144 rows
  # by hand: probabilities 0.5, 0.3, 0.15, 0.05: top_p 0.7 keeps {0.5, 0.3}; 0.85 also 0.15; 0.5 only the first
  logits = jnp.log(jnp.asarray([[0.15, 0.5, 0.05, 0.3]], jnp.float32))
  for top_p, kept in ((0.7, 0.3), (0.85, 0.15), (0.5, 0.5), (0.3, 0.5)):
    np.testing.assert_allclose(np.exp(np.asarray(sampling.nucleus_threshold(logits, jnp.float32(top_p)))), [[kept]],
                               rtol=1e-6)
