"""The server's request path over an in-process JaxSampler (uvicorn in a thread): every malformed field of
/generate and /v1/chat/completions is a 400 naming it, image spans are checked at the door, a row that fails
inside the batched sampler call fails alone, the body size limit is a 413."""

import concurrent.futures

import httpx
import numpy as np
import pytest

from osvl_jax import trajectory as tj
from osvl_jax.rollout import engine as engine_lib
from osvl_jax.rollout.embedded import jax_sampler
from osvl_jax.rollout.remote import sglang_protocol as protocol
from osvl_jax.serve import auth
from osvl_jax.serve import request_limits
from osvl_jax.serve import service as service_lib
from osvl_jax.serve.requests import Row
from tests.serve.conftest import BUCKET, MAX_LEN, NEW, serve_in_thread

LIMIT_NEW = 32        # --max_new_tokens_limit of this server
BODY = 1 << 20        # --max_body_bytes
VS, VE, PAD = tj.VISION_START_ID, tj.VISION_END_ID, tj.IMAGE_PAD_ID


@pytest.fixture(scope='module')
def service(tiny_model, tokenizer, processor):
  sampler = jax_sampler.JaxSampler(tiny_model, tokenizer, image_processor=processor, max_new_tokens=NEW,
                                   temperature=0.0, max_len=MAX_LEN, bucket=BUCKET)
  limits = request_limits.RequestLimits(MAX_LEN, LIMIT_NEW, max_body_bytes=BODY)
  svc = service_lib.SamplerService(sampler, tokenizer, processor, model_path='tiny', weight_version='0',
                                   batch_window_s=0.05, default_max_new_tokens=NEW, limits=limits)
  yield svc
  svc.close()


@pytest.fixture(scope='module')
def url(service):
  with serve_in_thread(service) as u:
    yield u


@pytest.fixture(scope='module')
def image_item(contexts):
  return protocol.image_data_url(contexts[2][1][0].pixels)   # 64x64: 4 pads


def generate_body(ids, images=None, max_new=4):
  body = {'input_ids': [int(i) for i in ids], 'sampling_params': {'max_new_tokens': max_new, 'temperature': 0},
          'return_logprob': True}
  if images:
    body['image_data'] = images
  return body


def test_split_pad_request_is_refused_and_its_batch_mates_answered(url, contexts, image_item):
  """Six valid requests sent together with one whose pad run is split: the bad one is a 400 naming the image and
  the split, the others get what they get alone."""
  image_ids = [int(i) for i in contexts[2][0]]
  start = image_ids.index(VS)
  split = image_ids[:start + 3] + [500] + image_ids[start + 3:]   # VS P P 500 P P VE
  assert split.count(PAD) == 4
  valid = [generate_body(contexts[0][0]), generate_body(contexts[1][0]), generate_body(image_ids, [image_item]),
           generate_body(contexts[0][0][:6]), generate_body(contexts[1][0][:4]), generate_body(image_ids[:-2],
                                                                                               [image_item])]
  alone = [httpx.post(url + '/generate', json=b, timeout=120).json()['output_ids'] for b in valid]
  bodies = valid[:3] + [generate_body(split, [image_item])] + valid[3:]
  with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
    replies = list(pool.map(lambda b: httpx.post(url + '/generate', json=b, timeout=120), bodies))
  bad = replies.pop(3)
  assert bad.status_code == 400
  message = bad.json()['error']['message']
  assert 'image_data[0]' in message and 'contiguous <|image_pad|>' in message and 'found 2 then id 500' in message
  assert [r.status_code for r in replies] == [200] * 6
  assert [r.json()['output_ids'] for r in replies] == alone


def test_a_row_failing_inside_the_batched_call_fails_alone(service, contexts, processor):
  """A row that passes the door but raises in the sampler (a split pad run given straight to the service): the
  batch is bisected, only that row's request fails, its five batch-mates match their answers alone."""
  def row(context, cap=4):
    return Row(context=engine_lib.as_context(context), max_new_tokens=cap, temperature=0.0, top_p=1.0,
               stop=(), stop_token_ids=frozenset(), return_logprob=True)
  ids, refs = contexts[2]
  start = int(np.flatnonzero(ids == VS)[0])
  split = np.concatenate([ids[:start + 3], [500], ids[start + 3:]]).astype(np.int32)   # VS P P 500 P P VE
  good = [row(contexts[0]), row(contexts[1]), row(contexts[2]), row((contexts[0][0][:6], [])),
          row((contexts[1][0][:5], []), cap=2)]
  alone = [service.submit_rows([r]).result(timeout=120)[0]['ids'] for r in good]
  before = dict(service.stats)
  futures = [service.submit_rows([r]) for r in good[:2] + [row((split, refs))] + good[2:]]   # all waiting together
  with pytest.raises(ValueError, match='needs 4 image tokens'):
    futures.pop(2).result(timeout=120)
  assert [f.result(timeout=120)[0]['ids'] for f in futures] == alone
  assert service.stats['failed_rows'] - before['failed_rows'] == 1
  assert service.stats['isolation_retries'] > before['isolation_retries']


def test_a_failing_row_of_a_job_larger_than_the_free_room_is_answered_once(tiny_model, tokenizer, processor,
                                                                          contexts, tmp_path):
  """max_batch=2 and a 3-row job whose second row fails inside the batched prefill: the job gets that one error
  (never re-admitted from row 0, never answered twice); a weight update that cannot even be resolved (a NUL byte
  in the path) is a (False, why); the worker keeps serving after both."""
  sampler = jax_sampler.JaxSampler(tiny_model, tokenizer, image_processor=processor, max_new_tokens=NEW,
                                   temperature=0.0, max_len=MAX_LEN, bucket=BUCKET)
  svc = service_lib.SamplerService(sampler, tokenizer, processor, model_path='tiny', weight_version='0', max_batch=2,
                                   default_max_new_tokens=NEW, weights_roots=auth.WeightsRoots([str(tmp_path)]))
  try:
    ids, refs = contexts[2]
    start = int(np.flatnonzero(ids == VS)[0])
    split = np.concatenate([ids[:start + 3], [500], ids[start + 3:]]).astype(np.int32)
    row = lambda c: Row(context=engine_lib.as_context(c), max_new_tokens=3, temperature=0.0, top_p=1.0,
                        stop=(), stop_token_ids=frozenset(), return_logprob=True)
    with pytest.raises(ValueError, match='needs 4 image tokens'):
      svc.submit_rows([row(contexts[0]), row((split, refs)), row(contexts[1])]).result(timeout=120)
    ok, message = svc.submit_update({'model_path': str(tmp_path) + '/x\x00'}).result(timeout=60)
    assert not ok and 'bad model_path' in message, message
    (alone,) = svc.submit_rows([row(contexts[1])]).result(timeout=120)
    assert len(alone['ids']) == 3 and svc.weight_version == '0'
    assert svc.submit_rows([]).result(timeout=5) == []
  finally:
    svc.close()


G = {'input_ids': [1, 2, 3]}   # a valid /generate body
CHAT = [{'role': 'user', 'content': 'hello'}]


def sp(**kw):
  return {**G, 'sampling_params': kw}


GENERATE_REFUSALS = [
    (sp(stop=5), 'sampling_params.stop must'),
    (sp(stop=['a', '']), 'sampling_params.stop must'),
    (sp(stop_token_ids=5), 'sampling_params.stop_token_ids must'),
    (sp(stop_token_ids=[1, 'a']), 'sampling_params.stop_token_ids[1]'),
    (sp(stop_token_ids=[-1]), 'sampling_params.stop_token_ids[0]'),
    (sp(temperature=-0.5), 'sampling_params.temperature'),
    (sp(temperature='hot'), 'sampling_params.temperature'),
    (sp(top_p=0), 'sampling_params.top_p'),
    (sp(top_p=1.5), 'sampling_params.top_p'),
    (sp(top_k=20), 'sampling_params.top_k'),
    (sp(top_k='x'), 'sampling_params.top_k'),
    (sp(n=2), 'sampling_params.n'),
    (sp(n=True), 'sampling_params.n'),
    (sp(min_p=0.1), 'sampling_params.min_p'),
    (sp(max_new_tokens=-1), 'sampling_params.max_new_tokens must be an integer >= 1'),
    (sp(max_new_tokens=0), 'sampling_params.max_new_tokens must be an integer >= 1'),
    (sp(max_new_tokens=2.5), 'sampling_params.max_new_tokens must'),
    (sp(logit_bias={'500': -1e4}), 'sampling_params.logit_bias[500]'),          # a ban of a non-vision id
    (sp(logit_bias={str(PAD): 5.0}), f'sampling_params.logit_bias[{PAD}]'),      # a boost, not a ban
    (sp(logit_bias={'x': -1e4}), "sampling_params.logit_bias: key 'x'"),
    (sp(logit_bias=[PAD]), 'sampling_params.logit_bias must be an object'),
    (sp(logit_bias={'\u00b2': -1e4}), 'is not a token id'),                  # '²'.isdigit() is True
    (sp(logit_bias={str(PAD): -10 ** 400}), f'sampling_params.logit_bias[{PAD}] must be a finite number'),
    (sp(logit_bias={str(PAD): None}), f'sampling_params.logit_bias[{PAD}] must be a finite number'),
    (sp(temperature=10 ** 400), 'sampling_params.temperature'),              # beyond float range
    (sp(max_new_tokens=10**9), f'sampling_params.max_new_tokens=1000000000 is above the server limit '
                               f'--max_new_tokens_limit={LIMIT_NEW}'),
    (sp(skip_special_tokens='no'), 'sampling_params.skip_special_tokens'),
    (sp(no_stop_trim=1), 'sampling_params.no_stop_trim'),
    (sp(sampling_seed='x'), 'sampling_params.sampling_seed'),
    (sp(spaces_between_special_tokens='x'), 'sampling_params.spaces_between_special_tokens'),
    (sp(stream_interval=0), 'sampling_params.stream_interval'),
    (sp(bogus=1), "unknown sampling_params field 'bogus'"),
    ({**G, 'sampling_params': 5}, 'sampling_params must be an object'),
    ({**G, 'sampling_params': [{}]}, 'sampling_params must be an object'),
    ({'input_ids': [[1, 2], [3]], 'sampling_params': [{}, {'top_p': 2}]}, 'sampling_params[1].top_p'),
    ({'input_ids': [[1, 2], [3]], 'sampling_params': [{}]}, 'sampling_params has 1 entries for 2 rows'),
    ({'input_ids': ['a']}, "input_ids[0]='a' is not a token id"),
    ({'input_ids': [1, -1]}, 'input_ids[1]=-1 is not a token id'),
    ({'input_ids': [1, True]}, 'input_ids[1]=True is not a token id'),
    ({'input_ids': [1, 2.0]}, 'input_ids[1]=2.0 is not a token id'),
    ({'input_ids': [tj.VOCAB_SIZE]}, f'input_ids[0]={tj.VOCAB_SIZE} is not a token id'),
    ({'input_ids': []}, 'input_ids must be a non-empty list'),
    ({'input_ids': 5}, 'input_ids must be a non-empty list'),
    ({'input_ids': [[1, 2], 3]}, 'input_ids[1] must be a non-empty list'),
    ({'input_ids': [[1, 2], [1, 'x']]}, "input_ids[1][1]='x' is not a token id"),
    ({'input_ids': [1, 2], 'text': 'hello'}, "field 'text' is not supported"),
    ({**G, 'image_data': 5}, 'image_data must be a string or a list'),
    ({**G, 'image_data': [5]}, 'image_data[0] must be a base64 string'),
    ({**G, 'image_data': ['http://example.com/a.png']}, 'image_data[0]: osvl_jax.serve does not fetch'),
    ({**G, 'image_data': ['iVBORw0KGgo=']}, 'image_data[0]'),
    ({'input_ids': [[1], [2]], 'image_data': [None]}, 'image_data must hold one entry per row (2)'),
    ({**G, 'return_logprob': 'yes'}, 'return_logprob must be true or false'),
    ({**G, 'return_text_in_logprobs': 1}, 'return_text_in_logprobs must be true or false'),
    ({**G, 'rid': 5}, 'rid must be a string'),
    ({'input_ids': [[1], [2]], 'rid': ['a', 5]}, 'rid[1] must be a string'),
    ({**G, 'stream': 'yes'}, 'stream must be true or false'),
    ({**G, 'stream': True}, 'stream=true is not supported'),
    ({**G, 'logprob_start_len': 3}, 'logprob_start_len=3'),
    ({**G, 'top_logprobs_num': 'x'}, 'top_logprobs_num must be an integer >= 0'),
    ({**G, 'top_logprobs_num': 2}, 'top_logprobs_num > 0 is not supported'),
    ({**G, 'modalities': 5}, 'modalities must be a list of strings'),
    ({**G, 'log_metrics': 'x'}, 'log_metrics must be true or false'),
    ({'input_ids': list(range(100, 100 + MAX_LEN))},
     f'input_ids: the prompt has {MAX_LEN} tokens; with at least 1 new token it needs {MAX_LEN + 1}, more than the '
     f'context length of {MAX_LEN} tokens'),
    ({'input_ids': [[1, 2], list(range(100, 400))]}, 'input_ids[1]: the prompt has 300 tokens'),
    # image spans (the image item is added by the test: 64x64, 4 pads)
    ({'input_ids': [1, VS, PAD, PAD, PAD, PAD, 7]}, 'found 4 then id 7 at position 6'),
    ({'input_ids': [1, VS, PAD, PAD, PAD, VE, PAD]}, 'found 3 then id'),
    ({'input_ids': [1, PAD, PAD, PAD, PAD]}, '0 <|vision_start|> tokens for 1 image'),
    ({'input_ids': [1, VS, PAD, VE, tj.VIDEO_PAD_ID]}, f'vision token {tj.VIDEO_PAD_ID} at position 7 lies outside'),
    ({'input_ids': [1, VS, PAD, VE, VE]}, f'vision token {VE} at position 7 lies outside'),
    ({'input_ids': [1, VS, PAD, PAD, VE]}, 'input_ids hold 2 <|image_pad|> but 1 image(s)'),
]


@pytest.mark.parametrize('body, match', GENERATE_REFUSALS)
def test_generate_refusals_name_the_field(url, image_item, body, match):
  ids = body['input_ids'] if isinstance(body['input_ids'], list) else []
  if 'image_data' not in body and any(i in (VS, PAD) for i in ids if isinstance(i, int)):
    body = {**body, 'image_data': [image_item]}
  resp = httpx.post(url + '/generate', json=body, timeout=60)
  assert resp.status_code == 400, resp.text
  assert match in resp.json()['error']['message']


def chat(**kw):
  return {'messages': CHAT, **kw}


CHAT_REFUSALS = [
    ({'messages': [5]}, 'messages[0] must be an object'),
    ({'messages': 'hi'}, 'messages must be a non-empty list'),
    ({'messages': []}, 'messages must be a non-empty list'),
    ({}, 'messages must be a non-empty list'),
    ({'messages': [{'role': 'tool', 'content': 'x'}]}, 'messages[0].role must be one of'),
    ({'messages': [{'role': 'user', 'content': 5}]}, 'messages[0].content must be a string or a list'),
    ({'messages': [{'role': 'user', 'content': [{'type': 'text', 'text': 5}]}]}, 'messages[0].content[0].text'),
    ({'messages': [{'role': 'user', 'content': [{'type': 'audio'}]}]}, 'messages[0].content[0] must be a text'),
    ({'messages': [{'role': 'user', 'content': ['hi']}]}, 'messages[0].content[0] must be a text'),
    ({'messages': [{'role': 'user', 'content': [{'type': 'image_url', 'image_url': 5}]}]},
     'messages[0].content[0].image_url must be a string'),
    ({'messages': [{'role': 'user', 'content': [{'type': 'image_url', 'image_url': {'url': 'data:image/png;base64,'
                                                                                        'AAAA'}}]}]},
     'messages[0].content[0].image_url'),
    ({'messages': [{'role': 'assistant', 'content': 'hi'}]}, 'must start with a user message'),
    ({'messages': CHAT + [{'role': 'system', 'content': 'x'}]}, 'messages[1]: a system message must come first'),
    (chat(max_tokens=0), 'max_tokens must be an integer >= 1'),
    (chat(max_tokens='x'), 'max_tokens must be an integer >= 1'),
    (chat(max_completion_tokens=10**9), f'max_completion_tokens=1000000000 is above the server limit '
                                        f'--max_new_tokens_limit={LIMIT_NEW}'),
    (chat(temperature=-1), 'temperature must be'),
    (chat(top_p=2), 'top_p must be'),
    (chat(stop=5), 'stop must be'),
    (chat(n=2), 'n=2 is not supported'),
    (chat(n='x'), 'n must be an integer'),
    (chat(stream=True), 'stream=true is not supported'),
    (chat(model=5), 'model must be a string'),
    (chat(seed='x'), 'seed must be an integer'),
    (chat(tools=[{'type': 'function'}]), "field 'tools' is not supported"),
    ({'messages': [{'role': 'user', 'content': 'word ' * 400}]}, 'messages: the prompt has'),
]


@pytest.mark.parametrize('body, match', CHAT_REFUSALS)
def test_chat_refusals_name_the_field(url, body, match):
  resp = httpx.post(url + '/v1/chat/completions', json=body, timeout=60)
  assert resp.status_code == 400, resp.text
  assert match in resp.json()['error']['message']


@pytest.mark.parametrize('content, match', [
    ('"\\ud800"', 'messages[0].content is not valid Unicode'),
    ('[{"type": "text", "text": "a\\udfffb"}]', 'messages[0].content[0].text is not valid Unicode')])
def test_chat_text_with_a_lone_surrogate_is_a_400(url, content, match):
  """JSON escapes of lone surrogates decode to strings the tokenizer refuses: a 400 naming the field, not a 500."""
  body = '{"messages": [{"role": "user", "content": %s}]}' % content
  resp = httpx.post(url + '/v1/chat/completions', content=body.encode(), timeout=60)
  assert resp.status_code == 400 and match in resp.json()['error']['message'], resp.text


def test_body_limits_and_serving_after_refusals(url, contexts):
  """A body over --max_body_bytes is a 413 (announced by Content-Length or streamed chunked); a non-JSON body a
  400; afterwards the server still answers valid /generate and chat requests."""
  big = b'{"input_ids": [' + b'1, ' * (BODY // 3) + b'1]}'
  resp = httpx.post(url + '/generate', content=big, timeout=60)
  assert resp.status_code == 413 and f'--max_body_bytes={BODY}' in resp.json()['error']['message']
  chunks = (big[k:k + 65536] for k in range(0, len(big), 65536))   # no Content-Length: chunked
  resp = httpx.post(url + '/v1/chat/completions', content=chunks, timeout=60)
  assert resp.status_code == 413 and 'max_body_bytes' in resp.json()['error']['message']
  resp = httpx.post(url + '/generate', content=b'{"input_ids": [1,', timeout=60)
  assert resp.status_code == 400 and 'not JSON' in resp.json()['error']['message']
  ok = httpx.post(url + '/generate', json=generate_body(contexts[0][0], max_new=3), timeout=120)
  assert ok.status_code == 200 and len(ok.json()['output_ids']) == 3
  ok = httpx.post(url + '/v1/chat/completions', json=chat(max_tokens=2, temperature=0), timeout=120)
  assert ok.status_code == 200 and ok.json()['usage']['completion_tokens'] == 2
  # As SGLangEngine sends them.
  bans = {'max_new_tokens': 3, 'temperature': 0, 'logit_bias': dict(protocol.VISION_LOGIT_BIAS)}
  ok = httpx.post(url + '/generate', json={**generate_body(contexts[0][0]), 'sampling_params': bans}, timeout=120)
  assert ok.status_code == 200 and len(ok.json()['output_ids']) == 3
  batch = {'input_ids': [[1, 2], [3, 4]], 'rid': ['a', 'b'], 'sampling_params': {'max_new_tokens': 1}}
  assert [o['meta_info']['id'] for o in httpx.post(url + '/generate', json=batch, timeout=120).json()] == ['a', 'b']
  info = httpx.get(url + '/server_info', timeout=30).json()['request_limits']
  assert info['max_new_tokens_limit'] == LIMIT_NEW and info['context_length'] == MAX_LEN
  assert info['max_body_bytes'] == BODY
