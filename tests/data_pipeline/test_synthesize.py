"""Oracle expert: real tool calls, process check, final response equal to the answer."""

import json

import pytest

from data_pipeline import synthesize
from osvl_jax import paths as osvl_paths


@pytest.fixture(scope='module')
def oracle_run(graph, grounded_items):
  records, counts = synthesize.synthesize(grounded_items[:3], graph, osvl_paths.data_dir())
  return records, counts


def test_oracle_trajectory_searches_the_image_then_the_text_and_answers(oracle_run, grounded_items):
  from osvl_jax import trajectory as traj_lib
  records, counts = oracle_run
  assert counts['kept'] >= 1 and counts['kept'] + counts['rejected'] == counts['in']
  by_id = {r['prompt_id']: r for r in grounded_items}
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


def test_process_check_each_hop_is_found_in_the_tool_results(oracle_run, grounded_items):
  from osvl_jax import trajectory as traj_lib
  records, _ = oracle_run
  by_id = {r['prompt_id']: r for r in grounded_items}
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
