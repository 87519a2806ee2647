"""The server's access checks and request bodies at their exact boundaries: a key that is a prefix (or an
extension) of the real one, an empty --api_key, a weights root that is a prefix of another folder's name, symlinks
two levels deep leaving the root, JSON nested deeper than the limit, lone surrogates in any string field, and a
weight_version that is not valid text."""

import json
import os

import fastapi
import httpx
import pytest
from fastapi.testclient import TestClient

from osvl_jax.rollout.embedded import jax_sampler
from osvl_jax.serve import auth, request_fields
from osvl_jax.serve import service as service_lib
from tests.serve.conftest import BUCKET, MAX_LEN, NEW, serve_in_thread

KEY = 'test-key-3f9a'


def _client(api_key):
  app = fastapi.FastAPI()
  auth.add_api_key_middleware(app, api_key)

  @app.get('/model_info')
  def model_info():
    return {'ok': True}
  return TestClient(app)


@pytest.mark.parametrize('header', [f'Bearer {KEY[:-1]}', f'Bearer {KEY[:1]}', 'Bearer ', 'Bearer', f'Bearer {KEY}x',
                                    f'Bearer  {KEY}', f'bearer {KEY}', KEY, f'Basic {KEY}', ''])
def test_a_prefix_or_extension_of_the_key_is_refused(header):
  client = _client(KEY)
  r = client.get('/model_info', headers={'Authorization': header} if header else {})
  assert (r.status_code, r.json()) == (401, {'error': 'Unauthorized'})
  assert not auth.authorized('GET', '/model_info', header, KEY)
  assert client.get('/model_info', headers={'Authorization': f'Bearer {KEY}'}).status_code == 200


@pytest.mark.parametrize('key', ['', ' ', '\t'])
def test_an_empty_api_key_is_refused_not_served_without_a_key(key):
  with pytest.raises(ValueError, match='--api_key is empty'):
    auth.add_api_key_middleware(fastapi.FastAPI(), key)
  auth.add_api_key_middleware(fastapi.FastAPI(), None)   # no key given: open, as SGLang


def test_a_root_is_not_a_prefix_of_another_folders_name(tmp_path):
  for name in ('weights', 'weights-old/v1', 'weights2/v1', 'weights/v1'):
    (tmp_path / name).mkdir(parents=True)
  for root in (tmp_path / 'weights', f'{tmp_path}/weights/'):
    roots = auth.WeightsRoots([str(root)])
    for sibling in ('weights-old/v1', 'weights2/v1', 'weights-old'):
      with pytest.raises(auth.WeightsPathRefused):
        roots.resolve(str(tmp_path / sibling))
    assert roots.resolve(str(tmp_path / 'weights/v1')) == str(tmp_path / 'weights/v1')
  roots = auth.WeightsRoots(['gs://bucket/weights'])
  for sibling in ('gs://bucket/weights-old/v1', 'gs://bucket/weights2', 'gs://bucket-old/weights/v1'):
    with pytest.raises(auth.WeightsPathRefused):
      roots.resolve(sibling)
  assert roots.resolve('gs://bucket/weights/v1') == 'gs://bucket/weights/v1'


def test_symlinks_two_levels_deep_cannot_leave_the_root(tmp_path):
  """root/ckpt/step -> root/inner (inside the root), root/inner/shard -> outside/secret: refused; and a link
  cycle inside the root ends the walk."""
  root, outside = tmp_path / 'root', tmp_path / 'outside'
  (root / 'ckpt').mkdir(parents=True)
  (root / 'inner').mkdir()
  outside.mkdir()
  (outside / 'secret').write_text('x')
  (root / 'ckpt' / 'config.json').write_text('{}')
  os.symlink(root / 'inner', root / 'ckpt' / 'step')
  os.symlink(outside / 'secret', root / 'inner' / 'shard')
  roots = auth.WeightsRoots([str(root)])
  with pytest.raises(auth.WeightsPathRefused):
    roots.resolve(str(root / 'ckpt'))
  os.remove(root / 'inner' / 'shard')
  os.symlink(root / 'ckpt', root / 'inner' / 'loop')   # a cycle, all inside the root: allowed, and it terminates
  assert roots.resolve(str(root / 'ckpt')) == str(root / 'ckpt')


@pytest.fixture(scope='module')
def served(tiny_model, tokenizer, processor):
  """(url, service, loaded paths): the tiny model; updates load the served model itself."""
  loaded = []
  sampler = jax_sampler.JaxSampler(tiny_model, tokenizer, image_processor=processor, max_new_tokens=NEW,
                                   temperature=0.0, max_len=MAX_LEN, bucket=BUCKET)
  svc = service_lib.SamplerService(sampler, tokenizer, processor, model_path='tiny', weight_version='0',
                                   default_max_new_tokens=NEW, loader=lambda path: loaded.append(path) or tiny_model)
  with serve_in_thread(svc) as url:
    yield url, svc, loaded
  svc.close()


GEN = {'input_ids': [100, 200, 300], 'sampling_params': {'max_new_tokens': 2, 'temperature': 0}}
CHAT = {'messages': [{'role': 'user', 'content': 'hi'}], 'max_tokens': 2}


def _nested(depth, leaf='1'):
  return '[' * depth + leaf + ']' * depth


@pytest.mark.parametrize('path,raw,field', [
    ('/generate', '{"input_ids": [100], "sampling_params": {"stop": %s}}' % _nested(40, '"a"'),
     'sampling_params.stop' + '[0]' * 30),
    ('/generate', '{"input_ids": [100], "rid": %s}' % _nested(100000), 'rid' + '[0]' * 31),   # past json's limit
    ('/generate', '{"input_ids": [100], "log_metrics": {"a": %s}}' % _nested(5000), 'log_metrics.a' + '[0]' * 30),
    ('/v1/chat/completions', '{"messages": [{"role": "user", "content": %s}]}' % _nested(900),
     'messages[0].content' + '[0]' * 29),
    ('/update_weights_from_disk', '{"model_path": "x", "weight_version": %s}' % _nested(3000),
     'weight_version' + '[0]' * 31),
    ('/generate', '{"input_ids": [100], "rid": "\\ud800"}', 'rid is not valid Unicode text'),
    ('/generate', '{"input_ids": [100], "sampling_params": {"stop": ["ok", "\\udfff"]}}',
     'sampling_params.stop[1] is not valid Unicode text'),
    ('/generate', '{"input_ids": [100], "\\ud800": null}', 'a key of the body is not valid Unicode text'),
    ('/v1/chat/completions', '{"messages": [{"role": "user", "content": "hi"}], "user": "\\ud800"}',
     'user is not valid Unicode text'),
    ('/update_weights_from_disk', '{"model_path": "\\ud800x"}', 'model_path is not valid Unicode text'),
    ('/update_weights_from_disk', '{"model_path": "x", "weight_version": "v\\udc00"}',
     'weight_version is not valid Unicode text'),
])
def test_deep_nesting_and_lone_surrogates_are_400s_naming_the_field(served, path, raw, field):
  url, svc, loaded = served
  r = httpx.post(url + path, content=raw.encode(), headers={'Content-Type': 'application/json'}, timeout=60)
  assert r.status_code == 400, r.text
  assert r.json()['error']['message'].startswith(field), r.json()
  assert loaded == [] and svc.weight_version == '0'
  assert httpx.post(url + '/generate', json=GEN, timeout=60).status_code == 200   # still serving


@pytest.mark.parametrize('version', ['', 'a\nb', '\x00', 'v' * 257, True, 1.5, [1], {'v': 1}, None])
def test_a_weight_version_that_is_not_text_is_refused_and_every_endpoint_keeps_answering(served, version):
  url, svc, loaded = served
  body = {'model_path': 'tiny', 'weight_version': version}
  r = httpx.post(url + '/update_weights_from_disk', json=body, timeout=60)
  if version is None:   # none given: the integer version + 1
    assert r.json()['success'] is True and svc.weight_version == '1'
    svc.weight_version = '0'
    loaded.clear()
    return
  assert (r.status_code, r.json()['success']) == (400, False), r.json()
  assert r.json()['message'].startswith('weight_version must be an integer or a non-empty printable string')
  assert loaded == [] and svc.weight_version == '0'
  for get in ('/model_info', '/server_info', '/v1/models'):
    assert httpx.get(url + get, timeout=10).status_code == 200
  assert httpx.post(url + '/generate', json=GEN, timeout=60).json()['meta_info']['weight_version'] == '0'
  assert httpx.post(url + '/v1/chat/completions', json=CHAT, timeout=60).status_code == 200


def test_an_integer_weight_version_is_its_text(served):
  url, svc, loaded = served
  r = httpx.post(url + '/update_weights_from_disk', json={'model_path': 'tiny', 'weight_version': 7}, timeout=60)
  assert r.json()['success'] is True and svc.weight_version == '7' and loaded == ['tiny']
  assert httpx.post(url + '/generate', json=GEN, timeout=60).json()['meta_info']['weight_version'] == '7'
  svc.weight_version = '0'
  loaded.clear()


def test_the_initial_weight_version_is_checked(tiny_model, tokenizer, processor):
  sampler = jax_sampler.JaxSampler(tiny_model, tokenizer, max_len=MAX_LEN, bucket=BUCKET)
  with pytest.raises(ValueError, match='--weight_version must be an integer or a non-empty printable string'):
    service_lib.SamplerService(sampler, tokenizer, processor, weight_version='v\udc80')


def test_deep_field_names_the_field_past_the_limit():
  assert request_fields.deep_field('{"a": [1, {"b,]": 2, "c": [[[]]]}]}', 4) == 'a[1].c[0]'
  assert request_fields.deep_field('[[1], [[2]]]', 2) == '[1][0]'
  assert request_fields.deep_field('{"a": [[1]]}', 3) == 'the body'
