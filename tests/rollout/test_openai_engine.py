"""`OpenAIEngine`: contexts read back into OpenAI vision messages, replies tokenized into the ids the builder would
append, failures typed; through the agent loop, a token-exact trajectory. Real HTTP against a scripted API model."""

import numpy as np
import pytest

from osvl_jax import trajectory as tj
from osvl_jax.rollout import agent_loop, engine as engine_lib
from osvl_jax.rollout.remote import openai_engine, sglang_protocol
from tests.rollout.openai_double import ChatDouble, Reply, decode_image
from tools import base as tools_base

CALL = tj.render_assistant_text('Crop the top.', tool_call={'name': 'crop', 'arguments': {
    'image': 'img_1', 'x': 0, 'y': 0, 'width': 32, 'height': 16}})
ANSWER = tj.render_assistant_text('It is a river.', response='Tagus River')


def _pixels(h, w, seed):
  return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


@pytest.fixture()
def two_turns(make_builder):
  """A builder after a question with an image, a crop call and its observation holding a second image."""
  builder = make_builder()
  builder.start('Which river is this?', _pixels(64, 64, 0))
  builder.append_assistant_text(CALL)
  builder.append_observation(tools_base.ToolResult(ok=True, text='cropped region', images=[_pixels(32, 48, 1)]))
  return builder


def test_context_messages_read_back_every_turn_and_image(two_turns, tokenizer):
  messages = openai_engine.context_messages((two_turns.prompt_ids(), two_turns.images), tokenizer)
  assert [m['role'] for m in messages] == ['system', 'user', 'assistant', 'user']
  assert '<tools>' in messages[0]['content'] and '"crop"' in messages[0]['content']
  assert messages[2]['content'] == CALL
  user, observation = messages[1]['content'], messages[3]['content']
  assert [p['type'] for p in user] == ['text', 'image_url'] and user[0]['text'] == 'Which river is this?\nimg_1: '
  assert '<tool_response>' in observation[0]['text'] and 'cropped region' in observation[0]['text']
  sent = [decode_image(p['image_url']['url']) for m in (user, observation) for p in m if p['type'] == 'image_url']
  assert len(sent) == 2
  np.testing.assert_array_equal(sent[0], _pixels(64, 64, 0))
  np.testing.assert_array_equal(sent[1], _pixels(32, 48, 1))
  with pytest.raises(ValueError, match='2 image spans but 1 images'):
    openai_engine.context_messages((two_turns.prompt_ids(), two_turns.images[:1]), tokenizer)


def test_a_reply_becomes_the_ids_the_builder_appends_for_that_text(two_turns, tokenizer):
  double = ChatDouble(lambda body, n: ANSWER)
  with double.serve() as url:
    engine = openai_engine.OpenAIEngine(url, 'api-model', tokenizer, max_new_tokens=64, temperature=0.0)
    (gen,) = engine.generate([(two_turns.prompt_ids(), two_turns.images)])
  assert gen.ids.tolist() == tokenizer.encode(ANSWER, add_special_tokens=False) + [engine_lib.IM_END_ID]
  assert gen.logprobs is None and gen.finish_reason == 'stop' and gen.text == ANSWER
  (body,) = double.bodies
  assert (body['model'], body['max_tokens'], body['temperature'], body['top_p']) == ('api-model', 64, 0.0, 1.0)
  assert 'stop' not in body and len(double.images[0]) == 2
  assert engine.stats == {'requests': 1, 'errors': 0, 'prompt_tokens': 100, 'completion_tokens': 7}


def test_length_cut_and_reasoning_content(make_builder, tokenizer):
  replies = [Reply('<think>half', finish_reason='length'), Reply('<response>x</response>', reasoning_content='why'),
             Reply(ANSWER)]
  double = ChatDouble(lambda body, n: replies[n])
  builder = make_builder()
  builder.start('q', None)
  with double.serve() as url:
    engine = openai_engine.OpenAIEngine(url, 'm', tokenizer, max_new_tokens=64)
    cut, reasoned = (engine.generate([(builder.prompt_ids(), [])])[0] for _ in range(2))
    (capped,) = engine.generate([(builder.prompt_ids(), [])], max_new_tokens=3)
  assert cut.finish_reason == 'length' and cut.ids.tolist() == tokenizer.encode('<think>half')
  assert reasoned.text == '<think>\nwhy\n</think>\n<response>x</response>' and reasoned.ids[-1] == engine_lib.IM_END_ID
  assert capped.finish_reason == 'length' and capped.ids.tolist() == tokenizer.encode(ANSWER)[:3]
  assert double.bodies[2]['max_tokens'] == 3


def test_a_server_error_is_retried_and_a_client_error_is_not(make_builder, tokenizer):
  statuses = [503, 200, 400]
  double = ChatDouble(lambda body, n: Reply(ANSWER, status=statuses[n]))
  builder = make_builder()
  builder.start('q', None)
  with double.serve() as url:
    engine = openai_engine.OpenAIEngine(url, 'm', tokenizer, retries=1)
    (gen,) = engine.generate([(builder.prompt_ids(), [])])
    assert gen.text == ANSWER and len(double.bodies) == 2
    with pytest.raises(sglang_protocol.EngineError) as e:
      engine.generate([(builder.prompt_ids(), [])])
  assert e.value.kind == 'http_status' and e.value.status == 400 and len(double.bodies) == 3
  assert engine.stats['errors'] == 1


def test_the_agent_loop_records_a_token_exact_trajectory_of_the_api_model(make_builder, env, tokenizer):
  double = ChatDouble(lambda body, n: CALL if len(body['messages']) == 2 else ANSWER)
  with double.serve() as url:
    engine = openai_engine.OpenAIEngine(url, 'm', tokenizer, max_new_tokens=128)
    (traj,) = agent_loop.run_episodes(engine, env, make_builder, [
        {'prompt_id': 'p', 'question': 'Which river?', 'image': _pixels(64, 64, 0), 'answers': ['Tagus River']}],
        max_turns=4)
  assert tj.check_trajectory(traj) == []
  assert [s.action.kind for s in traj.steps] == ['tool_call', 'response'] and traj.steps[0].result.ok
  assert traj.final_response == 'Tagus River' and traj.rollout_logprobs is None and traj.stop_reason == 'response'
  assert [len(i) for i in double.images] == [1, 2]   # the crop's output went back to the model as an image
  # The record is what the builder renders for those texts.
  want = make_builder()
  want.start('Which river?', _pixels(64, 64, 0))
  want.append_assistant_text(CALL)
  want.append_observation(traj.steps[0].result)
  want.append_assistant_text(ANSWER)
  assert traj.token_ids.tolist() == want.finish().token_ids.tolist()


def test_native_tool_calls_are_read_back_into_the_turn(make_builder, tokenizer):
  """An endpoint whose tool parser returns `tool_calls` (content None): the call becomes the turn's `<tool_call>`,
  parsed by the builder; arguments that are not JSON stay in the turn as sent, so the step is malformed."""
  call = {'name': 'crop', 'arguments': '{"image": "img_1", "x": 0, "y": 0, "width": 0.5, "height": 0.5}'}
  replies = [Reply(None, tool_calls=[call]), Reply(None, tool_calls=[{'name': 'crop', 'arguments': 'x=0 y=0'}])]
  double = ChatDouble(lambda body, n: replies[n])
  with double.serve() as url:
    engine = openai_engine.OpenAIEngine(url, 'm', tokenizer, max_new_tokens=256)
    read, unreadable = [], []
    for out in (read, unreadable):
      builder = make_builder()
      builder.start('q', None)
      (gen,) = engine.generate([(builder.prompt_ids(), [])])
      out.append(builder.append_assistant(gen.ids, gen.logprobs))
  assert read[0].kind == 'tool_call' and read[0].name == 'crop' and read[0].arguments['width'] == 0.5
  assert unreadable[0].kind not in ('tool_call', 'response') and unreadable[0].error
