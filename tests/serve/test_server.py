"""The server over an in-process JaxSampler (uvicorn in a thread): SGLang API parity, batching, chat, refusals,
the prefix cache (`cached_tokens`, `/flush_cache`, emptied by a weight update)."""


import httpx
import jax
import numpy as np
import pytest

from osvl_jax import checkpoints
from osvl_jax import trajectory as tj
from osvl_jax.rollout import engine as engine_lib
from osvl_jax.rollout.embedded import jax_sampler
from osvl_jax.rollout.remote import sglang_client as sc
from osvl_jax.rollout.remote import sglang_protocol as protocol
from osvl_jax.serve import service as service_lib
from osvl_jax.serve.request_fields import RequestError
from osvl_jax.serve.requests import Row, render_messages
from tests.serve.conftest import BUCKET, MAX_LEN, NEW, serve_in_thread


@pytest.fixture(scope='module')
def service(tiny_model, tokenizer, processor):
  """`reference_sampler`'s settings plus a prefix cache (as `osvl_jax.serve` runs); model_path 'tiny' reloads the
  same weights."""
  sampler = jax_sampler.JaxSampler(tiny_model, tokenizer, image_processor=processor, max_new_tokens=NEW,
                                   temperature=0.0, max_len=MAX_LEN, bucket=BUCKET, prefix_cache_slots=16)
  loader = lambda path: tiny_model if path == 'tiny' else checkpoints.load_policy(path)[0]
  svc = service_lib.SamplerService(sampler, tokenizer, processor, model_path='tiny', weight_version='0',
                                   batch_window_s=0.02, default_max_new_tokens=NEW, loader=loader)
  yield svc
  svc.close()


@pytest.fixture(scope='module')
def url(service):
  with serve_in_thread(service) as u:
    yield u


def test_greedy_through_http_equals_in_process(url, reference, tokenizer, contexts):
  """Twice: the second time every prompt but its last id comes from the server's prefix cache."""
  want = reference.generate(contexts)
  engine = sc.SGLangEngine(url, tokenizer, max_new_tokens=NEW, temperature=0.0)
  for _ in range(2):
    got = engine.generate(contexts)
    for w, g in zip(want, got):
      assert g.ids.tolist() == w.ids.tolist()
      np.testing.assert_allclose(g.logprobs, w.logprobs, atol=1e-5)
      assert g.finish_reason == w.finish_reason and g.text == w.text
      assert g.weight_version == '0'


def test_concurrent_rows_are_batched_and_cut_per_row(service, contexts):
  caps = [2, 6, 4]
  rows = [Row(context=engine_lib.as_context(c), max_new_tokens=n, temperature=0.0, top_p=1.0, stop=(),
              stop_token_ids=frozenset(), return_logprob=True) for c, n in zip(contexts, caps)]
  before = dict(service.stats)
  futures = [service.submit_rows([r]) for r in rows]   # three requests waiting together
  outs = [f.result(timeout=60)[0] for f in futures]
  assert service.stats['batches'] - before['batches'] == 1
  assert service.stats['max_rows_per_batch'] >= 3
  assert [len(o['ids']) for o in outs] == caps
  assert all(o['finish_reason'] == {'type': 'length', 'length': n} for o, n in zip(outs, caps))
  # An extra stop id of one row cuts that row only.
  stop_id = outs[1]['ids'][2]
  row = Row(context=rows[1].context, max_new_tokens=6, temperature=0.0, top_p=1.0, stop=(),
            stop_token_ids=frozenset({stop_id}), return_logprob=True)
  (cut,) = service.submit_rows([row]).result(timeout=60)
  assert cut['ids'] == outs[1]['ids'][:outs[1]['ids'].index(stop_id) + 1]
  assert cut['finish_reason'] == {'type': 'stop', 'matched': stop_id}


def test_generate_layout_and_batch_form(url, contexts):
  ids = [int(i) for i in contexts[0][0]]
  body = {'input_ids': [ids, ids[:5]], 'sampling_params': {'max_new_tokens': 3, 'temperature': 0},
          'return_logprob': True, 'return_text_in_logprobs': True}
  out = httpx.post(url + '/generate', json=body, timeout=60).json()
  assert isinstance(out, list) and len(out) == 2
  meta = out[0]['meta_info']
  assert len(out[0]['output_ids']) == 3 == meta['completion_tokens'] == meta['output_token_logprobs_length']
  assert [e[1] for e in meta['output_token_logprobs']] == out[0]['output_ids']
  assert all(isinstance(e[2], str) for e in meta['output_token_logprobs'])
  assert meta['weight_versions'] == [{'version': meta['weight_version'], 'start': 0, 'end': 3}]


@pytest.mark.parametrize('body, match', [
    ({'text': 'hello'}, 'text'),
    ({'input_ids': [1, 2], 'stream': True}, 'stream'),
    ({'input_ids': [1, 2], 'sampling_params': {'top_k': 20}}, 'top_k'),
    ({'input_ids': [1, 2], 'sampling_params': {'bogus': 1}}, 'bogus'),
    ({'input_ids': [1, 2], 'sampling_params': {'top_p': 0}}, 'top_p'),
    ({'input_ids': [1, tj.IMAGE_PAD_ID, tj.IMAGE_PAD_ID], 'image_data': ['iVBOR']}, 'image'),
    ({'input_ids': [1, 2], 'image_data': ['http://example.com/a.png']}, 'fetch'),
])
def test_refusals_are_400_naming_the_problem(url, body, match):
  resp = httpx.post(url + '/generate', json=body, timeout=30)
  assert resp.status_code == 400
  assert match in resp.json()['error']['message']


def test_admin_endpoints(url, tokenizer):
  engine = sc.SGLangEngine(url, tokenizer)
  assert engine.health()
  assert engine.model_info()['weight_version'] == '0'
  assert engine.server_info()['max_batch'] >= 1
  engine.flush_cache()
  assert httpx.get(url + '/get_model_info').status_code == 200
  assert httpx.get(url + '/v1/models').json()['data'][0]['id'] == 'osvl-jax'
  bad = httpx.post(url + '/update_weights_from_disk', json={'model_path': '/no/such/ckpt'}, timeout=30)
  assert bad.status_code == 400 and not bad.json()['success']
  assert engine.model_info()['weight_version'] == '0'


def test_chat_messages_render_as_the_trajectory_builder(tokenizer, processor, contexts):
  pixels = contexts[2][1][0].pixels
  builder = tj.TrajectoryBuilder(tokenizer, processor, [], system_prompt='Judge.')
  builder.start('Is it a tower?', pixels)
  image = {'type': 'image_url', 'image_url': {'url': protocol.image_data_url(pixels)}}
  messages = [{'role': 'system', 'content': 'Judge.'},
              {'role': 'user', 'content': [{'type': 'text', 'text': 'Is it a tower?'}, image]}]
  ids, refs = render_messages(tokenizer, processor, messages)
  np.testing.assert_array_equal(ids, builder.prompt_ids())
  assert len(refs) == 1 and refs[0].num_tokens == builder.images[0].num_tokens
  more = messages + [{'role': 'assistant', 'content': '<think>x</think><response>yes</response>'},
                     {'role': 'user', 'content': 'Sure?'}]
  ids2, _ = render_messages(tokenizer, processor, more)
  assert ids2[:len(ids)].tolist() == ids.tolist()   # append-only
  text = tokenizer.decode(ids2[len(ids):])
  assert text == ('<think>x</think><response>yes</response><|im_end|>\n<|im_start|>user\nSure?<|im_end|>\n'
                  '<|im_start|>assistant\n')
  with pytest.raises(RequestError):
    render_messages(tokenizer, processor, [{'role': 'assistant', 'content': 'hi'}])


def test_chat_completions_endpoint(url):
  body = {'model': 'osvl-jax', 'messages': [{'role': 'user', 'content': 'hello'}], 'max_tokens': 3,
          'temperature': 0}
  out = httpx.post(url + '/v1/chat/completions', json=body, timeout=60).json()
  assert out['object'] == 'chat.completion' and out['usage']['completion_tokens'] == 3
  assert isinstance(out['choices'][0]['message']['content'], str)
  assert out['choices'][0]['finish_reason'] == 'length'


def test_prefix_cache_is_reported_flushed_and_emptied_by_updates(url, service, contexts):
  ids = [int(i) for i in contexts[0][0]]

  def generate(input_ids):
    body = {'input_ids': input_ids, 'sampling_params': {'max_new_tokens': 3, 'temperature': 0},
            'return_logprob': True}
    out = httpx.post(url + '/generate', json=body, timeout=60).json()
    meta = out['meta_info']
    return meta['cached_tokens'], out['output_ids'], [e[0] for e in meta['output_token_logprobs']]

  assert httpx.post(url + '/flush_cache', timeout=30).status_code == 200
  assert service.prefix_cache_info()['used_slots'] == 0
  cached, first, first_lp = generate(ids)
  assert cached == 0 and service.prefix_cache_info()['used_slots'] == 1
  cached, again, again_lp = generate(ids)
  assert cached == len(ids) - 1 and again == first   # all but the last prompt id (its logits are needed)
  np.testing.assert_allclose(again_lp, first_lp, atol=1e-5)
  assert generate(ids + first + [500, 600])[0] == len(ids) + 2   # prompt + 3 ids but the last (never fed)
  assert httpx.get(url + '/flush_cache', timeout=30).text == 'Cache flushed.\n'
  assert service.prefix_cache_info()['used_slots'] == 0
  assert generate(ids)[0] == 0
  reply = httpx.post(url + '/update_weights_from_disk', json={'model_path': 'tiny', 'weight_version': '0'},
                     timeout=60).json()
  assert reply['success'], reply
  cached, after, after_lp = generate(ids)
  assert cached == 0 and after == first
  np.testing.assert_allclose(after_lp, first_lp, atol=1e-5)


def test_prefix_cache_size_auto_explicit_and_refused(tiny_model, monkeypatch):
  from osvl_jax.serve import launch  # pylint: disable=g-import-not-at-top
  t = tiny_model.config.text
  per_slot = 2 * t.num_hidden_layers * t.num_key_value_heads * t.head_dim * 256 * 4   # max_len 200 -> 256 tokens
  assert launch.prefix_cache_size(tiny_model, 0, 200, 128) == 0
  assert launch.prefix_cache_size(tiny_model, 7, 200, 128) == 7
  assert launch.prefix_cache_size(tiny_model, -1, 200, 128) == launch.AUTO_PREFIX_CACHE_SLOTS  # the tiny slot is small
  with pytest.raises(ValueError, match='prefix_cache_slots must be -1'):
    launch.prefix_cache_size(tiny_model, -2, 200, 128)
  # A device reporting 100 slots' worth of memory: auto takes a quarter, an explicit count over half is refused.
  device = type('Device', (), {'memory_stats': lambda self: {'bytes_limit': 100 * per_slot}})()
  monkeypatch.setattr(jax, 'devices', lambda: [device])
  assert launch.prefix_cache_size(tiny_model, -1, 200, 128) == 25
  assert launch.prefix_cache_size(tiny_model, 50, 200, 128) == 50
  with pytest.raises(ValueError, match='prefix_cache_slots=51 needs'):
    launch.prefix_cache_size(tiny_model, 51, 200, 128)
  # KV heads split over tensor 2 (the tiny model's 2 KV heads): a slot is half the bytes on each device.
  assert t.num_key_value_heads == 2
  assert launch.prefix_cache_size(tiny_model, -1, 200, 128, tensor=2) == 50
  assert launch.prefix_cache_size(tiny_model, 100, 200, 128, tensor=2) == 100
  with pytest.raises(ValueError, match='prefix_cache_slots=101 needs'):
    launch.prefix_cache_size(tiny_model, 101, 200, 128, tensor=2)
