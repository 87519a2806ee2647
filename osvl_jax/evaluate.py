"""`python -m osvl_jax.evaluate --config=configs/eval.py --workdir=W`: evaluate a policy on the benchmarks.

Runs `osvl_jax.eval.runner` (DESIGN.md §9); rerunning with the same workdir resumes (items already in
`W/results.jsonl` are not rolled out or judged again; judge errors are judged again). A workdir that holds results
of other settings (`W/eval_settings.json`: checkpoint, prompts, engine, sampling, judge, tools) is refused, naming
the differences. Modes, benchmarks and budgets take a tuple or a comma-separated list
(`--config.modes=agentic,direct`); an unknown name stops the job before any model is built (exit status 1). Last
line printed:
  benchmarks=<n> items=<m> report=<W>/report.json
"""

from absl import app, flags
from ml_collections import config_flags

from osvl_jax import compile_cache
from osvl_jax.eval import runner, runs


def _pct(x: float | None) -> str:
  return 'n/a' if x is None else f'{x:.3f}'


def main(argv) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  try:
    runs.check_config(_CONFIG.value)
    evaluator = runner.Evaluator(_CONFIG.value, _WORKDIR.value)
  except (ValueError, FileNotFoundError) as e:  # a bad name, a missing checkpoint, a workdir of other settings
    raise app.UsageError(str(e)) from e
  compile_cache.enable_for_run(_CONFIG.value, _WORKDIR.value)  # after the checks: a refused run writes nothing
  rep = evaluator.evaluate()
  for key, run in rep['runs'].items():
    print(f"run={key} average_pass_at_1={_pct(run['average_pass_at_1'])} "
          f"(over {','.join(run['average_covers']) or 'none'}) "
          f"mean_tool_calls={run['all']['tool_calls']['mean']:.2f}", flush=True)
  print(f"benchmarks={len(rep['benchmarks'])} items={rep['items']} report={rep['report']}", flush=True)


if __name__ == '__main__':
  # Flags are defined only when run as a program, so the module imports into others (and tests) freely.
  _CONFIG = config_flags.DEFINE_config_file('config', 'configs/eval.py', 'Eval config file.', lock_config=True)
  _WORKDIR = flags.DEFINE_string('workdir', None, 'Output folder (results.jsonl, report.*); resumable.',
                                 required=True)
  app.run(main)
