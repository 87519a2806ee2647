"""Does the trainer make an agent better? GRPO on the lookup world (DESIGN.md §6b, "Learning testbed"), per fatal
mode and seed, with the image-blind counter-test: the Table 3b comparison as an experiment.

  .venv/bin/python bench/learning_world.py --workdir=W [--config=configs/lookup.py[:hops=2]] [--modes=mask_clamp]
      [--seeds=3] [--failure_rate=0.3] [--fatal_k=3] [--blind_seeds=1] [--config.grpo.steps=30 ...]

Stages, each resumed from W when rerun with the same settings (a finished run keeps its `result.json`):
  1. the world (`data_pipeline.lookup_world`, W/data) and SFT once (`osvl_jax.train.sft`, W/sft_ckpt), shared by
     every mode and seed;
  2. SFT competence, greedy on the held-out prompts with no tool failures: format_ok, each copy (key from the
     image's colour, day from the question, value from the tool's text), accuracy;
  3. before GRPO: greedy accuracy on the held-out combinations (the `rl` split's last `heldout_combos`, held out of
     GRPO by `grpo.heldout_prompts`) with tools failing at `--failure_rate` (backend_error) and K = `--fatal_k`;
  4. per mode and seed: `osvl_jax.train.grpo` from the SFT checkpoint in W/learning/<setting>/<mode>/seed<s> (seed
     s draws the prompts, samples and injected failures: seed s of every mode starts from the same rollouts), then
     the same greedy evaluation;
  5. the counter-test (after the first mode's runs): `--blind_seeds` runs of the first mode with
     `grpo.zero_pixels='rollout'` (the policy never sees the image, in training and evaluation), whose held-out
     accuracy must stay at or below the image-blind chance level (the best any fixed key guess scores on those
     prompts without failures).

Written to W/learning/<setting> (setting = `fail<rate>_k<K>[_hops2]`): learning.json (everything), learning.png
(reward, batch accuracy, retry-after-failure rate, retry copies and turns per GRPO step, one line per mode with ± 1
standard error over seeds). Printed, one line per mode, then the counter-test's:

  mode=<m> reward_first=<x> reward_last=<y> delta=<d> delta_se=<s> acc_before=<a> acc_after=<b> retry_rate=<r>
      retry_copy=<c> seconds_per_run=<t>
  blind mode=<m> acc_before=<a> acc_after=<b> chance=<c> above_chance=<yes|no>

reward_first / reward_last: mean batch reward of the first / last `window` steps (a quarter of the steps), averaged
over seeds; delta the per-seed difference averaged, delta_se its standard error over seeds (0 with one);
acc_after, retry_rate (of the failed calls that had a next step, the fraction followed by another call) and
retry_copy (of those next calls, the fraction with the key and the day right) are the greedy held-out evaluation
after GRPO, averaged over seeds. A smoke run: --seeds=1 --blind_seeds=0
--config.sft.steps=20 --config.grpo.steps=2. Feeds BENCHMARKS.md, "Learning (lookup world)".
"""

import json
import pathlib
import pickle
import sys
import time

import numpy as np
from absl import app, flags, logging
from ml_collections import config_flags

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from data_pipeline import lookup_world  # noqa: E402
from osvl_jax import compile_cache  # noqa: E402
from osvl_jax.data import pipeline as pipeline_data  # noqa: E402
from osvl_jax.models.qwen3_vl import sharding  # noqa: E402
from osvl_jax.rl import fatal as fatal_lib  # noqa: E402
from osvl_jax.train import curves, data, grpo, metrics, rollouts, sft  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file('config', 'configs/lookup.py', 'The lookup world config.')
_WORKDIR = flags.DEFINE_string('workdir', None, 'Bench folder: W/data, W/sft_ckpt, W/learning.', required=True)
_MODES = flags.DEFINE_list('modes', ['mask_clamp'], 'fatal_modes to compare (none, hard, mask, mask_clamp).')
_SEEDS = flags.DEFINE_integer('seeds', 3, 'GRPO seeds per mode (0, 1, ...).')
_RATE = flags.DEFINE_float('failure_rate', 0.3, 'Probability that a tool call fails in GRPO and evaluation.')
_FATAL_K = flags.DEFINE_integer('fatal_k', 3, 'K: consecutive failed calls that make a rollout fatal.')
_BLIND_SEEDS = flags.DEFINE_integer('blind_seeds', 1, 'Seeds of the image-blind counter-test (first mode).')


def setting_name(config) -> str:
  hops = '_hops2' if config.data.hops == 2 else ''
  return f'fail{round(_RATE.value * 100):d}_k{_FATAL_K.value}{hops}'


def with_failures(base, rate: float, seed: int, fatal_k: int):
  """`base` with tools failing at `rate` (backend_error, drawn from `seed`) and K = `fatal_k`."""
  config = base.copy_and_resolve_references()
  config.unlock()
  config.tools.failure_injection = {'rate': float(rate), 'kind': 'backend_error', 'seed': int(seed)}
  config.rollout.fatal_k = fatal_k
  return config


def item_facts(config, workdir: pathlib.Path) -> dict[str, tuple[int, int]]:
  """prompt_id -> (key, day) of every item of the world."""
  rows, _ = pipeline_data.read_split(data.dataset_dir(config, workdir) / pipeline_data.ITEMS)
  facts = {}
  for r in rows:
    _, key, _, day = r['answer_evidence'].split()
    facts[r['prompt_id']] = (int(key), int(day))
  return facts


def trajectory_figures(traj, facts: dict) -> dict:
  """Per-trajectory figures: key / day copies (the first call's arguments), value copy (the response equals the last
  successful lookup's value; None without one), retries and failures with a next step."""
  calls = [s for s in traj.steps if s.action.kind == 'tool_call']
  key, day = facts[traj.prompt_id]
  first = calls[0].action.arguments if calls and isinstance(calls[0].action.arguments, dict) else {}
  values = [lookup_world.RESULT.fullmatch(s.result.text.strip()) for s in calls if s.result is not None and s.result.ok]
  values = [m.group(3) for m in values if m]
  failed_next = [traj.steps[i + 1].action.kind == 'tool_call' for i, s in enumerate(traj.steps[:-1])
                 if s.is_execution_error]
  retried = [traj.steps[i + 1].action.arguments for i, s in enumerate(traj.steps[:-1])
             if s.is_execution_error and traj.steps[i + 1].action.kind == 'tool_call']
  retried = [a if isinstance(a, dict) else {} for a in retried]
  return {'key_copy': float(first.get('key') == key), 'day_copy': float(first.get('day') == day),
          'value_copy': (None if not values or traj.final_response is None
                         else float(traj.final_response.strip() == values[-1])),
          'retries': sum(failed_next), 'failures_with_next': len(failed_next),
          'retry_copies': sum(a.get('key') == key and a.get('day') == day for a in retried)}


def evaluate(config, model, prompts: list[dict], facts: dict) -> dict:
  """Greedy episodes (temperature 0), one per prompt, with `config`'s tools: accuracy, reward, format_ok, turns,
  copies, retry rate."""
  runner = rollouts.RolloutRunner(config, model)
  trajectories = runner.run(prompts, num_generations=1, temperature=0.0, top_p=1.0, seed=config.seed)
  scores = [rollouts.score(t, alpha=config.grpo.alpha) for t in trajectories]
  figures = [trajectory_figures(t, facts) for t in trajectories]
  values = [f['value_copy'] for f in figures if f['value_copy'] is not None]
  failures = sum(f['failures_with_next'] for f in figures)
  return {'accuracy': float(np.mean([s['r_acc'] for s in scores])),
          'reward': float(np.mean([s['reward'] for s in scores])),
          'format_ok': rollouts.format_ok_fraction(trajectories),
          'turns': float(np.mean([len(t.steps) for t in trajectories])),
          'key_copy': float(np.mean([f['key_copy'] for f in figures])),
          'day_copy': float(np.mean([f['day_copy'] for f in figures])),
          'value_copy': float(np.mean(values)) if values else 0.0,
          'retry_rate': sum(f['retries'] for f in figures) / failures if failures else 0.0,
          'retry_copy': retry_copy(figures),
          'fatal_fraction': float(np.mean([t.fatal_step is not None for t in trajectories])),
          'prompts': len(prompts)}


def blind_chance(config, prompts: list[dict], facts: dict) -> float:
  """The image-blind chance level: the best held-out accuracy of any fixed key guess (the day read right, no
  failures)."""
  seed, hops = int(config.data.seed), int(config.data.hops)
  answers = [p['answers'][0] for p in prompts]
  days = [facts[p['prompt_id']][1] for p in prompts]
  return max(float(np.mean([str(lookup_world.answer(seed, k, d, hops)) == a for d, a in zip(days, answers)]))
             for k in range(len(lookup_world.COLOURS)))


def retry_copy(figures: list[dict]) -> float:
  """Of the calls made right after a failed call, the fraction with the key and the day right (nan without one)."""
  retries = sum(f['retries'] for f in figures)
  return sum(f['retry_copies'] for f in figures) / retries if retries else float('nan')


def step_retry_figures(run_dir: pathlib.Path, facts: dict) -> dict[str, list[float]]:
  """Per GRPO step, from the dumped rollout batches: `retry_rate` (of the failed calls with a next step, the
  fraction retried) and `retry_copy` (of those retries, the fraction with the key and day right)."""
  out = {'retry_rate': [], 'retry_copy': []}
  for path in sorted((run_dir / 'rollouts').glob('*.pkl')):
    figures = [trajectory_figures(t, facts) for t in pickle.loads(path.read_bytes())['trajectories']]
    failures = sum(f['failures_with_next'] for f in figures)
    out['retry_rate'].append(sum(f['retries'] for f in figures) / failures if failures else float('nan'))
    out['retry_copy'].append(retry_copy(figures))
  return out


def run_config(base, mode: str, seed: int, workdir: pathlib.Path, heldout: int, zero_pixels: str = 'none'):
  config = with_failures(base, _RATE.value, seed, _FATAL_K.value)
  config.seed = seed
  g = config.grpo
  g.fatal_mode, g.init_from, g.heldout_prompts, g.zero_pixels = mode, str(workdir), heldout, zero_pixels
  g.ckpt_every, g.dump_rollouts = g.steps, True
  if not config.data.get('dir'):
    config.data.dir = str(workdir / 'data')
  return config


def one_run(base, mode, seed, workdir, out, mesh, heldout, facts, zero_pixels='none') -> dict:
  """A GRPO run and its greedy held-out evaluation; its `result.json` makes a rerun skip it."""
  run_dir = out / ('blind' if zero_pixels != 'none' else mode) / f'seed{seed}'
  done = run_dir / 'result.json'
  if done.is_file():
    return json.loads(done.read_text())
  config = run_config(base, mode, seed, workdir, heldout, zero_pixels)
  print(f'learning_world: fatal_mode={mode} seed={seed} zero_pixels={zero_pixels} -> {run_dir}', flush=True)
  t0 = time.time()
  model = grpo.train(config, run_dir, mesh)
  seconds = time.time() - t0
  records = metrics.read_metrics(run_dir, 'grpo')
  keys = {'reward': 'mean_reward', 'accuracy': 'r_acc', 'turns': 'mean_turns', 'fatal_fraction': 'fatal_fraction'}
  result = {name: curves.series(records, key).tolist() for name, key in keys.items()}
  result.update(step_retry_figures(run_dir, facts), seed=seed, seconds=seconds,
                after=evaluate(config, model, data.load_prompts(config, workdir, 'heldout'), facts))
  done.write_text(json.dumps(result, indent=1))
  return result


def summarize(runs: list[dict], window: int) -> dict:
  pairs = np.array([curves.window_means(r['reward'], window) for r in runs])   # [seeds, 2]
  deltas = pairs[:, 1] - pairs[:, 0]
  copies = [c for c in (r['after'].get('retry_copy', np.nan) for r in runs) if not np.isnan(c)]
  return {'reward_first': float(pairs[:, 0].mean()), 'reward_last': float(pairs[:, 1].mean()),
          'delta': float(deltas.mean()),
          'delta_se': float(deltas.std(ddof=1) / np.sqrt(len(deltas))) if len(deltas) > 1 else 0.0,
          'acc_after': float(np.mean([r['after']['accuracy'] for r in runs])),
          'retry_rate': float(np.mean([r['after']['retry_rate'] for r in runs])),
          'retry_copy': float(np.mean(copies)) if copies else float('nan'),   # nan: no seed retried
          'turns_after': float(np.mean([r['after']['turns'] for r in runs])),
          'seconds_per_run': float(np.mean([r['seconds'] for r in runs])), 'seeds': len(runs)}


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  workdir = pathlib.Path(_WORKDIR.value)
  for mode in _MODES.value:
    fatal_lib.FATAL_MODES.get(mode)  # ValueError naming the mode, before any run
  if _SEEDS.value < 1 or _BLIND_SEEDS.value < 0 or _FATAL_K.value < 1 or not 0 <= _RATE.value <= 1:
    raise ValueError(f'--seeds={_SEEDS.value} (>= 1), --blind_seeds={_BLIND_SEEDS.value} (>= 0), '
                     f'--fatal_k={_FATAL_K.value} (>= 1), --failure_rate={_RATE.value} (in [0, 1])')
  base = _CONFIG.value
  out = workdir / 'learning' / setting_name(base)
  out.mkdir(parents=True, exist_ok=True)
  t0 = time.time()
  stats = lookup_world.build(base.data, data.dataset_dir(base, workdir))
  print(f"learning_world: world {json.dumps(stats['sft'])}, {stats['rl_prompts']} rl prompts "
        f"({stats['heldout_prompts']} held out), {stats['vocab_ids']} ids", flush=True)
  heldout = int(stats['heldout_prompts'])
  compile_cache.enable_for_run(base, workdir)
  mesh = sharding.mesh_from_config(base.mesh)
  t_sft = time.time()
  model = sft.train(base, workdir, mesh)   # resumes; a finished SFT returns at once
  sft_seconds = time.time() - t_sft
  facts = item_facts(base, workdir)
  probe = run_config(base, _MODES.value[0], 0, workdir, heldout)
  prompts = data.load_prompts(probe, workdir, 'heldout')
  before_path = out / 'before.json'
  if before_path.is_file():
    before = json.loads(before_path.read_text())
  else:
    blind = run_config(base, _MODES.value[0], 0, workdir, heldout, 'rollout')
    before = {'competence': evaluate(with_failures(probe, 0.0, 0, _FATAL_K.value), model, prompts, facts),
              'heldout': evaluate(probe, model, prompts, facts), 'blind': evaluate(blind, model, prompts, facts),
              'sft_seconds': sft_seconds}
    before_path.write_text(json.dumps(before, indent=1))
  c = before['competence']
  print(f"learning_world: SFT competence (greedy, no failures, {c['prompts']} held-out prompts): "
        f"format_ok={c['format_ok']:.3f} key_copy={c['key_copy']:.3f} day_copy={c['day_copy']:.3f} "
        f"value_copy={c['value_copy']:.3f} accuracy={c['accuracy']:.3f}", flush=True)
  del model
  steps = int(base.grpo.steps)
  window = max(1, steps // 4)
  result = {'flags': {f: flags.FLAGS[f].value for f in ('modes', 'seeds', 'failure_rate', 'fatal_k', 'blind_seeds')},
            'grpo': base.grpo.to_dict(), 'world': stats, 'window': window, 'before': before, 'modes': {}}
  for i, mode in enumerate(_MODES.value):
    runs = [one_run(base, mode, s, workdir, out, mesh, heldout, facts) for s in range(_SEEDS.value)]
    result['modes'][mode] = {'runs': runs, 'summary': summarize(runs, window)}
    if i == 0 and _BLIND_SEEDS.value:   # the counter-test of the first mode, before the other modes
      runs = [one_run(base, mode, s, workdir, out, mesh, heldout, facts, 'rollout') for s in range(_BLIND_SEEDS.value)]
      result['blind'] = {'mode': mode, 'runs': runs, 'before': before['blind'],
                         'chance': blind_chance(base, prompts, facts),
                         'acc_after': float(np.mean([r['after']['accuracy'] for r in runs]))}
    (out / 'learning.json').write_text(json.dumps(result, indent=1))
  modes = result['modes']
  panels = [({m: [r[key] for r in v['runs']] for m, v in modes.items()}, label, title)
            for key, label, title in (('reward', 'mean batch reward', 'GRPO reward'),
                                      ('accuracy', 'batch accuracy (r_acc)', 'GRPO accuracy'),
                                      ('retry_rate', 'retried failures', 'Retry after a failed call'),
                                      ('retry_copy', 'retries with key and day right', 'Retry copies'),
                                      ('turns', 'turns per rollout', 'GRPO turns'))]
  curves.plot_panels(panels, out / 'learning.png')
  result['seconds'] = time.time() - t0
  (out / 'learning.json').write_text(json.dumps(result, indent=1))
  print(f"learning_world: {result['seconds']:.0f} s (SFT {before['sft_seconds']:.0f} s); {out / 'learning.json'}",
        flush=True)
  acc_before = before['heldout']['accuracy']
  for mode, v in modes.items():
    s = v['summary']
    print(f"mode={mode} reward_first={s['reward_first']:.4f} reward_last={s['reward_last']:.4f} "
          f"delta={s['delta']:.4f} delta_se={s['delta_se']:.4f} acc_before={acc_before:.3f} "
          f"acc_after={s['acc_after']:.3f} retry_rate={s['retry_rate']:.3f} retry_copy={s['retry_copy']:.3f} "
          f"seconds_per_run={s['seconds_per_run']:.0f}", flush=True)
  if 'blind' in result:
    b = result['blind']
    print(f"blind mode={b['mode']} acc_before={b['before']['accuracy']:.3f} acc_after={b['acc_after']:.3f} "
          f"chance={b['chance']:.3f} above_chance={'yes' if b['acc_after'] > b['chance'] else 'no'}", flush=True)


if __name__ == '__main__':
  app.run(main)
