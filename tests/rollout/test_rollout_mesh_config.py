"""`rollout.mesh` as config (issue 49): the fields every config with a rollout section declares, set on the command
line; tensor 0 = no layout, -1 = auto (`layout.auto_tensor`: the smallest tensor-parallel degree whose replica holds
the weights and its share of the KV budget), T explicit; data -1 = the remaining devices. Pure sizing arithmetic and
the config checks: no devices beyond the first are needed (tests/rollout/test_sharded_sampler.py builds the meshes
on 8)."""

import pathlib
import subprocess
import sys
import types

import jax
import ml_collections
import pytest

from osvl_jax.rollout import factory
from osvl_jax.rollout.embedded import layout

REPO = pathlib.Path(__file__).resolve().parents[2]
GiB = 2 ** 30


def _parse(monkeypatch, name: str, *overrides: str):
  """--config=configs/<name> with `--config.X=...` overrides, parsed (and locked) as the mains parse them."""
  from absl import flags
  from ml_collections import config_flags
  fv = flags.FlagValues()
  path = str(REPO / 'configs' / name)
  config_flags.DEFINE_config_file('config', path, flag_values=fv, lock_config=True)
  argv = ['prog', f'--config={path}', *overrides]
  monkeypatch.setattr(sys, 'argv', argv)   # config_flags reads the overrides from sys.argv
  fv(argv)
  return fv.config


CONFIGS = {'demo.py': 0, 'lookup.py': 0, 'eval.py': 0, 'eval_paper.py': -1, 'qwen3vl_paper.py:grpo_8b': -1,
           'qwen3vl_paper.py:sft_32b': -1}   # file -> its default rollout.mesh.tensor


@pytest.mark.parametrize('name', sorted(CONFIGS))
def test_every_rollout_section_declares_the_mesh_and_the_command_line_sets_it(monkeypatch, name):
  default = _parse(monkeypatch, name)
  assert default.rollout.mesh.to_dict() == {'tensor': CONFIGS[name], 'data': -1}
  factory.check_engine_config(default.rollout)
  config = _parse(monkeypatch, name, '--config.rollout.mesh.tensor=2', '--config.rollout.mesh.data=-1')
  assert config.rollout.mesh.to_dict() == {'tensor': 2, 'data': -1}
  factory.check_engine_config(config.rollout)
  config = _parse(monkeypatch, name, '--config.rollout.mesh.data=4')
  if CONFIGS[name] == 0:   # data without a layout is a mistake, named
    with pytest.raises(ValueError, match=r'rollout\.mesh\.data=4 with rollout\.mesh\.tensor=0 \(no rollout layout\)'):
      factory.check_engine_config(config.rollout)
  else:
    factory.check_engine_config(config.rollout)


def test_show_config_prints_the_mesh_set_on_the_command_line():
  out = subprocess.run([sys.executable, '-m', 'osvl_jax.show_config', f'--config={REPO / "configs" / "demo.py"}',
                        '--config.rollout.mesh.tensor=2', '--config.rollout.mesh.data=-1'],
                       cwd=REPO, capture_output=True, text=True, timeout=120, check=True).stdout
  mesh = out[out.index('  mesh:'):].splitlines()[1:3]
  assert sorted(line.strip() for line in mesh) == ['data: -1', 'tensor: 2']


@pytest.mark.parametrize('mesh, message', [
    ({'tensor': -2}, r'rollout\.mesh\.tensor=-2: expected an int >= 1, or 0 \(no rollout layout\) or -1 \(auto\)'),
    ({'tensor': 2, 'data': 0}, r'rollout\.mesh\.data=0: expected an int >= 1, or -1'),
    ({'tensor': 1.5}, r'rollout\.mesh\.tensor=1\.5'),
    ({'tensor': 0, 'data': 2}, r'rollout\.mesh\.data=2 with rollout\.mesh\.tensor=0'),
    ({'tensor': 2, 'fsdp': 2}, r'rollout\.mesh\.fsdp: unknown field')])
def test_bad_mesh_fields_are_refused_naming_the_field(mesh, message):
  section = ml_collections.ConfigDict({'max_new_tokens': 4, 'max_total_tokens': 64, 'mesh': mesh})
  with pytest.raises(ValueError, match=message):
    factory.check_engine_config(section)


def test_tensor_zero_is_no_layout_and_auto_asks_for_its_size():
  one = jax.devices()[:1]
  assert layout.mesh_from_config({'tensor': 0, 'data': -1}, one) is None
  assert layout.mesh_from_config(ml_collections.ConfigDict(), one) is None
  with pytest.raises(ValueError, match=r'rollout\.mesh\.data=3 with rollout\.mesh\.tensor=0'):
    layout.mesh_from_config({'tensor': 0, 'data': 3}, one)
  with pytest.raises(ValueError, match=r'rollout\.mesh\.tensor=-1 \(auto\) is sized from the model'):
    layout.mesh_from_config({'tensor': -1, 'data': -1}, one)
  asked = []
  mesh = layout.mesh_from_config({'tensor': -1, 'data': 1}, one, auto=lambda n, r: asked.append((n, r)) or 1)
  assert asked == [(1, 1)] and dict(mesh.shape) == {'data': 1, 'fsdp': 1, 'tensor': 1, 'expert': 1}
  layout.mesh_from_config({'tensor': -1, 'data': -1}, one, auto=lambda n, r: asked.append((n, r)) or 1)
  assert asked[-1] == (1, -1)


def test_kv_bytes_per_token_of_the_8b():
  text = types.SimpleNamespace(num_hidden_layers=36, num_key_value_heads=8, head_dim=128)
  assert layout.kv_bytes_per_token(text, 'bfloat16') == 147_456     # the issue's ~147 KB per token
  assert layout.kv_bytes_per_token(text, 'float32') == 2 * 147_456


def test_bytes_per_device_split_the_replicas_rows_and_shared_slots_t_ways():
  # 8 rows over 3 replicas: 3 rows each (rounded up), + 2 shared slots = 5 rows of 1 GiB, with 10 GiB of weights.
  assert layout.rollout_bytes_per_device(10 * GiB, GiB, 8, tensor=2, replicas=3, shared_rows=2) == 7.5 * GiB
  assert layout.rollout_bytes_per_device(10 * GiB, GiB, 8, tensor=1, replicas=8) == 11 * GiB


def test_auto_tensor_is_the_smallest_degree_whose_replica_fits():
  kw = dict(weight_bytes=10 * GiB, kv_bytes_per_row=GiB, rows=8, num_devices=8, num_kv_heads=8)
  # T=1: 10 + 1 row = 11 GiB per device; T=2: (10 + 2) / 2 = 6; T=4: (10 + 4) / 4 = 3.5.
  assert layout.auto_tensor(device_bytes=16 * GiB, **kw) == 1          # 11 <= 14.4
  assert layout.auto_tensor(device_bytes=8 * GiB, **kw) == 2           # 11 > 7.2, 6 <= 7.2
  assert layout.auto_tensor(device_bytes=6 * GiB, **kw) == 4           # 6 > 5.4, 3.5 <= 5.4
  assert layout.auto_tensor(device_bytes=int(6.6 * GiB), fraction=1.0, **kw) == 2   # the fraction is the bound
  # Explicit replicas: 2 of them hold 4 rows each whatever T is: T=2: (10 + 4) / 2 = 7 > 5.4; T=4: 3.5.
  assert layout.auto_tensor(device_bytes=6 * GiB, replicas=2, **kw) == 4
  # Shared rows (prefix-cache slots) sit on every replica: T=2 with 4 more: (10 + 2 + 4) / 2 = 8 > 7.2; T=4: 4.5.
  assert layout.auto_tensor(device_bytes=8 * GiB, shared_rows=4, **kw) == 4


def test_auto_tensor_keeps_to_divisors_of_the_devices_and_kv_heads_and_names_the_field_when_none_fits():
  kw = dict(weight_bytes=30 * GiB, kv_bytes_per_row=GiB, rows=8, device_bytes=8 * GiB, num_devices=8)
  assert layout.auto_tensor(num_kv_heads=8, **kw) == 8                 # (30 + 8) / 8 = 4.75 <= 7.2
  with pytest.raises(ValueError, match=r'rollout\.mesh\.tensor=-1 \(auto\): no tensor-parallel degree dividing the '
                                       r'8 devices and the 4 KV heads .* at tensor=4 a device would hold 8\.50 GiB'):
    layout.auto_tensor(num_kv_heads=4, **kw)                           # T=8 would fit, but splits no 4 heads
  # Any common divisor, not only powers of two: 6 devices, 6 heads: T=2 (30 + 3) / 2 = 16.5 > 12.6, T=3 34 / 3 fits.
  assert layout.auto_tensor(num_kv_heads=6, **{**kw, 'num_devices': 6, 'device_bytes': 14 * GiB}) == 3
  with pytest.raises(ValueError, match=r'no tensor size with data=16 fits the 8 devices'):
    layout.auto_tensor(num_kv_heads=8, replicas=16, **kw)
