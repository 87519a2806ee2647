"""The asyncio agent loop against two real `osvl_jax.serve` workers behind a URL list, one killed mid-rollout:
each request that reaches the dead worker ends its own trajectory (stop_reason 'error', the engine and the cause
named), never as a tool error; the other episodes finish; every trajectory is returned, in order. With retries,
the client fails over to the live worker and nothing is lost."""

import numpy as np
import pytest

from osvl_jax import trajectory as tj
from osvl_jax.rollout import agent_loop
from osvl_jax.rollout.remote import sglang_client as sc
from tests.serve.conftest import healthy, serve_process, wait_until
from tools import env as tools_env

# One prompt bucket and a few batch shapes: few compiles on the shared CPUs.
FLAGS = ('--bucket=256', '--max_len=1024')


@pytest.fixture(scope='module')
def workers(tmp_path_factory):
  logs = tmp_path_factory.mktemp('logs')
  with serve_process(logs / 'w0.log', *FLAGS) as (w0, p0), serve_process(logs / 'w1.log', *FLAGS) as (w1, p1):
    wait_until(lambda: healthy(w0), 120, 'worker 0', p0, logs / 'w0.log')
    wait_until(lambda: healthy(w1), 120, 'worker 1', p1, logs / 'w1.log')
    yield (w0, p0), (w1, p1)


def _rollout(engine, tokenizer, processor, log_fn=None):
  env = tools_env.ToolEnv({'enabled': ('crop',)})
  make_builder = lambda: tj.TrajectoryBuilder(tokenizer, processor, [], system_prompt='Answer.')
  items = [{'prompt_id': f'q{k}', 'question': f'Question {k}?', 'image': None, 'answers': ['x']} for k in range(4)]
  return agent_loop.run_episodes(engine, env, make_builder, items, num_generations=2, max_turns=3, fatal_k=3,
                                 max_new_tokens=6, max_concurrency=8, log_fn=log_fn)


def test_a_worker_killed_mid_rollout_ends_only_the_episodes_it_fails(workers, tokenizer, processor):
  (w0, _), (w1, p1) = workers
  engine = sc.SGLangEngine([w0, w1], tokenizer, max_new_tokens=6, temperature=1.0, retries=0, timeout=60)
  calls = []

  def kill_after_first_turns(record):  # runs on the event loop after each answered request
    calls.append(record)
    if len(calls) == 8 and p1.poll() is None:  # every episode has its first turn: kill worker 1 now
      p1.kill()
      p1.wait(timeout=20)

  trajs = _rollout(engine, tokenizer, processor, kill_after_first_turns)
  assert p1.poll() is not None
  assert [(t.prompt_id, t.sample_index) for t in trajs] == [(f'q{k}', g) for k in range(4) for g in range(2)]
  failed = [t for t in trajs if t.stop_reason == 'error']
  served = [t for t in trajs if t.stop_reason != 'error']
  assert failed and served, [t.stop_reason for t in trajs]
  for t in failed:
    assert t.error.startswith(f'engine SGLangEngine failed at step {len(t.steps)}: EngineError: connection:')
    assert f'url={w1}' in t.error and 'attempts=1' in t.error
    assert 1 <= len(t.steps) < 3  # its turns before the kill are kept whole
  for t in served:
    assert t.stop_reason in ('fatal', 'max_turns', 'response') and t.error is None
  for t in trajs:
    assert tj.check_trajectory(t) == []
    # Engine failures are never tool errors: every observation is the random policy's own malformed call.
    assert {s.result.error_kind for s in t.steps if s.result is not None} <= {'malformed_call'}
    assert np.all(t.rollout_logprobs[t.gen_mask] <= 0)
  assert engine.stats['errors'] == len(failed)

  # The same rollout with one retry fails over to the live worker: nothing is lost.
  engine = sc.SGLangEngine([w0, w1], tokenizer, max_new_tokens=6, temperature=1.0, retries=1, backoff=0.0,
                           timeout=60)
  trajs = _rollout(engine, tokenizer, processor)
  assert [t.stop_reason for t in trajs if t.stop_reason == 'error'] == []
  assert engine.stats['retries'] >= 8 and engine.stats['errors'] == 0  # half of the >= 16 requests went to w1
