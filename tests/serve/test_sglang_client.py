"""SGLangEngine without a model: SGLang's request schema, image placeholders, response parsing, retries, fallbacks."""

import json
import pathlib

import httpx
import numpy as np
import pytest

from osvl_jax import trajectory as tj
from osvl_jax.rollout import engine as engine_lib
from osvl_jax.rollout.remote import sglang_client as sc
from osvl_jax.rollout.remote import sglang_protocol as protocol
from osvl_jax.serve import request_fields, requests

SCHEMA = json.loads((pathlib.Path(__file__).with_name('sglang_schema.json')).read_text())


def _answer(ids, reason=None, version='7', request=None, pads_per_image=1):
  """SGLang's /generate answer (documented schema); `prompt_tokens` from `request`'s input_ids, each image's one
  pad expanded to `pads_per_image` as SGLang does."""
  reason = reason or {'type': 'stop', 'matched': ids[-1]}
  sent = json.loads(request.content)['input_ids'] if request is not None else []
  prompt_tokens = len(sent) + (pads_per_image - 1) * sent.count(tj.IMAGE_PAD_ID)
  return {'text': 'x', 'output_ids': ids, 'meta_info': {
      'id': 'r', 'finish_reason': reason, 'weight_version': version, 'prompt_tokens': prompt_tokens,
      'output_token_logprobs': [[-0.5 * (k + 1), i, None] for k, i in enumerate(ids)]}}


def _engine(tokenizer, handler, urls='http://a:1', **kw):
  kw = {'retries': 2, 'backoff': 0.0, **kw}
  return sc.SGLangEngine(urls, tokenizer, transport=httpx.MockTransport(handler), **kw)


def test_schema_fixture_is_sglang_0_5_23():
  assert SCHEMA['sglang_version'] == '0.5.23'
  assert {'input_ids', 'image_data', 'sampling_params', 'return_logprob'} <= set(SCHEMA['GenerateReqInput'])


def test_every_request_field_is_in_sglangs_dataclasses(tokenizer, contexts):
  sent = []

  def handler(request):
    sent.append((request.url.path, json.loads(request.content)))
    if request.url.path == '/generate':
      return httpx.Response(200, json=_answer([5, tj.IM_END_ID], request=request,
                                              pads_per_image=contexts[2][1][0].num_tokens))
    return httpx.Response(200, json={'success': True, 'message': 'ok', 'num_paused_requests': 0})

  engine = _engine(tokenizer, handler, stop=('</tool_call>',))
  engine.generate(contexts, max_new_tokens=4)
  engine.update_weights_from_disk('/ckpt/3', weight_version='3', flush_cache=True)
  gen_fields, sp_fields = set(SCHEMA['GenerateReqInput']), set(SCHEMA['SamplingParams'])
  bodies = [b for p, b in sent if p == '/generate']
  assert len(bodies) == 3 and 'image_data' in bodies[2]
  for body in bodies:
    assert set(body) <= gen_fields, set(body) - gen_fields
    assert set(body['sampling_params']) <= sp_fields, set(body['sampling_params']) - sp_fields
    assert body['sampling_params']['stop_token_ids'] == [tj.IM_END_ID, tj.ENDOFTEXT_ID]
  (update,) = [b for p, b in sent if p == '/update_weights_from_disk']
  assert set(update) <= set(SCHEMA['UpdateWeightFromDiskReqInput'])
  # The server's accepted fields are SGLang's too.
  assert set(requests.GENERATE_FIELDS) <= gen_fields
  assert set(request_fields.SAMPLING_FIELDS) | set(request_fields.SAMPLING_DEFAULT_ONLY) <= sp_fields


def test_image_pads_collapse_to_one_per_image_and_expand_back(contexts, processor):
  ids, (ref,) = contexts[2]
  sent = protocol.collapse_image_pads(ids, [ref])
  assert sent.count(tj.IMAGE_PAD_ID) == 1 and len(sent) == len(ids) - ref.num_tokens + 1
  np.testing.assert_array_equal(requests.expand_image_pads(sent, [ref]), ids)
  np.testing.assert_array_equal(requests.expand_image_pads(ids, [ref]), ids)  # already expanded: unchanged
  with pytest.raises(ValueError, match='needs'):
    protocol.collapse_image_pads(ids[:-6], [ref])  # a short run
  with pytest.raises(ValueError, match='image'):
    protocol.collapse_image_pads(ids, [])
  url = protocol.image_data_url(ref)
  assert url.startswith('data:image/png;base64,')
  np.testing.assert_array_equal(requests.decode_image(url), ref.pixels)  # lossless


def test_response_parsing(tokenizer):
  engine = _engine(tokenizer, lambda r: httpx.Response(200, json={}))
  gen = engine.parse_response(_answer([11, 12, tj.IM_END_ID]))
  assert gen.ids.tolist() == [11, 12, tj.IM_END_ID] and gen.finish_reason == engine_lib.FINISH_STOP
  np.testing.assert_allclose(gen.logprobs, [-0.5, -1.0, -1.5])
  assert gen.weight_version == '7' and isinstance(gen, engine_lib.Generation)
  assert engine.parse_response(_answer([1, 2], {'type': 'length', 'length': 2})).finish_reason == 'length'
  assert engine.parse_response(_answer([1, 2], {'type': 'stop', 'matched': '</x>'})).finish_reason == 'stop_string'
  with pytest.raises(protocol.EngineError) as e:
    engine.parse_response(_answer([1], {'type': 'abort', 'message': 'bye'}))
  assert e.value.kind == protocol.ERROR_ABORT
  bad = _answer([1, 2])
  bad['output_ids'] = [1, 3]
  with pytest.raises(protocol.EngineError, match='disagree'):
    engine.parse_response(bad)
  with pytest.raises(protocol.EngineError, match='output_token_logprobs'):
    engine.parse_response({'meta_info': {'finish_reason': {'type': 'length'}}})


def test_retries_5xx_then_succeeds_round_robin(tokenizer):
  hosts, calls = [], {'n': 0}

  def handler(request):
    hosts.append(request.url.host)
    calls['n'] += 1
    if calls['n'] <= 2:
      return httpx.Response(503, text='busy')
    return httpx.Response(200, json=_answer([3, tj.IM_END_ID], request=request))

  engine = _engine(tokenizer, handler, urls=['http://a:1', 'http://b:1'])
  (gen,) = engine.generate([(np.asarray([1, 2, 3], np.int32), [])])
  assert gen.ids.tolist() == [3, tj.IM_END_ID]
  assert hosts == ['a', 'b', 'a'] and engine.stats['retries'] == 2


@pytest.mark.parametrize('failure, kind', [
    (httpx.ConnectError('refused'), protocol.ERROR_CONNECTION),
    (httpx.ReadTimeout('slow'), protocol.ERROR_TIMEOUT),
    (httpx.Response(500, text='boom'), protocol.ERROR_HTTP)])
def test_gives_up_with_typed_engine_error(tokenizer, failure, kind):
  def handler(request):
    if isinstance(failure, Exception):
      raise failure
    return failure

  engine = _engine(tokenizer, handler, retries=2)
  with pytest.raises(protocol.EngineError) as e:
    engine.generate([(np.asarray([1, 2], np.int32), [])])
  assert e.value.kind == kind and e.value.attempts == 3


def test_4xx_is_not_retried(tokenizer):
  engine = _engine(tokenizer, lambda r: httpx.Response(400, json={'error': {'message': 'bad'}}))
  with pytest.raises(protocol.EngineError) as e:
    engine.generate([(np.asarray([1], np.int32), [])])
  assert e.value.status == 400 and e.value.attempts == 1


def test_refused_connection_on_a_real_socket(tokenizer):
  from tests.serve.conftest import free_port
  engine = sc.SGLangEngine(f'http://127.0.0.1:{free_port()}', tokenizer, retries=1, backoff=0.01, timeout=2)
  with pytest.raises(protocol.EngineError) as e:
    engine.generate([(np.asarray([1], np.int32), [])])
  assert e.value.kind == protocol.ERROR_CONNECTION and e.value.attempts == 2
  assert not engine.health()


def test_info_falls_back_to_deprecated_endpoints(tokenizer):
  def handler(request):
    if request.url.path in ('/model_info', '/server_info'):
      return httpx.Response(404)
    return httpx.Response(200, json={'path': request.url.path})

  engine = _engine(tokenizer, handler)
  assert engine.model_info() == {'path': '/get_model_info'}
  assert engine.server_info() == {'path': '/get_server_info'}


def test_a_retry_fails_over_to_the_url_after_the_failed_one(tokenizer):
  """Concurrent requests share the round-robin, yet each retry goes to the next URL, never the dead one again."""
  hosts = []

  def handler(request):
    hosts.append(request.url.host)
    if request.url.host == 'dead':
      raise httpx.ConnectError('refused')
    return httpx.Response(200, json=_answer([3, tj.IM_END_ID], request=request))

  engine = _engine(tokenizer, handler, urls=['http://live:1', 'http://dead:1'], retries=1)
  gens = engine.generate([(np.asarray([1, k], np.int32), []) for k in range(8)])
  assert [g.ids.tolist() for g in gens] == [[3, tj.IM_END_ID]] * 8
  assert hosts.count('dead') == 4 and hosts.count('live') == 8 and engine.stats['retries'] == 4
