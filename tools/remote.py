"""Remote backends of the web tools: httpx clients with a timeout, bounded retries with backoff and typed errors.

Every client raises `base.ToolError(kind, message)` with kind
  timeout        the service did not answer within `timeout` seconds (after all retries);
  http_error     a non-2xx status (429 and 5xx are retried first; other 4xx are not);
  backend_error  a 2xx answer that is not the documented JSON (malformed, missing fields), a connection
                 failure, a URL that is not allowed (`check_public_url`), or a missing API key.
API keys come from environment variables only (named in the config, e.g. `SERPER_API_KEY`); they are sent in
headers and never appear in messages or logs (`_redact`).

Services and their documented request/response JSON (the test doubles in tests/tools/remote_doubles.py speak
the same):
  SerperClient   POST {base}/search, header `X-API-KEY`, body `{"q", "num", "hl"?}` ->
                 `{"organic": [{"title", "link", "snippet", "position"}], ...}`.
  JinaReader     GET {base}/{url}, header `Accept: application/json` (+ `Authorization: Bearer` if a key) ->
                 `{"code": 200, "data": {"title", "url", "content"}}`.
  ChatSummarizer POST {base}/chat/completions (OpenAI-compatible) `{"model", "messages", "max_tokens"}` ->
                 `{"choices": [{"message": {"content"}}]}`.
  LensClient     GET {base}/search.json?engine=google_lens&url=<image url>&api_key=<key> (SerpApi Google Lens)
                 -> `{"visual_matches": [{"position", "title", "link", "source"}], "knowledge_graph"?: [...]}`.
  PaddleOCRClient POST {base}/ocr `{"file": <base64 image>, "fileType": 1}` (PaddleX serving) ->
                 `{"errorCode": 0, "errorMsg": "Success", "result": {"ocrResults": [{"prunedResult":
                 {"rec_texts": [...], "rec_scores": [...], "rec_boxes": [[x0, y0, x1, y1], ...]}}]}}`.
"""

import base64
import ipaddress
import json
import os
import socket
import time
import urllib.parse

import cv2
import httpx
import numpy as np

from tools import base

RETRY_STATUS = frozenset({429, 500, 502, 503, 504})


def _redact(text: str, secrets: tuple[str, ...]) -> str:
  for s in secrets:
    if s:
      text = text.replace(s, '***')
  return text


def api_key(env_var: str, required: bool = True) -> str:
  """The key in environment variable `env_var` ('' when unset and not `required`).

  Raises:
    ToolError(backend_error): `required` and the variable is unset or empty (the message names the variable).
  """
  key = os.environ.get(env_var, '') if env_var else ''
  if required and not key:
    raise base.ToolError('backend_error', f'remote backend needs an API key in environment variable {env_var}')
  return key


def check_public_url(url: str, allow_private: bool = False) -> str:
  """Returns `url` when it is http(s) and its host resolves only to public addresses.

  Args:
    url: the URL to fetch.
    allow_private: also accept loopback / private / link-local hosts (tests with local doubles only).
  Raises:
    ToolError(bad_arguments): another scheme (file://, ftp://, ...), no host, a host that does not resolve, or
      one that resolves to a loopback, private, link-local, reserved or multicast address.
  """
  parts = urllib.parse.urlsplit(url)
  if parts.scheme not in ('http', 'https'):
    raise base.ToolError('bad_arguments', f'only http(s) URLs can be fetched, got scheme {parts.scheme or "none"!r}')
  host = parts.hostname
  if not host:
    raise base.ToolError('bad_arguments', f'URL {url[:80]!r} has no host')
  if allow_private:
    return url
  try:
    infos = socket.getaddrinfo(host, parts.port or (443 if parts.scheme == 'https' else 80), type=socket.SOCK_STREAM)
  except (socket.gaierror, UnicodeError) as e:
    raise base.ToolError('bad_arguments', f'host {host!r} does not resolve: {e}') from None
  for info in infos:
    addr = ipaddress.ip_address(info[4][0].split('%', 1)[0])
    if not addr.is_global or addr.is_multicast:
      raise base.ToolError('bad_arguments', f'host {host!r} resolves to non-public address {addr}; refused')
  return url


class HttpClient:
  """One service endpoint: timeout, bounded retries with exponential backoff, typed errors.

  Attributes:
    base_url: service root, e.g. `https://google.serper.dev`.
    timeout: seconds per attempt (connect + read).
    retries: extra attempts after the first for timeouts, connection errors, 429 and 5xx (so at most
      `retries + 1` attempts).
    backoff: seconds before the first retry; doubled each retry (a `Retry-After` header, capped at 10 s, wins).
    secrets: strings to redact from every error message (the API keys).
  """

  def __init__(self, base_url: str, timeout: float = 10.0, retries: int = 2, backoff: float = 0.5,
               secrets: tuple[str, ...] = (), transport: httpx.BaseTransport | None = None):
    self.base_url = base_url.rstrip('/')
    self.timeout, self.retries, self.backoff = float(timeout), int(retries), float(backoff)
    self.secrets = tuple(s for s in secrets if s)
    self._client = httpx.Client(timeout=self.timeout, transport=transport, follow_redirects=False)

  def request(self, method: str, path: str, *, json_body=None, params=None, headers=None,
              want_json: bool = True):
    """Sends one request (with retries) and returns the decoded JSON (or the text when `want_json` is False).

    Raises:
      ToolError: `timeout`, `http_error` or `backend_error` (see module docstring); messages are redacted.
    """
    url = f'{self.base_url}/{path.lstrip("/")}' if path else self.base_url
    delay, last = self.backoff, None
    for attempt in range(self.retries + 1):
      retry_after = None
      try:
        resp = self._client.request(method, url, json=json_body, params=params, headers=headers)
      except httpx.TimeoutException as e:
        last = base.ToolError('timeout', f'{self._where(url)} timed out after {self.timeout:g} s '
                                         f'({attempt + 1} attempt(s)): {type(e).__name__}')
      except httpx.HTTPError as e:
        last = base.ToolError('backend_error', _redact(f'{self._where(url)} connection failed: '
                                                       f'{type(e).__name__}: {e}', self.secrets))
      else:
        if resp.status_code >= 300:
          err = base.ToolError('http_error', _redact(f'{self._where(url)} returned HTTP {resp.status_code}: '
                                                     f'{resp.text[:200]}', self.secrets))
          if resp.status_code not in RETRY_STATUS:
            raise err
          last = err
          try:
            retry_after = min(10.0, float(resp.headers.get('retry-after', '')))
          except ValueError:
            retry_after = None
        elif not want_json:
          return resp.text
        else:
          try:
            return resp.json()
          except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as e:
            raise base.ToolError('backend_error', f'{self._where(url)} answered with malformed JSON: '
                                                  f'{e}') from None
      if attempt < self.retries:
        time.sleep(retry_after if retry_after is not None else delay)
        delay *= 2
    raise last

  def _where(self, url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return _redact(f'{parts.scheme}://{parts.netloc}{parts.path}', self.secrets)

  def close(self):
    self._client.close()


def _field(obj, *keys, kind=None, where=''):
  """obj[k0][k1]... with a `backend_error` naming the missing path (and type check against `kind`)."""
  cur = obj
  for k in keys:
    try:
      cur = cur[k]
    except (KeyError, IndexError, TypeError):
      raise base.ToolError('backend_error', f'{where} response lacks {"/".join(map(str, keys))}') from None
  if kind is not None and not isinstance(cur, kind):
    raise base.ToolError('backend_error', f'{where} response field {"/".join(map(str, keys))} is '
                                          f'{type(cur).__name__}, expected {kind.__name__}')
  return cur


def _client(cfg, key_secrets=()) -> HttpClient:
  return HttpClient(cfg.base_url, timeout=cfg.get('timeout', 10.0), retries=cfg.get('retries', 2),
                    backoff=cfg.get('backoff', 0.5), secrets=key_secrets)


class SerperClient:
  """Serper Google search. `search(q, num, hl) -> [{'title', 'link', 'snippet'}]` (empty list: no results)."""

  def __init__(self, cfg):
    self.key = api_key(cfg.api_key_env)
    self.http = _client(cfg, (self.key,))

  def search(self, q: str, num: int = 5, hl: str | None = None) -> list[dict]:
    body = {'q': q, 'num': int(num)}
    if hl:
      body['hl'] = hl
    data = self.http.request('POST', '/search', json_body=body, headers={'X-API-KEY': self.key})
    organic = data.get('organic', []) if isinstance(data, dict) else None
    if not isinstance(organic, list):
      raise base.ToolError('backend_error', 'serper response has no "organic" list')
    out = []
    for i, o in enumerate(organic[:num]):
      out.append({'title': str(_field(o, 'title', where='serper')), 'link': str(_field(o, 'link', where='serper')),
                  'snippet': str(o.get('snippet', '')) if isinstance(o, dict) else ''})
    return out


class JinaReader:
  """Jina reader: `read(url) -> (title, content)` of a public web page (markdown text)."""

  def __init__(self, cfg):
    self.key = api_key(cfg.get('api_key_env', ''), required=False)
    self.allow_private = bool(cfg.get('allow_private_urls', False))
    self.max_chars = int(cfg.get('max_chars', 4000))
    self.http = _client(cfg, (self.key,))

  def read(self, url: str) -> tuple[str, str]:
    check_public_url(url, self.allow_private)
    headers = {'Accept': 'application/json'}
    if self.key:
      headers['Authorization'] = f'Bearer {self.key}'
    data = self.http.request('GET', '/' + url, headers=headers)
    title = str(_field(data, 'data', 'title', where='jina') or '')
    content = _field(data, 'data', 'content', kind=str, where='jina')
    return title, content[:self.max_chars]


class ChatSummarizer:
  """An OpenAI-compatible chat endpoint that condenses a page to what matters for a query."""

  def __init__(self, cfg):
    self.key = api_key(cfg.get('api_key_env', ''), required=False)
    self.model = cfg.get('model', 'gpt-4o-mini')
    self.http = _client(cfg, (self.key,))

  def summarize(self, query: str, title: str, content: str, max_tokens: int = 200) -> str:
    headers = {'Authorization': f'Bearer {self.key}'} if self.key else {}
    body = {'model': self.model, 'max_tokens': max_tokens, 'messages': [
        {'role': 'system', 'content': 'Summarise the web page in at most 3 sentences, keeping only facts '
                                      'relevant to the query.'},
        {'role': 'user', 'content': f'Query: {query}\nPage: {title}\n\n{content}'}]}
    data = self.http.request('POST', '/chat/completions', json_body=body, headers=headers)
    return str(_field(data, 'choices', 0, 'message', 'content', kind=str, where='summarizer')).strip()


def web_search(cfg, query: str, top_k: int = 5, hl: str | None = None) -> str:
  """The remote text_search: Serper hits, each page read by Jina (first `cfg.read_top` hits) and optionally
  summarised by the LLM; returns `[k] Title (link): text` lines, or '' when Serper found nothing.

  A failed page read or summary degrades to the Serper snippet (the search itself succeeded); Serper failures
  raise ToolError.
  """
  hits = SerperClient(cfg.serper).search(query, top_k, hl)
  reader = JinaReader(cfg.jina) if cfg.get('read_top', 0) else None
  summarizer = ChatSummarizer(cfg.summarizer) if cfg.get('summarizer') and cfg.summarizer.get('base_url') else None
  lines = []
  for i, h in enumerate(hits, 1):
    text = h['snippet']
    if reader is not None and i <= cfg.read_top:
      try:
        title, content = reader.read(h['link'])
        text = summarizer.summarize(query, title or h['title'], content) if summarizer else content[:600]
      except base.ToolError as e:
        text = f'{h["snippet"]} (page not read: {e.kind})'
    lines.append(f'[{i}] {h["title"]} ({h["link"]}): {" ".join(text.split())}')
  return '\n'.join(lines)


class LensClient:
  """A Lens-style reverse image search (SerpApi `engine=google_lens`): `search(image_url) -> [matches]`."""

  def __init__(self, cfg):
    self.key = api_key(cfg.api_key_env)
    self.allow_private = bool(cfg.get('allow_private_urls', False))
    self.http = _client(cfg, (self.key,))

  def search(self, image_url: str, top_k: int = 5) -> list[dict]:
    check_public_url(image_url, self.allow_private)
    data = self.http.request('GET', '/search.json', params={'engine': 'google_lens', 'url': image_url,
                                                            'api_key': self.key})
    if not isinstance(data, dict):
      raise base.ToolError('backend_error', 'lens response is not a JSON object')
    if 'error' in data and 'visual_matches' not in data:
      raise base.ToolError('backend_error', _redact(f'lens error: {str(data["error"])[:200]}', (self.key,)))
    matches = data.get('visual_matches', [])
    if not isinstance(matches, list):
      raise base.ToolError('backend_error', 'lens response field visual_matches is not a list')
    return [{'title': str(_field(m, 'title', where='lens')), 'link': str(m.get('link', '')),
             'source': str(m.get('source', ''))} for m in matches[:top_k]]


def format_lens(matches: list[dict]) -> str:
  """`Visual matches:` then `[k] title (source, link)` lines."""
  return 'Visual matches:\n' + '\n'.join(f'[{i}] {m["title"]} ({m["source"]}, {m["link"]})'
                                         for i, m in enumerate(matches, 1))


class PaddleOCRClient:
  """PaddleX OCR serving (`/ocr`): `ocr(image) -> [(text, score, (x0, y0, x1, y1))]`."""

  def __init__(self, cfg):
    self.key = api_key(cfg.get('api_key_env', ''), required=False)
    self.http = _client(cfg, (self.key,))

  def ocr(self, image: np.ndarray) -> list[tuple[str, float, tuple[int, int, int, int]]]:
    ok, png = cv2.imencode('.png', np.ascontiguousarray(image[..., ::-1]))
    if not ok:
      raise base.ToolError('backend_error', 'could not encode the image as PNG')
    headers = {'Authorization': f'token {self.key}'} if self.key else {}
    data = self.http.request('POST', '/ocr', headers=headers,
                             json_body={'file': base64.b64encode(png.tobytes()).decode('ascii'), 'fileType': 1})
    if _field(data, 'errorCode', where='paddlex') != 0:
      raise base.ToolError('backend_error', f'paddlex error {data.get("errorCode")}: {str(data.get("errorMsg"))[:200]}')
    out = []
    for page in _field(data, 'result', 'ocrResults', kind=list, where='paddlex'):
      pruned = _field(page, 'prunedResult', kind=dict, where='paddlex')
      texts = _field(pruned, 'rec_texts', kind=list, where='paddlex')
      scores = pruned.get('rec_scores', [1.0] * len(texts))
      boxes = pruned.get('rec_boxes', [[0, 0, 0, 0]] * len(texts))
      if len(scores) != len(texts) or len(boxes) != len(texts):
        raise base.ToolError('backend_error', 'paddlex response: rec_texts, rec_scores, rec_boxes differ in length')
      for t, s, b in zip(texts, scores, boxes):
        out.append((str(t), float(s), tuple(int(v) for v in b)))
    return out
