"""An `Engine` over SGLang's native HTTP API (DESIGN.md §6b): SGLang servers on GPUs, `python -m osvl_jax.serve`
(the same API over the embedded JAX sampler), or the `sglang-router` in front of either.

Token ids in, token ids and their log-probs out: never a chat template, so trajectories stay token-exact. The
agent loop cannot tell `SGLangEngine` from `jax_sampler.JaxSampler`.

One `POST /generate` per context; the request and response fields, and how SGLang 0.5.23 keeps them exact, are in
`sglang_protocol` (`EngineError`, its kinds and the wire format): `input_ids` with one `<|image_pad|>` per image (SGLang
expands it; `SGLANG_MM_AVOID_RETOKENIZE` keeps the other ids verbatim), each image's PNG data URL encoded once
per `ImageRef`, the vision ids banned from sampling by `sampling_params.logit_bias` (native in 0.5.23, no server
flag; not `custom_logit_processor`, which needs `--enable-custom-logit-processor`), and every answer's
`meta_info.prompt_tokens` checked against the context's length.

Failures: a refused connection, a timeout, a dropped connection or an HTTP 5xx / 429 is retried with exponential
backoff, or after the answer's `Retry-After` when longer (`openai_client.retry_after_seconds`), on the next URL of
the list, then raised as `EngineError`; a 4xx is raised at once (the request is
wrong; retrying cannot help); an answer whose `prompt_tokens` differs from the context is an `EngineError` of kind
'prompt_mismatch'. The agent loop records an `EngineError` on the trajectory (never a tool error).
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Awaitable, Callable
from typing import Any, Sequence

import httpx
import numpy as np

from osvl_jax import openai_client
from osvl_jax.rollout import engine as engine_lib
from osvl_jax.rollout.api_key import api_key_from_env
from osvl_jax.rollout.remote import sglang_protocol as protocol
from osvl_jax.rollout.remote.sglang_protocol import (
    ERROR_CONNECTION, ERROR_HTTP, ERROR_RESPONSE, ERROR_TIMEOUT, VISION_LOGIT_BIAS, DataURLCache, EngineError,
    SGLangGeneration, collapse_image_pads)

RETRY_STATUS = (429, 500, 502, 503, 504)


class SGLangEngine(engine_lib.Engine):
  """`Engine` over SGLang's native `/generate` at one URL (a server or a router) or a list (round-robin).

  Each context is one request; the B requests of a `generate` / `agenerate` call are in flight together (up to
  `concurrency` connections), so the server batches them (`continuous_batching`: the agent loop sends each
  episode's turn as soon as it is ready). All HTTP is async (`httpx.AsyncClient`, one per event loop); the
  synchronous methods run their async twin on a fresh loop. Thread-safe.

  Log-probabilities are what the server returns. SGLang 0.5.23 (`layers/sampler.py`) returns, for sampled
  requests, log-probs of the temperature-scaled distribution (top-p not applied), and temperature-1 log-probs
  for greedy batches; `SGLANG_RETURN_ORIGINAL_LOGPROB=1` would make them temperature-1 always
  (`tpu_scripts/sglang_server.sh` sets it to 0). `osvl_jax.serve` and `JaxSampler` report the same tempered
  quantity, and the trainer recomputes it at `grpo.temperature` (`policy.loss_logprobs`). SGLang adds the vision-id
  `logit_bias` before computing them, so its log-probs are normalised over the other ids (the trainer's and
  `JaxSampler`'s are not: they differ by log(1 - p(vision ids)), ~0 for a trained policy).
  """
  continuous_batching = True
  weight_updates = 'disk'

  def __init__(self, urls: str | Sequence[str], tokenizer=None, max_new_tokens: int = 512,
               temperature: float = 1.0, top_p: float = 1.0, stop: Sequence[str] = (),
               stop_token_ids: Sequence[int] = engine_lib.EOS_IDS, timeout: float = 600.0, retries: int = 4,
               backoff: float = 0.5, max_backoff: float = 8.0, concurrency: int = 256,
               admin_urls: Sequence[str] | None = None, ban_vision_ids: bool = True,
               transport: httpx.AsyncBaseTransport | None = None, api_key: str | None = None):
    """Args:
      urls: base URL (`http://host:port`) of a server or router, or a list of them (requests round-robin).
      tokenizer: the Qwen tokenizer for `Generation.text` (None: `trajectory.load_tokenizer()`).
      max_new_tokens: default cap on emitted ids per row (>= 1).
      temperature: sampling temperature (>= 0; 0 = greedy).
      top_p: nucleus mass in (0, 1].
      stop: default stop strings.
      stop_token_ids: ids that end a turn (Qwen's two end-of-sequence ids).
      timeout: seconds per HTTP request (connect, read, write).
      retries: extra attempts after the first for retryable failures.
      backoff: seconds before the first retry; doubled each retry, capped at `max_backoff`.
      max_backoff: cap of the backoff, seconds.
      concurrency: HTTP connections per event loop: requests in flight at once (more wait for a connection).
      admin_urls: the servers that admin calls (`update_weights_from_disk`, `flush_cache`) go to (default:
        `urls`; behind a router pass the workers' URLs here).
      ban_vision_ids: send `sampling_params.logit_bias` = `VISION_LOGIT_BIAS`, so that the server never samples a
        vision id (SGLang needs it; `JaxSampler` bans them itself). False only for a server that refuses
        `logit_bias`: the agent loop then still makes a turn holding a vision id a malformed step.
      transport: httpx async transport (tests: `httpx.MockTransport`).
      api_key: sent as `Authorization: Bearer <key>` on every request (servers run with SGLang's `--api-key` /
        `osvl_jax.serve --api_key`; a router with `--api-key`); None: `$OSVL_API_KEY`, else `$SGLANG_API_KEY`
        (`api_key.api_key_from_env`), else no header. Never logged nor kept in a public attribute.
    Raises:
      ValueError: an empty URL list or a parameter out of range.
    """
    self.urls = [urls] if isinstance(urls, str) else list(urls)
    if not self.urls:
      raise ValueError('urls must name at least one server')
    self.urls = [u.rstrip('/') for u in self.urls]
    self.admin_urls = [u.rstrip('/') for u in (admin_urls or self.urls)]
    if tokenizer is None:
      from osvl_jax import trajectory  # pylint: disable=g-import-not-at-top
      tokenizer = trajectory.load_tokenizer()
    self.tokenizer = tokenizer
    if max_new_tokens < 1:
      raise ValueError(f'max_new_tokens must be >= 1, got {max_new_tokens}')
    engine_lib.Sampling(temperature, top_p).checked()  # ValueError naming an out-of-range setting
    if retries < 0 or backoff < 0 or concurrency < 1:
      raise ValueError(f'retries={retries}, backoff={backoff}, concurrency={concurrency}: out of range')
    self.max_new_tokens, self.temperature, self.top_p = int(max_new_tokens), float(temperature), float(top_p)
    self.stop = tuple(stop)
    self.stop_token_ids = tuple(int(i) for i in stop_token_ids)
    self.retries, self.backoff, self.max_backoff = int(retries), float(backoff), float(max_backoff)
    self.concurrency = int(concurrency)
    api_key = api_key if api_key is not None else api_key_from_env()
    self._client_args = {'timeout': timeout, 'transport': transport,
                         'headers': {'Authorization': f'Bearer {api_key}'} if api_key else None,
                         'limits': httpx.Limits(max_connections=concurrency, max_keepalive_connections=64)}
    self._clients: dict[asyncio.AbstractEventLoop, httpx.AsyncClient] = {}  # one per running event loop
    self._cycle = itertools.cycle(range(len(self.urls)))
    self._lock = threading.Lock()
    self.stats = {'requests': 0, 'retries': 0, 'errors': 0}
    self.ban_vision_ids = bool(ban_vision_ids)
    self.image_urls = DataURLCache()  # each live ImageRef's data URL, encoded once

  # -- HTTP ----------------------------------------------------------------------------------------------------
  def _client(self) -> httpx.AsyncClient:
    """The async HTTP client of the running event loop (created on first use; connections are per loop)."""
    loop = asyncio.get_running_loop()
    with self._lock:
      if loop not in self._clients:
        self._clients[loop] = httpx.AsyncClient(**self._client_args)
      return self._clients[loop]

  def usage(self) -> dict:
    """`Engine.usage`: {'requests' (sent, retries included), 'retries', 'errors' (calls failed after their
    retries)}."""
    with self._lock:
      return dict(self.stats)

  async def aclose(self) -> None:
    """Closes the HTTP client of the running event loop (`Engine.aclose`); a later call opens a new one."""
    with self._lock:
      client = self._clients.pop(asyncio.get_running_loop(), None)
    if client is not None:
      await client.aclose()

  def _sync(self, coroutine_fn: Callable[[], Awaitable[Any]]) -> Any:
    """`coroutine_fn()` run synchronously (`engine.run_sync`), this loop's client closed after it: the synchronous
    methods are thin wrappers of the async ones."""
    return engine_lib.run_sync(coroutine_fn, self.aclose)

  def _next_url(self) -> str:
    with self._lock:
      return self.urls[next(self._cycle)]

  async def _request(self, method: str, path: str, url: str | None = None, json: Any = None,
                     params: dict | None = None) -> httpx.Response:
    """One call with retries; `url` None = the next of the round-robin, each retry the URL after the failed one.

    Raises:
      EngineError: after the retries (refused / dropped connection, timeout, 5xx, 429), or at once for another
        non-2xx answer.
    """
    attempts, last_url = 0, ''
    while True:
      if url:
        target = url
      elif last_url:  # fail over: the URL after the one that failed (not the shared round-robin's next)
        target = self.urls[(self.urls.index(last_url) + 1) % len(self.urls)]
      else:
        target = self._next_url()
      last_url = target
      attempts += 1
      with self._lock:
        self.stats['requests'] += 1
      kind, message, status, wait = None, '', None, None
      try:
        resp = await self._client().request(method, target + path, json=json, params=params)
        if resp.status_code < 400:
          return resp
        status, message = resp.status_code, resp.text[:500]
        kind, wait = ERROR_HTTP, openai_client.retry_after_seconds(resp.headers)
        if status not in RETRY_STATUS:
          break
      except httpx.TimeoutException as e:
        kind, message = ERROR_TIMEOUT, repr(e)
      except (httpx.TransportError, httpx.RemoteProtocolError) as e:
        kind, message = ERROR_CONNECTION, repr(e)
      if attempts > self.retries:
        break
      with self._lock:
        self.stats['retries'] += 1
      await asyncio.sleep(max(min(self.backoff * 2 ** (attempts - 1), self.max_backoff), wait or 0.0))
    with self._lock:
      self.stats['errors'] += 1
    raise EngineError(kind, f'{method} {path}: {message}', last_url, status, attempts)

  def _json(self, resp: httpx.Response) -> Any:
    try:
      return resp.json()
    except ValueError as e:
      raise EngineError(ERROR_RESPONSE, f'not JSON: {resp.text[:200]!r}', str(resp.url), resp.status_code) from e

  # -- generation ----------------------------------------------------------------------------------------------
  def request_body(self, context: engine_lib.Context | tuple, max_new_tokens: int | None = None,
                   stop: Sequence[str] | None = None, sampling: engine_lib.Sampling | None = None) -> dict:
    """The `/generate` JSON body of one context (`sglang_protocol`'s docstring lists its fields): the vision ids
    banned by `sampling_params.logit_bias` unless `ban_vision_ids=False`; each `ImageRef`'s data URL from
    `self.image_urls` (encoded on its first request only).

    Raises:
      ValueError: the context's pad runs do not match its images (`collapse_image_pads`), or an image that is not
        uint8 [H, W, 3]; a `sampling` out of range.
    """
    context = engine_lib.as_context(context)
    stop = self.stop if stop is None else tuple(stop)
    temperature, top_p = (engine_lib.Sampling(self.temperature, self.top_p) if sampling is None
                          else engine_lib.Sampling(*sampling).checked())
    sampling = {'max_new_tokens': int(self.max_new_tokens if max_new_tokens is None else max_new_tokens),
                'temperature': temperature, 'top_p': top_p,
                'stop_token_ids': list(self.stop_token_ids), 'skip_special_tokens': False, 'no_stop_trim': True}
    if stop:
      sampling['stop'] = list(stop)
    if self.ban_vision_ids:
      sampling['logit_bias'] = dict(VISION_LOGIT_BIAS)
    body = {'input_ids': collapse_image_pads(context.prompt_ids, context.images),
            'sampling_params': sampling, 'return_logprob': True}
    if context.images:
      body['image_data'] = [self.image_urls.url(im) for im in context.images]
    return body

  def parse_response(self, out: dict, url: str = '', prompt_len: int | None = None,
                     sent_len: int | None = None) -> SGLangGeneration:
    """A `/generate` answer -> `SGLangGeneration` (ids, log-probs, finish reason, weight version).

    Args:
      out: the decoded JSON answer.
      url: the server, for errors.
      prompt_len: the context's length (pads expanded); when given, `meta_info.prompt_tokens` must equal it.
      sent_len: the number of `input_ids` sent (default `prompt_len`), for the mismatch message.
    Raises:
      EngineError: kind 'bad_response' for an answer without ids / log-probs or whose lengths differ (or without
        `prompt_tokens` when `prompt_len` is given); 'abort' for an aborted request; 'prompt_mismatch' naming
        both counts when the server ran a prompt of another length.
    """
    gen = protocol.parse_generate_response(out, self.tokenizer, url)
    if prompt_len is not None:
      protocol.check_prompt_tokens(gen.meta_info, prompt_len, prompt_len if sent_len is None else sent_len, url)
    return gen

  async def _generate_one(self, body: dict, prompt_len: int) -> SGLangGeneration:
    resp = await self._request('POST', '/generate', json=body)
    return self.parse_response(self._json(resp), str(resp.url), prompt_len, len(body['input_ids']))

  async def agenerate(self, contexts, max_new_tokens=None, stop=None, sampling=None):
    """Samples one assistant turn per context (`engine.Engine.generate`): one HTTP request each, all in flight
    together (at most `concurrency` connections), on the running event loop.

    Returns:
      B `SGLangGeneration`s in the order of `contexts`.
    Raises:
      ValueError: a context whose pad runs do not match its images.
      EngineError: a request that failed after its retries, or an answer that cannot be trusted (e.g. kind
        'prompt_mismatch': `meta_info.prompt_tokens` differs from the context's length). The other rows' results
        are dropped; the agent loop asks one context per call, so there a failure stays with its own trajectory.
    """
    contexts = [engine_lib.as_context(c) for c in contexts]
    bodies = [self.request_body(c, max_new_tokens, stop, sampling) for c in contexts]
    return list(await asyncio.gather(*(self._generate_one(b, int(np.asarray(c.prompt_ids).size))
                                       for b, c in zip(bodies, contexts))))

  def generate(self, contexts, max_new_tokens=None, stop=None, sampling=None):
    """`agenerate` on a fresh event loop (same result and errors)."""
    return self._sync(lambda: self.agenerate(contexts, max_new_tokens, stop, sampling))

  # -- admin ---------------------------------------------------------------------------------------------------
  def _get_with_fallback(self, path: str, deprecated: str, url: str | None) -> dict:
    url = (url or self.admin_urls[0]).rstrip('/')

    async def get():
      try:
        return self._json(await self._request('GET', path, url=url))
      except EngineError as e:
        if e.status != 404:
          raise
      return self._json(await self._request('GET', deprecated, url=url))
    return self._sync(get)

  def model_info(self, url: str | None = None) -> dict:
    """`GET /model_info` (falls back to the deprecated `/get_model_info` on a 404)."""
    return self._get_with_fallback('/model_info', '/get_model_info', url)

  def served_model(self) -> dict:
    """What each server says it serves: {url: its `/model_info` answer (model path, weight version, ...), or None
    for a server without one (404)} (the eval fingerprint's identity of a served policy).

    Raises:
      EngineError: a server that cannot be reached (after the retries) or answers another error.
    """
    out = {}
    for url in self.urls:
      try:
        out[url] = self.model_info(url)
      except EngineError as e:
        if e.status != 404:
          raise
        out[url] = None
    return out

  def server_info(self, url: str | None = None) -> dict:
    """`GET /server_info` (falls back to the deprecated `/get_server_info` on a 404)."""
    return self._get_with_fallback('/server_info', '/get_server_info', url)

  def health(self, url: str | None = None) -> bool:
    """True when `GET /health` answers 200 (one attempt, no retries)."""
    async def get():
      try:
        return (await self._client().get((url or self.urls[0]).rstrip('/') + '/health')).status_code == 200
      except httpx.HTTPError:
        return False
    return self._sync(get)

  def flush_cache(self) -> None:
    """`POST /flush_cache` on every admin URL."""
    async def flush():
      for url in self.admin_urls:
        await self._request('POST', '/flush_cache', url=url)
    self._sync(flush)

  def update_weights_from_disk(self, model_path: str, weight_version: str | None = None,
                               **fields: Any) -> list[dict]:
    """`POST /update_weights_from_disk` on every admin URL (SGLang's `UpdateWeightFromDiskReqInput`).

    Args:
      model_path: the new weights (an HF folder for SGLang; `osvl_jax.serve` also takes an orbax checkpoint).
      weight_version: the version the servers report from now on (None: the server's choice).
      **fields: other `UpdateWeightFromDiskReqInput` fields (e.g. `flush_cache`, `abort_all_requests`).
    Returns:
      Each server's answer `{success, message, num_paused_requests}`.
    Raises:
      EngineError: a server that failed or answered `success: false` (kind 'http_status').
    """
    body = {'model_path': str(model_path), **fields}
    if weight_version is not None:
      body['weight_version'] = str(weight_version)

    async def update():
      answers = []
      for url in self.admin_urls:
        out = self._json(await self._request('POST', '/update_weights_from_disk', url=url, json=body))
        if not out.get('success', False):
          raise EngineError(ERROR_HTTP, f'update_weights_from_disk failed: {out.get("message")}', url, 200)
        answers.append(out)
      return answers
    return self._sync(update)
