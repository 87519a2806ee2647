"""Group-relative advantages with one-sided clamping of fatal samples (DESIGN.md §6, paper Eq. 11).

  r̃_i = (r_i − μ_G) / (σ_G + δ)     over all G samples of a prompt, fatal ones included
  Â_i = r̃_i                         non-fatal samples
  Â_i = max(r̃_i, 0)                 fatal samples, when `clamp` (fatal_mode 'mask_clamp'; else Â_i = r̃_i)

Which σ: `std_ddof=1` (the unbiased sample standard deviation) is the default, because the official OpenSearch-VL
trainer is built on verl, whose `compute_grpo_outcome_advantage` takes `torch.std` of the group scores and
`torch.std` is unbiased (Bessel-corrected) by default; δ = 1e-6 is verl's epsilon too. `std_ddof=0` gives the
population std (Tunix's and DeepSeekMath's `std`). For G = 8 the two differ by a factor sqrt(8/7) ≈ 1.069 in the
advantage scale. A group of one sample follows verl: μ = 0, σ = 1, so r̃ = r / (1 + δ).

Estimators are registered by name in `ESTIMATORS` (Tunix style); each maps rewards [N, G] -> r̃ [N, G]:
  grpo     (r − μ_G) / (σ_G + δ)                          (Eq. 11)
  rloo     r_i − mean_{j≠i} r_j    (leave-one-out baseline; verl's RLOO, no std scaling)
  dr_grpo  r − μ_G                 (Dr. GRPO: no std scaling)
The fatal clamp applies to r̃ whatever the estimator.
"""

from typing import Callable

import jax
import jax.numpy as jnp

from osvl_jax import registry

EstimatorFn = Callable[..., jax.Array]  # (rewards f32 [N, G], *, delta, std_ddof) -> r̃ f32 [N, G]

# estimator name -> EstimatorFn. Config `grpo.estimator`.
ESTIMATORS: registry.Registry[EstimatorFn] = registry.Registry('advantage estimator')


@ESTIMATORS.register('grpo')
def grpo_normalized(rewards: jax.Array, *, delta: float = 1e-6, std_ddof: int = 1) -> jax.Array:
  """r̃ = (r − μ_G) / (σ_G + δ) per row of rewards [N, G] (Eq. 11); σ with `std_ddof`."""
  group_size = rewards.shape[-1]
  if group_size == 1:  # verl: mean 0, std 1 for a singleton group
    return rewards / (1.0 + delta)
  mean = jnp.mean(rewards, axis=-1, keepdims=True)
  std = jnp.std(rewards, axis=-1, keepdims=True, ddof=std_ddof)
  return (rewards - mean) / (std + delta)


@ESTIMATORS.register('rloo')
def rloo(rewards: jax.Array, *, delta: float = 1e-6, std_ddof: int = 1) -> jax.Array:
  """r̃_i = r_i − (Σ_j r_j − r_i)/(G − 1) per row of rewards [N, G]; a singleton group keeps r."""
  del delta, std_ddof
  group_size = rewards.shape[-1]
  if group_size == 1:
    return rewards
  total = jnp.sum(rewards, axis=-1, keepdims=True)
  return rewards - (total - rewards) / (group_size - 1)


@ESTIMATORS.register('dr_grpo')
def dr_grpo(rewards: jax.Array, *, delta: float = 1e-6, std_ddof: int = 1) -> jax.Array:
  """r̃ = r − μ_G per row of rewards [N, G] (no std scaling); a singleton group keeps r."""
  del delta, std_ddof
  if rewards.shape[-1] == 1:
    return rewards
  return rewards - jnp.mean(rewards, axis=-1, keepdims=True)


def group_advantages(rewards: jax.Array, is_fatal: jax.Array, group_size: int, clamp: bool = True,
                     estimator: str = 'grpo', delta: float = 1e-6,
                     std_ddof: int = 1) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Per-trajectory advantages Â (Eq. 11) and clamp statistics.

  Args:
    rewards: r(τ), float [N*G]: N prompts × G samples, each group contiguous (rows g*G .. g*G+G-1).
    is_fatal: bool [N*G]: True for fatal trajectories (f_i is not None).
    group_size: G.
    clamp: Â = max(r̃, 0) for fatal samples (Eq. 11): the fatal_mode's `clamp_fatal_advantage` (True only for
      'mask_clamp').
    estimator: name in `ESTIMATORS` ('grpo' | 'rloo' | 'dr_grpo').
    delta: δ in the denominator σ_G + δ.
    std_ddof: 1 = unbiased σ (verl / official code, default), 0 = population σ. See the module docstring.

  Returns:
    advantages: Â, float32 [N*G].
    stats: float32 scalars; counts and sums so that several batches reduce exactly (Tunix weighted metrics):
      num_fatal, num_fatal_clamped (fatal with r̃ < 0), num_fatal_kept (fatal with r̃ >= 0),
      fatal_clamped_frac = num_fatal_clamped / num_fatal, fatal_kept_frac = num_fatal_kept / num_fatal (both 0
      without fatal samples), fatal_clamped_rtilde_sum / _mean (mean r̃ of the
      clamped, before clamping), fatal_kept_rtilde_sum / _mean (mean r̃ of the preserved fatal samples),
      num_zero_std_groups (groups whose rewards are all equal: no learning signal), reward_mean, rtilde_mean.
      The fatal_* numbers are reported whether or not `clamp` applies the clamp (what it would do).

  Raises:
    ValueError: rewards / is_fatal not both [N*G], N*G not a multiple of group_size, an unknown estimator.
  """
  rewards = jnp.asarray(rewards, dtype=jnp.float32)
  is_fatal = jnp.asarray(is_fatal, dtype=bool)
  if rewards.ndim != 1 or is_fatal.shape != rewards.shape:
    raise ValueError(f'rewards {rewards.shape} and is_fatal {is_fatal.shape} must both be [N*G]')
  if group_size < 1 or rewards.shape[0] % group_size:
    raise ValueError(f'{rewards.shape[0]} rewards do not split into groups of {group_size}')

  grouped = rewards.reshape(-1, group_size)
  r_tilde = ESTIMATORS.get(estimator)(grouped, delta=delta, std_ddof=std_ddof).reshape(-1)
  if clamp:
    advantages = jnp.where(is_fatal, jnp.maximum(r_tilde, 0.0), r_tilde)
  else:
    advantages = r_tilde

  f32 = lambda x: jnp.asarray(x, jnp.float32)
  clamped = is_fatal & (r_tilde < 0)
  kept = is_fatal & (r_tilde >= 0)
  num_fatal, num_clamped, num_kept = f32(is_fatal.sum()), f32(clamped.sum()), f32(kept.sum())
  clamped_sum = jnp.sum(jnp.where(clamped, r_tilde, 0.0))
  kept_sum = jnp.sum(jnp.where(kept, r_tilde, 0.0))
  safe_div = lambda a, b: jnp.where(b > 0, a / jnp.maximum(b, 1.0), 0.0)
  stats = {
      'num_fatal': num_fatal,
      'num_fatal_clamped': num_clamped,
      'num_fatal_kept': num_kept,
      'fatal_clamped_frac': safe_div(num_clamped, num_fatal),
      'fatal_kept_frac': safe_div(num_kept, num_fatal),
      'fatal_clamped_rtilde_sum': clamped_sum,
      'fatal_clamped_rtilde_mean': safe_div(clamped_sum, num_clamped),
      'fatal_kept_rtilde_sum': kept_sum,
      'fatal_kept_rtilde_mean': safe_div(kept_sum, num_kept),
      'num_zero_std_groups': f32(jnp.sum(jnp.all(grouped == grouped[:, :1], axis=-1))),
      'reward_mean': jnp.mean(rewards),
      'rtilde_mean': jnp.mean(r_tilde),
  }
  return advantages.astype(jnp.float32), stats
