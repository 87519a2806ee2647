"""The experts of stage `sft` and the two-stage rejection of their trajectories (DESIGN.md §7.8; paper Sec. 3).

Experts (`data.synthesize.expert`):
  oracle  the offline default: `synthesize.OracleEngine`, one deterministic episode per item (`num_samples` does
          not apply), kept only when its own process check passes (every hop found in the search results).
  model   any model behind SGLang's native `/generate` API (an SGLang server, the `sglang-router`, or
          `python -m osvl_jax.serve`), through the token-exact `rollout.remote.sglang_client.SGLangEngine`.
  openai  any OpenAI-compatible chat endpoint with image inputs (the paper's frontier-model expert, vLLM, SGLang's
          OpenAI API, `osvl_jax.serve`'s `/v1`), through `rollout.remote.openai_engine.OpenAIEngine`: its text replies
          are rendered by the builder into the token-exact record (no log-probs, which SFT does not need).
The two model experts are built by `rollout.factory.make_engine` (`engine_section`) and run K = `num_samples`
episodes per item through the one agent loop (`rollout.agent_loop.run_episodes`), sampled at `temperature`.

Both go through the same rejection (`judge_trajectory`), with the judge of `data.synthesize.judge`
(`judges.registry`: the rule judge offline, the LLM judge when it names an endpoint):
  stage 1  answer correctness: `judge.accuracy(question, final_response, answers)` must be 1. Rejections:
           'answer: no response (<stop_reason>)', 'answer: incorrect', 'answer: judge error' (a reply the judge
           could not parse after its retries is a rejection, never a crash).
  stage 2  process quality over the trajectory: the judge's process score of the whole trajectory
           (`Judge.process_quality`; the LLM judge's prompt `process_v1`), or, for a judge without a process judge
           (it returns None: the rule judge), its query-quality score over the pre-fatal tool calls
           (`query_quality`, the r_query of Eq. 9); it must reach `min_process_score`.
           Rejections: 'process: below min_process_score', 'process: judge error'.
A trajectory `trajectory.check_trajectory` finds malformed is rejected first ('check_trajectory'). Of the
passing trajectories of an item, at most `keep_per_item` are kept, highest process score first (ties: sample
order): 1 by default, so the SFT split has one expert demonstration per item as with the oracle; 0 keeps every
passing one (the paper keeps the passing rollouts).

Limits of the model expert: `max_concurrency` episodes at once (and as many HTTP connections), `timeout_s` and
`retries` per request (the client's exponential backoff), per episode `max_turns`, `max_new_tokens` per turn,
`max_total_tokens` and `max_seconds`; an endpoint that fails ends the episode (stop_reason 'error'), which is
then rejected at stage 1 with its reason, never a crash.
"""

import concurrent.futures
from collections.abc import Mapping, Sequence

import ml_collections

from osvl_jax import config_checks as checks
from osvl_jax import trajectory as traj_lib
from osvl_jax.judges import registry as judges
from osvl_jax.rollout import factory

EXPERTS = ('oracle', 'model', 'openai')


def default_config() -> ml_collections.ConfigDict:
  """The `data.synthesize` section. Fields:

    enabled: run the `sft` stage.
    expert: 'oracle' (offline default), 'model' (SGLang's native API) or 'openai' (an OpenAI-compatible endpoint).
    base_url: 'model': the SGLang-native server, 'http://HOST:PORT' (no '/v1'; a comma-separated list is used
      round-robin); 'openai': the endpoint with '/v1', e.g. 'https://api.openai.com/v1'.
    model: the expert's name: sent with each request ('openai'), recorded in the stats (both).
    api_key_env: 'openai': the environment variable holding the endpoint's key ('' or unset: `$OSVL_API_KEY`, else
      `$SGLANG_API_KEY`, else none).
    num_samples: K, episodes per item (model expert; paper: 5).
    keep_per_item: passing trajectories kept per item, best process score first (0 = all).
    min_process_score: stage 2 threshold, in [0, 1].
    temperature, top_p: sampling of the model expert.
    max_turns: steps per episode.
    max_new_tokens: ids per assistant turn.
    max_total_tokens: tokens per trajectory (0 = unlimited).
    max_seconds: wall clock per episode, seconds (0 = unlimited).
    max_concurrency: episodes (and HTTP requests) in flight at once.
    timeout_s: seconds per HTTP request.
    retries: retries of a failed request (connection, timeout, 429 / 5xx), exponential backoff.
    judge: `judges.registry.default_config()` (name 'rule' offline; 'llm' with base_url + model).
  """
  c = ml_collections.ConfigDict()
  c.enabled = True
  c.expert = 'oracle'
  c.base_url = ''
  c.model = ''
  c.api_key_env = 'OPENAI_API_KEY'
  c.num_samples = 5
  c.keep_per_item = 1
  c.min_process_score = 0.5
  c.temperature = 1.0
  c.top_p = 1.0
  c.max_turns = 12
  c.max_new_tokens = 1024
  c.max_total_tokens = 16384
  c.max_seconds = 600.0
  c.max_concurrency = 32
  c.timeout_s = 300.0
  c.retries = 3
  c.judge = judges.default_config()
  return c


def check_config(config: ml_collections.ConfigDict, prefix: str = 'data.synthesize') -> None:
  """Fails fast on a `data.synthesize` section that cannot run.

  Raises:
    ValueError: naming the field: an unknown expert, 'model' without base_url, 'openai' without base_url or
      model, a base_url that is not http(s)://, num_samples / max_turns /
      max_new_tokens / max_concurrency not ints >= 1, keep_per_item / retries / max_total_tokens not ints >= 0,
      min_process_score outside [0, 1], an unknown judge name.
  """
  root = config
  for key in reversed(prefix.split('.')):  # the dotted paths the checks name
    root = {key: root}
  checks.choice(root, f'{prefix}.expert', EXPERTS)
  if config.expert == 'model' and not config.base_url:
    raise ValueError(f"{prefix}.base_url='': the model expert needs its server's URL (http://HOST:PORT)")
  if config.expert == 'openai' and not (config.base_url and config.model):
    raise ValueError(f"{prefix}.expert='openai' needs {prefix}.base_url (with /v1) and {prefix}.model, got "
                     f"{config.base_url!r} and {config.model!r}")
  if config.expert != 'oracle':
    factory.url_list(config, 'base_url', prefix)
  for field in ('num_samples', 'max_turns', 'max_new_tokens', 'max_concurrency'):
    checks.positive_int(root, f'{prefix}.{field}')
  for field in ('keep_per_item', 'retries', 'max_total_tokens'):
    checks.number(root, f'{prefix}.{field}', integer=True, low=0)
  checks.number(root, f'{prefix}.min_process_score', low=0, high=1)
  judges.JUDGES.get(config.judge.name)


def make_judge(config: ml_collections.ConfigDict):
  """The judge of `config.judge` (`judges.registry.get_judge`)."""
  return judges.get_judge(config.judge)


def judge_trajectory(traj: traj_lib.Trajectory, judge, min_process_score: float) -> tuple[str, float]:
  """The two-stage rejection of one expert trajectory (module docstring).

  Args:
    traj: a finished trajectory (question, answers, final_response, steps, fatal_step).
    judge: a `judges.base.Judge`; its `process_quality` scores stage 2, or its `query_quality` when it has no
      process judge (`process_quality` returns None).
    min_process_score: the stage 2 threshold.
  Returns:
    ('ok' or the rejection reason, the process score (0.0 when stage 2 was not reached)).
  """
  if traj_lib.check_trajectory(traj):
    return 'check_trajectory', 0.0
  if traj.final_response is None:
    return f'answer: no response ({traj.stop_reason})', 0.0
  verdict = judge.accuracy(traj.question, traj.final_response, list(traj.answers))
  if verdict.error is not None:
    return 'answer: judge error', 0.0
  if verdict.score < 1:
    return 'answer: incorrect', 0.0
  verdict = judge.process_quality(traj.question, traj.steps, list(traj.answers))
  if verdict is None:   # no process judge: r_query over the pre-fatal tool calls stands in
    prefix = traj.steps if traj.fatal_step is None else traj.steps[:traj.fatal_step]
    calls = [s for s in prefix if s.action.kind == 'tool_call']
    verdict = judge.query_quality(traj.question, [(s.action.name, s.action.arguments) for s in calls],
                                  [s.result for s in calls], answers=list(traj.answers),
                                  response=traj.final_response)
  if verdict.error is not None:
    return 'process: judge error', 0.0
  score = float(verdict.score)
  if score < min_process_score:
    return 'process: below min_process_score', score
  return 'ok', score


def select(trajectories: Sequence[traj_lib.Trajectory], judge, min_process_score: float,
           keep_per_item: int) -> tuple[list[traj_lib.Trajectory], dict]:
  """Judges every trajectory (in the judge's `max_concurrency` threads) and keeps the best passing ones of each item.

  Args:
    trajectories: any number per prompt_id, in sample order.
    judge: `judges.base.Judge`.
    min_process_score: stage 2 threshold.
    keep_per_item: passing trajectories kept per prompt_id, highest process score first, ties in sample order
      (0 = all).
  Returns:
    (kept trajectories in input order, counts {'judged', 'passed', 'kept', 'items_kept', 'reasons' (reason ->
    n, rejections only), 'surplus' (passing but over keep_per_item), 'process_score_mean' (over the passing)}).
  """
  with concurrent.futures.ThreadPoolExecutor(max(1, judge.max_concurrency)) as pool:
    verdicts = list(pool.map(lambda t: judge_trajectory(t, judge, min_process_score), trajectories))
  reasons: dict[str, int] = {}
  passing: dict[str, list[tuple[float, int]]] = {}
  for k, (traj, (reason, score)) in enumerate(zip(trajectories, verdicts)):
    if reason == 'ok':
      passing.setdefault(traj.prompt_id, []).append((-score, k))
    else:
      reasons[reason] = reasons.get(reason, 0) + 1
  keep = sorted(k for group in passing.values() for _, k in sorted(group)[:keep_per_item or None])
  scores = [-s for group in passing.values() for s, _ in group]
  counts = {'judged': len(trajectories), 'passed': len(scores), 'kept': len(keep), 'items_kept': len(passing),
            'reasons': dict(sorted(reasons.items(), key=lambda kv: -kv[1])), 'surplus': len(scores) - len(keep),
            'process_score_mean': round(sum(scores) / len(scores), 4) if scores else None}
  return [trajectories[k] for k in keep], counts


def engine_section(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The rollout section (`rollout.factory`) of a model expert: engine 'sglang' ('model') or 'openai', the
  endpoint, sampling, per-turn budget and request limits of `config` (the `data.synthesize` section)."""
  return ml_collections.ConfigDict({
      'engine': 'sglang' if config.expert == 'model' else 'openai', 'urls': str(config.base_url),
      'base_url': str(config.base_url), 'model': str(config.model), 'api_key_env': config.get('api_key_env', ''),
      'max_new_tokens': int(config.max_new_tokens), 'max_total_tokens': int(config.max_total_tokens),
      'temperature': float(config.temperature), 'top_p': float(config.top_p), 'timeout_s': float(config.timeout_s),
      'retries': int(config.retries), 'max_concurrency': int(config.max_concurrency)})


def model_engine(config: ml_collections.ConfigDict, tokenizer):
  """The model expert's engine: `rollout.factory.make_engine(engine_section(config))`, an `SGLangEngine` over
  `config.base_url` ('model') or an `OpenAIEngine` ('openai').

  Raises:
    ValueError: a bad endpoint field (naming it), a parameter out of range.
  """
  return factory.make_engine(engine_section(config), tokenizer)


def model_episodes(prompts: Sequence[Mapping], engine, env, make_builder, config: ml_collections.ConfigDict
                   ) -> list[traj_lib.Trajectory]:
  """K = `config.num_samples` episodes per prompt through `agent_loop.run_episodes` under the config's limits
  (`agent_loop.Limits.from_config(config)`: max_turns, max_new_tokens, max_total_tokens, max_seconds,
  max_concurrency; fatal_k and fatal_index at their defaults).

  Args:
    prompts: `agent_loop.Item`s or mappings (prompt_id, question, image uint8 [H, W, 3], answers).
    engine: the expert's engine (`model_engine`, or any `rollout.engine.Engine`).
    env: `tools.env.ToolEnv`.
    make_builder: `() -> TrajectoryBuilder`.
    config: the `data.synthesize` section.
  Returns:
    N * K trajectories, item-major (`run_episodes`); an endpoint failure ends its episode with stop_reason
    'error' (never raised).
  """
  from osvl_jax.rollout import agent_loop
  return agent_loop.run_episodes(engine, env, make_builder, list(prompts), num_generations=int(config.num_samples),
                                 limits=agent_loop.Limits.from_config(config))
