"""Parsing one assistant turn into an action, and rendering the canonical one (DESIGN.md §4).

`parse_action` never raises on model output; tool-call JSON is read strictly first, then repaired with the
maintained `json-repair` library (`loads_lenient`).
"""

import dataclasses
import json
import re
from typing import Any

import json_repair

# The official profile's alias tables are defined once, with the tool schemas (tools/schema.py).
from tools.schema import ARGUMENT_ALIASES, OFFICIAL_ONLY_ARGUMENTS, PROFILES, TOOL_NAME_ALIASES


@dataclasses.dataclass
class ParsedAction:
  """What one assistant turn asked for.

  Attributes:
    think: text inside <think>…</think> (stripped), None when absent.
    kind: 'tool_call', 'response', or 'malformed' (no action, or a tool call that cannot be read).
    name: tool name after aliasing (text_search, image_search, ocr, crop, ...), None unless kind == 'tool_call'.
    arguments: tool arguments after aliasing ({} unless kind == 'tool_call').
    response: text inside <response>…</response> (stripped), None unless kind == 'response'.
    error: why the call is malformed (kind == 'malformed'); the rollout returns it as a `malformed_call` result.
    format_ok: exactly one think block, then exactly one well-formed tool_call or response, nothing else.
    problems: every format violation found (empty iff format_ok).
  """
  think: str | None
  kind: str
  name: str | None = None
  arguments: dict = dataclasses.field(default_factory=dict)
  response: str | None = None
  error: str | None = None
  format_ok: bool = False
  problems: list[str] = dataclasses.field(default_factory=list)


_END_TOKENS = ('<|im_end|>', '<|endoftext|>')
_OPEN_RE = re.compile(r'<(tool_call|response)>')
_FENCE_RE = re.compile(r'^```(?:json)?\s*(.*?)\s*```$', re.S)
_BODY_LEAD_RE = re.compile(r'\s*(?:```(?:json)?\s*)?')  # what may precede a tool call's JSON value
_DECODER = json.JSONDecoder(strict=False)


def _json_value_end(text: str, start: int) -> int:
  """End (exclusive) of the JSON value that opens `text` at `start` (after blanks and a code fence), or -1.

  So a tool call's body is found by parsing its JSON, not by the first literal `</tool_call>`: a query may
  contain that text (or `<tool_call>`). Returns -1 when no strict JSON value starts there (the caller then falls
  back to the closing tag, and `loads_lenient` repairs what it can).
  """
  lead = _BODY_LEAD_RE.match(text, start)
  pos = lead.end()
  if pos >= len(text) or text[pos] not in '{[':
    return -1
  try:
    _, end = _DECODER.raw_decode(text, pos)
  except (json.JSONDecodeError, RecursionError):
    return -1
  return end


def unbox(response: str) -> str:
  """The answer of a response that is one `\\boxed{...}` (braces balanced inside; spaces around it allowed):
  'Agra' from '\\boxed{Agra}', '{1, 2}' from '\\boxed{{1, 2}}'; any other text as it is (an unclosed box, text
  beside the box)."""
  if not response.startswith('\\boxed{') or not response.endswith('}'):
    return response
  depth = 0
  for i, ch in enumerate(response[len('\\boxed'):], len('\\boxed')):
    depth += (ch == '{') - (ch == '}')
    if depth == 0:
      return response[len('\\boxed{'):i].strip() if i == len(response) - 1 else response
  return response


def parse_action(text: str, profile: str = 'osvl') -> ParsedAction:
  """Parses one assistant turn; never raises on model output.

  Accepts `<think>…</think>` then one `<tool_call>{"name": …, "arguments": {…}}</tool_call>` or
  `<response>…</response>`. Leniency (each noted in `problems` only when it breaks the format):
  - aliases: `parameters`/`args` for `arguments`; arguments given as a JSON string; `{"function": {...}}`
    wrapping; tool names `web_search` -> `text_search`, `layout_parsing` -> `ocr`; arguments `q` -> `query`,
    `url` -> `image`; profile 'official' also drops `hl`, `use_chart_recognition`, `use_doc_orientation_classify`.
  - JSON: code fences, text around the object, trailing commas, single quotes, unquoted keys (the JSON5
    leniencies the official code accepts through `json5`), Python True/False/None, missing closing braces (all
    format-neutral: a readable call is a call).
  - Two or more actions in one turn: format_ok False; the FIRST one (in text order) is the action executed.
  - Missing think block, missing closing tag, text outside the blocks, empty response: format_ok False, the
    action still counts.
  - A response written as `\\boxed{answer}` (the official agent prompt's form, `agent_system_v3`) is the answer
    inside the box (`unbox`).
  - A tool call's body is found by parsing its JSON value (`json.JSONDecoder.raw_decode` from the `{`/`[` that
    opens it), so `</tool_call>` or `<tool_call>` inside a JSON string (a query about them) is text; only a body
    that is not strict JSON ends at the first literal `</tool_call>` (then repaired by `loads_lenient`).
  - No action, unreadable JSON, missing/invalid name or non-object arguments: kind 'malformed' with `error`.

  Args:
    text: the decoded assistant turn (a trailing `<|im_end|>`/`<|endoftext|>` is ignored).
    profile: 'osvl' or 'official' (DESIGN.md §5); both map names to the osvl tool namespace.
  Returns:
    ParsedAction.
  Raises:
    ValueError: only for an unknown `profile` (a configuration error, not model output).
  """
  if profile not in PROFILES:
    raise ValueError(f'unknown tool-schema profile {profile!r}; expected one of {PROFILES}')
  try:
    return _parse_action(text if isinstance(text, str) else str(text), profile)
  except Exception as e:  # pylint: disable=broad-except  # a parser bug must not kill a rollout
    return ParsedAction(think=None, kind='malformed', error=f'unparseable output ({type(e).__name__}: {e})',
                        problems=['unparseable output'])


def _parse_action(text: str, profile: str) -> ParsedAction:
  problems: list[str] = []
  text = text.rstrip()
  while text.endswith(_END_TOKENS):
    text = text[:-len(next(t for t in _END_TOKENS if text.endswith(t)))].rstrip()
  # Think block.
  think, rest = None, text
  start, end = text.find('<think>'), text.find('</think>')
  if end >= 0 and 0 <= start < end:
    if text[:start].strip():
      problems.append('text before <think>')
    think, rest = text[start + len('<think>'):end].strip(), text[end + len('</think>'):]
  elif end >= 0:
    problems.append('</think> without <think>')
    think, rest = text[:end].replace('<think>', '').strip(), text[end + len('</think>'):]
  else:
    problems.append('missing <think>…</think>')
  if '<think>' in rest or '</think>' in rest:
    problems.append('more than one think block')
  # Action blocks in text order; an unclosed block runs to the next opening tag or the end.
  blocks, outside, pos = [], [], 0
  opens = list(_OPEN_RE.finditer(rest))
  for m in opens:
    if m.start() < pos:
      continue  # inside the previous block
    outside.append(rest[pos:m.start()])
    tag = m.group(1)
    search_from = m.end()
    if tag == 'tool_call':  # tags inside the call's JSON strings are text
      search_from = max(search_from, _json_value_end(rest, m.end()))
    following = _OPEN_RE.search(rest, search_from)
    next_open = following.start() if following else len(rest)
    close = rest.find(f'</{tag}>', search_from)
    # A <response> runs to its closing tag whatever it quotes; a <tool_call> must close before the next action.
    if close >= 0 and (tag == 'response' or close < next_open):
      body, pos = rest[m.end():close], close + len(f'</{tag}>')
    else:
      problems.append(f'unclosed <{tag}>')
      body, pos = rest[m.end():next_open], next_open
    blocks.append((tag, body))
  outside.append(rest[pos:])
  leftover = ''.join(outside)
  for tag in ('</tool_call>', '</response>'):
    leftover = leftover.replace(tag, '')
  if leftover.strip():
    problems.append('text outside the think and action blocks')
  if not blocks:
    problems.append('no <tool_call> or <response>')
    return ParsedAction(think=think, kind='malformed', error='no <tool_call> or <response> block found',
                        problems=problems)
  if len(blocks) > 1:
    problems.append(f'{len(blocks)} actions in one turn (the first is executed)')
  tag, body = blocks[0]
  if tag == 'response':
    response = unbox(body.strip())
    if not response:
      problems.append('empty <response>')
    return ParsedAction(think=think, kind='response', response=response, format_ok=not problems,
                        problems=problems)
  name, arguments, error, n_calls = _read_tool_call(body, profile)
  if n_calls > 1:
    problems.append(f'{n_calls} calls in one <tool_call> (the first is executed)')
  if error is not None:
    problems.append('malformed tool call')
    return ParsedAction(think=think, kind='malformed', error=error, problems=problems)
  return ParsedAction(think=think, kind='tool_call', name=name, arguments=arguments, format_ok=not problems,
                      problems=problems)


def _read_tool_call(body: str, profile: str) -> tuple[str | None, dict, str | None, int]:
  """(name, arguments, error, number of calls) of one <tool_call> body."""
  try:
    obj = loads_lenient(body)
  except ValueError as e:
    return None, {}, f'tool call is not valid JSON: {e}', 1
  n_calls = 1
  if isinstance(obj, list):
    n_calls = len(obj)
    if not obj:
      return None, {}, 'tool call is an empty list', 1
    obj = obj[0]
  if not isinstance(obj, dict):
    return None, {}, f'tool call must be a JSON object, got {type(obj).__name__}', n_calls
  if isinstance(obj.get('function'), dict):  # OpenAI style {"type": "function", "function": {...}}
    obj = obj['function']
  name = obj.get('name')
  if not isinstance(name, str) or not name.strip():
    return None, {}, 'tool call has no "name"', n_calls
  name = name.strip()
  name = TOOL_NAME_ALIASES.get(name, name)
  arguments = None
  for key in ('arguments', 'parameters', 'args'):
    if key in obj:
      arguments = obj[key]
      break
  if arguments is None:
    arguments = {}
  if isinstance(arguments, str):
    if not arguments.strip():
      arguments = {}
    else:
      try:
        arguments = loads_lenient(arguments)
      except ValueError as e:
        return name, {}, f'arguments of {name} are not valid JSON: {e}', n_calls
  if not isinstance(arguments, dict):
    return name, {}, f'arguments of {name} must be a JSON object, got {type(arguments).__name__}', n_calls
  arguments = dict(arguments)
  for alias, canonical in ARGUMENT_ALIASES.items():
    if alias in arguments and canonical not in arguments:
      arguments[canonical] = arguments.pop(alias)
  if profile == 'official':
    for key in OFFICIAL_ONLY_ARGUMENTS:
      arguments.pop(key, None)
  return name, arguments, None, n_calls


def loads_lenient(text: str) -> Any:
  """json.loads that also reads the JSON-ish objects LLMs write.

  Tries, in order: strict JSON (inside a code fence, if any); then, for the outermost {...}/[...] span and for
  the text from its first '{'/'[' on: strict JSON, then `json_repair.loads(..., strict=True)` (single-quoted
  strings, unquoted keys, trailing commas, True/False/None, unclosed strings/braces/brackets are repaired; an
  empty value such as `{"query": }`, an empty or duplicate key, or a second top-level value is not: a call with a
  hole is not guessed).

  Raises:
    ValueError: when none of these parses (message from the strict attempt; also for nesting too deep to parse).
  """
  text = text.strip()
  fence = _FENCE_RE.match(text)
  if fence:
    text = fence.group(1)
  try:
    return json.loads(text, strict=False)
  except (json.JSONDecodeError, RecursionError) as e:  # RecursionError: nesting deeper than the C stack allows
    first_error = e
  starts = [i for i in (text.find('{'), text.find('[')) if i >= 0]
  if not starts:
    raise ValueError(str(first_error))
  start = min(starts)
  end = max(text.rfind('}'), text.rfind(']'))
  candidates = []
  if end > start:
    candidates.append(text[start:end + 1])
  candidates.append(text[start:])
  for cand in candidates:
    try:
      return json.loads(cand, strict=False)
    except (json.JSONDecodeError, RecursionError):
      pass
    try:
      return json_repair.loads(cand, skip_json_loads=True, strict=True)
    except Exception:  # pylint: disable=broad-except  # ValueError in strict mode; any failure means unreadable
      continue
  raise ValueError(str(first_error))


def render_assistant_text(think: str, tool_call: dict | None = None, response: str | None = None) -> str:
  """The canonical assistant turn (oracle expert, SFT data); parse_action(render(...)) is format_ok.

  Args:
    think: the reasoning text.
    tool_call: {"name": str, "arguments": dict}; exactly one of tool_call / response.
    response: the final answer.
  Returns:
    '<think>\\n{think}\\n</think>\\n<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>' or
    '<think>\\n{think}\\n</think>\\n<response>{response}</response>' (no <|im_end|>).
  """
  if (tool_call is None) == (response is None):
    raise ValueError('render_assistant_text needs exactly one of tool_call or response')
  head = f'<think>\n{think.strip()}\n</think>\n'
  if response is not None:
    return head + f'<response>{response}</response>'
  if not isinstance(tool_call, dict) or 'name' not in tool_call:
    raise ValueError(f'tool_call must be a dict with "name" and "arguments", got {tool_call!r}')
  call = {'name': tool_call['name'], 'arguments': dict(tool_call.get('arguments') or {})}
  return head + '<tool_call>\n' + json.dumps(call, ensure_ascii=False) + '\n</tool_call>'
