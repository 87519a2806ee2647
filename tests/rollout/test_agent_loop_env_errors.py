"""rollout.env_errors in the agent loop (`rollout.limits`): with 'count' (the paper, default) an injected backend
error reaches the policy at once and counts toward the fatal cascade; with 'retry' a call ending on an environment
error (timeout, http_error, backend_error) is retried up to env_retries times with backoff, so the policy sees one
only after env_retries + 1 failed attempts in a row, and a call that succeeds on a retry leaves no trace in the
trajectory's tokens; a policy error is never retried. Real ToolEnv failure injection, real tokenizer and tools."""

import numpy as np
import pytest

from osvl_jax import trajectory as tj
from osvl_jax.rollout import agent_loop
from osvl_jax.rollout import engine as engine_lib
from tools import env as tools_env

CROP = tj.render_assistant_text('Zoom in.', tool_call={'name': 'crop', 'arguments': {
    'image': 'img_1', 'x': 0, 'y': 0, 'width': 48, 'height': 40}})
SHARPEN = tj.render_assistant_text('Sharpen it.', tool_call={'name': 'sharpen', 'arguments': {'image': 'img_1'}})
ANSWER = tj.render_assistant_text('Done.', response='Agra')
SEED_FAIL_THEN_OK = 29   # FailureInjector(0.5, seed=29) draws: fail, succeed, succeed


def _env(rate: float, kind: str = 'backend_error', seed: int = 0) -> tools_env.ToolEnv:
  return tools_env.ToolEnv({'enabled': ('crop', 'sharpen'),
                            'failure_injection': {'rate': rate, 'kind': kind, 'seed': seed}})


def _run(tokenizer, env, make_builder, script, **limits):
  image = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
  item = {'prompt_id': 'q0', 'question': 'Where is this?', 'image': image, 'answers': ['Agra']}
  return agent_loop.run_episodes(engine_lib.ScriptedEngine(script, tokenizer), env, make_builder, [item],
                                 **{'max_turns': 4, 'fatal_k': 3, **limits})[0]


def test_count_shows_every_environment_error_and_it_counts_toward_the_cascade(tokenizer, make_builder):
  env = _env(1.0)
  traj = _run(tokenizer, env, make_builder, [CROP] * 3, env_errors='count', env_retry_backoff_s=0.0)
  assert (traj.stop_reason, traj.fatal_step, len(traj.steps)) == ('fatal', 0, 3)
  assert [s.result.error_kind for s in traj.steps] == ['backend_error'] * 3
  assert [s.env_retries for s in traj.steps] == [0, 0, 0] and env.injected_counts == {'backend_error': 3}
  assert traj.environment_errors == [True] * 3


def test_retry_shows_an_environment_error_only_after_env_retries_plus_one_failures(tokenizer, make_builder):
  env = _env(1.0)
  traj = _run(tokenizer, env, make_builder, [CROP] * 3, env_errors='retry', env_retries=2,
              env_retry_backoff_s=0.01)
  assert (traj.stop_reason, traj.fatal_step, len(traj.steps)) == ('fatal', 0, 3)   # still fails: still fatal
  assert env.injected_counts == {'backend_error': 9}                                 # 3 attempts per call
  assert [s.env_retries for s in traj.steps] == [2, 2, 2]
  assert [s.result.error_kind for s in traj.steps] == ['backend_error'] * 3
  assert all(s.result.seconds >= 0.01 + 0.02 for s in traj.steps)                    # backoff 0.01 x 2^attempt
  assert tj.check_trajectory(traj) == []


def test_a_call_that_succeeds_on_a_retry_leaves_no_trace_in_the_tokens(tokenizer, make_builder):
  clean = _run(tokenizer, _env(0.0), make_builder, [CROP, SHARPEN, ANSWER])
  env = _env(0.5, seed=SEED_FAIL_THEN_OK)
  retried = _run(tokenizer, env, make_builder, [CROP, SHARPEN, ANSWER], env_errors='retry', env_retries=1,
                 env_retry_backoff_s=0.0)
  assert env.injected_counts == {'backend_error': 1}                                 # crop failed once
  assert [s.env_retries for s in retried.steps] == [1, 0, 0]
  assert retried.stop_reason == 'response' and retried.fatal_step is None
  np.testing.assert_array_equal(retried.token_ids, clean.token_ids)                 # the policy never saw it
  assert [s.format_ok for s in retried.steps] == [s.format_ok for s in clean.steps] == [True] * 3
  counted = _run(tokenizer, _env(0.5, seed=SEED_FAIL_THEN_OK), make_builder, [CROP, SHARPEN, ANSWER])
  assert counted.steps[0].result.error_kind == 'backend_error' and not counted.steps[0].format_ok   # 'count'
  assert not np.array_equal(counted.token_ids[:clean.num_tokens], clean.token_ids)


@pytest.mark.parametrize('kind', ['bad_arguments', 'unknown_tool', 'malformed_call'])
def test_a_policy_error_is_never_retried(tokenizer, make_builder, kind):
  env = _env(1.0, kind=kind)
  traj = _run(tokenizer, env, make_builder, [CROP] * 3, env_errors='retry', env_retries=3)
  assert env.injected_counts == {kind: 3} and [s.env_retries for s in traj.steps] == [0, 0, 0]
  assert traj.fatal_step == 0 and traj.environment_errors == [False] * 3


@pytest.mark.parametrize('fields, match', [
    ({'env_errors': 'ignore'}, r"env_errors='ignore': expected one of \('count', 'retry', 'exclude'\)"),
    ({'env_errors': 'retry', 'env_retries': 0}, r"env_retries=0: must be an int >= 1 with env_errors='retry'"),
    ({'env_retries': -1}, r"env_retries=-1: must be an int >= 0"),
    ({'env_retry_backoff_s': -0.5}, r'env_retry_backoff_s=-0.5: must be >= 0'),
])
def test_limits_refuse_a_bad_env_error_setting(fields, match):
  with pytest.raises(ValueError, match=match):
    agent_loop.Limits(**fields)
  assert agent_loop.Limits(env_errors='retry', env_retries=2).retries() == 2
  assert agent_loop.Limits(env_errors='exclude', env_retries=2).retries() == 0   # only 'retry' retries
  assert agent_loop.Limits.from_config({'env_errors': 'retry', 'env_retries': 5}).retries() == 5
