"""Compiles the real SFT train step of a config on the local devices from abstract shapes, and reads XLA's memory
analysis: the check of `estimate` (nothing is allocated; arguments are `jax.ShapeDtypeStruct`s with their
`NamedSharding`s).

The step is `sft.make_train_step`'s written as a pure function over the `nnx.split` state: `sft.loss_fn`
(`policy.loss_logprobs` + `losses.sft_loss`, + the MoE router losses where config.sft sets them),
`jax.value_and_grad`, the optax transform of `policy.make_tx` (AdamW, global-norm clip), parameters and optimizer
state donated (updated in place, as a trainer that keeps one copy would).
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from osvl_jax.models.qwen3_vl import config as config_lib
from osvl_jax.models.qwen3_vl import sharding
from osvl_jax.plan import estimate
from osvl_jax.train import policy, sft


def batch_shapes(mesh: Mesh, rows: int, seq_len: int, loss_tokens: int, rule_table, packed: bool = False) -> dict:
  """Text-only SFT batch (`batching.collate` fields) as ShapeDtypeStructs, rows split over the 'batch' axes:
  input_ids int32 [B, T], attention_mask [B, T] (bool; int32 segment ids when `packed`: `sft.pack_rows`),
  position_ids int32 [3, B, T], loss_positions / loss_targets int32 [B, K], completion_mask bool [B, K]."""
  def sds(shape, dtype, batch_dim=0):
    return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding.data_sharding(mesh, len(shape), batch_dim, rule_table))
  return {'input_ids': sds((rows, seq_len), jnp.int32),
          'attention_mask': sds((rows, seq_len), jnp.int32 if packed else jnp.bool_),
          'position_ids': sds((3, rows, seq_len), jnp.int32, 1),
          'loss_positions': sds((rows, loss_tokens), jnp.int32), 'loss_targets': sds((rows, loss_tokens), jnp.int32),
          'completion_mask': sds((rows, loss_tokens), jnp.bool_)}


def compile_sft_step(config: ml_collections.ConfigDict, mesh: Mesh, *, rows: int, seq_len: int, loss_tokens: int,
                     arch: config_lib.Qwen3VLConfig | None = None) -> dict:
  """Lowers and compiles the SFT step of `config` for `rows` rows x `seq_len` tokens (`loss_tokens` loss positions
  per row) on `mesh`.

  Returns:
    XLA's per-device `memory_analysis()` in bytes: argument, output, alias, temp, generated_code, and
    total = argument + output - alias + temp; plus compile_s (seconds to lower + compile).
  """
  arch = arch or estimate.architecture(config)
  rule_table = sharding.rules_from_config(config)
  model = estimate.abstract_model(config, arch)
  cfg = config.sft
  tx = policy.make_tx(cfg.lr, cfg.steps, cfg.warmup_steps, cfg.weight_decay, cfg.grad_clip)
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  opt_state = jax.eval_shape(tx.init, params)
  param_sh = sharding.state_shardings(params, mesh, rule_table)
  opt_sh = sharding.state_shardings(opt_state, mesh, rule_table)   # Adam mu / nu: their parameter's sharding
  with_sharding = lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s)
  params_in = jax.tree.map(with_sharding, params, param_sh)
  opt_in = jax.tree.map(with_sharding, opt_state, opt_sh)
  batch = batch_shapes(mesh, rows, seq_len, loss_tokens, rule_table, packed=bool(cfg.get('pack_rows')))

  router_coefs = policy.router_loss_coefs(cfg)

  def train_step(params, opt_state, batch):
    def loss_fn(params):   # `sft.loss_fn`: with the MoE router losses when config.sft sets them
      return sft.loss_fn(nnx.merge(graphdef, params, rest), batch, router_coefs)

    (loss, _), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  t0 = time.time()
  with sharding.use_mesh(mesh, rule_table):
    step = jax.jit(train_step, out_shardings=(param_sh, opt_sh, NamedSharding(mesh, PartitionSpec())),
                   donate_argnums=(0, 1))
    compiled = step.lower(params_in, opt_in, batch).compile()
  seconds = time.time() - t0
  m = compiled.memory_analysis()
  out = {'argument': m.argument_size_in_bytes, 'output': m.output_size_in_bytes, 'alias': m.alias_size_in_bytes,
         'temp': m.temp_size_in_bytes, 'generated_code': m.generated_code_size_in_bytes}
  out['total'] = out['argument'] + out['output'] - out['alias'] + out['temp']
  out['compile_s'] = seconds
  return out


def local_mesh(num_devices: int | None = None) -> tuple[Mesh, dict[str, int]]:
  """An FSDP mesh (fsdp = every local device, the other axes 1) over the local devices, and its sizes."""
  devices = jax.devices()[:num_devices] if num_devices else jax.devices()
  sizes = {a: (len(devices) if a == 'fsdp' else 1) for a in sharding.MESH_AXES}
  return sharding.make_mesh(**sizes, devices=devices), sizes


def report(xla: dict, plan: estimate.Plan) -> str:
  """Estimate beside XLA's memory analysis (GB = 1e9 bytes, per device) and their ratio xla_total / estimate."""
  gb = estimate.GB
  lines = [f"compiled SFT step on {np.prod(list(plan.mesh.values()))} local device(s), mesh "
           + ' '.join(f'{a}={s}' for a, s in plan.mesh.items())
           + f'; {plan.rows_per_chip} row(s)/device x {plan.seq_len} tokens; compile {xla["compile_s"]:.1f} s',
           f"{'per device':<42}{'GB (1e9 B)':>12}"]
  for name in ('argument', 'output', 'alias', 'temp', 'generated_code', 'total'):
    lines.append(f'{"xla " + name:<42}{xla[name] / gb:>12.3f}')
  lines.append(f'{"estimate total":<42}{plan.total / gb:>12.3f}')
  lines.append(f'xla_total_gb={xla["total"] / gb:.3f} estimate_gb={plan.total / gb:.3f} '
               f'ratio={xla["total"] / plan.total:.3f}')
  return '\n'.join(lines)
