"""SFT on expert trajectories: masked next-token loss on the policy's own tokens (Eq. 7-8).

Reads top to bottom (big_vision style): data, model, optimizer, resume, loop, checkpoint.

  .venv/bin/python -m osvl_jax.train.sft --config=configs/demo.py --workdir=workdir/demo

The dataset is `<config.data.dir or workdir/data>/sft` as written by `python -m data_pipeline.build`.
Rerunning with the same workdir resumes from the latest checkpoint in `<workdir>/sft_ckpt`.
"""

import pathlib
import time

import jax
import ml_collections
import numpy as np
import optax
import tqdm
from absl import app, flags, logging
from flax import nnx
from ml_collections import config_flags

from osvl_jax.rl import losses
from osvl_jax.train import batching, checkpoint, data, metrics, policy



def batch_indices(step: int, batch_size: int, num_examples: int, seed: int) -> np.ndarray:
  """Example indices of `step`: epochs are seeded permutations, so a resumed run sees the same order."""
  flat = np.arange(step * batch_size, (step + 1) * batch_size)
  epochs, offsets = np.divmod(flat, num_examples)
  return np.array([np.random.default_rng([seed, e]).permutation(num_examples)[o] for e, o in zip(epochs, offsets)])


def make_train_step():
  """A jitted SFT step (model, optimizer, batch, grid) -> metrics; `grid` (image_grid_thw as a tuple) is static."""

  @nnx.jit(static_argnums=3)
  def train_step(model, optimizer, batch, grid):
    batch = dict(batch, image_grid_thw=np.array(grid, np.int32).reshape(-1, 3) if grid else None)

    def loss_fn(model):
      logprobs = policy.loss_logprobs(model, batch)
      return losses.sft_loss(logprobs, batch['completion_mask'])

    (loss, aux), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
    optimizer.update(model, grads)
    return dict(aux, loss=loss, grad_norm=optax.tree.norm(grads))

  return train_step


def grid_key(image_grid_thw: np.ndarray | None) -> tuple:
  """A batch's image_grid_thw, int [I, 3] or None, as a hashable static argument: ((t, h, w), ...), () for None."""
  return tuple(map(tuple, image_grid_thw.tolist())) if image_grid_thw is not None else ()


def train(config: ml_collections.ConfigDict, workdir: str | pathlib.Path) -> nnx.Module:
  """Runs (or resumes) SFT; returns the trained model. Checkpoints in `<workdir>/sft_ckpt`."""
  workdir = pathlib.Path(workdir)
  cfg = config.sft
  trajectories = data.load_sft_trajectories(config, workdir)
  print(f'sft: {len(trajectories)} expert trajectories', flush=True)

  model = policy.build_model(config, seed=config.seed)
  optimizer = policy.make_optimizer(model, cfg.lr, cfg.steps, cfg.warmup_steps, cfg.weight_decay, cfg.grad_clip)
  mngr = checkpoint.manager(workdir, 'sft_ckpt')
  meta = checkpoint.restore(mngr, model, optimizer)
  start = meta['step'] if meta else 0
  if start:
    print(f'sft: resumed at step {start}', flush=True)
  writer = metrics.MetricWriter(workdir, 'sft')
  train_step = make_train_step()

  length, num_loss = batching.padded_sizes(trajectories)  # one shape for the run: one compiled step
  t0, tokens = time.time(), 0
  for step in tqdm.trange(start, cfg.steps, desc='sft', initial=start, total=cfg.steps):
    idx = batch_indices(step, cfg.batch_size, len(trajectories), config.seed)
    batch = batching.collate([trajectories[i] for i in idx], length=length, num_loss=num_loss)
    grid = grid_key(batch.pop('image_grid_thw'))
    out = train_step(model, optimizer, policy.device_batch(batch), grid)
    tokens += int(batch['completion_mask'].sum())
    if (step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps:
      out = jax.device_get(out)
      writer.write(step + 1, {**out, 'target_tokens_per_s': tokens / (time.time() - t0)})
      t0, tokens = time.time(), 0
    if (step + 1) % cfg.ckpt_every == 0 or step + 1 == cfg.steps:
      checkpoint.save(mngr, step + 1, model, optimizer, {'stage': 'sft'})
  writer.close()
  return model


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # orbax logs every checkpoint step at INFO
  train(_CONFIG.value, _WORKDIR.value)


if __name__ == '__main__':
  # Flags are defined only when run as a program, so the modules import into each other (and tests) freely.
  _CONFIG = config_flags.DEFINE_config_file('config', 'configs/demo.py', 'ml_collections config file.')
  _WORKDIR = flags.DEFINE_string('workdir', None, 'Job folder (checkpoints, metrics); reruns resume.', required=True)
  app.run(main)
