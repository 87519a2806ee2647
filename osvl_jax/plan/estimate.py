"""Per-chip memory of one training step, from abstract shapes only (nothing is allocated).

Units: bytes; GB = 1e9 bytes (the figures printed by `python -m osvl_jax.plan`), GiB = 2**30 (the HBM table).

Per chip, for a mesh and the config's sharding rules (`sharding.param_specs` on a `jax.sharding.AbstractMesh`):
  params     = Σ_p bytes(p, param_dtype) / Π(mesh axes p's dims are sharded over)
  optimizer  = 2 × params at float32 (AdamW mu + nu, same sharding; optax's scalar step counts ignored)
  gradients  = params (param_dtype, same sharding; the value_and_grad output before the update)
  gathers    = the FSDP working set (p = param-dtype bytes; an array not sharded over 'fsdp' is not gathered):
               one decoder layer's weights gathered over 'fsdp' (still split over the other axes) in the compute
               dtype and its full gradient before the reduce-scatter, (c + p) per element (the experts'
               gate_up_proj is gathered over its 'mlp' axes too: each device slices its gate and up blocks); the
               vocabulary matrices, cast to the compute dtype and then gathered whole over 'fsdp'
               (`text.embed_lookup` and `model.logits` constrain the cast table to ('vocab', None)): embedding
               gathered + its full gradient in param_dtype, c + p; lm_head gathered, its full gradient in the
               compute dtype and in param_dtype, 2c + p (tied: the one table, 2c + p)
  activations, for one micro-batch of b rows per chip (the batch's share of the global micro-batch: rows /
  Π(mesh axes of the logical axis 'batch')), T tokens per row, K loss positions per row, c = compute-dtype bytes,
  H hidden, I intermediate (MoE: k routed experts × moe_intermediate_size), nq / nkv heads, d head_dim, V vocab,
  L decoder layers, t_h / t_kv / t_i / t_v the tensor shards of heads / kv_heads / mlp / vocab:
    layer_saved  = b·T·[c·(4H + 3·nq·d/t_h + 4·nkv·d/t_kv + 3·I/t_i) + 4·nq/t_h]   what one layer keeps for its
                   backward: residual in, input norm out, attention out, post-attention norm out (4H); q after
                   norm, after rope, attention output (3·nq·d); k, k norm, k rope, v (4·nkv·d); gate, up,
                   silu(gate)·up (3I); the float32 row log-sum-exp of the blockwise attention (4·nq).
                   MoE layers (`moe.Experts`, routed per device): 3I becomes ep_b·(3·k·I_moe/t_i + 2·k·H) (the
                   device's k assignments per token, gathered and sorted by expert, and their outputs) and 4·E router
                   probabilities in float32; ep_b = the shards of the expert axes the batch is also split over (the
                   30B-A3B rules: 'expert'), whose tokens each device gathers before routing (1 by default).
    residual     = b·T·H·c, the scan carry (the input of each layer; `embed_lookup` casts to the compute dtype)
    with remat   = L·residual + layer_saved        (per layer only its input is saved; one layer is recomputed
                                                     at a time in the backward pass)
    without remat= L·(layer_saved)                  (every layer keeps its intermediates)
    logits       = 2·b·k·V/t_v·4                    (float32 logits of the live loss chunk and their gradient:
                                                     the trainers' loss projects k of a row's K loss positions at
                                                     a time, `policy.chunked_token_logprobs` with chunk C =
                                                     `compile_check.LOSS_CHUNK` positions per batch shard: per
                                                     row c = max(1, C // b); k = K when K <= c (or C = 0), else
                                                     ceil(K / ceil(K / c)), the balanced chunk)
  total = params + optimizer + gradients + gathers + activations; it fits a chip when total <= its HBM.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import pathlib
import re

import jax.numpy as jnp
import ml_collections
from flax import nnx
from flax import traverse_util

from osvl_jax.models.qwen3_vl import config as config_lib
from osvl_jax.models.qwen3_vl import model as model_lib
from osvl_jax.models.qwen3_vl import params_count
from osvl_jax.models.qwen3_vl import sharding
from osvl_jax.paths import data_dir

GB = 1e9
GIB = 2 ** 30
# HBM per chip (GiB): TPU v4 / v5e / v5p / v6e (Trillium) and NVIDIA H100 / H200 (SXM).
HBM_GIB = {'v4': 32, 'v5e': 16, 'v5p': 95, 'v6e': 32, 'H100': 80, 'H200': 141}
# TensorCores per chip, for slice names that count cores (v4-N, v5p-N); v5e / v6e names count chips.
_CORES_PER_CHIP = {'v4': 2, 'v5p': 2, 'v5e': 1, 'v6e': 1}


def parse_slice(tpu: str) -> tuple[str, int]:
  """'v5p-64' -> ('v5p', 32 chips): Cloud TPU accelerator types count TensorCores for v4 / v5p (2 per chip) and
  chips for v5e ('v5litepod-N' or 'v5e-N') / v6e.

  Raises:
    ValueError: naming `tpu` when it is not '<v4|v5p|v5e|v5litepod|v6e>-<N>' with N a whole number of chips.
  """
  match = re.fullmatch(r'(v4|v5p|v5e|v5litepod|v6e)-(\d+)', str(tpu))
  if not match:
    raise ValueError(f"tpu={tpu!r}: expected '<v4|v5p|v5e|v5litepod|v6e>-<N>', e.g. 'v5p-64'")
  chip = 'v5e' if match.group(1) == 'v5litepod' else match.group(1)
  cores, per_chip = int(match.group(2)), _CORES_PER_CHIP[chip]
  if cores % per_chip or cores == 0:
    raise ValueError(f'tpu={tpu!r}: {cores} cores is not a whole number of {chip} chips ({per_chip} cores each)')
  return chip, cores // per_chip


def hbm_bytes(chip: str) -> int:
  """HBM bytes of one chip named in `HBM_GIB` ('v5p', 'H200', ...). Raises ValueError naming the chip."""
  if chip not in HBM_GIB:
    raise ValueError(f'chip={chip!r}: known chips are {sorted(HBM_GIB)}')
  return HBM_GIB[chip] * GIB


def architecture(config: ml_collections.ConfigDict) -> config_lib.Qwen3VLConfig:
  """The model architecture of a config without its weights: `model.hf_config` (a Qwen3-VL family name of
  `params_count.family_hf_dicts` - '8B', '4B', '2B', '30B-A3B', '32B' - or a config.json path), else
  `<model.hf_path>/config.json`, else the tiny model with the `model.text` overrides (as `checkpoints.build_model`).

  Raises:
    FileNotFoundError: a config.json that does not exist; ValueError: an unknown family name / model.name.
  """
  hf_config, hf_path = config.model.get('hf_config'), config.model.get('hf_path')
  if hf_config:
    if hf_config in params_count.REAL or hf_config in params_count.ASSEMBLED:
      return config_lib.Qwen3VLConfig.from_hf_dict(
          params_count.family_hf_dicts(data_dir() / 'qwen' / 'configs')[hf_config])
    path = pathlib.Path(hf_config)
  elif hf_path:
    path = pathlib.Path(hf_path) / 'config.json'
  elif config.model.get('name') == 'tiny':
    arch = config_lib.Qwen3VLConfig.tiny()
    if config.model.get('text'):
      arch = dataclasses.replace(arch, text=dataclasses.replace(arch.text, **config.model.text.to_dict()))
    return arch
  else:
    raise ValueError(f"model.name={config.model.get('name')!r}: set model.hf_config (a family name or config.json)")
  if not path.is_file():
    raise FileNotFoundError(f'model config {path} does not exist (model.hf_config / model.hf_path)')
  return config_lib.Qwen3VLConfig.from_hf_dict(json.loads(path.read_text()))


def dtypes(config: ml_collections.ConfigDict) -> tuple[jnp.dtype, jnp.dtype]:
  """(compute dtype, parameter dtype) from `model.dtype` / `model.param_dtype` (default float32 both)."""
  return (jnp.dtype(config.model.get('dtype') or 'float32'), jnp.dtype(config.model.get('param_dtype') or 'float32'))


def abstract_model(config: ml_collections.ConfigDict, arch: config_lib.Qwen3VLConfig) -> model_lib.Qwen3VLModel:
  """`Qwen3VLModel` of `arch` under `nnx.eval_shape` (ShapeDtypeStruct parameters), with the config's dtypes,
  `model.scan_layers` and `model.remat`. Cached per (arch, dtypes, scan_layers): the 32B trace takes seconds."""
  dtype, param_dtype = dtypes(config)
  model = _abstract_model(arch, dtype.name, param_dtype.name, bool(config.model.get('scan_layers', False)))
  model.language_model.remat = bool(config.model.get('remat', False))
  return model


@functools.lru_cache(maxsize=8)
def _abstract_model(arch, dtype: str, param_dtype: str, scan_layers: bool) -> model_lib.Qwen3VLModel:
  return nnx.eval_shape(lambda: model_lib.Qwen3VLModel(arch, nnx.Rngs(0), dtype=jnp.dtype(dtype),
                                                        param_dtype=jnp.dtype(param_dtype), scan_layers=scan_layers))


def _axes(spec) -> set[str]:
  """Mesh axes a PartitionSpec shards over."""
  return {a for entry in spec if entry is not None for a in ((entry,) if isinstance(entry, str) else entry)}


def _shards(spec, mesh) -> int:
  """Number of pieces a PartitionSpec cuts an array into on `mesh`."""
  return math.prod(mesh.shape[a] for a in _axes(spec))


def param_bytes(model: nnx.Module, mesh, rule_table) -> dict[str, tuple[int, int, object]]:
  """Dot-joined parameter path -> (global bytes, per-chip bytes, PartitionSpec) for every parameter."""
  specs = traverse_util.flatten_dict(nnx.to_pure_dict(sharding.param_specs(model, mesh, rule_table)))
  values = traverse_util.flatten_dict(nnx.to_pure_dict(nnx.state(model, nnx.Param)))
  out = {}
  for path, value in values.items():
    spec = specs[path]
    total = math.prod(value.shape) * jnp.dtype(value.dtype).itemsize
    out['.'.join(map(str, path))] = (total, total // _shards(spec, mesh), spec)
  return out


@dataclasses.dataclass(frozen=True)
class Plan:
  """Per-chip bytes of one training step (see the module docstring) and the shapes they were computed for."""
  mesh: dict
  seq_len: int
  loss_tokens: int
  rows_per_chip: int
  params: int
  optimizer: int
  gradients: int
  gathers: int
  activations: int
  activations_no_remat: int
  activations_remat: int
  remat: bool

  @property
  def total(self) -> int:
    return self.params + self.optimizer + self.gradients + self.gathers + self.activations


def _axis_shards(name: str, size: int, mesh, rule_table) -> int:
  return _shards(sharding.logical_to_spec((name,), (size,), mesh, rule_table), mesh)


def live_loss_positions(rows: int, loss_tokens: int, chunk: int) -> int:
  """k: the loss positions per row whose logits are live at once (module docstring `logits`), for `rows` rows per
  batch shard, K = `loss_tokens` and the trainers' loss chunk `chunk` (0: one projection of all K)."""
  per_row = max(1, chunk // max(1, rows)) if chunk else 0
  if not per_row or loss_tokens <= per_row:
    return loss_tokens
  return -(-loss_tokens // -(-loss_tokens // per_row))


def activation_bytes(arch: config_lib.Qwen3VLConfig, mesh, rule_table, rows: int, seq_len: int, loss_tokens: int,
                     compute_bytes: int, loss_chunk: int = 0) -> tuple[int, int, int]:
  """(with remat, without remat, logits) activation bytes per chip for `rows` rows of `seq_len` tokens (module
  docstring formulas; `loss_chunk` the trainers' loss chunk, 0 = one projection of every loss position)."""
  t = arch.text
  h, nq, nkv, d, c = t.hidden_size, t.num_attention_heads, t.num_key_value_heads, t.head_dim, compute_bytes
  t_h = _axis_shards('heads', nq * d, mesh, rule_table)
  t_kv = _axis_shards('kv_heads', nkv * d, mesh, rule_table)
  t_v = _axis_shards('vocab', t.table_rows, mesh, rule_table)
  if arch.is_moe:
    t_i = _axis_shards('mlp', t.moe_intermediate_size, mesh, rule_table)
    k = t.num_experts_per_tok
    expert_axes = _axes(sharding.logical_to_spec(('experts',), (t.num_experts,), mesh, rule_table))
    ep_b = math.prod(mesh.shape[a] for a in expert_axes & _axes(sharding.logical_to_spec(('batch',), None, mesh,
                                                                                          rule_table)))
    mlp = ep_b * c * (3 * k * t.moe_intermediate_size // t_i + 2 * k * h) + 4 * t.num_experts
  else:
    t_i = _axis_shards('mlp', t.intermediate_size, mesh, rule_table)
    mlp = c * 3 * t.intermediate_size // t_i
  per_token = c * (4 * h + 3 * nq * d // t_h + 4 * nkv * d // t_kv) + mlp + 4 * nq // t_h
  layer_saved = rows * seq_len * per_token
  residual = rows * seq_len * h * c
  logits = 2 * rows * live_loss_positions(rows, loss_tokens, loss_chunk) * t.table_rows // t_v * 4
  n = t.num_hidden_layers
  return n * residual + layer_saved + logits, n * layer_saved + logits, logits


def gather_bytes(params: dict, arch: config_lib.Qwen3VLConfig, mesh, compute_bytes: int, param_bytes_each: int) -> int:
  """The FSDP working set per chip (module docstring `gathers`). `params` from `param_bytes`; `param_bytes_each` is
  the parameter dtype's size."""
  c, p, fsdp = compute_bytes, param_bytes_each, mesh.shape.get('fsdp', 1)
  total = 0
  for path, (_, per_chip, spec) in params.items():
    gathered = fsdp > 1 and 'fsdp' in _axes(spec)
    elements = per_chip * (fsdp if gathered else 1) // p
    if path.endswith('mlp.experts.gate_up_proj'):   # [.., E, hidden, 2I]: the 2I dim gathered too (`moe.Experts`)
      elements *= math.prod(mesh.shape[a] for a in _axes(spec[-1:]) - {'fsdp'})
    stacked = path.startswith('language_model.layers.') and not re.match(r'language_model\.layers\.\d', path)
    if stacked or path.startswith('language_model.layers.0.'):
      total += (elements // arch.text.num_hidden_layers if stacked else elements) * (c + (p if gathered else 0))
    elif path == 'language_model.embed_tokens.embedding':
      total += elements * ((c + p if gathered else 0) + (c if arch.tie_word_embeddings else 0))
    elif path == 'lm_head.kernel':
      total += elements * ((c + p if gathered else 0) + c)
  return total


def estimate(config: ml_collections.ConfigDict, sizes: dict[str, int], *, seq_len: int, global_rows: int,
             loss_tokens: int | None = None, arch: config_lib.Qwen3VLConfig | None = None) -> tuple[Plan, dict]:
  """The `Plan` of `config`'s model on a mesh of `sizes` for a micro-batch of `global_rows` rows of `seq_len`
  tokens with `loss_tokens` loss positions per row (default `seq_len`: every position, the upper bound).

  Returns:
    (plan, param_bytes(...) table).
  Raises:
    ValueError: seq_len / global_rows < 1.
  """
  if seq_len < 1 or global_rows < 1:
    raise ValueError(f'seq_len={seq_len}, global_rows={global_rows}: both must be >= 1')
  arch = arch or architecture(config)
  mesh, rule_table = sharding.abstract_mesh(sizes), sharding.rules_from_config(config)
  model = abstract_model(config, arch)
  table = param_bytes(model, mesh, rule_table)
  dtype, param_dtype = dtypes(config)
  params = sum(per_chip for _, per_chip, _ in table.values())
  optimizer = params * 2 * 4 // param_dtype.itemsize
  batch_shards = _shards(sharding.logical_to_spec(('batch',), None, mesh, rule_table), mesh)
  rows = -(-global_rows // batch_shards)
  loss_tokens = seq_len if loss_tokens is None else loss_tokens
  from osvl_jax.plan import compile_check   # pylint: disable=g-import-not-at-top  # (it imports this module)
  remat_b, no_remat_b, _ = activation_bytes(arch, mesh, rule_table, rows, seq_len, loss_tokens, dtype.itemsize,
                                            compile_check.LOSS_CHUNK)
  remat = bool(config.model.get('remat', False))
  gathers = gather_bytes(table, arch, mesh, dtype.itemsize, param_dtype.itemsize)
  plan = Plan(mesh=dict(sizes), seq_len=seq_len, loss_tokens=loss_tokens, rows_per_chip=rows, params=params,
              optimizer=optimizer, gradients=params, gathers=gathers,
              activations=remat_b if remat else no_remat_b, activations_no_remat=no_remat_b,
              activations_remat=remat_b, remat=remat)
  return plan, table


def report(plan: Plan, chip: str) -> str:
  """A readable table of `plan` on `chip`, ending with the line
  `params_gb_per_chip=<x> optimizer_gb_per_chip=<y> activations_gb_per_chip=<z> fits=<true|false>` (GB = 1e9)."""
  hbm = hbm_bytes(chip)
  mesh = ' '.join(f'{a}={s}' for a, s in plan.mesh.items())
  rows = [('parameters', plan.params), ('optimizer (AdamW mu+nu, f32)', plan.optimizer),
          ('gradients', plan.gradients), ('fsdp gathers (1 layer, vocab) + full grads', plan.gathers),
          (f"activations ({'remat' if plan.remat else 'no remat'}, used)", plan.activations),
          ('  activations with remat', plan.activations_remat),
          ('  activations without remat', plan.activations_no_remat),
          ('total', plan.total), (f'{chip} HBM ({HBM_GIB[chip]} GiB)', hbm)]
  lines = [f'mesh: {mesh}; micro-batch: {plan.rows_per_chip} row(s)/chip x {plan.seq_len} tokens, '
           f'{plan.loss_tokens} loss positions/row', f"{'per chip':<42}{'GB (1e9 B)':>12}"]
  lines += [f'{name:<42}{value / GB:>12.3f}' for name, value in rows]
  fits = plan.total <= hbm
  lines.append(f'params_gb_per_chip={plan.params / GB:.3f} optimizer_gb_per_chip={plan.optimizer / GB:.3f} '
               f'activations_gb_per_chip={plan.activations / GB:.3f} fits={str(fits).lower()}')
  return '\n'.join(lines)
