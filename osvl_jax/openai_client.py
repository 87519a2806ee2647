"""The one client of OpenAI-compatible `/v1/chat/completions` endpoints: the LLM judge (`judges.llm`), the pipeline's
LLM stages (`data_pipeline.llm`) and the API-model engine (`rollout.remote.openai_engine`) all call through
`ChatClient`.

A `ChatClient` holds one endpoint and its limits, on the pinned `openai` library (`OpenAI` for the sync form, from
any number of threads; `AsyncOpenAI` for the async form, one per event loop, since an async connection pool belongs
to the loop that opened it):
  endpoint     `base_url` (including `/v1`), `model` (sent with every request), the API key: given, else the
               environment variable named `api_key_env`, else 'EMPTY' (local servers need none). Never logged.
  timeout      `timeout_s` seconds per request (each attempt).
  retries      a failed attempt is retried up to `max_retries` times, sleeping `retry_backoff_s * 2**(k-1)` seconds
               before retry k, or longer when the answer's `Retry-After` asks so (`retry_after_seconds`): a refused /
               dropped connection, a timeout, HTTP 408 / 409 / 429 / 5xx (the statuses the `openai` library itself
               retries), a reply without choices, and a reply the caller's `parse`
               rejects (a ValueError: an unparseable judge verdict, an empty text). Another 4xx, or a body the
               library cannot read, fails at once.
  concurrency  at most `max_concurrency` calls in flight: the sync calls of all threads share one limit, each event
               loop has its own. A call keeps its slot through its retries and their sleeps.
  budgets      `max_requests` (requests sent, retries included) and `max_total_tokens` (the replies'
               `usage.total_tokens`) over the client's life; 0 = no limit. Checked before every attempt: once one
               is spent, `BudgetExceeded` naming it, and nothing is sent. The request budget is exact; the token
               budget is known only after a reply, so calls already in flight can overshoot it.
`usage()` counts requests sent, replies, retries, failed calls (by kind), budget refusals, and the prompt /
completion / total tokens the endpoint reported (its tokenizer's count): the run's cost figures.

The `openai` library's own retries are off (`max_retries=0`): its backoff is fixed (0.5 s doubling), its attempts are
invisible to the budgets and counters, and it cannot retry a reply the caller cannot use. The one bounded loop here
does all three.

Errors (both carry `kind`, `url`, `status`, `attempts`; the message names the URL):
  ChatError       the call failed after its retries (or at once when not retryable). kind: 'connection',
                  'timeout', 'http_<status>', 'bad_reply' (no choices, or `parse` refused it; `text` holds the last
                  reply), 'bad_response' (a body the library could not read).
  BudgetExceeded  a ChatError of kind 'budget': `budget` is 'max_requests' or 'max_total_tokens'.
"""

from __future__ import annotations

import asyncio
import dataclasses
import email.utils
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import openai

RETRY_STATUSES = (408, 409, 429)   # and every 5xx
MAX_RETRY_AFTER_S = 60.0   # a longer `Retry-After` is waited this long (a quota's hour would stall the run silently)
BUDGETS = ('max_requests', 'max_total_tokens')
_DETAIL_CHARS = 300


class ChatError(RuntimeError):
  """A chat completion that failed (module docstring).

  Attributes:
    kind: 'connection' | 'timeout' | 'http_<status>' | 'bad_reply' | 'bad_response' | 'budget'.
    reason: the last failure's message (the `openai` exception's text, the parse error's, ...).
    url: the endpoint URL (`<base_url>/chat/completions`).
    status: the last HTTP status, or None (no answer).
    attempts: requests sent for this call.
    cause: the last exception, or None.
    text: the last reply's text for 'bad_reply', else None.
  """

  def __init__(self, kind: str, reason: str, url: str, status: int | None = None, attempts: int = 0,
               cause: BaseException | None = None, text: str | None = None):
    self.kind, self.reason, self.url, self.status = kind, reason, url, status
    self.attempts, self.cause, self.text = attempts, cause, text
    what = f'{type(cause).__name__}: {reason}' if cause is not None else reason
    super().__init__(f'{kind}: {what} (POST {url}, status={status}, attempts={attempts})')


class BudgetExceeded(ChatError):
  """A budget of the client is spent; nothing was sent. `budget`: the field ('max_requests' or 'max_total_tokens'),
  `limit`: its value, `used`: requests sent or tokens used so far."""

  def __init__(self, budget: str, limit: int, used: int, url: str, attempts: int):
    self.budget, self.limit, self.used = budget, limit, used
    unit = 'requests sent' if budget == 'max_requests' else 'tokens used'
    super().__init__('budget', f'budget {budget}={limit} is spent ({used} {unit}); no request sent', url,
                     attempts=attempts)


@dataclasses.dataclass(frozen=True)
class Completion:
  """One chat answer.

  Attributes:
    text: the first choice's message content (None: the message has none).
    finish_reason: the first choice's ('stop', 'length', ...), or None.
    reasoning: the message's `reasoning_content` (reasoning parsers of vLLM / SGLang), or None.
    tool_calls: the message's native `tool_calls` (an endpoint whose tool parser took them out of the text), each
      {'name', 'arguments': the JSON text as sent, unparsed}; () without any.
    prompt_tokens, completion_tokens, total_tokens: this reply's `usage`, in the endpoint's tokens (0 without one).
    attempts: requests this call sent (1 + its retries).
    parsed: what `parse(text)` returned, when the call gave a `parse`.
  """
  text: str | None
  finish_reason: str | None
  reasoning: str | None
  prompt_tokens: int
  completion_tokens: int
  total_tokens: int
  attempts: int
  parsed: Any = None
  tool_calls: tuple = ()


def retry_after_seconds(headers) -> float | None:
  """The wait an HTTP answer's `Retry-After` header asks for, in seconds (delta-seconds or an HTTP date), at most
  `MAX_RETRY_AFTER_S`; None without a readable one. Both HTTP clients (this one, `sglang_client`) honour it."""
  value = (headers.get('retry-after') if headers is not None else None) or ''
  try:
    seconds = float(value)
  except ValueError:
    try:
      seconds = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
    except (TypeError, ValueError, IndexError):
      return None
  return min(max(seconds, 0.0), MAX_RETRY_AFTER_S) if seconds == seconds else None


class _Failure(Exception):
  """An attempt's failure, classified (internal); `retry_after`: the wait its answer asked for, or None."""

  def __init__(self, kind: str, reason: str, retry: bool, status: int | None = None,
               cause: BaseException | None = None, text: str | None = None, retry_after: float | None = None):
    super().__init__(reason)
    self.kind, self.reason, self.retry, self.status, self.cause, self.text = kind, reason, retry, status, cause, text
    self.retry_after = retry_after


def _classify(e: BaseException) -> _Failure:
  """An exception of `openai` -> its failure kind and whether it is retried; anything else is not ours: re-raised."""
  if isinstance(e, _Failure):
    return e
  reason = str(e)[:_DETAIL_CHARS]
  if isinstance(e, openai.APITimeoutError):   # (a subclass of APIConnectionError)
    return _Failure('timeout', reason, True, cause=e)
  if isinstance(e, openai.APIConnectionError):
    return _Failure('connection', reason, True, cause=e)
  if isinstance(e, openai.APIStatusError):
    status = int(e.status_code)
    return _Failure(f'http_{status}', reason, status in RETRY_STATUSES or status >= 500, status, e,
                    retry_after=retry_after_seconds(e.response.headers))
  if isinstance(e, openai.OpenAIError):
    return _Failure('bad_response', reason, False, cause=e)
  raise e


class ChatClient:
  """An OpenAI-compatible chat endpoint with timeouts, retries, a concurrency limit and budgets (module docstring).

  `complete(messages, ...)` (sync, thread-safe) and `await acomplete(messages, ...)` (async) return a `Completion`
  or raise `ChatError` / `BudgetExceeded`; `usage()` reads the counters; `close()` / `await aclose()` release the
  connections (a later call opens new ones).
  """

  def __init__(self, base_url: str, model: str, *, api_key: str | None = None, api_key_env: str = '',
               timeout_s: float = 60.0, max_retries: int = 2, retry_backoff_s: float = 0.5, max_concurrency: int = 8,
               max_requests: int = 0, max_total_tokens: int = 0):
    """Args:
      base_url: the endpoint including `/v1`, e.g. 'http://127.0.0.1:30000/v1' (a trailing '/' is dropped).
      model: the model name every request carries.
      api_key: sent as `Authorization: Bearer <key>`; None: `$<api_key_env>` when set and non-empty, else 'EMPTY'.
      api_key_env: the environment variable holding the key ('' = none).
      timeout_s: seconds per request (> 0).
      max_retries: retries of a failed attempt (>= 0).
      retry_backoff_s: seconds before retry 1; doubles with each further retry (>= 0).
      max_concurrency: calls in flight at most (>= 1).
      max_requests: requests the client may send in its life, retries included (0 = no limit).
      max_total_tokens: tokens (usage.total_tokens) the client may use in its life (0 = no limit).
    Raises:
      ValueError: an empty base_url or model, or a limit out of range (naming it).
    """
    if not str(base_url or '').strip():
      raise ValueError('base_url is empty: no endpoint to call')
    if not str(model or '').strip():
      raise ValueError(f'model is empty for the endpoint {base_url}')
    if not float(timeout_s) > 0:
      raise ValueError(f'timeout_s={timeout_s!r}: must be > 0')
    if int(max_concurrency) < 1:
      raise ValueError(f'max_concurrency={max_concurrency!r}: must be >= 1')
    for name, value in (('max_retries', max_retries), ('retry_backoff_s', retry_backoff_s),
                        ('max_requests', max_requests), ('max_total_tokens', max_total_tokens)):
      if not float(value) >= 0:
        raise ValueError(f'{name}={value!r}: must be >= 0')
    self.base_url, self.model = str(base_url).rstrip('/'), str(model)
    self.url = f'{self.base_url}/chat/completions'
    if api_key is None and api_key_env:
      api_key = os.environ.get(api_key_env) or None
    self.api_key = api_key or 'EMPTY'
    self.timeout_s, self.max_retries, self.retry_backoff_s = float(timeout_s), int(max_retries), float(retry_backoff_s)
    self.max_concurrency = int(max_concurrency)
    self.max_requests, self.max_total_tokens = int(max_requests), int(max_total_tokens)
    self._lock = threading.Lock()
    self._slots = threading.BoundedSemaphore(self.max_concurrency)
    self._sync: openai.OpenAI | None = None
    self._loops: dict[asyncio.AbstractEventLoop, tuple[openai.AsyncOpenAI, asyncio.Semaphore]] = {}
    self._usage = {'requests': 0, 'replies': 0, 'retries': 0, 'errors': 0, 'budget_refused': 0,
                   'prompt_tokens': 0, 'completion_tokens': 0, 'total_tokens': 0}
    self._error_kinds: dict[str, int] = {}

  @classmethod
  def from_config(cls, config, **overrides) -> 'ChatClient':
    """A client from a config section holding the constructor's field names (base_url, model, api_key_env,
    timeout_s, max_retries, retry_backoff_s, max_concurrency, max_requests, max_total_tokens; a missing one takes
    the constructor's default), `overrides` last.

    Raises:
      ValueError: as the constructor.
    """
    fields = ('base_url', 'model', 'api_key_env', 'timeout_s', 'max_retries', 'retry_backoff_s', 'max_concurrency',
              'max_requests', 'max_total_tokens')
    kwargs = {f: config.get(f) for f in fields if config.get(f) is not None}
    kwargs.update(overrides)
    return cls(kwargs.pop('base_url', ''), kwargs.pop('model', ''), **kwargs)

  def __repr__(self) -> str:
    return f'ChatClient({self.base_url!r}, model={self.model!r})'   # never the key

  def model_card(self) -> dict | None:
    """What `GET <base_url>/models` lists for `model` (its fields but the per-request stamps `created` and
    `permission`, which vLLM makes anew each time), or None when the endpoint does not list it or answers the
    listing with an HTTP error (an endpoint without `/models`).

    Raises:
      ChatError: the endpoint cannot be reached (kind 'connection' / 'timeout') or its answer cannot be read.
    """
    try:
      page = self._sync_client().models.list()
    except openai.APIStatusError:
      return None
    except openai.OpenAIError as e:
      f = _classify(e)
      raise ChatError(f.kind, f.reason, f'{self.base_url}/models', f.status, 1, e) from e
    for card in page.data:
      if card.id == self.model:
        return {k: v for k, v in sorted(card.model_dump().items()) if k not in ('created', 'permission')}
    return None

  # -- counters and budgets ----------------------------------------------------------------------------------------
  def usage(self) -> dict:
    """Counters over the client's life: requests (sent, retries included), replies (calls answered), retries,
    errors (calls failed after their retries; budget refusals not included), error_kinds ({kind: calls}),
    budget_refused (calls refused by a budget), prompt_tokens, completion_tokens, total_tokens (the endpoint's
    `usage`, summed over every reply received, retried ones included)."""
    with self._lock:
      return {**self._usage, 'error_kinds': dict(self._error_kinds)}

  def _reserve(self, attempt: int) -> None:
    """Counts attempt `attempt` (1-based) of a call against the budgets, or raises `BudgetExceeded`."""
    with self._lock:
      u = self._usage
      for budget, used in (('max_requests', u['requests']), ('max_total_tokens', u['total_tokens'])):
        limit = getattr(self, budget)
        if limit and used >= limit:
          u['budget_refused'] += 1
          raise BudgetExceeded(budget, limit, used, self.url, attempt - 1)
      u['requests'] += 1
      u['retries'] += int(attempt > 1)

  def _accept(self, reply: Any, parse: Callable[[str | None], Any] | None, attempts: int) -> Completion:
    """The `Completion` of a reply, its usage counted; raises `_Failure('bad_reply')` to retry it."""
    usage = getattr(reply, 'usage', None)
    prompt = int(getattr(usage, 'prompt_tokens', 0) or 0)
    completion = int(getattr(usage, 'completion_tokens', 0) or 0)
    total = int(getattr(usage, 'total_tokens', 0) or 0) or prompt + completion
    with self._lock:
      self._usage['prompt_tokens'] += prompt
      self._usage['completion_tokens'] += completion
      self._usage['total_tokens'] += total
    choices = getattr(reply, 'choices', None) or []
    message = getattr(choices[0], 'message', None) if choices else None
    if message is None:
      raise _Failure('bad_reply', 'the reply has no choices', True, 200)
    calls = tuple({'name': getattr(getattr(c, 'function', None), 'name', None),
                   'arguments': getattr(getattr(c, 'function', None), 'arguments', None)}
                  for c in getattr(message, 'tool_calls', None) or ())
    out = Completion(text=message.content, finish_reason=getattr(choices[0], 'finish_reason', None),
                     reasoning=getattr(message, 'reasoning_content', None), prompt_tokens=prompt,
                     completion_tokens=completion, total_tokens=total, attempts=attempts, tool_calls=calls)
    if parse is not None:
      try:
        out = dataclasses.replace(out, parsed=parse(out.text))
      except ValueError as e:
        raise _Failure('bad_reply', str(e)[:_DETAIL_CHARS], True, 200, e, out.text) from e
    with self._lock:
      self._usage['replies'] += 1
    return out

  def _give_up(self, failure: _Failure, attempts: int) -> ChatError:
    with self._lock:
      self._usage['errors'] += 1
      self._error_kinds[failure.kind] = self._error_kinds.get(failure.kind, 0) + 1
    return ChatError(failure.kind, failure.reason, self.url, failure.status, attempts, failure.cause, failure.text)

  def _backoff(self, attempt: int, failure: _Failure) -> float:
    """Seconds to sleep after failed attempt `attempt` (1-based): retry_backoff_s * 2**(attempt - 1), or the
    failure's `Retry-After` when longer."""
    return max(self.retry_backoff_s * 2 ** (attempt - 1), failure.retry_after or 0.0)

  def _body(self, messages: Sequence[dict], params: dict) -> dict:
    return {'model': self.model, 'messages': list(messages), **params}

  # -- sync ----------------------------------------------------------------------------------------------------------
  def _sync_client(self) -> openai.OpenAI:
    with self._lock:
      if self._sync is None:
        self._sync = openai.OpenAI(base_url=self.base_url, api_key=self.api_key, timeout=self.timeout_s,
                                   max_retries=0)
      return self._sync

  def complete(self, messages: Sequence[dict], *, parse: Callable[[str | None], Any] | None = None,
               **params) -> Completion:
    """One chat completion, blocking (safe from many threads; at most `max_concurrency` at once).

    Args:
      messages: OpenAI chat messages ({'role', 'content': str | [text / image_url parts]}).
      parse: called with the reply text (None when the message has no content); a ValueError it raises makes the
        reply a failed attempt, retried (kind 'bad_reply'); its result is `Completion.parsed`.
      **params: further request fields (max_tokens, temperature, top_p, stop, ...).
    Returns:
      The `Completion`.
    Raises:
      ChatError: the call failed after its retries, naming the URL and the last failure.
      BudgetExceeded: a budget was spent before an attempt (naming it); nothing more was sent.
    """
    body = self._body(messages, params)
    with self._slots:
      attempt = 0
      while True:
        attempt += 1
        self._reserve(attempt)
        try:
          return self._accept(self._sync_client().chat.completions.create(**body), parse, attempt)
        except Exception as e:  # pylint: disable=broad-except  # classified; anything not ours is re-raised
          failure = _classify(e)
          if not failure.retry or attempt > self.max_retries:
            raise self._give_up(failure, attempt) from e
        time.sleep(self._backoff(attempt, failure))

  def close(self) -> None:
    """Closes the sync connections (a later `complete` opens new ones)."""
    with self._lock:
      client, self._sync = self._sync, None
    if client is not None:
      client.close()

  # -- async ---------------------------------------------------------------------------------------------------------
  def _async_client(self) -> tuple[openai.AsyncOpenAI, asyncio.Semaphore]:
    """The running event loop's client and concurrency slots (made on first use; clients of closed loops dropped)."""
    loop = asyncio.get_running_loop()
    with self._lock:
      for old in [l for l in self._loops if l.is_closed()]:
        del self._loops[old]
      if loop not in self._loops:
        self._loops[loop] = (openai.AsyncOpenAI(base_url=self.base_url, api_key=self.api_key,
                                                timeout=self.timeout_s, max_retries=0),
                             asyncio.Semaphore(self.max_concurrency))
      return self._loops[loop]

  async def acomplete(self, messages: Sequence[dict], *, parse: Callable[[str | None], Any] | None = None,
                      **params) -> Completion:
    """`complete` for an event loop: the same arguments, result and errors; at most `max_concurrency` calls of this
    loop in flight at once."""
    body = self._body(messages, params)
    client, slots = self._async_client()
    async with slots:
      attempt = 0
      while True:
        attempt += 1
        self._reserve(attempt)
        try:
          return self._accept(await client.chat.completions.create(**body), parse, attempt)
        except Exception as e:  # pylint: disable=broad-except  # classified; anything not ours is re-raised
          failure = _classify(e)
          if not failure.retry or attempt > self.max_retries:
            raise self._give_up(failure, attempt) from e
        await asyncio.sleep(self._backoff(attempt, failure))

  async def aclose(self) -> None:
    """Closes the running event loop's connections (a later `acomplete` in it opens new ones)."""
    with self._lock:
      entry = self._loops.pop(asyncio.get_running_loop(), None)
    if entry is not None:
      await entry[0].close()
