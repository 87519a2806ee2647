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
The fatal clamp applies to r̃ whatever the estimator. A group of G >= 2 whose rewards are all equal gets r̃ = 0
exactly, whatever the estimator (DESIGN.md §6: no float rounding residue); a singleton group keeps the verl
convention above.
"""

import collections
from typing import Callable, Hashable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

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
  """Per-trajectory advantages Â (Eq. 11) and clamp statistics, for contiguous groups of `group_size` rows.

  Use `group_advantages_by_id` when the rows carry their prompt_id (the trainer does): groups are then formed by
  id, whatever the row order.

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
    advantages: Â, float32 [N*G]. Exactly 0 for every sample of a group of G >= 2 whose rewards are all equal,
      whatever the estimator (float32 rounding of μ_G would otherwise leave a residue r − μ_G that σ_G, the same
      residue, scales up to O(1): [0.9]*8 gave −0.056).
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
  rewards, is_fatal = _check_rows(rewards, is_fatal)
  if group_size < 1 or rewards.shape[0] % group_size:
    raise ValueError(f'{rewards.shape[0]} rewards do not split into groups of {group_size}')
  groups = list(np.arange(rewards.shape[0]).reshape(-1, group_size))
  return _advantages(rewards, is_fatal, groups, clamp, estimator, delta, std_ddof)


def group_advantages_by_id(rewards: jax.Array, is_fatal: jax.Array, group_ids: Sequence[Hashable],
                           clamp: bool = True, estimator: str = 'grpo', delta: float = 1e-6,
                           std_ddof: int = 1, exclude: np.ndarray | None = None
                           ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """`group_advantages` with the groups formed by `group_ids` (the rows' prompt_id), in any row order.

  A group is every row with the same id (DESIGN.md §4: group = all samples of one prompt_id), so the result
  equals computing each group alone, whatever the order of the rows. Groups may differ in size (a prompt drawn
  twice in one batch, across an epoch boundary, gives one group of 2G): each group's μ_G, σ_G (or leave-one-out
  baseline) is over its own samples; a group of one sample follows verl (module docstring).

  Args:
    rewards: r(τ), float [B].
    is_fatal: bool [B].
    group_ids: B hashable ids (prompt_id per row).
    clamp, estimator, delta, std_ddof: as in `group_advantages`.
    exclude: optional bool [B], rows dropped from the advantages (`rollout.env_errors='exclude'`: trajectories cut
      by environment errors, `fatal.cut_by_environment`): each group's μ_G, σ_G (or leave-one-out baseline) is over
      its other rows alone, as if the excluded were never sampled; an excluded row gets Â = r̃ = 0. A group left with
      fewer than 2 rows has no baseline: its remaining row gets Â = 0, as a group whose rewards are all equal (no
      learning signal). Excluded rows and such groups' rows are left out of every statistic.

  Returns:
    (advantages float32 [B], in the rows' order; stats as in `group_advantages`, and with `exclude` also
     num_excluded (rows excluded) and num_groups_without_baseline (groups left with < 2 rows, > 0 of them)).

  Raises:
    ValueError: rewards / is_fatal / group_ids / exclude not all of length B, an unknown estimator.
  """
  rewards, is_fatal = _check_rows(rewards, is_fatal)
  group_ids = list(group_ids)
  if len(group_ids) != rewards.shape[0]:
    raise ValueError(f'{len(group_ids)} group ids for {rewards.shape[0]} rewards')
  excluded = np.zeros(rewards.shape, bool) if exclude is None else np.asarray(exclude, bool)
  if excluded.shape != rewards.shape:
    raise ValueError(f'exclude {excluded.shape} must be [B] = {rewards.shape}')
  rows: dict[Hashable, list[int]] = {}
  for row, gid in enumerate(group_ids):
    if not excluded[row]:
      rows.setdefault(gid, []).append(row)
  groups = [np.asarray(r) for r in rows.values()]
  if exclude is None:
    return _advantages(rewards, is_fatal, groups, clamp, estimator, delta, std_ddof)
  whole = {gid for gid, n in collections.Counter(group_ids).items() if n >= 2}   # groups that had a baseline
  alone = [g for g, gid in zip(groups, rows) if len(g) < 2 and gid in whole]
  groups = [g for g, gid in zip(groups, rows) if len(g) >= 2 or gid not in whole]
  counted = np.zeros(rewards.shape, bool)
  for g in groups:
    counted[g] = True
  advantages, stats = _advantages(rewards, is_fatal, groups, clamp, estimator, delta, std_ddof, counted)
  stats['num_excluded'] = jnp.float32(excluded.sum())
  stats['num_groups_without_baseline'] = jnp.float32(len(alone))
  return advantages, stats


def _check_rows(rewards, is_fatal) -> tuple[np.ndarray, np.ndarray]:
  rewards = np.asarray(rewards, dtype=np.float32)
  is_fatal = np.asarray(is_fatal, dtype=bool)
  if rewards.ndim != 1 or is_fatal.shape != rewards.shape:
    raise ValueError(f'rewards {rewards.shape} and is_fatal {is_fatal.shape} must both be [N*G]')
  return rewards, is_fatal


def _advantages(rewards: np.ndarray, is_fatal: np.ndarray, groups: list[np.ndarray], clamp: bool,
                estimator: str, delta: float, std_ddof: int,
                counted: np.ndarray | None = None) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Shared body: `groups` lists each group's row indices (int [G_k]); groups of one size go through together.
  `counted`: bool [B], the rows in `groups` (None: every row); the others get r̃ = Â = 0 and no part in the
  statistics."""
  estimator_fn = ESTIMATORS.get(estimator)
  r_tilde = np.zeros(rewards.shape, np.float32)
  num_zero_std = 0
  by_size: dict[int, list[np.ndarray]] = {}
  for group_rows in groups:
    by_size.setdefault(len(group_rows), []).append(group_rows)
  for size, size_groups in by_size.items():
    index = np.stack(size_groups)  # [n, size]
    grouped = rewards[index]
    out = np.asarray(estimator_fn(jnp.asarray(grouped), delta=delta, std_ddof=std_ddof), np.float32)
    equal = np.all(grouped == grouped[:, :1], axis=-1)  # [n]: no learning signal
    num_zero_std += int(equal.sum())
    if size > 1:  # exactly 0, not the float32 residue (r − μ_G)/(σ_G + δ) of an inexact mean
      out = np.where(equal[:, None], np.float32(0.0), out)
    r_tilde[index] = out

  if counted is not None:   # rows outside every group: no statistic sees them
    is_fatal = is_fatal & counted
    rewards = rewards[counted]
    mean_rtilde = jnp.mean(jnp.asarray(r_tilde[counted])) if counted.any() else jnp.float32(0.0)
  r_tilde = jnp.asarray(r_tilde)
  is_fatal = jnp.asarray(is_fatal)
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
      'num_zero_std_groups': f32(num_zero_std),
      'reward_mean': jnp.mean(jnp.asarray(rewards)) if rewards.size else jnp.float32(0.0),
      'rtilde_mean': jnp.mean(r_tilde) if counted is None else mean_rtilde,
  }
  return advantages.astype(jnp.float32), stats
