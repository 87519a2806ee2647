"""Does GRPO improve the SFT policy here (the paper's Figure 3), and the Table 3b comparison as an experiment.

  .venv/bin/python bench/learning.py --workdir=<a finished demo workdir> [--modes=none,mask_clamp] [--seeds=3]
      [--steps=20] [--prompts_per_step=2] [--num_generations=4] [--failure_rate=0.3] [--temperature=0.7]
      [--heldout=3] [--lr=5e-4] [--pack_rows=1] [--out=<workdir>/learning] [--config=configs/demo.py --config.x=y]

From the workdir's SFT checkpoint (`sft_ckpt`) and dataset, each requested `fatal_mode` trains `--steps` GRPO steps
per seed (`--seeds` seeds 0, 1, ...; the seed draws the prompts, the samples and the injected tool failures, so
seed s of every mode starts from the same rollouts), in `<out>/<mode>/seed<s>` (started afresh). Tools fail at
random with `--failure_rate` (`tools.failure_injection`, backend_error); rollouts sample at `--temperature` (the
paper's 0.7, top-p 1.0) and the trainer's log-probs are those of the same tempered distribution. The last
`--heldout` prompts of the dataset's `rl` split are held out of training (`grpo.heldout_prompts`): before training
and after each run, greedy decoding (temperature 0) is scored on them and on the training prompts (same tools,
same injected failures).

Per step and run (from the GRPO metrics and the dumped rollout batches): batch reward and accuracy (r_acc), turns
per rollout, fatal fraction, clamped fraction, and the r̃ of fatal samples (kept: r̃ >= 0; clamped: r̃ < 0).
Written to <out>: learning.json (everything), learning.png (reward and turns per step, one line per mode, a band of
± 1 standard error over the seeds), fatal_advantages.png (histogram of the fatal samples' r̃, per mode). Printed,
one line per mode:

  mode=<m> reward_first10=<x> reward_last10=<y> delta=<d> delta_se=<s> turns_last10=<t> heldout_before=<a> heldout_after=<b>

delta = last-10 minus first-10 mean batch reward of each seed, averaged over seeds; delta_se its standard error
over the seeds (0 with one seed). With fewer than 20 steps the windows are half the steps each. A smoke run:
--steps=2 --seeds=1 --modes=mask_clamp --heldout=2. Feeds BENCHMARKS.md, "Learning (demo data, history)".
"""

import json
import pathlib
import pickle
import shutil
import sys
import time

import numpy as np
from absl import app, flags, logging
from ml_collections import config_flags

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from osvl_jax import compile_cache  # noqa: E402
from osvl_jax.models.qwen3_vl import sharding  # noqa: E402
from osvl_jax.rl import advantages as advantages_lib  # noqa: E402
from osvl_jax.rl import fatal as fatal_lib  # noqa: E402
from osvl_jax.train import curves, data, grpo, metrics, rollouts  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file('config', 'configs/demo.py', 'ml_collections config file.')
_WORKDIR = flags.DEFINE_string('workdir', 'workdir/demo', 'A finished demo workdir: sft_ckpt (and data).')
_OUT = flags.DEFINE_string('out', '', "Where the runs go; '' = <workdir>/learning.")
_MODES = flags.DEFINE_list('modes', ['none', 'mask_clamp'], 'fatal_modes to compare (none, hard, mask, mask_clamp).')
_SEEDS = flags.DEFINE_integer('seeds', 3, 'Seeds per mode (0, 1, ...).')
_STEPS = flags.DEFINE_integer('steps', 20, 'GRPO steps per run.')
_PROMPTS = flags.DEFINE_integer('prompts_per_step', 2, 'Prompts per GRPO step.')
_GROUP = flags.DEFINE_integer('num_generations', 4, 'Samples per prompt (G).')
_RATE = flags.DEFINE_float('failure_rate', 0.3, 'Probability that a tool call fails (injected backend_error).')
_TEMPERATURE = flags.DEFINE_float('temperature', 0.7, 'Rollout temperature (top-p 1.0), the paper\'s 0.7.')
_HELDOUT = flags.DEFINE_integer('heldout', 3, 'Last prompts of the rl split held out of training (the demo: 3 of 9).')
_LR = flags.DEFINE_float('lr', 5e-4, 'GRPO learning rate (constant schedule).')
_PACK_ROWS = flags.DEFINE_integer(
    'pack_rows', 1, 'grpo.pack_rows of the update: packed rows per micro-batch (0 = one trajectory per row, the '
    'whole batch at once; 1 halves the update on the 2-core CPU, BENCHMARKS.md session 20).')

WINDOW = 10  # steps averaged at each end (reward_first10 / reward_last10)


def run_config(base, mode: str, seed: int, workdir: pathlib.Path, out: pathlib.Path):
  """The config of one run: `base` (the demo's) with `fatal_mode = mode`, `seed`, the flags' steps, batch, lr,
  temperature, held-out prompts and injected failures, initialised from `workdir/sft_ckpt`, its rollout batches
  dumped (for the r̃ of fatal samples), one compile cache for every run (`<out>/jax_cache`)."""
  config = base.copy_and_resolve_references()
  config.unlock()  # config_flags locks it; tools.failure_injection is a new field of the demo's tools
  config.seed = seed
  config.compile_cache_dir = str(out / 'jax_cache')
  if not config.data.get('dir'):
    config.data.dir = str(workdir / 'data')
  config.tools.failure_injection = {'rate': _RATE.value, 'kind': 'backend_error', 'seed': seed}
  g = config.grpo
  g.fatal_mode, g.steps, g.ckpt_every = mode, _STEPS.value, _STEPS.value
  g.prompts_per_step, g.num_generations = _PROMPTS.value, _GROUP.value
  g.lr, g.lr_schedule, g.warmup_steps = _LR.value, 'constant', 0
  g.temperature, g.top_p = _TEMPERATURE.value, 1.0
  g.init_from = str(workdir)
  g.heldout_prompts = _HELDOUT.value
  g.dump_rollouts = True
  g.pack_rows = _PACK_ROWS.value  # beside --config.grpo.micro_batch_size: grpo's check_config names both
  return config


def greedy_accuracy(config, runner: rollouts.RolloutRunner, prompts: list[dict]) -> dict:
  """Greedy decoding (temperature 0) with `runner`'s policy on `prompts`, one episode each: mean r_acc, reward,
  turns."""
  trajectories = runner.run(prompts, num_generations=1, temperature=0.0, top_p=1.0, seed=config.seed)
  scores = [rollouts.score(t, alpha=config.grpo.alpha) for t in trajectories]
  return {'accuracy': float(np.mean([s['r_acc'] for s in scores])),
          'reward': float(np.mean([s['reward'] for s in scores])),
          'turns': float(np.mean([len(t.steps) for t in trajectories])), 'prompts': len(prompts)}


def evaluate(config, model) -> dict:
  """`greedy_accuracy` on the held-out and on the training prompts of `config`'s dataset (one rollout engine)."""
  runner = rollouts.RolloutRunner(config, model)
  return {part: greedy_accuracy(config, runner, data.load_prompts(config, None, part)) for part in data.PARTS}


def fatal_rtildes(run_dir: pathlib.Path, cfg) -> dict[str, list[float]]:
  """r̃ (Eq. 11 before the clamp) of every fatal sample of the run's dumped rollout batches, split into kept
  (r̃ >= 0) and clamped (r̃ < 0); computed from the batches' rewards and groups as the trainer does."""
  out = {'kept': [], 'clamped': []}
  for path in sorted((run_dir / 'rollouts').glob('*.pkl')):
    batch = pickle.loads(path.read_bytes())
    trajectories, scores = batch['trajectories'], batch['scores']
    if not trajectories:
      continue
    fatal = fatal_lib.fatal_step_array([t.fatal_step for t in trajectories]) != fatal_lib.NOT_FATAL
    r_tilde, _ = advantages_lib.group_advantages_by_id(
        np.array([s['reward'] for s in scores], np.float32), fatal, [t.prompt_id for t in trajectories],
        clamp=False, estimator=cfg.get('estimator', 'grpo'), delta=cfg.delta, std_ddof=cfg.get('std_ddof', 1))
    for value in np.asarray(r_tilde)[fatal]:
      out['kept' if value >= 0 else 'clamped'].append(float(value))
  return out


def run_record(run_dir: pathlib.Path, cfg) -> dict:
  """One run's per-step series (from `<run_dir>/metrics.jsonl`) and its fatal samples' r̃."""
  records = metrics.read_metrics(run_dir, 'grpo')
  keys = {'reward': 'mean_reward', 'accuracy': 'r_acc', 'turns': 'mean_turns', 'fatal_fraction': 'fatal_fraction',
          'clamped_fraction': 'fatal_clamped_fraction', 'kept_rtilde_mean': 'fatal_kept_rtilde_mean',
          'clamped_rtilde_mean': 'fatal_clamped_rtilde_mean', 'step_seconds': 'step_seconds'}
  return {**{name: curves.series(records, key).tolist() for name, key in keys.items()},
          'fatal_rtilde': fatal_rtildes(run_dir, cfg)}


def summarize(runs: list[dict], window: int) -> dict:
  """A mode's figures over its seeds: reward_first / reward_last / turns_last (means over the first / last
  `window` steps, averaged over seeds), delta (per-seed last − first, averaged) and delta_se (its standard error over
  the seeds; 0 with one), held-out and training greedy accuracy before (shared) and after (mean over seeds)."""
  pairs = np.array([curves.window_means(r['reward'], window) for r in runs])   # [seeds, 2]
  deltas = pairs[:, 1] - pairs[:, 0]
  turns = np.array([curves.window_means(r['turns'], window)[1] for r in runs])
  return {'reward_first': float(pairs[:, 0].mean()), 'reward_last': float(pairs[:, 1].mean()),
          'delta': float(deltas.mean()),
          'delta_se': float(deltas.std(ddof=1) / np.sqrt(len(deltas))) if len(deltas) > 1 else 0.0,
          'turns_last': float(turns.mean()), 'seeds': len(runs),
          'heldout_after': float(np.mean([r['after']['heldout']['accuracy'] for r in runs])),
          'train_after': float(np.mean([r['after']['train']['accuracy'] for r in runs]))}


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  workdir = pathlib.Path(_WORKDIR.value)
  out = pathlib.Path(_OUT.value or workdir / 'learning')
  for mode in _MODES.value:
    fatal_lib.FATAL_MODES.get(mode)  # ValueError naming the mode, before any run
  if min(_SEEDS.value, _STEPS.value, _HELDOUT.value) < 1:
    raise ValueError(f'--seeds={_SEEDS.value} --steps={_STEPS.value} --heldout={_HELDOUT.value}: each must be >= 1')
  out.mkdir(parents=True, exist_ok=True)
  t0 = time.time()
  base = run_config(_CONFIG.value, _MODES.value[0], 0, workdir, out)
  grpo.check_config(base)
  compile_cache.enable_for_run(base, out)
  mesh = sharding.mesh_from_config(base.mesh)   # one mesh for every run (the runs differ in mode and seed only)
  model, *_ = grpo.init_policy(base, out / 'sft_policy', mesh)   # a folder with no grpo_ckpt: the SFT checkpoint
  before = evaluate(base, model)
  del model
  print(f"learning: before GRPO, greedy accuracy heldout={before['heldout']['accuracy']:.3f} "
        f"train={before['train']['accuracy']:.3f} ({time.time() - t0:.0f} s)", flush=True)
  window = min(WINDOW, max(1, _STEPS.value // 2))
  result = {'flags': {f: flags.FLAGS[f].value for f in ('modes', 'seeds', 'steps', 'prompts_per_step',
                                                          'num_generations', 'failure_rate', 'temperature',
                                                          'heldout', 'lr', 'pack_rows')},
            'window': window, 'before': before, 'modes': {}}
  for mode in _MODES.value:
    runs = []
    for seed in range(_SEEDS.value):
      run_dir = out / mode / f'seed{seed}'
      shutil.rmtree(run_dir, ignore_errors=True)  # every run starts from the SFT checkpoint
      config = run_config(_CONFIG.value, mode, seed, workdir, out)
      print(f'learning: fatal_mode={mode} seed={seed} -> {run_dir}', flush=True)
      model = grpo.train(config, run_dir, mesh)
      runs.append({**run_record(run_dir, config.grpo), 'seed': seed, 'after': evaluate(config, model)})
      del model
    result['modes'][mode] = {'runs': runs, 'summary': summarize(runs, window)}
    (out / 'learning.json').write_text(json.dumps(result, indent=1))  # after every mode: a partial result survives
  modes = result['modes']
  curves.plot_panels([({m: [r['reward'] for r in v['runs']] for m, v in modes.items()}, 'mean batch reward',
                       f'GRPO reward, {_RATE.value:.0%} tool failures'),
                      ({m: [r['turns'] for r in v['runs']] for m, v in modes.items()}, 'turns per rollout',
                       'GRPO turns')], out / 'learning.png')
  rtildes = {f'{m} {kind}': [x for r in v['runs'] for x in r['fatal_rtilde'][kind]]
             for m, v in modes.items() for kind in ('kept', 'clamped')}
  if any(rtildes.values()):
    curves.plot_histogram(rtildes, out / 'fatal_advantages.png', 'r̃ of fatal samples (Eq. 11, before the clamp)',
                          'Fatal samples: kept (r̃ >= 0) and clamped (r̃ < 0)')
  result['seconds'] = time.time() - t0
  (out / 'learning.json').write_text(json.dumps(result, indent=1))
  lines = []
  for mode, v in modes.items():
    s = v['summary']
    lines.append(f"mode={mode} reward_first{window}={s['reward_first']:.4f} reward_last{window}={s['reward_last']:.4f} "
                 f"delta={s['delta']:.4f} delta_se={s['delta_se']:.4f} turns_last{window}={s['turns_last']:.2f} "
                 f"heldout_before={before['heldout']['accuracy']:.3f} heldout_after={s['heldout_after']:.3f}")
  print(f"learning: {result['seconds']:.0f} s; {out / 'learning.json'}", flush=True)
  print('\n'.join(lines), flush=True)


if __name__ == '__main__':
  app.run(main)
