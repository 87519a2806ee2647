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


def _grad_temp_bytes(b, k, h, v, chunk) -> int:
  """Temporary bytes of the compiled gradient of `chunked_token_logprobs` at [b, k, h] hidden states, vocab v."""
  args = (jax.ShapeDtypeStruct((b, k, h), jnp.float32), jax.ShapeDtypeStruct((v, h), jnp.float32),
          jax.ShapeDtypeStruct((b, k), jnp.int32))
  grad = jax.jit(jax.grad(lambda x, w, t: policy.chunked_token_logprobs(x, w, t, 1.0, chunk).sum(), argnums=(0, 1)))
  return grad.lower(*args).compile().memory_analysis().temp_size_in_bytes


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
  logits = b * k * v * 4   # one float32 [B, K, V] copy: 32 MiB
  whole, chunked = _grad_temp_bytes(b, k, h, v, 0), _grad_temp_bytes(b, k, h, v, chunk)
  assert whole >= logits                       # the one projection holds the whole logits (at least once)
  assert chunked <= whole / 4 and chunked < logits / 2, (whole, chunked)


def test_the_chunk_bounds_the_positions_of_one_batch_shard_whatever_the_rows():
  """8 rows x 512 positions under a chunk of 512: each projection holds 64 positions of every row (8 x 64 = 512), so
  the gradient's temporaries stay near those of one 512-position row, not 8 times them (the learning bench's GRPO
  update, 8 rows x 1,024 positions, ran out of memory when the chunk counted one row's positions)."""
  b, k, h, v, chunk = 8, 512, 32, 4096, 512
  whole, chunked = _grad_temp_bytes(b, k, h, v, 0), _grad_temp_bytes(b, k, h, v, chunk)
  logits = b * k * v * 4   # one float32 [B, K, V] copy: 64 MiB
  assert whole >= logits
  assert chunked <= whole / 4 and chunked < logits / 2, (whole, chunked)   # one projection: chunked == whole


def test_the_rows_per_shard_come_from_the_enclosing_mesh():
  """Under `sharding.use_mesh` with the 8 rows split over 8 data devices, each device projects its one row's 512
  positions at once (no loop); with one shard (no mesh) the same call loops over 8 chunks of 64."""
  from osvl_jax.models.qwen3_vl import sharding
  if jax.device_count() < 8:
    pytest.skip('needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)')
  b, k, h, v = 8, 512, 8, 64
  args = (jnp.zeros((b, k, h)), jnp.zeros((v, h)), jnp.zeros((b, k), jnp.int32))
  f = lambda x, w, t: policy.chunked_token_logprobs(x, w, t, 1.0, 512)
  assert 'scan' in str(jax.make_jaxpr(f)(*args))
  mesh = jax.make_mesh((8, 1, 1, 1), sharding.MESH_AXES)
  with sharding.use_mesh(mesh):
    assert 'scan' not in str(jax.make_jaxpr(f)(*args))
  assert 'scan' not in str(jax.make_jaxpr(lambda *a: policy.chunked_token_logprobs(*a, 1.0, 512, shards=8))(*args))


def test_chunks_are_balanced():
  """K = 37 positions, 16 per row and chunk: 3 chunks of 13 positions (2 padded per row), not 3 of 16 (11)."""
  args = (jnp.zeros((2, 37, 16)), jnp.zeros((300, 16)), jnp.zeros((2, 37), jnp.int32))
  jaxpr = str(jax.make_jaxpr(lambda *a: policy.chunked_token_logprobs(*a, 0.7, 32))(*args))
  assert 'f32[3,2,13,16]' in jaxpr and 'f32[3,2,16,16]' not in jaxpr
