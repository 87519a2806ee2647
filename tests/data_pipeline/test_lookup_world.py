"""The lookup world (DESIGN.md §6b, "Learning testbed"): its build in the project's dataset format, splits disjoint by
combination, single-token copies, the expert's retries and give-ups, the lookup tool, the image-blind switch."""

import json
import pathlib
import sys

import ml_collections
import numpy as np
import pytest

from data_pipeline import lookup_world
from osvl_jax import trajectory as traj_lib
from osvl_jax.data import pipeline as pipeline_data
from osvl_jax.rollout import engine as engine_lib
from osvl_jax.train import data as train_data
from osvl_jax.train import grpo_batch, rollouts
from tools import env as env_lib
from tools.specs import lookup as lookup_spec

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / 'configs'))
import lookup as lookup_config  # noqa: E402


def _small(hops=1, **kw) -> ml_collections.ConfigDict:
  c = lookup_world.default_config()
  c.update({**dict(hops=hops, sft_items=60, rl_combos=10, heldout_combos=4, rl_items_per_combo=1), **kw})
  return c


@pytest.fixture(scope='module')
def world(tmp_path_factory):
  out = tmp_path_factory.mktemp('lookup') / 'data'
  c = _small()
  return c, out, lookup_world.build(c, out)


def test_lookup_tool_reads_the_seeded_table_and_refuses_keys_outside_the_digits():
  env = env_lib.ToolEnv({'enabled': ('lookup',), 'lookup': {'seed': 7}})
  r = env.call('lookup', {'key': 4, 'day': 9}, [])
  assert r.ok and r.text == f'The value of key 4 on day 9 is {lookup_spec.table_value(7, 4, 9)}.'
  values = {lookup_spec.table_value(7, k, d) for k in range(10) for d in range(10)}
  assert values == set(range(10))                                   # every digit occurs: a 10-way copy
  assert [lookup_spec.table_value(7, k, 0) for k in range(10)] != [lookup_spec.table_value(8, k, 0)
                                                                   for k in range(10)]   # the seed decides
  bad = env.call('lookup', {'key': 10, 'day': 9}, [])
  assert not bad.ok and bad.error_kind == 'bad_arguments' and "'key'" in bad.text


def test_world_splits_are_disjoint_by_combination_and_cover_all_of_them():
  combos = lookup_world.split_combos(0, rl_combos=40, heldout_combos=20)
  parts = [set(combos[k]) for k in ('sft', 'rl', 'heldout')]
  assert [len(p) for p in parts] == [60, 20, 20]
  assert not (parts[0] & parts[1]) and not (parts[0] & parts[2]) and not (parts[1] & parts[2])
  assert parts[0] | parts[1] | parts[2] == {(k, d) for k in range(10) for d in range(10)}


def test_built_world_is_a_dataset_the_trainers_read(world):
  c, out, stats = world
  assert json.loads((out / 'build_config.json').read_text())['hops'] == 1
  trajectories = pipeline_data.load_sft(out)
  assert stats['sft']['kept'] == len(trajectories) > 50
  config = ml_collections.ConfigDict({'data': {'dir': str(out)}, 'grpo': {'heldout_prompts': 4}})
  train, held = train_data.load_prompts(config, None, 'train'), train_data.load_prompts(config, None, 'heldout')
  assert len(train) == 6 and len(held) == 4
  rows, _ = pipeline_data.read_split(out / pipeline_data.ITEMS)
  facts = {r['prompt_id']: tuple(int(x) for x in r['answer_evidence'].split()[1::2]) for r in rows}
  combos = lookup_world.split_combos(c.seed, c.rl_combos, c.heldout_combos)
  assert {facts[t.prompt_id] for t in trajectories} <= set(combos['sft'])
  assert {facts[p['prompt_id']] for p in train} == set(combos['rl'])
  assert {facts[p['prompt_id']] for p in held} == set(combos['heldout'])
  for p in train + held:   # the image is the key's colour (the only place the key is), the answer the table's
    key, day = facts[p['prompt_id']]
    assert p['answers'] == [str(lookup_spec.table_value(c.seed, key, day))]
    assert np.abs(p['image'].astype(int) - lookup_world.COLOURS[key][1]).max() <= c.jitter
    assert str(key) not in p['question'].replace(f'Day {day}.', '')


def test_every_copied_value_is_one_token_with_the_same_id_at_source_and_target(world):
  _, out, _ = world
  tokenizer = traj_lib.load_tokenizer()
  digit_ids = [tokenizer.encode(str(v)) for v in range(10)]
  assert all(len(ids) == 1 for ids in digit_ids)
  digit_ids = {ids[0] for ids in digit_ids}
  trajectory = next(t for t in pipeline_data.load_sft(out) if len(t.steps) == 2)
  call, answer = trajectory.steps
  key, day = call.action.arguments['key'], call.action.arguments['day']
  value = int(trajectory.final_response)
  ids = trajectory.token_ids.tolist()
  text_ids = lambda s: tokenizer.encode(s)
  for source, target in ((f'Day {day}.', f'"day": {day}}}'), (f'is {value}.', f'<response>{value}</response>')):
    src, tgt = text_ids(source), text_ids(target)
    assert set(src) & set(tgt) & digit_ids, (source, target)       # the digit is the same id in both
  assert answer.action.kind == 'response' and str(value) == trajectory.answers[0]
  vocab = json.loads((out / pipeline_data.VOCAB_FILE).read_text())
  assert set(ids) <= set(vocab) and digit_ids <= set(vocab) and set(traj_lib.EOS_IDS) <= set(vocab)
  assert vocab == sorted(set(vocab)) and len(vocab) < 400


def test_expert_data_holds_retries_and_give_ups_after_failures(tmp_path):
  stats = lookup_world.build(_small(sft_items=200, failure_rate=0.5, retry_prob=0.3), tmp_path / 'd')
  s = stats['sft']
  assert s['gave_up'] > s['retries'] > 0 and s['answered'] > 0
  for t in pipeline_data.load_sft(tmp_path / 'd'):
    for prev, nxt in zip(t.steps, t.steps[1:]):
      if prev.is_execution_error and nxt.action.kind == 'tool_call':
        assert nxt.action.arguments == prev.action.arguments        # a retry repeats the failed call
    assert t.fatal_step is None                                      # fatal episodes are not kept


def test_two_hop_items_answer_the_value_of_the_first_value(tmp_path):
  c = _small(hops=2, failure_rate=0.0)
  lookup_world.build(c, tmp_path / 'd')
  t = pipeline_data.load_sft(tmp_path / 'd')[0]
  first, second, _ = t.steps
  v1 = lookup_spec.table_value(c.seed, first.action.arguments['key'], first.action.arguments['day'])
  assert second.action.arguments == {'key': v1, 'day': first.action.arguments['day']}
  assert t.final_response == str(lookup_spec.table_value(c.seed, v1, first.action.arguments['day']))


def test_a_folder_built_with_other_settings_is_refused(world):
  c, out, _ = world
  other = _small(hops=2)
  with pytest.raises(ValueError, match=r"hops: built with 1, asked 2"):
    lookup_world.build(other, out)
  assert lookup_world.build(c, out)['sft']['kept'] > 0                # the same settings: resumed as it is


def test_zero_pixels_rollout_hides_the_image_from_the_policy_and_the_update(world):
  _, out, _ = world
  config = lookup_config.get_config()
  config.data.dir = str(out)
  config.grpo.zero_pixels = 'rollout'
  prompts = train_data.load_prompts(config, None, 'train')[:2]
  assert all(p['image'].any() for p in prompts)
  tokenizer = traj_lib.load_tokenizer()
  text = traj_lib.render_assistant_text('Give up.', response='unknown')

  class Runner(rollouts.RolloutRunner):   # the real runner with a scripted engine in place of the sampler
    def __init__(self, config):  # pylint: disable=super-init-not-called
      self.config, self.tokenizer = config, tokenizer
      self.image_processor, self.env = rollouts.image_processor(config), rollouts.tool_env(config)
      self.system_prompt = traj_lib.system_prompt_text(config.system_prompt)
      self.engine = engine_lib.ScriptedEngine([text], tokenizer)
      self.limits = rollouts.agent_loop.Limits.from_config(config.rollout)
      self.sync = type('S', (), {'version': 0})()

  blind = Runner(config).run(prompts, num_generations=1, temperature=1.0, top_p=1.0, seed=0)
  assert all(not np.asarray(t.images[0].pixels).any() for t in blind)
  config.grpo.zero_pixels = 'none'
  seen = Runner(config).run(prompts, num_generations=1, temperature=1.0, top_p=1.0, seed=0)
  assert all(np.asarray(t.images[0].pixels).any() for t in seen)
  cfg = config.grpo
  batch = grpo_batch.prepare_batch(seen + seen, cfg)[0]
  assert np.abs(batch['pixel_values']).sum() > 0
  cfg.zero_pixels = 'update'
  batch = grpo_batch.prepare_batch(seen + seen, cfg)[0]
  assert batch['pixel_values'].shape[0] > 0 and not np.abs(batch['pixel_values']).any()
