"""The server's access checks and request bodies at their exact boundaries: a key that is a prefix (or an
extension) of the real one, an empty --api_key, a weights root that is a prefix of another folder's name, symlinks
two levels deep leaving the root, JSON nested deeper than the limit, lone surrogates in any string field, and a
weight_version that is not valid text."""

import json
import os

import fastapi
import pytest
from fastapi.testclient import TestClient

from osvl_jax.rollout import server_auth

KEY = 'test-key-3f9a'


def _client(api_key):
  app = fastapi.FastAPI()
  server_auth.add_api_key_middleware(app, api_key)

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
  assert not server_auth.authorized('GET', '/model_info', header, KEY)
  assert client.get('/model_info', headers={'Authorization': f'Bearer {KEY}'}).status_code == 200


@pytest.mark.parametrize('key', ['', ' ', '\t'])
def test_an_empty_api_key_is_refused_not_served_without_a_key(key):
  with pytest.raises(ValueError, match='--api_key is empty'):
    server_auth.add_api_key_middleware(fastapi.FastAPI(), key)
  server_auth.add_api_key_middleware(fastapi.FastAPI(), None)   # no key given: open, as SGLang


def test_a_root_is_not_a_prefix_of_another_folders_name(tmp_path):
  for name in ('weights', 'weights-old/v1', 'weights2/v1', 'weights/v1'):
    (tmp_path / name).mkdir(parents=True)
  for root in (tmp_path / 'weights', f'{tmp_path}/weights/'):
    roots = server_auth.WeightsRoots([str(root)])
    for sibling in ('weights-old/v1', 'weights2/v1', 'weights-old'):
      with pytest.raises(server_auth.WeightsPathRefused):
        roots.resolve(str(tmp_path / sibling))
    assert roots.resolve(str(tmp_path / 'weights/v1')) == str(tmp_path / 'weights/v1')
  roots = server_auth.WeightsRoots(['gs://bucket/weights'])
  for sibling in ('gs://bucket/weights-old/v1', 'gs://bucket/weights2', 'gs://bucket-old/weights/v1'):
    with pytest.raises(server_auth.WeightsPathRefused):
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
  roots = server_auth.WeightsRoots([str(root)])
  with pytest.raises(server_auth.WeightsPathRefused):
    roots.resolve(str(root / 'ckpt'))
  os.remove(root / 'inner' / 'shard')
  os.symlink(root / 'ckpt', root / 'inner' / 'loop')   # a cycle, all inside the root: allowed, and it terminates
  assert roots.resolve(str(root / 'ckpt')) == str(root / 'ckpt')
