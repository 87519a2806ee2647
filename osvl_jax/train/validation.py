"""Validation during GRPO (verl's `trainer.test_freq` and `val_before_train`; PAPER.md Table 5: "test every 10
steps", validation sampling temperature 0.7, top-p 0.95).

`grpo.val_every` (int >= 0; 0 = off): the policy is validated before the first step (step 0: the initial policy,
the SFT checkpoint's) and after every `val_every`-th step and the last (verl also validates after its last step),
on the held-out RL prompts: the `rl` split's last `grpo.heldout_prompts` prompts, which GRPO never trains on
(`data.load_prompts(config, workdir, 'heldout')`). Each validation rolls out one sample per prompt (verl's
`val_kwargs.n` default) with the published policy, sampled with the config's validation section, `eval.temperature` /
`eval.top_p` (Table 5's 0.7 / 0.95 in the paper files), PRNG seed `seed(config, step)`, against a fresh `ToolEnv` of
the run's tool config: the same failure-injection draws at every validation (the calls' order aside) and none taken
from the training's, so validation leaves the training rollouts as they are. The trajectories are scored with the
run's judge (Eq. 9, `rollouts.score_all`).

Records: stage 'val' in `<workdir>/metrics.jsonl` (and TensorBoard `tb/val/`) at the policy's step (0, val_every,
2 val_every, ..., grpo.steps), written by the trainer's `MetricWriter` (`write(..., stage='val')`): mean_reward,
accuracy (mean r_acc), r_fmt, r_query, mean_turns, fatal_fraction, answered_fraction, judge_errors, prompts,
temperature, top_p, seed, policy_version, val_seconds. A step already holding a 'val' record is not validated
again, so a resumed run (which re-runs the steps after its checkpoint) writes each validation once. The demo plots
them beside the training curve (`curves.step_points`). Only process 0 validates (it alone rolls out).
"""

import pathlib
import time

import ml_collections
import numpy as np

from osvl_jax import config_checks as checks
from osvl_jax import distributed
from osvl_jax.judges import base as judges_base
from osvl_jax.train import data, metrics, rollouts

STAGE = 'val'
SEED_OFFSET = 50_000  # validation seeds: config.seed * 100_003 + SEED_OFFSET + step (training: ... + step)


def check_config(config: ml_collections.ConfigDict) -> int:
  """Checks the validation fields (called by `grpo.check_config`); returns `val_every` (0 = off).

  Fields: grpo.val_every (optional int >= 0); when > 0, grpo.heldout_prompts >= 1 (the prompts it validates on)
  and the validation section eval.temperature (>= 0; 0 = greedy) and eval.top_p (in (0, 1]).

  Raises:
    ValueError: naming the field: val_every not an int >= 0; val_every > 0 with no held-out prompts, or with a
      missing or bad eval.temperature / eval.top_p.
  """
  every = checks.number(config, 'grpo.val_every', integer=True, low=0, optional=True) or 0
  if not every:
    return 0
  if not config.grpo.get('heldout_prompts'):
    raise ValueError(f'grpo.val_every={every} validates on held-out RL prompts, but grpo.heldout_prompts='
                     f"{config.grpo.get('heldout_prompts')!r}: set it to the number of the rl split's last prompts to "
                     'hold out of training (e.g. --config.grpo.heldout_prompts=3), or grpo.val_every=0')
  if 'eval' not in config:
    raise ValueError(f'grpo.val_every={every} samples with the validation section eval.temperature / eval.top_p, '
                     'which this config lacks')
  checks.number(config, 'eval.temperature', low=0)
  checks.number(config, 'eval.top_p', low=0, low_open=True, high=1)
  return int(every)


def due(step: int, every: int, steps: int) -> bool:
  """Whether the policy after `step` GRPO steps (0 = before the first) is validated: step 0, every `every`-th, and
  the last (`steps`); never with `every` 0."""
  return bool(every) and (step % every == 0 or step == steps)


def seed(config: ml_collections.ConfigDict, step: int) -> int:
  """The sampler's PRNG seed of the validation at `step` (apart from the training rollouts' seed * 100_003 + step)."""
  return int(config.seed) * 100_003 + SEED_OFFSET + int(step)


def summarize(trajectories: list, scores: list[dict]) -> dict:
  """The validation figures of scored trajectories (`rollouts.score_all`): mean_reward, accuracy (mean r_acc, in
  [0, 1]), r_fmt, r_query, mean_turns (steps per trajectory), fatal_fraction, answered_fraction (a final response),
  judge_errors (judgements that fell back), prompts (trajectories; one per prompt)."""
  mean = lambda values: float(np.mean(values)) if len(values) else 0.0
  return {'mean_reward': mean([s['reward'] for s in scores]), 'accuracy': mean([s['r_acc'] for s in scores]),
          'r_fmt': mean([s['r_fmt'] for s in scores]), 'r_query': mean([s['r_query'] for s in scores]),
          'mean_turns': mean([len(t.steps) for t in trajectories]),
          'fatal_fraction': mean([t.fatal_step is not None for t in trajectories]),
          'answered_fraction': mean([t.final_response is not None for t in trajectories]),
          'judge_errors': int(sum(s.get('judge_errors', 0) for s in scores)), 'prompts': len(trajectories)}


def evaluate(config: ml_collections.ConfigDict, runner: rollouts.RolloutRunner, prompts: list[dict],
             judge: judges_base.Judge | None, step: int) -> dict:
  """One validation of `runner`'s published policy on `prompts` (module docstring): one sample each at
  eval.temperature / eval.top_p, seed `seed(config, step)`, a fresh `ToolEnv`, scored by `judge` (None: the rule
  judge) with grpo.alpha.

  Returns:
    `summarize`'s figures + temperature, top_p, seed, policy_version (the runner's published version),
    val_seconds.
  """
  t0 = time.time()
  temperature, top_p, val_seed = float(config.eval.temperature), float(config.eval.top_p), seed(config, step)
  trajectories = runner.run(prompts, num_generations=1, temperature=temperature, top_p=top_p, seed=val_seed,
                            env=rollouts.tool_env(config), require_tokens=False)
  scores = rollouts.score_all(trajectories, alpha=config.grpo.alpha, judge=judge)
  return {**summarize(trajectories, scores), 'temperature': temperature, 'top_p': top_p, 'seed': val_seed,
          'policy_version': int(runner.version or 0), 'val_seconds': time.time() - t0}


class Validator:
  """The trainer's validations (module docstring): `maybe_validate(step)` after each published version.

  Args:
    config: the run's config (`check_config` accepted it).
    workdir: the run's folder: the held-out prompts' dataset and `metrics.jsonl` (its 'val' records: the steps
      already validated).
    runner: the run's `rollouts.RolloutRunner` (its engine, its published version).
    judge: the run's judge.
    writer: the run's `metrics.MetricWriter`.
  Inactive (every call a no-op) with grpo.val_every 0 and on processes other than 0.
  """

  def __init__(self, config: ml_collections.ConfigDict, workdir: str | pathlib.Path,
               runner: rollouts.RolloutRunner, judge: judges_base.Judge | None, writer: metrics.MetricWriter):
    self.config, self.runner, self.judge, self.writer = config, runner, judge, writer
    self.every = check_config(config)
    self.active = bool(self.every) and distributed.is_main()
    self.prompts, self.done = [], set()
    if self.active:
      self.prompts = data.load_prompts(config, workdir, 'heldout')
      self.done = {int(r['step']) for r in metrics.read_metrics(workdir, STAGE)}

  def maybe_validate(self, step: int) -> dict | None:
    """Validates the published policy as that of `step` when `due` and not yet logged; returns the record written
    (None when none)."""
    if not self.active or not due(step, self.every, int(self.config.grpo.steps)) or step in self.done:
      return None
    record = evaluate(self.config, self.runner, self.prompts, self.judge, step)
    self.writer.write(step, record, stage=STAGE)
    self.done.add(step)
    print(f"grpo: validation at step {step}: reward={record['mean_reward']:.4f} accuracy={record['accuracy']:.4f} "
          f"turns={record['mean_turns']:.2f} fatal={record['fatal_fraction']:.3f} over {record['prompts']} held-out "
          'prompts', flush=True)
    return record
