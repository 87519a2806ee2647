"""The memory plan of GRPO's rollout phase (`osvl_jax/plan/rollout_phase.py`, issue 49): the embedded sampler's
weights in the rollout layout, its KV cache at the config's rollout batch and context, and whether the trainer and
the sampler fit a chip together; `--compile`'s decode step against the estimate.

Run with 8 simulated devices: XLA_FLAGS=--xla_force_host_platform_device_count=8 (the compile test needs them).
"""

import pathlib
import re
import subprocess
import sys

import jax
import pytest

from osvl_jax import plan
from osvl_jax.models.qwen3_vl import text as text_lib
from osvl_jax.plan import compile_check, rollout_phase
from osvl_jax.plan.estimate import live_loss_positions
from osvl_jax.rollout.embedded import layout
from osvl_jax.train import policy
from tests.train.test_plan import ONE_DEVICE, load

ROLLOUT_LINE = re.compile(r'rollout_gb_per_chip=(\d+\.\d{3}) kv_gb_per_chip=(\d+\.\d{3}) '
                          r'peak_gb_per_chip=(\d+\.\d{3}) fits=(true|false)')
TRAINING_LINE = re.compile(r'params_gb_per_chip=.* fits=(true|false)')


def kv_heavy_config(dtype: str = 'bfloat16'):
  """The 8B GRPO config with a small model whose KV cache outweighs its weights: the tiny model (width 64, the real
  vocabulary) with 8 layers and 8 KV heads of 16, computing (and caching) in `dtype`."""
  config = load('grpo_8b')
  config.model.hf_config = ''
  config.model.hf_path = ''
  config.model.name = 'tiny'
  config.model.dtype = dtype
  config.model.text = {'num_hidden_layers': 8, 'num_attention_heads': 8, 'num_key_value_heads': 8}
  return config


def _training(config):
  p, _ = plan.estimate(config, dict(ONE_DEVICE, fsdp=8), seq_len=256, global_rows=8)
  return p


def test_rollout_shapes_are_the_trainers():
  """grpo_8b: 256 prompts x G 8 = 2,048 episodes, 512 at once (rollout.max_concurrency, a power of two already);
  the sampler's max_len 74,096 + 4,096 = 78,192 rounded up to its bucket of 128; without a prefix cache a turn
  prefills its whole context, 74,096 tokens on the ladder (steps of 512)."""
  config = load('grpo_8b')
  s = rollout_phase.rollout_shapes(config)
  assert (s.episodes, s.rows, s.cache_len, s.prefill_len, s.cache_dtype.name, s.pool_slots) == (
      2048, 512, 78_208, 74_240, 'bfloat16', 0)
  config.rollout.max_concurrency = 300          # padded as a generate's batch: the next power of two
  config.rollout.prefix_cache_slots = 4         # a turn prefills what follows its cached prefix: the prompt budget
  s = rollout_phase.rollout_shapes(config)
  assert (s.rows, s.prefill_len, s.pool_slots) == (512, 4096, 4)
  config.rollout.max_concurrency = 0            # unlimited: every episode at once
  assert rollout_phase.rollout_shapes(config).rows == 2048


@pytest.mark.parametrize('tensor, replicas', [(2, 4), (8, 1), (1, 8)])
def test_kv_bytes_per_chip_are_the_hand_product(tensor, replicas):
  """k, v [L, B, Hkv, C, D] split over (data, tensor) and the bool mask [B, C] over data: per chip
  2·L·(B/R)·(Hkv/T)·C·D·c + (B/R)·C, the cache `init_cache` makes divided by its shards."""
  config = kv_heavy_config()
  arch = plan.architecture(config)
  t = arch.text
  shapes = rollout_phase.Shapes(episodes=30, running=30, rows=30, cache_len=1024, prefill_len=256,
                                cache_dtype=jax.numpy.dtype('bfloat16'), pool_slots=3, max_len=1000)
  p = rollout_phase.estimate(config, _training(config), {'tensor': tensor, 'data': replicas}, 'v5p', shapes, arch)
  rows = -(-30 // replicas) * replicas                 # padded to a multiple of the replicas
  b = rows // replicas
  assert (p.rows, p.rows_per_replica) == (rows, b)
  assert p.kv == 2 * 8 * b * (8 // tensor) * 1024 * 16 * 2 + b * 1024
  cache = jax.eval_shape(lambda: text_lib.init_cache(t, rows, 1024, jax.numpy.bfloat16))
  assert p.kv == layout.kv_bytes(cache) // (tensor * replicas) + b * 1024
  assert p.pool == 2 * 8 * 3 * (8 // tensor) * 1024 * 16 * 2          # slots whole on every replica
  training = _training(config)
  assert p.rollout == training.params + training.optimizer + p.sampler
  assert p.reshard_phase == training.params + training.optimizer + 2 * p.weights + p.pool


# Qwen3-VL-8B's KV bytes per token in bfloat16: 36 layers x 8 KV heads x 128 x 2 (k, v) x 2 bytes.
PER_TOKEN_8B = 36 * 8 * 128 * 2 * 2


def _kv_gb_8b(rows: int, tensor: int, replicas: int, cache_len: int = 78_208) -> float:
  """Per-chip KV (and mask) GB of `rows` rows of `cache_len` slots, by hand."""
  b = rows // replicas
  return round((b * cache_len * PER_TOKEN_8B // tensor + b * cache_len) / 1e9, 3)


def test_grpo_8b_prints_rollout_bytes_per_chip_and_fits():
  """`plan --config=configs/qwen3vl_paper.py:grpo_8b` as the file stands: the rollout section ends the output, its
  KV per chip the hand product for the layout it names (512 rows x 78,208 slots)."""
  assert PER_TOKEN_8B == 147_456
  out = plan.run(load('grpo_8b')).splitlines()
  assert TRAINING_LINE.fullmatch(next(line for line in out if line.startswith('params_gb_per_chip=')))
  named = re.match(r'rollout layout: (?:tensor=(\d+) data=(\d+)|one device)', next(
      line for line in out if line.startswith('rollout layout: ')))
  tensor, replicas = (int(named.group(1)), int(named.group(2))) if named.group(1) else (1, 1)
  match = ROLLOUT_LINE.fullmatch(out[-1])
  assert float(match.group(2)) == _kv_gb_8b(512, tensor, replicas)
  assert float(match.group(1)) > float(match.group(2)) and float(match.group(3)) >= float(match.group(1))
  assert match.group(4) == 'false'   # no layout of 32 v5p chips holds 512 rows of 78k (module docstrings)


@pytest.mark.parametrize('mesh', [{}, {'tensor': 0}])
def test_grpo_8b_without_a_rollout_layout_holds_the_whole_cache_on_one_chip(mesh):
  """No rollout layout (rollout.mesh empty, or tensor 0): the sampler of today, one device, holds the whole batch's
  KV cache on device 0: 5.9 TB."""
  config = load('grpo_8b')
  config.rollout.mesh = mesh
  out = plan.run(config).splitlines()
  assert any(line.startswith('rollout layout: one device (no rollout layout); none (rollout.mesh unset or tensor 0)')
             for line in out)
  match = ROLLOUT_LINE.fullmatch(out[-1])
  assert float(match.group(2)) == _kv_gb_8b(512, 1, 1) and match.group(4) == 'false'


def test_grpo_8b_on_tensor_4_splits_weights_and_cache():
  """rollout.mesh.tensor = 4, replicas over the other 8 of the 32 chips: the float32 weights split over 4, the
  cache over all 32 chips."""
  config = load('grpo_8b')
  config.rollout.mesh = {'tensor': 4, 'data': -1}
  out = plan.run(config).splitlines()
  match = ROLLOUT_LINE.fullmatch(out[-1])
  assert float(match.group(2)) == _kv_gb_8b(512, 4, 8)
  assert any(line.startswith('rollout layout: tensor=4 data=8; rollout.mesh') for line in out)
  weights = float(next(line for line in out if line.startswith("rollout weights")).split()[-1])
  _, table = plan.estimate(config, dict(ONE_DEVICE, fsdp=8, tensor=4), seq_len=16, global_rows=8)
  total = sum(whole for whole, _, _ in table.values())       # float32 parameters: ~35 GB, split over tensor
  assert abs(weights * 1e9 - total / 4) <= 0.01 * total / 4


def test_rows_that_fit_fit_and_one_replica_more_does_not():
  """With a prefix cache (a turn prefills what follows its cached prefix, not its whole 74k context, whose dense
  attention over the cache no chip holds) some rows fit a tensor=4 x 8 layout beside the trainer: the rollout phase
  of that many rows fits, one row per replica more does not."""
  config = load('grpo_8b')
  config.rollout.prefix_cache_slots = 4
  config.rollout.mesh = {'tensor': 4}
  training, _ = plan.estimate(config, dict(ONE_DEVICE, fsdp=8, tensor=4), seq_len=74_096, global_rows=8)
  p = rollout_phase.estimate(config, training, {'tensor': 4, 'data': 8}, 'v5p')
  n = p.rows_that_fit()
  assert n % 8 == 0 and 0 < n < 512
  s = rollout_phase.rollout_shapes(config)
  at = lambda rows: rollout_phase.estimate(config, training, {'tensor': 4, 'data': 8}, 'v5p',
                                           rollout_phase.Shapes(**{**s.__dict__, 'rows': rows}))
  assert at(n).fits and not at(n + 8).fits


def test_a_tensor_degree_the_kv_heads_refuse_is_refused_naming_the_field():
  config = load('grpo_8b')
  with pytest.raises(ValueError, match=r'rollout\.mesh\.tensor=16 does not divide .*num_key_value_heads=8'):
    rollout_phase.estimate(config, _training(config), {'tensor': 16, 'data': 2}, 'v5p')
  assert rollout_phase.tensor_choices(plan.architecture(config), 32) == [1, 2, 4, 8]


def test_loss_logits_are_the_live_chunk():
  """The trainers project `policy.LOSS_CHUNK` loss positions per batch shard at a time: a row's K positions in
  balanced chunks of k = ceil(K / ceil(K / (C // rows))) (`policy.chunked_token_logprobs`)."""
  assert compile_check.LOSS_CHUNK == policy.LOSS_CHUNK == 512
  live = live_loss_positions
  assert live(1, 4096, 512) == 512 and live(2, 4096, 512) == 256 and live(1, 300, 512) == 300
  assert live(1, 1000, 512) == 500 and live(3, 1000, 512) == 167   # 2 chunks of 500; 6 of 167 (170 per row)
  assert live(1, 4096, 0) == 4096


@pytest.mark.skipif(len(jax.devices()) < 8, reason='needs XLA_FLAGS=--xla_force_host_platform_device_count=8')
@pytest.mark.parametrize('tensor', [2, 8])
def test_compiled_decode_step_is_near_the_estimate(tensor):
  """One decode step of the real `JaxSampler` on the local rollout layout (8 simulated devices), 32 rows x 4,096
  cache slots of the KV-heavy model: XLA's per-device total within 25% of weights + kv + decode temporaries, the
  KV cache donated (aliased) and held as a shard per device. In float32: XLA's CPU backend writes a bfloat16 cache
  through whole-cache float32 copies (`compile_check`'s docstring), which a TPU's does not need."""
  config = kv_heavy_config('float32')
  xla, _, p = plan.compile_rollout(config, tensor, 32, 4096, _training(config), 'v5p')
  assert (p.tensor, p.replicas, p.rows) == (tensor, 8 // tensor, 32)
  assert p.kv > p.weights + p.decode                  # the comparison is about the cache
  assert xla['alias'] >= p.kv - p.rows_per_replica * 4096 - 1024
  ratio = xla['total'] / (p.weights + p.kv + p.decode)
  assert 0.75 <= ratio <= 1.25, (xla, p)
  text = compile_check.rollout_report(xla, p)
  assert text.splitlines()[-1].endswith(f'ratio={ratio:.3f}')


def test_auto_tensor_without_a_fitting_degree_plans_the_largest():
  """rollout.mesh.tensor = -1 (auto): 512 rows of 78k tokens of 8B KV (5.9 TB) fit no layout of 32 v5p chips, so
  the plan lays out the largest degree the KV heads allow, 8, and says so (the run refuses it, naming the field)."""
  config = load('grpo_8b')
  config.rollout.mesh = {'tensor': -1}
  out = plan.run(config).splitlines()
  assert any(line.startswith('rollout layout: tensor=8 data=4; ') for line in out), out
  assert ROLLOUT_LINE.fullmatch(out[-1]).group(4) == 'false'


@pytest.mark.skipif(len(jax.devices()) < 8, reason='needs XLA_FLAGS=--xla_force_host_platform_device_count=8')
def test_compile_prints_the_rollout_steps_beside_their_estimates_before_the_rollout_line():
  """`plan.run(..., compile_tokens)` on a GRPO config: the SFT step's check inside the training section, the
  prefill's and the decode step's on the local rollout layout (the configured tensor degree) inside the rollout
  section, whose line ends the output."""
  config = kv_heavy_config('float32')
  config.tpu = 'v5p-8'
  config.rollout.mesh = {'tensor': 2}
  out = plan.run(config, compile_tokens=256).splitlines()
  assert ROLLOUT_LINE.fullmatch(out[-1])
  decode = next(i for i, line in enumerate(out) if line.startswith('decode_xla_total_gb='))
  assert out.index(next(line for line in out if line.startswith('rollout: '))) < decode < len(out) - 1
  assert any(line.startswith('compiled rollout steps on the rollout layout tensor=2 data=4') for line in out)
  ratio = float(out[decode].split('ratio=')[1])
  assert 0.75 <= ratio <= 1.25
  assert out[decode - 1].startswith('prefill_xla_total_gb=')   # 128 prompt tokens per row
  assert any(line.startswith('xla_total_gb=') for line in out[:decode])   # the SFT step's check


def test_the_command_line_prints_the_rollout_section_for_grpo_8b():
  out = subprocess.run([sys.executable, '-m', 'osvl_jax.plan', '--config=configs/qwen3vl_paper.py:grpo_8b',
                        '--config.rollout.mesh.tensor=4'], capture_output=True, text=True, check=True, timeout=300,
                       cwd=pathlib.Path(__file__).resolve().parents[2]).stdout.splitlines()
  assert out[0].startswith('config: stage=grpo tpu=v5p-64')
  assert 'rollout layout: tensor=4 data=8; rollout.mesh' in out
  match = ROLLOUT_LINE.fullmatch(out[-1])
  assert float(match.group(2)) == _kv_gb_8b(512, 4, 8) and match.group(4) == 'false'


@pytest.mark.skipif(len(jax.devices()) < 8, reason='needs XLA_FLAGS=--xla_force_host_platform_device_count=8')
@pytest.mark.parametrize('tensor, rows, prompt', [(2, 16, 512), (2, 16, 1024), (8, 8, 1024)])
def test_compiled_prefill_is_near_the_estimate(tensor, rows, prompt):
  """The sampler's prefill of `prompt` tokens per row into a 2,048-slot cache, compiled on the local rollout layout:
  XLA's per-device total within 25% of weights + kv + prefill temporaries, which the dense attention over the
  cache dominates (scores [rows, heads, P, C]): the term that decides the paper configs' fits=false."""
  config = kv_heavy_config('float32')
  _, prefill, p = plan.compile_rollout(config, tensor, rows, 2048, _training(config), 'v5p', prefill_len=prompt)
  assert p.prefill > p.kv + p.weights
  ratio = prefill['total'] / (p.weights + p.kv + p.prefill)
  assert 0.75 <= ratio <= 1.25, (prefill, p)
