"""The judge interface: the source of r_acc and r_query in Eq. 9 (DESIGN.md §6).

A judge has two methods, each returning a `Verdict` and never raising:

  accuracy(question, response, answers) -> Verdict       score ∈ {0, 1}: does the response contain the answer
  query_quality(question, tool_calls, results, *, answers=(), response=None) -> Verdict
                                                         score ∈ [0, 1] over the pre-fatal tool calls

`query_quality` is given the reference answers and the agent's final response too (the paper's query judge sees
both, PAPER.md "judge and agent protocols"); a judge that does not need them (the rule judge) ignores them, and
callers pass them to every judge alike.

Implementations: `rule.RuleJudge` (offline), `llm.LLMJudge` (OpenAI-compatible); pick one by name with
`registry.get_judge(config.judge)`.
"""

import dataclasses
import threading
from typing import Any, Sequence


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
  `max_concurrency`: verdicts a caller may ask for at once, from threads (1: one at a time, a local CPU-bound judge;
  a remote judge is I/O bound and says how many requests its endpoint takes).
  """
  name = 'base'
  max_concurrency = 1

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
    """r_acc: does `response` (None: no final answer) contain one of `answers` (the reference and aliases)?"""
    raise NotImplementedError

  def query_quality(self, question: str, tool_calls: Sequence[tuple[str, Any]], results: Sequence[Any], *,
                    answers: Sequence[str] = (), response: str | None = None) -> Verdict:
    """r_query ∈ [0, 1] of the pre-fatal tool calls.

    Args:
      question: the user question.
      tool_calls: (tool name, arguments) per call, in order (the pre-fatal prefix only).
      results: the `tools.base.ToolResult` (or None) of each call, aligned with `tool_calls`.
      answers: the reference answer and its aliases (may be empty).
      response: the agent's final response, None when it gave none.
    """
    raise NotImplementedError
