"""LLM judges over any OpenAI-compatible `/v1/chat/completions` endpoint (DESIGN.md §6; the paper used GPT-4o).

Three judgements, one versioned prompt file each (`osvl_jax/judges/prompts`; temperature 0 from config). The
defaults (`DEFAULT_PROMPTS`) are this project's wordings of the paper's protocols (PAPER.md, "The paper's judge and
agent protocols") with rules of its own (a hedged list of candidates is wrong; only the search calls are rated);
accuracy_v3 / query_quality_v4 follow the paper's description alone (the paper configs' choice). Every version is
one config value away, `config.prompts = {'accuracy': 'accuracy_v3', 'query_quality': 'query_quality_v4'}`
(`--config.judge.prompts.accuracy=accuracy_v1` where the config names the field):
  accuracy       accuracy_v2 (default): question, reference answers, response: does the response contain the
                 correct answer anywhere? The judge replies `correct: yes|no` then `reasoning: ...`. accuracy_v3:
                 the same protocol without v2's rules on hedged lists and refusals. accuracy_v1: `Correct` or
                 `Incorrect`.                                                   -> r_acc ∈ {0, 1}
  query quality  query_quality_v3 (default): question, reference answers, the final answer and a summary of the
                 pre-fatal tool calls (`summarize_trajectory`: at most 20 steps, arguments cut to 200 characters,
                 results to 400); only the search calls (`tools.base.SEARCH_TOOLS`) are rated, five criteria on
                 an anchored 0.0 / 0.3 / 0.5 / 0.7 / 1.0 scale; reply `score: <float>` then `reasoning: ...`.
                 query_quality_v4: the same five criteria and scale, after the paper's description alone.
                 v1 / v2: the tool calls as `format_calls` lists them, `Score: x`. -> r_query ∈ [0, 1]
                 Asked of `query_model` where set (the paper's second judge model), else of `model`.
  process        a whole trajectory (Sec. 3, four dimensions; `format_transcript`), `Score:` -> [0, 1]
                 (`process_quality`)
Every template is filled from the same fields (`prompts.JUDGE_FIELDS`); a version leaves out those it does not use,
and one asking for a field the judge does not fill is refused when the judge is built.

Robustness: the reply is read strictly (`parse_binary`, `parse_score`: <think> blocks dropped; a JSON object, else
the template line `correct:` / `score:` (bracket, quote, markdown and case variants; the last such line decides),
else a reply that is only the value; free prose is no verdict, nor is a score outside [0, 1]). Requests go through
the project's one OpenAI-compatible client (`osvl_jax.openai_client`, built from this config: timeout_s,
max_retries, retry_backoff_s, max_concurrency and the budgets max_requests /
max_total_tokens): a failed request (connection, timeout, 408 / 409 / 429 / 5xx) or an unparseable reply is retried
`max_retries` times with exponential backoff; then, or at once for another 4xx or a spent budget, the error is
recorded in the `Verdict` and the judge's counters and the fallback score is returned (`on_error`: the rule judge's
value, or 0 as the official release scores it). A judge never raises into the trainer. The client's `usage()`
(`judge.client`) holds the token counts.

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
from osvl_jax.trajectory import actions
from tools import base as tools_base

# The prompts are versioned files (`osvl_jax/judges/prompts`); `config.prompts.<kind>` picks another version. The
# defaults are this project's wordings of the paper's protocols (accuracy_v2, query_quality_v3; the paper configs name
# accuracy_v3 / query_quality_v4); every other version stays available by name.
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
_FENCE_LINE_RE = re.compile(r'^[ \t]*```[\w-]*[ \t]*$', re.MULTILINE)  # a code fence's opening or closing line
# A template line `<key>: <value>` (`=` for `:`), markdown, list, quote or JSON marks before the key and around it.
_KEY_LINE = r'^[\s*_#>`"\'{-]*{key}[\s*_`"\']*[:=](.*)$'
_CORRECT_LINE_RE = re.compile(_KEY_LINE.replace('{key}', 'correct'), re.IGNORECASE)
_SCORE_LINE_RE = re.compile(_KEY_LINE.replace('{key}', 'score'), re.IGNORECASE)
# A value and the wrappers a judge puts around it: [no], <no>, (no), "no", 'no', `no`, **no**.
_OPEN, _CLOSE = r'[\s\[<(\'"`*_]*', r'[\s\]>)\'"`*_]*'
_NUMBER = r'-?(?:\d+(?:\.\d+)?|\.\d+)'
_VERDICT_VALUE_RE = re.compile(rf'{_OPEN}(not\s+correct|\w+){_CLOSE}', re.IGNORECASE)
_SCORE_VALUE_RE = re.compile(rf'{_OPEN}({_NUMBER})(?:\s*(?:/|out of)\s*({_NUMBER})|\s*(%))?{_CLOSE}', re.IGNORECASE)
_VERDICTS = {'yes': 1.0, 'true': 1.0, 'correct': 1.0, 'right': 1.0, '1': 1.0,
             'no': 0.0, 'false': 0.0, 'incorrect': 0.0, 'not correct': 0.0, 'wrong': 0.0, '0': 0.0}
_JSON_VERDICT_KEYS = ('correct', 'is_correct', 'verdict', 'judgement', 'judgment', 'result')
# What may follow a template line's value: nothing, a closing mark, or a separator and then reasoning that names
# no second value (`correct: yes/no`, `yes, no`, `score: 0.3 or 0.5`, `0.5-0.7`, `0,7` are no single value).
_AFTER_VALUE_RE = re.compile(r'[.,;:!]?|[.,;:!]\s.*|\(.*|[-–—]\s.*|reasoning\b.*', re.IGNORECASE | re.DOTALL)
_SECOND_VERDICT_RE = re.compile(r'\b(?:yes|no|true|false)\b', re.IGNORECASE)
_SECOND_SCORE_RE = re.compile(r'\d')


class JudgeParseError(ValueError):
  """The judge's reply holds no verdict."""


def _strip_reasoning(text: str | None) -> str:
  if text is None:
    raise JudgeParseError('empty reply (no message content)')
  text = _THINK_RE.sub(' ', text).strip()
  if not text:
    raise JudgeParseError('empty reply')
  return text


def _value(text: str, value_re: re.Pattern, second_re: re.Pattern | None) -> re.Match | None:
  """The value at the start of `text` when the rest is a closing mark (`second_re` None: a whole reply) or, after a
  separator, reasoning without a second value; else None."""
  match = value_re.match(text)
  if match is None:
    return None
  rest = text[match.end():]
  if second_re is None:
    return match if rest in ('', '.', '!') else None
  return match if _AFTER_VALUE_RE.fullmatch(rest) and not second_re.search(rest) else None


def _read(text: str | None, line_re: re.Pattern, value_re: re.Pattern, second_re: re.Pattern, json_keys: Sequence[str],
          from_match, from_json, what: str) -> float:
  """The shared rule of `parse_binary` and `parse_score` (their docstrings); `from_match` / `from_json` turn a
  value match / a JSON value into the result, None when it is no value."""
  text = _strip_reasoning(text)
  body = _FENCE_LINE_RE.sub('', text).strip()
  if body.startswith('{') and body.endswith('}'):
    try:
      data = actions.loads_lenient(body)
    except ValueError as e:
      raise JudgeParseError(f'unreadable JSON reply ({e}) {text[:200]!r}') from None
    data = {str(k).strip().lower(): v for k, v in data.items()} if isinstance(data, dict) else {}
    key = next((k for k in json_keys if k in data), None)
    result = None if key is None else from_json(data[key], text)
    if result is None:
      raise JudgeParseError(f'no {what} field ({"/".join(json_keys)}) in JSON reply {text[:200]!r}')
    return result
  lines = [m[1] for m in map(line_re.match, body.splitlines()) if m]
  if lines:  # the last template line is the judge's conclusion
    match = _value(lines[-1], value_re, second_re)
    result = None if match is None else from_match(match, text)
    if result is None:
      raise JudgeParseError(f'the last template line holds no single {what} ({lines[-1].strip()[:80]!r}) in '
                            f'{text[:200]!r}')
    return result
  match = _value(body, value_re, None)
  result = None if match is None else from_match(match, text)
  if result is None:
    raise JudgeParseError(f'no template {what} in {text[:200]!r}')
  return result


def _verdict_of_match(match: re.Match, text: str) -> float | None:
  del text
  return _VERDICTS.get(re.sub(r'\s+', ' ', match[1].lower()))


def _verdict_of_json(value: Any, text: str) -> float | None:
  if isinstance(value, bool):
    return float(value)
  if isinstance(value, (int, float)):
    return float(value) if value in (0, 1) else None
  match = _value(value, _VERDICT_VALUE_RE, None) if isinstance(value, str) else None
  return None if match is None else _verdict_of_match(match, text)


def parse_binary(text: str | None) -> float:
  """A judge's yes / no verdict -> 1.0 / 0.0, read strictly: anything but these forms is a judge error.

  1. A reply that is one JSON object (a ```json fence, single quotes, Python literals allowed): its first key of
     `_JSON_VERDICT_KEYS` decides, a bool, 0 / 1, or a verdict word (below).
  2. Otherwise the paper's template line `correct: <v>` (any case, `=` for `:`, markdown / list / quote marks
     around the key, the value wrapped in [], <>, (), quotes, backticks or bold: `correct: [no]`). When several
     such lines appear the LAST decides (a judge that reasons, then concludes); when its value is not one verdict
     (`correct: <yes or no>`, `correct: partially`, `correct: yes, no`) the reply is a judge error, whatever
     earlier lines said. After the value a line may hold a separator and reasoning naming no second value.
  3. Otherwise a reply that is only the verdict (accuracy_v1's one word: `Correct`, `**Incorrect**`, `no.`).
  Verdict words: yes / true / correct / right / 1 -> 1.0; no / false / incorrect / not correct / wrong / 0 -> 0.0.
  Free prose ("Incorrect. The correct answer is X", "does not contain the correct answer") is no verdict.
  <think> blocks are dropped first (an unclosed one runs to the end).

  Raises:
    JudgeParseError: no verdict (the message quotes the reply). The caller records a judge error, never a 0 or 1.
  """
  return _read(text, _CORRECT_LINE_RE, _VERDICT_VALUE_RE, _SECOND_VERDICT_RE, _JSON_VERDICT_KEYS,
               _verdict_of_match, _verdict_of_json, 'verdict')


def _score_of_match(match: re.Match, text: str) -> float:
  value, denominator, percent = match.groups()
  score = float(value)
  if denominator is not None:
    if float(denominator) <= 0:
      raise JudgeParseError(f'bad score denominator {denominator} in {text[:200]!r}')
    score /= float(denominator)
  elif percent:
    score /= 100.0
  return _unit(score, text)


def _unit(score: float, text: str) -> float:
  if not 0.0 <= score <= 1.0:  # NaN too
    raise JudgeParseError(f'score {score:g} is outside [0, 1] in {text[:200]!r}')
  return float(score)


def _score_of_json(value: Any, text: str) -> float | None:
  if isinstance(value, (int, float)) and not isinstance(value, bool):
    return _unit(float(value), text)
  match = _value(value, _SCORE_VALUE_RE, None) if isinstance(value, str) else None
  return None if match is None else _score_of_match(match, text)


def parse_score(text: str | None) -> float:
  """A judge's `score: x` reply -> x ∈ [0, 1], read strictly: anything but these forms is a judge error.

  1. A reply that is one JSON object (fenced, single-quoted allowed): its `score`, a number or a numeric string.
  2. Otherwise the paper's template line `score: <x>` (the same key and value variants as `parse_binary`:
     `**Score:** 0.7`, `score: [0.7]`); the LAST such line decides, whatever numbers other lines hold (the
     process judge's `Grounding: x` lines, reasoning); after the value a line may hold a separator and reasoning
     without a digit (`score: 0.7 (a good strategy)`; `score: 0.3 or 0.5`, `0.5-0.7`, `0,7` are errors).
  3. Otherwise a reply that is only the value (`0.4`, `60%`).
  A value is a number in [0, 1], or on an explicit scale: `x/y`, `x out of y` -> x / y, `x%` -> x / 100. No
  other scale is guessed: `score: 7` is a judge error, not 0.7. Free prose ("The score is 0.7") is no score.

  Raises:
    JudgeParseError: no score, or one outside [0, 1] (the message quotes the reply).
  """
  return _read(text, _SCORE_LINE_RE, _SCORE_VALUE_RE, _SECOND_SCORE_RE, ('score',), _score_of_match,
               _score_of_json, 'score')


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
    self._cache: dict[tuple[str, str], float] = {}
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

  def _ask(self, prompt: str, parse, model: str = '') -> tuple[float | None, str | None, str]:
    """(score, None, raw) on success, (None, error, raw of the last reply) after the client gave up; `model` ('' =
    the client's) names the model asked."""
    with self._cache_lock:
      if (model, prompt) in self._cache:
        self._count('cache_hits')
        return self._cache[model, prompt], None, ''
    self._count('calls')
    try:
      reply = self.client.complete([{'role': 'user', 'content': prompt}], parse=parse,
                                   temperature=float(self.config.temperature), max_tokens=int(self.config.max_tokens),
                                   **({'model': model} if model else {}))
    except openai_client.ChatError as e:  # after the retries, a 4xx, a spent budget
      self._count('retries', max(e.attempts - 1, 0))
      self._count('errors')
      return None, str(e)[:600], e.text or ''
    except Exception as e:  # noqa: BLE001 — a judge never crashes the trainer
      self._count('errors')
      return None, f'{type(e).__name__}: {str(e)[:300]}', ''
    self._count('retries', reply.attempts - 1)
    with self._cache_lock:
      self._cache[model, prompt] = reply.parsed
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
    score, error, raw = self._ask(prompt, parse_score, str(self.config.get('query_model') or ''))
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
