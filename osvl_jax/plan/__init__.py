"""Memory plan of a training config on its TPU slice: `python -m osvl_jax.plan --config=... [--compile]`.

  estimate.py       per-chip bytes of parameters, AdamW state, gradients, activations from abstract shapes
                    (the formulas are in its docstring), the chip HBM table, the slice names
  rollout_phase.py  GRPO's rollouts on the embedded sampler: its weights in the rollout layout, the KV cache at the
                    config's rollout batch and context, the prefix-cache pool, the reshard's transient copy, and
                    whether training and rollouts fit a chip together (formulas in its docstring)
  compile_check.py  the SFT step and the sampler's decode step compiled from ShapeDtypeStructs on the local
                    devices, XLA's memory analysis
"""

from __future__ import annotations

import math

import jax
import ml_collections

from osvl_jax.models.qwen3_vl import sharding
from osvl_jax.plan import compile_check, rollout_phase
from osvl_jax.plan.estimate import (GB, HBM_GIB, Plan, architecture, estimate, hbm_bytes, parse_slice, report)

__all__ = ['GB', 'HBM_GIB', 'Plan', 'architecture', 'compile_rollout', 'estimate', 'hbm_bytes', 'parse_slice',
           'report', 'run', 'step_shapes']


def step_shapes(config: ml_collections.ConfigDict) -> tuple[int, int]:
  """(tokens per row, global rows of one micro-batch) of the step of `config.stage` ('sft' default, or 'grpo'): the
  largest shape the trainer compiles.

  SFT: the largest of sft.length_buckets (`batching.sft_buckets`; else data.max_length, else
  rollout.max_total_tokens) x sft.pack_rows (packed rows, `sft.make_packed_step`), else sft.micro_batch_size, else
  sft.batch_size (the SFT trainer takes one step per batch).
  GRPO: the largest of grpo.length_buckets (`batching.bucket_sizes`; else rollout.max_total_tokens) x
  grpo.pack_rows (packed rows, `grpo_update.Packing`), else grpo.micro_batch_size (0 / unset = the mini-batch:
  grpo.mini_batch_prompts (else prompts_per_step) x num_generations).

  Raises:
    ValueError: naming `stage` when it is neither 'sft' nor 'grpo'.
  """
  stage = config.get('stage', 'sft')
  if stage == 'sft':
    length = config.data.get('max_length') if config.get('data') else None
    buckets = config.sft.get('length_buckets') or ()
    return int(max(buckets) if buckets else length or config.rollout.max_total_tokens), int(
        config.sft.get('pack_rows') or config.sft.get('micro_batch_size') or config.sft.batch_size)
  if stage == 'grpo':
    g = config.grpo
    rows = g.get('pack_rows') or g.get('micro_batch_size') or (
        (g.get('mini_batch_prompts') or g.prompts_per_step) * g.num_generations)
    buckets = g.get('length_buckets') or ()
    return int(max(buckets) if buckets else config.rollout.max_total_tokens), int(rows)
  raise ValueError(f"stage={stage!r}: expected 'sft' or 'grpo'")


def compile_rollout(config: ml_collections.ConfigDict, tensor: int, rows: int, cache_len: int, training: Plan,
                    chip: str, arch=None, prefill_len: int | None = None
                    ) -> tuple[dict, dict | None, rollout_phase.RolloutPlan]:
  """The embedded sampler's decode step (and, with `prefill_len`, its prefill of that many prompt tokens per row)
  compiled on the local devices' rollout layout (`tensor` x replicas over the rest) for `rows` rows of `cache_len`
  cache slots (`compile_check.compile_decode_step` / `compile_prefill_step`), and the `rollout_phase.RolloutPlan`
  of the same shapes (with `training` live beside it, on `chip`).

  Returns:
    (XLA's memory analysis of the decode, of the prefill or None, the plan); compare XLA's totals with
    plan.weights + plan.kv + plan.decode (plan.prefill).
  Raises:
    ValueError: tensor not dividing the local devices or the KV heads; rows not a multiple of the replicas.
  """
  arch = arch or architecture(config)
  mesh = compile_check.rollout_mesh(tensor)
  shapes = rollout_phase.Shapes(episodes=rows, running=rows, rows=rows, cache_len=cache_len,
                                prefill_len=prefill_len or cache_len,
                                cache_dtype=rollout_phase.rollout_shapes(config).cache_dtype, pool_slots=0,
                                max_len=cache_len)
  sizes = {'tensor': int(mesh.shape['tensor']), 'data': int(mesh.shape['data'])}
  local = rollout_phase.estimate(config, training, sizes, chip, shapes, arch)
  decode = compile_check.compile_decode_step(config, mesh, rows=local.rows, cache_len=cache_len, arch=arch)
  prefill = (compile_check.compile_prefill_step(config, mesh, rows=local.rows, prefill_len=prefill_len,
                                                cache_len=cache_len, arch=arch) if prefill_len else None)
  return decode, prefill, local


def run(config: ml_collections.ConfigDict, chip: str | None = None, loss_tokens: int | None = None,
        compile_tokens: int | None = None) -> str:
  """The text `python -m osvl_jax.plan` prints: the slice plan's table (its summary line
  `params_gb_per_chip=... fits=...` last for SFT); with `compile_tokens`, before that line, the compiled SFT step
  on the local devices vs the estimate for their mesh. For stage 'grpo' the rollout section follows
  (`rollout_phase.report`: the rollout layout, its per-chip bytes, the phases with the trainer's state, the
  smallest tensor degree that fits), ending with `rollout_gb_per_chip=... peak_gb_per_chip=... fits=...`, training
  and rollouts together; with `compile_tokens`, before that line, the sampler's prefill (compile_tokens / 2 prompt
  tokens per row) and one decode step compiled on the local devices' rollout layout (the layout's tensor degree,
  else the smallest fitting one, capped by the local devices) for one row per device and `compile_tokens` cache
  slots, vs their estimates.

  Raises:
    ValueError: `config.tpu` unset; from `parse_slice` (config.tpu), `sharding.mesh_sizes` (config.mesh),
      `hbm_bytes` (chip), `step_shapes`.
  """
  if not config.get('tpu'):
    raise ValueError("config.tpu is not set: the plan needs a slice, e.g. tpu = 'v5p-64' (configs/qwen3vl_paper.py)")
  slice_chip, chips = parse_slice(config.tpu)
  chip = chip or slice_chip
  hbm_bytes(chip)
  sizes = sharding.mesh_sizes(config.get('mesh'), chips, multi_host=True)
  seq_len, rows = step_shapes(config)
  arch = architecture(config)
  slice_plan, _ = estimate(config, sizes, seq_len=seq_len, global_rows=rows, loss_tokens=loss_tokens, arch=arch)
  lines = [f'config: stage={config.get("stage", "sft")} tpu={config.tpu} ({chips} {slice_chip} chips)',
           *report(slice_plan, chip).splitlines()]
  n = len(jax.devices())
  if compile_tokens:
    mesh, local_sizes = compile_check.local_mesh()
    local_plan, _ = estimate(config, local_sizes, seq_len=compile_tokens, global_rows=n, arch=arch)
    xla = compile_check.compile_sft_step(config, mesh, rows=n, seq_len=compile_tokens, loss_tokens=compile_tokens,
                                         arch=arch)
    lines[-1:-1] = ['', *compile_check.report(xla, local_plan).splitlines(), '']
  if config.get('stage', 'sft') != 'grpo':
    return '\n'.join(lines)
  shapes = rollout_phase.rollout_shapes(config)
  rollout_sizes, how = rollout_phase.configured_sizes(config, chips, slice_plan, chip, arch, shapes)
  rollout = rollout_phase.estimate(config, slice_plan, rollout_sizes, chip, shapes, arch, training_sizes=sizes)
  best = rollout_phase.smallest_fitting(config, slice_plan, chips, chip, shapes, arch)
  section = rollout_phase.report(rollout, shapes, chip, how, best)
  if compile_tokens:
    tensor = math.gcd((rollout if rollout.layout else best or rollout).tensor, n)
    decode, prefill, local = compile_rollout(config, tensor, n, compile_tokens, local_plan, chip, arch,
                                             prefill_len=compile_tokens // 2)
    section[-1:-1] = ['', *compile_check.rollout_report(decode, local, prefill).splitlines(), '']
  return '\n'.join(lines + [''] + section)
