"""JaxSampler on a tiny random Qwen3-VL: KV-cache decoding equals full forwards, batching changes nothing, stops."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from osvl_jax import compile_cache
from osvl_jax import trajectory as tj
from osvl_jax.models.qwen3_vl import model as model_lib
from osvl_jax.models.qwen3_vl import rope
from osvl_jax.models.qwen3_vl.config import Qwen3VLConfig
from osvl_jax.rollout import engine as engine_lib
from osvl_jax.rollout.embedded import jax_sampler, prefill_inputs

IM_END = 151645
NEW = 6  # decode length in these tests: small, the CPUs are shared.


@pytest.fixture(scope='module')
def tokenizer():
  return tj.load_tokenizer()


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
  """Greedy ids and temperature-1 logprobs by full forwards (no cache), one token at a time.

  Each forward runs on the prompt and the ids so far right-padded to len(prompt) + n (one compiled program for
  the n calls): a causal model's logits at the last real position do not depend on what follows it."""
  ids, out_ids, out_lp = list(prompt), [], []
  grid = np.stack([im.grid_thw for im in images]) if images else None
  pixels = np.concatenate([im.pixel_values for im in images]) if images else None
  static_grid = None if grid is None else tuple(map(tuple, grid.tolist()))
  forward = nnx.jit(lambda m, x, pos, pix: m.logits(m(x, pos, None, pix, static_grid)[0]))
  total = len(prompt) + n
  for _ in range(n):
    x = np.asarray(ids + [0] * (total - len(ids)), np.int32)[None]
    pos, _ = rope.get_rope_index(x, grid)
    logp = jax.nn.log_softmax(forward(model, x, pos, pixels)[0, len(ids) - 1])
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


def test_tiny_top_p_sampling_is_greedy_and_logprobs_are_at_the_temperature(model, tokenizer):
  """top_p -> 0 keeps only the argmax: the greedy ids; their log-probs are those of softmax(logits / 0.7), as a
  teacher-forced forward divided by 0.7 gives them (log-probs ~12 in float32: atol 1e-5)."""
  prompt = _text_prompt(0, 11)
  greedy = _sampler(model, tokenizer).generate([(prompt, [])])[0]
  nucleus = _sampler(model, tokenizer, temperature=0.7, top_p=1e-6, seed=3).generate([(prompt, [])])[0]
  assert nucleus.ids.tolist() == greedy.ids.tolist()
  ids = np.concatenate([prompt, greedy.ids]).astype(np.int32)[None]
  pos, _ = rope.get_rope_index(ids, None)
  hidden, _ = model(ids, pos)
  logits = np.asarray(model.logits(hidden), np.float64)[0, len(prompt) - 1:-1]
  want = jax.nn.log_softmax(logits / 0.7, axis=-1)[np.arange(len(greedy.ids)), greedy.ids]
  np.testing.assert_allclose(nucleus.logprobs, np.asarray(want), atol=1e-5)
  assert np.abs(nucleus.logprobs - greedy.logprobs).max() > 1e-3   # greedy reports temperature 1


def test_context_at_max_len_emits_nothing(model, tokenizer):
  sampler = _sampler(model, tokenizer, max_len=12)
  full, short = sampler.generate([(_text_prompt(0, 12), []), (_text_prompt(1, 9), [])])
  assert full.ids.size == 0 and full.finish_reason == engine_lib.FINISH_LENGTH
  assert short.ids.size == 3 and short.finish_reason == engine_lib.FINISH_LENGTH


# ---------------------------------------------------------------------------------------------------------------
# Hardening: end-of-sequence ids, vision ids never sampled, temperature and seed really used, parameter checks.
# ---------------------------------------------------------------------------------------------------------------

PEAKED = {100: 20.0, 200: 19.0, 300: 18.0, 400: 17.0}  # first-token logits of `_peaked_model` (all others 0)


def _peaked_model(prompt, targets):
  """An untied tiny model whose logits at the last prompt position are `targets` {id: logit}, 0 elsewhere."""
  model = model_lib.Qwen3VLModel(Qwen3VLConfig.tiny(tie_word_embeddings=False), nnx.Rngs(0))
  x = np.asarray(prompt, np.int32)[None]
  hidden, _ = model(x, rope.get_rope_index(x)[0], None, None, None)
  h = np.asarray(hidden[0, -1], np.float64)
  kernel = np.zeros(model.lm_head.kernel[...].shape, np.float32)
  for i, v in targets.items():
    kernel[:, i] = v * h / np.dot(h, h)
  model.lm_head.kernel[...] = jnp.asarray(kernel)
  return model, np.asarray(hidden[0, -1], np.float64) @ kernel.astype(np.float64)


ROWS = 256  # rows per draw: one compiled prefill shared by the temperature and seed tests


@pytest.fixture(scope='module')
def peaked(tokenizer):
  """(prompt, first-token logits float64 [V], one sampler over `_peaked_model`: max_new_tokens=1, T=1, seed 0)."""
  prompt = _text_prompt(8, 10)
  model, logits = _peaked_model(prompt, PEAKED)
  return prompt, logits, _sampler(model, tokenizer, max_new_tokens=1, temperature=1.0, seed=0)


def _draw(sampler, prompt, temperature=1.0, seed=None):
  sampler.temperature = temperature
  if seed is not None:
    sampler.reseed(seed)
  return np.asarray([g.ids[0] for g in sampler.generate([(prompt, [])] * ROWS)])


def _softmax(x):
  e = np.exp(x - x.max())
  return e / e.sum()


def _chi2(ids, probs, keys):
  """Chi-square of the counts of `keys` (plus 'any other id') against `probs` [V]."""
  observed = np.asarray([np.sum(ids == k) for k in keys] + [np.sum(~np.isin(ids, keys))], np.float64)
  expected = np.asarray([probs[k] for k in keys] + [1 - sum(probs[k] for k in keys)]) * len(ids)
  expected = np.maximum(expected, 1e-3)
  return float(np.sum((observed - expected) ** 2 / expected))


def test_temperature_shapes_the_sampled_distribution(peaked):
  """256 first tokens at T=0.5 follow softmax(logits / 0.5) (chi2, 4 dof, p=0.001 -> 18.5), not softmax(logits)."""
  prompt, logits, sampler = peaked
  keys = sorted(PEAKED)
  cold = _draw(sampler, prompt, temperature=0.5, seed=0)
  assert _chi2(cold, _softmax(logits / 0.5), keys) < 18.5
  assert _chi2(cold, _softmax(logits), keys) > 18.5  # a sampler that ignored its temperature fails here
  hot = _draw(sampler, prompt, temperature=1.0, seed=0)
  assert _chi2(hot, _softmax(logits), keys) < 18.5
  assert _chi2(hot, _softmax(logits / 0.5), keys) > 18.5
  assert np.mean(cold == 100) > np.mean(hot == 100) + 0.1  # colder: the top id more often


def test_seed_decides_the_samples(peaked):
  prompt, _, sampler = peaked
  a = _draw(sampler, prompt, seed=0)
  c = _draw(sampler, prompt, seed=1)
  d = _draw(sampler, prompt)  # the key advances per call
  # Any other id has probability 2e-4 (151,932 ids at logit 0 vs e^20): ~5% of 256-row draws hold one.
  assert np.isin(a, list(PEAKED)).mean() > 0.95 and len(set(a.tolist()) & set(PEAKED)) > 1
  assert a.tolist() != c.tolist() and d.tolist() not in (a.tolist(), c.tolist())
  assert _draw(sampler, prompt, seed=0).tolist() == a.tolist()


@pytest.mark.parametrize('temperature', [0.0, 1.0])
def test_vision_ids_are_never_sampled_nor_argmaxed(tokenizer, temperature):
  """Vision ids get the largest logits, yet greedy and sampling pick an allowed id; log-probs stay unmasked."""
  prompt = _text_prompt(9, 10)
  targets = {**{v: 30.0 for v in tj.VISION_IDS}, 500: 20.0, 600: 19.0}
  model, logits = _peaked_model(prompt, targets)
  sampler = _sampler(model, tokenizer, max_new_tokens=1, temperature=temperature, seed=0)
  gens = sampler.generate([(prompt, [])] * 32)
  ids = np.asarray([g.ids[0] for g in gens])
  assert not np.isin(ids, tj.VISION_IDS).any()
  assert set(ids.tolist()) == ({500} if temperature == 0 else {500, 600})
  logp = logits - np.log(np.sum(np.exp(logits - logits.max()))) - logits.max()
  np.testing.assert_allclose([g.logprobs[0] for g in gens], logp[ids], atol=1e-4)  # under the unmasked model


def test_endoftext_stops_like_im_end(tokenizer):
  """Qwen's second end-of-sequence id ends the row too (finish 'stop', kept, not in the text)."""
  model = model_lib.Qwen3VLModel(Qwen3VLConfig.tiny(tie_word_embeddings=False), nnx.Rngs(0))
  prompt = _text_prompt(6, 9)
  ref, _ = _reference_greedy(model, prompt, [], 8)
  k = next(i for i in range(1, len(ref)) if ref[i] not in ref[:i])
  kernel = model.lm_head.kernel[...]
  eot = tj.ENDOFTEXT_ID
  model.lm_head.kernel[...] = kernel.at[:, [eot, ref[k]]].set(kernel[:, [ref[k], eot]])
  gen = _sampler(model, tokenizer, max_new_tokens=8).generate([(prompt, [])])[0]
  assert gen.ids.tolist() == ref[:k] + [eot]
  assert gen.finish_reason == engine_lib.FINISH_STOP
  assert gen.text == tokenizer.decode(ref[:k])


@pytest.mark.parametrize('kw, name', [
    ({'top_p': 0.0}, 'top_p'), ({'top_p': -0.5}, 'top_p'), ({'top_p': 1.5}, 'top_p'),
    ({'top_p': float('nan')}, 'top_p'),
    ({'temperature': -0.1}, 'temperature'), ({'temperature': float('nan')}, 'temperature'),
    ({'temperature': float('inf')}, 'temperature'), ({'temperature': 'hot'}, 'temperature'),
    ({'max_new_tokens': 0}, 'max_new_tokens'), ({'max_new_tokens': 2.5}, 'max_new_tokens'),
    ({'max_new_tokens': True}, 'max_new_tokens'), ({'max_len': 0}, 'max_len'), ({'bucket': 0}, 'bucket'),
    ({'stop': '</tool_call>'}, 'stop'), ({'stop': ['']}, 'stop'), ({'seed': -1}, 'seed')])
def test_invalid_sampling_parameters_are_refused_by_name(model, tokenizer, kw, name):
  with pytest.raises(ValueError, match=name):
    _sampler(model, tokenizer, **kw)


def test_sampling_parameters_are_checked_on_assignment_and_per_call(model, tokenizer):
  sampler = _sampler(model, tokenizer, temperature=0.0, top_p=1.0)  # the edges of the valid ranges
  sampler.temperature, sampler.top_p = 0.7, 0.01
  assert (sampler.temperature, sampler.top_p) == (0.7, 0.01)
  with pytest.raises(ValueError, match='top_p'):
    sampler.top_p = 0.0
  with pytest.raises(ValueError, match='temperature'):
    sampler.temperature = -1.0
  assert (sampler.temperature, sampler.top_p) == (0.7, 0.01)
  with pytest.raises(ValueError, match='max_new_tokens'):
    sampler.generate([(_text_prompt(0, 5), [])], max_new_tokens=0)
  with pytest.raises(ValueError, match='stop'):
    sampler.generate([(_text_prompt(0, 5), [])], stop='x')


# ---------------------------------------------------------------------------------------------------------------
# Chunked decoding (several steps per device call): exact lengths, exact stop-string cuts, exact log-probs.
# ---------------------------------------------------------------------------------------------------------------


def _teacher_forced_logprobs(model, prompt, images, ids):
  """log_softmax(logits)[id_k] of each emitted id by one full forward over prompt + ids (no cache)."""
  x = np.asarray(list(prompt) + list(ids), np.int32)[None]
  grid = np.stack([im.grid_thw for im in images]) if images else None
  pixels = np.concatenate([im.pixel_values for im in images]) if images else None
  hidden, _ = model(x, rope.get_rope_index(x, grid)[0], None, pixels, grid)
  logp = np.asarray(jax.nn.log_softmax(model.logits(hidden)[0], axis=-1))
  return logp[len(prompt) - 1 + np.arange(len(ids)), np.asarray(ids)]


def test_rows_emit_exactly_their_length_limit_across_chunks(model, tokenizer):
  """max_len 20 leaves rows of 11, 14, 17 and 6 prompt ids 9, 6, 3 and (max_new_tokens) 12 ids: each row ends
  inside a different 4-step chunk, with its greedy ids."""
  prompts = [_text_prompt(10 + i, n) for i, n in enumerate([11, 14, 17, 6])]
  sampler = _sampler(model, tokenizer, max_new_tokens=12, max_len=20, decode_steps=4)
  gens = sampler.generate([(p, []) for p in prompts])
  for prompt, gen, limit in zip(prompts, gens, [9, 6, 3, 12]):
    assert gen.ids.tolist() == _reference_greedy(model, prompt, [], limit)[0]
    assert gen.finish_reason == engine_lib.FINISH_LENGTH
  assert sampler.stats['decode_steps'] == 11   # the longest row: 1 id from the prefill + 11 steps


@pytest.mark.parametrize('decode_steps', [3, 64])
def test_sampled_logprobs_equal_a_teacher_forced_forward(model, tokenizer, image_ref, decode_steps):
  """Temperature-1 samples of rows of different lengths (one with an image): each emitted id's log-prob is the
  full forward's over prompt + emitted ids (<= 1e-5), so every chunk fed the right id at the right slot."""
  contexts = [(_text_prompt(20, 13), []), (_image_prompt(image_ref), [image_ref]), (_text_prompt(21, 4), [])]
  sampler = _sampler(model, tokenizer, temperature=1.0, seed=5, max_new_tokens=10, decode_steps=decode_steps)
  for (prompt, images), gen in zip(contexts, sampler.generate(contexts)):
    assert len(gen.ids) == 10 or gen.ids[-1] in tj.EOS_IDS
    np.testing.assert_allclose(gen.logprobs, _teacher_forced_logprobs(model, prompt, images, gen.ids), atol=1e-5,
                               rtol=0)


def _stop_at(tokenizer, ref, k, width):
  """The text of ref[k-width+1 : k+1] if it is a stop string completed exactly at id k of ref, else None."""
  text = tokenizer.decode(ref[k - width + 1:k + 1])
  if not text.strip() or text in tokenizer.decode(ref[:k]) or '\ufffd' in tokenizer.decode(ref[:k + 1]):
    return None
  return text


@pytest.mark.parametrize('width', [1, 2])  # 2: a stop string made of two ids, also across a chunk boundary
def test_stop_string_in_a_later_chunk_cuts_at_the_completing_id(model, tokenizer, width):
  """4-step chunks (ids 1-4, 5-8, 9-12 after the prefill's id 0): the row whose text completes the stop string
  at id k >= 5 (inside the second chunk; with width 2 the string spans ids 4 and 5, two chunks) ends with
  exactly ids[:k+1], the chunk's later ids dropped; the other row runs on to its limit."""
  prompt, other = _text_prompt(0, 11), _text_prompt(1, 9)
  ref, _ = _reference_greedy(model, prompt, [], 12)
  other_ref, _ = _reference_greedy(model, other, [], 12)
  found = [(k, t) for k in range(5, 11) for t in [_stop_at(tokenizer, ref, k, width)]
           if t and t not in tokenizer.decode(other_ref)]
  assert found, 'no greedy id of this random model completes a usable stop string'
  k, text = found[0]
  gens = _sampler(model, tokenizer, max_new_tokens=12, decode_steps=4).generate([(prompt, []), (other, [])],
                                                                                stop=[text])
  assert gens[0].ids.tolist() == ref[:k + 1] and gens[0].finish_reason == engine_lib.FINISH_STOP_STRING
  assert len(gens[0].logprobs) == k + 1
  assert gens[1].ids.tolist() == other_ref and gens[1].finish_reason == engine_lib.FINISH_LENGTH


def test_samples_do_not_depend_on_the_chunk_size_or_an_unmatched_stop_string(model, tokenizer):
  """One key per `generate`, folded with the global decode step: decode_steps 64, 1 and 3, and a stop string that
  never matches (which caps the chunk at 8), all draw the same ids for the same seed."""
  prompts = [(_text_prompt(s, 7), []) for s in range(2)]

  def draw(**kw):
    stop = kw.pop('stop', None)
    s = jax_sampler.JaxSampler(model, tokenizer, max_new_tokens=20, temperature=1.0, seed=3, bucket=16, **kw)
    return [g.ids.tolist() for g in s.generate(prompts, stop=stop)]

  want = draw(decode_steps=64)
  assert len(set(map(tuple, want))) == 2 and all(len(w) >= 3 for w in want)
  assert draw(decode_steps=1) == want
  assert draw(decode_steps=3) == want
  assert draw(decode_steps=64, stop=('never-in-text-@@@',)) == want


def _compiles() -> int:
  """Programs built in this process: compiled, or read back from the persistent cache `make test` shares."""
  counts = compile_cache.counts()
  return counts['compiles_total'] + counts['compile_cache_hits']


def test_prefill_compiles_once_for_images_of_different_grids(model, tokenizer):
  """The images reach the prefill as arrays (`prefill_inputs.vision_arrays`), never as a static grid: contexts whose
  images have other grids but the same patch bucket run the programs the first built; more patches than the bucket
  (the next power of two) compile one more."""
  proc = tj.ImageProcessor(min_pixels=32 * 32, max_pixels=64 * 64)
  rng = np.random.default_rng(7)
  ref = lambda h, w: proc.process(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
  sampler = _sampler(model, tokenizer, patch_bucket=16)
  refs = [ref(64, 64), ref(32, 64), ref(64, 32)]
  assert [tuple(r.grid_thw.tolist()) for r in refs] == [(1, 4, 4), (1, 2, 4), (1, 4, 2)]
  counts = []
  for r in refs:
    before = _compiles()
    gen = sampler.generate([(_image_prompt(r), [r])])[0]
    counts.append(_compiles() - before)
    ref_ids, ref_lp = _reference_greedy(model, _image_prompt(r), [r], NEW)   # the padded layout changes nothing
    assert gen.ids.tolist() == ref_ids
    np.testing.assert_allclose(gen.logprobs, ref_lp, atol=1e-4)
  assert counts[0] >= 1 and counts[1:] == [0, 0], counts
  two = [refs[0], refs[1]]   # 16 + 8 patches: the next bucket (32)
  ids = np.concatenate([_image_prompt(refs[0])[:-4], _image_prompt(refs[1])[5:]])
  before = _compiles()
  sampler.generate([(ids, two)])
  assert _compiles() - before >= 1


def test_images_for_a_model_without_a_vision_tower_are_refused_naming_it():
  """`vision_arrays` with no vision config and images: a ValueError naming the images, not an AttributeError."""
  inputs = prefill_inputs.PrefillInputs(np.zeros((1, 8), np.int32), np.zeros((3, 1, 8), np.int32),
                                        np.ones((1, 8), bool), np.zeros(1, np.int32),
                                        np.zeros((16, 1536), np.float32), ((1, 4, 4),))
  with pytest.raises(ValueError, match=r'1 image\(s\) in the prefill, but the model has no vision tower'):
    prefill_inputs.vision_arrays(inputs, None, 256)
  assert prefill_inputs.vision_arrays(inputs._replace(pixel_values=None, grids=()), None, 256) is None


def test_length_rungs_by_hand():
  """`prefill_inputs.length_rung`: bucket x 2^k up to 4 buckets (64), then steps of 64, capped at max_len rounded
  up to the bucket (208), never below n."""
  got = [prefill_inputs.length_rung(n, 16, 200) for n in (1, 16, 17, 33, 64, 65, 129, 200)]
  assert got == [16, 16, 32, 64, 64, 128, 192, 208]
  assert prefill_inputs.length_rung(300, 16, 200) == 304   # over the cap (never asked by the sampler): n's multiple


def test_a_growing_context_compiles_a_logarithmic_number_of_programs(model, tokenizer):
  """A multi-turn context grows every turn: prompts of 20, 36, ..., 164 tokens (10 lengths, 10 multiples of the
  bucket 16) with max_len 200 pad to the rungs 32, 64, 128, 192 (suffix and cache alike), so the 10 calls build
  at most 4 rungs' programs; the outputs equal the unpadded greedy reference."""
  sampler = jax_sampler.JaxSampler(model, tokenizer, max_new_tokens=4, temperature=0.0, max_len=200, bucket=16)
  lengths = list(range(20, 165, 16))
  built = []
  for i, n in enumerate(lengths):
    before = _compiles()
    gen = sampler.generate([(_text_prompt(i, n), [])])[0]
    built.append(_compiles() - before)
    if i in (0, 5):
      ref_ids, ref_lp = _reference_greedy(model, _text_prompt(i, n), [], 4)
      assert gen.ids.tolist() == ref_ids
      np.testing.assert_allclose(gen.logprobs, ref_lp, atol=1e-4)
  rung = lambda n: prefill_inputs.length_rung(n, 16, 200)
  rungs = {(rung(n), rung(min(n + 4, 200))) for n in lengths}
  assert len(rungs) == 4, rungs
  new_shapes = [i for i, b in enumerate(built) if b]
  assert built[0] >= 1 and len(new_shapes) <= 4, built   # a multiple-of-16 ladder would build 10

