"""The judge interface: the source of r_acc and r_query in Eq. 9 (DESIGN.md §6) and of the pipeline's process score.

Everything a caller asks of a judge is declared here, so no caller probes a judge (hasattr) or tests its class:

  accuracy(question, response, answers, *, hints=None) -> Verdict
                        score ∈ {0, 1}: does the response contain the answer. `hints`: a benchmark item's metadata
                        (numeric_tolerance, numeric_ranges, gold_letter) that a judge may use (the rule judge does).
  query_quality(question, tool_calls, results, *, answers=(), response=None) -> Verdict
                        score ∈ [0, 1] over the pre-fatal tool calls
  process_quality(question, steps, answers) -> Verdict | None
                        score ∈ [0, 1] of the whole trajectory (Sec. 3), or None: this judge has no process judge
                        (the default; the caller then uses its own stand-in, e.g. the pipeline uses query_quality)
  max_concurrency       verdicts a caller may ask for at once, from threads
  describe() -> dict    what decides its verdicts (name, class, prompt names and hashes, settings), as JSON values:
                        recorded with eval results and shown in the report
  stats() -> dict       counters (calls, errors, retries, cache_hits)
  usage() -> dict       cost: requests and tokens sent to an endpoint (`USAGE_FIELDS`; 0 for a local judge)

Each verdict method returns a `Verdict` and never raises. `query_quality` is given the reference answers and the
agent's final response too (the paper's query judge sees both, PAPER.md "judge and agent protocols"); a judge that
does not need them (the rule judge) ignores them, and callers pass them to every judge alike.

Implementations: `rule.RuleJudge` (offline), `llm.LLMJudge` (OpenAI-compatible); pick one by name with
`registry.get_judge(config.judge)`.
"""

import dataclasses
import threading
from collections.abc import Mapping
from typing import Any, Sequence

USAGE_FIELDS = ('requests', 'prompt_tokens', 'completion_tokens', 'total_tokens')  # `Judge.usage`

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
  """Interface of a judge (module docstring); subclasses override `accuracy` and `query_quality`, and may override
  `process_quality` and `describe`.

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
    """Counters since the judge was built: calls (verdicts asked of the judge itself, cache hits not included),
    errors (verdicts that fell back), retries (requests repeated), cache_hits."""
    with self._lock:
      return dict(self._counts)

  def accuracy(self, question: str, response: str | None, answers: Sequence[str], *,
               hints: Mapping[str, Any] | None = None) -> Verdict:
    """r_acc: does `response` (None: no final answer) contain one of `answers` (the reference and aliases)?

    Args:
      question: the user question.
      response: the final answer text, or None.
      answers: the reference answer and its aliases.
      hints: a benchmark item's metadata; a judge may read `numeric_tolerance` (relative tolerance of a numeric
        answer), `numeric_ranges` ([lo, hi] accepted intervals) and `gold_letter` (a multiple-choice item's correct
        option), and ignores the rest. None: none.
    """
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

  def process_quality(self, question: str, steps: Sequence[Any], answers: Sequence[str]) -> Verdict | None:
    """The process judge (Sec. 3): a score in [0, 1] of how a whole trajectory reached its answer.

    Args:
      question: the user question.
      steps: the trajectory's `trajectory.Step`s, all of them (text, action, result).
      answers: the reference answer and its aliases.
    Returns:
      None: this judge has no process judge (the default): the caller decides what stands in for it. A judge with
      one returns its Verdict (after a judge error, a fallback score with the error: read `error`, never the score).
    """
    del question, steps, answers
    return None

  def usage(self) -> dict[str, int]:
    """What this judge's verdicts cost since it was built (the eval report's judge cost): requests (sent to an
    endpoint, retries included), prompt_tokens, completion_tokens, total_tokens (the endpoint's `usage`, summed).
    The base (a local judge: no endpoint) costs nothing: every count is 0."""
    return dict.fromkeys(USAGE_FIELDS, 0)

  def describe(self) -> dict:
    """What decides this judge's verdicts, as JSON values (recorded with eval results: results of a judge that
    describes itself otherwise are not mixed with them; shown in the eval report).

    Returns:
      {'name': registered name, 'class': module.qualname, 'prompt_names': {kind: prompt file name},
       'prompts': {kind: sha256 of the prompt text, 16 hex}, 'settings': {field: value} of the verdict-deciding
       settings}; the base has no prompts and no settings.
    """
    return {'name': self.name, 'class': f'{type(self).__module__}.{type(self).__qualname__}', 'prompt_names': {},
            'prompts': {}, 'settings': {}}
