"""The embedded sampler on a rollout mesh (issue 49): tensor-parallel weights within a replica, the batch and the KV
cache split over replicas and KV heads. On 8 simulated devices (XLA_FLAGS=--xla_force_host_platform_device_count=8;
skipped with fewer) greedy rollouts equal the unsharded sampler's id for id, images and prefix cache included,
log-probs within float tolerance; the KV cache is created and kept sharded, and the compiled decode step holds
1/shards of it per device."""

import dataclasses

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

from osvl_jax import trajectory as tj
from osvl_jax.models.qwen3_vl import model as model_lib
from osvl_jax.models.qwen3_vl import sharding
from osvl_jax.models.qwen3_vl.config import Qwen3VLConfig
from osvl_jax.rollout import engine as engine_lib
from osvl_jax.rollout import factory
from osvl_jax.rollout.embedded import decode_batch, jax_sampler, layout

NEW = 5             # ids per turn: small, the CPUs are shared.
KW = {'max_new_tokens': NEW, 'temperature': 0.0, 'max_len': 128, 'bucket': 32}

pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason='needs 8 (simulated) devices')


def _wide_kv_model():
  """`tiny()` with 8 query and 8 KV heads, so that tensor=8 splits the KV heads."""
  base = Qwen3VLConfig.tiny()
  text = dataclasses.replace(base.text, num_attention_heads=8, num_key_value_heads=8)
  return model_lib.Qwen3VLModel(dataclasses.replace(base, text=text), nnx.Rngs(1))


@pytest.fixture(scope='module')
def models(model):
  return {2: model, 8: _wide_kv_model()}   # tensor size -> a model whose KV heads it divides


@pytest.fixture(scope='module')
def image_ref():
  proc = tj.ImageProcessor(min_pixels=32 * 32, max_pixels=64 * 64)
  return proc.process(np.random.default_rng(1).integers(0, 256, (64, 64, 3), dtype=np.uint8))


def _text(seed: int, n: int) -> list:
  return np.random.default_rng(seed).integers(100, 150000, size=n).tolist()


def _first_turn(image_ref):
  span = [tj.VISION_START_ID] + [tj.IMAGE_PAD_ID] * image_ref.num_tokens + [tj.VISION_END_ID]
  return [(np.asarray(_text(0, 11), np.int32), []),
          (np.asarray(_text(2, 5) + span + _text(3, 4), np.int32), [image_ref]),
          (np.asarray(_text(5, 3), np.int32), [])]


def _two_turns(sampler, image_ref):
  """Generations of two batches; the second extends each first-turn row by its ids and new text (prefix reuse)."""
  first = _first_turn(image_ref)
  gens = sampler.generate(first)
  second = [(np.asarray(list(p) + g.ids.tolist() + _text(10 + i, 3), np.int32), ims)
            for i, ((p, ims), g) in enumerate(zip(first, gens))]
  gens2 = sampler.generate(second)
  return gens + gens2, list(sampler.cached_tokens)


@pytest.mark.parametrize('slots', [0, 8], ids=['no_prefix_cache', 'prefix_cache'])
@pytest.mark.parametrize('tensor', [2, 8], ids=['tensor2x4', 'tensor8'])
def test_sharded_greedy_equals_unsharded(models, tokenizer, image_ref, tensor, slots):
  model = models[tensor]
  mesh = layout.mesh_from_config({'tensor': tensor})
  assert dict(mesh.shape) == {'data': 8 // tensor, 'fsdp': 1, 'tensor': tensor, 'expert': 1}
  want, want_cached = _two_turns(jax_sampler.JaxSampler(model, tokenizer, prefix_cache_slots=slots, **KW), image_ref)
  sharded = jax_sampler.JaxSampler(model, tokenizer, prefix_cache_slots=slots, mesh=mesh, **KW)
  got, got_cached = _two_turns(sharded, image_ref)
  assert got_cached == want_cached
  if slots:
    assert min(got_cached) > 0   # the second turn did reuse the first's KV
  for w, g in zip(want, got):
    assert g.ids.tolist() == w.ids.tolist()
    scale = max(1.0, float(np.abs(w.logprobs).max()))
    np.testing.assert_allclose(g.logprobs, w.logprobs, rtol=0, atol=1e-5 * scale)
  kernel = sharded._state['language_model']['layers'][0]['self_attn']['k_proj']['kernel'][...]  # pylint: disable=W0212
  assert kernel.sharding.spec == jax.sharding.PartitionSpec(None, 'tensor')   # tensor-parallel, no fsdp


def _laid_out(x: jax.Array, spec) -> bool:
  """x is a NamedSharding equivalent to `spec` on its mesh (trailing Nones may be dropped)."""
  return (isinstance(x.sharding, jax.sharding.NamedSharding)
          and x.sharding.is_equivalent_to(jax.sharding.NamedSharding(x.sharding.mesh, spec), x.ndim))


def test_the_kv_cache_is_created_and_kept_sharded(model, tokenizer, image_ref):
  sampler = jax_sampler.JaxSampler(model, tokenizer, mesh=layout.mesh_from_config({'tensor': 2}), **KW)
  empty = sampler._init_cache(4, 32)   # pylint: disable=protected-access
  for name in ('k', 'v'):
    assert _laid_out(empty[name], layout.KV_SPEC)
    assert {s.data.shape for s in empty[name].addressable_shards} == {(2, 1, 1, 32, 16)}   # [L, B/4, Hkv/2, C, D]
  assert _laid_out(empty['mask'], layout.MASK_SPEC)
  batch = decode_batch.DecodeBatch(sampler, chunk=2)
  contexts = [engine_lib.as_context(c) for c in _first_turn(image_ref)]
  batch.admit(contexts[:1], [50], ['a'])   # one row: padded to the 4 replicas
  assert batch.capacity == 4
  for _ in range(2):
    assert _laid_out(batch.cache['k'], layout.KV_SPEC) and _laid_out(batch.cache['mask'], layout.MASK_SPEC)
    batch.step()
  assert batch.live == 1
  batch.admit(contexts + contexts[:1], [NEW] * 4, ['b', 'c', 'd', 'e'])   # 1 + 4 rows: grows to 8, still sharded
  assert batch.capacity == 8 and _laid_out(batch.cache['v'], layout.KV_SPEC)


def _decode_argument_bytes(sampler, batch: int, cache_len: int) -> int:
  decode = sampler._decode_fn(True, False, 4)   # pylint: disable=protected-access
  cache = sampler._init_cache(batch, cache_len)   # pylint: disable=protected-access
  carry = (jnp.zeros(batch, jnp.int32),) * 4 + (jnp.zeros(batch, bool),)
  lowered = decode.lower(sampler._state, cache, carry, jnp.ones(batch, jnp.int32),   # pylint: disable=W0212
                         jax.random.key(0), jnp.int32(0), jnp.float32(1.0), jnp.float32(1.0))
  return int(lowered.compile().memory_analysis().argument_size_in_bytes)


@pytest.mark.parametrize('tensor', [2, 8])
def test_compiled_decode_holds_a_shard_of_the_kv_per_device(models, tokenizer, tensor):
  """Per-device argument bytes of the compiled decode step grow, with the cache length, by the KV bytes / 8 (the
  weights, the same at both lengths, cancel)."""
  sampler = jax_sampler.JaxSampler(models[tensor], tokenizer, mesh=layout.mesh_from_config({'tensor': tensor}),
                                   **{**KW, 'max_len': 2048})
  batch, short, long = 8, 256, 2048
  grown = _decode_argument_bytes(sampler, batch, long) - _decode_argument_bytes(sampler, batch, short)
  model = models[tensor]
  kv = layout.kv_bytes(model.init_cache(batch, long)) - layout.kv_bytes(model.init_cache(batch, short))
  assert abs(grown - kv / 8) <= 0.1 * kv / 8, (grown, kv / 8)


def test_a_mesh_the_kv_heads_do_not_fit_is_refused_naming_the_field(model, tokenizer):
  with pytest.raises(ValueError, match=r'rollout.mesh.tensor=4 does not divide .*num_key_value_heads=2'):
    jax_sampler.JaxSampler(model, tokenizer, mesh=layout.mesh_from_config({'tensor': 4}), **KW)


@pytest.mark.parametrize('mesh, field', [
    ({'tensor': 3}, 'rollout.mesh.tensor=3'), ({'tensor': 0}, 'rollout.mesh.tensor=0'),
    ({'fsdp': 2}, 'rollout.mesh.fsdp'), ({'tensor': 2, 'data': 8}, 'rollout.mesh.data=8')])
def test_bad_rollout_mesh_sizes_are_refused_naming_the_field(mesh, field):
  with pytest.raises(ValueError, match=field.replace('.', r'\.')):
    layout.mesh_sizes(mesh, 8)


def test_factory_builds_the_layout_from_rollout_mesh_and_none_by_default(model, tokenizer):
  section = ml_collections.ConfigDict({'max_new_tokens': 4, 'max_total_tokens': 64})
  assert factory.make_engine(section, tokenizer, model=model).layout is None
  section.mesh = {'tensor': 2}
  engine = factory.make_engine(section, tokenizer, model=model)
  assert (engine.layout.replicas, engine.layout.tensor, engine.batch_multiple) == (4, 2, 4)
  section.mesh = {'tensor': 2, 'expert': 1}
  with pytest.raises(ValueError, match=r'rollout\.mesh\.expert: unknown field'):
    factory.check_engine_config(section)
  section.mesh = {'data': 0}
  with pytest.raises(ValueError, match=r'rollout\.mesh\.data=0'):
    factory.check_engine_config(section)


def test_weights_on_the_training_layout_are_resharded_and_the_trainer_keeps_its_own(model, tokenizer, image_ref):
  """A policy laid out for training (FSDP over 8) samples on the rollout layout as the unsharded one does; its own
  arrays keep the FSDP layout."""
  trained = sharding.shard_model(nnx.clone(model), sharding.make_mesh(fsdp=8))
  embed = trained.language_model.embed_tokens.embedding
  before = embed[...].sharding
  want = jax_sampler.JaxSampler(model, tokenizer, **KW).generate(_first_turn(image_ref))
  sampler = jax_sampler.JaxSampler(trained, tokenizer, mesh=layout.mesh_from_config({'tensor': 2}), **KW)
  got = sampler.generate(_first_turn(image_ref))
  assert [g.ids.tolist() for g in got] == [w.ids.tolist() for w in want]
  assert embed[...].sharding == before and 'fsdp' in str(before.spec)
  table = sampler._state['language_model']['embed_tokens']['embedding'][...]   # pylint: disable=protected-access
  assert table.sharding.spec == jax.sharding.PartitionSpec('tensor', None)   # vocab over tensor, no fsdp


def test_auto_tensor_sizes_the_layout_from_the_model_and_the_kv_budget(model, tokenizer, monkeypatch):
  """rollout.mesh.tensor=-1: with a device just large enough for (weights + 2 rows of KV) / 2 at 90%, one device
  cannot hold the weights and a row, so T = 2 (4 replicas of 2 rows); a device too small for any T is refused."""
  section = ml_collections.ConfigDict({'max_new_tokens': 4, 'max_total_tokens': 60, 'max_concurrency': 8,
                                       'mesh': {'tensor': -1, 'data': -1}})
  weights = layout.weight_bytes(model)
  row = layout.kv_bytes_per_token(model.config.text, model.dtype) * 64
  assert row == layout.kv_bytes(model.init_cache(1, 64))   # the per-token count is the cache's
  monkeypatch.setattr(layout, 'device_bytes', lambda: int((weights + 2 * row) / 2 / layout.FIT_FRACTION) + 1)
  engine = factory.make_engine(section, tokenizer, model=model)
  assert (engine.layout.tensor, engine.layout.replicas) == (2, 4)
  section.mesh.data = 2   # 2 replicas of 4 rows: (weights + 4 rows) / 2 no longer fits; the KV heads stop T at 2
  with pytest.raises(ValueError, match=r'rollout\.mesh\.tensor=-1 \(auto\): no tensor-parallel degree dividing the 8 '
                                       r'devices and the 2 KV heads'):
    factory.make_engine(section, tokenizer, model=model)
  del section['max_concurrency']
  section.mesh.data = -1
  with pytest.raises(ValueError, match=r'rollout\.mesh\.tensor=-1 \(auto\) sizes the KV cache for the rollout\'s '
                                       r'concurrent rows: none given \(rollout\.max_concurrency\)'):
    factory.make_engine(section, tokenizer, model=model)
