"""Multi-turn fatal-aware GRPO (Sec. 4.2, Eq. 9-12).

Reads top to bottom: prompts, policy (from the SFT checkpoint), tools, sampler; then per step: roll out G
samples per prompt with the current policy, score them (Eq. 9), group advantages (Eq. 11), post-fatal mask
(Eq. 10), one clipped policy-gradient update (Eq. 12), metrics, checkpoint.

  .venv/bin/python -m osvl_jax.train.grpo --config=configs/demo.py --workdir=workdir/demo

The policy starts from the latest checkpoint in `<workdir>/sft_ckpt` (or `config.grpo.init_from`);
rerunning with the same workdir resumes from `<workdir>/grpo_ckpt`.
"""

import collections
import pathlib
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import tqdm
from absl import app, flags, logging
from flax import nnx
from ml_collections import config_flags

from osvl_jax.rl import advantages as advantages_lib
from osvl_jax.rl import fatal as fatal_lib
from osvl_jax.rl import losses
from osvl_jax.train import batching, checkpoint, data, metrics, rollouts, sft, state



def make_logprob_fn():
  """Jitted (model, batch, grid) -> [B, K] log-probs at loss positions (the trainer's old log-probs)."""

  @nnx.jit(static_argnums=2)
  def logprob_fn(model, batch, grid):
    batch = dict(batch, image_grid_thw=np.array(grid, np.int32).reshape(-1, 3) if grid else None)
    return state.loss_logprobs(model, batch)

  return logprob_fn


def make_train_step(cfg: ml_collections.ConfigDict):
  """Jitted GRPO update (model, optimizer, batch, grid) -> metrics (Eq. 12 loss over the whole group batch)."""

  @nnx.jit(static_argnums=3)
  def train_step(model, optimizer, batch, grid):
    batch = dict(batch, image_grid_thw=np.array(grid, np.int32).reshape(-1, 3) if grid else None)

    def loss_fn(model):
      logprobs = state.loss_logprobs(model, batch)
      return losses.grpo_loss(logprobs, batch['old_logprobs'], batch['advantages'], batch['loss_mask'],
                              eps_low=cfg.eps_low, eps_high=cfg.eps_high, beta=cfg.beta)

    (loss, aux), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
    optimizer.update(model, grads)
    return dict(aux, loss=loss, grad_norm=sft._global_norm(grads))

  return train_step


def prompt_indices(step: int, prompts_per_step: int, num_prompts: int, seed: int) -> np.ndarray:
  """Prompts of `step` (seeded epochs, so a resumed run continues the same order)."""
  return sft.batch_indices(step, prompts_per_step, num_prompts, seed + 1)


def init_policy(config: ml_collections.ConfigDict, workdir: pathlib.Path):
  """Policy + optimizer, resumed from `<workdir>/grpo_ckpt`, else initialised from the SFT checkpoint."""
  cfg = config.grpo
  model = state.build_model(config, seed=config.seed)
  optimizer = state.make_optimizer(model, cfg.lr, cfg.steps, warmup_steps=0, grad_clip=1.0)
  mngr = checkpoint.manager(workdir, 'grpo_ckpt')
  meta = checkpoint.restore(mngr, model, optimizer)
  if meta:
    print(f"grpo: resumed at step {meta['step']}", flush=True)
    return model, optimizer, mngr, meta['step']
  init_dir = pathlib.Path(cfg.get('init_from') or workdir)
  sft_meta = checkpoint.restore(checkpoint.manager(init_dir, 'sft_ckpt'), model)
  if sft_meta is None and not config.model.get('hf_path'):
    raise FileNotFoundError(f'grpo: no SFT checkpoint in {init_dir / "sft_ckpt"}; run osvl_jax.train.sft first '
                            'or set config.grpo.init_from')
  print(f"grpo: policy initialised from {init_dir / 'sft_ckpt'}", flush=True)
  return model, optimizer, mngr, 0


def train(config: ml_collections.ConfigDict, workdir: str | pathlib.Path) -> nnx.Module:
  """Runs (or resumes) GRPO; returns the policy. Checkpoints in `<workdir>/grpo_ckpt`."""
  workdir = pathlib.Path(workdir)
  cfg = config.grpo
  prompts = data.load_prompts(config, workdir)
  model, optimizer, mngr, start = init_policy(config, workdir)
  runner = rollouts.RolloutRunner(config, model)
  writer = metrics.MetricWriter(workdir, 'grpo')
  logprob_fn, train_step = make_logprob_fn(), make_train_step(cfg)
  group = cfg.num_generations

  for step in tqdm.trange(start, cfg.steps, desc='grpo', initial=start, total=cfg.steps):
    t0 = time.time()
    items = [prompts[i] for i in prompt_indices(step, cfg.prompts_per_step, len(prompts), config.seed)]
    trajectories = runner.run(items, num_generations=group, temperature=cfg.temperature, top_p=cfg.top_p,
                              seed=config.seed * 100_003 + step)
    rollout_seconds = time.time() - t0
    scores = [rollouts.score(t, alpha=cfg.alpha) for t in trajectories]
    rewards = np.array([s['reward'] for s in scores], np.float32)
    fatal_steps = fatal_lib.fatal_step_array([t.fatal_step for t in trajectories])
    adv, adv_stats = advantages_lib.group_advantages(rewards, fatal_steps != fatal_lib.NOT_FATAL, group,
                                                     mode=cfg.fatal_mode, delta=cfg.delta)

    batch = batching.collate(trajectories, length_multiple=1024, loss_multiple=256)  # few distinct shapes
    grid = sft.grid_key(batch)
    batch['loss_mask'] = np.asarray(fatal_lib.loss_mask(batch['loss_valid'], batch['loss_step'], fatal_steps,
                                                        cfg.fatal_mode))
    batch['advantages'] = np.asarray(adv, np.float32)
    batch = state.device_batch(batch)
    batch['old_logprobs'] = logprob_fn(model, batch, grid)
    out = jax.device_get(train_step(model, optimizer, batch, grid))

    tool_calls = collections.Counter(s.action.name for t in trajectories for s in t.steps
                                     if s.action.kind == 'tool_call')
    writer.write(step + 1, {
        **{k: v for k, v in out.items()},
        'mean_reward': float(rewards.mean()),
        'r_fmt': float(np.mean([s['r_fmt'] for s in scores])),
        'r_acc': float(np.mean([s['r_acc'] for s in scores])),
        'r_query': float(np.mean([s['r_query'] for s in scores])),
        'fatal_fraction': float(np.mean(fatal_steps != fatal_lib.NOT_FATAL)),
        **adv_stats,
        'unmasked_tokens': int(np.asarray(batch['loss_mask']).sum()),
        'mean_turns': float(np.mean([len(t.steps) for t in trajectories])),
        'tool_calls': dict(tool_calls),
        'rollout_seconds': rollout_seconds,
        'step_seconds': time.time() - t0,
    })
    if (step + 1) % cfg.ckpt_every == 0 or step + 1 == cfg.steps:
      checkpoint.save(mngr, step + 1, model, optimizer, {'stage': 'grpo'})
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
