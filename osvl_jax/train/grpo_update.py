"""The GRPO update of one rollout batch: mini-batches, PPO epochs, micro-batches (DESIGN.md §6, Eq. 12).

The official schedule (verl's dp_actor, as the paper's run script sets it): a rollout batch of N prompts × G
samples is split into mini-batches of `grpo.mini_batch_prompts` prompts' groups (a group never split); each
mini-batch is one optimizer step, its gradient accumulated over `grpo.micro_batch_size`-row micro-batches; the
mini-batches are passed over `grpo.ppo_epochs` times, in the same order every epoch (verl splits the batch once and
reuses the split; no rng, so a resumed run needs no shuffle state). The old log-probs (and the reference's when
β > 0) are computed ONCE, over the whole rollout batch, before the first mini-batch: ρ ≡ 1 on the first step and
departs from 1 from the second on, where the clip acts. Each mini-batch's loss is normalised by that mini-batch
(its num_sequences and num_tokens), as verl does; within it micro-batches sum to the mini-batch gradient.

Train–inference mismatch: the engine's log-probs ride on the trajectory (`rollout_logprobs`); the update logs
mean |log π_rollout − log π_old| and the spread of π_old / π_rollout, and with `grpo.tis_cap` C > 0 weights each
token's loss by min(π_old / π_rollout, C) (truncated importance sampling, verl's TIS).

Placement is injected (`place(batch) -> batch`, applied to every host micro-batch, which carries its images' grids as
image_grid_thw [I, 3]; the placed batch has them laid out per shard as arrays, `placement.vision_layout`, so the jitted
pieces take nothing grid-shaped as static and compile once per budget); this module builds no mesh.
Multi-host: every process runs the update on the same host batch; results split over several hosts' devices come
back through `distributed.to_host` (a collective, called at the same points on every process).
"""

import functools
import math
from typing import Callable

import jax
import ml_collections
import numpy as np
from flax import nnx

from osvl_jax import config_checks as checks
from osvl_jax import distributed
from osvl_jax.models.qwen3_vl import sharding
from osvl_jax.rl import losses
from osvl_jax.train import metrics, placement, policy, update_rows

# How the per-optimizer-step metrics reduce to one record per rollout step: the losses and grad norms of the steps
# are averaged (each is normalised by its own mini-batch), token fractions weighted by tokens, counts summed.
STEP_REDUCTIONS = {**losses.GRPO_METRIC_REDUCTIONS, 'loss': metrics.MEAN, 'pg_objective': metrics.MEAN,
                   'grad_norm': metrics.MEAN, 'grad_norm_max': metrics.MAX, 'router_aux_loss': metrics.MEAN,
                   'router_z_loss': metrics.MEAN}


def check_update_config(config: ml_collections.ConfigDict) -> None:
  """Checks the update-schedule fields of `config.grpo` (called by `grpo.check_config`).

  Fields (all optional): mini_batch_prompts (int >= 0; 0 = the whole rollout batch, one step), ppo_epochs (int >= 1,
  default 1), tis_cap (None or 0 = off, else >= 1), max_logprob_mismatch (the mismatch alarm, `check_mismatch`: None
  or 0 = off, else > 0), max_staleness (int >= 0; 0 = strictly on-policy; read by the
  async rollout), micro_batch_size (must divide the rows of a mini-batch, mini_batch_prompts × num_generations),
  router_aux_loss_coef / router_z_loss_coef (>= 0; MoE router losses, `make_grad_fn`), router_loss_form, adam_b2,
  min_lr_ratio (`policy.check_optimizer_config`), pack_rows (int >= 0; > 0 =
  packed micro-batches of that many rows, `Packing`; not beside micro_batch_size).

  Raises:
    ValueError: naming the field: mini_batch_prompts < 0 or not dividing grpo.prompts_per_step, ppo_epochs < 1,
      tis_cap in (0, 1) or < 0, max_logprob_mismatch < 0, max_staleness < 0, micro_batch_size not dividing the
      mini-batch rows (or a non-int count), a router loss coefficient < 0, `policy.check_optimizer_config`'s,
      pack_rows < 0 or set beside
      micro_batch_size.
  """
  prompts = checks.positive_int(config, 'grpo.prompts_per_step')
  mini = checks.number(config, 'grpo.mini_batch_prompts', integer=True, low=0, optional=True) or prompts
  if prompts % mini:
    raise ValueError(f'grpo.mini_batch_prompts={mini} does not divide grpo.prompts_per_step={prompts}')
  checks.number(config, 'grpo.ppo_epochs', integer=True, low=1, optional=True)
  if config.grpo.get('tis_cap'):  # None / 0 = off; a cap below 1 would scale every token down
    checks.number(config, 'grpo.tis_cap', low=1)
  checks.number(config, 'grpo.max_staleness', integer=True, low=0, optional=True)
  checks.number(config, 'grpo.max_logprob_mismatch', low=0, optional=True)
  for field in policy.ROUTER_LOSS_FIELDS:
    checks.number(config, f'grpo.{field}', low=0, optional=True)
  policy.check_optimizer_config(config, 'grpo')  # adam_b2, min_lr_ratio, router_loss_form
  rows = mini * checks.number(config, 'grpo.num_generations', integer=True, low=1)
  pack_rows = checks.number(config, 'grpo.pack_rows', integer=True, low=0, optional=True)
  if pack_rows and config.grpo.get('micro_batch_size'):
    raise ValueError(f'grpo.pack_rows={pack_rows} packs each mini-batch into micro-batches of that many rows: leave '
                     f'grpo.micro_batch_size={config.grpo.micro_batch_size} at 0')
  micro = checks.number(config, 'grpo.micro_batch_size', integer=True, low=0, optional=True) or rows
  if rows % micro:
    raise ValueError(f'grpo.micro_batch_size={micro} does not divide a mini-batch of {rows} trajectories '
                     f'(grpo.mini_batch_prompts={mini} × grpo.num_generations)')


# ----------------------------------------------------------------------------------------------------------------
# Train–inference mismatch (DESIGN.md §6)
# ----------------------------------------------------------------------------------------------------------------

def rollout_logprob_rows(batch: dict) -> np.ndarray:
  """bool [B]: rows whose engine log-probs are known.

  `collate` writes 0 for a trajectory without `rollout_logprobs` (an engine that gave none, an expert trajectory),
  so a row is known when any of its completion tokens has a non-zero rollout log-prob. (A row of only
  probability-1 tokens reads as unknown; its weights would be ~1 anyway.)
  """
  rollout = batch.get('rollout_logprobs')
  if rollout is None:
    return np.zeros(batch['input_ids'].shape[0], bool)
  return np.any((np.asarray(rollout) != 0) & np.asarray(batch['completion_mask'], bool), axis=1)


def mismatch_metrics(old_logprobs: np.ndarray, rollout_logprobs: np.ndarray, known_rows: np.ndarray,
                     loss_mask: np.ndarray, tis_cap: float | None = None) -> dict[str, float]:
  """The trainer-vs-engine log-prob gap over the loss tokens of rows with known rollout log-probs.

  Args:
    old_logprobs: log π_old from the trainer, float32 [B, K].
    rollout_logprobs: log π_rollout from the engine, float32 [B, K].
    known_rows: bool [B] (`rollout_logprob_rows`).
    loss_mask: M, [B, K] (Eq. 10).
    tis_cap: C of truncated importance sampling, or None / 0 (then no `tis_capped_frac`).
  Returns:
    logprob_mismatch_tokens (tokens compared), logprob_mismatch_abs_mean (mean |log π_rollout − log π_old|), and
    of the ratio π_old / π_rollout = exp(old − rollout): logprob_mismatch_ratio_mean / _std / _max / _min; with
    tis_cap, tis_capped_frac (tokens whose ratio exceeds C). All 0 when no token is compared.
  """
  on = (np.asarray(loss_mask) > 0) & np.asarray(known_rows, bool)[:, None]
  diff = (np.asarray(old_logprobs, np.float64) - np.asarray(rollout_logprobs, np.float64))[on]
  ratio = np.exp(diff)
  any_ = diff.size > 0
  out = {'logprob_mismatch_tokens': float(diff.size),
         'logprob_mismatch_abs_mean': float(np.mean(np.abs(diff))) if any_ else 0.0,
         'logprob_mismatch_ratio_mean': float(np.mean(ratio)) if any_ else 0.0,
         'logprob_mismatch_ratio_std': float(np.std(ratio)) if any_ else 0.0,
         'logprob_mismatch_ratio_max': float(np.max(ratio)) if any_ else 0.0,
         'logprob_mismatch_ratio_min': float(np.min(ratio)) if any_ else 0.0}
  if tis_cap:
    out['tis_capped_frac'] = float(np.mean(ratio > tis_cap)) if any_ else 0.0
  return out


class MismatchAlarm(RuntimeError):
  """The trainer's and the engine's log-probs of the same tokens disagree beyond `grpo.max_logprob_mismatch`."""


def check_mismatch(metrics: dict, threshold: float | None, figure: str = 'logprob_mismatch_abs_mean') -> None:
  """The mismatch alarm: stops the step when `metrics[figure]` (`mismatch_metrics`' mean |log π_rollout −
  log π_old|; the trainer passes `logprob_mismatch_on_policy_abs_mean`, over the rows rolled out by the weights being updated,
  so a stale row's policy lag under `max_staleness` does not count) exceeds `threshold` (None / 0 = off). An engine
  that rolled out another policy than the trainer's shows up this way: one that did not see the images, wrongly
  exported or unpublished weights, another tokenization of the context, another temperature.

  Raises:
    MismatchAlarm: naming the figure, its value, the token count and the config field.
  """
  value = metrics.get(figure, 0.0)
  tokens = metrics.get(figure.replace('_abs_mean', '_tokens'), 0)
  if threshold and tokens and not value <= float(threshold):  # a NaN figure rings too
    raise MismatchAlarm(
        f'{figure}={value:.4g} (mean |log π_rollout − log π_old| over {int(tokens)} loss tokens) exceeds '
        f'grpo.max_logprob_mismatch={threshold}: the engine sampled from another policy than the trainer scores (did it see the images? are its weights the '
        'published ones? same temperature?); the step is not taken')


def check_rollout_logprobs(rollout_logprobs: np.ndarray, completion_mask: np.ndarray, prompt_ids) -> None:
  """Refuses engine log-probs that are not finite on a completion token (a NaN would make every mismatch figure
  NaN, which no threshold compares above, and TIS weights NaN).

  Args:
    rollout_logprobs: float32 [B, K]; completion_mask: bool [B, K]; prompt_ids: [B].
  Raises:
    ValueError: naming the first such value, its loss position, its row and the row's prompt_id.
  """
  bad = ~np.isfinite(np.asarray(rollout_logprobs)) & np.asarray(completion_mask, bool)
  if bad.any():
    row, k = (int(i) for i in np.argwhere(bad)[0])
    raise ValueError(f'rollout_logprobs: {float(rollout_logprobs[row, k]):g} at loss position {k} of row {row} '
                     f'(prompt_id {prompt_ids[row]!r}; {int(bad.sum())} such tokens in the batch): the engine\'s '
                     'log-probs must be finite; the step is not taken')


def tis_weights(old_logprobs: np.ndarray, rollout_logprobs: np.ndarray, known_rows: np.ndarray,
                loss_mask: np.ndarray, cap: float) -> np.ndarray:
  """Truncated importance-sampling weights min(π_old / π_rollout, C) (verl's TIS; DESIGN.md §6).

  Args:
    old_logprobs, rollout_logprobs: float32 [B, K]; known_rows: bool [B]; loss_mask: [B, K]; cap: C > 0.
  Returns:
    float32 [B, K]: min(exp(old − rollout), C) on the loss tokens of known rows, 1 elsewhere (no correction where
    the engine's log-probs are unknown).
  """
  on = (np.asarray(loss_mask) > 0) & np.asarray(known_rows, bool)[:, None]
  diff = np.where(on, np.asarray(old_logprobs, np.float32) - np.asarray(rollout_logprobs, np.float32), 0.0)
  return np.where(on, np.minimum(np.exp(diff), cap), 1.0).astype(np.float32)


# ----------------------------------------------------------------------------------------------------------------
# Jitted pieces and the schedule
# ----------------------------------------------------------------------------------------------------------------

def with_grid(batch: dict, grid: tuple) -> dict:
  """A host (micro-)batch with its images' grids as image_grid_thw int32 [I, 3] (None without images), the form
  `place` and `placement.vision_layout` read."""
  return dict(batch, image_grid_thw=np.array(grid, np.int32).reshape(-1, 3) if grid else None)


def default_place(vision_config, patches_per_shard: int = 0) -> Callable[[dict], dict]:
  """`place` without a mesh: the batch's images laid out as one shard (`placement.vision_layout`), host arrays."""
  return functools.partial(placement.vision_layout, vision_config=vision_config, shards=1,
                           patches_per_shard=patches_per_shard)


@nnx.jit
def logprob_fn(model, batch: dict, temperature=1.0) -> jax.Array:
  """Jitted: [B, K] float32 log-probs of `model` at the batch's loss positions (π_old, π_ref), of the distribution
  at `temperature` (a float32 scalar, traced: `policy.loss_logprobs`). `batch` as `place` returns it (images laid
  out per shard; nothing static)."""
  return policy.loss_logprobs(model, batch, jax.numpy.asarray(temperature, jax.numpy.float32))


def make_grad_fn(cfg: ml_collections.ConfigDict):
  """Jitted (model, batch, num_sequences, num_tokens) -> (grads, metrics) of −J (Eq. 12) on one placed micro-batch
  (images laid out per shard, `place`; nothing static, so one program per budget).

  `num_sequences` (rows) and `num_tokens` (Σ M) are those of the mini-batch the micro-batch belongs to (float32
  scalars), so the micro-batch gradients sum to the mini-batch gradient. The batch needs old_logprobs, advantages,
  loss_mask (ref_logprobs when beta > 0; tis_weights [B, K] when TIS is on) beside `batching.collate`'s fields.
  Loss settings from `cfg` (= config.grpo): eps_low, eps_high, beta, aggregation, clip_ratio_c, temperature (π_θ
  at the rollout temperature, `policy.loss_logprobs`; default 1), router_aux_loss_coef / router_z_loss_coef /
  router_loss_form (MoE:
  −J + the micro-batch's share rows / num_sequences of aux_coef · aux + z_coef · z over its real tokens,
  `policy.router_loss`; metrics router_aux_loss / router_z_loss, which sum over the micro-batches to the
  row-weighted mean; absent = 0: no router terms); one function (and compile cache) per distinct setting.
  """
  aggregation = cfg.get('aggregation', 'seq_mean_token_mean')
  losses.AGGREGATIONS.get(aggregation)
  clip_ratio_c = cfg.get('clip_ratio_c', None)
  return _grad_fn(float(cfg.eps_low), float(cfg.eps_high), float(cfg.beta), aggregation,
                  None if clip_ratio_c is None else float(clip_ratio_c), temperature(cfg),
                  policy.router_loss_coefs(cfg))


def temperature(cfg: ml_collections.ConfigDict) -> float:
  """The temperature of the trainer's log-probs: `cfg.temperature` (config.grpo; the rollout temperature, which
  `grpo.check_config` holds it equal to), 1.0 when absent."""
  value = cfg.get('temperature', None)
  return 1.0 if value is None else float(value)


def loss_fn(model, batch: dict, num_sequences, num_tokens, eps_low: float, eps_high: float, beta: float,
            aggregation: str, clip_ratio_c: float | None, temperature: float = 1.0,
            router_coefs: tuple[float, float] = (0.0, 0.0), num_rows=None) -> tuple[jax.Array, dict]:
  """−J (Eq. 12, `losses.grpo_loss`) of one placed micro-batch at π_θ = `model` (log-probs at `temperature`), and
  with a MoE model and non-zero `router_coefs` (aux, z) + its share rows / num_rows of aux_coef · aux +
  z_coef · z over its real tokens (`policy.router_loss`; metrics router_aux_loss / router_z_loss). `num_rows`: the
  mini-batch's trajectories (None: num_sequences, which is fewer when rows are excluded from the loss,
  rollout.env_errors='exclude'; the router terms see every row the model ran).

  Returns:
    (float32 [] loss, `losses.grpo_loss`'s metrics [+ the router metrics]); settings as `make_grad_fn`.
  """
  on = policy.router_losses_on(model, router_coefs)
  logprobs, stats = policy.loss_logprobs_and_router_stats(model, batch, temperature, router_stats=on)
  loss, aux = losses.grpo_loss(logprobs, batch['old_logprobs'], batch['advantages'], batch['loss_mask'],
                               ref_logprobs=batch.get('ref_logprobs') if beta else None, eps_low=eps_low,
                               eps_high=eps_high, beta=beta, aggregation=aggregation, num_sequences=num_sequences,
                               num_tokens=num_tokens, clip_ratio_c=clip_ratio_c, tis_weights=batch.get('tis_weights'),
                               sequence_tokens=batch.get('sequence_tokens'))
  if on:   # this micro-batch's share of the step's trajectories (packed: segments) weighs its router terms
    segments = jax.numpy.max(jax.numpy.asarray(batch['attention_mask']).astype(jax.numpy.int32), axis=1)
    rows = num_sequences if num_rows is None else num_rows
    share = jax.numpy.sum(segments) / jax.numpy.asarray(rows, jax.numpy.float32)
    penalty, router_metrics = policy.router_loss(stats, router_coefs, share)
    loss = loss + penalty
    aux = dict(aux, **router_metrics)
  return loss, aux


@functools.cache
def _grad_fn(eps_low: float, eps_high: float, beta: float, aggregation: str, clip_ratio_c: float | None,
             temperature: float = 1.0, router_coefs: tuple[float, float] = (0.0, 0.0)):

  @nnx.jit
  def grad_fn(model, batch, num_sequences, num_tokens, num_rows=None):
    (loss, aux), grads = nnx.value_and_grad(
        lambda m: loss_fn(m, batch, num_sequences, num_tokens, eps_low, eps_high, beta, aggregation, clip_ratio_c,
                          temperature, router_coefs, num_rows), has_aux=True)(model)
    return sharding.constrain_state(grads), dict(aux, loss=loss)  # placed like the parameters

  return grad_fn


def accumulate_grads(model, parts: list[dict], grad_fn, num_sequences: float,
                     num_tokens: float, num_rows: float | None = None) -> tuple[nnx.State, dict]:
  """Σ over micro-batches of the gradient of −J, each normalised by the mini-batch: the mini-batch gradient.

  Args:
    parts: placed micro-batches (`update_rows.split_micro_batches` or `pack_parts`, then `with_grid` and `place`).
    grad_fn: `make_grad_fn(cfg)`.
    num_sequences, num_tokens: rows the loss counts and Σ M of the mini-batch.
    num_rows: every row of the mini-batch (the MoE router terms' share; None: num_sequences).
  Returns:
    (grads as an nnx.State like the model's params, metrics reduced by `losses.GRPO_METRIC_REDUCTIONS`).
  """
  grads, metrics_list = None, []
  f32 = lambda x: jax.numpy.asarray(x, jax.numpy.float32)
  for batch in parts:
    g, m = (grad_fn(model, batch, f32(num_sequences), f32(num_tokens)) if num_rows is None else
            grad_fn(model, batch, f32(num_sequences), f32(num_tokens), f32(num_rows)))
    grads = g if grads is None else policy.add_grads(grads, g)
    metrics_list.append(distributed.to_host(m))
  return grads, metrics.reduce_metrics(metrics_list, losses.GRPO_METRIC_REDUCTIONS)


def batch_logprobs(model, batch: dict, grid: tuple, micro_batch_size: int,
                   place: Callable[[dict], dict], temp: float = 1.0,
                   packing: update_rows.Packing | None = None) -> np.ndarray:
  """log π_T of `model` (at temperature `temp`) at the loss positions of the whole batch, float32 [B, K] on host,
  in micro-batches, or in packed micro-batches (`update_rows.pack_parts`) written back to their trajectories' rows (0 on
  padding); rows split over several hosts are gathered (`distributed.to_host`)."""
  rows = batch['input_ids'].shape[0]
  t = np.float32(temp)
  if packing is not None:
    out = np.zeros(np.shape(batch['loss_targets']), np.float32)
    n_loss = np.asarray(batch['completion_mask'], bool).sum(1)
    for part, part_grid, packed in update_rows.pack_parts(batch, grid, np.arange(rows), packing):
      values = np.asarray(distributed.to_host(logprob_fn(model, place(with_grid(part, part_grid)), t)))
      update_rows.unpack_loss_values(values, packed, n_loss, out)
    return out
  parts = update_rows.split_micro_batches(batch, grid, math.gcd(rows, micro_batch_size or rows))
  return np.concatenate([np.asarray(distributed.to_host(logprob_fn(model, place(with_grid(b, g)), t)))
                         for b, g in parts])


def make_update_fn(cfg: ml_collections.ConfigDict, place: Callable[[dict], dict] | None = None,
                   batch_shards: int = 1):
  """The update of one rollout batch under the official schedule (module docstring), as a function.

  Args:
    cfg: config.grpo: mini_batch_prompts (0 = whole batch), ppo_epochs (default 1), micro_batch_size (0 = the
      mini-batch), tis_cap (None / 0 = off), beta, patches_per_shard (the default place's patch budget; 0 / absent
      = each micro-batch's fullest shard), and `make_grad_fn`'s loss settings.
    place: host batch (with image_grid_thw, `with_grid`) -> placed batch (e.g. `placement.shard_batch` over a mesh:
      images laid out per shard), applied to every micro-batch; default `default_place(model.config.vision,
      cfg.patches_per_shard)`, host arrays.
    batch_shards: the data x fsdp devices `place` splits rows over (the packed rows' patch budget, `Packing`).
  With cfg.pack_rows > 0 every micro-batch (π_old, π_ref and the gradient's) is packed (`update_rows.pack_parts`): the
  mini-batch's trajectories go whole into `Packing` rows, pack_rows rows per micro-batch; the number of
  micro-batches follows the real tokens, the program is one, and the losses and gradients are the unpacked ones.
  Returns:
    update(model, optimizer, batch, grid, prompt_ids, ref_model=None) -> (metrics, step_metrics):
      batch / grid as `grpo_batch.prepare_batch` returns them (without rewards / fatal_steps; host numpy; optionally
      `on_policy_rows` bool [B], the rows rolled out by the weights being updated: the mismatch alarm's rows,
      `check_mismatch`; optionally `loss_rows` bool [B], the rows the loss counts among its sequences, a mini-batch's
      num_sequences being its loss rows: rows excluded by rollout.env_errors='exclude' are not), prompt_ids [B]
      the prompt of each row, ref_model π_ref (needed when beta > 0). The model
      and optimizer are updated in place.
      step_metrics: one dict per optimizer step (`grpo_loss`'s metrics + grad_norm, before clipping);
      metrics: those reduced by `STEP_REDUCTIONS` (+ grad_norm_max), `mismatch_metrics`, optimizer_steps (the
      mini-batches with a token in the loss: one without takes no step), mini_batches, micro_batches (per
      mini-batch, the largest).
  Raises (from update):
    ValueError: prompt_ids not [B]; beta > 0 without ref_model; a rollout log-prob that is not finite on a
      completion token (`check_rollout_logprobs`, before any optimizer step).
    MismatchAlarm: the engine's log-probs are further than `cfg.max_logprob_mismatch` from π_old's (before any
      optimizer step).
  """
  patches = int(cfg.get('patches_per_shard', 0) or 0)
  mini_prompts, epochs = int(cfg.get('mini_batch_prompts', 0) or 0), int(cfg.get('ppo_epochs', 1) or 1)
  micro, tis_cap, beta = int(cfg.get('micro_batch_size', 0) or 0), cfg.get('tis_cap', None), float(cfg.beta)
  grad_fn, temp = make_grad_fn(cfg), temperature(cfg)
  packing = update_rows.Packing.from_config(cfg, batch_shards)

  def update(model, optimizer, batch, grid, prompt_ids, ref_model=None):
    put = place or default_place(model.config.vision, patches)
    rows = batch['input_ids'].shape[0]
    if len(prompt_ids) != rows:
      raise ValueError(f'prompt_ids has {len(prompt_ids)} entries for a batch of {rows} rows')
    if beta and ref_model is None:
      raise ValueError(f'grpo.beta={beta} needs ref_model')
    batch = dict(batch)
    on_policy = batch.pop('on_policy_rows', None)  # bool [B]: rolled out by the weights being updated
    loss_rows = batch.pop('loss_rows', None)  # bool [B]: the rows the loss counts (None: every row)
    batch['old_logprobs'] = batch_logprobs(model, batch, grid, micro, put, temp, packing)  # once (Eq. 12's π_old)
    if beta:
      batch['ref_logprobs'] = batch_logprobs(ref_model, batch, grid, micro, put, temp, packing)
    known = rollout_logprob_rows(batch)
    rollout = batch.get('rollout_logprobs', np.zeros_like(batch['old_logprobs']))
    check_rollout_logprobs(rollout, batch['completion_mask'], prompt_ids)  # before any optimizer step
    out = mismatch_metrics(batch['old_logprobs'], rollout, known, batch['loss_mask'], tis_cap)
    figure = 'logprob_mismatch_abs_mean'
    if on_policy is not None:  # the alarm's figure: the engine's own gap, not the lag of stale rows' policy
      figure = 'logprob_mismatch_on_policy_abs_mean'
      alarm = mismatch_metrics(batch['old_logprobs'], rollout, known & np.asarray(on_policy, bool), batch['loss_mask'])
      out.update(logprob_mismatch_on_policy_tokens=alarm['logprob_mismatch_tokens'],
                 logprob_mismatch_on_policy_abs_mean=alarm['logprob_mismatch_abs_mean'])
    check_mismatch(out, cfg.get('max_logprob_mismatch'), figure)  # before any optimizer step: nothing changed yet
    if tis_cap:
      batch['tis_weights'] = tis_weights(batch['old_logprobs'], rollout, known, batch['loss_mask'], tis_cap)
    minis = update_rows.mini_batch_rows(prompt_ids, mini_prompts)
    steps, micro_batches, applied = [], 0, 0
    for _ in range(epochs):
      for mini_rows in minis:
        n = len(mini_rows)
        if packing is not None:
          parts = [put(with_grid(b, g)) for b, g, _ in update_rows.pack_parts(batch, grid, mini_rows, packing)]
        else:
          part, part_grid = (batch, grid) if n == rows else update_rows.take_rows(batch, grid, mini_rows)
          parts = [put(with_grid(b, g))
                   for b, g in update_rows.split_micro_batches(part, part_grid, math.gcd(n, micro or n))]
        micro_batches = max(micro_batches, len(parts))
        sequences = n if loss_rows is None else float(np.sum(np.asarray(loss_rows)[mini_rows]))
        tokens = float(np.sum(batch['loss_mask'][mini_rows]))
        grads, step = accumulate_grads(model, parts, grad_fn, sequences, tokens, None if loss_rows is None else n)
        if tokens:
          step['grad_norm'] = float(distributed.to_host(policy.apply_grads(model, optimizer, grads)))
          applied += 1
        else:   # no token in the loss (every rollout cut, e.g. past rollout.max_seconds): a zero gradient would still
          step['grad_norm'] = 0.0   # move the weights (Adam's momentum, weight decay), so no optimizer step is taken
        steps.append(step)
    out.update(metrics.reduce_metrics([dict(s, grad_norm_max=s['grad_norm']) for s in steps], STEP_REDUCTIONS))
    out.update(optimizer_steps=applied, mini_batches=len(minis), micro_batches=micro_batches)
    return out, steps

  return update
