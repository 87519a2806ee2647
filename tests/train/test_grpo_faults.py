"""GRPO's runtime faults stop the trainer with an error naming the input, before anything is written where possible
(osvl_jax/train/grpo.py, rollouts.py, preflight.py; osvl_jax/checkpoints): a rollout batch in which every
trajectory ended on an error (an engine answering out-of-vocabulary ids) is no step to take; servers that refuse
the trainer's API key stop it before a weight export; a damaged last checkpoint is refused naming its folder."""

import http.server
import pathlib
import re
import shutil
import sys
import threading

import ml_collections
import numpy as np
import pytest
from flax import nnx

from osvl_jax import checkpoints
from osvl_jax import trajectory as tj
from osvl_jax.models.qwen3_vl import sharding
from osvl_jax.rollout import api_key, factory
from osvl_jax.rollout import engine as engine_lib
from osvl_jax.serve import auth
from osvl_jax.train import grpo, metrics, policy, preflight
from tests.train import test_grpo_serve

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / 'configs'))
import demo as demo_config  # noqa: E402

LENGTH_BUCKETS = (64, 128, 256, 512, 1024)


def _config() -> ml_collections.ConfigDict:
  """The demo config on the tiny model, 1 prompt x G = 2 per step, the embedded engine."""
  c = demo_config.get_config()
  c.model.vocab = 'full'   # the tests' datasets list no vocab_ids.json
  c.model.text = ml_collections.ConfigDict()   # Qwen3VLConfig.tiny()
  c.image.min_pixels, c.image.max_pixels = 32 * 32, 64 * 64
  c.tools.enabled = ('text_search',)
  c.rollout.update(max_turns=2, max_new_tokens=8, max_total_tokens=480)
  c.grpo.update(steps=2, prompts_per_step=1, num_generations=2, ckpt_every=1)
  c.grpo.length_buckets, c.grpo.max_loss_tokens, c.grpo.loss_bucket = LENGTH_BUCKETS, 0, 16
  return c


@pytest.fixture
def workdir(tmp_path, monkeypatch):
  """An SFT checkpoint of the tiny model and two prompts with 64x64 images (`test_grpo_serve.make_workdir`)."""
  return test_grpo_serve.make_workdir(tmp_path, monkeypatch)


class _OutOfVocabulary(engine_lib.Engine):
  """An engine whose every turn holds an id past the model's vocabulary (a server serving another model)."""
  weight_updates = 'in_process'

  def set_model(self, model, weight_version=None):
    del model, weight_version

  def generate(self, contexts, max_new_tokens=None, stop=None, sampling=None):
    ids = [9707, tj.VOCAB_SIZE + 5, tj.IM_END_ID]
    return [engine_lib.Generation(np.asarray(ids), np.full(3, -0.5), '', engine_lib.FINISH_STOP) for _ in contexts]


def test_a_step_whose_every_trajectory_failed_stops_the_trainer_naming_the_cause(workdir, monkeypatch):
  monkeypatch.setattr(factory, 'make_engine', lambda *args, **kwargs: _OutOfVocabulary())
  with pytest.raises(RuntimeError, match=r'rollout: all 2 trajectories ended on an error before a policy token, '
                                         r'nothing to train on '
                                         r'\(the step is not taken\); first: engine _OutOfVocabulary failed at '
                                         r'step 0: ValueError: id 151941 at position 1 is outside the vocabulary'):
    grpo.train(_config(), workdir)
  assert metrics.read_metrics(workdir, 'grpo') == []           # no step recorded, no checkpoint
  assert not (workdir / 'grpo_ckpt').exists() or not any((workdir / 'grpo_ckpt').iterdir())


class _KeyedServer(http.server.BaseHTTPRequestHandler):
  """A server run with an API key (`auth.authorized`, as `osvl_jax.serve --api_key`): /health open, every
  other path 401 without `Authorization: Bearer <KEY>`."""

  def do_GET(self):  # noqa: N802
    if not auth.authorized('GET', self.path, self.headers.get('Authorization'), KEY):
      self.send_response(401)
    else:
      self.send_response(200 if self.path in ('/health', '/model_info') else 404)
    self.end_headers()
    self.wfile.write(b'{}')

  def log_message(self, *args):
    pass


KEY = 'sk-test-4f1d'


@pytest.fixture
def keyed_server():
  server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), _KeyedServer)
  threading.Thread(target=server.serve_forever, daemon=True).start()
  yield f'http://127.0.0.1:{server.server_address[1]}'
  server.shutdown()
  server.server_close()


def test_a_trainer_without_the_servers_key_stops_before_anything_is_written(keyed_server, workdir, monkeypatch):
  """/health is open on a keyed server, so the preflight also asks an authenticated endpoint (/model_info) with the
  key the engine will send: a missing or wrong key stops the trainer naming the URL and the variables (never the
  key), before a weight export."""
  c = _config()
  c.rollout.engine, c.rollout.urls = 'sglang', [keyed_server]
  for name in api_key.API_KEY_ENV:
    monkeypatch.delenv(name, raising=False)
  with pytest.raises(PermissionError, match=rf'rollout.urls: {keyed_server} answered /model_info with HTTP 401 '
                                            r'without an API key: set \$OSVL_API_KEY \(or \$SGLANG_API_KEY\)'):
    preflight.check_servers(c)
  before = sorted(p.relative_to(workdir).as_posix() for p in workdir.rglob('*'))
  with pytest.raises(PermissionError, match='rollout.urls'):
    grpo.train(c, workdir)
  assert sorted(p.relative_to(workdir).as_posix() for p in workdir.rglob('*')) == before   # no weights/, metrics
  monkeypatch.setenv('SGLANG_API_KEY', 'sk-wrong-key')
  with pytest.raises(PermissionError, match=r'HTTP 401 with the API key in \$SGLANG_API_KEY') as refused:
    preflight.check_servers(c)
  assert 'sk-wrong-key' not in str(refused.value)
  monkeypatch.setenv('OSVL_API_KEY', KEY)   # read first (api_key.api_key_from_env)
  assert preflight.check_servers(c) == [keyed_server]


def _damage(step_dir: pathlib.Path, how: str) -> None:
  if how == 'meta':                       # the JSON meta cut short
    (step_dir / 'meta' / 'metadata').write_text('{"stage": "gr')
  elif how == 'truncated':                # every array data file cut to 10 bytes
    for f in (step_dir / 'params').rglob('*'):
      if f.is_file() and f.parent.name == 'd':
        f.write_bytes(f.read_bytes()[:10])
  else:                                   # the params item deleted
    shutil.rmtree(step_dir / 'params')


@pytest.mark.parametrize('how', ['meta', 'truncated', 'deleted'])
def test_a_damaged_last_checkpoint_is_refused_naming_the_step_folder_and_the_previous_step(tmp_path, how):
  """A finished step folder that cannot be read stops the resume with an error naming that folder and the step kept
  before it (moving the folder aside resumes from there); no silent fallback, which would later write the same
  step again over the damaged one."""
  model = nnx.Linear(4, 3, rngs=nnx.Rngs(0))
  mngr = checkpoints.manager(tmp_path, 'grpo_ckpt')
  for step in (1, 2):
    checkpoints.save(mngr, step, model, None, {'stage': 'grpo'})
  _damage(tmp_path / 'grpo_ckpt' / '2', how)
  folder = re.escape(str(tmp_path / 'grpo_ckpt' / '2'))
  with pytest.raises(ValueError, match=rf'checkpoint {folder} cannot be read \(.+\); if it is damaged .* move it '
                                       r'aside to resume from step 1'):
    checkpoints.restore(checkpoints.manager(tmp_path, 'grpo_ckpt'), nnx.Linear(4, 3, rngs=nnx.Rngs(1)))
  restored = nnx.Linear(4, 3, rngs=nnx.Rngs(1))
  assert checkpoints.restore(checkpoints.manager(tmp_path, 'grpo_ckpt'), restored, step=1)['step'] == 1
  np.testing.assert_array_equal(np.asarray(restored.kernel.value), np.asarray(model.kernel.value))


def test_grpo_resume_from_a_damaged_last_step_names_it(workdir):
  c = _config()
  mesh = sharding.mesh_from_config(c.mesh)
  model, optimizer = policy.create(c, mesh, 'grpo')
  checkpoints.save(checkpoints.manager(workdir, 'grpo_ckpt'), 1, model, optimizer, {'stage': 'grpo'})
  _damage(workdir / 'grpo_ckpt' / '1', 'meta')
  folder = re.escape(str(workdir / 'grpo_ckpt' / '1'))
  with pytest.raises(ValueError, match=rf'checkpoint {folder} cannot be read \(JSONDecodeError: .+\); no earlier '
                                       r'step is kept'):
    grpo.train(c, workdir)
  assert metrics.read_metrics(workdir, 'grpo') == []
