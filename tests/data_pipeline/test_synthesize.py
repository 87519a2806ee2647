"""Oracle expert: real tool calls, process check, final response equal to the answer."""

import json

import numpy as np
import pytest

from data_pipeline import synthesize
from osvl_jax import paths as osvl_paths


@pytest.fixture(scope='module')
def oracle_run(graph, accepted_items):
  records, counts = synthesize.synthesize(accepted_items[:3], graph, osvl_paths.data_dir())
  return records, counts


def test_oracle_trajectory_searches_the_image_then_the_text_and_answers(oracle_run, accepted_items):
  from osvl_jax import trajectory as traj_lib
  records, counts = oracle_run
  assert counts['kept'] >= 1 and counts['kept'] + counts['rejected'] == counts['in']
  by_id = {r['prompt_id']: r for r in accepted_items}
  for rec in records:
    traj = traj_lib.Trajectory.from_record(rec)
    item = by_id[traj.prompt_id]
    names = [s.action.name for s in traj.steps[:-1]]
    assert names[0] == 'image_search' and traj.steps[0].action.arguments == {'image': 'img_1'}
    assert set(names[1:]) == {'text_search'} and len(names) - 1 >= item['hops'] + 1
    assert traj.steps[-1].action.kind == 'response'
    assert traj.final_response == item['answers'][0]
    assert all(s.format_ok for s in traj.steps)
    assert traj_lib.check_trajectory(traj) == []
    assert traj.question == item['question']


def test_process_check_each_hop_is_found_in_the_tool_results(oracle_run, accepted_items):
  from osvl_jax import trajectory as traj_lib
  records, _ = oracle_run
  by_id = {r['prompt_id']: r for r in accepted_items}
  for rec in records:
    traj = traj_lib.Trajectory.from_record(rec)
    path = by_id[traj.prompt_id]['path']
    texts = [s.result.text for s in traj.steps if s.result is not None]
    assert synthesize.contains_name(texts[0], path[0])  # image_search identifies v0
    joined = '\n'.join(texts[1:])
    for title in path[1:]:
      assert synthesize.contains_name(joined, title)
    assert synthesize.contains_answer(texts[-1], by_id[traj.prompt_id]['answers'])
    queries = [json.loads(s['arguments_json']).get('query', '') for s in rec['steps'][1:-1]]
    answers = by_id[traj.prompt_id]['answers']
    assert not any(synthesize.contains_answer(q, answers) for q in queries)  # Answers are found, never typed.


def test_assistant_turns_are_generated_tokens_observations_are_not(oracle_run):
  from osvl_jax import trajectory as traj_lib
  records, _ = oracle_run
  traj = traj_lib.Trajectory.from_record(records[0])
  gen = traj.gen_mask
  assert gen.sum() > 0 and (traj.step_of_token[gen] >= 0).all()
  assert not gen[traj.step_of_token < 0].any()


def test_observations_and_question_are_read_back_from_the_context():
  from osvl_jax import trajectory as traj_lib
  from tools import base as tools_base
  tokenizer = traj_lib.load_tokenizer()
  builder = traj_lib.TrajectoryBuilder(tokenizer, traj_lib.ImageProcessor(min_pixels=32 * 32, max_pixels=64 * 64),
                                       [])
  question = 'Which <|im_start|> city\nis this?'
  builder.start(question, np.full((40, 50, 3), 90, np.uint8))
  texts = ['Found it: </tool_response> <|im_end|> Agra\n', 'no text tools']
  images = [[np.zeros((40, 40, 3), np.uint8)], []]
  for text, ims in zip(texts, images):
    builder.append_assistant_text(traj_lib.render_assistant_text('t', tool_call={'name': 'crop', 'arguments': {}}))
    builder.append_observation(tools_base.ToolResult(ok=True, text=text, images=ims))
  assert synthesize._user_question(builder.prompt_ids(), tokenizer) == question
  assert synthesize.observations(builder.prompt_ids(), tokenizer) == [(texts[0], ('img_2',)), (texts[1], ())]


def test_one_oracle_engine_serves_a_batch_of_items_and_generations(oracle_run, accepted_items, graph):
  """Batched through `run_episodes` (G=2), the oracle writes the same trajectories as one item at a time."""
  from osvl_jax import trajectory as traj_lib
  from osvl_jax.rollout import agent_loop
  from tools import env as env_lib
  records, _ = oracle_run
  items = accepted_items[:3]
  data_dir = osvl_paths.data_dir()
  tokenizer = traj_lib.load_tokenizer(data_dir)
  env = env_lib.ToolEnv()
  processor = traj_lib.ImageProcessor()
  engine = synthesize.OracleEngine(items, graph, tokenizer)
  prompts = [agent_loop.Item(it['prompt_id'], it['question'], synthesize.load_image(data_dir, it['image_path']),
                             it['answers']) for it in items]
  trajs = agent_loop.run_episodes(engine, env, lambda: traj_lib.TrajectoryBuilder(tokenizer, processor, env.schemas()),
                                  prompts, num_generations=2, max_turns=max(map(synthesize.max_oracle_steps, items)))
  assert set(engine.outcomes) == {it['prompt_id'] for it in items}
  kept = {r['prompt_id']: r for r in records}
  assert {p for p, o in engine.outcomes.items() if o == 'ok'} == set(kept)
  for traj in trajs:
    assert traj.rollout_logprobs is None  # an expert has no distribution
    if traj.prompt_id in kept:
      assert traj.token_ids.tolist() == kept[traj.prompt_id]['token_ids']
      assert traj.gen_mask.tolist() == kept[traj.prompt_id]['gen_mask']
    else:
      assert traj.final_response == synthesize.GIVE_UP_RESPONSE


def test_oracle_gives_up_with_the_reason(graph, accepted_items):
  from osvl_jax import trajectory as traj_lib
  from tools import env as env_lib
  data_dir = osvl_paths.data_dir()
  item = dict(accepted_items[0], path=['No_Such_Article_Anywhere'] + list(accepted_items[0]['path'][1:]))
  tokenizer = traj_lib.load_tokenizer(data_dir)
  env = env_lib.ToolEnv()
  make_builder = lambda: traj_lib.TrajectoryBuilder(tokenizer, traj_lib.ImageProcessor(), env.schemas())
  traj, reason = synthesize.oracle_trajectory(item, synthesize.load_image(data_dir, item['image_path']), env,
                                              make_builder, graph, tokenizer)
  assert traj is None and reason == 'image_search: No_Such_Article_Anywhere not identified'
  with pytest.raises(ValueError, match='same question'):
    synthesize.OracleEngine([item, dict(item, prompt_id='other')], graph, tokenizer)


@pytest.mark.parametrize('kind,params,tool,arguments', [
    ('blur', {'blur': 'gaussian', 'sigma': 2.0, 'ksize': 13}, 'sharpen', {'image': 'img_1'}),
    ('downsample', {'factor': 3}, 'super_resolution', {'image': 'img_1', 'scale': 3}),
])
def test_a_degraded_item_is_repaired_before_the_image_search(graph, solvable_items, tmp_path, kind, params, tool,
                                                            arguments):
  """The first call is the paired repair tool on img_1; image_search then looks up its output, img_2."""
  from data_pipeline import degrade
  from osvl_jax import trajectory as traj_lib
  from tools import env as env_lib
  data_dir = osvl_paths.data_dir()
  item = solvable_items[0]
  original = synthesize.load_image(data_dir, item['image_path'])
  degraded = degrade.apply(original, kind, params)
  degrade.save_png(degraded, tmp_path / 'd.png')
  item = dict(item, image_path=str(tmp_path / 'd.png'),
              degradation={'kind': kind, 'params': json.dumps(params), 'repair_tool': tool})
  tokenizer = traj_lib.load_tokenizer(data_dir)
  env = env_lib.ToolEnv({'enabled': ('text_search', 'image_search', 'sharpen', 'super_resolution')})
  make_builder = lambda: traj_lib.TrajectoryBuilder(tokenizer, traj_lib.ImageProcessor(), env.schemas())
  image = synthesize.load_image(data_dir, item['image_path'])
  assert image.shape[0] == round(original.shape[0] / params.get('factor', 1))
  traj, reason = synthesize.oracle_trajectory(item, image, env, make_builder, graph, tokenizer)
  assert reason == 'ok', reason
  first, second = traj.steps[0], traj.steps[1]
  assert (first.action.name, first.action.arguments) == (tool, arguments)
  assert first.result.ok and len(first.result.images) == 1
  assert len(traj.images) >= 2  # img_1 (the input), img_2 (the repair's output)
  assert (second.action.name, second.action.arguments) == ('image_search', {'image': 'img_2'})
  assert synthesize.contains_name(second.result.text, item['path'][0])
  assert traj.final_response == item['answers'][0] and traj_lib.check_trajectory(traj) == []
  assert len(traj.steps) <= synthesize.max_oracle_steps(item)


def test_a_repair_tool_that_is_not_enabled_is_not_called(graph, accepted_items):
  """A degraded item whose repair tool the environment does not offer is searched as it is (img_1)."""
  item = dict(accepted_items[0], degradation={'kind': 'downsample', 'params': '{"factor": 2}',
                                              'repair_tool': 'super_resolution'})
  plan = synthesize.oracle_plan(item, graph, tools=('text_search', 'image_search', 'sharpen'))
  assert next(plan).tool_call == {'name': 'image_search', 'arguments': {'image': 'img_1'}}
  plan = synthesize.oracle_plan(item, graph)
  assert next(plan).tool_call == {'name': 'super_resolution', 'arguments': {'image': 'img_1', 'scale': 2}}
  assert plan.send(synthesize.Observation('Upscaled.', ('img_2',))).tool_call['arguments'] == {'image': 'img_2'}
