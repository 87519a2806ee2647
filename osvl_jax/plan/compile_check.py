"""Compiles the real SFT train step of a config, and one decode step of the embedded sampler on a rollout layout, on
the local devices from abstract shapes, and reads XLA's memory analysis: the check of `estimate` and
`rollout_phase` (nothing is allocated; arguments are `jax.ShapeDtypeStruct`s with their `NamedSharding`s).

The step is `sft.make_train_step`'s written as a pure function over the `nnx.split` state: `sft.loss_fn`
(`policy.loss_logprobs` + `losses.sft_loss`, + the MoE router losses where config.sft sets them),
`jax.value_and_grad`, the optax transform of `policy.make_tx` (AdamW, global-norm clip), parameters and optimizer
state donated (updated in place, as a trainer that keeps one copy would).

The decode step is `JaxSampler._decode_fn`'s program, built by a real `JaxSampler` whose weights are the abstract
model's placed on the rollout layout (`AbstractLayout`: `Layout.place_state` giving ShapeDtypeStructs), the KV
cache donated as the sampler donates it. On CPU, XLA writes a bfloat16 cache through float32: each layer's scatter
converts the whole k and v buffers to float32 and back (whole-cache `convert`s around the `scatter` in the
optimized HLO), which `temp` counts (~2 x the KV bytes) and which the estimate does not; a float32 cache compiles
without them (tests/train/test_plan_rollout.py compares at float32).

This is the planner's one module that imports `osvl_jax.train` (the trainers' steps and their loss chunk).
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
from osvl_jax.rollout.embedded import jax_sampler, layout as layout_lib
from osvl_jax.train import policy, sft

# Loss positions per vocabulary projection of the trainers' loss (`policy.chunked_token_logprobs`), read by `estimate`.
LOSS_CHUNK = policy.LOSS_CHUNK


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
  return _memory(compiled, time.time() - t0)


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


def _memory(compiled, seconds: float) -> dict:
  m = compiled.memory_analysis()
  out = {'argument': m.argument_size_in_bytes, 'output': m.output_size_in_bytes, 'alias': m.alias_size_in_bytes,
         'temp': m.temp_size_in_bytes, 'generated_code': m.generated_code_size_in_bytes}
  out['total'] = out['argument'] + out['output'] - out['alias'] + out['temp']
  out['compile_s'] = seconds
  return out


class AbstractLayout(layout_lib.Layout):
  """A rollout `Layout` whose `place_state` gives ShapeDtypeStructs with the rollout layout's NamedShardings (for
  an abstract model: nothing is allocated)."""

  def place_state(self, state):
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state,
                        sharding.state_shardings(state, self.mesh, self.rules))


def rollout_mesh(tensor: int, num_devices: int | None = None) -> Mesh:
  """The rollout mesh (`layout.mesh_from_config`) of `tensor` over the local devices, replicas over the rest."""
  devices = jax.devices()[:num_devices] if num_devices else jax.devices()
  return layout_lib.mesh_from_config({'tensor': tensor}, devices)


def _abstract_sampler(config: ml_collections.ConfigDict, mesh: Mesh, rows: int, cache_len: int, arch, cache_dtype
                      ) -> tuple[jax_sampler.JaxSampler, dict]:
  """A `JaxSampler` over the abstract model of `config` on `mesh` (`AbstractLayout`), and its KV cache of `rows` x
  `cache_len` as ShapeDtypeStructs on the rollout layout."""
  arch = arch or estimate.architecture(config)
  model = estimate.abstract_model(config, arch)
  sampler = jax_sampler.JaxSampler(model, None, max_len=cache_len, cache_dtype=cache_dtype)
  sampler.layout = AbstractLayout(mesh)
  sampler.set_model(model)                     # the weights as ShapeDtypeStructs on the rollout layout
  if rows % sampler.layout.replicas:
    raise ValueError(f'rows={rows} is not a multiple of the {sampler.layout.replicas} rollout replicas')
  shapes = jax.eval_shape(lambda: model.init_cache(rows, cache_len, cache_dtype))
  shardings = sampler.layout.cache_shardings()
  return sampler, {k: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=shardings[k]) for k, x in shapes.items()}


def compile_decode_step(config: ml_collections.ConfigDict, mesh: Mesh, *, rows: int, cache_len: int,
                        arch: config_lib.Qwen3VLConfig | None = None, cache_dtype=None) -> dict:
  """Lowers and compiles one call of the embedded sampler's decode program (`JaxSampler._decode_fn`: sampling at a
  temperature, no top-p, the sampler's default `decode_steps` per call) on the rollout mesh `mesh`, for `rows` rows
  (a multiple of the replicas) and a KV cache of `cache_len` slots in `cache_dtype` (None: the model's compute
  dtype, as `factory.make_engine` leaves it), the cache donated.

  Returns:
    XLA's per-device `memory_analysis()` in bytes, as `compile_sft_step`'s (argument, output, alias, temp,
    generated_code, total = argument + output - alias + temp, compile_s), and cache_dtype (its name).
  Raises:
    ValueError: `rows` not a multiple of the replicas; the mesh's tensor size not dividing the KV heads.
  """
  sampler, cache = _abstract_sampler(config, mesh, rows, cache_len, arch, cache_dtype)
  row = NamedSharding(mesh, PartitionSpec('data'))
  carry = tuple(jax.ShapeDtypeStruct((rows,), d, sharding=row) for d in (jnp.int32,) * 4 + (jnp.bool_,))
  decode = sampler._decode_fn(False, False, sampler.decode_steps)   # pylint: disable=protected-access
  t0 = time.time()
  lowered = decode.lower(sampler._state, cache, carry,   # pylint: disable=protected-access
                         jax.ShapeDtypeStruct((rows,), jnp.int32, sharding=row), jax.random.key(0), jnp.int32(0),
                         jnp.float32(0.7), jnp.float32(1.0))
  compiled = lowered.compile()
  return {**_memory(compiled, time.time() - t0), 'cache_dtype': jnp.dtype(cache['k'].dtype).name}


def compile_prefill_step(config: ml_collections.ConfigDict, mesh: Mesh, *, rows: int, prefill_len: int,
                         cache_len: int, arch: config_lib.Qwen3VLConfig | None = None, cache_dtype=None) -> dict:
  """Lowers and compiles the embedded sampler's prefill program (`JaxSampler._prefill_fn`: sampling at a
  temperature, no top-p, no images) on the rollout mesh `mesh` for `rows` rows of `prefill_len` prompt tokens
  written into a KV cache of `cache_len` slots (the cache donated), as `compile_decode_step`.

  Returns:
    XLA's per-device memory analysis, as `compile_decode_step`'s.
  Raises:
    ValueError: as `compile_decode_step`.
  """
  sampler, cache = _abstract_sampler(config, mesh, rows, cache_len, arch, cache_dtype)
  row, rows2 = NamedSharding(mesh, PartitionSpec('data')), NamedSharding(mesh, PartitionSpec('data', None))
  sds = lambda shape, dtype, sh: jax.ShapeDtypeStruct(shape, dtype, sharding=sh)
  prefill = sampler._prefill_fn(False, False)   # pylint: disable=protected-access
  t0 = time.time()
  lowered = prefill.lower(sampler._state, sds((rows, prefill_len), jnp.int32, rows2),   # pylint: disable=W0212
                          sds((3, rows, prefill_len), jnp.int32, NamedSharding(mesh, PartitionSpec(None, 'data'))),
                          sds((rows, prefill_len), jnp.bool_, rows2), None, sds((rows,), jnp.int32, row),
                          sds((rows,), jnp.int32, row), cache, jax.random.key(0), jnp.float32(0.7), jnp.float32(1.0))
  compiled = lowered.compile()
  return {**_memory(compiled, time.time() - t0), 'cache_dtype': jnp.dtype(cache['k'].dtype).name}


def rollout_report(xla: dict, plan, prefill: dict | None = None) -> str:
  """XLA's memory analysis of the decode step (and of the prefill, when given) beside `rollout_phase.RolloutPlan`'s
  sampler bytes of the same program (weights + kv + decode, or + prefill, temporaries), per device (GB = 1e9 bytes),
  and their ratios; the decode's line last."""
  gb = estimate.GB
  lines = [f'compiled rollout steps on the rollout layout tensor={plan.tensor} data={plan.replicas} of the local '
           f'devices; {plan.rows} rows ({plan.rows_per_replica}/replica)', f"{'per device':<42}{'GB (1e9 B)':>12}"]
  if jax.default_backend() == 'cpu' and xla.get('cache_dtype') == 'bfloat16':
    lines.append('(CPU: the bfloat16 cache scatter runs in float32, whole-cache copies in temp; see compile_check)')
  summary = []
  for step, got, temps in (('prefill', prefill, plan.prefill), ('decode', xla, plan.decode)):
    if got is None:
      continue
    guess = plan.weights + plan.kv + temps
    lines += [f'{f"xla {step} " + name:<42}{got[name] / gb:>12.3f}' for name in ('argument', 'alias', 'temp', 'total')]
    lines.append(f'{f"estimate weights + kv + {step}":<42}{guess / gb:>12.3f}')
    summary.append(f'{step}_xla_total_gb={got["total"] / gb:.3f} {step}_estimate_gb={guess / gb:.3f} '
                   f'ratio={got["total"] / guess:.3f}')
  return '\n'.join(lines + summary)
