"""The policy both trainers train: model, optimizer, the one forward pass (log-probs at loss positions only), and
their placement on the trainer's mesh (DESIGN.md §3: the training mains own the mesh, big_vision style).

SFT and GRPO share one path:
  mesh = sharding.mesh_from_config(config.mesh)           # ('data', 'fsdp', 'tensor', 'expert')
  model, optimizer = policy.create(config, mesh, 'sft')   # created sharded: no full copy on one device
  batch = placement.shard_batch(batch, mesh, rules, vision)  # rows over ('data', 'fsdp'), images per shard
  with sharding.use_mesh(mesh, rules): step(model, optimizer, batch, ...)
Parameters and the optimizer state (Adam mu / nu like their parameter) are placed by the model's logical rules
(`models/qwen3_vl/sharding.py`, overridable with `config.sharding_rules`); batches by `placement`.
"""

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import nnx

from osvl_jax import checkpoints
from osvl_jax import config_checks as checks
from osvl_jax.models.qwen3_vl import config as config_lib
from osvl_jax.models.qwen3_vl import model as model_lib
from osvl_jax.models.qwen3_vl import moe
from osvl_jax.models.qwen3_vl import sharding
from osvl_jax.models.qwen3_vl import vision as vision_lib
from osvl_jax.models.qwen3_vl import weights
from osvl_jax.rl import losses


SCHEDULES = ('cosine', 'constant')
# The optimizer's defaults where a stage's config leaves them out (configs/demo.py's values): AdamW β2 0.95, a cosine
# ending at 10% of the lr. The frameworks of the paper's run (HF Trainer, verl) use β2 0.999 and a cosine to 0
# (configs/qwen3vl_paper.py sets them).
ADAM_B2 = 0.95
MIN_LR_RATIO = 0.1


def make_schedule(lr: float, steps: int, warmup_steps: int = 0, kind: str = 'cosine',
                  min_lr_ratio: float = MIN_LR_RATIO) -> optax.Schedule:
  """Learning rate per optimizer step: linear warmup from 0 over `warmup_steps`, then (`kind`) 'cosine' decay to
  min_lr_ratio · `lr` at `steps` (HF Trainer's 'cosine': 0), or 'constant' `lr` (verl's actor default, the
  official GRPO run's); without warmup the first step already uses `lr`.

  Raises:
    ValueError: steps < 1, warmup_steps < 0 or warmup_steps >= steps (optax's cosine decay needs >= 1 step), an
      unknown `kind`, min_lr_ratio outside [0, 1].
  """
  if kind not in SCHEDULES:
    raise ValueError(f'lr_schedule={kind!r}: expected one of {SCHEDULES}')
  if steps < 1:
    raise ValueError(f'steps={steps}: the schedule needs at least one step')
  if not 0 <= warmup_steps < steps:
    raise ValueError(f'warmup_steps={warmup_steps} must lie in [0, steps={steps})')
  if not 0 <= min_lr_ratio <= 1:
    raise ValueError(f'min_lr_ratio={min_lr_ratio} must lie in [0, 1]')
  if kind == 'constant':
    if warmup_steps == 0:
      return optax.constant_schedule(lr)
    return optax.join_schedules([optax.linear_schedule(0.0, lr, warmup_steps), optax.constant_schedule(lr)],
                                [warmup_steps])
  if warmup_steps == 0:
    return optax.cosine_decay_schedule(lr, decay_steps=steps, alpha=min_lr_ratio)
  return optax.warmup_cosine_decay_schedule(0.0, lr, warmup_steps, steps, end_value=lr * min_lr_ratio)


def make_tx(lr: float, steps: int, warmup_steps: int = 0, weight_decay: float = 0.0,
            grad_clip: float = 1.0, schedule: str = 'cosine', b2: float = ADAM_B2,
            min_lr_ratio: float = MIN_LR_RATIO) -> optax.GradientTransformation:
  """AdamW (b1 0.9, `b2`, decoupled `weight_decay`) on `make_schedule(lr, steps, warmup_steps, schedule,
  min_lr_ratio)`, global-norm clipping at `grad_clip`.

  Raises:
    ValueError: from `make_schedule`.
  """
  return optax.chain(optax.clip_by_global_norm(grad_clip),
                     optax.adamw(make_schedule(lr, steps, warmup_steps, schedule, min_lr_ratio), b1=0.9, b2=b2,
                                 weight_decay=weight_decay))


def check_optimizer_config(config: ml_collections.ConfigDict, stage: str) -> None:
  """Checks the optional optimizer and router-loss fields of `config.<stage>` that `create` / `router_loss_coefs`
  read: adam_b2 in [0, 1), min_lr_ratio in [0, 1], router_loss_form one of `moe.ROUTER_LOSS_FORMS`.

  Raises:
    ValueError: naming the field and its value.
  """
  checks.number(config, f'{stage}.adam_b2', low=0, high=1, high_open=True, optional=True)
  checks.number(config, f'{stage}.min_lr_ratio', low=0, high=1, optional=True)
  if config[stage].get('router_loss_form') is not None:
    checks.choice(config, f'{stage}.router_loss_form', moe.ROUTER_LOSS_FORMS)


def create_model(config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh,
                 seed: int = 0, workdir=None) -> model_lib.Qwen3VLModel:
  """`checkpoints.build_model(config, seed, workdir)` created directly sharded on `mesh` by the rules
  (`config.sharding_rules`).

  A random init is traced abstractly (`nnx.eval_shape`) and then run by `jax.jit` with the rules' `out_shardings`,
  so each device only ever materialises its own shards; an HF folder (`model.hf_path`) is read one tensor at a
  time, each placed in its sharding (`weights.load_hf_folder(mesh=...)`). The values are the same on every mesh
  (and `checkpoints.build_model`'s up to float rounding of the jitted init).
  """
  rules = sharding.rules_from_config(config)
  if config.model.get('hf_path'):
    model, _ = weights.load_hf_folder(config.model.hf_path, scan_layers=bool(config.model.get('scan_layers', False)),
                                      mesh=mesh, rules=rules, **checkpoints.model_dtypes(config))
    return checkpoints.set_layer_options(model, config)
  make = lambda: checkpoints.build_model(config, seed, workdir=workdir)
  graphdef, abstract = nnx.split(nnx.eval_shape(make))
  init = jax.jit(lambda: nnx.split(make())[1], out_shardings=sharding.state_shardings(abstract, mesh, rules))
  return nnx.merge(graphdef, init())


def create_optimizer(model: nnx.Module, tx: optax.GradientTransformation, mesh: jax.sharding.Mesh,
                     rules=sharding.LOGICAL_RULES) -> nnx.Optimizer:
  """`nnx.Optimizer(model, tx)` over the model's `nnx.Param`s, its state created directly sharded: Adam's mu / nu
  take their parameter's sharding (their paths end in the parameter's), counts are replicated."""
  graphdef, abstract = nnx.split(nnx.eval_shape(lambda m: nnx.Optimizer(m, tx, wrt=nnx.Param), model))
  model_def = nnx.graphdef(model)
  init = jax.jit(lambda state: nnx.split(nnx.Optimizer(nnx.merge(model_def, state), tx, wrt=nnx.Param))[1],
                 out_shardings=sharding.state_shardings(abstract, mesh, rules))
  return nnx.merge(graphdef, init(nnx.state(model)))


def create(config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh,
           stage: str, workdir=None) -> tuple[model_lib.Qwen3VLModel, nnx.Optimizer]:
  """The policy and its optimizer, both created sharded on `mesh` (SFT and GRPO alike).

  Args:
    config: the job config: `model`, `seed`, optional `sharding_rules`, and the stage's optimizer settings.
    mesh: the trainer's mesh (`sharding.mesh_from_config(config.mesh)`).
    stage: 'sft' or 'grpo': `config.<stage>` gives lr, steps and optionally warmup_steps (0), weight_decay (0.0),
      grad_clip (1.0), lr_schedule ('cosine' | 'constant'), adam_b2 (`ADAM_B2`), min_lr_ratio (`MIN_LR_RATIO`) to
      `make_tx`. The schedule spans optimizer steps: for
      GRPO each of the `steps` rollout batches makes ppo_epochs × (prompts_per_step / mini_batch_prompts) of them
      (DESIGN.md §6), and warmup_steps counts rollout steps too.
    workdir: the job folder, whose dataset a compact `model.vocab='dataset'` names (`checkpoints.vocab_ids`).
  Returns:
    (model, optimizer).
  Raises:
    ValueError: from `build_model` / `make_schedule`.
  """
  cfg = config[stage]
  per_step = 1
  if stage == 'grpo':
    mini = cfg.get('mini_batch_prompts') or cfg.prompts_per_step
    per_step = int(cfg.get('ppo_epochs') or 1) * max(int(cfg.prompts_per_step) // int(mini), 1)
  model = create_model(config, mesh, seed=config.seed, workdir=workdir)
  tx = make_tx(cfg.lr, cfg.steps * per_step, cfg.get('warmup_steps', 0) * per_step, cfg.get('weight_decay', 0.0),
               cfg.get('grad_clip', 1.0), cfg.get('lr_schedule', 'cosine'), cfg.get('adam_b2', ADAM_B2),
               cfg.get('min_lr_ratio', MIN_LR_RATIO))
  return model, create_optimizer(model, tx, mesh, sharding.rules_from_config(config))


def check_vocabulary(model: model_lib.Qwen3VLModel, trajectories, stage: str) -> None:
  """Refuses trajectories that hold an id the model has no row for (a compact vocabulary's row would be another
  id's under jit): `config.check_ids` on each.

  Raises:
    ValueError: naming the stage, the trajectory (prompt_id, sample) and the first such id.
  """
  for t in trajectories:
    config_lib.check_ids(model.config, t.token_ids, f'{stage} trajectory {t.prompt_id!r} (sample {t.sample_index})')


def mask_out_of_vocabulary(model: model_lib.Qwen3VLModel, trajectories: list) -> tuple[list, int]:
  """(the trajectories with every id their model's compact vocabulary lacks, at a position the policy did not emit,
  replaced by `<|endoftext|>`, how many trajectories were changed).

  A compact vocabulary (`model.vocab`) lists the ids of the dataset, but a tool's text (a search result, an error
  echoing a malformed call) may hold others. The embedded sampler reads such an id as `<|endoftext|>`, the
  vocabulary's unknown-token stand-in (`jax_sampler.JaxSampler.generate`); the update reads the same ids here, so
  its log-probs are the sampler's. The policy can only emit ids of the vocabulary. With the full vocabulary
  nothing changes.

  Args:
    model: the policy (its `config.text.vocab_ids`).
    trajectories: `Trajectory` records (token_ids [T] int, gen_mask [T] bool).
  Raises:
    ValueError: an emitted id outside the vocabulary (a trajectory this policy cannot have sampled), naming the
      trajectory (`config.check_ids`).
  """
  vocab = model.config.text.vocab_ids
  if vocab is None:
    return list(trajectories), 0
  out, changed = [], 0
  for t in trajectories:
    ids = np.asarray(t.token_ids)
    read = config_lib.read_unknown_as_endoftext(model.config, ids)
    if (read != ids).any():
      config_lib.check_ids(model.config, ids[np.asarray(t.gen_mask, bool)],
                           f'trajectory {t.prompt_id!r} (sample {t.sample_index}), its emitted ids')
      t = dataclasses.replace(t, token_ids=read)
      changed += 1
    out.append(t)
  return out, changed


def pin_placement(*modules: nnx.Module) -> None:
  """Inside a jitted step under `sharding.use_mesh`: constrains the state of each module (model, optimizer) to the
  rules' shardings after an update (`sharding.constrain_state`), so parameters and Adam moments stay where
  `create` put them. A no-op without a mesh."""
  for module in modules:
    nnx.update(module, sharding.constrain_state(nnx.state(module)))


@functools.partial(jax.jit, donate_argnums=0)
def add_grads(total, grads):
  """Jitted: `total` + `grads` leaf by leaf (gradient accumulation over micro-batches; pytrees of the same
  structure, e.g. the nnx.State of the parameters' gradients), one program for the whole tree; `total` is donated
  (the sum is written in place: one accumulator's memory, not two)."""
  return jax.tree.map(jnp.add, total, grads)


@functools.partial(nnx.jit, donate_argnums=(1, 2))
def apply_grads(model, optimizer, grads) -> jax.Array:
  """Jitted: one optimizer step with `grads` (in place); returns their global norm, before clipping. The updated
  parameters and optimizer state keep the mesh rules' shardings (`pin_placement`).

  The optimizer state and `grads` are donated (updated in place / consumed). The parameters are not: the embedded
  sampler's snapshot (`JaxSampler.set_model`, `nnx.clone`) shares the model's arrays and may still be rolling out
  with them (`grpo.max_staleness` >= 1)."""
  optimizer.update(model, grads)
  pin_placement(model, optimizer)
  return optax.tree.norm(grads)


# Loss positions per vocabulary projection, over one batch shard's rows (`chunked_token_logprobs`). 512: on the 2-core
# CPU the gradient of 8 x 512 positions takes 3.4 s against 4.8 s at 2048 (whose float32 logits are 1.2 GB a chunk),
# 2 x 1,280 2.3 s against 4.9 s (BENCHMARKS.md, session 20); the projection is a large matmul either way.
LOSS_CHUNK = 512


def loss_logprobs(model: model_lib.Qwen3VLModel, batch: dict, temperature=1.0) -> jax.Array:
  """`loss_logprobs_and_router_stats` without the router statistics: [B, K] float32 log-probs."""
  return loss_logprobs_and_router_stats(model, batch, temperature)[0]


def loss_logprobs_and_router_stats(model: model_lib.Qwen3VLModel, batch: dict, temperature=1.0,
                                   router_stats: bool = False, chunk: int = LOSS_CHUNK
                                   ) -> tuple[jax.Array, dict | None]:
  """Log-probs of the emitted tokens at the batch's loss positions, of the distribution at `temperature`, and
  (with `router_stats`, MoE) the router-loss statistics of the same forward pass.

  Args:
    model: the policy.
    batch: from `batching.collate` (jnp or np arrays; flat pixel_values with static image_grid_thw), or laid out
      per shard (`vision_layout` / `shard_batch`: pixel_values [S, P, D] and the `vision_*` geometry arrays).
    temperature: > 0, a Python float or a float32 scalar: log_softmax(logits / temperature), the distribution a
      rollout at that temperature samples from (verl divides the logits by the rollout temperature for π_old,
      π_θ and π_ref alike). 1.0 (SFT) leaves the logits as they are.
    router_stats: also return the MoE router statistics over the batch's real tokens (`attention_mask`):
      `moe.router_stats` stacked over the sparse layers (None for a dense model). False: the forward as without.
    chunk: loss positions per vocabulary projection over one batch shard's rows (`chunked_token_logprobs`).
  Returns:
    ([B, K] float32 log pi_T(token t+1 | tokens <= t) at `loss_positions`, garbage where `completion_mask` is 0
    (with a compact vocabulary: of the distribution over its rows, the targets mapped to rows); the router
    statistics or None).
  """
  out = model(batch['input_ids'], batch['position_ids'], batch['attention_mask'],
              pixel_values=batch.get('pixel_values'), image_grid_thw=batch.get('image_grid_thw'),
              vision_inputs=vision_inputs(batch), router_stats=router_stats)
  hidden, stats = out[0], (out[2] if router_stats else None)
  gathered = jnp.take_along_axis(hidden, batch['loss_positions'][..., None], axis=1)  # [B, K, H]
  return chunked_token_logprobs(gathered, model.output_table(gathered.dtype), model.ids_to_rows(batch['loss_targets']),
                                temperature, chunk), stats


def chunked_token_logprobs(hidden, table, targets, temperature=1.0, chunk: int = LOSS_CHUNK,
                           shards: int | None = None) -> jax.Array:
  """log softmax(hidden · tableᵀ / temperature)[targets], at most `chunk` loss positions per batch shard at a time.

  The [B, K, vocab] logits of a long budget or a wide batch do not fit (K = 71,680 positions of a 151,936-id
  vocabulary are 43 GB per row in float32; the GRPO update's 8 rows x 1,024 positions of the learning bench 5 GB
  per copy, 26 GB for the gradient): K is cut into chunks of c = chunk // (rows per batch shard) positions, so that
  each device's live logits are [rows per shard, c, vocab] <= `chunk` positions whatever the batch's width; each
  chunk is projected, reduced to its log-probs and dropped (`jax.lax.map`), and recomputed in the backward pass
  (`jax.checkpoint`). K <= c (or chunk 0) is the one projection, exactly `losses.token_logprobs`. Each position's
  log-prob is its own row of the matmul and log-softmax, so the chunking changes no value beyond rounding. The
  chunks are balanced: n = ceil(K / c) chunks of ceil(K / n) positions, under n padded positions per row.

  Args:
    hidden: [B, K, H] hidden states at the loss positions (compute dtype).
    table: [V, H] output projection (`Qwen3VLModel.output_table`).
    targets: int [B, K] rows of `table` (token ids; `Qwen3VLModel.ids_to_rows` of them with a compact vocabulary).
    temperature: > 0, a Python float or float32 scalar (the logits are divided by it).
    chunk: loss positions per projection over one batch shard's rows, an int >= 0.
    shards: the batch shards the B rows are split over; None = those of the enclosing `sharding.use_mesh` (the
      trainers trace their steps in one; 1 outside any).
  Returns:
    float32 [B, K].
  """
  def project(h, t):
    logits = jnp.einsum('bth,vh->btv', h, table, preferred_element_type=jnp.float32)
    if not (isinstance(temperature, (int, float)) and temperature == 1):
      logits = logits / jnp.asarray(temperature, jnp.float32)
    return losses.token_logprobs(logits, t)

  b, k = targets.shape
  if shards is None:
    mesh = jax.sharding.get_abstract_mesh()
    shards = 1 if mesh.empty else sharding.batch_shards(mesh, sharding.current_rules())
  rows_per_shard = max(1, b // max(1, shards))
  per_row = max(1, chunk // rows_per_shard) if chunk else 0   # positions of each row per projection
  if not per_row or k <= per_row:
    return project(hidden, targets)
  n = -(-k // per_row)
  per_row = -(-k // n)                                          # balanced chunks: under n padded positions a row
  pad = n * per_row - k
  h = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0))).reshape(b, n, per_row, -1).swapaxes(0, 1)   # [n, B, c, H]
  t = jnp.pad(targets, ((0, 0), (0, pad))).reshape(b, n, per_row).swapaxes(0, 1)
  out = jax.lax.map(jax.checkpoint(lambda args: project(*args)), (h, t))                       # [n, B, c]
  return out.swapaxes(0, 1).reshape(b, n * per_row)[:, :k]


ROUTER_LOSS_FIELDS = ('router_aux_loss_coef', 'router_z_loss_coef')


class RouterLoss(NamedTuple):
  """A stage's MoE router losses: coefficients of the load-balancing (aux) and z-losses, and how the sparse layers'
  losses combine (`moe.ROUTER_LOSS_FORMS`: 'per_layer', Megatron's sum of per-layer losses; 'pooled', HF's one loss
  over pooled statistics). Hashable: a static argument of the compiled steps."""
  aux: float
  z: float
  form: str = 'per_layer'


def router_loss_coefs(cfg: ml_collections.ConfigDict | None) -> RouterLoss:
  """The MoE router losses of a stage's config (`config.sft` / `config.grpo`): `router_aux_loss_coef` (HF
  `Qwen3VLMoeTextConfig`'s name) and `router_z_loss_coef` (HF `SwitchTransformers`'s), 0.0 where absent or None
  (off), and `router_loss_form` ('per_layer' where absent)."""
  cfg = cfg or {}
  return RouterLoss(*(float(cfg.get(name) or 0.0) for name in ROUTER_LOSS_FIELDS),
                    cfg.get('router_loss_form') or 'per_layer')


def router_losses_on(model: model_lib.Qwen3VLModel, coefs: tuple) -> bool:
  """Whether the step adds router losses: a MoE model and a non-zero coefficient (a dense model has no router;
  with both coefficients 0 the step traces exactly the program it traces without them)."""
  return model.config.is_moe and any(RouterLoss(*coefs)[:2])


def router_loss(stats: dict, coefs: tuple, weight=1.0) -> tuple[jax.Array, dict]:
  """The router terms a step adds to its task loss: weight · (aux_coef · aux + z_coef · z), with aux the
  load-balancing loss (`moe.load_balancing_loss`) and z the ST-MoE z-loss (`moe.z_loss`) in the form
  `coefs.form`: 'per_layer', Megatron's losses per sparse layer summed over the layers; 'pooled', transformers'
  `load_balancing_loss_func` with the attention mask (HF adds router_aux_loss_coef · aux to the LM loss the same way).

  Args:
    stats: `loss_logprobs_and_router_stats`'s router statistics of this (micro-)batch.
    coefs: a `RouterLoss` (`router_loss_coefs`), or (aux_coef, z_coef) in the 'per_layer' form.
    weight: the share of this micro-batch in the optimizer step's batch (rows / rows of the step), float or
      float32 scalar, so that the micro-batch terms add up to the row-weighted mean (HF's gradient accumulation).
  Returns:
    (float32 [] penalty, {'router_aux_loss': weight · aux, 'router_z_loss': weight · z}): metrics that sum over a
    step's micro-batches to the step's (row-weighted mean) values.
  Raises:
    ValueError: an unknown form.
  """
  coefs = RouterLoss(*coefs)
  aux = weight * moe.load_balancing_loss(stats, coefs.form)
  z = weight * moe.z_loss(stats, coefs.form)
  return coefs.aux * aux + coefs.z * z, {'router_aux_loss': aux, 'router_z_loss': z}


def vision_inputs(batch: dict) -> dict | None:
  """The per-shard geometry arrays of a laid-out batch (fields 'vision_<name>', `vision.GEOMETRY_FIELDS`) as the
  model's `vision_inputs` dict, or None for a flat (or image-less) batch."""
  if 'vision_segment_ids' not in batch:
    return None
  return {k: batch[f'vision_{k}'] for k in vision_lib.GEOMETRY_FIELDS}
