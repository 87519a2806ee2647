"""An `Engine` over SGLang's native HTTP API (DESIGN.md §6b): SGLang servers on GPUs, `python -m osvl_jax.serve`
(the same API over the embedded JAX sampler), or the `sglang-router` in front of either.

Token ids in, token ids and their log-probs out: never a chat template, so trajectories stay token-exact. The
agent loop cannot tell `SGLangEngine` from `jax_sampler.JaxSampler`.

The request (one `POST /generate` per context; fields of SGLang's `GenerateReqInput`, checked against SGLang
0.5.23's `io_struct.py` by `tests/serve/test_sglang_schema.py`):

  {"input_ids": [int, ...],                       the context, each image's pad run collapsed to ONE pad
   "image_data": ["data:image/png;base64,..."],   one per image, in order (omitted without images)
   "sampling_params": {"max_new_tokens", "temperature", "top_p", "stop" (strings, when any),
                       "stop_token_ids": [<|im_end|>, <|endoftext|>], "skip_special_tokens": false,
                       "no_stop_trim": true},
   "return_logprob": true}

Images. SGLang's `image_data` takes, per image, a URL, a file path, raw bytes or a base64 string / data URL
(`sglang.srt.utils.load_image`); the client sends the image's ORIGINAL pixels (`ImageRef.pixels`) as a lossless
PNG data URL. SGLang's multimodal processor resizes them itself, with the folder's `preprocessor_config.json`
(which `export_hf` writes with the training pixel budget), so its grid equals the trajectory's. For pre-tokenized
prompts SGLang 0.5.23 expects ONE `<|image_pad|>` placeholder per image inside `<|vision_start|>...<|vision_end|>`
and expands the i-th placeholder into that image's feature count itself (`BaseMultimodalProcessor.
_expand_input_ids`; without `SGLANG_MM_AVOID_RETOKENIZE` the ids are decoded and the HF processor expands the
placeholders the same way). The trajectory's context holds the expanded run (`ImageRef.num_tokens` pads), so the
client collapses each run to one pad (checking its length against the image) before sending. `osvl_jax.serve`
accepts both forms.

The response: `output_ids` (the emitted ids, including the stop id when one matched) and `meta_info` with
`output_token_logprobs` = [[logprob, token_id, text|null], ...] (one per emitted id), `finish_reason` =
{"type": "stop", "matched": <id | string>} | {"type": "length", "length": n} | {"type": "abort", ...},
`weight_version` and, when an update landed mid-request, `weight_versions` = [{version, start, end}, ...].

Failures: a refused connection, a timeout, a dropped connection or an HTTP 5xx / 429 is retried with exponential
backoff (on the next URL of the list), then raised as `EngineError`; a 4xx is raised at once (the request is
wrong; retrying cannot help). The agent loop records an `EngineError` on the trajectory (never a tool error).
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import dataclasses
import io
import itertools
import threading
from collections.abc import Awaitable, Callable
from typing import Any, Sequence

import httpx
import numpy as np

from osvl_jax.rollout import engine as engine_lib
from osvl_jax.rollout import server_auth
from osvl_jax.trajectory import tokens as tokens_lib

IMAGE_PAD_ID = tokens_lib.IMAGE_PAD_ID
RETRY_STATUS = (429, 500, 502, 503, 504)

# EngineError.kind values.
ERROR_CONNECTION = 'connection'   # refused / reset / dropped connection
ERROR_TIMEOUT = 'timeout'         # connect, read or write timeout
ERROR_HTTP = 'http_status'        # a non-2xx answer (after retries for 5xx / 429)
ERROR_RESPONSE = 'bad_response'   # a 2xx answer this client cannot read (missing fields, lengths differ)
ERROR_ABORT = 'abort'             # the server aborted the request (finish_reason type 'abort')
ERROR_KINDS = (ERROR_CONNECTION, ERROR_TIMEOUT, ERROR_HTTP, ERROR_RESPONSE, ERROR_ABORT)


class EngineError(RuntimeError):
  """A generation or admin call that failed after its retries.

  Attributes:
    kind: one of `ERROR_KINDS`.
    url: the last URL tried.
    status: the HTTP status of the last answer, or None (no answer).
    attempts: how many requests were sent.
  """

  def __init__(self, kind: str, message: str, url: str = '', status: int | None = None, attempts: int = 1):
    super().__init__(f'{kind}: {message} (url={url}, status={status}, attempts={attempts})')
    self.kind, self.url, self.status, self.attempts = kind, url, status, attempts


@dataclasses.dataclass
class SGLangGeneration(engine_lib.Generation):
  """A `Generation` (with `weight_version` / `weight_versions` from `meta_info`) and the rest of what the server
  reported.

  Attributes:
    meta_info: the whole `meta_info` of the answer, minus the per-token log-prob lists.
  """
  meta_info: dict | None = None


def image_data_url(image: Any) -> str:
  """`data:image/png;base64,...` of an `ImageRef`'s original pixels (or of a uint8 [H, W, 3] array)."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  pixels = np.asarray(getattr(image, 'pixels', image))
  if pixels.dtype != np.uint8 or pixels.ndim != 3 or pixels.shape[-1] != 3:
    raise ValueError(f'an image must be an ImageRef or uint8 [H, W, 3], got {pixels.dtype} {pixels.shape}')
  buf = io.BytesIO()
  Image.fromarray(pixels).save(buf, format='PNG', compress_level=1)
  return 'data:image/png;base64,' + base64.b64encode(buf.getvalue()).decode('ascii')


def collapse_image_pads(prompt_ids: np.ndarray, images: Sequence[Any]) -> list[int]:
  """The context with each image's `<|image_pad|>` run replaced by one pad (SGLang expands it again).

  Args:
    prompt_ids: int [T], the context, with `ImageRef.num_tokens` consecutive pads per image.
    images: the context's images in order (`ImageRef`s; raw arrays are accepted unchecked).
  Returns:
    The ids as a list of ints, one pad per image.
  Raises:
    ValueError: the number of pad runs differs from the number of images, or a run's length differs from its
      image's `num_tokens`.
  """
  ids = [int(i) for i in np.asarray(prompt_ids).reshape(-1)]
  out, k, i = [], 0, 0
  while i < len(ids):
    if ids[i] != IMAGE_PAD_ID:
      out.append(ids[i])
      i += 1
      continue
    j = i
    while j < len(ids) and ids[j] == IMAGE_PAD_ID:
      j += 1
    if k >= len(images):
      raise ValueError(f'context has more <|image_pad|> runs than its {len(images)} image(s)')
    want = getattr(images[k], 'num_tokens', None)
    if want is not None and j - i != want:
      raise ValueError(f'image {k + 1}: a run of {j - i} <|image_pad|> but the image needs {want}')
    out.append(IMAGE_PAD_ID)
    k, i = k + 1, j
  if k != len(images):
    raise ValueError(f'context has {k} <|image_pad|> run(s) but {len(images)} image(s)')
  return out


def _finish_reason(meta: dict, url: str) -> str:
  reason = meta.get('finish_reason')
  kind = reason.get('type') if isinstance(reason, dict) else reason
  if kind == 'stop':
    matched = reason.get('matched') if isinstance(reason, dict) else None
    return engine_lib.FINISH_STOP_STRING if isinstance(matched, str) else engine_lib.FINISH_STOP
  if kind == 'length':
    return engine_lib.FINISH_LENGTH
  if kind == 'abort':
    raise EngineError(ERROR_ABORT, f'request aborted by the server: {reason}', url)
  raise EngineError(ERROR_RESPONSE, f'unknown finish_reason {reason!r}', url)


class SGLangEngine(engine_lib.Engine):
  """`Engine` over SGLang's native `/generate` at one URL (a server or a router) or a list (round-robin).

  Each context is one request; the B requests of a `generate` / `agenerate` call are in flight together (up to
  `concurrency` connections), so the server batches them (`continuous_batching`: the agent loop sends each
  episode's turn as soon as it is ready). All HTTP is async (`httpx.AsyncClient`, one per event loop); the
  synchronous methods run their async twin on a fresh loop. Thread-safe.

  Log-probabilities are what the server returns. SGLang 0.5.23 (`layers/sampler.py`) returns, for sampled
  requests, log-probs of the temperature-scaled distribution (top-p not applied), and temperature-1 log-probs
  for greedy batches or when the server runs with `SGLANG_RETURN_ORIGINAL_LOGPROB=1` (set it on the GPU servers
  so that rollout log-probs are comparable to the trainer's); `osvl_jax.serve` always returns temperature-1
  log-probs, like `JaxSampler`. At temperature 1 (GRPO rollouts) all agree.
  """
  continuous_batching = True

  def __init__(self, urls: str | Sequence[str], tokenizer=None, max_new_tokens: int = 512,
               temperature: float = 1.0, top_p: float = 1.0, stop: Sequence[str] = (),
               stop_token_ids: Sequence[int] = engine_lib.EOS_IDS, timeout: float = 600.0, retries: int = 4,
               backoff: float = 0.5, max_backoff: float = 8.0, concurrency: int = 256,
               admin_urls: Sequence[str] | None = None, transport: httpx.AsyncBaseTransport | None = None,
               api_key: str | None = None):
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
      transport: httpx async transport (tests: `httpx.MockTransport`).
      api_key: sent as `Authorization: Bearer <key>` on every request (servers run with SGLang's `--api-key` /
        `osvl_jax.serve --api_key`; a router with `--api-key`); None: `$OSVL_API_KEY`, else `$SGLANG_API_KEY`
        (`server_auth.api_key_from_env`), else no header. Never logged nor kept in a public attribute.
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
    if not (temperature >= 0 and np.isfinite(temperature)):
      raise ValueError(f'temperature must be a finite number >= 0, got {temperature}')
    if not 0 < top_p <= 1:
      raise ValueError(f'top_p must be in (0, 1], got {top_p}')
    if retries < 0 or backoff < 0 or concurrency < 1:
      raise ValueError(f'retries={retries}, backoff={backoff}, concurrency={concurrency}: out of range')
    self.max_new_tokens, self.temperature, self.top_p = int(max_new_tokens), float(temperature), float(top_p)
    self.stop = tuple(stop)
    self.stop_token_ids = tuple(int(i) for i in stop_token_ids)
    self.retries, self.backoff, self.max_backoff = int(retries), float(backoff), float(max_backoff)
    self.concurrency = int(concurrency)
    api_key = api_key if api_key is not None else server_auth.api_key_from_env()
    self._client_args = {'timeout': timeout, 'transport': transport,
                         'headers': {'Authorization': f'Bearer {api_key}'} if api_key else None,
                         'limits': httpx.Limits(max_connections=concurrency, max_keepalive_connections=64)}
    self._clients: dict[asyncio.AbstractEventLoop, httpx.AsyncClient] = {}  # one per running event loop
    self._cycle = itertools.cycle(range(len(self.urls)))
    self._lock = threading.Lock()
    self.stats = {'requests': 0, 'retries': 0, 'errors': 0}

  # -- HTTP ----------------------------------------------------------------------------------------------------
  def _client(self) -> httpx.AsyncClient:
    """The async HTTP client of the running event loop (created on first use; connections are per loop)."""
    loop = asyncio.get_running_loop()
    with self._lock:
      if loop not in self._clients:
        self._clients[loop] = httpx.AsyncClient(**self._client_args)
      return self._clients[loop]

  async def aclose(self) -> None:
    """Closes the HTTP client of the running event loop (`Engine.aclose`); a later call opens a new one."""
    with self._lock:
      client = self._clients.pop(asyncio.get_running_loop(), None)
    if client is not None:
      await client.aclose()

  def _sync(self, coroutine_fn: Callable[[], Awaitable[Any]]) -> Any:
    """Runs `coroutine_fn()` on a fresh event loop (in a worker thread when this thread runs one) and closes that
    loop's client: the synchronous methods are thin wrappers of the async ones."""
    async def main():
      try:
        return await coroutine_fn()
      finally:
        await self.aclose()
    try:
      asyncio.get_running_loop()
    except RuntimeError:
      return asyncio.run(main())
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
      return pool.submit(asyncio.run, main()).result()

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
      kind, message, status = None, '', None
      try:
        resp = await self._client().request(method, target + path, json=json, params=params)
        if resp.status_code < 400:
          return resp
        status, message = resp.status_code, resp.text[:500]
        kind = ERROR_HTTP
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
      await asyncio.sleep(min(self.backoff * 2 ** (attempts - 1), self.max_backoff))
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
                   stop: Sequence[str] | None = None) -> dict:
    """The `/generate` JSON body of one context (the module docstring lists its fields).

    Raises:
      ValueError: the context's pad runs do not match its images (`collapse_image_pads`).
    """
    context = engine_lib.as_context(context)
    stop = self.stop if stop is None else tuple(stop)
    sampling = {'max_new_tokens': int(self.max_new_tokens if max_new_tokens is None else max_new_tokens),
                'temperature': self.temperature, 'top_p': self.top_p,
                'stop_token_ids': list(self.stop_token_ids), 'skip_special_tokens': False, 'no_stop_trim': True}
    if stop:
      sampling['stop'] = list(stop)
    body = {'input_ids': collapse_image_pads(context.prompt_ids, context.images),
            'sampling_params': sampling, 'return_logprob': True}
    if context.images:
      body['image_data'] = [image_data_url(im) for im in context.images]
    return body

  def parse_response(self, out: dict, url: str = '') -> SGLangGeneration:
    """A `/generate` answer -> `SGLangGeneration` (ids, log-probs, finish reason, weight version).

    Raises:
      EngineError: kind 'bad_response' for an answer without ids / log-probs or whose lengths differ; 'abort'
        for an aborted request.
    """
    meta = out.get('meta_info') if isinstance(out, dict) else None
    if not isinstance(meta, dict):
      raise EngineError(ERROR_RESPONSE, f'no meta_info in {str(out)[:200]}', url)
    token_lps = meta.get('output_token_logprobs')
    if token_lps is None:
      raise EngineError(ERROR_RESPONSE, 'no output_token_logprobs in meta_info (return_logprob ignored?)', url)
    try:
      lp_ids = [int(entry[1]) for entry in token_lps]
      logprobs = np.asarray([float(entry[0]) for entry in token_lps], np.float32)
    except (TypeError, ValueError, IndexError) as e:
      raise EngineError(ERROR_RESPONSE, f'unreadable output_token_logprobs: {e}', url) from e
    ids = out.get('output_ids')
    ids = lp_ids if ids is None else [int(i) for i in ids]
    if ids != lp_ids:
      raise EngineError(ERROR_RESPONSE, f'output_ids ({len(ids)}) and output_token_logprobs ({len(lp_ids)}) '
                        'disagree', url)
    reason = _finish_reason(meta, url)
    rest = {k: v for k, v in meta.items() if not k.endswith('token_logprobs')}
    return SGLangGeneration(ids=np.asarray(ids, np.int32), logprobs=logprobs,
                            text=engine_lib.decode_text(self.tokenizer, ids), finish_reason=reason,
                            weight_version=None if meta.get('weight_version') is None
                            else str(meta['weight_version']),
                            weight_versions=meta.get('weight_versions'), meta_info=rest)

  async def _generate_one(self, body: dict) -> SGLangGeneration:
    resp = await self._request('POST', '/generate', json=body)
    return self.parse_response(self._json(resp), str(resp.url))

  async def agenerate(self, contexts, max_new_tokens=None, stop=None):
    """Samples one assistant turn per context (`engine.Engine.generate`): one HTTP request each, all in flight
    together (at most `concurrency` connections), on the running event loop.

    Returns:
      B `SGLangGeneration`s in the order of `contexts`.
    Raises:
      ValueError: a context whose pad runs do not match its images.
      EngineError: a request that failed after its retries (the other rows' results are dropped; the agent loop
        asks one context per call, so there a failure stays with its own trajectory).
    """
    bodies = [self.request_body(c, max_new_tokens, stop) for c in contexts]
    return list(await asyncio.gather(*(self._generate_one(b) for b in bodies)))

  def generate(self, contexts, max_new_tokens=None, stop=None):
    """`agenerate` on a fresh event loop (same result and errors)."""
    return self._sync(lambda: self.agenerate(contexts, max_new_tokens, stop))

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
