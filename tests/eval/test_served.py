"""Evaluation of served models (`rollout.engine` 'sglang' / 'openai', `rollout.factory.make_engine`) over real HTTP
on 127.0.0.1: `python -m osvl_jax.serve --tiny` directly, two of them behind the real `sglang-router`, and the
serve's `/v1/chat/completions` as the OpenAI-compatible endpoint; every mode, with the report's cost figures."""

import json
import os
import pathlib
import subprocess
import sys

import httpx
import numpy as np
import pytest

from osvl_jax.eval import runner
from tests.eval.conftest import SCRIPT, small_config
from tests.rollout.openai_double import ChatDouble
from tests.serve.conftest import router_cluster

ROOT = pathlib.Path(__file__).parents[2]
MODES = ('agentic', 'direct', 'rag', 'degrade')
# The eval below fits in 1536 tokens a trajectory; the workers serve the tiny model at the eval's pixel budget
# (small_config: 32*32 .. 64*64, the `--tiny` default).
WORKER_FLAGS = ('--max_len=2048', '--bucket=256', '--max_new_tokens=4', '--batch_window_ms=20')


def served_config(**rollout):
  c = small_config(benchmarks=('fvqa',), max_items_per_benchmark=2, max_tool_calls=1, modes=MODES)
  c.rollout.max_new_tokens = 4
  c.rollout.max_total_tokens = 1536
  c.rollout.timeout_s = 300.0
  c.rollout.update(rollout)
  return c


def _flags(config) -> list[str]:
  """The CLI overrides that make configs/eval.py into `config` (its rollout engine fields included)."""
  r = config.rollout
  out = ['--config.benchmarks=fvqa', '--config.max_items_per_benchmark=2', '--config.max_tool_calls=1',
         f'--config.modes={",".join(MODES)}', '--config.batch_size=2', '--config.progress=False',
         '--config.image.min_pixels=1024', '--config.image.max_pixels=4096', '--config.rollout.max_new_tokens=4',
         '--config.rollout.max_total_tokens=1536', '--config.rollout.timeout_s=300',
         f'--config.rollout.engine={r.engine}']
  for field in ('urls', 'base_url', 'model'):
    if r.get(field):
      out.append(f'--config.rollout.{field}={r[field]}')
  return out


def _evaluate_cli(workdir, config):
  env = {**os.environ, 'XLA_FLAGS': '--xla_force_host_platform_device_count=1', 'JAX_PLATFORMS': 'cpu'}
  out = subprocess.run([sys.executable, '-m', 'osvl_jax.evaluate', '--config=configs/eval.py',
                        f'--workdir={workdir}', *_flags(config)], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  assert out.stdout.strip().splitlines()[-1] == f'benchmarks=1 items=2 report={workdir / "report.json"}'
  return json.loads((workdir / 'report.json').read_text())


def _records(workdir) -> dict:
  rows = [json.loads(l) for l in (workdir / 'results.jsonl').read_text().splitlines()]
  return {(r['run'], r['id']): r for r in rows}


def _assert_costs_filled(rep, records):
  """Every mode ran both items through the engine (no engine error) and the report's costs are filled."""
  assert list(rep['runs']) == list(MODES) and len(records) == 2 * len(MODES)
  for r in records.values():
    assert r['error'] is None and r['stop_reason'] != 'error', r
    assert r['turns'] >= 1 and r['gen_tokens'] >= 1 and r['seconds'] > 0
  for run in rep['runs'].values():
    costs = run['all']
    assert costs['items'] == 2 and costs['error_rate'] == 0.0
    assert costs['turns']['mean'] >= 1 and costs['gen_tokens']['mean'] >= 1 and costs['seconds']['mean'] > 0
    assert set(costs['tool_calls']) == {'mean', 'median', 'p90'}
  assert next(r for r in records.values() if r['run'] == 'rag')['rag_status'] == 'ok'


@pytest.fixture(scope='module')
def cluster(tmp_path_factory):
  """(router URL, [worker URLs]): two `osvl_jax.serve --tiny` workers (the same random model) behind
  `sglang_router.launch_router` (round robin)."""
  with router_cluster(tmp_path_factory.mktemp('logs'), *WORKER_FLAGS, timeout=180) as urls:
    yield urls


@pytest.fixture(scope='module')
def one_worker(cluster, tmp_path_factory, env):
  """(workdir, report, records) of the eval against worker 0 over SGLang's API, in process."""
  workdir = tmp_path_factory.mktemp('sglang_direct')
  rep = runner.evaluate(served_config(engine='sglang', urls=cluster[1][0], temperature=0.0), workdir, env=env)
  return workdir, rep, _records(workdir)


def test_sglang_engine_evaluates_a_served_model_in_every_mode(cluster, one_worker):
  workdir, rep, records = one_worker
  _assert_costs_filled(rep, records)
  settings = json.loads((workdir / 'eval_settings.json').read_text())
  assert settings['policy'] == {'served': 'sglang', 'urls': cluster[1][0]} and settings['engine'] == {'class': 'sglang'}
  assert rep['meta']['policy'] == f'served=sglang, urls={cluster[1][0]}'


def test_the_cli_evaluates_two_workers_behind_the_router_as_one_of_them(cluster, one_worker, tmp_path):
  """Greedy, the same weights: through the router each item gets the answer worker 0 gave it, token for token."""
  router, workers = cluster
  rows = lambda: [httpx.get(w + '/server_info', timeout=10).json()['internal_states'][0]['stats']['rows']
                  for w in workers]
  before = rows()
  rep = _evaluate_cli(tmp_path, served_config(engine='sglang', urls=router))
  assert all(a > b for a, b in zip(rows(), before))   # the router sent turns to both workers
  records = _records(tmp_path)
  _assert_costs_filled(rep, records)
  want = one_worker[2]
  assert sorted(records) == sorted(want)
  for key, r in records.items():
    assert (r['response'], r['gen_tokens'], r['turns'], r['stop_reason']) == (
        want[key]['response'], want[key]['gen_tokens'], want[key]['turns'], want[key]['stop_reason']), key


def test_the_cli_evaluates_the_serves_chat_endpoint_as_an_openai_model(cluster, tmp_path):
  rep = _evaluate_cli(tmp_path, served_config(engine='openai', base_url=f'{cluster[1][0]}/v1', model='osvl-jax'))
  records = _records(tmp_path)
  _assert_costs_filled(rep, records)
  settings = json.loads((tmp_path / 'eval_settings.json').read_text())
  assert settings['policy'] == {'served': 'openai', 'base_url': f'{cluster[1][0]}/v1', 'model': 'osvl-jax'}


def test_an_api_model_that_calls_tools_is_judged_and_costed_in_every_mode(tmp_path, env):
  """A scripted API model (tool schemas in its system message: a crop, then the answer; without them: the answer)
  over real HTTP: Pass@1, tool usage and costs per mode, the rag results and the degraded image in its messages."""
  def answer(body, n):
    tools = '"crop"' in body['messages'][0]['content']
    return SCRIPT[0] if tools and len(body['messages']) == 2 else SCRIPT[1]
  double = ChatDouble(answer)
  with double.serve() as url:
    config = served_config(engine='openai', base_url=url, model='api-model', max_new_tokens=128)
    config.update(max_items_per_benchmark=3)
    rep = runner.evaluate(config, tmp_path, env=env)
  records = _records(tmp_path)
  for mode, run in rep['runs'].items():
    costs = run['all']
    assert run['benchmarks']['fvqa']['pass_at_1'] == pytest.approx(1 / 3), mode   # one of three is the Tagus item
    tools = mode in ('agentic', 'degrade')
    assert costs['tool_usage'] == ({'crop': 3} if tools else {}) and costs['tool_calls']['mean'] == float(tools)
    assert costs['turns']['mean'] == 1 + tools and costs['gen_tokens']['mean'] > 0 and costs['seconds']['mean'] > 0
  # 3 items: agentic and degrade 2 turns each, direct and rag 1.
  assert len(double.bodies) == 3 * (2 + 1 + 1 + 2)
  rag = [b for b in double.bodies if 'Search results for the question' in json.dumps(b['messages'][1])]
  assert len(rag) == 3
  by_item = {}
  for body, images in zip(double.bodies, double.images):
    if len(body['messages']) == 2 and images:
      by_item.setdefault(json.dumps(body['messages'][1]['content'][0]), []).append(images[0])
  assert any(any(not np.array_equal(ims[0], im) for im in ims[1:]) for ims in by_item.values())  # degraded
  assert all(r['response'] == 'Tagus River' for r in records.values())
