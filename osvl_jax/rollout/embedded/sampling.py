"""Drawing the next id from a batch of logits (the embedded sampler's last op, `jax_sampler.JaxSampler`).

Pure functions of arrays, jit-able:
  * `sample_logits`: greedy / temperature / nucleus (top-p) draw with some ids banned, returning the ids and their
    log-probabilities at the sampling temperature under the unmasked model (what the trainer recomputes).
  * `categorical`: one draw per row from softmax(logits) by two-level inverse-CDF sampling (2 uniforms per row),
    the distribution of `jax.random.categorical` without its V Gumbel draws per row.
  * `nucleus_threshold`: the smallest logit top-p keeps, by bisection over the float ordering (no sort).
"""

import math
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from osvl_jax.trajectory import tokens as tokens_lib

NEVER_SAMPLED = tokens_lib.VISION_IDS  # ids whose logits are masked to -inf before sampling and argmax.


def _block_size(v: int) -> int:
  """First-level block of `categorical` for V ids: the smallest divisor of V from ceil(sqrt(V)) to 4x that (no
  padding; 1187 for the 151,936-id vocabulary), else ceil(sqrt(V)) (the ids are then padded to a multiple)."""
  root = math.isqrt(max(v - 1, 0)) + 1
  return next((d for d in range(root, 4 * root + 1) if v % d == 0), root)


def categorical(key: jax.Array, logits: jax.Array) -> jax.Array:
  """One draw per row from softmax(logits), by inverse-CDF sampling in two levels: a block of ids
  (`_block_size`, ~sqrt(V)) with probability its mass, then an id inside it with probability its share.

  The distribution of `jax.random.categorical` (Gumbel-max) from 2 uniforms per row instead of V Gumbel draws:
  at the 152k vocabulary and batch 32 that is ~50x less work on XLA:CPU, where the V draws per row dominated a
  decode step. Each level's cumulative sum has ~sqrt(V) terms, so float32 rounding stays ~1e-7 of the mass. Ids
  with logit -inf have probability 0 and are never drawn, also at a rounding edge: each level takes the first
  entry with positive weight whose running sum exceeds the uniform (else its last positive entry).

  Args:
    key: PRNG key.
    logits: float32 [B, V] (a finite maximum per row; -inf = excluded).
  Returns:
    int32 [B] ids.
  """
  b, v = logits.shape
  block = _block_size(v)
  n_blocks = -(-v // block)
  probs = jnp.exp(logits - jnp.max(logits, axis=-1, keepdims=True))           # unnormalised, max 1
  if n_blocks * block != v:
    probs = jnp.pad(probs, ((0, 0), (0, n_blocks * block - v)))
  probs = probs.reshape(b, n_blocks, block)
  u = jax.random.uniform(key, (2, b, 1), jnp.float32)

  def pick(weights, u):  # weights [B, N] >= 0 with a positive entry, u [B, 1] in [0, 1) -> drawn index [B]
    # The first entry WITH POSITIVE WEIGHT whose running sum exceeds u * total. Counting `cdf <= x` instead assumed
    # a cumsum that never decreases; XLA computes it blockwise, so a zero-weight entry can sit above a 1-ulp step.
    cdf = jnp.cumsum(weights, axis=-1)
    hit = (cdf > u * cdf[:, -1:]) & (weights > 0)
    last = weights.shape[-1] - 1 - jnp.argmax(weights[:, ::-1] > 0, axis=-1)
    return jnp.where(jnp.any(hit, axis=-1), jnp.argmax(hit, axis=-1), last)

  j = pick(jnp.sum(probs, axis=-1), u[0])
  inside = jnp.take_along_axis(probs, j[:, None, None], axis=1)[:, 0]
  return (j * block + pick(inside, u[1])).astype(jnp.int32)


def _ordered(x: jax.Array) -> jax.Array:
  """int32 keys ordered as the float32 values `x` are (finite values; -0.0 just below +0.0)."""
  bits = jax.lax.bitcast_convert_type(x, jnp.int32)
  return jnp.where(bits < 0, bits ^ jnp.int32(0x7FFFFFFF), bits)


def _unordered(key: jax.Array) -> jax.Array:
  """The float32 whose `_ordered` key is `key` (its inverse)."""
  return jax.lax.bitcast_convert_type(jnp.where(key < 0, key ^ jnp.int32(0x7FFFFFFF), key), jnp.float32)


def nucleus_threshold(logits: jax.Array, top_p: jax.Array) -> jax.Array:
  """The smallest logit that nucleus (top-p) sampling keeps, per row: min{x among the row's logits : the mass of
  the logits strictly above x < top_p}. Keeping `logits >= threshold` is the nucleus of the sorted definition
  (HF `TopPLogitsWarper`, SGLang's top-p: descending order, keep while the mass before an id is below top_p), ties
  of the threshold kept, the most probable id always.

  Found without sorting V logits (a [B, 152k] sort dominated a decode step on XLA:CPU, ~35x the rest): the mass
  above x falls as x rises, so the threshold is found by bisection over the float32 values in their bit order, 32
  masked sums over V, then snapped to the row's smallest logit at or above the boundary found: the result is
  exactly a logit of the row. Only a mass within float32 rounding of top_p may decide differently from a
  sorted cumulative sum.

  Args:
    logits: float32 [B, V], a finite maximum per row (-inf = excluded: never kept, no mass).
    top_p: float32 scalar in (0, 1].
  Returns:
    float32 [B, 1].
  """
  top = jnp.max(logits, axis=-1, keepdims=True)
  probs = jnp.exp(logits - top)
  probs = probs / jnp.sum(probs, axis=-1, keepdims=True)
  finite_min = jnp.min(jnp.where(jnp.isfinite(logits), logits, top), axis=-1, keepdims=True)
  lo = _ordered(finite_min) - 1   # mass above it: all of it (>= top_p)
  hi = _ordered(top)               # mass above the maximum: 0 (< top_p)

  def step(_, bounds):
    lo, hi = bounds
    mid = (lo >> 1) + (hi >> 1) + (lo & hi & 1)   # floor((lo + hi) / 2) without int32 overflow
    above = jnp.sum(jnp.where(logits > _unordered(mid), probs, 0.0), axis=-1, keepdims=True)
    keep = above < top_p
    return jnp.where(keep, lo, mid), jnp.where(keep, mid, hi)

  _, hi = jax.lax.fori_loop(0, 33, step, (lo, hi))
  # The row's smallest logit at or above the boundary: XLA:CPU compares denormals as zero, so the boundary may be a
  # denormal next to a logit of 0; snapping returns the logit itself.
  return jnp.min(jnp.where(logits >= _unordered(hi), logits, jnp.inf), axis=-1, keepdims=True)


def sample_logits(logits: jax.Array, key: jax.Array, temperature: jax.Array, top_p: jax.Array,
                  greedy: bool, use_top_p: bool, banned: Sequence[int] = NEVER_SAMPLED
                  ) -> tuple[jax.Array, jax.Array]:
  """Draws one id per row and returns it with its log-probability under the distribution it was drawn from.

  Args:
    logits: float32 [B, V].
    key: PRNG key.
    temperature: float32 scalar (> 0 unless `greedy`).
    top_p: float32 scalar in (0, 1]: nucleus mass kept (the most probable allowed id is always kept).
    greedy: static; argmax when True (temperature 0).
    use_top_p: static; skip the nucleus cut (`nucleus_threshold`) when top_p == 1.
    banned: static; ids never drawn (logits -inf before sampling and argmax; ids >= V are ignored). Default:
      the vision ids.
  Returns:
    (ids int32 [B], logprobs float32 [B]) with logprobs = log_softmax(logits / temperature)[ids] (unmasked: the
    banned ids and top-p do not renormalise it; greedy: temperature 1), what `policy.loss_logprobs` recomputes at
    the rollout temperature and what SGLang 0.5.23 returns by default (`layers/sampler.py`), computed as
    (x[id] - max) - log(sum(exp(x - max))) like `jax.nn.log_softmax`, without materialising the [B, V]
    log-probabilities.
  """
  raw = logits.astype(jnp.float32)
  if not greedy:
    raw = raw / temperature   # the distribution sampled from (and reported: the trainer's π_T)
  top = jnp.max(raw, axis=-1, keepdims=True)
  log_z = jnp.log(jnp.sum(jnp.exp(raw - top), axis=-1))
  allowed = np.ones(raw.shape[-1], bool)
  allowed[[int(i) for i in banned if 0 <= int(i) < raw.shape[-1]]] = False
  logits = raw if allowed.all() else jnp.where(allowed, raw, -jnp.inf)  # a constant mask, fused
  if greedy:
    ids = jnp.argmax(logits, axis=-1)
  else:
    scaled = logits
    if use_top_p:
      scaled = jnp.where(scaled >= nucleus_threshold(scaled, top_p), scaled, -jnp.inf)
    ids = categorical(key, scaled)
  ids = ids.astype(jnp.int32)
  return ids, (jnp.take_along_axis(raw, ids[:, None], axis=-1) - top)[:, 0] - log_z
