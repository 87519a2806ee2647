"""The agent loop with a scripted policy (ScriptedEngine) and the real ToolEnv: typed errors, fatal cascades,
responses, token exactness, batching, budgets."""


import numpy as np
import pytest

from osvl_jax import trajectory as tj
from osvl_jax.rollout import agent_loop
from osvl_jax.rollout import engine as engine_lib
from tools import base

IM_END = tj.IM_END_ID


def _call(name, arguments, think='Let me use a tool.'):
  return tj.render_assistant_text(think, tool_call={'name': name, 'arguments': arguments})


def _answer(text='Agra'):
  return tj.render_assistant_text('I know it now.', response=text)


CROP = _call('crop', {'image': 'img_1', 'x': 0, 'y': 0, 'width': 32, 'height': 16})
BAD_JSON = '<think>\nsearch\n</think>\n<tool_call>\n{"name": "crop", "arguments": {"image": \n</tool_call>'
UNKNOWN = _call('browse', {'url': 'https://example.org'})
MISSING_IMAGE = _call('crop', {'image': 'img_9', 'x': 0, 'y': 0, 'width': 8, 'height': 8})


def _item(prompt_id='q0', question='In which city is this building?'):
  image = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
  return {'prompt_id': prompt_id, 'question': question, 'image': image, 'answers': ['Agra']}


def _run(tokenizer, env, make_builder, script, items=None, **kw):
  engine = engine_lib.ScriptedEngine(script, tokenizer)
  kw = {'num_generations': 1, 'max_turns': 6, **kw}
  trajs = agent_loop.run_episodes(engine, env, make_builder, items or [_item()], **kw)
  return trajs, engine


def _kinds(traj):
  return [None if s.result is None else s.result.error_kind for s in traj.steps]


def test_bad_json_unknown_tool_and_missing_image_become_typed_errors(tokenizer, env, make_builder):
  (traj,), _ = _run(tokenizer, env, make_builder, [BAD_JSON, CROP, UNKNOWN, CROP, MISSING_IMAGE, _answer()])
  assert _kinds(traj) == ['malformed_call', None, 'unknown_tool', None, 'bad_arguments', None]
  for l in (0, 2, 4):
    assert traj.steps[l].result.ok is False and traj.steps[l].format_ok is False
  assert traj.steps[0].action.kind == 'malformed'
  assert 'Malformed tool call' in traj.steps[0].result.text and '<tool_call>' in traj.steps[0].result.text
  assert traj.fatal_step is None  # errors separated by successes never cascade
  assert traj.final_response == 'Agra'
  assert [s.format_ok for s in traj.steps] == [False, True, False, True, False, True]
  assert len(traj.images) == 3  # img_1 + the two crops
  assert tj.check_trajectory(traj) == []


def test_the_model_is_told_about_its_error_in_the_next_context(tokenizer, env, make_builder):
  (traj,), engine = _run(tokenizer, env, make_builder, [UNKNOWN, _answer()])
  second_context = tokenizer.decode(engine.calls[1][0].prompt_ids.tolist())
  assert "Unknown tool 'browse'" in second_context
  assert second_context.endswith('<|im_start|>assistant\n')


@pytest.mark.parametrize('index, expected', [('first', 0), ('kth', 2)])
def test_three_consecutive_errors_are_fatal_and_stop_the_episode(tokenizer, env, make_builder, index, expected):
  (traj,), engine = _run(tokenizer, env, make_builder, [CROP, BAD_JSON, UNKNOWN, MISSING_IMAGE, CROP, _answer()],
                         fatal_k=3, fatal_index=index)
  assert _kinds(traj) == [None, 'malformed_call', 'unknown_tool', 'bad_arguments']
  assert traj.fatal_step == expected + 1  # the run starts at step 1
  assert len(engine.calls) == 4 and traj.final_response is None
  assert traj.steps[-1].format_ok is False


def test_no_result_is_not_an_execution_error(tokenizer, make_builder):
  class NoResultEnv:
    def call(self, name, arguments, images):
      return base.error('no_result', 'No results.')
  (traj,), _ = _run(tokenizer, NoResultEnv(), make_builder, [CROP, CROP, CROP, CROP, _answer()], fatal_k=3)
  assert traj.fatal_step is None and traj.final_response == 'Agra'
  assert all(s.format_ok for s in traj.steps)


def test_a_response_ends_the_episode_with_final_response(tokenizer, env, make_builder):
  (traj,), engine = _run(tokenizer, env, make_builder, [_answer('Agra, India'), CROP])
  assert len(engine.calls) == 1 and len(traj.steps) == 1
  assert traj.final_response == 'Agra, India' and traj.steps[0].format_ok and traj.steps[0].result is None
  assert traj.token_ids[-1] == IM_END and traj.answers == ['Agra'] and traj.prompt_id == 'q0'


def test_token_ids_are_append_only_and_gen_mask_covers_exactly_the_scripted_ids(tokenizer, env, make_builder):
  script = [CROP, BAD_JSON, _call('sharpen', {'image': 'img_2'}), _answer()]
  (traj,), engine = _run(tokenizer, env, make_builder, script)
  contexts = [c[0].prompt_ids for c in engine.calls]
  for a, b in zip(contexts, contexts[1:] + [traj.token_ids]):
    assert np.array_equal(b[:len(a)], a)  # each context is a prefix of the next
  emitted = [tokenizer.encode(text, add_special_tokens=False) + [IM_END] for text in script]
  assert [g.ids.tolist() for g in engine.emitted] == emitted
  # The gen_mask runs are exactly the scripted ids, in order, one run per step, tagged with that step.
  runs = np.split(np.arange(traj.num_tokens), np.flatnonzero(np.diff(traj.gen_mask.astype(int))) + 1)
  gen_runs = [r for r in runs if traj.gen_mask[r[0]]]
  assert [traj.token_ids[r].tolist() for r in gen_runs] == emitted
  assert [set(traj.step_of_token[r].tolist()) for r in gen_runs] == [{0}, {1}, {2}, {3}]
  assert traj.gen_mask.sum() == sum(map(len, emitted))
  assert tj.check_trajectory(traj) == []


def test_malformed_outputs_never_raise(tokenizer, env, make_builder):
  garbage = ['', '<tool_call>{{{', '\x00\ufffd<|im_end|>', '<tool_call>[1, 2]</tool_call>',
             '<think>x</think><tool_call>{"name": 3, "arguments": "nope"}</tool_call>',
             '</think></think><response>']  # an unclosed, badly thought response still ends the episode
  (traj,), _ = _run(tokenizer, env, make_builder, lambda l, c: garbage[l], max_turns=10, fatal_k=99)
  assert len(traj.steps) == len(garbage)
  assert all(s.result.error_kind == 'malformed_call' and not s.result.ok for s in traj.steps[:-1])
  assert traj.steps[-1].action.kind == 'response' and not traj.steps[-1].format_ok
  assert tj.check_trajectory(traj) == []


def test_all_unfinished_episodes_share_one_generate_call_per_turn(tokenizer, env, make_builder):
  def script(step, context):  # q0 answers at once, q1 after one crop, q2 after two crops
    question = tokenizer.decode(context.prompt_ids.tolist())
    n = next(int(k) for k in '012' if f'question {k}' in question)
    return _answer() if step >= n else CROP
  items = [_item(f'q{k}', f'question {k}?') for k in range(3)]
  trajs, engine = _run(tokenizer, env, make_builder, script, items=items, num_generations=2)
  assert [len(c) for c in engine.calls] == [6, 4, 2]
  assert [(t.prompt_id, t.sample_index) for t in trajs] == [(f'q{k}', g) for k in range(3) for g in range(2)]
  assert [len(t.steps) for t in trajs] == [1, 1, 2, 2, 3, 3]
  assert all(t.final_response == 'Agra' for t in trajs)


def test_max_turns_truncates_and_the_last_step_is_not_format_ok(tokenizer, env, make_builder):
  (traj,), _ = _run(tokenizer, env, make_builder, [CROP], max_turns=2)
  assert len(traj.steps) == 2 and traj.final_response is None and traj.fatal_step is None
  assert [s.format_ok for s in traj.steps] == [True, False]


def test_token_budget_ends_at_the_last_whole_step(tokenizer, env, make_builder):
  (full,), _ = _run(tokenizer, env, make_builder, [CROP, CROP, _answer()])
  after_step = [int(np.flatnonzero(full.step_of_token == l)[-1]) + 1 for l in range(3)]
  budget = after_step[1] - 1  # step 1 (with its observation) does not fit
  (cut,), _ = _run(tokenizer, env, make_builder, [CROP, CROP, _answer()], max_total_tokens=budget)
  assert len(cut.steps) == 1 and cut.num_tokens == after_step[0] <= budget
  assert np.array_equal(cut.token_ids, full.token_ids[:after_step[0]])
  assert tj.check_trajectory(cut) == []


def test_engine_lengths_are_capped_by_the_budget(tokenizer, env, make_builder):
  long_answer = _answer('word ' * 200)
  builder = make_builder()
  builder.start(_item()['question'], _item()['image'])
  budget = builder.num_tokens + 50
  (traj,), engine = _run(tokenizer, env, make_builder, [long_answer], max_total_tokens=budget,
                         max_new_tokens=1000)
  assert engine.emitted[0].ids.size == 50  # the engine was asked for no more than the budget left
  assert len(traj.steps) == 0 and traj.num_tokens == budget - 50  # the cut step (+ its im_end) was dropped


def test_scripted_engine_counts_steps_from_the_context(tokenizer, make_builder):
  builder = make_builder()
  builder.start('q?', None)
  engine = engine_lib.ScriptedEngine(['a', 'b'], tokenizer)
  (gen,) = engine.generate([(builder.prompt_ids(), [])])
  assert gen.text == 'a' and gen.ids.tolist() == tokenizer.encode('a') + [IM_END]
  builder.append_assistant(gen.ids)
  builder.append_observation(base.ToolResult(ok=True, text='x'))
  assert engine.generate([(builder.prompt_ids(), [])])[0].text == 'b'
