"""Every config field the GRPO trainer reads exists in the demo and paper configs (so `--config.grpo.X=...` can set
it), found by parsing the trainer's source; and the checks of what lies outside the config (init checkpoint,
rollout servers) fail before anything is written, naming the field."""

import ast
import dataclasses
import http.server
import pathlib
import socket
import sys
import threading

import pytest
from flax import nnx

from osvl_jax import checkpoints
from osvl_jax.models.qwen3_vl import model as model_lib
from osvl_jax.models.qwen3_vl.config import Qwen3VLConfig
from osvl_jax.rollout import agent_loop
from osvl_jax.train import grpo, preflight

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / 'configs'))
import demo as demo_config  # noqa: E402
import qwen3vl_paper  # noqa: E402

TRAINER = ('osvl_jax/train/grpo.py', 'osvl_jax/train/grpo_update.py', 'osvl_jax/train/rollouts.py',
           'osvl_jax/train/policy.py', 'osvl_jax/train/preflight.py', 'osvl_jax/rollout/factory.py',
           'osvl_jax/train/validation.py')
ALIASES = {'cfg': 'grpo', 'r': 'rollout', 'grpo': 'grpo', 'section': 'rollout'}   # local names of config sections
# Fields of the rollout factory a training run never reads: the 'openai' engine's (refused for RL), and the
# sampling defaults (the trainer passes grpo.temperature / grpo.top_p).
NOT_FOR_TRAINING = {'rollout.base_url', 'rollout.model', 'rollout.api_key_env', 'rollout.temperature',
                    'rollout.top_p'}
SECTIONS = ('grpo', 'rollout', 'model', 'image')
METHODS = {'get', 'get_ref', 'to_dict', 'lock', 'unlock'}


def _section(node) -> str | None:
  if isinstance(node, ast.Name) and node.id in ALIASES:
    return ALIASES[node.id]
  if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == 'config':
    return node.attr
  return None


def trainer_reads() -> set[str]:
  """'section.field' for every `config.S.f`, `config.S.get('f')`, alias (`cfg.f`, `r.get('f')`), checked path
  ('grpo.steps'), `url_list(config, 'f')` and every `agent_loop.Limits` field of `Limits.from_config(r)` in the
  trainer's modules."""
  out = set()
  for name in TRAINER:
    for node in ast.walk(ast.parse((REPO / name).read_text())):
      if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == 'get' and \
          node.args and isinstance(node.args[0], ast.Constant) and _section(node.func.value):
        out.add(f'{_section(node.func.value)}.{node.args[0].value}')
      elif isinstance(node, ast.Attribute) and node.attr not in METHODS and _section(node.value):
        out.add(f'{_section(node.value)}.{node.attr}')
      elif isinstance(node, ast.Call) and getattr(node.func, 'attr', '') == 'from_config' and \
          ast.unparse(node.func.value).endswith('Limits') and node.args and _section(node.args[0]):
        out.update(f'{_section(node.args[0])}.{f.name}' for f in dataclasses.fields(agent_loop.Limits))
      elif isinstance(node, ast.Call) and getattr(node.func, 'id', getattr(node.func, 'attr', '')) == 'url_list' \
          and isinstance(node.args[1], ast.Constant):
        out.add(f'rollout.{node.args[1].value}')
      elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.count('.') == 1 and \
          node.value.split('.')[0] in SECTIONS and node.value.split('.')[1].isidentifier():
        out.add(node.value)
  return {r for r in out if r.split('.')[0] in SECTIONS} - NOT_FOR_TRAINING


CONFIGS = {'demo': demo_config.get_config, **{f'grpo_{size}': (lambda s=size: qwen3vl_paper.get_config(f'grpo_{s}'))
                                             for size in ('8b', '32b', '30b_a3b')}}


def test_the_parser_finds_the_fields_the_trainer_reads():
  reads = trainer_reads()   # the neighbours of the fault: read with .get, through an alias, as a checked path
  assert {'grpo.weight_decay', 'grpo.warmup_steps', 'grpo.grad_clip', 'grpo.init_from', 'grpo.steps',
          'rollout.urls', 'rollout.admin_urls', 'rollout.weights_keep', 'rollout.max_seconds', 'model.hf_path',
          'image.min_pixels'} <= reads
  assert len(reads) > 40


@pytest.mark.parametrize('name', sorted(CONFIGS))
def test_every_field_the_grpo_trainer_reads_is_in_the_config(name):
  config = CONFIGS[name]()
  missing = sorted(r for r in trainer_reads() if r.split('.')[1] not in config[r.split('.')[0]])
  assert missing == []


def parse_flags(monkeypatch, *overrides: str):
  """configs/demo.py with `--config.X=...` overrides, parsed as the trainers' absl mains parse them."""
  from absl import flags
  from ml_collections import config_flags
  fv = flags.FlagValues()
  config_flags.DEFINE_config_file('config', str(REPO / 'configs' / 'demo.py'), flag_values=fv)
  argv = ['prog', f'--config={REPO / "configs" / "demo.py"}', *overrides]
  monkeypatch.setattr(sys, 'argv', argv)   # config_flags reads the overrides from sys.argv
  fv(argv)
  return fv.config


def test_weight_decay_is_set_from_the_command_line(monkeypatch):
  config = parse_flags(monkeypatch, '--config.grpo.weight_decay=0.05', '--config.grpo.warmup_steps=2')
  assert config.grpo.weight_decay == 0.05 and config.grpo.warmup_steps == 2
  grpo.check_config(config)


def test_fewer_sft_steps_scale_the_default_warmup_and_an_explicit_one_names_the_fix(monkeypatch):
  from osvl_jax.train import sft
  assert parse_flags(monkeypatch).sft.warmup_steps == 28            # the demo's 28 of 650
  config = parse_flags(monkeypatch, '--config.sft.steps=5')
  assert config.sft.warmup_steps == 0
  sft.check_config(config)
  config = parse_flags(monkeypatch, '--config.sft.steps=100')
  assert config.sft.warmup_steps == 4
  config = parse_flags(monkeypatch, '--config.sft.steps=5', '--config.sft.warmup_steps=20')
  with pytest.raises(ValueError, match=r'sft.warmup_steps=20 must be < sft.steps=5.*--config.sft.warmup_steps to '
                                       r'at most 4'):
    sft.check_config(config)
  config = parse_flags(monkeypatch, '--config.grpo.warmup_steps=10')   # the GRPO neighbour (steps 10)
  with pytest.raises(ValueError, match='grpo.warmup_steps=10 must be < grpo.steps=10.*at most 9'):
    grpo.check_config(config)


def _tiny_sft(workdir):
  checkpoints.save(checkpoints.manager(workdir, 'sft_ckpt'), 1, model_lib.Qwen3VLModel(Qwen3VLConfig.tiny(),
                                                                                     nnx.Rngs(0)), None, {})


def test_a_missing_init_from_fails_at_once_naming_the_field_and_writes_nothing(tmp_path):
  c = demo_config.get_config()
  c.model.vocab = 'full'   # the tests' datasets list no vocab_ids.json
  c.grpo.init_from = str(tmp_path / 'no_such_sft_run')
  work = tmp_path / 'grpo'
  with pytest.raises(FileNotFoundError, match='grpo.init_from=.*no_such_sft_run'):
    grpo.train(c, work)
  assert not work.exists() and not (tmp_path / 'no_such_sft_run').exists()   # no empty grpo_ckpt/, no folder
  c.grpo.init_from = ''
  work.mkdir()
  with pytest.raises(FileNotFoundError, match='no SFT checkpoint'):   # neither init_from nor hf_path
    grpo.train(c, work)
  assert list(work.iterdir()) == []


def test_the_init_checkpoint_is_found_in_init_from_the_workdir_or_a_resume(tmp_path):
  c = demo_config.get_config()
  c.model.vocab = 'full'   # the tests' datasets list no vocab_ids.json
  _tiny_sft(tmp_path / 'sft_run')
  c.grpo.init_from = str(tmp_path / 'sft_run')
  assert preflight.check_init_checkpoint(c, tmp_path / 'grpo') == 'sft'
  assert not (tmp_path / 'grpo').exists()
  c.grpo.init_from = ''
  assert preflight.check_init_checkpoint(c, tmp_path / 'sft_run') == 'sft'
  c.model.hf_path = str(tmp_path / 'no_hf')
  with pytest.raises(FileNotFoundError, match='model.hf_path=.*no_hf'):
    preflight.check_init_checkpoint(c, tmp_path / 'empty')
  assert preflight.checkpoint_steps(tmp_path / 'sft_run', 'sft_ckpt') == [1]
  assert preflight.checkpoint_steps(tmp_path / 'sft_run', 'grpo_ckpt') == []
  assert not (tmp_path / 'sft_run' / 'grpo_ckpt').exists()


class _Health(http.server.BaseHTTPRequestHandler):
  status = 200

  def do_GET(self):  # noqa: N802
    self.send_response(self.status if self.path == '/health' else 404)
    self.end_headers()

  def log_message(self, *args):
    pass


@pytest.fixture
def health_server():
  """A real HTTP server on 127.0.0.1 whose /health answers `_Health.status`; yields a setter and its URL."""
  class Handler(_Health):
    pass
  server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
  thread = threading.Thread(target=server.serve_forever, daemon=True)
  thread.start()
  yield Handler, f'http://127.0.0.1:{server.server_address[1]}'
  server.shutdown()
  server.server_close()


def _closed_port_url() -> str:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return f'http://127.0.0.1:{s.getsockname()[1]}'   # closed once the block ends: connection refused


def test_unreachable_rollout_servers_fail_at_once_naming_the_field_and_write_nothing(tmp_path, health_server):
  handler, url = health_server
  c = demo_config.get_config()
  c.model.vocab = 'full'   # the tests' datasets list no vocab_ids.json
  c.rollout.engine, c.rollout.urls = 'sglang', [url]
  assert preflight.check_servers(c) == [url]                    # the neighbour: a server that answers
  dead = _closed_port_url()
  c.rollout.urls = [url, dead]
  with pytest.raises(ConnectionError, match=f'rollout.urls: {dead} did not answer /health'):
    preflight.check_servers(c)
  c.rollout.urls, c.rollout.admin_urls = [url], [dead]
  with pytest.raises(ConnectionError, match=f'rollout.admin_urls: {dead}'):
    preflight.check_servers(c)
  handler.status = 503
  c.rollout.admin_urls = None
  with pytest.raises(ConnectionError, match='HTTP 503'):
    preflight.check_servers(c)
  _tiny_sft(tmp_path)                                           # the checkpoint is there: only the server fails
  before = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob('*'))
  c.rollout.urls = [dead]
  with pytest.raises(ConnectionError, match='rollout.urls'):
    grpo.train(c, tmp_path)
  assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob('*')) == before  # no metrics, tb/, weights
