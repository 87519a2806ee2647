"""`python -m osvl_jax.evaluate --config=configs/eval.py --workdir=W`: evaluate a policy on the benchmarks.

Runs `osvl_jax.eval.runner` (DESIGN.md §9); rerunning with the same workdir resumes (items already in
`W/results.jsonl` are not rolled out or judged again). Last line printed:
  benchmarks=<n> items=<m> report=<W>/report.json
"""

from absl import app, flags
from ml_collections import config_flags

from osvl_jax.eval import runner


def main(argv) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  rep = runner.evaluate(_CONFIG.value, _WORKDIR.value)
  for key, run in rep['runs'].items():
    print(f"run={key} average_pass_at_1={run['average_pass_at_1']:.3f} "
          f"mean_tool_calls={run['all']['tool_calls']['mean']:.2f}", flush=True)
  print(f"benchmarks={len(rep['benchmarks'])} items={rep['items']} report={rep['report']}", flush=True)


if __name__ == '__main__':
  # Flags are defined only when run as a program, so the module imports into others (and tests) freely.
  _CONFIG = config_flags.DEFINE_config_file('config', 'configs/eval.py', 'Eval config file.', lock_config=True)
  _WORKDIR = flags.DEFINE_string('workdir', None, 'Output folder (results.jsonl, report.*); resumable.',
                                 required=True)
  app.run(main)
