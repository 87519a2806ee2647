"""SFT on expert trajectories: masked next-token loss on the policy's own tokens (Eq. 7-8).

Reads top to bottom (big_vision style): data, mesh (built once, in main), model, optimizer, resume, loop,
checkpoint. What it shares with GRPO lives in `train/` modules (`policy_config`, `policy`, `data`, `batching`).

  .venv/bin/python -m osvl_jax.train.sft --config=configs/demo.py --workdir=workdir/demo

The dataset is `<config.data.dir or workdir/data>/sft` as written by `python -m data_pipeline.build`.
Rerunning with the same workdir resumes from the latest checkpoint in `<workdir>/sft_ckpt`.
"""

import functools
import pathlib
import time
from typing import Callable

import jax
import ml_collections
import optax
import tqdm
from absl import app, flags, logging
from flax import nnx
from ml_collections import config_flags

from osvl_jax import checkpoints
from osvl_jax import compile_cache
from osvl_jax import config_checks as checks
from osvl_jax import distributed
from osvl_jax.checkpoints import storage
from osvl_jax.models.qwen3_vl import sharding
from osvl_jax.rl import losses
from osvl_jax.train import batching, data, metrics, placement, policy, policy_config


def check_config(config: ml_collections.ConfigDict) -> None:
  """Fails fast, before anything is read or written, on an SFT config that cannot run.

  Raises:
    ValueError: naming the field: `policy_config.check_model_config`'s, sft.steps / batch_size / log_every /
      ckpt_every not ints >= 1, sft.lr <= 0, sft.warmup_steps outside [0, sft.steps) (`checks.warmup_steps`: the
      message says which value fits), sft.weight_decay < 0, sft.grad_clip <= 0,
      sft.micro_batch_size (optional; 0 = the batch) not an int >= 0 dividing sft.batch_size, the micro-batch not a
      multiple of the mesh's data x fsdp size, sft.patches_per_shard (optional) not an int >= 0, sft.length_buckets
      (optional) not increasing ints >= 1,
      sft.router_aux_loss_coef / router_z_loss_coef (optional) < 0, `policy.check_optimizer_config`'s (adam_b2,
      min_lr_ratio, router_loss_form), sft.pack_rows (optional; 0 = no packing) not
      an int >= 0 or not a multiple of the data x fsdp devices, or set beside sft.micro_batch_size,
      sft.max_loss_tokens (optional) not an int >= 0.
  """
  policy_config.check_model_config(config)
  checks.positive_int(config, 'sft.steps')
  for field in ('batch_size', 'log_every', 'ckpt_every'):
    checks.positive_int(config, f'sft.{field}')
  checks.number(config, 'sft.lr', low=0, low_open=True)
  checks.warmup_steps(config, 'sft')
  checks.number(config, 'sft.weight_decay', low=0)
  checks.number(config, 'sft.grad_clip', low=0, low_open=True)
  checks.number(config, 'sft.patches_per_shard', integer=True, low=0, optional=True)
  checks.length_buckets(config, 'sft.length_buckets', empty_ok=True,
                        meaning=', or () for one bucket, the longest trajectory')
  for field in policy.ROUTER_LOSS_FIELDS:
    checks.number(config, f'sft.{field}', low=0, optional=True)
  policy.check_optimizer_config(config, 'sft')  # adam_b2, min_lr_ratio, router_loss_form (optional)
  if config.sft.get('lr_schedule') is not None:
    checks.choice(config, 'sft.lr_schedule', policy.SCHEDULES)
  micro = checks.number(config, 'sft.micro_batch_size', integer=True, low=0, optional=True) or config.sft.batch_size
  if config.sft.batch_size % micro:
    raise ValueError(f'sft.micro_batch_size={micro} does not divide sft.batch_size={config.sft.batch_size}')
  shards = policy_config.batch_shards(config)
  checks.number(config, 'sft.max_loss_tokens', integer=True, low=0, optional=True)
  pack_rows = checks.number(config, 'sft.pack_rows', integer=True, low=0, optional=True)
  if pack_rows:
    if config.sft.get('micro_batch_size'):
      raise ValueError(f'sft.pack_rows={pack_rows} packs the step into micro-batches of that many rows: leave '
                       f'sft.micro_batch_size={config.sft.micro_batch_size} at 0')
    if pack_rows % shards:
      raise ValueError(f'sft.pack_rows={pack_rows} does not split over the {shards} data x fsdp devices of '
                       'config.mesh')
    return
  if micro % shards:
    field = 'micro_batch_size' if config.sft.get('micro_batch_size') else 'batch_size'
    raise ValueError(f'sft.{field}={micro} (rows per step or micro-batch) does not split over the {shards} '
                     'data x fsdp devices of config.mesh')


def loss_fn(model, batch: dict, router_coefs: tuple[float, float] = (0.0, 0.0), num_tokens=None,
            share=1.0) -> tuple[jax.Array, dict]:
  """The SFT loss of `batch` (`policy.loss_logprobs` + `losses.sft_loss`, Eq. 7-8): (loss, metrics); batch fields
  as `make_train_step` reads them.

  With a MoE model and non-zero `router_coefs` (aux, z[, form]; `policy.router_loss_coefs`) the loss is
  L_SFT + share · (aux_coef · aux + z_coef · z) (`policy.router_loss`, over the batch's real tokens) and the metrics
  add router_aux_loss / router_z_loss; otherwise the program is the one without them. For one micro-batch of a step
  (`make_grad_step`): `num_tokens` is Σ M of the whole step's batch (float32 scalar; default this batch's) and
  `share` its rows / the step's rows, so that the micro-batch losses and metrics sum to the step's."""
  on = policy.router_losses_on(model, router_coefs)
  logprobs, stats = policy.loss_logprobs_and_router_stats(model, batch, router_stats=on)
  loss, metrics = losses.sft_loss(logprobs, batch['completion_mask'], num_tokens)
  if on:
    penalty, router_metrics = policy.router_loss(stats, router_coefs, share)
    loss = loss + penalty
    metrics = dict(metrics, **router_metrics, loss=loss)
  return loss, metrics


def make_train_step(cfg: ml_collections.ConfigDict | None = None):
  """A jitted SFT step (model, optimizer, batch) -> metrics; `cfg` (config.sft, optional) gives the MoE router
  losses' coefficients (`router_aux_loss_coef`, `router_z_loss_coef`; absent = 0, `loss_fn`).

  `batch` is laid out by `placement.shard_batch` / `placement.host_batch` (images per batch shard with their geometry
  as arrays, no image_grid_thw): nothing of it is static, so every batch of the same budgets (T, K, rows, patches
  per shard) runs one compiled program whatever its images. The model's and optimizer's arrays are donated: the step
  updates them in place (one copy of the parameters and Adam moments per device, not two), so arrays read from them
  before the step are deleted by it.
  """
  step_loss = functools.partial(loss_fn, router_coefs=policy.router_loss_coefs(cfg))   # Python floats: static

  @nnx.jit(donate_argnums=(0, 1))
  def train_step(model, optimizer, batch):
    (loss, aux), grads = nnx.value_and_grad(step_loss, has_aux=True)(model, batch)
    optimizer.update(model, grads)
    policy.pin_placement(model, optimizer)  # the updated state keeps the rules' shardings
    return dict(aux, loss=loss, grad_norm=optax.tree.norm(grads))

  return train_step


def make_grad_step(cfg: ml_collections.ConfigDict | None = None):
  """A jitted (model, batch, num_tokens, share) -> (grads, metrics) of one micro-batch of an SFT step (gradient
  accumulation, `sft.micro_batch_size`): `loss_fn`'s gradient with Σ M of the whole step (`num_tokens`, float32
  scalar) and the micro-batch's share of its rows (`share`, float32 scalar), so that the micro-batch gradients and
  metrics sum to those of the step taken at once (the router terms: the row-weighted mean, HF's accumulation).
  Grads are placed like the parameters; batch as `make_train_step`'s. One function (and compile cache) per
  setting of the router coefficients."""
  return _grad_step(policy.router_loss_coefs(cfg))


@functools.cache
def _grad_step(coefs: tuple[float, float]):

  @nnx.jit
  def grad_step(model, batch, num_tokens, share):
    (loss, aux), grads = nnx.value_and_grad(
        lambda m: loss_fn(m, batch, coefs, num_tokens, share), has_aux=True)(model)
    return sharding.constrain_state(grads), dict(aux, loss=loss)

  return grad_step


def make_packed_step(cfg: ml_collections.ConfigDict, place: Callable[[list, list], dict], budget: batching.Bucket,
                     patches_per_row: int = 0):
  """One optimizer step over a list of trajectories, packed (dynamic batch size, `sft.pack_rows`): step(model,
  optimizer, trajectories) -> metrics.

  The step's trajectories are packed into rows of the budget (`batching.pack`: T tokens, K loss tokens,
  `patches_per_row` patches), the rows taken `sft.pack_rows` at a time (the last micro-batch padded with empty
  rows), each micro-batch's gradient (`make_grad_step`, normalised by the whole step's Σ M) summed, then one
  optimizer step: the loss and gradient of the step taken at once, unpacked (Eq. 8 sums over tokens), from one
  compiled program whatever the lengths; the number of micro-batches follows the step's real tokens.

  Args:
    cfg: config.sft (pack_rows, router coefficients).
    place: (trajectories, rows) -> placed batch at the budget (`placement.host_batch(..., rows=rows)`).
    budget: the packed shape (`batching.pack_budget`).
    patches_per_row: the image patches one row may hold (the shard budget / its rows), or 0.
  Returns:
    step: metrics loss, nll_sum, num_tokens (the step's), router metrics (MoE), grad_norm (before clipping),
    micro_batches (packed micro-batches run) and packed_rows (rows holding trajectories).
  """
  grad_step = make_grad_step(cfg)
  per_micro = int(cfg.pack_rows)
  f32 = lambda x: jax.numpy.asarray(x, jax.numpy.float32)

  def step(model, optimizer, trajectories):
    rows = batching.pack(trajectories, budget.length, budget.num_loss, patches_per_row)
    num_tokens = f32(sum(batching.num_loss_tokens(t) for t in trajectories))
    grads, parts = None, []
    for start in range(0, len(rows), per_micro):
      part = rows[start:start + per_micro]
      members = [i for row in part for i in row]
      local = {i: n for n, i in enumerate(members)}
      batch = place([trajectories[i] for i in members],
                    [[local[i] for i in row] for row in part] + [[]] * (per_micro - len(part)))
      g, m = grad_step(model, batch, num_tokens, f32(len(members) / len(trajectories)))
      grads = g if grads is None else policy.add_grads(grads, g)
      parts.append(distributed.to_host(m))
    grad_norm = policy.apply_grads(model, optimizer, grads)
    return dict(metrics.reduce_metrics(parts), grad_norm=grad_norm, micro_batches=len(parts), packed_rows=len(rows))

  return step


def make_step(cfg: ml_collections.ConfigDict, place: Callable[[list], dict]):
  """One optimizer step over a list of trajectories: step(model, optimizer, rows) -> metrics.

  Args:
    cfg: config.sft: batch_size, micro_batch_size (0 / absent = the batch: one fused, donated `make_train_step`),
      and the router coefficients.
    place: trajectories -> placed batch at the run's fixed budgets (`placement.host_batch`).
  Returns:
    step: with micro-batches, their gradients (`make_grad_step`) summed, then one optimizer step
    (`policy.apply_grads`); metrics loss, nll_sum, num_tokens (summed over the micro-batches: the step's), the
    router metrics (MoE), grad_norm (before clipping).
  """
  micro = int(cfg.get('micro_batch_size', 0) or 0) or int(cfg.batch_size)
  if micro >= cfg.batch_size:
    fused = make_train_step(cfg)
    return lambda model, optimizer, rows: fused(model, optimizer, place(rows))
  grad_step = make_grad_step(cfg)
  f32 = lambda x: jax.numpy.asarray(x, jax.numpy.float32)

  def step(model, optimizer, rows):
    num_tokens = f32(sum(batching.num_loss_tokens(t) for t in rows))
    grads, parts = None, []
    for start in range(0, len(rows), micro):
      g, m = grad_step(model, place(rows[start:start + micro]), num_tokens, f32(micro / len(rows)))
      grads = g if grads is None else policy.add_grads(grads, g)
      parts.append(distributed.to_host(m))
    grad_norm = policy.apply_grads(model, optimizer, grads)
    return dict(metrics.reduce_metrics(parts), grad_norm=grad_norm)

  return step


def buckets(cfg: ml_collections.ConfigDict, trajectories: list, mesh, rules, vision_config) -> list:
  """The run's compiled shapes (`batching.sft_buckets`): one (T, K, P) per `sft.length_buckets` entry that some
  trajectory fits (() = one, the longest), K and P holding every trajectory of that length: K `sft.max_loss_tokens`
  (at most T) or (0) the most loss tokens, P per batch shard from `sft.patches_per_shard` or (0) the fullest row
  times the rows of a batch shard.

  Raises:
    ValueError: a trajectory longer than the largest bucket or over sft.max_loss_tokens, naming it and the budget.
  """
  rows_per_shard = (int(cfg.get('micro_batch_size', 0) or 0) or cfg.batch_size) // sharding.batch_shards(mesh, rules)
  return batching.sft_buckets(trajectories, tuple(cfg.get('length_buckets') or ()), rows_per_shard,
                              vision_config.spatial_merge_size, int(cfg.get('patches_per_shard', 0) or 0),
                              max_loss_tokens=int(cfg.get('max_loss_tokens', 0) or 0))


def placer(cfg: ml_collections.ConfigDict, trajectories: list, mesh, rules, vision_config) -> Callable[[list], dict]:
  """rows -> placed batch (`placement.host_batch`) at the smallest of the run's `buckets` that holds them: one
  compiled step per bucket. What `sft.train` and bench/compile_count.py step with."""
  shapes = buckets(cfg, trajectories, mesh, rules, vision_config)

  def place(rows):
    b = batching.pick_bucket(shapes, rows)
    return placement.host_batch(rows, mesh, b.length, b.num_loss, rules, vision_config, b.patches)

  return place


def packer(cfg: ml_collections.ConfigDict, trajectories: list, mesh, rules, vision_config):
  """The packed run's step (`sft.pack_rows` > 0): `make_packed_step` at the one budget
  (`batching.pack_budget`: T the largest of `sft.length_buckets`, K `sft.max_loss_tokens` or its bound, P
  `sft.patches_per_shard` or its bound for pack_rows / shards rows), placing with `placement.host_batch`. Returns
  (step, budget)."""
  rows_per_shard = int(cfg.pack_rows) // sharding.batch_shards(mesh, rules)
  budget = batching.pack_budget(trajectories, tuple(cfg.get('length_buckets') or ()), rows_per_shard,
                                vision_config.spatial_merge_size, int(cfg.get('max_loss_tokens') or 0),
                                int(cfg.get('patches_per_shard') or 0))
  place = lambda part, rows: placement.host_batch(part, mesh, budget.length, budget.num_loss, rules, vision_config,
                                               budget.patches, rows=rows)
  return make_packed_step(cfg, place, budget, budget.patches // rows_per_shard), budget


def train(config: ml_collections.ConfigDict, workdir: str | pathlib.Path,
          mesh: jax.sharding.Mesh | None = None) -> nnx.Module:
  """Runs (or resumes) SFT on `mesh` (main's; None = built here from `config.mesh`, once); returns the trained
  model. Checkpoints in `<workdir>/sft_ckpt`.

  The checkpoints' meta records the image processor budget (`image_processor`: min_pixels, max_pixels), which
  `osvl_jax.export_hf` writes into the exported preprocessor_config.json.

  Raises:
    ValueError: from `check_config`, before anything is read or written.
  """
  check_config(config)
  workdir = storage.path(workdir)  # gs://... stays a URL
  cfg = config.sft
  trajectories = data.load_sft_trajectories(config, workdir)
  recorded = data.build_system_prompt(config, workdir)
  if recorded is not None:
    policy_config.check_system_prompt(config, recorded, f'the dataset {data.dataset_dir(config, workdir)}')
  print(f'sft: {len(trajectories)} expert trajectories', flush=True)

  # The mesh of config.mesh (every host's devices): model and optimizer state created sharded on it by the rules.
  mesh = sharding.mesh_from_config(config.get('mesh')) if mesh is None else mesh
  rules = sharding.rules_from_config(config)
  model, optimizer = policy.create(config, mesh, 'sft', workdir)
  policy.check_vocabulary(model, trajectories, 'SFT')
  mngr = checkpoints.manager(workdir, 'sft_ckpt')
  meta = checkpoints.restore(mngr, model, optimizer)  # onto the placement above, whatever mesh wrote it
  start = meta['step'] if meta else 0
  if start:
    print(f'sft: resumed at step {start}', flush=True)
  writer = metrics.MetricWriter(workdir, 'sft')
  if cfg.get('pack_rows'):
    train_step, budget = packer(cfg, trajectories, mesh, rules, model.config.vision)
    print(f'sft: packed rows of {budget.length} tokens, {budget.num_loss} loss tokens, {budget.patches} patches per '
          f'batch shard, {cfg.pack_rows} rows per micro-batch', flush=True)
  else:
    train_step = make_step(cfg, placer(cfg, trajectories, mesh, rules, model.config.vision))
  t0, tokens = time.time(), 0
  for step in tqdm.trange(start, cfg.steps, desc='sft', initial=start, total=cfg.steps,
                          disable=not distributed.is_main()):
    idx = data.batch_indices(step, cfg.batch_size, len(trajectories), config.seed)
    with sharding.use_mesh(mesh, rules):  # activation constraints on
      out = train_step(model, optimizer, [trajectories[i] for i in idx])
    tokens += out['num_tokens']
    if (step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps:
      out = jax.device_get(out)
      writer.write(step + 1, {**out, 'target_tokens_per_s': tokens / (time.time() - t0)})
      t0, tokens = time.time(), 0
    if (step + 1) % cfg.ckpt_every == 0 or step + 1 == cfg.steps:
      checkpoints.save(mngr, step + 1, model, optimizer, {'stage': 'sft', **policy_config.checkpoint_meta(config)},
                      wait=step + 1 == cfg.steps)  # asynchronous but the last
  writer.close()
  return model


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # orbax logs every checkpoint step at INFO
  distributed.initialize()  # multi-host (TPU pod, or OSVL_* / JAX_COORDINATOR_ADDRESS variables); else a no-op
  check_config(_CONFIG.value)
  compile_cache.enable_for_run(_CONFIG.value, _WORKDIR.value)
  mesh = sharding.mesh_from_config(_CONFIG.value.get('mesh'))  # the run's one mesh, passed down (big_vision)
  train(_CONFIG.value, _WORKDIR.value, mesh)


if __name__ == '__main__':
  # Flags are defined only when run as a program, so the modules import into each other (and tests) freely.
  _CONFIG = config_flags.DEFINE_config_file('config', 'configs/demo.py', 'ml_collections config file.')
  _WORKDIR = flags.DEFINE_string('workdir', None, 'Job folder (checkpoints, metrics); reruns resume.', required=True)
  app.run(main)
