"""config.failure_injection: deterministic injected failures, counted by kind; 100 rollouts at 50 % survive."""

import collections

import numpy as np
import pytest

from osvl_jax import trajectory as tj
from osvl_jax.rollout import agent_loop
from osvl_jax.rollout import engine as engine_lib
from tools import env as tools_env

ALL_TOOLS = ('text_search', 'image_search', 'ocr', 'crop', 'sharpen', 'super_resolution', 'perspective_correct')
CALLS = [('crop', {'image': 'img_1', 'x': 0, 'y': 0, 'width': 32, 'height': 32}), ('sharpen', {'image': 'img_1'}),
         ('super_resolution', {'image': 'img_1'}), ('perspective_correct', {'image': 'img_1'}),
         ('ocr', {'image': 'img_1'}), ('text_search', {'query': 'Taj Mahal'}), ('image_search', {'image': 'img_1'})]
KINDS = ('timeout', 'http_error', 'backend_error')


def _kinds(env, n, seed_calls=CALLS):
  image = np.zeros((16, 16, 3), np.uint8)
  return [env.call(*seed_calls[i % 4][:2], [image]).error_kind for i in range(n)]


def _expected_draws(n, rate, kinds, seed):
  """The injected kind (or None) of each of n calls, computed independently of `FailureInjector` from numpy's
  generator with the documented draw order: per call one uniform u = random(); the call fails when u < rate, and
  then one integers(len(kinds)) picks the kind."""
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(n):
    if rng.random() < rate:
      out.append(kinds[int(rng.integers(len(kinds)))])
    else:
      out.append(None)
  return out


def test_injection_is_deterministic_given_seed_and_counted():
  cfg = {'enabled': ('crop', 'sharpen', 'super_resolution', 'perspective_correct'),
         'failure_injection': {'rate': 0.5, 'kind': 'backend_error', 'seed': 0}}
  a, b = tools_env.ToolEnv(cfg), tools_env.ToolEnv(cfg)
  ka, kb = _kinds(a, 200), _kinds(b, 200)
  assert ka == kb == _expected_draws(200, 0.5, ('backend_error',), 0)  # call by call
  assert ka.count('backend_error') == 88 and a.injected_counts == {'backend_error': 88}  # exact, seed 0
  c = tools_env.ToolEnv({**cfg, 'failure_injection': {'rate': 0.5, 'kind': 'backend_error', 'seed': 1}})
  kc = _kinds(c, 200)
  assert kc == _expected_draws(200, 0.5, ('backend_error',), 1) and kc.count('backend_error') == 100 and kc != ka


@pytest.mark.parametrize('rate, expected', [(0.0, 0), (0.25, None), (1.0, 40)])
def test_injection_rate_edges(rate, expected):
  env = tools_env.ToolEnv({'enabled': ('crop', 'sharpen', 'super_resolution', 'perspective_correct'),
                          'failure_injection': {'rate': rate, 'kind': 'timeout', 'seed': 5}})
  kinds = _kinds(env, 40)
  assert kinds == _expected_draws(40, rate, ('timeout',), 5)
  if expected is not None:
    assert kinds.count('timeout') == expected


def test_kind_tuple_draws_among_kinds():
  env = tools_env.ToolEnv({'enabled': ('crop', 'sharpen', 'super_resolution', 'perspective_correct'),
                          'failure_injection': {'rate': 1.0, 'kind': ('timeout', 'http_error'), 'seed': 3}})
  kinds = _kinds(env, 100)
  assert kinds == _expected_draws(100, 1.0, ('timeout', 'http_error'), 3)
  assert env.injected_counts == {'timeout': 57, 'http_error': 43} == dict(collections.Counter(kinds))


def test_no_injection_by_default_and_bad_config_is_rejected():
  env = tools_env.ToolEnv({'enabled': ('crop', 'sharpen', 'super_resolution', 'perspective_correct')})
  assert set(_kinds(env, 20)) == {None} and env.injected_counts == {}
  with pytest.raises(ValueError, match='failure_injection'):
    tools_env.ToolEnv({'failure_injection': {'rate': 0.5, 'kind': 'exploded'}})


def rollouts_with_injected_failures(num_episodes: int = 100, rate: float = 0.5, seed: int = 0, calls=CALLS):
  """Runs `num_episodes` scripted episodes that make `calls` (default: every tool once), with `rate` injected
  failures of kinds timeout / http_error / backend_error on every tool.

  Returns:
    (trajectories, injected: dict kind -> n, observed: dict kind -> n of execution errors in the steps).
  """
  env = tools_env.ToolEnv({'enabled': ALL_TOOLS, 'failure_injection': {'rate': rate, 'kind': KINDS, 'seed': seed}})
  tokenizer = tj.load_tokenizer()
  processor = tj.ImageProcessor(min_pixels=32 * 32, max_pixels=64 * 64)
  make_builder = lambda: tj.TrajectoryBuilder(tokenizer, processor, env.schemas())
  script = [tj.render_assistant_text('Use a tool.', tool_call={'name': n, 'arguments': a}) for n, a in calls]
  script.append(tj.render_assistant_text('Done.', response='Agra'))
  engine = engine_lib.ScriptedEngine(script, tokenizer)
  rng = np.random.default_rng(0)
  items = [{'prompt_id': f'q{i}', 'question': 'Where is this?',
            'image': rng.integers(0, 256, (48, 48, 3), dtype=np.uint8), 'answers': ['Agra']}
           for i in range(num_episodes)]
  trajs = agent_loop.run_episodes(engine, env, make_builder, items, max_turns=len(script), fatal_k=99)
  observed = collections.Counter(s.result.error_kind for t in trajs for s in t.steps
                                 if s.result is not None and s.result.is_execution_error)
  return trajs, env.injected_counts, dict(observed)


def test_100_rollouts_with_half_the_tool_calls_failing_complete_and_errors_match_injections():
  # The five fast tools here (bench/tools_quality.py runs all seven); ocr and text_search in the next test.
  trajs, injected, observed = rollouts_with_injected_failures(100, 0.5, calls=CALLS[:4] + CALLS[6:])
  assert len(trajs) == 100 and all(t.final_response == 'Agra' for t in trajs)
  # 100 episodes x 5 calls = 500 draws in one sequence (the injector's lock orders them; which episode gets which
  # draw may vary, the totals per kind do not).
  want = collections.Counter(k for k in _expected_draws(500, 0.5, KINDS, 0) if k)
  assert want == {'backend_error': 90, 'http_error': 78, 'timeout': 71}
  assert observed == injected == want


def test_rollouts_calling_all_seven_tools_with_injected_failures_match_counts():
  trajs, injected, observed = rollouts_with_injected_failures(6, 0.5, seed=1)
  assert len(trajs) == 6 and all(t.final_response == 'Agra' for t in trajs)
  want = collections.Counter(k for k in _expected_draws(6 * 7, 0.5, KINDS, 1) if k)  # 6 episodes x 7 calls
  assert want == {'backend_error': 8, 'http_error': 7, 'timeout': 4}
  assert observed == injected == want
