"""tpu_scripts/sglang_server.sh: the commands of a dry run (setup, SGLang server, router) and refused flags.

No test here installs SGLang or needs a GPU; shellcheck runs on every script in test_launch.py.
"""

import itertools
import json
import os
import pathlib
import re
import shlex
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = REPO / 'tpu_scripts' / 'sglang_server.sh'
SCHEMA = json.loads((REPO / 'tests' / 'serve' / 'sglang_schema.json').read_text())


def server(*args, check=True) -> subprocess.CompletedProcess:
  env = {**os.environ, 'HOME': '/home/me'}
  env.pop('PYTHON', None)
  res = subprocess.run(['bash', str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60)
  if check:
    assert res.returncode == 0, res.stderr
  return res


def _lines(res):
  return [shlex.split(line) for line in res.stdout.splitlines()]


def test_dry_run_sets_up_its_own_venv_then_serves_the_folder():
  lines = _lines(server('--dry_run', '--model_path=/ckpt/my policy', '--tp_size=4', '--mem_fraction_static=0.7',
                        '--port=31000', '--weight_version=step-5', '--', '--context-length', '32768'))
  py = '/home/me/sglang_venv/bin/python'
  assert lines[0] == ['python3', '-m', 'venv', '/home/me/sglang_venv']
  assert lines[1] == [py, '-m', 'pip', 'install', '-q', '--upgrade', 'pip']
  assert lines[2] == [py, '-m', 'pip', 'install', '-q', f'sglang=={SCHEMA["sglang_version"]}', 'sglang-router==0.3.2']
  assert lines[3] == ['env', 'SGLANG_MM_AVOID_RETOKENIZE=1', 'SGLANG_RETURN_ORIGINAL_LOGPROB=0', py, '-m', 'sglang.launch_server',
                      '--model-path', '/ckpt/my policy', '--tp-size', '4', '--mem-fraction-static', '0.7',
                      '--host', '0.0.0.0', '--port', '31000', '--weight-version', 'step-5',
                      '--context-length', '32768']
  assert len(lines) == 4


def test_the_router_pins_match_setup_py():
  pins = dict(re.findall(r"'(sglang-router)==([0-9.]+)'", (REPO / 'setup.py').read_text()))
  assert pins == {'sglang-router': '0.3.2'}


def test_dry_run_with_a_router_lists_this_server_and_the_others():
  lines = _lines(server('--dry_run', '--skip_setup', '--model_path=/m', '--venv=/opt/sg', '--router_port=30100',
                        '--worker_urls=http://h2:30000,http://h3:30000'))
  assert lines[0][:6] == ['env', 'SGLANG_MM_AVOID_RETOKENIZE=1', 'SGLANG_RETURN_ORIGINAL_LOGPROB=0',
                          '/opt/sg/bin/python', '-m', 'sglang.launch_server']
  assert lines[0][6:] == ['--model-path', '/m', '--tp-size', '1', '--mem-fraction-static', '0.85', '--host',
                          '0.0.0.0', '--port', '30000']
  assert lines[1] == ['/opt/sg/bin/python', '-m', 'sglang_router.launch_router', '--host', '0.0.0.0', '--port',
                      '30100', '--policy', 'round_robin', '--worker-urls', 'http://127.0.0.1:30000',
                      'http://h2:30000', 'http://h3:30000']
  assert len(lines) == 2


@pytest.mark.parametrize('args, message', [
    ([], '--model_path is required'),
    (['--model_path=/m', '--tp_size=0'], '--tp_size must be a positive integer'),
    (['--model_path=/m', '--mem_fraction_static=1.5'], '--mem_fraction_static must be in (0, 1)'),
    (['--model_path=/m', '--worker_urls=http://a:1'], '--worker_urls needs --router_port'),
    (['--model_path=/m', '--tp=2'], "unknown argument '--tp=2'"),
])
def test_bad_flags_are_refused_before_any_command(args, message):
  res = server('--dry_run', *args, check=False)
  assert res.returncode == 2 and message in res.stderr and res.stdout == ''


def test_a_real_run_refuses_a_folder_without_config_json(tmp_path):
  res = server(f'--model_path={tmp_path}', '--skip_setup', check=False)
  assert res.returncode == 2 and 'has no config.json' in res.stderr


def _server_env(line):
  """The NAME=VALUE words between `env` and the python of a server command line."""
  assert line[0] == 'env'
  return dict(w.split('=', 1) for w in itertools.takewhile(lambda w: '=' in w and not w.startswith('/'), line[1:]))


@pytest.mark.parametrize('args', [(), ('--router_port=30100',)])
def test_every_server_command_keeps_multimodal_token_ids_exact(args):
  """SGLANG_MM_AVOID_RETOKENIZE (SGLang 0.5.23 srt/environ.py, an EnvBool read in
  BaseMultimodalProcessor.process_and_combine_mm_data) must be on: a pre-tokenized prompt with images is then kept
  verbatim, not decoded and re-tokenized."""
  (line,) = [l for l in _lines(server('--dry_run', '--skip_setup', '--model_path=/m', *args))
             if 'sglang.launch_server' in l]
  env = _server_env(line)
  assert env['SGLANG_MM_AVOID_RETOKENIZE'] == '1' and env['SGLANG_RETURN_ORIGINAL_LOGPROB'] == '0'
  # SGLang's EnvBool reads exactly these spellings as true.
  assert env['SGLANG_MM_AVOID_RETOKENIZE'].lower() in ('true', '1', 'yes', 'y')
  assert env['SGLANG_RETURN_ORIGINAL_LOGPROB'].lower() not in ('true', '1', 'yes', 'y')   # tempered log-probs


def test_help_prints_the_whole_header():
  res = server('--help')
  header = [l for l in SCRIPT.read_text().splitlines()[1:] if l.startswith('#')]
  header = header[:next(i for i, l in enumerate(header) if l.startswith('# --dry_run')) + 1]
  assert res.stdout.splitlines() == [re.sub(r'^# ?', '', l) for l in header]
  assert 'SGLANG_MM_AVOID_RETOKENIZE=1' in res.stdout
