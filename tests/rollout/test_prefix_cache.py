"""The sampler's prefix cache: reusing earlier rows' KV changes no greedy id and no log-prob, reports exactly the
reused prefix, never reuses past a changed image or across weights, and evicts the least recently used slot."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from osvl_jax import trajectory as tj
from osvl_jax.models.qwen3_vl import model as model_lib
from osvl_jax.models.qwen3_vl.config import Qwen3VLConfig
from osvl_jax.rollout.embedded import jax_sampler
from osvl_jax.rollout.embedded import prefix_cache as pc

NEW = 4             # ids per turn: small, the CPUs are shared.
KW = {'max_new_tokens': NEW, 'temperature': 0.0, 'max_len': 256, 'bucket': 64}   # one length bucket for all


@pytest.fixture(scope='module')
def images():
  """Three 64x64 images (4 pads each); 0 and 2 have the same grid, only their pixels differ."""
  proc = tj.ImageProcessor(min_pixels=32 * 32, max_pixels=64 * 64)
  return [proc.process(np.random.default_rng(s).integers(0, 256, (64, 64, 3), dtype=np.uint8)) for s in (1, 2, 3)]


def _text(seed: int, n: int) -> list:
  return np.random.default_rng(seed).integers(100, 150000, size=n).tolist()


def _span(image) -> list:
  return [tj.VISION_START_ID] + [tj.IMAGE_PAD_ID] * image.num_tokens + [tj.VISION_END_ID]


def _ctx(ids, ims):
  return np.asarray(ids, np.int32), list(ims)


@pytest.fixture(scope='module')
def turns(model, tokenizer, images):
  """Three batches through a sampler with the cache (8 slots) and one without, over the same contexts.

  Batch 1: A = system + question + image 0 + text, B = system + another question (nothing cached yet).
  Batch 2: A1 = A + its ids + text + image 1 (a new image in the suffix), B1 = B + its ids + text, C = system + a
    third question (shares only the system prefix), D = A (identical to a cached context), E = A with image 2 in
    place of image 0 (same ids, other pixels).
  Batch 3: A2, B1' = each batch-2 row of A1 / B1 + its ids + text.
  Returns [(contexts, generations without cache, generations with cache, cached_tokens)] per batch.
  """
  system = [tj.IM_START_ID] + _text(0, 19)
  qa, qb, qc = ([q] + _text(s, 5) for q, s in ((101, 1), (102, 2), (103, 3)))
  a = _ctx(system + qa + _span(images[0]) + _text(4, 4), [images[0]])
  b = _ctx(system + qb + _text(5, 3), [])
  off = jax_sampler.JaxSampler(model, tokenizer, **KW)
  on = jax_sampler.JaxSampler(model, tokenizer, prefix_cache_slots=8, **KW)
  out = []

  def run(contexts):
    want, got = off.generate(contexts), on.generate(contexts)
    out.append((contexts, want, got, list(on.cached_tokens)))
    return want

  ga, gb = run([a, b])
  a1 = _ctx(list(a[0]) + ga.ids.tolist() + _text(6, 3) + _span(images[1]) + _text(7, 2), [images[0], images[1]])
  b1 = _ctx(list(b[0]) + gb.ids.tolist() + _text(8, 5), [])
  c = _ctx(system + qc + _text(9, 2), [])
  e = _ctx(a[0], [images[2]])
  ga1, gb1, *_ = run([a1, b1, c, a, e])
  run([_ctx(list(a1[0]) + ga1.ids.tolist() + _text(10, 3), a1[1]),
       _ctx(list(b1[0]) + gb1.ids.tolist() + _text(11, 4), [])])
  return out, on, off, (a, b, a1, b1, c)


def test_cached_prefixes_change_no_id_and_no_logprob(turns):
  out, *_ = turns
  for contexts, want, got, _ in out:
    for w, g in zip(want, got):
      assert g.ids.tolist() == w.ids.tolist() and g.finish_reason == w.finish_reason
      np.testing.assert_allclose(g.logprobs, w.logprobs, atol=1e-5, rtol=0)


def test_cached_tokens_are_exactly_the_reused_prefix(turns):
  out, _, _, (a, b, a1, b1, c) = turns
  (_, g1, _, cached1), (_, g2, _, cached2), (_, _, _, cached3) = out
  assert cached1 == [0, 0]
  first_pad = list(a[0]).index(tj.IMAGE_PAD_ID)
  system_len = 20
  assert cached2 == [len(a[0]) + NEW - 1,   # A's prompt + its ids but the last (never fed)
                     len(b[0]) + NEW - 1,
                     system_len,            # the shared system prompt only
                     len(a[0]) - 1,         # identical context: all but the last id (the first logits)
                     first_pad]             # another image: nothing from the image's first pad on
  assert all(len(g.ids) == NEW for g in g1 + g2)
  assert cached3 == [len(a1[0]) + NEW - 1, len(b1[0]) + NEW - 1]


def test_set_model_empties_the_cache(turns, model):
  out, on, off, _ = turns
  contexts, before, *_ = out[-1]
  other = model_lib.Qwen3VLModel(Qwen3VLConfig.tiny(), nnx.Rngs(7))
  on.set_model(other)
  off.set_model(other)   # same compiled programs, new weights: a fresh sampler's answers
  try:
    assert on.prefix_cache.used_slots == 0
    want, got = off.generate(contexts), on.generate(contexts)
    assert on.cached_tokens == [0, 0]
    for w, g in zip(want, got):
      assert g.ids.tolist() == w.ids.tolist()
      np.testing.assert_allclose(g.logprobs, w.logprobs, atol=1e-5, rtol=0)
    assert not np.allclose(got[0].logprobs, before[0].logprobs, atol=1e-3)   # the weights did change
  finally:
    on.set_model(model)
    off.set_model(model)


def test_prefix_never_ends_inside_an_image_run():
  """A context identical to a stored one but ending inside an image run (no <|vision_end|> yet): the T - 1 cap
  falls inside the run, so the prefix is cut back to the run's first pad."""
  cache = pc.PrefixCache(slots=2, max_len=16)
  image = -5   # an image key
  keys = np.asarray([7, 8, 9, image, image, image], np.int64)
  _store(cache, [keys])
  assert cache.match(keys) == (3, 0)
  assert cache.match(np.asarray([7, 8, 9, image, image, image, 10, 11], np.int64)) == (6, 0)
  assert cache.match(np.asarray([7, 8, 9, -6, -6, -6, 10], np.int64)) == (3, 0)   # another image
  assert cache.match(np.asarray([1, 2], np.int64)) == (0, -1)


def test_image_keys_follow_pixels_and_grid(images):
  ids = np.asarray([5] + _span(images[0]), np.int64)
  k0 = pc.row_keys(ids, [images[0]], tj.IMAGE_PAD_ID)
  assert (k0[2:6] == pc.image_key(images[0])).all() and (k0[2:6] < 0).all()
  assert k0[[0, 1, 6]].tolist() == [5, tj.VISION_START_ID, tj.VISION_END_ID]
  assert pc.image_key(images[0]) == pc.image_key(images[0]) != pc.image_key(images[2])


def _store(cache, key_rows, offset=0.0):
  """Stores rows whose KV is a recognisable constant (row b: offset + b) in a [1, B, 1, 16, 1] batch cache."""
  batch = len(key_rows)
  k = jnp.broadcast_to(offset + jnp.arange(batch, dtype=jnp.float32)[None, :, None, None, None], (1, batch, 1, 16, 1))
  cache.store({'k': k, 'v': -k}, [(b, keys, -1) for b, keys in enumerate(key_rows)])


def test_least_recently_used_slot_is_evicted():
  cache = pc.PrefixCache(slots=2, max_len=16)
  x, y, z = (np.asarray([s, s + 1, s + 2, s + 3], np.int64) for s in (10, 20, 30))
  _store(cache, [x], 1.0)
  _store(cache, [y], 2.0)
  assert cache.match(np.append(x, 0))[0] == 4     # x used: y is now the least recently used
  _store(cache, [z], 3.0)                          # evicts y
  assert cache.match(np.append(y, 0)) == (0, -1)
  (mx, sx), (mz, sz) = cache.match(np.append(x, 0)), cache.match(np.append(z, 0))
  assert (mx, mz) == (4, 4) and sx != sz
  got = cache.gather(np.asarray([sx, sz]), np.asarray([4, 2]), 16)
  assert np.asarray(got['k'])[0, :, 0, 0, 0].tolist() == [1.0, 3.0]
  assert np.asarray(got['v'])[0, :, 0, 0, 0].tolist() == [-1.0, -3.0]
  assert np.asarray(got['mask']).sum(1).tolist() == [4, 2]
  cache.clear()
  assert cache.used_slots == 0 and cache.match(np.append(x, 0)) == (0, -1)


def test_a_row_extending_a_whole_slot_reuses_that_slot():
  cache = pc.PrefixCache(slots=2, max_len=16)
  x = np.asarray([1, 2, 3], np.int64)
  _store(cache, [x, np.asarray([9, 9], np.int64)])
  longer = np.asarray([1, 2, 3, 4, 5], np.int64)
  m, slot = cache.match(np.append(longer, 6))
  assert (m, slot) == (3, 0)
  cache.store({'k': jnp.zeros((1, 1, 1, 16, 1)), 'v': jnp.zeros((1, 1, 1, 16, 1))}, [(0, longer, slot)])
  assert cache.used_slots == 2 and cache.lengths.tolist() == [5, 2]   # slot 0 extended, [9, 9] kept
  cache.store({'k': jnp.zeros((1, 1, 1, 16, 1)), 'v': jnp.zeros((1, 1, 1, 16, 1))}, [(0, x, 0)])
  assert cache.lengths.tolist() == [5, 2]   # already held by slot 0: nothing written
