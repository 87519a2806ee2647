"""Field checks of `osvl_jax.serve.service`'s requests: SGLang `sampling_params` and the OpenAI chat body. Each
malformed field is a `RequestError` (HTTP 400) whose message names the field and the value.
"""

import json
import math
import re
from typing import Any

from osvl_jax.trajectory import tokens as tokens_lib

# sampling_params keys read here, and those accepted only at their default (value -> allowed values).
SAMPLING_FIELDS = ('max_new_tokens', 'temperature', 'top_p', 'stop', 'stop_token_ids', 'skip_special_tokens',
                   'no_stop_trim', 'sampling_seed', 'spaces_between_special_tokens', 'stream_interval')
SAMPLING_DEFAULT_ONLY = {'top_k': (None, -1, 0, 1 << 30), 'min_p': (None, 0, 0.0), 'n': (None, 1),
                         'frequency_penalty': (None, 0, 0.0), 'presence_penalty': (None, 0, 0.0),
                         'repetition_penalty': (None, 1, 1.0), 'min_new_tokens': (None, 0), 'ignore_eos': (None, False),
                         'json_schema': (None,), 'regex': (None,), 'ebnf': (None,), 'logit_bias': (None, {}),
                         'custom_params': (None, {}), 'structural_tag': (None,), 'stop_regex': (None, [], ())}
# OpenAI chat fields read here (`seed` and `user` are accepted and ignored); any other field must be absent or
# hold a default-like value (`default_like`).
CHAT_FIELDS = ('model', 'messages', 'max_tokens', 'max_completion_tokens', 'temperature', 'top_p', 'stop', 'n',
               'stream', 'seed', 'user')
CHAT_ROLES = ('system', 'user', 'assistant')
MAX_JSON_DEPTH = 32      # nesting levels of a request body (the deepest field read here is at level 5)
MAX_VERSION_CHARS = 256  # the longest weight_version


class RequestError(ValueError):
  """A request this server refuses (HTTP 400), with the reason."""


def default_like(value: Any) -> bool:
  """True for a value SGLang treats as unset (None, False, 0, [], {}): such an unsupported field is accepted."""
  return value is None or value is False or (isinstance(value, (int, float)) and value == 0) or value in ([], {})


def integer(value: Any, name: str, minimum: int | None = None) -> int:
  """`value` as an int (JSON integer, not a bool), at least `minimum`; else a RequestError naming `name`."""
  if isinstance(value, bool) or not isinstance(value, int) or (minimum is not None and value < minimum):
    what = 'an integer' + (f' >= {minimum}' if minimum is not None else '')
    raise RequestError(f'{name} must be {what}, got {value!r}')
  return value


def boolean(value: Any, name: str, default: bool) -> bool:
  """`value` (a JSON boolean; None: `default`); else a RequestError naming `name`."""
  if value is None:
    return default
  if not isinstance(value, bool):
    raise RequestError(f'{name} must be true or false, got {value!r}')
  return value


def number(value: Any, name: str, default: float, ok, what: str) -> float:
  """`value` as a float with `ok(value)` true (None: `default`); else a RequestError naming `name` and `what`."""
  if value is None:
    return default
  try:
    as_float = None if isinstance(value, bool) or not isinstance(value, (int, float)) else float(value)
  except OverflowError:   # a JSON integer beyond float range
    as_float = None
  if as_float is None or not ok(as_float):
    raise RequestError(f'{name} must be {what}, got {str(value)[:40]}')
  return as_float


def stop_strings(value: Any, name: str) -> tuple[str, ...]:
  """A stop string or list of them (None / []: none) -> tuple of non-empty strings; else a RequestError."""
  if value is None:
    return ()
  stop = (value,) if isinstance(value, str) else tuple(value) if isinstance(value, list) else None
  if stop is None or not all(isinstance(s, str) and s for s in stop):
    raise RequestError(f'{name} must be a non-empty string or a list of them, got {value!r}')
  return stop


def sampling(values: dict, names: dict, default_max_new: int, limits=None) -> dict:
  """The sampling parameters this server runs, from `values` (keys as in SGLang) checked under `names`.

  Args:
    values: {max_new_tokens, temperature, top_p, stop, stop_token_ids, skip_special_tokens, no_stop_trim}
      (absent / None: the default).
    names: how errors name each key (e.g. 'sampling_params.top_p', or chat's 'top_p').
    default_max_new: max_new_tokens when none is given.
    limits: a `request_limits.RequestLimits` (None: no max_new_tokens limit).
  Returns:
    The `requests.Row` keyword arguments of sampling.
  Raises:
    RequestError: naming the field.
  """
  max_new = values.get('max_new_tokens')
  max_new = default_max_new if max_new is None else integer(max_new, names['max_new_tokens'], 1)
  if limits is not None:
    limits.check_max_new_tokens(max_new, names['max_new_tokens'])
  temperature = number(values.get('temperature'), names['temperature'], 1.0, lambda t: math.isfinite(t) and t >= 0,
                       'a finite number >= 0 (0 = greedy)')
  top_p = number(values.get('top_p'), names['top_p'], 1.0, lambda p: 0 < p <= 1, 'a number in (0, 1]')
  stop_ids = values.get('stop_token_ids')
  stop_ids = [] if stop_ids is None else stop_ids
  if not isinstance(stop_ids, list):
    raise RequestError(f'{names["stop_token_ids"]} must be a list of token ids, got {stop_ids!r}')
  for k, i in enumerate(stop_ids):
    integer(i, f'{names["stop_token_ids"]}[{k}]', 0)
  return {'max_new_tokens': int(max_new), 'temperature': temperature, 'top_p': top_p,
          'stop': stop_strings(values.get('stop'), names['stop']), 'stop_token_ids': frozenset(stop_ids),
          'skip_special_tokens': boolean(values.get('skip_special_tokens'), names['skip_special_tokens'], True),
          'no_stop_trim': boolean(values.get('no_stop_trim'), names['no_stop_trim'], False)}


def vision_bans(value: Any, name: str) -> None:
  """Checks an SGLang `logit_bias` ({"<token id>": bias}): this server accepts only bans (bias <= -100) of the
  vision ids, which its sampler never samples anyway (`SGLangEngine` sends them to every server; DESIGN.md §4).

  Raises:
    RequestError: naming `name`: not an object, a key that is not a token id, a bias that is not a number, or a
      bias this server cannot apply (on another id, or above -100).
  """
  if not isinstance(value, dict):
    raise RequestError(f'{name} must be an object of token id -> bias, got {value!r}')
  for key, bias in value.items():
    if not isinstance(key, str) or not (key.isascii() and key.isdigit()):
      raise RequestError(f'{name}: key {key!r} is not a token id')
    bias = number(bias, f'{name}[{key}]', math.nan, math.isfinite, 'a finite number')
    if math.isnan(bias):   # null
      raise RequestError(f'{name}[{key}] must be a finite number, got null')
    if int(key) not in tokens_lib.VISION_IDS or bias > -100:
      raise RequestError(f'{name}[{key}]={bias!r}: osvl_jax.serve applies a logit_bias only as a ban (<= -100) '
                         f'of the vision ids {list(tokens_lib.VISION_IDS)}, which it never samples')


def parse_sampling(sp: Any, default_max_new: int, limits=None, name: str = 'sampling_params') -> dict:
  """SGLang `sampling_params` -> the subset this server runs (`sampling`).

  Raises:
    RequestError: naming the field, for a value of the wrong type or range, an unknown field, or one this server
      runs only at its default (e.g. top_k, n).
  """
  sp = {} if sp is None else sp
  if not isinstance(sp, dict):
    raise RequestError(f'{name} must be an object, got {sp!r}')
  for key, value in sp.items():
    if key in SAMPLING_FIELDS:
      continue
    if key == 'logit_bias':
      vision_bans(value, f'{name}.logit_bias')
      continue
    if key in SAMPLING_DEFAULT_ONLY:
      allowed = SAMPLING_DEFAULT_ONLY[key]   # a bool only where it is the default itself (True == 1)
      if value not in allowed or isinstance(value, bool) and not any(a is value for a in allowed):
        raise RequestError(f'{name}.{key}={value!r} is not supported by osvl_jax.serve (only its default)')
      continue
    raise RequestError(f'unknown {name} field {key!r}')
  if sp.get('sampling_seed') is not None:
    integer(sp['sampling_seed'], f'{name}.sampling_seed')
  boolean(sp.get('spaces_between_special_tokens'), f'{name}.spaces_between_special_tokens', True)
  if sp.get('stream_interval') is not None:
    integer(sp['stream_interval'], f'{name}.stream_interval', 1)
  names = {k: f'{name}.{k}' for k in SAMPLING_FIELDS}
  return sampling(sp, names, default_max_new, limits)


def check_chat_body(body: Any) -> None:
  """An OpenAI `/v1/chat/completions` body this server can run: its fields and the shape of `messages`.

  Raises:
    RequestError: naming the field (e.g. 'messages[1].content[0].image_url').
  """
  if not isinstance(body, dict):
    raise RequestError('the body must be a JSON object')
  for key, value in body.items():
    if key not in CHAT_FIELDS and not default_like(value):
      raise RequestError(f'field {key!r} is not supported by osvl_jax.serve /v1/chat/completions')
  if body.get('model') is not None and not isinstance(body['model'], str):
    raise RequestError(f'model must be a string, got {body["model"]!r}')
  if body.get('user') is not None and not isinstance(body['user'], str):
    raise RequestError(f'user must be a string, got {body["user"]!r}')
  if body.get('seed') is not None:
    integer(body['seed'], 'seed')
  if boolean(body.get('stream'), 'stream', False):
    raise RequestError('stream=true is not supported by osvl_jax.serve')
  if body.get('n') is not None and integer(body['n'], 'n', 1) != 1:
    raise RequestError(f'n={body["n"]} is not supported: only n=1')
  check_messages(body.get('messages'))


def _utf8(text: str | None, name: str) -> None:
  """Refuses text the tokenizer cannot take: JSON escapes of lone surrogates (`"\\ud800"`) decode to no UTF-8."""
  try:
    (text or '').encode('utf-8')
  except UnicodeEncodeError as e:
    raise RequestError(f'{name} is not valid Unicode text (a lone surrogate at {e.start})') from None


def _child(name: str, key) -> str:
  """The name of `key` inside the field `name` ('' = the body): 'sampling_params.stop[0]'."""
  if isinstance(key, int):
    return f'{name}[{key}]'
  return f'{name}.{key}' if name else str(key)


def check_json(body: Any, max_depth: int = MAX_JSON_DEPTH) -> None:
  """Refuses a parsed JSON body nested deeper than `max_depth` levels, or holding a string (value or key) that is
  not valid Unicode text (a lone surrogate, from an escape such as `"\\ud800"`), which no answer could echo.

  Raises:
    RequestError: naming the field (e.g. 'sampling_params.stop[0]').
  """
  todo = [(body, '', 1)]
  while todo:
    value, name, depth = todo.pop()
    if isinstance(value, str):
      _utf8(value, name or 'the body')
      continue
    if not isinstance(value, (list, dict)):
      continue
    if depth > max_depth:
      raise RequestError(f'{name}: JSON nested deeper than {max_depth} levels')
    for key, item in (value.items() if isinstance(value, dict) else enumerate(value)):
      if isinstance(key, str):
        _utf8(key, f'a key of {name or "the body"}')
      if isinstance(item, (str, list, dict)):
        todo.append((item, _child(name, key), depth + 1))


_JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{},]')


def deep_field(text: str, max_depth: int = MAX_JSON_DEPTH) -> str:
  """The field of the JSON `text` whose value opens nesting level `max_depth` + 1 ('the body' if none): names
  what a parser's recursion limit refused."""
  stack = []   # per open container: [kind, current index or key]
  for m in _JSON_TOKEN.finditer(text):
    token = m.group()
    if token in '[{':
      if len(stack) >= max_depth:
        name = ''
        for _, key in stack:
          name = _child(name, key)
        return name or 'the body'
      stack.append(['[', 0] if token == '[' else ['{', None])
    elif token in ']}':
      if stack:
        stack.pop()
    elif token == ',' and stack:
      stack[-1][1] = stack[-1][1] + 1 if stack[-1][0] == '[' else None
    elif stack and stack[-1][0] == '{' and stack[-1][1] is None:   # a key
      stack[-1][1] = token[1:-1]
  return 'the body'


def parse_body(raw: bytes) -> Any:
  """A request body -> its JSON value, checked by `check_json`.

  Raises:
    RequestError: not JSON; nested deeper than `MAX_JSON_DEPTH` (naming the field, also past the parser's own
      recursion limit); a string that is not valid Unicode text (naming the field).
  """
  try:
    body = json.loads(raw)
  except RecursionError:
    field = deep_field(raw.decode('utf-8', 'replace'))
    raise RequestError(f'{field}: JSON nested deeper than {MAX_JSON_DEPTH} levels') from None
  except ValueError:
    raise RequestError('the body is not JSON') from None
  check_json(body)
  return body


def weight_version(value: Any, name: str = 'weight_version') -> str:
  """A weight version as text: a JSON integer, or a non-empty printable string of at most `MAX_VERSION_CHARS`
  characters (no control characters, no lone surrogates: every answer reports it).

  Raises:
    RequestError: naming `name`.
  """
  if isinstance(value, int) and not isinstance(value, bool):
    return str(value)
  if not (isinstance(value, str) and value and len(value) <= MAX_VERSION_CHARS and value.isprintable()):
    raise RequestError(f'{name} must be an integer or a non-empty printable string of at most {MAX_VERSION_CHARS} '
                       f'characters, got {str(value)[:80]!r}')
  return value


def check_messages(messages: Any) -> None:
  """OpenAI chat `messages`: a non-empty list of {role, content: string | null | [text / image_url parts]}.

  Raises:
    RequestError: naming the field (e.g. 'messages[1].content[0].image_url').
  """
  if not isinstance(messages, list) or not messages:
    raise RequestError(f'messages must be a non-empty list of message objects, got {messages!r}')
  for k, message in enumerate(messages):
    where = f'messages[{k}]'
    if not isinstance(message, dict):
      raise RequestError(f'{where} must be an object with role and content, got {message!r}')
    if message.get('role') not in CHAT_ROLES:
      raise RequestError(f'{where}.role must be one of {CHAT_ROLES}, got {message.get("role")!r}')
    content = message.get('content')
    if content is None or isinstance(content, str):
      _utf8(content, f'{where}.content')
      continue
    if not isinstance(content, list):
      raise RequestError(f'{where}.content must be a string or a list of parts, got {content!r}')
    for j, part in enumerate(content):
      kind = part.get('type') if isinstance(part, dict) else None
      if kind == 'text' and isinstance(part.get('text'), str):
        _utf8(part['text'], f'{where}.content[{j}].text')
        continue
      url = part.get('image_url') if kind == 'image_url' else None
      url = url.get('url') if isinstance(url, dict) else url
      if not isinstance(url, str) and kind in ('text', 'image_url'):
        field = 'text' if kind == 'text' else 'image_url'
        raise RequestError(f'{where}.content[{j}].{field} must be a string (image_url: or {{"url": string}})')
      if kind not in ('text', 'image_url'):
        raise RequestError(f'{where}.content[{j}] must be a text or image_url part, got {part!r}')


def chat_sampling(body: dict, default_max_new: int, limits=None) -> dict:
  """The sampling parameters of a checked chat body (`check_chat_body`), errors naming the chat fields."""
  max_new = body.get('max_completion_tokens')
  name = 'max_completion_tokens'
  if max_new is None:
    max_new, name = body.get('max_tokens'), 'max_tokens'
  values = {'max_new_tokens': max_new, 'temperature': body.get('temperature'), 'top_p': body.get('top_p'),
            'stop': body.get('stop')}
  names = {**{k: k for k in SAMPLING_FIELDS}, 'max_new_tokens': name}
  return sampling(values, names, default_max_new, limits)
