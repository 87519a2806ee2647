"""Per-token weight versions: `Generation.token_versions` from SGLang's version spans, the builder's record of
them, `policy_version` = the oldest token's, and the trajectory check (DESIGN.md §4, §6b)."""

import numpy as np
import pytest

from osvl_jax import trajectory as tj
from osvl_jax.rollout import engine as engine_lib
from tools import base as tools_base


def _gen(n, version=None, spans=None):
  return engine_lib.Generation(ids=np.arange(n) + 100, logprobs=np.zeros(n), text='', finish_reason='stop',
                               weight_version=version, weight_versions=spans)


def test_generation_token_versions():
  assert _gen(3, '4').token_versions().tolist() == [4, 4, 4]
  # SGLang: the turn started on 4, the update to 5 landed after two tokens.
  spans = [{'version': '4', 'start': 0, 'end': 2}, {'version': '5', 'start': 2, 'end': 5}]
  assert _gen(5, '5', spans).token_versions().tolist() == [4, 4, 5, 5, 5]
  assert _gen(3, None).token_versions() is None           # nothing reported
  assert _gen(3, 'default').token_versions() is None      # SGLang's name before any update: not a version
  assert _gen(3, None, [{'version': '2', 'start': 0, 'end': 2}]).token_versions() is None  # token 2 unknown
  assert _gen(2, '1', [{'start': 0}]).token_versions() is None  # malformed span


@pytest.fixture
def builder():
  b = tj.TrajectoryBuilder(tj.load_tokenizer(), tj.ImageProcessor(), [], system_prompt='Answer.')
  b.start('Q?', None)
  return b


def _turn(tokenizer, text):
  return tokenizer.encode(text) + [tj.IM_END_ID]


def test_builder_records_versions_and_the_oldest_is_the_policy_version(builder):
  tok = builder.tokenizer
  call = _turn(tok, '<think>a</think><tool_call>{"name": "crop", "arguments": {}}</tool_call>')
  builder.append_assistant(call, versions=[3] * len(call))
  builder.append_observation(tools_base.ToolResult(ok=False, error_kind='bad_arguments', text='', images=[], seconds=0.0))
  answer = _turn(tok, '<think>b</think><response>x</response>')
  builder.append_assistant(answer, versions=[3] * 2 + [4] * (len(answer) - 2))  # straddles an update
  traj = builder.finish(prompt_id='p', policy_version=9)
  v = traj.token_versions
  assert v.dtype == np.int32 and v.shape == traj.token_ids.shape
  assert set(v[~traj.gen_mask].tolist()) == {-1} and set(v[traj.gen_mask].tolist()) == {3, 4}
  assert traj.policy_version == 3  # the oldest token's, not the loop's argument
  assert tj.check_trajectory(traj) == []
  back = tj.Trajectory.from_json(traj.to_json())
  np.testing.assert_array_equal(back.token_versions, v)
  traj.policy_version = 4
  assert any('oldest token version 3' in p for p in tj.check_trajectory(traj))


def test_a_turn_without_versions_drops_them_and_truncation_keeps_them_aligned(builder):
  tok = builder.tokenizer
  call = _turn(tok, '<think>a</think><tool_call>{"name": "crop", "arguments": {}}</tool_call>')
  builder.append_assistant(call, versions=[1] * len(call))
  builder.append_observation(tools_base.ToolResult(ok=False, error_kind='bad_arguments', text='', images=[], seconds=0.0))
  builder.append_assistant(_turn(tok, '<think>b</think><response>x</response>'))  # engine gave no versions
  assert builder.finish(policy_version=7).token_versions is None
  builder.truncate(1)
  traj = builder.finish(policy_version=7)
  assert traj.token_versions.shape == traj.token_ids.shape and traj.policy_version == 1


def test_bad_versions_are_refused_and_change_nothing(builder):
  ids = _turn(builder.tokenizer, '<think>a</think><response>x</response>')
  before = builder.num_tokens
  for versions in ([1], [-1] * len(ids)):  # one short, one negative
    with pytest.raises(ValueError, match='one integer >= 0 per id'):
      builder.append_assistant(ids, versions=versions)
  assert builder.num_tokens == before and not builder.steps
