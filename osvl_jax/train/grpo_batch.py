"""A GRPO rollout batch -> the update's arrays (Sec. 4.2, Eq. 9-11): rewards (`score_batch`), group advantages and
the post-fatal loss mask at the config's compiled shapes (`prepare_batch`, `check_budgets`), and the per-step
rollout metrics (`rollout_metrics`). The trainer loop is `grpo.train`; the update itself `grpo_update`.
"""

import collections

import jax
import ml_collections
import numpy as np
from absl import logging

from osvl_jax import config_checks as checks
from osvl_jax.judges import base as judges_base
from osvl_jax.rl import advantages as advantages_lib
from osvl_jax.rl import fatal as fatal_lib
from osvl_jax.train import batching, rollouts
from tools import base as tools_base


LOSS_BUCKET = 64  # the K ladder's first rung (`batching.bucket_sizes`) when grpo.loss_bucket is unset


def check_budgets(config: ml_collections.ConfigDict) -> tuple[tuple[int, ...], int]:
  """The update's compiled shapes from the config (`batching.bucket_sizes`): grpo.length_buckets (tokens per row,
  increasing, the largest at least rollout.max_total_tokens, so every rollout fits one) and grpo.max_loss_tokens
  (optional; None / 0 = T), at least what a rollout can emit, min(max_total_tokens, max_response_tokens when set,
  max_turns × max_new_tokens); grpo.loss_bucket (optional, default `LOSS_BUCKET`), the first rung of the K ladder.

  Returns:
    (length_buckets, the emitted-token bound).
  Raises:
    ValueError: naming the field and the value that fits.
  """
  buckets = checks.length_buckets(config, 'grpo.length_buckets', empty_ok=False, meaning='')
  total = int(config.rollout.max_total_tokens)
  if buckets[-1] < total:
    raise ValueError(f'grpo.length_buckets={tuple(buckets)}: the largest is below rollout.max_total_tokens={total}; '
                     f'end them with {total} (or more) so every rollout fits one')
  response = int(config.rollout.get('max_response_tokens') or 0) or total   # 0: only T bounds the response
  emitted = min(total, response, int(config.rollout.max_turns) * int(config.rollout.max_new_tokens))
  k = checks.number(config, 'grpo.max_loss_tokens', integer=True, low=0, optional=True)
  checks.number(config, 'grpo.loss_bucket', integer=True, low=1, optional=True)
  if k and k < emitted:
    raise ValueError(f'grpo.max_loss_tokens={k} is below what a rollout can emit, min(rollout.max_total_tokens, '
                     f'max_response_tokens, max_turns x max_new_tokens) = {emitted}; set it to {emitted} (or 0: T)')
  return tuple(buckets), emitted


def score_batch(trajectories: list, cfg: ml_collections.ConfigDict,
                judge: judges_base.Judge | None = None) -> list[dict]:
  """`rollouts.score_all` (Eq. 9) of `trajectories` with `cfg.alpha`, in the judge's `max_concurrency` threads."""
  return rollouts.score_all(trajectories, alpha=cfg.alpha, judge=judge)


def environment_cut(trajectories: list, rollout_cfg: ml_collections.ConfigDict) -> np.ndarray:
  """bool [B]: the trajectories cut by environment errors (`fatal.cut_by_environment`: their fatal cascade of
  rollout.fatal_k consecutive execution errors holds a timeout, http_error or backend_error)."""
  k = int(rollout_cfg.fatal_k)
  return np.array([fatal_lib.cut_by_environment(t.execution_errors, t.environment_errors, k) for t in trajectories],
                  bool).reshape(-1)


def env_errors(rollout_cfg: ml_collections.ConfigDict) -> str:
  """`rollout.env_errors` ('count' when absent), `fatal.ENV_ERROR_MODES`."""
  return rollout_cfg.get('env_errors') or 'count'


def prepare_batch(trajectories: list, cfg: ml_collections.ConfigDict, judge: judges_base.Judge | None = None,
                  scores: list[dict] | None = None,
                  exclude: np.ndarray | None = None) -> tuple[dict, tuple, list, dict]:
  """Scores a rollout batch and builds the update's arrays (Eq. 9, 10, 11).

  `cfg.fatal_mode` is resolved here, once: its `clamp_fatal_advantage` goes to `advantages.group_advantages` and
  its `mask_fn` to `fatal.loss_mask`.

  Groups (Eq. 11) are formed by `prompt_id`, never by row position: the rows may come in any order, and the
  advantages equal those of each group computed alone. A group whose size is not `cfg.num_generations` (a prompt
  drawn twice in one batch gives 2G samples of one prompt_id) is used as it is, over its own samples, and logged
  as a warning.

  Args:
    trajectories: B trajectories (normally N prompts × G samples), in any order.
    cfg: `config.grpo` (alpha, num_generations, fatal_mode, delta, length_buckets; optional estimator, std_ddof,
      max_loss_tokens, loss_bucket, zero_pixels: 'update' zeroes pixel_values, `rollouts.ZERO_PIXELS`): T and K
      come from the budgets (`batching.bucket_sizes`).
    judge: r_acc / r_query judge (`osvl_jax.judges.registry`); None = the offline rule judge.
    scores: the trajectories' `score_batch`, when already computed (a multi-host job scores on process 0 and
      sends the scores to every host); None = score here with `judge`.
    exclude: optional bool [B], rows dropped from the advantages and the loss (rollout.env_errors='exclude':
      `environment_cut`): each group's baseline is over its other rows (`advantages.group_advantages_by_id`), an
      excluded row gets Â = 0 and a loss mask of 0, and the loss does not count it among its sequences
      (`loss_rows`), so the update equals that of the batch without it.
  Returns:
    (batch, grid, scores, advantage stats): `batch` is `batching.collate`'s dict plus loss_mask [B, K] float32
    (Eq. 10 at the loss positions), advantages [B] float32 (Eq. 11), rewards [B], fatal_steps [B] int32 (-1 =
    not fatal), and with `exclude` loss_rows [B] bool (the rows the loss counts, `grpo_update`); `grid` the images'
    grids, a tuple of (t, h, w) (host data for `grpo_update`'s row splits); `scores` the per-trajectory reward
    components.
  """
  scores = score_batch(trajectories, cfg, judge) if scores is None else scores
  if len(scores) != len(trajectories):
    raise ValueError(f'scores has {len(scores)} entries for {len(trajectories)} trajectories')
  fatal_mode = fatal_lib.FATAL_MODES.get(cfg.fatal_mode)
  rewards = np.array([s['reward'] for s in scores], np.float32)
  fatal_steps = fatal_lib.fatal_step_array([t.fatal_step for t in trajectories])
  prompt_ids = [t.prompt_id for t in trajectories]
  sizes = collections.Counter(prompt_ids)
  odd = {pid: n for pid, n in sizes.items() if n != cfg.num_generations}
  if odd:  # e.g. a prompt drawn twice in one batch, across an epoch boundary: one group of 2G
    logging.warning('groups whose size is not num_generations=%d (prompt_id: size): %s', cfg.num_generations,
                    dict(list(odd.items())[:8]))
  adv, adv_stats = advantages_lib.group_advantages_by_id(
      rewards, fatal_steps != fatal_lib.NOT_FATAL, prompt_ids, clamp=fatal_mode.clamp_fatal_advantage,
      estimator=cfg.get('estimator', 'grpo'), delta=cfg.delta, std_ddof=cfg.get('std_ddof', 1), exclude=exclude)
  length, num_loss = batching.bucket_sizes(trajectories, cfg.length_buckets, cfg.get('max_loss_tokens'),
                                           cfg.get('loss_bucket') or LOSS_BUCKET)
  batch = batching.collate(trajectories, length=length, num_loss=num_loss)  # programs: batching.program_bound
  if cfg.get('zero_pixels') == 'update' and batch.get('pixel_values') is not None:   # the blind counter-test
    batch['pixel_values'] = np.zeros_like(batch['pixel_values'])
  grids = batch.pop('image_grid_thw')  # host data: the update lays the images out per shard (no static grid)
  grid = tuple(map(tuple, grids.tolist())) if grids is not None else ()
  batch['loss_mask'] = np.asarray(fatal_lib.loss_mask(batch['completion_mask'], batch['loss_step'], fatal_steps,
                                                      fatal_mode.mask_fn))
  batch['advantages'] = np.asarray(adv, np.float32)
  if exclude is not None:   # out of the loss: no token, and not among its sequences
    keep = ~np.asarray(exclude, bool)
    batch['loss_mask'] = batch['loss_mask'] * keep[:, None].astype(batch['loss_mask'].dtype)
    batch['loss_rows'] = keep
  batch['rewards'], batch['fatal_steps'] = rewards, fatal_steps
  return batch, grid, scores, adv_stats


def rollout_metrics(trajectories: list, scores: list[dict], fatal_steps: np.ndarray, adv_stats: dict,
                    loss_mask: np.ndarray, env_cut: np.ndarray | None = None) -> dict:
  """Per-step rollout metrics: reward components, fatal / clamped / kept fractions, turns, tool calls by tool; the
  execution errors the policy saw split into policy_errors (malformed_call, unknown_tool, bad_arguments) and
  env_errors (timeout, http_error, backend_error: `tools.base.ENVIRONMENT_ERROR_KINDS`), env_retries (environment
  errors retried before the policy saw a result, rollout.env_errors='retry'), env_cut_trajectories (`env_cut`,
  bool [B]: trajectories cut by environment errors, `environment_cut`; whatever the mode) and, under 'exclude',
  the advantages' num_excluded (those dropped from the advantages and the loss)."""
  fatal = fatal_steps != fatal_lib.NOT_FATAL
  stats = {k: float(v) for k, v in jax.device_get(adv_stats).items()}
  tool_calls = collections.Counter(s.action.name for t in trajectories for s in t.steps
                                   if s.action.kind == 'tool_call')
  tool_errors = collections.Counter(s.result.error_kind for t in trajectories for s in t.steps
                                    if s.result is not None and s.result.is_execution_error)
  env_kinds = set(tools_base.ENVIRONMENT_ERROR_KINDS)
  mean = lambda key: float(np.mean([s[key] for s in scores]))
  return {
      'mean_reward': mean('reward'),
      'r_fmt': mean('r_fmt'),
      'r_acc': mean('r_acc'),
      'r_query': mean('r_query'),
      'judge_errors': int(sum(s.get('judge_errors', 0) for s in scores)),
      'fatal_fraction': float(np.mean(fatal)),
      # of the fatal samples: clamped (r̃ < 0; Â = 0 under mask_clamp) vs preserved (r̃ >= 0, Â = r̃)
      'fatal_clamped_fraction': stats['fatal_clamped_frac'],
      'fatal_kept_fraction': stats['fatal_kept_frac'],
      'fatal_kept_rtilde_mean': stats['fatal_kept_rtilde_mean'],
      **stats,
      'unmasked_tokens': int(np.asarray(loss_mask).sum()),
      'mean_turns': float(np.mean([len(t.steps) for t in trajectories])),
      'mean_tool_calls': float(sum(tool_calls.values()) / max(len(trajectories), 1)),
      'tool_calls': dict(tool_calls),
      'tool_errors': dict(tool_errors),
      'policy_errors': int(sum(n for kind, n in tool_errors.items() if kind not in env_kinds)),
      'env_errors': int(sum(n for kind, n in tool_errors.items() if kind in env_kinds)),
      'env_retries': int(sum(s.env_retries for t in trajectories for s in t.steps)),
      'env_cut_trajectories': int(np.sum(env_cut)) if env_cut is not None else 0,
  }
