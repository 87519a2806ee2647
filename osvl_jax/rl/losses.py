"""Token log-probabilities, the SFT loss (Eq. 8) and the fatal-aware GRPO loss (Eq. 12).

All functions are pure and jit/grad-friendly. Losses are *normalised by whole-batch counts passed in*
(`num_sequences`, `num_tokens`), so the sum of the losses of the micro-batches (or data-parallel shards) of a
batch equals the loss of the full batch, and so do the gradients (DESIGN.md §6). For GRPO that batch is the
mini-batch of one optimizer step (`train.grpo_update`). Metrics carry counts and sums beside the local ratios so
that they reduce exactly across micro-batches too.

Alignment: `logits[:, t]` predicts `targets[:, t]`; a caller holding a sequence `ids [B, T+1]` passes
`logits(ids[:, :-1])` and `targets = ids[:, 1:]`, and shifts the masks the same way (mask of the target token).
"""

from typing import Callable

import jax
import jax.numpy as jnp

from osvl_jax import registry


def token_logprobs(logits: jax.Array, targets: jax.Array, temperature: float = 1.0) -> jax.Array:
  """log π(targets[b, t] | ·) = log_softmax(logits / temperature)[b, t, targets[b, t]].

  Args:
    logits: float [B, T, V] (any float dtype; computed in float32).
    targets: int [B, T] token ids.
    temperature: sampling temperature the rollout used (1.0 = plain log-softmax).

  Returns:
    float32 [B, T].
  """
  logits = logits.astype(jnp.float32)
  if temperature != 1.0:
    logits = logits / temperature
  picked = jnp.take_along_axis(logits, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
  return picked - jax.nn.logsumexp(logits, axis=-1)


def sft_loss(logprobs: jax.Array, mask: jax.Array,
             num_tokens: jax.Array | float | None = None) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Eq. 8: L_SFT = −Σ_t M_t log π(y_t | ·) / Σ_t M_t, observation tokens masked out (M = M_gen).

  Args:
    logprobs: float32 [B, T] from `token_logprobs`.
    mask: bool or float [B, T], 1 on supervised tokens (the policy's own tokens).
    num_tokens: Σ M over the whole batch when this call sees one micro-batch of it; default Σ M of this call.
      With it, micro-batch losses sum to the full-batch loss.

  Returns:
    (loss f32 scalar, metrics {loss, nll_sum, num_tokens}); 0 when nothing is masked in.
  """
  mask = mask.astype(jnp.float32)
  local_tokens = jnp.sum(mask)
  denom = local_tokens if num_tokens is None else jnp.asarray(num_tokens, jnp.float32)
  nll_sum = -jnp.sum(jnp.where(mask > 0, logprobs, 0.0) * mask)
  loss = nll_sum / jnp.maximum(denom, 1.0)
  return loss, {'loss': loss, 'nll_sum': nll_sum, 'num_tokens': local_tokens}


# ----------------------------------------------------------------------------------------------------------------
# Loss aggregation, registered by name (Tunix style): per-token objective [B, T] -> scalar J.
# ----------------------------------------------------------------------------------------------------------------

# (per_token f32 [B,T], mask f32 [B,T], *, num_sequences, num_tokens, sequence_tokens=None). `sequence_tokens`
# f32 [B,T]: Σ_t M of the sequence each token belongs to, for packed rows holding several sequences (None: each row
# is one sequence).
AggregationFn = Callable[..., jax.Array]

# aggregation name -> AggregationFn. Config `grpo.aggregation`.
AGGREGATIONS: registry.Registry[AggregationFn] = registry.Registry('loss aggregation')


@AGGREGATIONS.register('seq_mean_token_mean')
def seq_mean_token_mean(per_token: jax.Array, mask: jax.Array, *, num_sequences: jax.Array,
                        num_tokens: jax.Array, sequence_tokens: jax.Array | None = None) -> jax.Array:
  """Eq. 12: (1/G) Σ_i (1/Σ_t M_it) Σ_t M_it x_it; G = `num_sequences`; rows with Σ_t M_it = 0 give 0. Packed rows
  (`sequence_tokens` given): each token weighs 1 / Σ M of its own sequence, the same sum sequence by sequence."""
  del num_tokens
  if sequence_tokens is not None:
    return jnp.sum(per_token * mask / jnp.maximum(sequence_tokens, 1.0)) / jnp.maximum(num_sequences, 1.0)
  row_tokens = jnp.sum(mask, axis=-1)
  row_mean = jnp.sum(per_token * mask, axis=-1) / jnp.maximum(row_tokens, 1.0)
  return jnp.sum(jnp.where(row_tokens > 0, row_mean, 0.0)) / jnp.maximum(num_sequences, 1.0)


@AGGREGATIONS.register('seq_mean_token_sum')
def seq_mean_token_sum(per_token: jax.Array, mask: jax.Array, *, num_sequences: jax.Array,
                       num_tokens: jax.Array, sequence_tokens: jax.Array | None = None) -> jax.Array:
  """verl's 'seq-mean-token-sum': (1/G) Σ_i Σ_t M_it x_it, G = `num_sequences` (longer rows weigh more; packed or
  not, the same sum)."""
  del num_tokens, sequence_tokens
  return jnp.sum(per_token * mask) / jnp.maximum(num_sequences, 1.0)


@AGGREGATIONS.register('token_mean')
def token_mean(per_token: jax.Array, mask: jax.Array, *, num_sequences: jax.Array,
               num_tokens: jax.Array, sequence_tokens: jax.Array | None = None) -> jax.Array:
  """DAPO-style global token mean: Σ_it M_it x_it / Σ_it M_it, with Σ M = `num_tokens` of the whole batch."""
  del num_sequences, sequence_tokens
  return jnp.sum(per_token * mask) / jnp.maximum(num_tokens, 1.0)


def kl_k3(logprobs: jax.Array, ref_logprobs: jax.Array) -> jax.Array:
  """Schulman's k3 estimator of KL(π_θ ‖ π_ref) per token: exp(q − p) − (q − p) − 1, q = log π_ref, p = log π_θ."""
  d = ref_logprobs - logprobs
  return jnp.exp(d) - d - 1.0


# How each `grpo_loss` metric reduces over the micro-batches of a batch (`train.metrics.reduce_metrics`): a mean
# weighted by num_tokens, the max, or (every other key: counts, sums, and the loss, already normalised by the whole
# batch) the sum.
GRPO_METRIC_REDUCTIONS = {'clip_frac': 'num_tokens', 'clip_frac_low': 'num_tokens', 'clip_frac_high': 'num_tokens',
                          'approx_kl': 'num_tokens', 'kl': 'num_tokens', 'ratio_mean': 'num_tokens',
                          'ratio_max': 'max'}


def grpo_loss(logprobs: jax.Array, old_logprobs: jax.Array, advantages: jax.Array, loss_mask: jax.Array,
              ref_logprobs: jax.Array | None = None, eps_low: float = 0.2, eps_high: float = 0.28,
              beta: float = 0.0, aggregation: str = 'seq_mean_token_mean',
              num_sequences: jax.Array | float | None = None, num_tokens: jax.Array | float | None = None,
              clip_ratio_c: float | None = None, tis_weights: jax.Array | None = None,
              sequence_tokens: jax.Array | None = None) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Fatal-aware clipped GRPO loss, −J of Eq. 12.

    J = 1/G Σ_i (1/Σ_t M_it) Σ_t M_it [min(ρ_it Â_i, clip(ρ_it, 1−ε_low, 1+ε_high) Â_i) − β KL_k3,it]
    ρ_it = exp(log π_θ − log π_old)

  With M from `fatal.loss_mask` (Eq. 10) and Â from `advantages.group_advantages` (Eq. 11), post-fatal tokens
  and clamped fatal samples get exactly zero gradient.

  Args:
    logprobs: log π_θ of the taken tokens, float32 [B, T] (differentiated).
    old_logprobs: log π_old, float32 [B, T], recomputed by the trainer before the update (no gradient).
    advantages: Â, float32 [B], one per trajectory; or [B, T], each token's trajectory's (packed rows).
    loss_mask: M, float32 [B, T] (Eq. 10).
    ref_logprobs: log π_ref, float32 [B, T], or None (needed when beta > 0).
    eps_low, eps_high: asymmetric clip range (official run: 0.2 / 0.28).
    beta: KL coefficient (official run: 0).
    aggregation: 'seq_mean_token_mean' (Eq. 12: per-trajectory token mean, then mean over the G sequences),
      'token_mean' (DAPO: one token mean over the whole batch) or 'seq_mean_token_sum' (verl: per-trajectory
      token sum, then mean over the G sequences).
    num_sequences: G, the number of sequences in the WHOLE batch this call is a micro-batch of (default B).
    num_tokens: Σ M over the whole batch, used by 'token_mean' (default Σ M of this call).
    clip_ratio_c: optional dual-clip bound (verl's clip_ratio_c, e.g. 3.0): for Â < 0 the token objective is
      floored at clip_ratio_c · Â. None (default) = Eq. 12 exactly.
    tis_weights: optional truncated-importance-sampling weights, float32 [B, T], min(π_old / π_rollout, C) per
      token (verl's TIS; DESIGN.md §6): each token's clipped surrogate is multiplied by its weight (no gradient
      through it; the KL term is not weighted). None = no correction.
    sequence_tokens: packed rows (several trajectories per row, `train.update_rows.pack_batch`): float32 [B, T],
      Σ_t M of the trajectory each token belongs to (the per-trajectory means of Eq. 12 and the sequence count
      read it); None = one trajectory per row.

  Returns:
    (loss = −J, float32 scalar; metrics, float32 scalars):
      loss, pg_objective (J without the KL term),
      num_tokens (Σ M in this call), num_sequences_with_tokens, clipped_tokens, clip_frac (clipped_tokens /
      num_tokens: tokens whose clipped branch is the smaller objective, i.e. the clip is active),
      clip_frac_low (the clip is active on the low side: ρ < 1 − ε_low with Â < 0), clip_frac_high (on the high
      side: ρ > 1 + ε_high with Â > 0; clip_frac = low + high), approx_kl (verl's ppo_kl, the k1 estimate
      mean_t (log π_old − log π_θ) over masked tokens), kl_sum / kl (token-mean k3 KL to the reference, 0 without
      it), ratio_mean, ratio_max. Over micro-batches they reduce by `GRPO_METRIC_REDUCTIONS`.

  Raises:
    ValueError: advantages not [B] or [B, T], tis_weights / sequence_tokens not [B, T], beta > 0 without
      ref_logprobs, or an unknown aggregation.
  """
  logprobs = logprobs.astype(jnp.float32)
  mask = loss_mask.astype(jnp.float32)
  on = mask > 0
  batch = logprobs.shape[0]
  if advantages.shape not in ((batch,), logprobs.shape):
    raise ValueError(f'advantages must be [B]={batch} or [B, T]={logprobs.shape}, got {advantages.shape}')
  if sequence_tokens is not None and sequence_tokens.shape != logprobs.shape:
    raise ValueError(f'sequence_tokens must be [B, T]={logprobs.shape}, got {sequence_tokens.shape}')
  if tis_weights is not None and tis_weights.shape != logprobs.shape:
    raise ValueError(f'tis_weights must be [B, T]={logprobs.shape}, got {tis_weights.shape}')
  if beta != 0.0 and ref_logprobs is None:
    raise ValueError('beta > 0 needs ref_logprobs')
  num_sequences = jnp.asarray(batch if num_sequences is None else num_sequences, jnp.float32)
  local_tokens = jnp.sum(mask)
  num_tokens = local_tokens if num_tokens is None else jnp.asarray(num_tokens, jnp.float32)
  aggregate = AGGREGATIONS.get(aggregation)

  # Masked tokens may hold padding garbage: zero the log-ratio there before exp (no inf, no NaN gradient).
  log_ratio = jnp.where(on, logprobs - jax.lax.stop_gradient(old_logprobs.astype(jnp.float32)), 0.0)
  ratio = jnp.exp(log_ratio)
  adv = jax.lax.stop_gradient(advantages.astype(jnp.float32))
  adv = adv[:, None] if adv.ndim == 1 else adv
  unclipped = ratio * adv
  clipped = jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv
  surrogate = jnp.minimum(unclipped, clipped)
  if clip_ratio_c is not None:
    surrogate = jnp.where(adv < 0, jnp.maximum(surrogate, clip_ratio_c * adv), surrogate)
  if tis_weights is not None:
    surrogate = surrogate * jax.lax.stop_gradient(tis_weights.astype(jnp.float32))
  surrogate = jnp.where(on, surrogate, 0.0)

  if ref_logprobs is not None:
    ref = jax.lax.stop_gradient(ref_logprobs.astype(jnp.float32))
    kl = jnp.where(on, kl_k3(jnp.where(on, logprobs, 0.0), jnp.where(on, ref, 0.0)), 0.0)
  else:
    kl = jnp.zeros_like(logprobs)

  per_seq = None if sequence_tokens is None else jax.lax.stop_gradient(sequence_tokens.astype(jnp.float32))
  pg_objective = aggregate(surrogate, mask, num_sequences=num_sequences, num_tokens=num_tokens,
                           sequence_tokens=per_seq)
  objective = pg_objective
  if beta != 0.0:
    objective = aggregate(surrogate - beta * kl, mask, num_sequences=num_sequences, num_tokens=num_tokens,
                          sequence_tokens=per_seq)
  loss = -objective

  stop = jax.lax.stop_gradient
  clip_active = on & (clipped < unclipped)
  clipped_low = jnp.sum(jnp.where(clip_active & (ratio < 1.0), 1.0, 0.0))
  clipped_high = jnp.sum(jnp.where(clip_active & (ratio > 1.0), 1.0, 0.0))
  clipped_tokens = clipped_low + clipped_high
  kl_sum = jnp.sum(kl * mask)
  denom = jnp.maximum(local_tokens, 1.0)
  metrics = {
      'loss': stop(loss),
      'pg_objective': stop(pg_objective),
      'num_tokens': local_tokens,
      # Packed: each trajectory's tokens weigh 1 / its token count, so they add up to one per trajectory.
      'num_sequences_with_tokens': (jnp.sum(jnp.sum(mask, axis=-1) > 0).astype(jnp.float32) if per_seq is None
                                    else stop(jnp.round(jnp.sum(mask / jnp.maximum(per_seq, 1.0))))),
      'clipped_tokens': stop(clipped_tokens),
      'clip_frac': stop(clipped_tokens / denom),
      'clip_frac_low': stop(clipped_low / denom),
      'clip_frac_high': stop(clipped_high / denom),
      'approx_kl': stop(-jnp.sum(log_ratio * mask) / denom),
      'kl_sum': stop(kl_sum),
      'kl': stop(kl_sum / denom),
      'ratio_mean': stop(jnp.sum(ratio * mask) / denom),
      'ratio_max': stop(jnp.max(jnp.where(on, ratio, 0.0))),
  }
  return loss, metrics
