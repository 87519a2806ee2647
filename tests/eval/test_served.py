"""Evaluation of served models (`rollout.engine` 'sglang' / 'openai', `rollout.factory.make_engine`) over real HTTP
on 127.0.0.1: `python -m osvl_jax.serve --tiny` directly, two of them behind the real `sglang-router`, and the
serve's `/v1/chat/completions` as the OpenAI-compatible endpoint; every mode, with the report's cost figures."""

import json
import os
import pathlib
import subprocess
import sys
import zlib

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
  out = ['--config.benchmarks=fvqa', f'--config.max_items_per_benchmark={config.max_items_per_benchmark}',
         '--config.max_tool_calls=1', f'--config.modes={",".join(config.modes)}', '--config.batch_size=2',
         '--config.progress=False',
         '--config.image.min_pixels=1024', '--config.image.max_pixels=4096', '--config.rollout.max_new_tokens=4',
         '--config.rollout.max_total_tokens=1536', '--config.rollout.timeout_s=300',
         f'--config.rollout.engine={r.engine}']
  for field in ('urls', 'base_url', 'model', 'retries'):
    if r.get(field):
      out.append(f'--config.rollout.{field}={r[field]}')
  return out


def _evaluate_cli(workdir, config, items=2):
  env = {**os.environ, 'XLA_FLAGS': '--xla_force_host_platform_device_count=1', 'JAX_PLATFORMS': 'cpu'}
  out = subprocess.run([sys.executable, '-m', 'osvl_jax.evaluate', '--config=configs/eval.py',
                        f'--workdir={workdir}', *_flags(config)], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  assert out.stdout.strip().splitlines()[-1] == f'benchmarks=1 items={items} report={workdir / "report.json"}'
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
  reports = settings['policy'].pop('reports')
  assert settings['policy'] == {'served': 'sglang', 'urls': cluster[1][0]} and settings['engine'] == {'class': 'sglang'}
  assert reports[cluster[1][0]]['served_model_name'] == 'osvl-jax'   # what /model_info says is served there
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
  reports = settings['policy'].pop('reports')
  assert settings['policy'] == {'served': 'openai', 'base_url': f'{cluster[1][0]}/v1', 'model': 'osvl-jax'}
  assert reports['id'] == 'osvl-jax' and 'created' not in reports   # its /v1/models card, without the stamp


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


def test_engine_failures_are_counted_apart_and_redone_on_resume(tmp_path, env):
  """An API model answering some items with 500s: those are engine errors (not wrong answers: Pass@1 is over the
  items that ran, the engine-error rate beside it), the billed tokens reach the report; a rerun with another
  timeout / retries / concurrency resumes and rolls out exactly the failed items again; another model behind the
  same URL is refused."""
  from osvl_jax.eval import results
  from tests.rollout.openai_double import USAGE, Reply
  broken = {'on': True}
  fails = lambda body: broken['on'] and zlib.crc32(json.dumps(body['messages'][1]).encode()) % 2 == 0
  double = ChatDouble(lambda body, n: Reply(status=500) if fails(body) else SCRIPT[1],
                      models=[{'id': 'api-model', 'object': 'model', 'created': 1, 'owned_by': 'lab-a'}])
  config = served_config(engine='openai', model='api-model', max_new_tokens=128, retries=0)
  config.update(max_items_per_benchmark=6, modes=('direct',))
  with double.serve() as url:
    config.rollout.base_url = url
    rep = runner.evaluate(config, tmp_path, env=env)
    failed = {k for k, r in _records(tmp_path).items() if r['engine_error']}
    s = rep['runs']['direct']['benchmarks']['fvqa']
    ran = [r for r in _records(tmp_path).values() if not r['engine_error']]
    assert 0 < len(failed) < 6 and (s['items'], s['engine_errors'], s['ran']) == (6, len(failed), 6 - len(failed))
    assert s['engine_error_rate'] == pytest.approx(len(failed) / 6)
    assert s['pass_at_1'] == pytest.approx(sum(r['correct'] for r in ran) / len(ran))
    assert all(_records(tmp_path)[k]['correct'] is None for k in failed)
    assert rep['meta']['engine_usage']['prompt_tokens'] == len(ran) * USAGE['prompt_tokens']
    assert f"Engine error rate {100 * len(failed) / 6:.1f}%" in (tmp_path / 'report.md').read_text()
    broken['on'] = False
    asked = len(double.bodies)
    config.rollout.update(timeout_s=900.0, retries=2, max_concurrency=3)   # not result-deciding
    rep = runner.evaluate(config, tmp_path, env=env)
    redone = [json.dumps(b['messages'][1]) for b in double.bodies[asked:]]
    assert len(redone) == len(failed) and not any(_records(tmp_path)[k]['engine_error'] for k in failed)
    assert rep['runs']['direct']['benchmarks']['fvqa']['engine_errors'] == 0
    double.models[0]['owned_by'] = 'lab-b'   # another model behind the same URL and name
    with pytest.raises(results.SettingsMismatch, match=r'policy\.reports\.owned_by'):
      runner.Evaluator(config, tmp_path, env=env)


def test_the_cli_counts_a_killed_worker_and_a_failing_one_as_engine_errors_and_redoes_them(tmp_path, tokenizer):
  """`python -m osvl_jax.evaluate` over two SGLang-API workers: one killed after two answers, one answering 500s
  (no retries, so each request's outcome is its worker's). 6 items, 3 requests per worker: 2 ran, 4 engine errors;
  Pass@1 over the 2. A rerun with both healthy redoes exactly the 4."""
  from tests.rollout.sglang_double import SGLangDouble
  from osvl_jax import trajectory as tj
  processor = tj.ImageProcessor(min_pixels=1024, max_pixels=4096)
  killed, failing = (SGLangDouble(tokenizer, processor, [SCRIPT[1]]) for _ in range(2))
  killed.die_after, failing.status = 2, 500
  with killed.serve() as a, failing.serve() as b:
    config = served_config(engine='sglang', urls=f'{a},{b}', retries=0)
    config.update(modes=('direct',), max_items_per_benchmark=6)
    rep = _evaluate_cli(tmp_path, config, items=6)
  first = _records(tmp_path)
  failed = sorted(k for k, r in first.items() if r['engine_error'])
  s = rep['runs']['direct']['benchmarks']['fvqa']
  assert (s['items'], s['engine_errors'], s['ran'], len(failed)) == (6, 4, 2, 4)
  assert s['engine_error_rate'] == pytest.approx(4 / 6)
  assert s['pass_at_1'] == pytest.approx(sum(r['correct'] for r in first.values() if not r['engine_error']) / 2)
  settings = json.loads((tmp_path / 'eval_settings.json').read_text())
  assert settings['policy']['reports'] == {a: killed.model_info, b: failing.model_info}
  killed.die_after, failing.status = None, 200
  sent = len(killed.bodies) + len(failing.bodies)
  with killed.serve(port=int(a.rsplit(':', 1)[1])), failing.serve(port=int(b.rsplit(':', 1)[1])):
    rep = _evaluate_cli(tmp_path, config, items=6)
  assert len(killed.bodies) + len(failing.bodies) - sent == 4
  again = _records(tmp_path)
  assert sorted(k for k in again if again[k]['engine_error'] is None) == sorted(again) and len(again) == 6
  assert {k: again[k] for k in first if k not in failed} == {k: first[k] for k in first if k not in failed}
  assert rep['runs']['direct']['benchmarks']['fvqa']['engine_errors'] == 0
