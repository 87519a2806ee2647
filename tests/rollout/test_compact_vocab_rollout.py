"""A compact-vocabulary policy in rollouts: the embedded sampler draws over its rows and returns Qwen ids, reads a
context id outside the vocabulary as <|endoftext|>, the server refuses such ids with a 400 naming the field."""

import httpx
import jax
import numpy as np

from osvl_jax import trajectory as tj
from osvl_jax.models.qwen3_vl import rope
from osvl_jax.rollout import agent_loop
from osvl_jax.rollout.embedded import jax_sampler
from osvl_jax.serve import request_limits
from osvl_jax.serve import service as service_lib
from tests.models.test_compact_vocab import VOCAB, compact, compact_copy, full  # noqa: F401  (fixtures: the model pair)
from tests.serve.conftest import serve_in_thread

NEW = 6


def _sampler(model, tokenizer, banned=None, max_len=64):
  cls = jax_sampler.JaxSampler
  if banned is not None:
    cls = type('Banned', (jax_sampler.JaxSampler,), {'never_sampled': tuple(banned)})
  return cls(model, tokenizer, max_new_tokens=NEW, temperature=0.0, max_len=max_len, bucket=16)


def _prompts():
  rng = np.random.default_rng(3)
  return [np.asarray(rng.choice(np.asarray(VOCAB[:-8]), n), np.int32) for n in (9, 5)]


def test_greedy_compact_sampling_is_the_full_models_with_every_other_id_banned(full, compact, tokenizer):
  """Same ids as the full model forbidden everything outside the vocabulary (and, as always, the vision ids); a
  banned id inside the vocabulary is banned as its row. The log-probs are of the distribution over the rows."""
  outside = np.setdiff1d(np.arange(151936), VOCAB)
  contexts = [(p, []) for p in _prompts()]
  first = _sampler(compact, tokenizer).generate(contexts)
  extra = int(first[0].ids[0])   # the compact model's first choice, banned next
  for banned in (tj.VISION_IDS, tj.VISION_IDS + (extra,)):
    got = _sampler(compact, tokenizer, banned).generate(contexts)
    want = _sampler(full, tokenizer, tuple(banned) + tuple(outside.tolist())).generate(contexts)
    for g, w in zip(got, want):
      assert g.ids.tolist() == w.ids.tolist() and set(g.ids.tolist()) <= set(VOCAB)
  assert got[0].ids[0] != extra
  # log softmax over the vocabulary's rows of the full model's logits, by one forward of prompt + emitted ids
  prompt, gen = contexts[0][0], first[0]
  ids = np.concatenate([prompt, gen.ids])[None]
  logits = np.asarray(full.logits(full(ids, rope.get_rope_index(ids, None)[0])[0]))[0]
  rows = np.searchsorted(VOCAB, gen.ids)
  steps = np.arange(len(prompt) - 1, len(prompt) - 1 + len(gen.ids))
  want_lp = np.asarray(jax.nn.log_softmax(logits[steps][:, np.asarray(VOCAB)], axis=-1))[np.arange(len(rows)), rows]
  np.testing.assert_allclose(gen.logprobs, want_lp, atol=1e-4)


def test_a_context_id_outside_the_vocabulary_reads_as_endoftext(full, compact, tokenizer, make_builder, env):
  """A tool's text may hold ids the vocabulary lacks: the sampler reads each as <|endoftext|> (ids and log-probs
  equal the same context written with it), and an episode whose question has such words runs like the others."""
  unknown = next(i for i in range(1000, 151000) if i not in VOCAB)
  prompt = _prompts()[0]
  written = np.concatenate([prompt[:4], [tj.ENDOFTEXT_ID], prompt[4:]]).astype(np.int32)
  read = np.concatenate([prompt[:4], [unknown], prompt[4:]]).astype(np.int32)
  got, want = _sampler(compact, tokenizer).generate([(read, []), (written, [])])
  assert got.ids.tolist() == want.ids.tolist() and set(got.ids.tolist()) <= set(VOCAB)
  np.testing.assert_allclose(got.logprobs, want.logprobs, atol=1e-5)
  other = _sampler(compact, tokenizer).generate([(np.where(read == unknown, VOCAB[10], read).astype(np.int32), [])])
  assert other[0].logprobs.tolist() != want.logprobs.tolist()   # the stand-in is a real input, not ignored
  items = [{'prompt_id': 'known', 'question': 'Which city?', 'answers': ['x']},
           {'prompt_id': 'unknown', 'question': 'Which city is shown in the photograph?', 'answers': ['x']}]
  builders = [make_builder() for _ in items]
  for builder, item in zip(builders, items):
    builder.start(item['question'], None)
  vocab = sorted(set(builders[0].prompt_ids().tolist()) | set(VOCAB))
  assert [i for i in builders[1].prompt_ids().tolist() if i not in vocab]   # the second question has other words
  sampler = _sampler(compact_copy(full, vocab), tokenizer, max_len=512)   # the system prompt: ~450 ids
  for t in agent_loop.run_episodes(sampler, env, make_builder, items, max_turns=1, max_new_tokens=NEW):
    assert t.stop_reason != 'error' and len(t.steps) == 1 and set(t.token_ids[t.gen_mask].tolist()) <= set(vocab)


def test_the_server_refuses_ids_outside_the_vocabulary_naming_the_field(compact, tokenizer):
  sampler = _sampler(compact, tokenizer)
  service = service_lib.SamplerService(sampler, tokenizer, None, model_path='tiny', weight_version='0',
                                       batch_window_s=0.01, default_max_new_tokens=NEW,
                                       limits=request_limits.RequestLimits(64, 16))
  prompt = [int(i) for i in _prompts()[0]]
  try:
    with serve_in_thread(service) as url:
      ok = httpx.post(url + '/generate', json={'input_ids': prompt, 'sampling_params': {'temperature': 0}},
                      timeout=120)
      assert ok.status_code == 200 and set(ok.json()['output_ids']) <= set(VOCAB)
      bad = httpx.post(url + '/generate', json={'input_ids': [prompt, [VOCAB[0], 151000]]}, timeout=30)
      assert bad.status_code == 400
      assert 'input_ids[1]: token id 151000' in bad.text and 'at position 1 is outside the compact vocabulary' in bad.text
  finally:
    service.close()
