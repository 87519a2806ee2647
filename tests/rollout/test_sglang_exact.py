"""SGLangEngine keeps trajectories exact against SGLang: the agent loop over a real HTTP socket to
`sglang_double.SGLangDouble` (a test double of SGLang 0.5.23 built from its documented /generate schema).

  * `meta_info.prompt_tokens` is checked against the context: a server that ran other ids is an engine error on
    that trajectory naming both counts (never a tool error, never a crash);
  * vision ids are banned in the request itself (`sampling_params.logit_bias`), which the double honours;
  * each image's data URL is encoded once per trajectory, the requests byte-identical to encoding per request.
"""

import gc

import httpx
import numpy as np
import pytest

from osvl_jax import trajectory as tj
from osvl_jax.rollout import agent_loop
from osvl_jax.rollout.remote import sglang_client as sc
from osvl_jax.rollout.remote import sglang_protocol
from tests.rollout.sglang_double import SGLangDouble

CROP = tj.render_assistant_text('Zoom in.', tool_call={'name': 'crop', 'arguments': {
    'image': 'img_1', 'x': 0, 'y': 0, 'width': 32, 'height': 16}})
NO_TOOL = tj.render_assistant_text('Try another tool.', tool_call={'name': 'nope', 'arguments': {}})
ANSWER = tj.render_assistant_text('I know it now.', response='Agra')
FOUR_TURNS = [CROP, NO_TOOL, NO_TOOL, ANSWER]  # 2 images: the input and the crop
PROCESSOR = tj.ImageProcessor(min_pixels=32 * 32, max_pixels=64 * 64)  # = conftest's make_builder


def _items(n):
  image = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
  return [{'prompt_id': f'q{k}', 'question': f'Question {k}: where?', 'image': image, 'answers': ['Agra']}
          for k in range(n)]


def _engine(url, tokenizer, **kw):
  return sc.SGLangEngine(url, tokenizer, max_new_tokens=64, temperature=0.0, retries=0, **kw)


def _rollout(engine, env, make_builder, n=2, g=1, max_turns=4):
  return agent_loop.run_episodes(engine, env, make_builder, _items(n), num_generations=g, max_turns=max_turns)


def test_correct_prompt_tokens_pass_and_every_request_is_sglangs_schema(tokenizer, env, make_builder):
  double = SGLangDouble(tokenizer, PROCESSOR, FOUR_TURNS)
  with double.serve() as url:
    trajs = _rollout(_engine(url, tokenizer), env, make_builder)
  assert [t.stop_reason for t in trajs] == ['response', 'response'] and all(t.error is None for t in trajs)
  assert [len(t.steps) for t in trajs] == [4, 4] and [len(t.images) for t in trajs] == [2, 2]
  assert all(tj.check_trajectory(t) == [] for t in trajs)
  # What the double ran is exactly each trajectory's prefix at each step: 8 requests, 8 prefixes.
  sent = sorted(b['input_ids'] for b in double.bodies)
  assert sent == sorted(_sent_prefix(t, k) for t in trajs for k in range(4))


def _sent_prefix(traj, step):
  """The input_ids of the request for `step` of `traj`: its prefix, one pad per image."""
  start = int(np.flatnonzero(np.asarray(traj.step_of_token) == step)[0])
  ids = traj.token_ids[:start]
  return sglang_protocol.collapse_image_pads(ids, traj.images[:int((ids == tj.VISION_START_ID).sum())])


@pytest.mark.parametrize('fault', ['drift +1', 'drift -3', 'another image size'])
def test_a_wrong_prompt_tokens_is_an_engine_error_naming_both_counts(tokenizer, env, make_builder, fault):
  if fault == 'another image size':  # the server's preprocessor_config differs: 16 pads per image, not 4
    double = SGLangDouble(tokenizer, tj.ImageProcessor(min_pixels=128 * 128, max_pixels=128 * 128), FOUR_TURNS)
  else:
    double = SGLangDouble(tokenizer, PROCESSOR, FOUR_TURNS, prompt_tokens_offset=int(fault.split()[1]))
  with double.serve() as url:
    engine = _engine(url, tokenizer)
    trajs = _rollout(engine, env, make_builder)
  for t in trajs:
    n = len(t.token_ids)  # the prompt: no step was appended
    want = n + (12 if fault == 'another image size' else int(fault.split()[1]))
    assert t.stop_reason == 'error' and t.steps == [] and len(t.images) == 1
    assert t.error.startswith('engine SGLangEngine failed at step 0: EngineError: prompt_mismatch: ')
    assert f'prompt_tokens={want} but the context has {n} tokens (sent as {n - 3} input_ids' in t.error
    assert tj.check_trajectory(t) == []
  assert engine.stats['requests'] == 2  # not retried: the same server would run the same ids


def test_a_missing_prompt_tokens_is_a_bad_response(tokenizer):
  engine = _engine('http://a:1', tokenizer)
  answer = {'output_ids': [5], 'meta_info': {'finish_reason': {'type': 'length', 'length': 1},
                                             'output_token_logprobs': [[-1.0, 5, None]]}}
  with pytest.raises(sglang_protocol.EngineError) as e:
    engine.parse_response(answer, prompt_len=7)
  assert e.value.kind == sglang_protocol.ERROR_RESPONSE and 'meta_info.prompt_tokens=None' in str(e.value)
  answer['meta_info']['prompt_tokens'] = 7
  assert engine.parse_response(answer, prompt_len=7).ids.tolist() == [5]


VISION_TURN = tj.render_assistant_text('I see <|vision_start|><|image_pad|><|vision_end|> here.', response='Agra')


def test_vision_ids_are_banned_in_the_request_and_the_double_honours_it(tokenizer, env, make_builder):
  double = SGLangDouble(tokenizer, PROCESSOR, [VISION_TURN])
  with double.serve() as url:
    engine = _engine(url, tokenizer)
    (traj,) = _rollout(engine, env, make_builder, n=1, max_turns=1)
    (body,) = double.bodies  # parsed as strict JSON, as SGLang's orjson does: a finite bias, no -Infinity
    bias = body['sampling_params']['logit_bias']
    banned = sglang_protocol.BANNED_LOGIT_BIAS
    assert bias == {str(i): banned for i in tj.VISION_IDS} and banned <= -100
    assert set(tj.VISION_IDS) == {tj.VISION_START_ID, tj.VISION_END_ID, tj.IMAGE_PAD_ID, tj.VIDEO_PAD_ID}
    # The turn never holds a vision id, so it is a clean response (the 'x' the double falls back to instead).
    gen = np.asarray(traj.token_ids)[np.asarray(traj.gen_mask)]
    assert not np.isin(gen, tj.VISION_IDS).any() and traj.stop_reason == 'response'
    assert traj.steps[0].format_ok and traj.final_response == 'Agra'
    # The same body without the bias: the double emits the three vision ids the script asks for.
    unbiased = {**body, 'sampling_params': {k: v for k, v in body['sampling_params'].items() if k != 'logit_bias'}}
    out = httpx.post(url + '/generate', json=unbiased, timeout=30).json()
    assert np.isin(out['output_ids'], tj.VISION_IDS).sum() == 3
    no_ban = _engine(url, tokenizer, ban_vision_ids=False)
    assert 'logit_bias' not in no_ban.request_body((traj.token_ids[:5], []))['sampling_params']


def test_each_image_is_encoded_once_per_trajectory_and_requests_are_unchanged(tokenizer, env, make_builder,
                                                                             monkeypatch):
  calls = []
  encode = sglang_protocol.image_data_url

  def counting(image):
    calls.append(image)
    return encode(image)

  double = SGLangDouble(tokenizer, PROCESSOR, FOUR_TURNS)
  with double.serve() as url:
    engine = _engine(url, tokenizer)
    monkeypatch.setattr(sglang_protocol, 'image_data_url', counting)
    (traj,) = _rollout(engine, env, make_builder, n=1)
    monkeypatch.setattr(sglang_protocol, 'image_data_url', encode)
  assert traj.stop_reason == 'response' and len(traj.steps) == 4 and len(traj.images) == 2
  assert len(double.bodies) == 4 and [len(b['image_data']) for b in double.bodies] == [1, 2, 2, 2]
  assert len(calls) == 2 and calls[0] is traj.images[0] and calls[1] is traj.images[1]
  assert len(engine.image_urls) == 2
  # Byte for byte what encoding every image on every request (the client before the cache) sends.
  for k, raw in enumerate(double.requests):
    start = int(np.flatnonzero(np.asarray(traj.step_of_token) == k)[0])
    n_images = int((traj.token_ids[:start] == tj.VISION_START_ID).sum())
    expected = engine.request_body((traj.token_ids[:start], traj.images[:n_images]),
                                   double.bodies[k]['sampling_params']['max_new_tokens'])
    expected['image_data'] = [encode(im) for im in traj.images[:n_images]]
    assert expected['input_ids'] == _sent_prefix(traj, k)
    assert raw == httpx.Request('POST', url, json=expected).content
  # The cache goes with the trajectory.
  del traj
  calls.clear()
  gc.collect()
  assert len(engine.image_urls) == 0


def test_the_cache_re_encodes_replaced_pixels_and_never_caches_raw_arrays():
  cache = sglang_protocol.DataURLCache()
  rng = np.random.default_rng(3)
  ref = PROCESSOR.process(rng.integers(0, 256, (40, 40, 3), dtype=np.uint8))
  first = cache.url(ref)
  assert cache.url(ref) is first and first == sglang_protocol.image_data_url(ref)
  ref.pixels = rng.integers(0, 256, (40, 40, 3), dtype=np.uint8)
  assert cache.url(ref) == sglang_protocol.image_data_url(ref) != first
  raw = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
  assert cache.url(raw) == sglang_protocol.image_data_url(raw) and len(cache) == 1
  with pytest.raises(ValueError, match='uint8'):
    cache.url(np.zeros((4, 4), np.uint8))
