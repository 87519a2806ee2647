"""`make demo`: the main job end to end on CPU and real data.

  .venv/bin/python -m osvl_jax.demo --workdir=workdir/demo [--config=configs/demo.py --config.sft.steps=...]

Stages (each resumes from the workdir when rerun):
  1. data   build the multi-hop visual QA set + oracle expert trajectories -> <workdir>/data
  2. sft    masked next-token SFT on the expert trajectories          -> <workdir>/sft_ckpt
  3. eval   sample the SFT'd policy on the RL prompts (split rl)      -> <workdir>/eval_sft.json
  4. grpo   fatal-aware GRPO (fatal_mode from config)                  -> <workdir>/grpo_ckpt
Metrics of every stage go to <workdir>/metrics.jsonl (and TensorBoard under <workdir>/tb).
The GRPO reward and turns per step are plotted to <workdir>/grpo_reward.png (with the validation records', stage
'val', when grpo.val_every > 0). The last line printed is
  demo: sft_format_ok=<f> grpo_steps=<n> grpo_group_size=<G> mean_reward=<r> fatal_fraction=<f>
        grpo_reward_first=<x> grpo_reward_last=<y>
(on one line; grpo_reward_first / _last: the mean batch reward of the first and last `report_window` GRPO steps).
"""

import json
import pathlib
import time

import numpy as np
from absl import app, flags, logging
from ml_collections import config_flags

from data_pipeline import build as build_lib
from osvl_jax import compile_cache
from osvl_jax import config_checks as checks
from osvl_jax import distributed
from osvl_jax.checkpoints import storage
from osvl_jax.models.qwen3_vl import sharding
from osvl_jax.train import curves, data, grpo, metrics, rollouts, sft, validation



def report_window(steps: int) -> int:
  """GRPO steps averaged for grpo_reward_first / grpo_reward_last: a quarter of the run, 1 to 5 steps."""
  return min(5, max(1, steps // 4))


def _stage(name: str, index: int):
  print(f'demo: [{index}/4] {name}', flush=True)


def check_config(config) -> None:
  """Checks every stage's config (data, sft, eval, grpo) before the first stage starts.

  Raises:
    ValueError: naming the field, from `data_pipeline.build.check_config`, `sft.check_config`,
      `grpo.check_config`, or eval.num_prompts / num_samples not ints >= 1, eval.temperature < 0, eval.top_p not
      in (0, 1].
  """
  build_lib.check_config(config.data)
  sft.check_config(config)
  checks.positive_int(config, 'eval.num_prompts')
  checks.positive_int(config, 'eval.num_samples')
  checks.number(config, 'eval.temperature', low=0)
  checks.number(config, 'eval.top_p', low=0, low_open=True, high=1)
  grpo.check_config(config)


def evaluate_format(config, workdir: pathlib.Path, model) -> dict:
  """Samples the policy `eval.num_samples` times on each of `eval.num_prompts` RL prompts (the `rl` split, disjoint
  from the SFT items); fraction of steps with r_fmt^(l) = 1."""
  path = workdir / 'eval_sft.json'
  if path.exists():
    return json.loads(path.read_text())
  prompts = data.load_prompts(config, workdir)[:config.eval.num_prompts]
  runner = rollouts.RolloutRunner(config, model)
  trajectories = runner.run(prompts, num_generations=config.eval.num_samples, temperature=config.eval.temperature,
                            top_p=config.eval.top_p, seed=config.seed)
  scores = [rollouts.score(t, alpha=config.grpo.alpha) for t in trajectories]
  result = {
      'sft_format_ok': rollouts.format_ok_fraction(trajectories),
      'num_trajectories': len(trajectories),
      'num_steps': sum(len(t.steps) for t in trajectories),
      'mean_reward': float(np.mean([s['reward'] for s in scores])),
      'r_acc': float(np.mean([s['r_acc'] for s in scores])),
      'example_steps': [s.text for s in trajectories[0].steps],
  }
  writer = metrics.MetricWriter(workdir, 'eval')
  writer.write(0, {k: v for k, v in result.items() if k != 'example_steps'})
  writer.close()
  path.write_text(json.dumps(result, indent=1))
  return result


def run(config, workdir: str | pathlib.Path, mesh=None) -> str:
  """Runs every stage on `mesh` (main's; None = built here from `config.mesh`, once: SFT and GRPO share it);
  returns the summary line.

  Raises:
    ValueError: from `check_config`, before any stage runs or anything is written.
  """
  check_config(config)
  mesh = sharding.mesh_from_config(config.get('mesh')) if mesh is None else mesh
  workdir = storage.path(workdir)  # gs://... stays a URL (its dataset then needs --config.data.dir)
  workdir.mkdir(parents=True, exist_ok=True)
  t0 = time.time()
  _stage('data: Wikispeedia paths -> multi-hop visual questions -> oracle expert trajectories', 1)
  stats = build_lib.build_dataset(config.data, data.dataset_dir(config, workdir))
  print(f"demo: data {json.dumps(stats['summary'])}", flush=True)
  _stage('sft', 2)
  model = sft.train(config, workdir, mesh)
  _stage('eval: sampling the SFT policy on the RL prompts', 3)
  evaluation = evaluate_format(config, workdir, model)
  print(f"demo: sft_format_ok={evaluation['sft_format_ok']:.3f} over {evaluation['num_steps']} steps", flush=True)
  _stage(f'grpo (fatal_mode={config.grpo.fatal_mode})', 4)
  grpo.train(config, workdir, mesh)
  print(f'demo: finished in {time.time() - t0:.0f} s; GRPO curves: {workdir / "grpo_reward.png"}', flush=True)
  return summary(config, evaluation, metrics.read_metrics(workdir, 'grpo'), workdir,
                 metrics.read_metrics(workdir, validation.STAGE))


def summary(config, evaluation: dict, records: list[dict], workdir: pathlib.Path,
            val_records: list[dict] = ()) -> str:
  """The demo's last line from the eval result and the GRPO metric records (a resumed step's last record counts,
  `curves.series`); plots the GRPO reward and turns per step to `<workdir>/grpo_reward.png`, with the validation
  records' (stage 'val', `grpo.val_every`) at their steps beside them when there are any.

  grpo_reward_first / grpo_reward_last: the mean batch reward over the first / last `report_window` steps.
  """
  reward, fatal = curves.series(records, 'mean_reward'), curves.series(records, 'fatal_fraction')
  first, last = curves.window_means(reward, report_window(len(reward)))
  mode = config.grpo.fatal_mode
  val = lambda key: {'validation (held-out)': curves.step_points(val_records, key)} if val_records else None
  curves.plot_panels([({mode: [reward]}, 'mean batch reward', 'GRPO reward', val('mean_reward')),
                      ({mode: [curves.series(records, 'mean_turns')]}, 'turns per rollout', 'GRPO turns',
                       val('mean_turns'))],
                     workdir / 'grpo_reward.png')
  return (f"demo: sft_format_ok={evaluation['sft_format_ok']:.3f} grpo_steps={len(reward)} "
          f'grpo_group_size={config.grpo.num_generations} '
          f'mean_reward={reward.mean():.4f} fatal_fraction={fatal.mean():.4f} '
          f'grpo_reward_first={first:.4f} grpo_reward_last={last:.4f}')


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # orbax logs every checkpoint step at INFO
  distributed.initialize()  # multi-host (TPU pod, or OSVL_* / JAX_COORDINATOR_ADDRESS variables); else a no-op
  compile_cache.enable_for_run(_CONFIG.value, _WORKDIR.value)
  print(run(_CONFIG.value, _WORKDIR.value), flush=True)  # builds the run's one mesh after checking the config


if __name__ == '__main__':
  # Flags are defined only when run as a program, so the modules import into each other (and tests) freely.
  _CONFIG = config_flags.DEFINE_config_file('config', 'configs/demo.py', 'ml_collections config file.')
  _WORKDIR = flags.DEFINE_string('workdir', 'workdir/demo', 'Job folder; rerunning resumes.')
  app.run(main)
