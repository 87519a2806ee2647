"""Compiled programs of a run whose images all differ (issue 22): SFT steps, GRPO updates and sampler calls.

Command: `.venv/bin/python bench/compile_count.py [--n 6] [--max_side 128] [--seed 0]`
Trajectories are built by the real `TrajectoryBuilder` with the real tokenizer: each row holds 1-4 images (the
question's, then crops a tool returned), each side drawn in [64, --max_side] pixels (the demo's image processor:
64x64 to 128x128 pixels), then answers. On the tiny Qwen3-VL (configs/demo.py's model, one device):
  * `--n` SFT steps (`sft.make_step` at the budgets `sft.placer` derives from the dataset, as `sft.train` runs),
    then `--n` packed ones (`sft.packer`, sft.pack_rows = 1: one program for the micro-batches, whatever they hold),
  * `--n` GRPO updates (`grpo_batch.prepare_batch` on config.grpo's length buckets and ladders, `grpo_update`),
  * `--n` embedded-sampler calls (`JaxSampler.generate` on the rows' prompts, two rows a call).
Programs are counted by name from JAX's own compile log (`jax.log_compiles`: one "Compiling jit(<name>)" per
program built, compiled or read from a persistent cache) for each phase's step functions (`PHASES`). Prints
  sft_programs=<n> grpo_programs=<n> sampler_programs=<n> distinct_image_grids=<m> steady_step_s=<x>
and, beside each count, the bound the config sets (`*_bound`): the count must not exceed it, nor grow with m or N
(`tests/test_bench_cli.py` runs this at small N). steady_step_s: the mean SFT step after the first (compile) step.
Feeds BENCHMARKS.md, "Compile counts".
"""

import argparse
import collections
import contextlib
import logging
import re
import sys
import time

import jax
import numpy as np

from osvl_jax import trajectory as tj
from osvl_jax.models.qwen3_vl import sharding
from osvl_jax.rollout.embedded import jax_sampler
from osvl_jax.train import batching, grpo_batch, grpo_update, placement, policy, sft
from tools.base import ToolResult

sys.path.insert(0, 'configs')
import demo as demo_config  # noqa: E402  pylint: disable=wrong-import-position

CROP = tj.render_assistant_text('Zoom in.', tool_call={'name': 'crop', 'arguments': {
    'image': 'img_1', 'x': 0, 'y': 0, 'width': 48, 'height': 40}})
ANSWER = tj.render_assistant_text('It is Agra.', response='Agra')
# The step functions each phase compiles (the names `jax.jit` / `nnx.jit` give them).
PHASES = {'sft': ('train_step',), 'sft_packed': ('grad_step', 'add_grads', 'apply_grads'),
          'grpo': ('grad_fn', 'logprob_fn', 'apply_grads'), 'sampler': ('prefill', 'decode')}
_COMPILING = re.compile(r'Compiling (?:jit\()?([\w.<>-]+)\)?')


class _Names(logging.Handler):
  def __init__(self):
    super().__init__()
    self.names = collections.Counter()

  def emit(self, record):
    match = _COMPILING.match(record.getMessage())
    if match:
      self.names[match.group(1)] += 1


@contextlib.contextmanager
def compiled_names():
  """Counter of the programs built inside the block, by jitted function name."""
  handler, logger = _Names(), logging.getLogger('jax')
  logger.addHandler(handler)
  propagate, logger.propagate = logger.propagate, False   # counted, not printed
  try:
    with jax.log_compiles():
      yield handler.names
  finally:
    logger.removeHandler(handler)
    logger.propagate = propagate


def make_trajectory(rng, tokenizer, processor, prompt_id: str, sample: int, max_side: int) -> tj.Trajectory:
  """A real episode: the question's image, 0-3 crop turns each returning an image, the answer."""
  image = lambda: rng.integers(0, 256, (int(rng.integers(64, max_side + 1)), int(rng.integers(64, max_side + 1)), 3),
                               dtype=np.uint8)
  builder = tj.TrajectoryBuilder(tokenizer, processor, [])
  builder.start('Which city is this?', image())
  for _ in range(int(rng.integers(0, 4))):
    builder.append_assistant_text(CROP)
    builder.append_observation(ToolResult(ok=True, text='Here is the crop.', images=[image()]))
  builder.append_assistant_text(ANSWER)
  return builder.finish(prompt_id=prompt_id, sample_index=sample, answers=['Agra'])


def answer_context(trajectory: tj.Trajectory) -> tuple[np.ndarray, list]:
  """The context the policy answered in: every id before its last turn, with all the row's images."""
  gen = np.asarray(trajectory.gen_mask, bool)
  last = int(np.flatnonzero(gen[1:] & ~gen[:-1])[-1]) + 1
  return np.asarray(trajectory.token_ids[:last], np.int32), list(trajectory.images)


def config_for(max_side: int):
  config = demo_config.get_config()
  config.model.vocab = 'full'   # the episodes here are drawn, no dataset lists their ids
  config.image.max_pixels = config.data.max_pixels = max(max_side * max_side, config.image.min_pixels)
  # A fixed patch budget per batch shard (2 rows x 4 images of the largest size): P takes one shape.
  config.grpo.update(prompts_per_step=2, num_generations=2, length_buckets=(1024, 2048), max_loss_tokens=0,
                     loss_bucket=64, patches_per_shard=8 * (max_side // 16) ** 2)
  config.rollout.max_total_tokens = 2048
  return config


def run(n: int, max_side: int, seed: int) -> dict:
  config = config_for(max_side)
  rng = np.random.default_rng(seed)
  tokenizer = tj.load_tokenizer()
  processor = tj.ImageProcessor(min_pixels=config.image.min_pixels, max_pixels=config.image.max_pixels)
  rows = 2
  data = [make_trajectory(rng, tokenizer, processor, f'q{i // 2}', i % 2, max_side) for i in range(rows * n)]
  grids = {tuple(im.grid_thw.tolist()) for t in data for im in t.images}
  per_row = collections.Counter(len(t.images) for t in data)
  mesh, rules = sharding.mesh_from_config(config.mesh), sharding.rules_from_config(config)
  config.sft.batch_size = rows
  model, optimizer = policy.create(config, mesh, 'sft')
  out = {'distinct_image_grids': len(grids), 'images_per_row': dict(sorted(per_row.items()))}

  step = sft.make_step(config.sft, sft.placer(config.sft, data, mesh, rules, model.config.vision))
  times = []
  with compiled_names() as names:
    for i in range(n):
      t0 = time.perf_counter()
      with sharding.use_mesh(mesh, rules):
        jax.block_until_ready(step(model, optimizer, data[rows * i:rows * (i + 1)]))
      times.append(time.perf_counter() - t0)
  out['sft_programs'] = sum(names[k] for k in PHASES['sft'])
  out['sft_names'] = dict(names)
  out['sft_bound'] = 1
  out['steady_step_s'] = float(np.mean(times[1:])) if n > 1 else float('nan')

  # Packed (sft.pack_rows = 1, rows of the longest trajectory): a step runs 1-2 micro-batches of one program, the
  # accumulation and the optimizer step, whatever the lengths and images.
  config.sft.update(pack_rows=1, length_buckets=())
  packed, _ = sft.packer(config.sft, data, mesh, rules, model.config.vision)
  micro = []
  with compiled_names() as names:
    for i in range(n):
      with sharding.use_mesh(mesh, rules):
        micro.append(jax.device_get(packed(model, optimizer, data[rows * i:rows * (i + 1)]))['micro_batches'])
  out['sft_packed_programs'] = sum(names[k] for k in PHASES['sft_packed'])
  out['sft_packed_bound'] = len(PHASES['sft_packed'])
  out['sft_packed_micro_batches'] = sorted(set(micro))

  cfg = config.grpo
  update = grpo_update.make_update_fn(cfg, place=lambda b: placement.shard_batch(b, mesh, rules, model.config.vision,
                                                                              int(cfg.patches_per_shard or 0)))
  shapes = set()
  with compiled_names() as names:
    for i in range(n):
      part = data[rows * i:rows * (i + 1)]
      batch, grid, _, _ = grpo_batch.prepare_batch(part, cfg)
      shapes.add(batch['loss_targets'].shape)
      for key in ('rewards', 'fatal_steps'):
        batch.pop(key)
      with sharding.use_mesh(mesh, rules):
        update(model, optimizer, batch, grid, [t.prompt_id for t in part])
  out['grpo_programs'] = sum(names[k] for k in PHASES['grpo'])
  out['grpo_names'] = dict(names)
  # Each (T, K) rung compiles π_old's and the gradient's programs once per patch rung; apply_grads once.
  # π_old's program and the gradient's for each (T, K) rung the budgets allow (P is fixed), apply_grads once.
  out['grpo_bound'] = 2 * batching.program_bound(cfg.length_buckets, cfg.max_loss_tokens, cfg.loss_bucket) + 1
  out['grpo_shapes'] = len(shapes)

  # One suffix bucket and one cache length (bucket = max_len) and one patch rung (2 rows x 4 images x 64 patches
  # fit 512): prefill and decode compile once each, whatever the images.
  sampler = jax_sampler.JaxSampler(model, tokenizer, max_new_tokens=4, temperature=0.0, max_len=1024, bucket=1024,
                                   decode_steps=4, patch_bucket=max(512, 8 * (max_side // 16) ** 2))
  with compiled_names() as names:
    for i in range(n):
      part = data[rows * i:rows * (i + 1)]
      sampler.generate([answer_context(t) for t in part])
  out['sampler_programs'] = sum(names[k] for k in PHASES['sampler'])
  out['sampler_names'] = dict(names)
  out['sampler_bound'] = 2
  return out


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--n', type=int, default=6, help='SFT steps, GRPO updates and sampler calls (each >= 1)')
  parser.add_argument('--max_side', type=int, default=128, help='largest image side drawn, pixels (>= 64)')
  parser.add_argument('--seed', type=int, default=0)
  args = parser.parse_args(argv)
  if args.n < 1 or args.max_side < 64:
    parser.error('--n must be >= 1 and --max_side >= 64')
  out = run(args.n, args.max_side, args.seed)
  print(' '.join(f'{k}={out[k]}' for k in ('sft_programs', 'grpo_programs', 'sampler_programs',
                                            'distinct_image_grids')) + f" steady_step_s={out['steady_step_s']:.3f}")
  print(' '.join(f'{k}={v}' for k, v in out.items() if k.endswith('_bound') or k in (
      'grpo_shapes', 'images_per_row', 'sft_packed_programs', 'sft_packed_micro_batches')))
  return out


if __name__ == '__main__':
  main()
