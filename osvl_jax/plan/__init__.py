"""Memory plan of a training config on its TPU slice: `python -m osvl_jax.plan --config=... [--compile]`.

  estimate.py       per-chip bytes of parameters, AdamW state, gradients, activations from abstract shapes
                    (the formulas are in its docstring), the chip HBM table, the slice names
  compile_check.py  the SFT step compiled from ShapeDtypeStructs on the local devices, XLA's memory analysis
"""

from __future__ import annotations

import jax
import ml_collections

from osvl_jax.models.qwen3_vl import sharding
from osvl_jax.plan import compile_check
from osvl_jax.plan.estimate import (GB, HBM_GIB, Plan, architecture, estimate, hbm_bytes, parse_slice, report)

__all__ = ['GB', 'HBM_GIB', 'Plan', 'architecture', 'estimate', 'hbm_bytes', 'parse_slice', 'report', 'run',
           'step_shapes']


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


def run(config: ml_collections.ConfigDict, chip: str | None = None, loss_tokens: int | None = None,
        compile_tokens: int | None = None) -> str:
  """The text `python -m osvl_jax.plan` prints: the slice plan's table (last line: the summary line); with
  `compile_tokens`, before that line, the compiled step on the local devices vs the estimate for their mesh.

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
  if compile_tokens:
    mesh, local_sizes = compile_check.local_mesh()
    n = len(jax.devices())
    local_plan, _ = estimate(config, local_sizes, seq_len=compile_tokens, global_rows=n, arch=arch)
    xla = compile_check.compile_sft_step(config, mesh, rows=n, seq_len=compile_tokens, loss_tokens=compile_tokens,
                                         arch=arch)
    lines[-1:-1] = ['', *compile_check.report(xla, local_plan).splitlines(), '']
  return '\n'.join(lines)
