"""Token budgets of the agent loop: per-turn max_new_tokens, per-trajectory max_total_tokens, and stop_reason."""

import numpy as np

from osvl_jax import trajectory as tj
from osvl_jax.rollout import agent_loop
from osvl_jax.rollout import engine as engine_lib

CROP = tj.render_assistant_text('Zoom in.', tool_call={'name': 'crop', 'arguments': {
    'image': 'img_1', 'x': 0, 'y': 0, 'width': 48, 'height': 40}})
SHARPEN = tj.render_assistant_text('Sharpen it.', tool_call={'name': 'sharpen', 'arguments': {'image': 'img_2'}})
UNKNOWN = tj.render_assistant_text('Browse.', tool_call={'name': 'browse', 'arguments': {}})
ANSWER = tj.render_assistant_text('Done.', response='Agra')


def _run(tokenizer, env, make_builder, script, engine=None, **kw):
  image = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
  item = {'prompt_id': 'q0', 'question': 'Where is this?', 'image': image, 'answers': ['Agra']}
  engine = engine or engine_lib.ScriptedEngine(script, tokenizer)
  return agent_loop.run_episodes(engine, env, make_builder, [item], **{'max_turns': 4, **kw})[0]


def test_a_turn_cut_at_max_new_tokens_is_kept_but_never_executed(tokenizer, env, make_builder):
  ids = tokenizer.encode(CROP, add_special_tokens=False)
  limit = len(ids) - 1  # cut just before '</tool_call>': the JSON alone would be readable
  assert tj.parse_action(tokenizer.decode(ids[:limit])).kind == 'tool_call'
  traj = _run(tokenizer, env, make_builder, [CROP, ANSWER], max_new_tokens=limit)
  step = traj.steps[0]
  assert step.action.kind == 'malformed' and 'max_new_tokens' in step.action.error
  assert step.result.error_kind == 'malformed_call' and not step.format_ok
  assert len(traj.images) == 1  # the crop never ran
  emitted = np.flatnonzero(traj.step_of_token == 0)
  np.testing.assert_array_equal(traj.token_ids[emitted[:limit]], ids[:limit])
  assert traj.gen_mask[emitted[:limit]].all() and traj.token_ids[emitted[limit]] == tj.IM_END_ID
  assert not traj.gen_mask[emitted[limit]]  # the closing <|im_end|> was not emitted by the policy
  assert tj.check_trajectory(traj) == []


def test_the_total_budget_always_ends_at_a_whole_step(tokenizer, env, make_builder):
  full = _run(tokenizer, env, make_builder, [CROP, SHARPEN, ANSWER])
  assert full.stop_reason == 'response' and not full.truncated and len(full.images) == 3
  boundaries = [int(np.flatnonzero(full.step_of_token == l)[-1]) + 1 for l in range(-1, 3)]
  for budget in range(boundaries[0] + 1, full.num_tokens + 3, 7):
    cut = _run(tokenizer, env, make_builder, [CROP, SHARPEN, ANSWER], max_total_tokens=budget)
    assert cut.num_tokens <= budget and cut.num_tokens in boundaries and tj.check_trajectory(cut) == []
    np.testing.assert_array_equal(cut.token_ids, full.token_ids[:cut.num_tokens])
    assert len(cut.images) == int(np.sum(cut.token_ids == tj.VISION_START_ID))
    want = 'response' if cut.num_tokens == full.num_tokens else 'token_budget'
    assert cut.stop_reason == want and cut.truncated == (want == 'token_budget')


def test_an_observation_over_the_budget_is_dropped_even_when_it_would_be_fatal(tokenizer, env, make_builder):
  full = _run(tokenizer, env, make_builder, [UNKNOWN], fatal_k=2)
  assert full.fatal_step == 0 and full.stop_reason == 'fatal' and len(full.steps) == 2
  cut = _run(tokenizer, env, make_builder, [UNKNOWN], fatal_k=2, max_total_tokens=full.num_tokens - 1)
  assert cut.num_tokens < full.num_tokens and len(cut.steps) == 1
  assert cut.stop_reason == 'token_budget' and cut.fatal_step is None


def test_stop_reasons(tokenizer, env, make_builder):
  assert _run(tokenizer, env, make_builder, [CROP], max_turns=2).stop_reason == 'max_turns'

  class FullEngine(engine_lib.Engine):
    def generate(self, contexts, max_new_tokens=None, stop=None, sampling=None):
      return [engine_lib.Generation(np.zeros(0, np.int32), np.zeros(0, np.float32), '', 'length')
              for _ in contexts]

  traj = _run(tokenizer, env, make_builder, [], engine=FullEngine())
  assert traj.stop_reason == 'context_full' and traj.truncated and traj.steps == []


def test_without_stop_at_fatal_the_episode_runs_on_and_keeps_its_first_cascade(tokenizer, env, make_builder):
  """stop_at_fatal=False (the paper's "blind" baseline): the episode goes past its fatal cascade to its answer;
  fatal_step stays the first cascade's step, even when a second cascade follows, so the masks are unchanged."""
  script = [UNKNOWN, UNKNOWN, CROP, UNKNOWN, UNKNOWN, ANSWER]
  stopped = _run(tokenizer, env, make_builder, script, fatal_k=2, max_turns=8)
  assert (stopped.stop_reason, stopped.fatal_step, len(stopped.steps)) == ('fatal', 0, 2)
  blind = _run(tokenizer, env, make_builder, script, fatal_k=2, max_turns=8, stop_at_fatal=False)
  assert (blind.stop_reason, blind.fatal_step, len(blind.steps)) == ('response', 0, 6)
  assert blind.final_response == 'Agra' and len(blind.images) == 2 and tj.check_trajectory(blind) == []
  np.testing.assert_array_equal(blind.token_ids[:stopped.num_tokens], stopped.token_ids)  # the same first steps


def _response_tokens(traj) -> int:
  return traj.num_tokens - int(np.sum(traj.step_of_token == -1))


def test_the_response_budget_counts_turns_and_observations_and_ends_at_a_whole_step(tokenizer, env, make_builder):
  """max_response_tokens (verl's multi-turn response length) counts every token after the prompt: the policy's
  turns and the observations (tool text, image spans). A budget that ends exactly where step 1 ends keeps steps 0-1
  with exactly that many response tokens; one token less keeps step 0 only; the prompt's length does not count."""
  full = _run(tokenizer, env, make_builder, [CROP, SHARPEN, ANSWER])
  prompt = int(np.sum(full.step_of_token == -1))
  ends = [int(np.flatnonzero(full.step_of_token == l)[-1]) + 1 - prompt for l in range(3)]   # response per step
  assert ends[0] > int(np.sum(full.gen_mask[full.step_of_token == 0])) + 16   # step 0's observation counts (an image)
  cut = _run(tokenizer, env, make_builder, [CROP, SHARPEN, ANSWER], max_response_tokens=ends[1])
  assert (len(cut.steps), _response_tokens(cut), cut.stop_reason) == (2, ends[1], 'token_budget')
  np.testing.assert_array_equal(cut.token_ids, full.token_ids[:prompt + ends[1]])
  assert tj.check_trajectory(cut) == []
  short = _run(tokenizer, env, make_builder, [CROP, SHARPEN, ANSWER], max_response_tokens=ends[1] - 1)
  assert (len(short.steps), _response_tokens(short), short.stop_reason) == (1, ends[0], 'token_budget')
  whole = _run(tokenizer, env, make_builder, [CROP, SHARPEN, ANSWER], max_response_tokens=ends[2])
  assert (whole.stop_reason, _response_tokens(whole)) == ('response', ends[2])   # the answer ends at the budget
  # A longer prompt: the same response budget cuts at the same step; a total budget of the same size would not.
  image = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
  item = {'prompt_id': 'q1', 'question': 'Where is this? ' * 20, 'image': image, 'answers': ['Agra']}
  run = lambda **kw: agent_loop.run_episodes(engine_lib.ScriptedEngine([CROP, SHARPEN, ANSWER], tokenizer), env,
                                             make_builder, [item], max_turns=4, **kw)[0]
  long = run(max_response_tokens=ends[1])
  assert int(np.sum(long.step_of_token == -1)) > prompt + 40
  assert (len(long.steps), _response_tokens(long)) == (2, ends[1])
  assert len(run(max_total_tokens=prompt + ends[1]).steps) < 2


def test_the_turn_asked_for_is_capped_at_the_response_room(tokenizer, env, make_builder):
  """The last turn is asked for at most the tokens left under max_response_tokens (and max_new_tokens)."""
  caps = []

  class Recording(engine_lib.ScriptedEngine):
    def generate(self, contexts, max_new_tokens=None, stop=None, sampling=None):
      caps.append(max_new_tokens)
      return super().generate(contexts, max_new_tokens, stop, sampling)

  full = _run(tokenizer, env, make_builder, [CROP, ANSWER])
  prompt = int(np.sum(full.step_of_token == -1))
  after_step_0 = int(np.flatnonzero(full.step_of_token == 0)[-1]) + 1 - prompt
  _run(tokenizer, env, make_builder, [CROP, ANSWER], engine=Recording([CROP, ANSWER], tokenizer),
       max_response_tokens=after_step_0 + 5, max_new_tokens=64)
  assert caps == [64, 5]


def test_a_prompt_over_its_budget_is_refused_and_told_apart(tokenizer, env, make_builder):
  full = _run(tokenizer, env, make_builder, [ANSWER])
  prompt = int(np.sum(full.step_of_token == -1))
  over = _run(tokenizer, env, make_builder, [ANSWER], max_prompt_tokens=prompt - 1)
  assert (over.stop_reason, over.steps) == ('error', []) and agent_loop.prompt_over_budget(over)
  assert f'prompt has {prompt} tokens' in over.error and 'max_prompt_tokens=' + str(prompt - 1) in over.error
  fits = _run(tokenizer, env, make_builder, [ANSWER], max_prompt_tokens=prompt)
  assert fits.stop_reason == 'response' and not agent_loop.prompt_over_budget(fits)
  item = {'prompt_id': 'thin', 'question': 'Where?', 'image': np.zeros((300, 1, 3), np.uint8), 'answers': []}
  refused = agent_loop.run_episodes(engine_lib.ScriptedEngine([ANSWER], tokenizer), env, make_builder, [item])[0]
  assert refused.stop_reason == 'error' and not agent_loop.prompt_over_budget(refused)   # an image, not the budget


def test_limits_room_and_prompt_limit_by_hand():
  limits = agent_loop.Limits(max_total_tokens=100, max_prompt_tokens=30, max_response_tokens=60)
  assert limits.prompt_limit() == 30
  assert limits.room(num_tokens=25, prompt_tokens=25) == 60     # the response budget binds
  assert limits.room(num_tokens=50, prompt_tokens=10) == 20     # 60 - 40 < 100 - 50
  assert limits.room(num_tokens=95, prompt_tokens=50) == 5      # the total binds
  assert agent_loop.Limits().room(10, 5) is None and agent_loop.Limits().prompt_limit() is None
  assert agent_loop.Limits(max_total_tokens=100).prompt_limit() == 99
  section = {'max_response_tokens': 0, 'max_prompt_tokens': 0, 'max_total_tokens': 0}
  assert agent_loop.Limits.from_config(section) == agent_loop.Limits()   # 0 = unlimited
  for name in ('max_response_tokens', 'max_prompt_tokens', 'max_total_tokens'):
    try:
      agent_loop.Limits(**{name: -3})
    except ValueError as e:
      assert f'{name} must be >= 1 or None' in str(e)
    else:
      raise AssertionError(name)
