"""The loss's vocabulary projection in chunks of loss positions (`policy.chunked_token_logprobs`): the same log-probs
and gradients as one projection, with the [B, K, vocab] logits never live at once (a compiled program's temporaries
shrink with the chunk)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from osvl_jax.rl import losses
from osvl_jax.train import policy


def _relative(a, b) -> float:
  return float(jnp.abs(a - b).max() / jnp.abs(a).max())


@pytest.mark.parametrize('chunk', [8, 16, 37])
def test_chunks_give_the_one_projection_values_and_gradients(chunk):
  rng = np.random.default_rng(chunk)
  b, k, h, v = 2, 37, 16, 300
  hidden = jnp.asarray(rng.normal(size=(b, k, h)), jnp.float32)
  table = jnp.asarray(rng.normal(size=(v, h)), jnp.float32)
  targets = jnp.asarray(rng.integers(0, v, (b, k)), jnp.int32)
  want = losses.token_logprobs(jnp.einsum('bth,vh->btv', hidden, table) / 0.7, targets)
  got = policy.chunked_token_logprobs(hidden, table, targets, 0.7, chunk)
  assert got.shape == (b, k) and got.dtype == jnp.float32
  # Each position's log-prob is one row of the same matmul and log-softmax: differences are rounding only, far
  # below the log-probs' own size (~ -6 nats).
  assert _relative(want, got) <= 1e-6
  weights = jnp.asarray(rng.normal(size=(b, k)), jnp.float32)
  loss = lambda c: lambda x, w: (policy.chunked_token_logprobs(x, w, targets, 0.7, c) * weights).sum()
  for one, chunked in zip(jax.grad(loss(0), argnums=(0, 1))(hidden, table),
                          jax.grad(loss(chunk), argnums=(0, 1))(hidden, table)):
    assert _relative(one, chunked) <= 1e-5


def test_the_chunked_program_keeps_only_a_chunk_of_logits():
  b, k, h, v, chunk = 1, 2048, 32, 4096, 256
  args = (jax.ShapeDtypeStruct((b, k, h), jnp.float32), jax.ShapeDtypeStruct((v, h), jnp.float32),
          jax.ShapeDtypeStruct((b, k), jnp.int32))

  def temp_bytes(c):
    grad = jax.jit(jax.grad(lambda x, w, t: policy.chunked_token_logprobs(x, w, t, 1.0, c).sum(), argnums=(0, 1)))
    return grad.lower(*args).compile().memory_analysis().temp_size_in_bytes

  logits = b * k * v * 4   # one float32 [B, K, V] copy: 32 MiB
  whole, chunked = temp_bytes(0), temp_bytes(chunk)
  assert whole >= logits                       # the one projection holds the whole logits (at least once)
  assert chunked <= whole / 4 and chunked < logits / 2, (whole, chunked)
