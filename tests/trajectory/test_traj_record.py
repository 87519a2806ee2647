"""Trajectory.to_record / from_record: lossless storage in HF datasets."""

import numpy as np

from osvl_jax import trajectory as tj
from tools.base import error


def _assert_same(a, b):
  for f in ('token_ids', 'gen_mask', 'step_of_token'):
    np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
  assert (a.prompt_id, a.sample_index, a.final_response, a.fatal_step, a.policy_version, a.question,
          a.answers) == (b.prompt_id, b.sample_index, b.final_response, b.fatal_step, b.policy_version,
                         b.question, b.answers)
  if a.rollout_logprobs is None:
    assert b.rollout_logprobs is None
  else:
    np.testing.assert_array_equal(a.rollout_logprobs, b.rollout_logprobs)
  assert len(a.images) == len(b.images)
  for x, y in zip(a.images, b.images):
    np.testing.assert_array_equal(x.pixels, y.pixels)
    np.testing.assert_array_equal(x.grid_thw, y.grid_thw)
    np.testing.assert_array_equal(x.pixel_values, y.pixel_values)
  assert len(a.steps) == len(b.steps)
  for s, t in zip(a.steps, b.steps):
    assert (s.index, s.text, s.format_ok, s.seconds, s.action) == (t.index, t.text, t.format_ok, t.seconds,
                                                                    t.action)
    assert (s.result is None) == (t.result is None)
    if s.result is not None:
      assert (s.result.ok, s.result.error_kind, s.result.text, s.result.seconds) == (
          t.result.ok, t.result.error_kind, t.result.text, t.result.seconds)
      assert len(s.result.images) == len(t.result.images)
      for x, y in zip(s.result.images, t.result.images):
        np.testing.assert_array_equal(x, y)


def test_record_round_trip(tokenizer, small_processor, rng, two_step):
  traj, *_ = two_step(tokenizer, small_processor, rng)
  _assert_same(traj, tj.Trajectory.from_record(traj.to_record()))


def test_record_round_trip_through_datasets(tokenizer, small_processor, rng, two_step):
  import datasets  # pylint: disable=g-import-not-at-top
  traj, *_ = two_step(tokenizer, small_processor, rng, logprobs=False)
  b = tj.TrajectoryBuilder(tokenizer, small_processor, [])
  b.start('text only', None)
  b.append_assistant_text('<tool_call>{"name": "x"}</tool_call>')
  b.append_observation(error('unknown_tool', 'no tool x'))
  fatal = b.finish(prompt_id='q8', fatal_step=0)
  ds = datasets.Dataset.from_list([traj.to_record(), fatal.to_record()], features=tj.record_features())
  _assert_same(traj, tj.Trajectory.from_record(ds[0]))
  back = tj.Trajectory.from_record(ds[1])
  _assert_same(fatal, back)
  assert back.fatal_step == 0 and back.final_response is None and back.steps[0].action.think is None
