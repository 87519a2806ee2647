"""Access control of the server (`serve.auth`): the API key (401 without it, /health open, as SGLang), the client
and the real `sglang-router` sending it, and `--weights_root` (paths outside it, missing paths and escaping
symlinks refused with one message; non-local schemes never contacted outside an allowed root)."""

import os

import httpx
import pytest

from osvl_jax import checkpoints
from osvl_jax.rollout import weight_publish
from osvl_jax.rollout.embedded import jax_sampler
from osvl_jax.rollout.remote import sglang_client as sc
from osvl_jax.rollout.remote import sglang_protocol as protocol
from osvl_jax.serve import auth
from osvl_jax.serve import service as service_lib
from tests.serve.conftest import (BUCKET, MAX_LEN, NEW, healthy, router_process, serve_in_thread, serve_process,
                                  wait_until)

KEY = 'test-key-3f9a'
GEN = {'input_ids': [100, 200, 300], 'sampling_params': {'max_new_tokens': 2, 'temperature': 0}}


@pytest.fixture(scope='module')
def folders(tmp_path_factory, tiny_model):
  """root/ok: an exported tiny folder; outside/w: one outside the root; symlinks and `..` paths escaping it."""
  base = tmp_path_factory.mktemp('weights')
  root, outside = base / 'root', base / 'outside'
  ok = weight_publish.export_version(tiny_model, root, 1, 32 * 32, 64 * 64, dtype='float32')
  out = weight_publish.export_version(tiny_model, outside, 1, 32 * 32, 64 * 64, dtype='float32')
  os.symlink(out, root / 'escape')                       # a folder link leaving the root
  shard = root / 'shard_link'
  shard.mkdir()
  for f in out.iterdir():                                # a folder inside whose files link outside
    os.symlink(f, shard / f.name)
  return {'root': root, 'ok': ok, 'outside': out, 'escape': root / 'escape', 'shard_link': shard,
          'dotdot': root / '..' / 'outside' / out.name, 'missing': root / 'v99999999'}


@pytest.fixture(scope='module')
def secured(tiny_model, tokenizer, processor, folders):
  """(url, service, loaded paths): a server with KEY and weights_roots = [root, gs://allowed/policies]."""
  loaded = []

  def loader(path):
    loaded.append(path)
    if path.startswith('gs://'):
      raise FileNotFoundError(path)   # the test never reaches a bucket: it records that one would be read
    return checkpoints.load_policy(path)[0]
  sampler = jax_sampler.JaxSampler(tiny_model, tokenizer, image_processor=processor, max_new_tokens=NEW,
                                   temperature=0.0, max_len=MAX_LEN, bucket=BUCKET)
  svc = service_lib.SamplerService(sampler, tokenizer, processor, model_path='tiny', weight_version='0',
                                   default_max_new_tokens=NEW, loader=loader,
                                   weights_roots=auth.WeightsRoots([str(folders['root']), 'gs://allowed/policies']))
  with serve_in_thread(svc, api_key=KEY) as url:
    yield url, svc, loaded
  svc.close()


def test_requests_need_the_key_but_health(secured):
  url, _, _ = secured
  for headers in ({}, {'Authorization': 'Bearer wrong'}, {'Authorization': KEY}):
    r = httpx.post(url + '/generate', json=GEN, headers=headers, timeout=60)
    assert (r.status_code, r.json()) == (401, {'error': 'Unauthorized'})
    for path in ('/model_info', '/server_info', '/v1/models', '/flush_cache'):
      assert httpx.get(url + path, headers=headers, timeout=10).status_code == 401
    r = httpx.post(url + '/update_weights_from_disk', json={'model_path': 'x'}, headers=headers, timeout=10)
    assert r.status_code == 401
  bearer = {'Authorization': f'Bearer {KEY}'}
  r = httpx.post(url + '/generate', json=GEN, headers=bearer, timeout=60)
  assert r.status_code == 200 and len(r.json()['output_ids']) == 2
  assert httpx.get(url + '/model_info', headers=bearer, timeout=10).status_code == 200
  assert httpx.get(url + '/health', timeout=10).status_code == 200          # open, as SGLang
  assert httpx.get(url + '/health_generate', timeout=10).status_code == 200


def test_the_client_sends_the_key_from_its_argument_or_the_environment(secured, tokenizer, monkeypatch):
  url, _, _ = secured
  context = ([100, 200, 300], [])
  monkeypatch.delenv('OSVL_API_KEY', raising=False)
  monkeypatch.delenv('SGLANG_API_KEY', raising=False)
  with pytest.raises(protocol.EngineError) as e:
    sc.SGLangEngine(url, tokenizer, max_new_tokens=2, temperature=0.0, retries=0).generate([context])
  assert e.value.status == 401 and KEY not in str(e.value)
  (gen,) = sc.SGLangEngine(url, tokenizer, max_new_tokens=2, temperature=0.0, api_key=KEY).generate([context])
  assert len(gen.ids) == 2
  for name in ('SGLANG_API_KEY', 'OSVL_API_KEY'):   # OSVL_API_KEY wins over SGLANG_API_KEY
    monkeypatch.setenv(name, KEY)
    engine = sc.SGLangEngine(url, tokenizer, max_new_tokens=2, temperature=0.0)
    assert engine.model_info()['weight_version'] == '0' and len(engine.generate([context])[0].ids) == 2
    monkeypatch.setenv(name, 'wrong')
  monkeypatch.setenv('SGLANG_API_KEY', KEY)
  with pytest.raises(protocol.EngineError, match='401'):
    sc.SGLangEngine(url, tokenizer, retries=0).model_info()


def _update(url, path):
  r = httpx.post(url + '/update_weights_from_disk', json={'model_path': str(path)},
                 headers={'Authorization': f'Bearer {KEY}'}, timeout=120)
  return r.status_code, r.json()


def test_weights_outside_the_root_are_refused_like_missing_ones(secured, folders):
  url, svc, loaded = secured
  refusals = {}
  for name in ('outside', 'escape', 'shard_link', 'dotdot', 'missing'):
    status, out = _update(url, folders[name])
    assert status == 400 and out['success'] is False, name
    refusals[name] = out['message'].replace(str(folders[name]), '<path>')
  assert set(refusals.values()) == {"model_path '<path>' is not a weights folder under the allowed --weights_root"}
  for url_path in ('gs://other/policies/v1', 'gs://allowed/policies/../secrets', 's3://allowed/policies/v1',
                   'http://127.0.0.1:1/policies'):
    status, out = _update(url, url_path)
    assert status == 400 and 'not a weights folder under the allowed --weights_root' in out['message']
  assert loaded == [] and svc.weight_version == '0'      # nothing was read, nothing changed
  status, out = _update(url, 'gs://allowed/policies/./v1')    # under the allowed bucket root: handed to the loader
  assert loaded == ['gs://allowed/policies/v1'] and out['success'] is False
  status, out = _update(url, folders['ok'])
  assert (status, out['success']) == (200, True) and loaded[-1] == str(folders['ok'].resolve())


def test_roots_must_exist(tmp_path):
  with pytest.raises(ValueError, match='is not an existing folder'):
    auth.WeightsRoots([str(tmp_path / 'nope')])
  assert auth.WeightsRoots().resolve('/anything') == '/anything'   # no root: any path (SGLang)


def test_served_process_and_router_forward_the_key(tmp_path, tokenizer, folders):
  """`osvl_jax.serve --api_key --weights_root` behind `sglang_router.launch_router --api-key`."""
  with serve_process(tmp_path / 'w.log', f'--api_key={KEY}', f'--weights_root={folders["root"]}') as (w, proc):
    wait_until(lambda: healthy(w), 120, 'worker', proc, tmp_path / 'w.log')
    with router_process(tmp_path / 'router.log', '--policy', 'round_robin', '--worker-urls', w,
                        '--api-key', KEY) as (url, router):
      bearer = {'Authorization': f'Bearer {KEY}'}
      wait_until(lambda: any(x.get('is_healthy') for x in httpx.get(url + '/workers', headers=bearer, timeout=2)
                             .json().get('workers', [])), 60, 'router', router, tmp_path / 'router.log')
      assert httpx.post(url + '/generate', json=GEN, timeout=60).status_code == 401
      engine = sc.SGLangEngine(url, tokenizer, max_new_tokens=2, temperature=0.0, api_key=KEY, admin_urls=[w])
      assert len(engine.generate([([100, 200, 300], [])])[0].ids) == 2
      with pytest.raises(protocol.EngineError, match='not a weights folder under the allowed --weights_root'):
        engine.update_weights_from_disk(str(folders['outside']), weight_version='7')
      assert engine.update_weights_from_disk(str(folders['ok']), weight_version='7')[0]['success']
      assert engine.generate([([100, 200, 300], [])])[0].weight_version == '7'
