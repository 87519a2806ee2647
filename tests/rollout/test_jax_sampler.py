"""JaxSampler on a tiny random Qwen3-VL: KV-cache decoding equals full forwards, batching changes nothing, stops."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from osvl_jax import trajectory as tj
from osvl_jax.models.qwen3_vl import model as model_lib
from osvl_jax.models.qwen3_vl import rope
from osvl_jax.models.qwen3_vl.config import Qwen3VLConfig
from osvl_jax.rollout import engine as engine_lib
from osvl_jax.rollout import jax_sampler

IM_END = 151645
NEW = 6  # decode length in these tests: small, the CPUs are shared.


@pytest.fixture(scope='module')
def tokenizer():
  return tj.load_tokenizer()


@pytest.fixture(scope='module')
def model():
  return model_lib.Qwen3VLModel(Qwen3VLConfig.tiny(), nnx.Rngs(0))


@pytest.fixture(scope='module')
def image_ref():
  """A 64x64 random image -> grid (1, 4, 4), 4 image-pad tokens."""
  proc = tj.ImageProcessor(min_pixels=32 * 32, max_pixels=64 * 64)
  return proc.process(np.random.default_rng(1).integers(0, 256, (64, 64, 3), dtype=np.uint8))


def _text_prompt(seed: int, length: int) -> np.ndarray:
  return np.random.default_rng(seed).integers(100, 150000, size=length).astype(np.int32)


def _image_prompt(ref) -> np.ndarray:
  ids = list(_text_prompt(2, 5)) + [tj.VISION_START_ID] + [tj.IMAGE_PAD_ID] * ref.num_tokens
  return np.asarray(ids + [tj.VISION_END_ID] + list(_text_prompt(3, 4)), np.int32)


def _reference_greedy(model, prompt, images, n):
  """Greedy ids and temperature-1 logprobs by full forwards (no cache), one token at a time."""
  ids, out_ids, out_lp = list(prompt), [], []
  grid = np.stack([im.grid_thw for im in images]) if images else None
  pixels = np.concatenate([im.pixel_values for im in images]) if images else None
  for _ in range(n):
    x = np.asarray(ids, np.int32)[None]
    pos, _ = rope.get_rope_index(x, grid)
    hidden, _ = model(x, pos, None, pixels, grid)
    logp = jax.nn.log_softmax(model.logits(hidden)[0, -1])
    tok = int(jnp.argmax(logp))
    out_ids.append(tok)
    out_lp.append(float(logp[tok]))
    ids.append(tok)
    if tok == IM_END:
      break
  return out_ids, np.asarray(out_lp, np.float32)


def _sampler(model, tokenizer, **kw):
  kw = {'max_new_tokens': NEW, 'temperature': 0.0, 'max_len': 256, 'bucket': 16, **kw}
  return jax_sampler.JaxSampler(model, tokenizer, **kw)


def test_greedy_equals_argmax_of_full_forwards(model, tokenizer, image_ref):
  sampler = _sampler(model, tokenizer)
  contexts = [(_text_prompt(0, 11), []), (_image_prompt(image_ref), [image_ref])]
  gens = sampler.generate(contexts)
  for (prompt, images), gen in zip(contexts, gens):
    ref_ids, ref_lp = _reference_greedy(model, prompt, images, NEW)
    assert gen.ids.tolist() == ref_ids
    np.testing.assert_allclose(gen.logprobs, ref_lp, atol=1e-4)
    assert gen.finish_reason == engine_lib.FINISH_LENGTH
    assert gen.ids.dtype == np.int32 and gen.logprobs.dtype == np.float32


def test_batch_of_different_lengths_equals_each_alone(model, tokenizer, image_ref):
  sampler = _sampler(model, tokenizer)
  contexts = [(_text_prompt(4, 21), []), (_image_prompt(image_ref), [image_ref]), (_text_prompt(5, 3), [])]
  together = sampler.generate(contexts)
  for context, gen in zip(contexts, together):
    alone = sampler.generate([context])[0]
    assert gen.ids.tolist() == alone.ids.tolist()
    np.testing.assert_allclose(gen.logprobs, alone.logprobs, atol=1e-5)


def test_stops_at_im_end_and_keeps_the_stop_token(tokenizer):
  """Swapping the lm_head columns of <|im_end|> and the 4th greedy token makes the model end the turn there."""
  model = model_lib.Qwen3VLModel(Qwen3VLConfig.tiny(tie_word_embeddings=False), nnx.Rngs(0))
  prompt = _text_prompt(6, 9)
  ref, _ = _reference_greedy(model, prompt, [], 8)
  k = next(i for i in range(1, len(ref)) if ref[i] not in ref[:i])
  kernel = model.lm_head.kernel[...]
  model.lm_head.kernel[...] = kernel.at[:, [IM_END, ref[k]]].set(kernel[:, [ref[k], IM_END]])
  other = _text_prompt(7, 14)
  gens = _sampler(model, tokenizer, max_new_tokens=8).generate([(prompt, []), (other, [])])
  assert gens[0].ids.tolist() == ref[:k] + [IM_END]
  assert gens[0].finish_reason == engine_lib.FINISH_STOP
  assert gens[0].text == tokenizer.decode(ref[:k])
  other_ref, _ = _reference_greedy(model, other, [], 8)
  assert gens[1].ids.tolist() == other_ref  # the stopped row does not disturb the running one


def test_stop_string_ends_the_row(model, tokenizer):
  prompt = _text_prompt(0, 11)
  ref, _ = _reference_greedy(model, prompt, [], NEW)
  usable = [k for k in range(1, len(ref)) if tokenizer.decode(ref[k:k + 1]).strip()
            and tokenizer.decode(ref[k:k + 1]) not in tokenizer.decode(ref[:k])
            and '\ufffd' not in tokenizer.decode(ref[:k + 1])]
  assert usable, 'no greedy token of this random model decodes to a usable stop string'
  k = usable[0]
  gen = _sampler(model, tokenizer).generate([(prompt, [])], stop=[tokenizer.decode(ref[k:k + 1])])[0]
  assert gen.ids.tolist() == ref[:k + 1]
  assert gen.finish_reason == engine_lib.FINISH_STOP_STRING


def test_tiny_top_p_sampling_is_greedy_and_logprobs_are_temperature_one(model, tokenizer):
  prompt = _text_prompt(0, 11)
  greedy = _sampler(model, tokenizer).generate([(prompt, [])])[0]
  nucleus = _sampler(model, tokenizer, temperature=0.7, top_p=1e-6, seed=3).generate([(prompt, [])])[0]
  assert nucleus.ids.tolist() == greedy.ids.tolist()
  np.testing.assert_allclose(nucleus.logprobs, greedy.logprobs, atol=1e-5)


def test_sampling_draws_from_the_model_distribution():
  """Top-p=1 sampling frequencies follow softmax(logits / T); top-p removes the tail."""
  logits = jnp.log(jnp.asarray([[0.5, 0.3, 0.15, 0.05]], jnp.float32))
  keys = jax.random.split(jax.random.key(0), 4000)
  draw = jax.vmap(lambda k, tp: jax_sampler.sample_logits(logits, k, 1.0, tp, False, True)[0][0],
                  in_axes=(0, None))
  ids = np.asarray(draw(keys, 1.0))
  np.testing.assert_allclose(np.bincount(ids, minlength=4) / len(ids), [0.5, 0.3, 0.15, 0.05], atol=0.03)
  ids = np.asarray(draw(keys, 0.7))  # nucleus {0, 1}: mass before id 2 is 0.8 >= 0.7
  assert set(ids.tolist()) == {0, 1}
  tok, lp = jax_sampler.sample_logits(logits, keys[0], 0.5, 0.7, False, True)  # warped draw, base logprob
  np.testing.assert_allclose(np.exp(lp), np.asarray([0.5, 0.3, 0.15, 0.05])[np.asarray(tok)], rtol=1e-5)


def test_context_at_max_len_emits_nothing(model, tokenizer):
  sampler = _sampler(model, tokenizer, max_len=12)
  full, short = sampler.generate([(_text_prompt(0, 12), []), (_text_prompt(1, 9), [])])
  assert full.ids.size == 0 and full.finish_reason == engine_lib.FINISH_LENGTH
  assert short.ids.size == 3 and short.finish_reason == engine_lib.FINISH_LENGTH
