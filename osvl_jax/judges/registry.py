"""Judges by name (big_vision / Tunix style): the source of r_acc and r_query in Eq. 9 (DESIGN.md §6).

A judge has two methods, each returning a `Verdict` and never raising:

  accuracy(question, response, answers) -> Verdict       score ∈ {0, 1}: does the response contain the answer
  query_quality(question, tool_calls, results) -> Verdict score ∈ [0, 1] over the pre-fatal tool calls

Registered judges:
  rule  offline default, `osvl_jax.judges.rule` (deterministic heuristics, no network);
  llm   any OpenAI-compatible chat endpoint, `osvl_jax.judges.llm` (base_url, model, temperature 0).

Pick one with `config.judge.name`; the other fields of `default_config()` configure the `llm` judge.

  judge = registry.get_judge(config.get('judge'))        # None -> the rule judge
  r_acc = judge.accuracy(question, response, answers).score
"""

import dataclasses
import threading
from typing import Any, Callable, Sequence

import ml_collections

from osvl_jax.judges import rule


@dataclasses.dataclass(frozen=True)
class Verdict:
  """One judgement.

  Attributes:
    score: r_acc ∈ {0, 1} or r_query ∈ [0, 1]. After a judge error, the fallback value.
    error: None, or why the judge could not give a verdict (after its retries); the score is then a fallback.
    raw: the judge model's raw reply (last attempt), '' for the rule judge.
  """
  score: float
  error: str | None = None
  raw: str = ''


class Judge:
  """Interface of a judge; subclasses override `accuracy` and `query_quality`.

  `stats()` returns counters (calls, errors, retries, cache_hits) as ints; they are thread-safe.
  """
  name = 'base'

  def __init__(self):
    self._lock = threading.Lock()
    self._counts = {'calls': 0, 'errors': 0, 'retries': 0, 'cache_hits': 0}

  def _count(self, key: str, n: int = 1) -> None:
    with self._lock:
      self._counts[key] += n

  def stats(self) -> dict[str, int]:
    with self._lock:
      return dict(self._counts)

  def accuracy(self, question: str, response: str | None, answers: Sequence[str]) -> Verdict:
    raise NotImplementedError

  def query_quality(self, question: str, tool_calls: Sequence[tuple[str, Any]],
                    results: Sequence[Any]) -> Verdict:
    raise NotImplementedError


class RuleJudge(Judge):
  """The offline rule judge (`osvl_jax.judges.rule`): normalised containment / numeric match, query heuristic."""
  name = 'rule'

  def __init__(self, config: ml_collections.ConfigDict | None = None):
    super().__init__()
    del config

  def accuracy(self, question, response, answers):
    del question
    self._count('calls')
    return Verdict(rule.accuracy(response, answers))

  def query_quality(self, question, tool_calls, results):
    self._count('calls')
    return Verdict(rule.query_quality(tool_calls, results, question))


JudgeFactory = Callable[[ml_collections.ConfigDict], Judge]
_JUDGES: dict[str, JudgeFactory] = {}


def register_judge(name: str) -> Callable[[JudgeFactory], JudgeFactory]:
  """Decorator registering a judge class / factory `(config) -> Judge` under `name`."""
  def decorator(factory: JudgeFactory) -> JudgeFactory:
    if name in _JUDGES:
      raise ValueError(f'judge {name!r} is already registered')
    _JUDGES[name] = factory
    return factory
  return decorator


register_judge('rule')(RuleJudge)


def _llm_judge(config: ml_collections.ConfigDict) -> Judge:
  from osvl_jax.judges import llm  # imports the `openai` client only when asked for
  return llm.LLMJudge(config)


register_judge('llm')(_llm_judge)


def judges() -> list[str]:
  return sorted(_JUDGES)


def default_config() -> ml_collections.ConfigDict:
  """Judge settings (`config.judge`). Fields:

    name: registered judge, 'rule' (offline default) or 'llm'.
    base_url: OpenAI-compatible endpoint including `/v1`, e.g. 'http://127.0.0.1:8000/v1' (llm).
    model: model name sent in the request (llm).
    temperature: sampling temperature of the judge (0: deterministic).
    api_key_env: environment variable holding the API key; unset -> 'EMPTY' (local servers need none).
    timeout_s: per-request timeout, seconds.
    max_retries: retries after a failed request or an unparseable reply (bounded), then the error is recorded.
    retry_backoff_s: sleep before retry k is retry_backoff_s * 2**k.
    max_tokens: judge reply budget.
    max_concurrency: trajectories scored in parallel threads (llm).
    on_error: fallback score after the retries: 'rule' (the rule judge's value) or 'zero'.
    max_result_chars: tool-result text shown to the query judge per call.
  """
  c = ml_collections.ConfigDict()
  c.name = 'rule'
  c.base_url = ''
  c.model = ''
  c.temperature = 0.0
  c.api_key_env = 'OPENAI_API_KEY'
  c.timeout_s = 60.0
  c.max_retries = 3
  c.retry_backoff_s = 1.0
  c.max_tokens = 512
  c.max_concurrency = 8
  c.on_error = 'rule'
  c.max_result_chars = 600
  return c


def get_judge(config: ml_collections.ConfigDict | dict | None = None) -> Judge:
  """The judge named by `config.name`, configured by `config` merged over `default_config()`.

  Raises:
    ValueError: for an unregistered name.
  """
  cfg = default_config()
  if config is not None:
    cfg.update(dict(config) if not isinstance(config, ml_collections.ConfigDict) else config)
  if cfg.name not in _JUDGES:
    raise ValueError(f'judge {cfg.name!r} is not one of {judges()}')
  return _JUDGES[cfg.name](cfg)
