"""Remote backends of the web tools: httpx clients with a timeout, bounded retries with backoff and typed errors.

Every client raises `base.ToolError(kind, message)` with kind
  timeout        the service did not answer within `timeout` seconds (after all retries);
  http_error     a non-2xx status (429 and 5xx are retried first; other 4xx are not);
  backend_error  a 2xx answer that is not the documented JSON (malformed, missing fields), a connection
                 failure, a URL that is not allowed (`check_public_url`), or a missing API key.
API keys come from environment variables only (named in the config, e.g. `SERPER_API_KEY`) and never appear in a
message, a returned text or a log line, in any encoding:
  - they are sent in headers wherever the documented API allows it; SerpApi (Lens) documents only the `api_key`
    query parameter, so that key travels in the URL;
  - httpx logs every request URL at INFO (printed under absl's default verbosity), so a filter on the `httpx` and
    `httpcore.*` loggers rewrites each record with every registered key redacted, and the value of any
    key-like query parameter (`api_key=`, `key=`, `token=`, ...) replaced by `***` (`_LogRedactor`);
  - `redact` replaces a key in all the encodings an echo could use: raw, percent-encoded (any safe set, either
    hex case, `quote_plus`, double-encoded), JSON- or HTML-escaped, and base64 (standard / URL-safe, with or
    without padding); error bodies are redacted before they are truncated (no partial key survives a cut).

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
import functools
import ipaddress
import json
import logging
import os
import re
import socket
import threading
import time
import urllib.parse

import cv2
import httpx
import numpy as np

from tools import base

RETRY_STATUS = frozenset({429, 500, 502, 503, 504})


_HTML_ESCAPES = {'&': ('&amp;', '&#38;', '&#x26;'), '<': ('&lt;', '&#60;', '&#x3c;'), '>': ('&gt;', '&#62;', '&#x3e;'),
                 '"': ('&quot;', '&#34;', '&#x22;', '\\"'), "'": ('&#39;', '&#x27;', '&apos;'), '/': ('\\/',),
                 ' ': ('+', '%20'), '\\': ('\\\\',)}


def _hex_pattern(b: int) -> str:
  """Regex of `%XX` (either hex case) for byte `b`, also double-encoded (`%25XX`)."""
  hx = ''.join(f'[{h.lower()}{h.upper()}]' if h.isalpha() else h for h in f'{b:02x}')
  return f'%(?:25)?{hx}'


def _char_pattern(c: str) -> str:
  """Regex of character `c` raw, percent-encoded (its UTF-8 bytes), `+` for a space, JSON/HTML-escaped."""
  alts = [re.escape(c), ''.join(_hex_pattern(b) for b in c.encode('utf-8'))]
  alts += [re.escape(e) for e in _HTML_ESCAPES.get(c, ())]
  if not c.isascii() or not c.isprintable():
    alts += [re.escape(f'\\u{ord(c):04x}'), re.escape(f'\\u{ord(c):04X}')]
  return '(?:' + '|'.join(alts) + ')'


@functools.lru_cache(maxsize=256)
def _secret_regex(secrets: tuple[str, ...]) -> re.Pattern | None:
  """One regex matching any of `secrets` in any encoding (see the module docstring), longest first."""
  forms = set()
  for s in secrets:
    if not s:
      continue
    raw = s.encode('utf-8')
    forms.add(s)
    for b64 in (base64.b64encode(raw).decode(), base64.urlsafe_b64encode(raw).decode()):
      forms.update({b64, b64.rstrip('=')})
  if not forms:
    return None
  return re.compile('|'.join(''.join(_char_pattern(c) for c in f) for f in sorted(forms, key=len, reverse=True)))


def redact(text: str, secrets) -> str:
  """`text` with every occurrence of each secret, in any encoding (module docstring), replaced by `***`."""
  pattern = _secret_regex(tuple(sorted({s for s in secrets if s})))
  return pattern.sub('***', text) if pattern is not None and text else text


# A key-like query parameter's value in a URL (for log lines: whatever the key, it is not printed).
_KEY_PARAM_RE = re.compile(r'(?i)([?&;](?:api[_-]?key|apikey|key|access[_-]?token|token|secret|password|sig|'
                           r'signature|auth)=)[^&;#\s"\'<>]*')


class _LogRedactor(logging.Filter):
  """Rewrites the records of the HTTP libraries' loggers with every registered key redacted (any encoding) and
  the value of key-like URL query parameters replaced by `***`. Installed once on `LOGGERS`."""

  LOGGERS = ('httpx', 'httpcore', 'httpcore.connection', 'httpcore.http11', 'httpcore.http2', 'httpcore.proxy',
             'httpcore.socks')

  def __init__(self):
    super().__init__('osvl-redact-keys')
    self._lock = threading.Lock()
    self.secrets: tuple[str, ...] = ()

  def add(self, secrets) -> None:
    with self._lock:
      self.secrets = tuple(sorted(set(self.secrets) | {s for s in secrets if s}))

  def filter(self, record: logging.LogRecord) -> bool:
    try:
      msg = record.getMessage()
    except Exception:  # pylint: disable=broad-except  # A broken record: let logging report it.
      return True
    clean = _KEY_PARAM_RE.sub(r'\1***', redact(msg, self.secrets))
    if clean != msg:
      record.msg, record.args = clean, None
    return True


_LOG_REDACTOR = _LogRedactor()
for _name in _LogRedactor.LOGGERS:
  _logger = logging.getLogger(_name)
  if not any(isinstance(f, _LogRedactor) for f in _logger.filters):
    _logger.addFilter(_LOG_REDACTOR)


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
    _LOG_REDACTOR.add(self.secrets)
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
        last = base.ToolError('backend_error', redact(f'{self._where(url)} connection failed: '
                                                       f'{type(e).__name__}: {e}', self.secrets))
      else:
        if resp.status_code >= 300:
          body = redact(resp.text, self.secrets)[:200]  # Redacted before the cut: no partial key survives.
          err = base.ToolError('http_error', f'{self._where(url)} returned HTTP {resp.status_code}: {body}')
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
            raise base.ToolError('backend_error', redact(f'{self._where(url)} answered with malformed JSON: '
                                                          f'{e}', self.secrets)) from None
      if attempt < self.retries:
        time.sleep(retry_after if retry_after is not None else delay)
        delay *= 2
    raise last

  def _where(self, url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return redact(f'{parts.scheme}://{parts.netloc}{parts.path}', self.secrets)

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
  summarised by the LLM; returns `[k] Title (link): text` lines (keys redacted), or '' when Serper found nothing.

  A failed page read or summary degrades to the Serper snippet (the search itself succeeded); Serper failures
  raise ToolError.
  """
  serper = SerperClient(cfg.serper)
  hits = serper.search(query, top_k, hl)
  reader = JinaReader(cfg.jina) if cfg.get('read_top', 0) else None
  summarizer = ChatSummarizer(cfg.summarizer) if cfg.get('summarizer') and cfg.summarizer.get('base_url') else None
  secrets = serper.http.secrets + sum((c.http.secrets for c in (reader, summarizer) if c is not None), ())
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
  return redact('\n'.join(lines), secrets)


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
      raise base.ToolError('backend_error', f'lens error: {redact(str(data["error"]), (self.key,))[:200]}')
    matches = data.get('visual_matches', [])
    if not isinstance(matches, list):
      raise base.ToolError('backend_error', 'lens response field visual_matches is not a list')
    return [{'title': redact(str(_field(m, 'title', where='lens')), (self.key,)),
             'link': redact(str(m.get('link', '')), (self.key,)),
             'source': redact(str(m.get('source', '')), (self.key,))} for m in matches[:top_k]]


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
      msg = redact(f'{data.get("errorCode")}: {data.get("errorMsg")}', self.http.secrets)[:200]
      raise base.ToolError('backend_error', f'paddlex error {msg}')
    out = []
    for page in _field(data, 'result', 'ocrResults', kind=list, where='paddlex'):
      pruned = _field(page, 'prunedResult', kind=dict, where='paddlex')
      texts = _field(pruned, 'rec_texts', kind=list, where='paddlex')
      scores = pruned.get('rec_scores', [1.0] * len(texts))
      boxes = pruned.get('rec_boxes', [[0, 0, 0, 0]] * len(texts))
      if len(scores) != len(texts) or len(boxes) != len(texts):
        raise base.ToolError('backend_error', 'paddlex response: rec_texts, rec_scores, rec_boxes differ in length')
      for t, s, b in zip(texts, scores, boxes):
        out.append((redact(str(t), self.http.secrets), float(s), tuple(int(v) for v in b)))
    return out
