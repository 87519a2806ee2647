"""The asyncio agent loop: batching of in-process engines, per-episode requests to a server-like engine, engine
failures recorded on their own trajectory, the concurrency limit, the tool pool and the wall-clock budget."""

import asyncio
import threading
import time

import numpy as np
import pytest

from osvl_jax import trajectory as tj
from osvl_jax.rollout import agent_loop
from osvl_jax.rollout import engine as engine_lib
from osvl_jax.rollout.remote import sglang_protocol as protocol

CROP = tj.render_assistant_text('Zoom in.', tool_call={'name': 'crop', 'arguments': {
    'image': 'img_1', 'x': 0, 'y': 0, 'width': 32, 'height': 16}})
ANSWER = tj.render_assistant_text('I know it now.', response='Agra')
SCRIPT = [CROP, CROP, ANSWER]


def _items(n, bad=()):
  image = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
  return [{'prompt_id': f'q{k}', 'question': f'Question {"bad" if k in bad else k}: where?', 'image': image,
           'answers': ['Agra']} for k in range(n)]


class ServerLike(engine_lib.ScriptedEngine):
  """A ScriptedEngine the loop treats as a server: one request per turn, no batching by the loop."""
  continuous_batching = True


class FailingEngine(engine_lib.ScriptedEngine):
  """Raises an EngineError at step `fail_step` for every batch holding a 'Question bad' context."""

  def __init__(self, tokenizer, fail_step=1, batching=False):
    super().__init__(SCRIPT, tokenizer)
    self.fail_step = fail_step
    self.continuous_batching = not batching

  def generate(self, contexts, max_new_tokens=None, stop=None, sampling=None):
    for c in map(engine_lib.as_context, contexts):
      if (engine_lib.count_assistant_turns(c.prompt_ids, self.tokenizer) == self.fail_step
          and 'Question bad' in self.tokenizer.decode(c.prompt_ids.tolist())):
        raise protocol.EngineError(protocol.ERROR_CONNECTION, "ConnectError('refused')", 'http://w1:30000', None, 1)
    return super().generate(contexts, max_new_tokens, stop)


class SlowEnv:
  """The real ToolEnv behind `seconds` of latency per call; counts the calls in flight at once."""

  def __init__(self, env, seconds):
    self.env, self.seconds = env, seconds
    self.lock = threading.Lock()
    self.in_flight = self.most_in_flight = 0

  def call(self, name, arguments, images=()):
    with self.lock:
      self.in_flight += 1
      self.most_in_flight = max(self.most_in_flight, self.in_flight)
    try:
      time.sleep(self.seconds)
      return self.env.call(name, arguments, images)
    finally:
      with self.lock:
        self.in_flight -= 1


def _ids(trajs):
  return [t.token_ids.tolist() for t in trajs]


def test_batched_direct_and_limited_runs_give_the_same_trajectories(tokenizer, env, make_builder):
  items = _items(3)
  batched_engine = engine_lib.ScriptedEngine(SCRIPT, tokenizer)
  batched = agent_loop.run_episodes(batched_engine, env, make_builder, items, num_generations=2, max_turns=4)
  assert [len(c) for c in batched_engine.calls] == [6, 6, 6]  # one call per turn for the 6 episodes
  direct_engine = ServerLike(SCRIPT, tokenizer)
  direct = agent_loop.run_episodes(direct_engine, env, make_builder, items, num_generations=2, max_turns=4,
                                   max_concurrency=3, tool_workers=4)
  assert [len(c) for c in direct_engine.calls] == [1] * 18  # 6 episodes x 3 turns, one request each
  limited = agent_loop.run_episodes(engine_lib.ScriptedEngine(SCRIPT, tokenizer), env, make_builder, items,
                                    num_generations=2, max_turns=4, max_concurrency=2)
  assert _ids(direct) == _ids(batched) == _ids(limited)
  assert [(t.prompt_id, t.sample_index) for t in direct] == [(f'q{k}', g) for k in range(3) for g in range(2)]
  assert all(t.stop_reason == 'response' and len(t.steps) == 3 and len(t.images) == 3 for t in direct)


@pytest.mark.parametrize('batching', [True, False])
def test_an_engine_error_ends_only_its_own_trajectory(tokenizer, env, make_builder, batching):
  engine = FailingEngine(tokenizer, fail_step=1, batching=batching)
  items = _items(4, bad=(1, 2))
  trajs = agent_loop.run_episodes(engine, env, make_builder, items, num_generations=2, max_turns=4)
  assert [(t.prompt_id, t.sample_index) for t in trajs] == [(f'q{k}', g) for k in range(4) for g in range(2)]
  reasons = [t.stop_reason for t in trajs]
  assert reasons == ['response'] * 2 + ['error'] * 4 + ['response'] * 2
  good = agent_loop.run_episodes(engine_lib.ScriptedEngine(SCRIPT, tokenizer), env, make_builder, _items(4),
                                 num_generations=2, max_turns=4)
  assert _ids([trajs[k] for k in (0, 1, 6, 7)]) == _ids([good[k] for k in (0, 1, 6, 7)])  # untouched
  for t in trajs[2:6]:
    assert t.error == ("engine FailingEngine failed at step 1: EngineError: connection: ConnectError('refused') "
                       '(url=http://w1:30000, status=None, attempts=1)')
    assert len(t.steps) == 1 and t.steps[0].result.ok  # the last whole step: the crop and its observation
    assert t.final_response is None and not t.steps[-1].format_ok
    assert all(s.result is None or s.result.error_kind is None for s in t.steps)  # never a tool error
    assert tj.check_trajectory(t) == []
  # The failing contexts of a batch are found row by row; the others of that batch are answered.
  if batching:
    assert [len(c) for c in engine.calls] == [8, 1, 1, 1, 1, 4]  # the refused rows are not recorded


def test_max_concurrency_bounds_the_episodes_in_flight_and_tools_overlap(tokenizer, env, make_builder):
  items = _items(8)
  seconds = {}
  for limit in (1, 4):
    slow = SlowEnv(env, 0.2)
    t0 = time.perf_counter()
    trajs = agent_loop.run_episodes(ServerLike(SCRIPT, tokenizer), slow, make_builder, items, max_turns=4,
                                    max_concurrency=limit, tool_workers=8)
    seconds[limit] = time.perf_counter() - t0
    assert slow.most_in_flight == limit  # 8 episodes, at most `limit` at once, blocked in their tools together
    assert all(t.stop_reason == 'response' for t in trajs)
  # 16 calls of 0.2 s: 3.2 s of sleep one at a time, 0.8 s four at a time; the loop's own work is the same.
  assert seconds[1] - seconds[4] > 0.5 * (3.2 - 0.8), seconds
  slow = SlowEnv(env, 0.05)
  agent_loop.run_episodes(ServerLike(SCRIPT, tokenizer), slow, make_builder, items, max_turns=4,
                          max_concurrency=8, tool_workers=1)
  assert slow.most_in_flight == 1  # one tool thread: one call at a time


def test_the_time_budget_stops_an_episode_at_its_last_whole_step(tokenizer, env, make_builder):
  class SlowEngine(ServerLike):
    async def agenerate(self, contexts, max_new_tokens=None, stop=None, sampling=None):
      text = self.tokenizer.decode(engine_lib.as_context(contexts[0]).prompt_ids.tolist())
      if 'Question bad' in text and engine_lib.count_assistant_turns(contexts[0][0], self.tokenizer) == 1:
        await asyncio.sleep(5)  # the second turn of the 'bad' episode never comes in time
      return await super().agenerate(contexts, max_new_tokens, stop, sampling)

  items = _items(2, bad=(0,))
  t0 = time.perf_counter()
  late, ok = agent_loop.run_episodes(SlowEngine(SCRIPT, tokenizer), env, make_builder, items, max_turns=4,
                                     max_seconds=1.0)
  assert time.perf_counter() - t0 < 5  # the 5 s turn was abandoned at 1 s
  assert late.stop_reason == 'time_budget' and late.truncated and len(late.steps) == 1
  assert late.error is None and tj.check_trajectory(late) == []
  assert ok.stop_reason == 'response' and len(ok.steps) == 3


def test_a_tool_call_cut_by_the_time_budget_is_dropped_whole(tokenizer, env, make_builder):
  slow = SlowEnv(env, 0.6)
  (traj,) = agent_loop.run_episodes(ServerLike(SCRIPT, tokenizer), slow, make_builder, _items(1), max_turns=4,
                                    max_seconds=1.0)
  # Step 0's call ends at ~0.6 s; step 1's call would end at ~1.2 s: the step is dropped, its tool not awaited.
  assert traj.stop_reason == 'time_budget' and len(traj.steps) == 1 and traj.steps[0].result.ok
  full = agent_loop.run_episodes(ServerLike(SCRIPT, tokenizer), env, make_builder, _items(1), max_turns=4)[0]
  end = int(np.flatnonzero(full.step_of_token == 0)[-1]) + 1
  assert traj.token_ids.tolist() == full.token_ids[:end].tolist() and tj.check_trajectory(traj) == []
  with pytest.raises(ValueError, match='max_seconds'):
    agent_loop.run_episodes(ServerLike(SCRIPT, tokenizer), env, make_builder, _items(1), max_seconds=0)


def test_run_episodes_works_inside_a_running_event_loop(tokenizer, env, make_builder):
  async def main():
    sync = agent_loop.run_episodes(engine_lib.ScriptedEngine(SCRIPT, tokenizer), env, make_builder, _items(1))
    native = await agent_loop.run_episodes_async(ServerLike(SCRIPT, tokenizer), env, make_builder, _items(1))
    return sync, native
  (sync,), (native,) = asyncio.run(main())
  assert sync.token_ids.tolist() == native.token_ids.tolist() and sync.stop_reason == 'response'


def test_log_fn_reports_each_engine_call(tokenizer, env, make_builder):
  logs = []
  agent_loop.run_episodes(engine_lib.ScriptedEngine(SCRIPT, tokenizer), env, make_builder, _items(2),
                          num_generations=2, max_turns=4, log_fn=logs.append)
  assert [(r['turn'], r['active']) for r in logs] == [(0, 4), (1, 4), (2, 4)]
  assert all(r['new_tokens'] > 0 and r['generate_s'] >= 0 for r in logs)
