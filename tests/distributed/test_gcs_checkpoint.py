"""Checkpoints and `export_hf` on a `gs://` workdir, against a local fake GCS server.

The server is `gcp-storage-emulator` (a test double of Google Cloud Storage's JSON API, the API both tensorstore's
`gcs` driver and gcsfs speak) on 127.0.0.1. The job runs in a subprocess pointed at it the documented ways:
`TENSORSTORE_GCS_HTTP_URL` (tensorstore, which writes the arrays) and `STORAGE_EMULATOR_HOST` (gcsfs, which
etils.epath uses for orbax's directory operations). The test then reads the bucket over the same HTTP API: the
objects sit under the URL's own path (`run/sft_ckpt/<step>/...`), so the URL reached storage unchanged, and no
local folder named `gs:` appears.
"""

import json
import os
import pathlib
import socket
import subprocess
import sys

import httpx
import pytest

gcs_server = pytest.importorskip('gcp_storage_emulator.server')
from gcp_storage_emulator.handlers import objects as gcs_objects  # pylint: disable=g-import-not-at-top

REPO = pathlib.Path(__file__).resolve().parents[2]


def _download_with_generation(original):
  """The emulator's media download plus the `x-goog-generation` / `x-goog-metageneration` headers that GCS sends
  with every object download (documented in GCS's request/response header reference); tensorstore's conditional
  reads (OCDBT manifests) need them and the emulator leaves them out."""

  def download(request, response, storage, *args, **kwargs):
    original(request, response, storage, *args, **kwargs)
    try:
      obj = storage.get_file_obj(request.params['bucket_name'], request.params['object_id'])
    except Exception:  # pylint: disable=broad-except  (a 404 reply: no object, no generation)
      return
    response['x-goog-generation'] = str(obj['generation'])
    response['x-goog-metageneration'] = str(obj.get('metageneration', '1'))

  return download


@pytest.fixture
def fake_gcs(monkeypatch):
  # objects.get (`?alt=media`) calls the module's `download`; the raw download routes hold the function itself.
  original = gcs_objects.download
  patched = _download_with_generation(original)
  monkeypatch.setattr(gcs_objects, 'download', patched)
  monkeypatch.setattr(gcs_server, 'HANDLERS', tuple(
      (regex, {method: (patched if handler is original else handler) for method, handler in handlers.items()})
      for regex, handlers in gcs_server.HANDLERS))
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    port = s.getsockname()[1]
  server = gcs_server.create_server('127.0.0.1', port, in_memory=True, default_bucket='bkt')
  server.start()
  try:
    yield f'http://127.0.0.1:{port}'
  finally:
    server.stop()


def _objects(url: str, prefix: str) -> list[str]:
  reply = httpx.get(f'{url}/storage/v1/b/bkt/o', params={'prefix': prefix}, timeout=30)
  reply.raise_for_status()
  return sorted(item['name'] for item in reply.json().get('items', []))


def test_checkpoints_and_export_on_a_gs_workdir(fake_gcs, tmp_path):
  env = dict(os.environ, STORAGE_EMULATOR_HOST=fake_gcs, TENSORSTORE_GCS_HTTP_URL=fake_gcs,
             GOOGLE_AUTH_TOKEN_FOR_TESTING='test-token',  # tensorstore: a fixed token instead of ADC lookup
             GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT='false',  # gcsfs: no gRPC bucket-layout probe (the fake has none)
             XLA_FLAGS='--xla_force_host_platform_device_count=4', JAX_PLATFORMS='cpu')
  out = tmp_path / 'hf'
  proc = subprocess.run([sys.executable, str(REPO / 'tests/distributed/gcs_job.py'), 'gs://bkt/run', str(out)],
                        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads(proc.stdout.strip().splitlines()[-1])

  assert result['restored_step'] == 2 and result['steps_kept'] == [2]      # async saves, keep-N = 1
  assert result['params_equal'] and result['restored_embed_shards'] == 4    # restored onto a 4-device mesh
  assert result['export']['path'] == 'gs://bkt/run/sft_ckpt' and result['export']['step'] == 2
  assert result['exported_embed_equal'] and (out / 'config.json').is_file()

  names = _objects(fake_gcs, 'run/')
  assert names and all(n.startswith('run/sft_ckpt/2/') for n in names), names[:5]
  assert any('/params/' in n for n in names) and any('/opt/' in n for n in names)
  assert not (tmp_path / 'gs:').exists()
