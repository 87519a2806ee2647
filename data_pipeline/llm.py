"""An async OpenAI-compatible chat client for the LLM stages of the pipeline (DESIGN.md §7: "every LLM-using stage
talks to an OpenAI-compatible endpoint (`openai` client, base_url + model from config)").

`AsyncChatClient.chat(messages)` never raises: every failure (connection refused, timeout, HTTP status, an empty
reply, an exhausted budget) comes back as `Reply.error`, a short reason the stage records on the item. Limits:
  * concurrency: at most `max_concurrency` requests in flight (`asyncio.Semaphore`);
  * retries: a failed attempt (connection, timeout, 429 / 5xx, empty reply) is retried up to `max_retries`
    times after `retry_backoff_s * 2**k` seconds; other 4xx are not retried;
  * budgets: `max_requests` attempts and `max_total_tokens` tokens (the replies' `usage.total_tokens`) for the
    client's life (0 = unlimited); past either, requests are answered `budget: requests` / `budget: tokens`
    without being sent (the token budget is read before each attempt, so up to `max_concurrency - 1` requests
    already in flight can overshoot it; the request budget is exact).
`stats()` counts requests (attempts sent), replies, errors (by kind), retries, tokens and budget refusals.

Images go as `image_url` data URLs (PNG, base64) in the user message (`image_part`), the OpenAI vision format
that `osvl_jax.serve`, vLLM and SGLang accept.
"""

import asyncio
import base64
import dataclasses
import os

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
    retry_backoff_s: the sleep before retry k is retry_backoff_s * 2**k, seconds.
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


class AsyncChatClient:
  """`openai.AsyncOpenAI` behind a concurrency limit, retries and request / token budgets; never raises.

  The interface the stages use (a test double implements the same): `await chat(messages) -> Reply`,
  `stats() -> dict`, `await aclose()`.
  """

  def __init__(self, config: ml_collections.ConfigDict):
    """Args: config: `default_config()` fields (base_url must be set).

    Raises:
      ValueError: an empty base_url or model.
    """
    import openai  # pylint: disable=import-outside-toplevel
    if not config.base_url:
      raise ValueError('base_url is empty: no endpoint to call')
    if not config.model:
      raise ValueError(f'model is empty for the endpoint {config.base_url}')
    self.config = config
    self._openai = openai
    self._client = openai.AsyncOpenAI(base_url=config.base_url, api_key=os.environ.get(config.api_key_env) or
                                      'EMPTY', timeout=float(config.timeout_s), max_retries=0)
    self._semaphore = asyncio.Semaphore(int(config.max_concurrency))
    self._counts = {'requests': 0, 'replies': 0, 'errors': 0, 'retries': 0, 'tokens': 0, 'budget_refused': 0,
                    'error_kinds': {}}

  def stats(self) -> dict:
    return {k: (dict(v) if isinstance(v, dict) else v) for k, v in self._counts.items()}

  def _budget_left(self) -> str | None:
    c = self.config
    if c.max_requests and self._counts['requests'] >= c.max_requests:
      return 'budget: requests'
    if c.max_total_tokens and self._counts['tokens'] >= c.max_total_tokens:
      return 'budget: tokens'
    return None

  def _error(self, kind: str, text: str) -> Reply:
    self._counts['errors'] += 1
    self._counts['error_kinds'][kind] = self._counts['error_kinds'].get(kind, 0) + 1
    return Reply(error=f'{kind}: {text}'[:300])

  async def chat(self, messages: list[dict]) -> Reply:
    """One chat completion of `messages` (OpenAI format); the reply text, or the reason there is none."""
    async with self._semaphore:
      last = None
      for attempt in range(int(self.config.max_retries) + 1):
        refused = self._budget_left()
        if refused is not None:
          self._counts['budget_refused'] += 1
          return Reply(error=refused)
        if attempt:
          self._counts['retries'] += 1
          await asyncio.sleep(float(self.config.retry_backoff_s) * 2 ** (attempt - 1))
          refused = self._budget_left()  # another request may have spent the budget while this one slept
          if refused is not None:
            self._counts['budget_refused'] += 1
            return Reply(error=refused)
        self._counts['requests'] += 1
        try:
          resp = await self._client.chat.completions.create(
              model=self.config.model, messages=messages, max_tokens=int(self.config.max_tokens),
              temperature=float(self.config.temperature))
        except (self._openai.APIConnectionError, self._openai.APITimeoutError) as e:
          last = ('connection' if not isinstance(e, self._openai.APITimeoutError) else 'timeout', str(e))
          continue
        except self._openai.APIStatusError as e:
          last = (f'http_{e.status_code}', str(e))
          if e.status_code == 429 or e.status_code >= 500:
            continue
          break
        except Exception as e:  # pylint: disable=broad-except  # A malformed response body, ...
          last = ('bad_response', f'{type(e).__name__}: {e}')
          break
        tokens = int(getattr(resp.usage, 'total_tokens', 0) or 0) if resp.usage is not None else 0
        self._counts['tokens'] += tokens
        text = resp.choices[0].message.content if resp.choices else None
        if not text or not text.strip():
          last = ('empty_reply', 'the reply has no text')
          continue
        self._counts['replies'] += 1
        return Reply(text=text, tokens=tokens)
      return self._error(*last)

  async def aclose(self) -> None:
    await self._client.close()
