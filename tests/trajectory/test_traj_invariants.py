"""validate_trajectory (called by batching.collate on every trajectory) and `python -m osvl_jax.trajectory --check`."""

import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from osvl_jax import trajectory as tj
from osvl_jax.train import batching


def _replace(traj, **fields):
  return dataclasses.replace(traj, **fields)


def _drop_token(traj, index):
  return _replace(traj, token_ids=np.delete(traj.token_ids, index), gen_mask=np.delete(traj.gen_mask, index),
                  step_of_token=np.delete(traj.step_of_token, index), rollout_logprobs=None)


def _broken(traj):
  """name -> (trajectory breaking one invariant, text its problem must contain)."""
  pad = int(np.flatnonzero(traj.token_ids == tj.IMAGE_PAD_ID)[-1])
  gen = traj.gen_mask.copy()
  gen[5] = True  # a system-prompt token marked as emitted
  obs = int(np.flatnonzero(traj.token_ids == tj.TOOL_RESPONSE_ID)[0])
  gen_obs = traj.gen_mask.copy()
  gen_obs[obs] = True  # an observation token marked as emitted
  sot = traj.step_of_token.copy()
  sot[-3] = 0
  return {
      'pad_missing': (_drop_token(traj, pad), 'image 2: 14 <|image_pad|>'),
      'image_not_in_tokens': (_replace(traj, images=traj.images + [traj.images[0]]),
                              '2 <|vision_start|> tokens for 3 images'),
      'image_missing': (_replace(traj, images=traj.images[:1]), '2 <|vision_start|> tokens for 1 images'),
      'gen_on_system': (_replace(traj, gen_mask=gen), 'gen_mask outside assistant turns at [5]'),
      'gen_on_observation': (_replace(traj, gen_mask=gen_obs), 'gen_mask outside assistant turns'),
      'step_decreases': (_replace(traj, step_of_token=sot), 'step_of_token decreases'),
      'grid_wrong': (_replace(traj, images=[traj.images[0], dataclasses.replace(
          traj.images[1], grid_thw=np.array([1, 6, 8], np.int32))]), 'image 2'),
  }


def test_sound_trajectory_passes_and_is_returned(tokenizer, small_processor, rng, two_step):
  traj, *_ = two_step(tokenizer, small_processor, rng)
  assert tj.validate_trajectory(traj) is traj


def test_each_broken_invariant_raises_a_named_error_in_collate(tokenizer, small_processor, rng, two_step):
  traj, *_ = two_step(tokenizer, small_processor, rng)
  for name, (bad, problem) in _broken(traj).items():
    assert any(problem in p for p in tj.check_trajectory(bad)), (name, tj.check_trajectory(bad))
    with pytest.raises(tj.TrajectoryError, match=r"prompt_id='q7' sample_index=3 is invalid: .*"
                       + problem.replace('[', r'\[').replace(']', r'\]').replace('|', r'\|')):
      batching.collate([traj, bad], length_multiple=64, loss_multiple=16)
  assert issubclass(tj.TrajectoryError, ValueError)


def test_every_step_must_have_tokens(tokenizer, small_processor, rng, two_step):
  traj, *_ = two_step(tokenizer, small_processor, rng)
  extra = _replace(traj, steps=traj.steps + [traj.steps[-1]])
  assert any('step_of_token reaches 1 with 3 steps' in p for p in tj.check_trajectory(extra))
  assert any('stop_reason' in p for p in tj.check_trajectory(_replace(traj, stop_reason='bored')))


def test_json_lines_round_trip_and_encoding(tokenizer, small_processor, rng, two_step, tmp_path):
  traj, *_ = two_step(tokenizer, small_processor, rng)
  traj.stop_reason = 'response'
  line = traj.to_json()
  assert '\n' not in line
  record = json.loads(line)
  assert isinstance(record['images'][0]['png'], str) and record['images'][0]['grid_thw'] == [1, 4, 4]
  back = tj.Trajectory.from_json(line)
  for f in ('token_ids', 'gen_mask', 'step_of_token', 'rollout_logprobs', 'pixel_values', 'image_grid_thw'):
    np.testing.assert_array_equal(getattr(back, f), getattr(traj, f))
  assert back.stop_reason == 'response' and back.steps[0].result.images[0].shape == (96, 160, 3)


def _run_check(path):
  env = {**os.environ, 'JAX_PLATFORMS': 'cpu'}
  return subprocess.run([sys.executable, '-m', 'osvl_jax.trajectory', '--check', str(path)], capture_output=True,
                        text=True, env=env, timeout=120, check=False)


def test_check_command_counts_and_names_each_problem(tokenizer, small_processor, rng, two_step, tmp_path, capsys):
  traj, *_ = two_step(tokenizer, small_processor, rng)
  good = tmp_path / 'good.jsonl'
  tj.write_jsonl([traj, traj], good)
  # A hand-broken file: one good line, one with a pad token removed, one with gen_mask on the system prompt,
  # one that is not a trajectory at all.
  records = [json.loads(traj.to_json()) for _ in range(3)]
  pad = records[1]['token_ids'].index(tj.IMAGE_PAD_ID)
  for key in ('token_ids', 'gen_mask', 'step_of_token', 'rollout_logprobs'):
    del records[1][key][pad]
  records[2]['gen_mask'][5] = True
  bad = tmp_path / 'bad.jsonl'
  bad.write_text('\n'.join(json.dumps(r) for r in records) + '\n{"prompt_id": "x"}\n')
  assert tj.main(['--check', str(good)]) == 0  # in-process (one subprocess below is enough for `-m`)
  assert capsys.readouterr().out.strip().splitlines() == ['trajectories=2 invalid=0']
  out = _run_check(bad)
  lines = out.stdout.strip().splitlines()
  assert out.returncode == 1 and lines[-1] == 'trajectories=4 invalid=3', out.stdout + out.stderr
  assert any(l.startswith(f'{bad}:2: ') and '<|image_pad|>' in l for l in lines)
  assert any(l.startswith(f'{bad}:3: ') and 'gen_mask outside assistant turns at [5]' in l for l in lines)
  assert any(l.startswith(f'{bad}:4: ') and 'cannot decode' in l for l in lines)
