"""How the asyncio agent loop (`agent_loop.run_episodes_async`) asks an engine for assistant turns.

Each running episode awaits `queue.generate(key, context, cap)` for its next turn. Two queues, chosen by
`engine.Engine.continuous_batching` (`make_queue`):

  - `BatchQueue` (in-process engines: `JaxSampler`, `TextEngine`): the turns of the episodes that are waiting are
    gathered into ONE `engine.agenerate` call, rows in episode order, once every running episode waits (none is
    in a tool call) and no call is in flight. So the embedded sampler keeps its batch (one program per turn for
    the whole group) and, with every episode running at once, the calls are exactly those of the former
    turn-by-turn loop: same batches, same row order, same sampler PRNG draws, same trajectories. The trade-off:
    an episode whose tool answers early waits for the slowest tool call of its turn before it generates again
    (the JAX sampler cannot add rows to a running batch).
  - `DirectQueue` (servers that batch concurrent requests themselves: `SGLangEngine`): each turn is sent at once,
    on its own; the server's continuous batching does the gathering, and no episode waits for another.

A failed engine call raises in the episodes it served, which record it (stop_reason 'error'). A batch whose call
raises is retried one row at a time, so a context the engine refuses fails alone and the others go on.
"""

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

from osvl_jax.rollout import engine as engine_lib


def _cap(caps: Sequence[int | None]) -> int | None:
  """The max_new_tokens of a batch: the largest row cap (None when any row has none)."""
  return None if any(c is None for c in caps) else max(caps)


def _new_tokens(gens: Sequence[engine_lib.Generation]) -> int:
  return int(sum(g.ids.size for g in gens))


async def _call(engine: engine_lib.Engine, contexts: list, cap: int | None, stop: Sequence[str] | None,
                sampling: engine_lib.Sampling | None) -> list[engine_lib.Generation]:
  """`engine.agenerate`, checked to return one generation per context.

  Raises:
    RuntimeError: the engine returned another number of generations; any error of the engine itself.
  """
  gens = list(await engine.agenerate(contexts, max_new_tokens=cap, stop=stop, sampling=sampling))
  if len(gens) != len(contexts):
    raise RuntimeError(f'{type(engine).__name__}.agenerate returned {len(gens)} generations for '
                       f'{len(contexts)} contexts')
  return gens


class DirectQueue:
  """One `engine.agenerate` call per turn, sent as soon as the episode asks (a server batches them)."""

  def __init__(self, engine: engine_lib.Engine, stop: Sequence[str] | None,
               log_fn: Callable[[dict], None] | None = None, sampling: engine_lib.Sampling | None = None):
    self.engine, self.stop, self.log_fn, self.sampling = engine, stop, log_fn, sampling
    self.calls = 0

  def join(self, key: int) -> None:
    """Registers a running episode (nothing to do without batching)."""

  def leave(self, key: int) -> None:
    """Unregisters an episode that ended (nothing to do without batching)."""

  async def generate(self, key: int, context: Any, cap: int | None) -> engine_lib.Generation:
    """The next assistant turn of episode `key` for `context` (`(prompt_ids int32 [T], images)`), at most `cap`
    new ids (None: the engine's default). Raises whatever the engine raised."""
    del key
    t0 = time.perf_counter()
    (gen,) = await _call(self.engine, [context], cap, self.stop, self.sampling)
    self.calls += 1
    if self.log_fn is not None:
      self.log_fn({'turn': self.calls - 1, 'active': 1, 'generate_s': time.perf_counter() - t0, 'tools_s': 0.0,
                   'new_tokens': _new_tokens([gen])})
    return gen


class BatchQueue:
  """Gathers the waiting episodes' turns into one `engine.agenerate` call (see the module docstring).

  A call is dispatched when every registered episode is waiting and no call is in flight; its rows are in
  episode-key order; its max_new_tokens is the largest row cap (the agent loop checks each row's own budget).
  Runs on one event loop; not thread-safe.

  Attributes:
    calls: engine calls made so far (a failed batch's per-row retries included).
  """

  def __init__(self, engine: engine_lib.Engine, stop: Sequence[str] | None,
               log_fn: Callable[[dict], None] | None = None, sampling: engine_lib.Sampling | None = None):
    self.engine, self.stop, self.log_fn, self.sampling = engine, stop, log_fn, sampling
    self.live: set[int] = set()
    self.pending: dict[int, tuple[Any, int | None, asyncio.Future]] = {}
    self.calls = 0
    self._in_flight: asyncio.Task | None = None
    self._check_scheduled = False
    self._idle_since = time.perf_counter()

  def join(self, key: int) -> None:
    """Registers episode `key` as running: no batch is sent while it is busy (in a tool call)."""
    self.live.add(key)

  def leave(self, key: int) -> None:
    """Unregisters episode `key` (it ended); the others may now be all waiting."""
    self.live.discard(key)
    self.pending.pop(key, None)
    self._dispatch()

  async def generate(self, key: int, context: Any, cap: int | None) -> engine_lib.Generation:
    """The next assistant turn of episode `key` (see `DirectQueue.generate`); waits for its batch."""
    future = asyncio.get_running_loop().create_future()
    self.pending[key] = (context, cap, future)
    self._dispatch()
    try:
      return await future
    finally:
      if key in self.pending and self.pending[key][2] is future:  # cancelled before its batch left
        del self.pending[key]

  def _dispatch(self) -> None:
    """Checks for a full batch once the tasks that are ready now have run (so they can join and ask first)."""
    if not self._check_scheduled:
      self._check_scheduled = True
      asyncio.get_running_loop().call_soon(self._dispatch_now)

  def _dispatch_now(self) -> None:
    self._check_scheduled = False
    if self._in_flight is not None or not self.pending or len(self.pending) < len(self.live):
      return
    batch = [(k, *self.pending[k]) for k in sorted(self.pending)]
    self.pending = {}
    self._in_flight = asyncio.ensure_future(self._run(batch))
    self._in_flight.add_done_callback(lambda task: self._done(task, batch))

  def _done(self, task: asyncio.Task, batch: list) -> None:
    self._in_flight = None
    error = None if task.cancelled() else task.exception()
    for *_, future in batch:  # only left unset if `_run` itself failed: never leave an episode hanging
      if not future.done():
        future.set_exception(error or RuntimeError('the batch was cancelled'))
    self._dispatch()

  async def _run(self, batch: list[tuple[int, Any, int | None, asyncio.Future]]) -> None:
    tools_s = time.perf_counter() - self._idle_since
    t0 = time.perf_counter()
    contexts = [c for _, c, _, _ in batch]
    try:
      outcomes: list[Any] = await _call(self.engine, contexts, _cap([cap for _, _, cap, _ in batch]), self.stop,
                                        self.sampling)
    except Exception as e:  # pylint: disable=broad-except
      outcomes = [e]
    self.calls += 1
    if isinstance(outcomes[0], Exception) and len(batch) > 1:  # find the rows that fail: one call per row
      outcomes = []
      for _, context, cap, _ in batch:
        try:
          outcomes.extend(await _call(self.engine, [context], cap, self.stop, self.sampling))
        except Exception as e:  # pylint: disable=broad-except  # recorded on that episode's trajectory
          outcomes.append(e)
        self.calls += 1
    self._idle_since = time.perf_counter()
    if self.log_fn is not None:
      gens = [g for g in outcomes if isinstance(g, engine_lib.Generation)]
      self.log_fn({'turn': self.calls - 1, 'active': len(batch), 'generate_s': self._idle_since - t0,
                   'tools_s': tools_s, 'new_tokens': _new_tokens(gens)})
    for (_, _, _, future), outcome in zip(batch, outcomes):
      if future.done():  # its episode stopped waiting (time budget)
        continue
      if isinstance(outcome, Exception):
        future.set_exception(outcome)
      else:
        future.set_result(outcome)


def make_queue(engine: engine_lib.Engine, stop: Sequence[str] | None,
               log_fn: Callable[[dict], None] | None = None,
               sampling: engine_lib.Sampling | None = None) -> DirectQueue | BatchQueue:
  """`DirectQueue` for an engine with `continuous_batching`, else `BatchQueue`.

  Args:
    engine: the policy engine.
    stop: stop strings for every call (None: the engine's default).
    log_fn: optional callback receiving one dict per engine call: turn (the call's index), active (its rows),
      generate_s (seconds of the call), tools_s (seconds the loop worked between calls: tool calls, appends;
      0 for `DirectQueue`), new_tokens (ids emitted).
    sampling: sampling settings for every call (None: the engine's defaults).
  """
  cls = DirectQueue if engine.continuous_batching else BatchQueue
  return cls(engine, stop, log_fn, sampling)
