"""ShareGPT export of expert trajectories: our Trajectory -> official SFT record -> the official reader."""

import json

import numpy as np
import pytest

from data_pipeline import degrade, synthesize
from osvl_jax import paths as osvl_paths


@pytest.fixture(scope='module')
def oracle_trajectories(graph, solvable_items, tmp_path_factory):
  """Oracle trajectories of two items, the first one blurred (a repair call that returns img_2)."""
  from osvl_jax import trajectory as traj_lib
  data_dir = osvl_paths.data_dir()
  first = solvable_items[0]
  params = {'blur': 'gaussian', 'sigma': 2.0, 'ksize': 13}
  path = tmp_path_factory.mktemp('degraded') / 'blur.png'
  degrade.save_png(degrade.apply(synthesize.load_image(data_dir, first['image_path']), 'blur', params), path)
  items = [dict(first, image_path=str(path), degradation={'kind': 'blur', 'params': json.dumps(params),
                                                           'repair_tool': 'sharpen'})] + list(solvable_items[1:3])
  records, counts = synthesize.synthesize(items, graph, data_dir)
  assert counts['repaired'] == 1 and counts['kept'] >= 2
  return [traj_lib.Trajectory.from_record(r) for r in records]


def test_round_trip_through_the_official_reader_gives_the_same_tokens(oracle_trajectories, tmp_path):
  from osvl_jax import trajectory as traj_lib
  from osvl_jax.data import official
  from tools import env as env_lib
  schemas = env_lib.ToolEnv().schemas()
  path = tmp_path / 'sft_sharegpt.jsonl'
  counts = official.write_sft(oracle_trajectories, path, schemas)
  n_images = sum(len(t.images) for t in oracle_trajectories)
  assert counts == {'written': len(oracle_trajectories), 'skipped': 0, 'images': n_images}
  records = [json.loads(line) for line in path.read_text().splitlines()]
  repaired = next(r for r in records if json.loads(r['conversations'][1]['value'].split('<tool_call>')[1]
                                                   .split('</tool_call>')[0])['name'] == 'sharpen')
  # human, then gpt / observation alternating; the sharpen observation carries img_2.
  assert repaired['conversations'][0]['value'].startswith('<image>\n')
  assert [t['from'] for t in repaired['conversations'][:4]] == ['human', 'gpt', 'observation', 'gpt']
  assert repaired['conversations'][2]['value'].endswith('\n<image>') and len(repaired['images']) == 2
  assert json.loads(repaired['tools']) == [s['function'] for s in schemas]
  back = official.load_sft(path, traj_lib.load_tokenizer(), traj_lib.ImageProcessor(), profile='osvl')
  assert len(back) == len(oracle_trajectories)
  for ours, theirs in zip(oracle_trajectories, back):
    assert theirs.prompt_id == ours.prompt_id and theirs.question == ours.question
    np.testing.assert_array_equal(theirs.token_ids, ours.token_ids)
    np.testing.assert_array_equal(theirs.gen_mask, ours.gen_mask)
    np.testing.assert_array_equal(theirs.step_of_token, ours.step_of_token)
    assert theirs.final_response == ours.final_response
    assert [im.pixels.shape for im in theirs.images] == [im.pixels.shape for im in ours.images]
    np.testing.assert_array_equal(theirs.images[-1].pixels, ours.images[-1].pixels)


def test_a_record_that_cannot_give_back_the_same_tokens_is_refused(oracle_trajectories):
  from osvl_jax.data import official
  traj = oracle_trajectories[0]
  paths = [f'{k}.png' for k in range(len(traj.images))]
  with pytest.raises(ValueError, match='image paths'):
    official.trajectory_to_sft_record(traj, [], paths[:-1])
  step = next(s for s in traj.steps if s.result is not None)
  text = step.result.text
  step.result.text = text + '\n'
  try:
    with pytest.raises(ValueError, match=f'step {step.index}: tool text has leading/trailing whitespace'):
      official.trajectory_to_sft_record(traj, [], paths)
  finally:
    step.result.text = text
