"""tpu_scripts/: the gcloud command sequence of `launch.sh` (dry run, and a run against a fake gcloud), shellcheck.

No test here reaches Google Cloud: a fake `gcloud` stands first on PATH and records every call.
"""

import os
import pathlib
import shlex
import shutil
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
SCRIPTS = sorted((REPO / 'tpu_scripts').glob('*.sh'))
LAUNCH = REPO / 'tpu_scripts' / 'launch.sh'

FAKE_GCLOUD = """#!/usr/bin/env bash
# Records its arguments; a TPU / queued resource is absent until created; a queued resource is ACTIVE at once.
printf '%s\\n' "$*" >> "$FAKE_GCLOUD_LOG"
case "$*" in
  *"describe"*"--format=value(state.state)"*) echo ACTIVE ;;
  *"describe"*) exit 1 ;;
esac
"""


@pytest.fixture
def fake_gcloud(tmp_path):
  """PATH with a recording `gcloud` first; returns the log path (empty when gcloud was never called)."""
  bin_dir = tmp_path / 'bin'
  bin_dir.mkdir()
  (bin_dir / 'gcloud').write_text(FAKE_GCLOUD)
  (bin_dir / 'gcloud').chmod(0o755)
  log = tmp_path / 'gcloud.log'
  log.touch()
  env = {**os.environ, 'PATH': f'{bin_dir}:{os.environ["PATH"]}', 'FAKE_GCLOUD_LOG': str(log),
         'OSVL_TARBALL': str(tmp_path / 'src.tar.gz')}
  env.pop('GCLOUD', None)
  return env, log


def launch(env, *args, check=True) -> subprocess.CompletedProcess:
  res = subprocess.run(['bash', str(LAUNCH), *args], env=env, capture_output=True, text=True, timeout=60)
  if check:
    assert res.returncode == 0, res.stderr
  return res


TPU = ['--name=osvl-8b', '--zone=us-east5-a', '--project=my-proj', '--accelerator_type=v5p-64']


@pytest.mark.parametrize('entry, config', [
    ('osvl_jax.train.sft', 'configs/demo.py'), ('osvl_jax.train.grpo', 'configs/demo.py'),
    ('osvl_jax.train.sft', 'configs/qwen3vl_paper.py:sft_8b'),
    ('osvl_jax.train.grpo', 'configs/qwen3vl_paper.py:grpo_32b'),
    ('osvl_jax.train.sft', 'configs/qwen3vl_paper.py:sft_30b_a3b')])
def test_dry_run_prints_create_copy_setup_and_start_on_every_worker(fake_gcloud, entry, config):
  env, log = fake_gcloud
  out = launch(env, '--dry_run', *TPU, f'--entry={entry}', f'--config={config}', '--workdir=gs://bkt/run',
               '--', '--config.sft.lr=1e-5', '--config.data.dir=/data/my set').stdout
  lines = [shlex.split(line) for line in out.splitlines()]
  scope = ['--zone=us-east5-a', '--project=my-proj']
  assert lines[0] == ['gcloud', 'compute', 'tpus', 'tpu-vm', 'describe', 'osvl-8b', *scope]
  assert lines[1] == ['gcloud', 'compute', 'tpus', 'tpu-vm', 'create', 'osvl-8b', *scope,
                      '--accelerator-type=v5p-64', '--version=tpu-ubuntu2204-base']
  tarball = env['OSVL_TARBALL']
  assert lines[2][:4] == ['tar', '-czf', tarball, '-C'] and '--exclude=./.venv' in lines[2]
  assert lines[3] == ['gcloud', 'compute', 'tpus', 'tpu-vm', 'scp', tarball, f'osvl-8b:{tarball}', *scope,
                      '--worker=all']
  assert lines[4][:8] == ['gcloud', 'compute', 'tpus', 'tpu-vm', 'ssh', 'osvl-8b', *scope]
  assert lines[4][8] == '--worker=all' and 'bash ~/osvl_jax/tpu_scripts/setup.sh' in lines[4][9]
  assert lines[5][:9] == ['gcloud', 'compute', 'tpus', 'tpu-vm', 'ssh', 'osvl-8b', *scope, '--worker=all']
  assert len(lines) == 6
  remote = lines[5][9].removeprefix('--command=')
  assert remote.startswith('cd ~/osvl_jax && (setsid nohup env ') and remote.endswith('> run.pid)')
  job = shlex.split(remote[remote.index('env '):remote.index(' > run.log')])
  assert job == ['env', 'OSVL_DISTRIBUTED=auto', 'PYTHONUNBUFFERED=1', '.venv/bin/python', '-m', entry,
                 f'--config={config}', '--workdir=gs://bkt/run', '--config.sft.lr=1e-5',
                 '--config.data.dir=/data/my set']
  assert log.read_text() == ''  # a dry run never calls gcloud


def test_dry_run_with_a_queued_resource_requests_it_then_waits_for_active(fake_gcloud):
  env, log = fake_gcloud
  out = launch(env, '--dry_run', '--queued_resource', '--spot', '--name=q', '--zone=z', '--skip_setup',
               '--config=configs/demo.py', '--workdir=gs://b/r').stdout
  lines = [shlex.split(line) for line in out.splitlines()]
  assert lines[0] == ['gcloud', 'compute', 'tpus', 'queued-resources', 'describe', 'q', '--zone=z']
  assert lines[1] == ['gcloud', 'compute', 'tpus', 'queued-resources', 'create', 'q', '--node-id=q', '--zone=z',
                      '--accelerator-type=v5p-8', '--runtime-version=tpu-ubuntu2204-base', '--spot']
  assert lines[2] == ['gcloud', 'compute', 'tpus', 'queued-resources', 'describe', 'q', '--zone=z',
                      '--format=value(state.state)']
  assert 'setup.sh' not in lines[5][-1]
  assert log.read_text() == ''


def test_logs_stop_and_delete_commands(fake_gcloud):
  env, _ = fake_gcloud
  logs = shlex.split(launch(env, 'logs', '--dry_run', '--name=t', '--zone=z', '--worker=all').stdout)
  assert logs == ['gcloud', 'compute', 'tpus', 'tpu-vm', 'ssh', 't', '--zone=z', '--worker=all',
                  '--command=tail -n +1 -F ~/osvl_jax/run.log']
  stop = shlex.split(launch(env, 'stop', '--dry_run', '--name=t', '--zone=z').stdout)
  assert stop[:8] == ['gcloud', 'compute', 'tpus', 'tpu-vm', 'ssh', 't', '--zone=z', '--worker=all']
  assert 'kill -TERM -- -$(cat run.pid)' in stop[8]
  delete = shlex.split(launch(env, 'delete', '--dry_run', '--queued_resource', '--name=t', '--zone=z').stdout)
  assert delete == ['gcloud', 'compute', 'tpus', 'queued-resources', 'delete', 't', '--zone=z', '--force',
                    '--quiet']


def test_a_real_run_calls_gcloud_in_that_order_and_ships_the_working_tree(fake_gcloud):
  env, log = fake_gcloud
  launch(env, '--queued_resource', '--name=q', '--zone=z', '--config=configs/demo.py', '--workdir=gs://b/r')
  calls = [line.split()[:4] for line in log.read_text().splitlines()]
  assert calls == [['compute', 'tpus', 'queued-resources', 'describe'], ['compute', 'tpus', 'queued-resources',
                   'create'], ['compute', 'tpus', 'queued-resources', 'describe'],
                   ['compute', 'tpus', 'tpu-vm', 'scp'], ['compute', 'tpus', 'tpu-vm', 'ssh'],
                   ['compute', 'tpus', 'tpu-vm', 'ssh']]
  listing = subprocess.run(['tar', '-tzf', env['OSVL_TARBALL']], capture_output=True, text=True, check=True).stdout
  names = set(listing.split())
  assert './osvl_jax/distributed.py' in names and './tpu_scripts/setup.sh' in names
  assert not any(n.startswith(('./.venv/', './.git/')) for n in names)


@pytest.mark.parametrize('args, message', [
    (['--zone=z', '--config=c', '--workdir=w'], '--name is required'),
    (['--name=t', '--config=c', '--workdir=w'], '--zone is required'),
    (['--name=t', '--zone=z', '--workdir=w'], '--config is required'),
    (['--name=t', '--zone=z', '--config=c', '--workdir=w', '--best_effort'], '--best_effort needs'),
    (['--name=t', '--zone=z', '--config=c', '--workdir=w', '--lr=1'], "unknown argument '--lr=1'"),
])
def test_missing_or_unknown_flags_are_refused_before_any_command(fake_gcloud, args, message):
  env, log = fake_gcloud
  res = launch(env, '--dry_run', *args, check=False)
  assert res.returncode == 2 and message in res.stderr and res.stdout == ''
  assert log.read_text() == ''


@pytest.mark.skipif(shutil.which('shellcheck') is None,
                    reason='shellcheck is not installed (apt-get install -y shellcheck)')
@pytest.mark.parametrize('script', SCRIPTS, ids=lambda p: p.name)
def test_shellcheck_passes(script):
  res = subprocess.run(['shellcheck', str(script)], capture_output=True, text=True)
  assert res.returncode == 0, res.stdout
