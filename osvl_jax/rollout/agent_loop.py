"""The multi-turn agent loop: policy engine + tool environment -> token-exact Trajectories (DESIGN.md §4-6).

Every episode alternates an assistant turn (from an `engine.Engine`) and, for a tool call, an observation (from
`tools.env.ToolEnv.call`), recorded by a `trajectory.TrajectoryBuilder`. The loop is asyncio
(`run_episodes_async`; `run_episodes` is its synchronous wrapper): every episode is a task that runs at its own
pace under a concurrency limit (`max_concurrency`), its tool calls in a thread pool (`tool_workers`), its turns
asked through `turn_queue`: one batched `generate` for all waiting episodes of an in-process engine (the former
turn-by-turn batches, hence the same trajectories), one request per turn to a server that batches itself.

Per step l:
  - `<response>` -> the episode ends (final_response is set by the builder).
  - a readable `<tool_call>` -> `env.call(name, arguments, images so far)`; its ToolResult is the observation.
  - anything else (no action, unreadable JSON, ...) -> a `malformed_call` ToolResult (ok False) whose text tells
    the model what went wrong and what is expected; it is an execution error like any other.
  - r_fmt^(l) (`Step.format_ok`, DESIGN §6): one think block + exactly one tool_call and a result that is not an
    execution error, for l < L; one think block + exactly one response for l = L. So a last step that is not a
    response (max_turns, fatal cascade, token budget) has format_ok False.
Episodes end on a response, after `max_turns` steps, at fatality (n_err consecutive execution errors reaches
`fatal_k`; `fatal_step` = f_i per `fatal_index`, `rl.fatal.fatal_step`), or when a token budget
(`max_total_tokens`, `max_response_tokens`) would be exceeded (the trajectory then ends at the last whole step that
fits). The reason is recorded in `Trajectory.stop_reason`. Bad model output never raises.

Nothing a tool, the engine, the image processor or the builder raises leaves `run_episodes` (DESIGN §4, §6b); each
failure stays with its own trajectory, and the other items and samples of the batch are untouched:
  - a prompt that cannot be rendered (an input image the processor refuses: not uint8 RGB, empty, aspect ratio
    over 200; a prompt over `max_prompt_tokens` or with no room under `max_total_tokens`, `prompt_over_budget`; a
    question the tokenizer refuses) -> its samples are prompt-only trajectories with no steps, stop_reason 'error' and
    `Trajectory.error` naming the prompt_id and the reason (logged, with a count). Their ids are the prompt
    rendered without what failed: without its images, and also without the question when that still fails or
    is over the budget; so they pass `check_trajectory`, `train.batching.collate` accepts them, and they carry
    no gradient (no generated token; r_fmt = 0 with no steps, so the group's advantages are 0);
  - an observation the builder cannot append (an image the processor refuses, e.g. a 300x1 crop whose aspect
    ratio is over 200; text the tokenizer refuses) -> that step gets a `bad_arguments` error result instead,
    naming the reason, and the episode goes on;
  - an engine failure (`sglang_protocol.EngineError` after the client's retries: refused connection, 5xx,
    timeout; any exception of `Engine.agenerate`) -> that trajectory ends at its last whole step with
    stop_reason 'error' and `Trajectory.error` = 'engine <class> failed at step <l>: <type>: <cause>' (never a
    tool error); a failed batch of an in-process engine is retried row by row, so only the failing rows end;
  - an engine output the policy cannot have produced (`engine.check_generation`: an id outside the vocabulary, a
    log-prob that is NaN, infinite or positive) -> the same engine error, naming the value;
  - anything else (an error observation that cannot be appended either) -> that
    trajectory ends at its last whole step with stop_reason 'error' and `Trajectory.error` saying why.
The builder's appends are transactional, so a failed append leaves no partial observation or step, and the other
episodes of the batch are untouched. A turn with vision ids (from an engine other than the embedded sampler,
which never samples them) is a malformed step whose ids are kept but read as text by the model.

Token and time budgets (`limits.Limits`; its docstring says how each is counted and where an episode is cut):
`max_prompt_tokens` (a longer prompt is refused, never cut), `max_response_tokens` (everything after the prompt:
assistant turns and observations), `max_total_tokens` (the whole sequence), `max_new_tokens` (per turn), the engine's
own context, and `max_seconds` (wall clock). A step that would cross a token budget is dropped whole: the
trajectory ends at the last whole step (stop_reason 'token_budget'), never inside a tool call or an image span.
"""

import asyncio
import concurrent.futures
import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from absl import logging

from osvl_jax import trajectory as traj_lib
from osvl_jax.rl import fatal as fatal_lib
from osvl_jax.rollout import engine as engine_lib
from osvl_jax.rollout import turn_queue
from osvl_jax.rollout.limits import Limits  # pylint: disable=unused-import  # agent_loop.Limits, the callers' name
from tools import base as tools_base

MALFORMED_HINT = ('Reply with <think>...</think> followed by exactly one <tool_call>{"name": <tool name>, '
                  '"arguments": {...}}</tool_call>, or <response>final answer</response>.')


@dataclasses.dataclass
class Item:
  """One question to roll out.

  Attributes:
    prompt_id: group key of its trajectories.
    question: the user question.
    image: uint8 [H, W, 3] RGB input image (img_1), or None.
    answers: accepted answers (copied into each Trajectory; may be empty).
  """
  prompt_id: str
  question: str
  image: np.ndarray | None = None
  answers: Sequence[str] = ()


def as_item(item: Item | Mapping[str, Any] | Any) -> Item:
  """An `Item` from an Item, a mapping with its fields, or any object with those attributes."""
  if isinstance(item, Item):
    return item
  get = item.get if isinstance(item, Mapping) else (lambda k, d=None: getattr(item, k, d))
  return Item(prompt_id=str(get('prompt_id')), question=get('question'), image=get('image', None),
              answers=list(get('answers', ()) or ()))


class _Episode:
  """Mutable state of one running episode."""

  def __init__(self, item: Item, sample_index: int, builder: traj_lib.TrajectoryBuilder):
    self.item = item
    self.sample_index = sample_index
    self.builder = builder
    self.fatal_step: int | None = None
    self.done = False
    self.end_reason: str | None = None
    self.error: str | None = None  # why, for end_reason 'error'
    self.prompt_tokens = builder.num_tokens  # the rendered prompt's (the response budget counts what follows)


def _why(e: BaseException, limit: int = 500) -> str:
  """'Type: message' of an exception, valid UTF-8, at most `limit` characters."""
  return f'{type(e).__name__}: {e}'.encode('utf-8', 'backslashreplace').decode('utf-8')[:limit]


def _start(item: Item, sample_index: int, make_builder: Callable[[], traj_lib.TrajectoryBuilder],
           prompt_limit: int | None, budgets: str) -> _Episode:
  """An episode with its prompt rendered; one whose prompt cannot be rendered is over at once.

  That one is a prompt-only episode (stop_reason 'error', `error` naming the prompt_id and the reason) whose ids
  are the prompt without what failed: without its images, else also without the question (the builder's
  `start` is transactional, so the refused attempt left it empty).
  """
  builder = make_builder()
  try:
    builder.start(item.question, item.image, max_tokens=prompt_limit)
    return _Episode(item, sample_index, builder)
  except Exception as e:  # pylint: disable=broad-except  # a refused image, a prompt over budget, bad text
    why = _why(e) + (f' ({budgets})' if isinstance(e, traj_lib.PromptTooLongError) else '')
  episode = _Episode(item, sample_index, builder)   # prompt_tokens 0: nothing rendered yet
  episode.done, episode.end_reason = True, 'error'
  episode.error = f'prompt_id={item.prompt_id!r}: the prompt cannot be rendered: {why}'
  for question in (item.question, ''):
    try:
      builder.start(question, None, max_tokens=prompt_limit)
      break
    except Exception:  # pylint: disable=broad-except
      continue
  else:  # the system prompt alone is over the budget: every prompt fails; keep the record anyway
    builder.start('', None)
  builder.question = item.question
  return episode


def prompt_over_budget(traj: traj_lib.Trajectory) -> bool:
  """True for a prompt-only trajectory whose prompt was refused for its token budget (`max_prompt_tokens`, or no
  room under `max_total_tokens`): `_start` names the `trajectory.PromptTooLongError` in its `error`."""
  return (traj.stop_reason == 'error' and not traj.steps and traj.error is not None
          and f'cannot be rendered: {traj_lib.PromptTooLongError.__name__}: ' in traj.error)


def malformed_result(action: traj_lib.ParsedAction) -> tools_base.ToolResult:
  """The observation for an assistant turn whose action cannot be executed (ok False, `malformed_call`)."""
  why = action.error or 'no <tool_call> or <response> found'
  return tools_base.error('malformed_call', f'Malformed tool call: {why}. {MALFORMED_HINT}')


def _call_tool(env, action: traj_lib.ParsedAction, images) -> tools_base.ToolResult:
  """env.call, with any escaping exception turned into a `backend_error` (ToolEnv itself never raises)."""
  t0 = time.perf_counter()
  try:
    return env.call(action.name, dict(action.arguments or {}), [im.pixels for im in images])
  except Exception as e:  # pylint: disable=broad-except
    return tools_base.error('backend_error', f'{action.name} failed: {type(e).__name__}: {e}',
                            seconds=time.perf_counter() - t0)


async def _call_tool_retrying(env, pool: concurrent.futures.Executor, action: traj_lib.ParsedAction, images,
                              limits: Limits) -> tuple[tools_base.ToolResult, int]:
  """`_call_tool` in the tool pool; with `limits.env_errors` 'retry', a result that is an environment error
  (`ToolResult.is_environment_error`) is retried up to `limits.env_retries` times, after env_retry_backoff_s x
  2^attempt seconds each (asyncio sleeps: the other episodes go on).

  Returns:
    (the result the policy sees, with `seconds` the wall time of every attempt and backoff; the environment
    errors retried before it).
  """
  loop = asyncio.get_running_loop()
  t0, retries = time.perf_counter(), limits.retries()
  for attempt in range(retries + 1):
    result = await loop.run_in_executor(pool, _call_tool, env, action, images)
    if attempt == retries or not result.is_environment_error:
      break
    await asyncio.sleep(limits.env_retry_backoff_s * 2 ** attempt)
  if attempt:
    result.seconds = time.perf_counter() - t0
  return result, attempt


def run_episodes(engine: engine_lib.Engine, env, make_builder: Callable[[], traj_lib.TrajectoryBuilder],
                 items: Sequence[Item | Mapping[str, Any]], *args, **kwargs) -> list[traj_lib.Trajectory]:
  """`run_episodes_async` to completion, for synchronous callers (same arguments, same trajectories).

  Runs a fresh event loop (in a worker thread when the calling thread already runs one).
  """
  coroutine = run_episodes_async(engine, env, make_builder, items, *args, **kwargs)
  try:
    asyncio.get_running_loop()
  except RuntimeError:
    return asyncio.run(coroutine)
  with concurrent.futures.ThreadPoolExecutor(1) as pool:
    return pool.submit(asyncio.run, coroutine).result()


async def run_episodes_async(engine: engine_lib.Engine, env,
                             make_builder: Callable[[], traj_lib.TrajectoryBuilder],
                             items: Sequence[Item | Mapping[str, Any]], num_generations: int = 1,
                             limits: 'Limits | None' = None, *, stop: Sequence[str] = (),
                             sampling: engine_lib.Sampling | None = None, policy_version: int = 0,
                             log_fn: Callable[[dict], None] | None = None,
                             **limit_fields) -> list[traj_lib.Trajectory]:
  """Rolls out `num_generations` episodes per item, all concurrently (asyncio), each at its own pace.

  Args:
    engine: the policy (`JaxSampler`, `SGLangEngine`, `OpenAIEngine`, the pipeline's `OracleEngine`, or
      `ScriptedEngine` in tests). Its turns are asked through `turn_queue.make_queue`: gathered into one batch per
      call for an in-process engine, one request per turn for a server (`Engine.continuous_batching`).
    env: a `tools.env.ToolEnv` (anything with `call(name, arguments, images) -> ToolResult`); its calls run in a
      pool of `limits.tool_workers` threads, so a slow tool blocks no other episode.
    make_builder: `() -> TrajectoryBuilder`, a fresh builder (tokenizer, image processor, tool schemas, profile).
    items: N items (`Item`, or mappings with prompt_id, question, image uint8 [H, W, 3] | None, answers).
    num_generations: G episodes per item (the GRPO group).
    limits: the budgets (`Limits`; callers with a config section: `Limits.from_config(section)`); None = the
      defaults of `Limits`.
    stop: stop strings passed to the engine (empty: the engine's default).
    sampling: the engine's sampling settings for every turn of this call (`engine.Sampling`; None: the engine's
      defaults).
    policy_version: recorded in each Trajectory.
    log_fn: optional callback receiving one dict per engine call (turn, active, generate_s, tools_s,
      new_tokens; `turn_queue.make_queue`).
    **limit_fields: `Limits` fields that replace those of `limits` (e.g. `max_turns=4` in tests).

  Returns:
    N * G Trajectories, item-major (item i, samples 0..G-1), with steps, final_response, fatal_step,
    rollout_logprobs from the engine, `policy_version` and `stop_reason`.
    A prompt that cannot be rendered (refused input image, over `max_prompt_tokens`, no room under
    `max_total_tokens`) gives G prompt-only trajectories with no steps, stop_reason 'error' and
    `Trajectory.error` saying why. An engine failure (e.g. `sglang_protocol.EngineError` after the client's
    retries) ends that trajectory at its last whole step, stop_reason 'error', `Trajectory.error` naming the
    engine and the cause; the other episodes go on. Nothing a tool, the engine, the image processor or the
    builder raises leaves this function.
  Raises:
    ValueError: a limit out of range (`Limits`), before any rollout.
    TypeError: a keyword that is not a `Limits` field.
  """
  limits = dataclasses.replace(limits or Limits(), **limit_fields)
  budgets = f'max_prompt_tokens={limits.max_prompt_tokens}, max_total_tokens={limits.max_total_tokens}'
  episodes = [_start(item, g, make_builder, limits.prompt_limit(), budgets)
              for item in map(as_item, items) for g in range(num_generations)]
  failed = [e for e in episodes if e.done]
  if failed:
    logging.warning('run_episodes: %d of %d prompts could not be rendered; their %d trajectories are prompt-only '
                    "(stop_reason 'error'). First: %s", len({id(e.item) for e in failed}),
                    len({id(e.item) for e in episodes}), len(failed), failed[0].error)

  queue = turn_queue.make_queue(engine, tuple(stop) if stop else None, log_fn, sampling)
  semaphore = asyncio.Semaphore(limits.max_concurrency or max(len(episodes), 1))
  pool = concurrent.futures.ThreadPoolExecutor(limits.tool_workers, thread_name_prefix='tools')

  async def run(key: int, episode: _Episode) -> None:
    try:
      async with semaphore:
        queue.join(key)
        await _run_episode(key, episode, engine, queue, env, pool, limits)
    finally:  # after the release, so the episode that takes this place joins before the next batch leaves
      queue.leave(key)

  try:
    await asyncio.gather(*(run(k, e) for k, e in enumerate(episodes) if not e.done))
  finally:
    pool.shutdown(wait=False)
    await engine.aclose()
  errors = [e for e in episodes if e.end_reason == 'error' and e.error and e.error.startswith('engine ')]
  if errors:
    logging.warning('run_episodes: %d of %d trajectories ended on an engine error. First: %s', len(errors),
                    len(episodes), errors[0].error)

  out = []
  for e in episodes:
    if not e.done:
      e.end_reason = 'max_turns'
    traj = e.builder.finish(prompt_id=e.item.prompt_id, sample_index=e.sample_index, answers=e.item.answers,
                            fatal_step=e.fatal_step, policy_version=policy_version, stop_reason=e.end_reason,
                            error=e.error if e.end_reason == 'error' else None)
    if traj.steps and traj.steps[-1].action.kind != 'response':
      traj.steps[-1].format_ok = False  # r_fmt^(L) needs a response at l = L (DESIGN §6)
    out.append(traj)
  return out


async def _run_episode(key: int, e: _Episode, engine: engine_lib.Engine, queue, env,
                       pool: concurrent.futures.Executor, limits: Limits) -> None:
  """Runs episode `e` to its end, recording why it ended on `e` (never raises but for cancellation)."""
  try:
    async with asyncio.timeout(limits.max_seconds):
      for _ in range(limits.max_turns):
        await _step(key, e, engine, queue, env, pool, limits)
        if e.done:
          break
  except TimeoutError:
    if e.builder.awaiting_observation:  # abandoned in its tool call: drop the step
      e.builder.truncate(len(e.builder.steps) - 1)
    e.done, e.end_reason = True, 'time_budget'
  except Exception as err:  # pylint: disable=broad-except  # a bug must not take the other episodes down
    if e.builder.awaiting_observation:
      e.builder.truncate(len(e.builder.steps) - 1)
    e.done, e.end_reason, e.error = True, 'error', f'the agent loop failed: {_why(err)}'


async def _step(key: int, e: _Episode, engine: engine_lib.Engine, queue, env, pool: concurrent.futures.Executor,
                limits: Limits) -> None:
  """One assistant turn of `e` and, for a tool call, its observation; sets `e.done` when the episode ends."""
  cap = limits.max_new_tokens
  room = limits.room(e.builder.num_tokens, e.prompt_tokens)  # under max_total_tokens and max_response_tokens
  if room is not None:
    if room <= 0:
      e.done, e.end_reason = True, 'token_budget'
      return
    cap = room if cap is None else min(cap, room)
  t0 = time.perf_counter()
  try:
    gen = await queue.generate(key, (e.builder.prompt_ids(), e.builder.images), cap)
    engine_lib.check_generation(gen)  # an id outside the vocabulary, a NaN log-prob: the engine's fault
  except Exception as err:  # pylint: disable=broad-except  # EngineError, refused connection, 5xx, timeout, ...
    e.done, e.end_reason = True, 'error'
    e.error = f'engine {type(engine).__name__} failed at step {len(e.builder.steps)}: {_why(err)}'
    return
  gen_seconds = time.perf_counter() - t0
  needed = gen.ids.size + int(gen.ids.size == 0 or gen.ids[-1] != engine_lib.IM_END_ID)  # + closing im_end
  # (an upper bound: the builder drops ids after the first end-of-sequence id)
  if gen.ids.size == 0 or (room is not None and needed > room):
    e.done, e.end_reason = True, 'token_budget' if gen.ids.size else 'context_full'
    return
  try:
    action = e.builder.append_assistant(gen.ids, gen.logprobs, seconds=gen_seconds,
                                        cut=gen.finish_reason == engine_lib.FINISH_LENGTH,
                                        versions=gen.token_versions())
  except Exception as err:  # pylint: disable=broad-except  # e.g. ids outside the vocabulary; unchanged
    e.done, e.end_reason, e.error = True, 'error', f'the assistant turn cannot be appended: {_why(err)}'
    return
  if action.kind == 'response':
    e.done, e.end_reason = True, 'response'
    return
  if action.kind == 'tool_call':
    result, retried = await _call_tool_retrying(env, pool, action, list(e.builder.images), limits)
    _observe(e, result)
    e.builder.steps[-1].env_retries = retried
  else:
    _observe(e, malformed_result(action))

  if e.builder.awaiting_observation:  # _observe could append neither the result nor an error about it
    e.builder.truncate(len(e.builder.steps) - 1)
    e.done, e.end_reason = True, 'error'
  elif (limits.room(e.builder.num_tokens, e.prompt_tokens) or 0) < 0:
    # The observation (tool text, image spans) crossed a token budget: drop the whole step.
    e.builder.truncate(len(e.builder.steps) - 1)
    e.done, e.end_reason = True, 'token_budget'
  else:
    f = fatal_lib.fatal_step([s.is_execution_error for s in e.builder.steps], limits.fatal_k, limits.fatal_index)
    if f is not None:
      e.fatal_step = f   # the first cascade: `fatal_step` of the steps so far never moves once found
      if limits.stop_at_fatal:
        e.done, e.end_reason = True, 'fatal'


def _observe(episode: _Episode, result: tools_base.ToolResult) -> None:
  """Appends `result` as the observation; one the builder refuses becomes a `bad_arguments` error result.

  When even that cannot be appended, the step is left awaiting its observation (the builder is transactional),
  `episode.error` says why, and the loop ends the episode with stop_reason 'error'.
  """
  builder = episode.builder
  try:
    builder.append_observation(result)
    return
  except Exception as e:  # pylint: disable=broad-except  # an image the processor refuses, untokenizable text
    name = builder.steps[-1].action.name or 'the tool'
    why = _why(e)
    fallback = tools_base.error(
        'bad_arguments', f'{name} returned a result that cannot be shown to the model ({why}). Try other '
        f'arguments.', seconds=float(getattr(result, 'seconds', 0.0) or 0.0))
  try:
    builder.append_observation(fallback)
  except Exception as e:  # pylint: disable=broad-except  # the loop ends the episode ('error')
    episode.error = (f'the observation of step {builder.steps[-1].index} cannot be appended ({why}), nor an '
                     f'error about it ({_why(e)})')

