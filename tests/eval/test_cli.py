"""The absl main `python -m osvl_jax.evaluate`: list flags as comma-separated strings or tuples, names checked before
any model is built (unknown name: an error listing the known names, non-zero exit)."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from osvl_jax.data import benchmarks
from osvl_jax.eval import runs

from tests.eval.conftest import small_config

ROOT = pathlib.Path(__file__).parents[2]


def _evaluate(workdir, *flags, timeout=600, config='configs/eval.py'):
  env = {**os.environ, 'XLA_FLAGS': '--xla_force_host_platform_device_count=1', 'JAX_PLATFORMS': 'cpu'}
  return subprocess.run([sys.executable, '-m', 'osvl_jax.evaluate', f'--config={config}',
                         f'--workdir={workdir}', '--config.progress=False', *flags],
                        cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize('flags, named', [
    (['--config.benchmarks=fvqa,nope'], "unknown benchmark(s) ['nope']"),
    (['--config.benchmarks=a,b'], "unknown benchmark(s) ['a', 'b']"),
    (['--config.benchmarks=fvqa', '--config.modes=agentic,sideways'], "eval mode 'sideways' is not one of"),
    (['--config.benchmarks=fvqa', '--config.budgets=2,x'], "tool-call budget 'x' is not an integer"),
    (['--config.benchmarks=fvqa', '--config.rollout.prefix_cache_slots=-1'], 'rollout.prefix_cache_slots=-1'),
])
def test_bad_names_exit_non_zero_before_anything_is_built(tmp_path, flags, named):
  out = _evaluate(tmp_path / 'w', *flags, timeout=300)
  assert out.returncode != 0, out.stdout
  assert named in out.stderr
  if 'benchmark' in named:
    assert str(sorted(benchmarks.BENCHMARKS)) in out.stderr  # the known names are listed
  assert not (tmp_path / 'w').exists() or not any((tmp_path / 'w').iterdir())  # nothing written, nothing run


def test_the_paper_eval_without_a_judge_endpoint_exits_naming_both_fields(tmp_path):
  out = _evaluate(tmp_path / 'w', timeout=300, config='configs/eval_paper.py')
  assert out.returncode != 0, out.stdout
  assert "judge.name='llm' needs judge.base_url and judge.model (empty)" in out.stderr
  assert not (tmp_path / 'w').exists() or not any((tmp_path / 'w').iterdir())  # nothing written, nothing run


def test_comma_separated_modes_benchmarks_and_budgets_run(tmp_path):
  """The documented form `--config.modes=agentic,direct` (config_flags makes it the 1-tuple ('agentic,direct',))."""
  out = _evaluate(tmp_path, '--config.modes=agentic,direct', '--config.benchmarks=fvqa,mmsearch',
                  '--config.budgets=1', '--config.max_items_per_benchmark=1', '--config.max_tool_calls=1',
                  '--config.rollout.max_new_tokens=2', '--config.rollout.max_total_tokens=1024',
                  '--config.model.text.num_hidden_layers=1', '--config.image.min_pixels=1024',
                  '--config.image.max_pixels=4096')
  assert out.returncode == 0, out.stderr[-3000:]
  rep = json.loads((tmp_path / 'report.json').read_text())
  assert list(rep['runs']) == ['agentic', 'direct', 'budget_1'] and rep['benchmarks'] == ['fvqa', 'mmsearch']
  assert out.stdout.strip().splitlines()[-1] == f'benchmarks=2 items=2 report={tmp_path / "report.json"}'


def test_list_fields_read_strings_and_tuples_alike():
  assert runs.as_list(('agentic,direct',), 'modes') == ['agentic', 'direct']
  assert runs.as_list('agentic, direct', 'modes') == ['agentic', 'direct']
  assert runs.as_list("('agentic', 'direct')", 'modes') == ['agentic', 'direct']
  assert runs.as_list((2, 4), 'budgets') == ['2', '4'] and runs.as_list('', 'budgets') == []
  with pytest.raises(ValueError, match='listed twice'):
    runs.as_list('fvqa,fvqa', 'benchmarks')
  planned = runs.plan_runs(small_config(modes=('agentic,direct',), budgets=('2,4',)))
  assert [r.key for r in planned] == ['agentic', 'direct', 'budget_2', 'budget_4']
  assert runs.benchmark_names(small_config(benchmarks=('fvqa,mmsearch',))) == ['fvqa', 'mmsearch']
  with pytest.raises(ValueError, match='nothing to run'):
    runs.plan_runs(small_config(modes=(), budgets=()))
  with pytest.raises(ValueError, match='is empty'):
    runs.benchmark_names(small_config(benchmarks=()))
