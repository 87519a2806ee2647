"""LLM judges over any OpenAI-compatible `/v1/chat/completions` endpoint (DESIGN.md §6; the paper used GPT-4o).

Three judgements, one versioned prompt file each (`osvl_jax/judges/prompts`; temperature 0 from config). The
defaults (`DEFAULT_PROMPTS`) are the paper's protocols (PAPER.md, "The paper's judge and agent protocols"); the
earlier wordings are one config value away, `config.prompts = {'accuracy': 'accuracy_v1', 'query_quality':
'query_quality_v2'}` (`--config.judge.prompts.accuracy=accuracy_v1` where the config names the field):
  accuracy       accuracy_v2 (default): question, reference answers, response: does the response contain the
                 correct answer anywhere? The judge replies `correct: yes|no` then `reasoning: ...`. accuracy_v1:
                 `Correct` or `Incorrect`.                                      -> r_acc ∈ {0, 1}
  query quality  query_quality_v3 (default): question, reference answers, the final answer and a summary of the
                 pre-fatal tool calls (`summarize_trajectory`: at most 20 steps, arguments cut to 200 characters,
                 results to 400); only the search calls (`tools.base.SEARCH_TOOLS`) are rated, five criteria on
                 an anchored 0.0 / 0.3 / 0.5 / 0.7 / 1.0 scale; reply `score: <float>` then `reasoning: ...`.
                 v1 / v2: the tool calls as `format_calls` lists them, `Score: x`. -> r_query ∈ [0, 1]
  process        a whole trajectory (Sec. 3, four dimensions; `format_transcript`), `Score:` -> [0, 1]
                 (`process_quality`)
Every template is filled from the same fields (`prompts.JUDGE_FIELDS`); a version leaves out those it does not use,
and one asking for a field the judge does not fill is refused when the judge is built.

Robustness: the reply is parsed leniently (`parse_binary`, `parse_score`: reasoning in <think> blocks dropped,
a `correct:` / `score:` line decides, then JSON or free text, last verdict wins, 0-10 / percent / `7/10` scales
mapped to [0, 1]). Requests go through the project's one OpenAI-compatible client (`osvl_jax.openai_client`, built
from this config: timeout_s, max_retries, retry_backoff_s, max_concurrency and the budgets max_requests /
max_total_tokens): a failed request (connection, timeout, 408 / 409 / 429 / 5xx) or an unparseable reply is retried
`max_retries` times with exponential backoff; then, or at once for another 4xx or a spent budget, the error is
recorded in the `Verdict` and the judge's counters and the fallback score is returned (`on_error`: the rule judge's
value, or 0). A judge never raises into the trainer. The client's `usage()` (`judge.client`) holds the token counts.

No call is made when there is nothing to judge: no final response -> r_acc = 0; no tool calls -> r_query = 0.
"""

import hashlib
import json
import re
import threading
from typing import Any, Sequence

import ml_collections

from osvl_jax import openai_client
from osvl_jax.judges import base, prompts, registry, rule
from tools import base as tools_base

# The prompts are versioned files (`osvl_jax/judges/prompts`); `config.prompts.<kind>` picks another version. The
# defaults are the paper's protocols (accuracy_v2, query_quality_v3); accuracy_v1 / query_quality_v1, v2 stay
# available by name.
DEFAULT_PROMPTS = {'accuracy': 'accuracy_v2', 'query_quality': 'query_quality_v3', 'process': 'process_v1'}
# The paper's trajectory summary for the query judge (query_quality_v3): at most this many tool-call steps, each
# call's arguments cut to this many characters, its result text to this many.
SUMMARY_MAX_STEPS = 20
SUMMARY_ARGUMENT_CHARS = 200
SUMMARY_RESULT_CHARS = 400
ACCURACY_PROMPT = prompts.load(DEFAULT_PROMPTS['accuracy'])
QUERY_PROMPT = prompts.load(DEFAULT_PROMPTS['query_quality'])
PROCESS_PROMPT = prompts.load(DEFAULT_PROMPTS['process'])

_THINK_RE = re.compile(r'<think>.*?(</think>|$)', re.DOTALL | re.IGNORECASE)
_BINARY_RE = re.compile(r'\b(not\s+correct|incorrect|correct|wrong)\b', re.IGNORECASE)
_BINARY_WORD_RE = re.compile(r'^\W*(correct|incorrect|right|wrong|yes|no|true|false)\W*$', re.IGNORECASE)
_ECHO_RE = re.compile(r'\bcorrect\s+or\s+incorrect\b', re.IGNORECASE)  # the instruction repeated back
# The paper's accuracy-judge format: a line `correct: yes|no` (any case, markdown bold around either part).
_FIELD_RE = re.compile(r'^[\s*_#>-]*correct[\s*_]*[:=][\s*_]*(yes|no)\b', re.IGNORECASE | re.MULTILINE)
_JSON_VERDICT_KEYS = ('correct', 'is_correct', 'verdict', 'judgement', 'judgment', 'result')
_BINARY_VALUE = {'not correct': 0.0, 'incorrect': 0.0, 'wrong': 0.0, 'no': 0.0, 'false': 0.0,
                 'correct': 1.0, 'right': 1.0, 'yes': 1.0, 'true': 1.0}
_NUMBER = r'(-?\d+(?:\.\d+)?|-?\.\d+)'
_SCORE_RE = re.compile(rf'score\s*(?:is|of)?\s*[:=]?\s*{_NUMBER}(?:\s*(?:/|out of)\s*{_NUMBER})?', re.IGNORECASE)
# The paper's query-judge format: a line `score: <float>` (any case, markdown around `score`); it decides whatever
# numbers the reasoning after it holds.
_SCORE_FIELD_RE = re.compile(rf'^[\s_#>-]*score[\s_]*[:=]\s*{_NUMBER}(?:\s*(?:/|out of)\s*{_NUMBER})?',
                             re.IGNORECASE | re.MULTILINE)
_FRACTION_RE = re.compile(rf'{_NUMBER}\s*(?:/|out of)\s*{_NUMBER}', re.IGNORECASE)
_LONE_NUMBER_RE = re.compile(rf'^\W*{_NUMBER}\s*(%?)\W*$')


class JudgeParseError(ValueError):
  """The judge's reply holds no verdict."""


def _strip_reasoning(text: str | None) -> str:
  if text is None:
    raise JudgeParseError('empty reply (no message content)')
  text = _THINK_RE.sub(' ', text).strip()
  if not text:
    raise JudgeParseError('empty reply')
  return text


def parse_binary(text: str | None) -> float:
  """A Correct / Incorrect reply -> 1.0 / 0.0.

  Accepts the paper's `correct: yes|no` line (accuracy_v2's reply; any case, bold allowed, reasoning before or
  after it; both values in one reply is a judge error), `Correct`, `**Incorrect**`, `The response is correct.`,
  `{"correct": true}`, `{"verdict": "Correct"}`, a reply that is only `yes` / `no` / `true` / `false` / `right` / `wrong`, and `1` / `0`. In free text only
  correct / incorrect / not correct / wrong count and the last one wins (`... so it is not correct` -> 0); a
  stray `no` or `yes` inside a sentence is not a verdict. <think> blocks and an echo of the instruction
  ("Correct or Incorrect") are ignored.

  Raises:
    JudgeParseError: no verdict in the reply (an empty reply, `Maybe.`, an echo of the instruction, a JSON
      object without a readable verdict). The caller records a judge error: never a 0 or 1.
  """
  text = _strip_reasoning(text)
  fields = {m.lower() for m in _FIELD_RE.findall(text)}
  if len(fields) == 1:
    return _BINARY_VALUE[fields.pop()]
  if fields:
    raise JudgeParseError(f'both `correct: yes` and `correct: no` in {text[:200]!r}')
  lone = _LONE_NUMBER_RE.match(text)
  if lone and lone[1] in ('0', '1'):
    return float(lone[1])
  try:
    data = json.loads(text)
  except json.JSONDecodeError:
    data = None
  if isinstance(data, dict):
    for key in _JSON_VERDICT_KEYS:
      value = data.get(key)
      if isinstance(value, bool):
        return float(value)
      if isinstance(value, (int, float)) and value in (0, 1):
        return float(value)
      if isinstance(value, str) and _BINARY_WORD_RE.match(value):
        return _BINARY_VALUE[_BINARY_WORD_RE.match(value)[1].lower()]
    raise JudgeParseError(f'no verdict field in JSON reply {text[:200]!r}')
  whole = _BINARY_WORD_RE.match(text.replace('*', ''))
  if whole:
    return _BINARY_VALUE[whole[1].lower()]
  words = _BINARY_RE.findall(_ECHO_RE.sub(' ', text))
  if not words:
    raise JudgeParseError(f'no Correct/Incorrect verdict in {text[:200]!r}')
  return _BINARY_VALUE[re.sub(r'\s+', ' ', words[-1].lower())]


def _to_unit(value: float, denominator: float | None, percent: bool = False) -> float:
  if denominator is not None:
    if denominator <= 0:
      raise JudgeParseError(f'bad score denominator {denominator}')
    value = value / denominator
  elif percent:
    value = value / 100.0
  elif 1.0 < value <= 10.0:  # a 0-10 scale
    value = value / 10.0
  elif 10.0 < value <= 100.0:  # a percentage
    value = value / 100.0
  if not 0.0 <= value <= 1.0:
    raise JudgeParseError(f'score {value} is outside [0, 1]')
  return float(value)


def parse_score(text: str | None) -> float:
  """A `Score: x` reply -> x ∈ [0, 1].

  The paper's format first: a line starting with `score:` (any case, markdown bold allowed, `=` for `:`) decides,
  whatever numbers the reasoning holds (`score: 0.7\nreasoning: a score of 0.3 would ...` -> 0.7); several such
  lines with different values are a judge error. Otherwise accepts `The score is 0.7`, `**Score:** 70%`,
  `{"score": 0.7}`, a lone number (`0.7`, `7`, `70%`), `3 out of 4`, and the last `score` in the text wins. A
  number in (1, 10] is read on a 0-10 scale, in (10, 100] as a percentage, `x/y` as x / y.

  Raises:
    JudgeParseError: no score, a score that maps outside [0, 1], or `score:` lines that disagree.
  """
  text = _strip_reasoning(text)
  lines = {_to_unit(float(v), float(d) if d else None) for v, d in _SCORE_FIELD_RE.findall(text.replace('*', ''))}
  if len(lines) == 1:
    return lines.pop()
  if lines:
    raise JudgeParseError(f'`score:` lines disagree ({sorted(lines)}) in {text[:200]!r}')
  try:
    data = json.loads(text)
    if isinstance(data, dict) and isinstance(data.get('score'), (int, float)):
      return _to_unit(float(data['score']), None)
  except json.JSONDecodeError:
    pass
  matches = _SCORE_RE.findall(text.replace('*', ''))
  if matches:
    value, denominator = matches[-1]
    return _to_unit(float(value), float(denominator) if denominator else None)
  lone = _LONE_NUMBER_RE.match(text)
  if lone:
    return _to_unit(float(lone[1]), None, percent=bool(lone[2]))
  fraction = _FRACTION_RE.findall(text)
  if len(fraction) == 1:
    return _to_unit(float(fraction[0][0]), float(fraction[0][1]))
  raise JudgeParseError(f'no score in {text[:200]!r}')


def _arguments_text(arguments: Any) -> str:
  try:
    return json.dumps(arguments, ensure_ascii=False, sort_keys=True)
  except (TypeError, ValueError):
    return repr(arguments)


def _status(result: Any) -> tuple[str, str]:
  """(status, whitespace-collapsed text) of a tool result: ok | nothing found | error (<kind>) | no result."""
  if result is None:
    status, text = 'no result', ''
  elif getattr(result, 'is_execution_error', False):
    status, text = f'error ({result.error_kind})', result.text
  elif getattr(result, 'error_kind', None) == 'no_result':
    status, text = 'nothing found', result.text
  else:
    status, text = 'ok', result.text
  return status, ' '.join(str(text).split())


def _cut(text: str, max_chars: int) -> str:
  return text if len(text) <= max_chars else text[:max_chars] + ' ...'


def format_calls(tool_calls: Sequence[tuple[str, Any]], results: Sequence[Any], max_chars: int = 600) -> str:
  """The v1 / v2 query judge's view of the tool calls: `[k] name {arguments}` then `-> status: result text`
  (result text cut to `max_chars` characters, then ' ...')."""
  lines = []
  for k, ((name, arguments), result) in enumerate(zip(tool_calls, results), 1):
    status, text = _status(result)
    lines.append(f'[{k}] {name} {_arguments_text(arguments)}\n    -> {status}: {_cut(text, max_chars)}')
  return '\n'.join(lines)


def summarize_trajectory(tool_calls: Sequence[tuple[str, Any]], results: Sequence[Any],
                         max_steps: int = SUMMARY_MAX_STEPS, max_argument_chars: int = SUMMARY_ARGUMENT_CHARS,
                         max_result_chars: int = SUMMARY_RESULT_CHARS,
                         search_tools: Sequence[str] = tools_base.SEARCH_TOOLS) -> str:
  """The query_quality_v3 judge's summary of the search trajectory (the paper's limits by default).

  One step per tool call, in order, the first `max_steps` only:
    `Step k [search|other] <name> <arguments as sorted JSON>` (cut to `max_argument_chars` characters)
    `  -> <status>: <result text>` (whitespace collapsed, cut to `max_result_chars`; status ok | nothing found |
       error (<error kind>) | no result)
  A cut text ends with ' ...'. Calls past `max_steps` are counted in a last line
  `(N later tool calls not shown; the summary keeps the first <max_steps>)` ('call' when N is 1).

  Args:
    tool_calls: (tool name, arguments) per call, in order.
    results: the `tools.base.ToolResult` (or None) of each call, aligned with `tool_calls`.
    max_steps: steps shown (>= 1); max_argument_chars, max_result_chars: characters kept (>= 1).
    search_tools: names tagged [search] (the calls the judge rates).
  Returns:
    The summary ('' without calls).
  Raises:
    ValueError: a limit below 1.
  """
  if min(max_steps, max_argument_chars, max_result_chars) < 1:
    raise ValueError(f'summary limits must be >= 1: max_steps={max_steps}, max_argument_chars={max_argument_chars}, '
                     f'max_result_chars={max_result_chars}')
  pairs = list(zip(tool_calls, results))
  lines = []
  for k, ((name, arguments), result) in enumerate(pairs[:max_steps], 1):
    kind = 'search' if name in search_tools else 'other'
    status, text = _status(result)
    lines.append(f'Step {k} [{kind}] {name} {_cut(_arguments_text(arguments), max_argument_chars)}')
    lines.append(f'  -> {status}: {_cut(text, max_result_chars)}')
  if len(pairs) > max_steps:
    n = len(pairs) - max_steps
    lines.append(f'({n} later tool call{"s" if n > 1 else ""} not shown; the summary keeps the first {max_steps})')
  return '\n'.join(lines)


# Judge config fields that do not change a verdict (how it is reached, not what it is): left out of `describe`.
OPERATIONAL_FIELDS = ('name', 'prompts', 'api_key_env', 'timeout_s', 'max_retries', 'retry_backoff_s',
                      'max_concurrency', 'max_requests', 'max_total_tokens')


class LLMJudge(base.Judge):
  """Accuracy, query-quality and process judges over an OpenAI-compatible chat endpoint.

  Args:
    config: `registry.default_config()` fields (base_url, model, temperature, api_key_env, timeout_s,
      max_retries, retry_backoff_s, max_tokens, max_concurrency, max_requests, max_total_tokens, on_error,
      max_result_chars, prompts).
  Attributes:
    client: the `openai_client.ChatClient` of the endpoint (its `usage()`: requests and tokens, for cost figures).
    prompt_names, prompts: {kind: prompt file name}, {kind: prompt text} in use.
  Raises:
    ValueError: when base_url or model is empty, on_error is unknown, or a limit is out of range.
  """
  name = 'llm'

  def __init__(self, config: ml_collections.ConfigDict):
    super().__init__()
    registry.check_config(config)  # base_url, model, on_error, temperature, prompts: ValueError naming the field
    self.config = config
    self.max_concurrency = int(config.max_concurrency)
    self.client = openai_client.ChatClient.from_config(config)
    self._cache: dict[str, float] = {}
    self._cache_lock = threading.Lock()
    chosen = {**DEFAULT_PROMPTS, **dict(config.get('prompts') or {})}
    self.prompt_names = {k: prompts.check_judge_prompt(k, v) for k, v in chosen.items()}
    self.prompts = {k: prompts.load(v) for k, v in self.prompt_names.items()}

  def usage(self) -> dict[str, int]:
    """`base.Judge.usage` from the endpoint client's counters (`openai_client.ChatClient.usage`)."""
    u = self.client.usage()
    return {k: int(u[k]) for k in base.USAGE_FIELDS}

  def describe(self) -> dict:
    """`base.Judge.describe` with the prompts in use and the verdict-deciding settings (base_url, model,
    temperature, max_tokens, on_error, max_result_chars: every config field but `OPERATIONAL_FIELDS`)."""
    cfg = self.config.to_dict() if isinstance(self.config, ml_collections.ConfigDict) else dict(self.config)
    return {**super().describe(),
            'prompt_names': dict(sorted(self.prompt_names.items())),
            'prompts': {k: hashlib.sha256(v.encode('utf-8')).hexdigest()[:16] for k, v in sorted(self.prompts.items())},
            'settings': {k: v for k, v in sorted(cfg.items()) if k not in OPERATIONAL_FIELDS}}

  def _ask(self, prompt: str, parse) -> tuple[float | None, str | None, str]:
    """(score, None, raw) on success, (None, error, raw of the last reply) after the client gave up."""
    with self._cache_lock:
      if prompt in self._cache:
        self._count('cache_hits')
        return self._cache[prompt], None, ''
    self._count('calls')
    try:
      reply = self.client.complete([{'role': 'user', 'content': prompt}], parse=parse,
                                   temperature=float(self.config.temperature), max_tokens=int(self.config.max_tokens))
    except openai_client.ChatError as e:  # after the retries, a 4xx, a spent budget
      self._count('retries', max(e.attempts - 1, 0))
      self._count('errors')
      return None, str(e)[:600], e.text or ''
    except Exception as e:  # noqa: BLE001 — a judge never crashes the trainer
      self._count('errors')
      return None, f'{type(e).__name__}: {str(e)[:300]}', ''
    self._count('retries', reply.attempts - 1)
    with self._cache_lock:
      self._cache[prompt] = reply.parsed
    return reply.parsed, None, reply.text or ''

  def _fallback(self, rule_score: float) -> float:
    return rule_score if self.config.on_error == 'rule' else 0.0

  def accuracy(self, question: str, response: str | None, answers: Sequence[str], *,
               hints=None) -> base.Verdict:
    """r_acc ∈ {0, 1}; 0 without a call when there is no (or an empty) final response. `hints` (a benchmark item's
    metadata) are not shown to the judge model; its fallback (`on_error='rule'`) is the rule judge with them."""
    if response is None or not response.strip():
      return base.Verdict(0.0)
    prompt = self.prompts['accuracy'].format(question=question, answers=' | '.join(answers), response=response)
    score, error, raw = self._ask(prompt, parse_binary)
    if error is not None:
      return base.Verdict(self._fallback(rule.accuracy_with_hints(question, response, answers, hints)), error, raw)
    return base.Verdict(score, None, raw)

  def query_quality(self, question: str, tool_calls: Sequence[tuple[str, Any]], results: Sequence[Any], *,
                    answers: Sequence[str] = (), response: str | None = None) -> base.Verdict:
    """r_query ∈ [0, 1] over the pre-fatal tool calls; 0 without a call when there are none.

    Args:
      question: the user question.
      tool_calls, results: the pre-fatal calls and their `ToolResult`s (`base.Judge.query_quality`).
      answers: the reference answer and its aliases (query_quality_v3 shows them; '(not given)' when empty).
      response: the agent's final response (v3 shows it; '(none: ...)' when None or empty).
    Returns:
      Verdict(score); after failed retries or an unparseable reply, the fallback (`on_error`) with the error.
    """
    if not tool_calls:
      return base.Verdict(0.0)
    final = (response or '').strip() or '(none: the agent gave no final answer)'
    prompt = self.prompts['query_quality'].format(
        question=question, answers=' | '.join(answers) or '(not given)', final_answer=final,
        calls=format_calls(tool_calls, results, int(self.config.max_result_chars)),
        trajectory=summarize_trajectory(tool_calls, results), search_tools=', '.join(tools_base.SEARCH_TOOLS))
    score, error, raw = self._ask(prompt, parse_score)
    if error is not None:
      return base.Verdict(self._fallback(rule.query_quality(tool_calls, results, question)), error, raw)
    return base.Verdict(score, None, raw)

  def process_quality(self, question: str, steps: Sequence[Any], answers: Sequence[str]) -> base.Verdict:
    """The process judge (Sec. 3; prompt `process_v1`): score in [0, 1] of how a trajectory reached its answer.

    Args:
      question: the user question.
      steps: the trajectory's steps, all of them (shown as `format_transcript` writes them).
      answers: the reference answer and its aliases.
    Returns:
      Verdict(score); after failed retries or an unparseable reply, Verdict(0.0, error, raw): a caller must
      read `error`, never the fallback score, as the verdict.
    """
    prompt = self.prompts['process'].format(question=question, answers=' | '.join(answers),
                                            transcript=format_transcript(steps))
    score, error, raw = self._ask(prompt, parse_score)
    if error is not None:
      return base.Verdict(0.0, error, raw)
    return base.Verdict(score, None, raw)


def format_transcript(steps: Sequence[Any], max_chars: int = 600) -> str:
  """The process judge's view of a trajectory: per step `[k] <assistant text>` then `-> status: result text`.

  Args:
    steps: `trajectory.Step`s (text, action, result).
    max_chars: tool-result text kept per step.
  """
  lines = []
  for k, step in enumerate(steps, 1):
    lines.append(f'[{k}] {" ".join(str(step.text).split())}')
    result = getattr(step, 'result', None)
    if result is not None:
      status = 'ok' if result.ok else f'error ({result.error_kind})'
      text = ' '.join(str(result.text).split())
      lines.append(f'    -> {status}: {text[:max_chars]}{" ..." if len(text) > max_chars else ""}')
  return '\n'.join(lines)
