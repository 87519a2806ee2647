"""The async chat client of the LLM stages of the pipeline (DESIGN.md §7: "every LLM-using stage talks to an
OpenAI-compatible endpoint (`openai` client, base_url + model from config)").

`AsyncChatClient` is the project's one OpenAI-compatible client (`osvl_jax.openai_client.ChatClient`, built from
`default_config()`'s fields) in the form the stages use: `chat(messages)` never raises; every failure (connection
refused, timeout, HTTP status, an empty reply, a spent budget) comes back as `Reply.error`, a short reason
`<kind>: <what>` the stage records on the item. The client's limits:
  * concurrency: at most `max_concurrency` requests in flight;
  * retries: a failed attempt (connection, timeout, 408 / 409 / 429 / 5xx, an empty reply: kind 'bad_reply') is
    retried up to `max_retries` times after `retry_backoff_s * 2**(k-1)` seconds; other 4xx are not retried;
  * budgets: `max_requests` attempts and `max_total_tokens` tokens (the replies' `usage.total_tokens`) for the
    client's life (0 = unlimited); past either, requests are answered `budget: requests` / `budget: tokens`
    without being sent (the token budget is read before each attempt, so up to `max_concurrency - 1` requests
    already in flight can overshoot it; the request budget is exact).
`stats()` counts requests (attempts sent), replies, errors (by kind), retries, tokens (total; prompt and completion
too) and budget refusals.

An endpoint outage is not an item's fault: `outages(counts)` finds the failed calls of the kinds that say the
endpoint did not answer (`OUTAGE_KINDS`: refused / dropped connections, timeouts, HTTP 401 / 403 / 404 / 408 / 429 /
5xx, after the retries) in a stage's counts, and the build stops without saving the stage (`EndpointDown`), so that
a rerun asks again instead of keeping the items rejected (or left with their fallbacks) for it.

Images go as `image_url` data URLs (PNG, base64) in the user message (`image_part`), the OpenAI vision format
that `osvl_jax.serve`, vLLM and SGLang accept.
"""

import base64
import dataclasses

import cv2
import ml_collections
import numpy as np


def default_config() -> ml_collections.ConfigDict:
  """Endpoint and limits of an LLM stage. Fields:

    base_url: OpenAI-compatible endpoint including `/v1`, e.g. 'http://127.0.0.1:30000/v1'; '' = offline.
    model: model name sent in the request.
    api_key_env: environment variable holding the API key; unset -> 'EMPTY' (local servers need none).
    max_concurrency: requests in flight at most.
    max_retries: retries of a failed attempt (connection, timeout, 429 / 5xx, empty reply).
    retry_backoff_s: the sleep before retry k (k = 1, 2, ...) is retry_backoff_s * 2**(k-1), seconds.
    timeout_s: per-attempt timeout, seconds.
    max_tokens: reply budget per request, tokens.
    temperature: sampling temperature (0: greedy).
    max_requests: attempts allowed for the stage (0 = unlimited).
    max_total_tokens: total tokens (prompt + reply, from `usage`) allowed for the stage (0 = unlimited).
  """
  c = ml_collections.ConfigDict()
  c.base_url = ''
  c.model = ''
  c.api_key_env = 'OPENAI_API_KEY'
  c.max_concurrency = 8
  c.max_retries = 2
  c.retry_backoff_s = 0.5
  c.timeout_s = 60.0
  c.max_tokens = 64
  c.temperature = 0.0
  c.max_requests = 0
  c.max_total_tokens = 0
  return c


def image_part(image: np.ndarray) -> dict:
  """An OpenAI `image_url` content part holding uint8 [H, W, 3] RGB as a PNG data URL."""
  ok, png = cv2.imencode('.png', cv2.cvtColor(np.asarray(image, np.uint8), cv2.COLOR_RGB2BGR))
  if not ok:
    raise ValueError(f'could not encode an image of shape {np.shape(image)} as PNG')
  return {'type': 'image_url', 'image_url': {'url': 'data:image/png;base64,' + base64.b64encode(png).decode()}}


@dataclasses.dataclass
class Reply:
  """One chat answer: `text` (None after a failure), `error` (None, or the reason), `tokens` (usage total)."""
  text: str | None = None
  error: str | None = None
  tokens: int = 0


class EndpointDown(RuntimeError):
  """A stage's LLM endpoint did not answer some of its requests (`outages`); the stage is not saved."""


def outage_kind(kind: str) -> bool:
  """Whether a failed call's kind (`openai_client.ChatError.kind`) says the endpoint did not answer: 'connection',
  'timeout', or 'http_<status>' with status 401, 403, 404 (a wrong key or URL), 408, 429 or 5xx."""
  if kind in ('connection', 'timeout'):
    return True
  status = kind.removeprefix('http_')
  return status.isdigit() and (int(status) in (401, 403, 404, 408, 429) or int(status) >= 500)


def outages(counts: dict) -> dict[str, dict[str, int]]:
  """Endpoint -> {outage kind: failed calls} over every LLM step in a stage's `counts` (at any depth: a dict with
  'endpoint' and 'llm', the client's `stats()` with its 'error_kinds'); {} when every request was answered."""
  out = {}

  def visit(value):
    if not isinstance(value, dict):
      return
    llm_stats = value.get('llm')
    for kind, n in (llm_stats.get('error_kinds') or {}).items() if isinstance(llm_stats, dict) else ():
      if outage_kind(kind) and n:
        by_kind = out.setdefault(str(value.get('endpoint', '?')), {})
        by_kind[kind] = by_kind.get(kind, 0) + n
    for v in value.values():
      visit(v)

  visit(counts)
  return out


# The reason a spent budget gives (`Reply.error`), by the client's budget field.
_BUDGET_REASONS = {'max_requests': 'budget: requests', 'max_total_tokens': 'budget: tokens'}


def _has_text(text: str | None) -> str:
  """The reply text, or ValueError (an empty reply: retried by the client as a bad reply)."""
  if not text or not text.strip():
    raise ValueError('the reply has no text')
  return text


class AsyncChatClient:
  """The project's `openai_client.ChatClient` for the stages: `await chat(messages) -> Reply`, never raising.

  The interface the stages use (a test double implements the same): `await chat(messages) -> Reply`,
  `stats() -> dict`, `await aclose()`.
  """

  def __init__(self, config: ml_collections.ConfigDict):
    """Args: config: `default_config()` fields (base_url must be set).

    Raises:
      ValueError: an empty base_url or model, a limit out of range.
    """
    from osvl_jax import openai_client  # pylint: disable=import-outside-toplevel  # (imports `openai`)
    self.config = config
    self._lib = openai_client
    self.client = openai_client.ChatClient.from_config(config)

  def stats(self) -> dict:
    """{'requests', 'replies', 'errors', 'retries', 'tokens' (total), 'prompt_tokens', 'completion_tokens',
    'budget_refused', 'error_kinds'} of the client's life (`ChatClient.usage`)."""
    usage = self.client.usage()
    usage['tokens'] = usage.pop('total_tokens')
    return usage

  async def chat(self, messages: list[dict]) -> Reply:
    """One chat completion of `messages` (OpenAI format); the reply text, or the reason there is none."""
    try:
      reply = await self.client.acomplete(messages, parse=_has_text, max_tokens=int(self.config.max_tokens),
                                          temperature=float(self.config.temperature))
    except self._lib.BudgetExceeded as e:
      return Reply(error=_BUDGET_REASONS[e.budget])
    except self._lib.ChatError as e:
      return Reply(error=f'{e.kind}: {e.reason}'[:300])
    except Exception as e:  # pylint: disable=broad-except  # a stage records the reason, never crashes
      return Reply(error=f'bad_response: {type(e).__name__}: {e}'[:300])
    return Reply(text=reply.text, tokens=reply.total_tokens)

  async def aclose(self) -> None:
    """Closes the running event loop's connections."""
    await self.client.aclose()
