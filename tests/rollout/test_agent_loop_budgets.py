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
