"""API keys never reach a log line or a ToolResult, in any encoding (DESIGN.md §5): the SerpApi Lens key that
travels in the query string is kept out of httpx's INFO request log, and a key that an error body echoes
URL-encoded (a key holding `/`, `+`, `=`) is redacted from the tool text. Real HTTP servers on 127.0.0.1."""

import base64
import http.server
import json
import logging
import pathlib
import re
import subprocess
import sys
import textwrap
import threading
import urllib.parse

import httpx
import ml_collections
import pytest

import remote_doubles as doubles
from tools import base
from tools import env as tools_env
from tools import remote

KEY = 'sk/A+b=c9-SECRET_0x'  # '/', '+' and '=' change under every URL encoding.
ROOT = pathlib.Path(__file__).resolve().parents[2]


def encodings(key: str) -> dict[str, str]:
  """Every form in which `key` could leak (each must be absent from logs and tool texts)."""
  pct = urllib.parse.quote(key, safe='')
  forms = {
      'raw': key,
      'quote': urllib.parse.quote(key),
      'quote_safe_none': pct,
      'quote_lower_hex': re.sub(r'%[0-9A-F]{2}', lambda m: m.group(0).lower(), pct),
      'quote_plus': urllib.parse.quote_plus(key),
      'quote_plus_slash': urllib.parse.quote_plus(key, safe='/'),
      'double_encoded': urllib.parse.quote(pct, safe=''),
      'httpx_query': str(httpx.QueryParams({'k': key}))[2:],
      'json': json.dumps(key)[1:-1].replace('/', '\\/'),
      'b64': base64.b64encode(key.encode()).decode(),
      'b64_urlsafe': base64.urlsafe_b64encode(key.encode()).decode(),
  }
  forms['b64_unpadded'] = forms['b64'].rstrip('=')
  forms['b64_quoted'] = urllib.parse.quote(forms['b64'], safe='')
  return forms


def assert_no_key(text: str, key: str = KEY):
  for name, form in encodings(key).items():
    assert form not in text, f'key leaked ({name} encoding {form!r}) in: {text!r}'


def _cfg(url, **kw):
  return ml_collections.ConfigDict({'base_url': url, 'api_key_env': 'OSVL_TEST_KEY', 'timeout': 2.0,
                                    'retries': 0, 'backoff': 0.01, **kw})


@pytest.fixture(autouse=True)
def _key(monkeypatch):
  monkeypatch.setenv('OSVL_TEST_KEY', KEY)


@pytest.fixture
def logs(caplog):
  """Everything the HTTP libraries and the root logger emit, down to DEBUG."""
  caplog.set_level(logging.DEBUG)
  for name in ('httpx', 'httpcore'):
    caplog.set_level(logging.DEBUG, logger=name)
  return caplog


def _lens_env(url):
  return tools_env.ToolEnv({'tool_schema': 'official', 'enabled': ('image_search',), 'image_search': {
      'backend': 'remote', 'lens': dict(_cfg(url, allow_private_urls=True))}})


class EchoServer:
  """An HTTP server on 127.0.0.1 that answers every GET with `status` and a body echoing the request target
  (path + query string exactly as received, i.e. URL-encoded), after `pad` filler characters."""

  def __init__(self, status: int, pad: int = 0):
    outer = self
    self.targets: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
      def log_message(self, *args):
        pass

      def do_GET(self):
        outer.targets.append(self.path)
        body = json.dumps({'error': 'x' * pad + f'Invalid API key in request {self.path}'}).encode()
        self.send_response(status)
        self.send_header('content-type', 'application/json')
        self.send_header('content-length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    self._server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
    self.url = f'http://127.0.0.1:{self._server.server_address[1]}'
    threading.Thread(target=self._server.serve_forever, daemon=True).start()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self._server.shutdown()
    self._server.server_close()


# --- redact() itself ----------------------------------------------------------------------------------------

@pytest.mark.parametrize('name', sorted(encodings(KEY)))
def test_redact_removes_every_encoding(name):
  form = encodings(KEY)[name]
  out = remote.redact(f'before {form} after', (KEY,))
  assert out == 'before *** after', (name, out)


@pytest.mark.parametrize('key', ['plain-key-0123456789', 'with space&amp<>"\'\\é', 'ÿ/é+ü=='])
def test_redact_neighbour_keys(key):
  for name, form in encodings(key).items():
    assert remote.redact(f'[{form}]', (key,)) == '[***]', (key, name, form)


def test_redact_leaves_other_text_alone():
  text = 'sk/A+b=c9-SECRET_0y and sk/A+b=c9 and api_key=public'
  assert remote.redact(text, (KEY,)) == text
  assert remote.redact(text, ()) == text and remote.redact('', (KEY,)) == ''


# --- Lens: the key in the query string --------------------------------------------------------------------

def test_lens_success_logs_the_request_without_the_key(logs):
  with doubles.ServiceDouble(doubles.lens) as srv:
    r = _lens_env(srv.url).call('image_search', {'url': 'http://127.0.0.1:9/taj.jpg'}, [])
  assert r.ok, r.text
  assert srv.requests[0]['query']['api_key'] == KEY  # The key did reach the service.
  request_lines = [rec.getMessage() for rec in logs.records if rec.name == 'httpx']
  assert request_lines and 'search.json' in request_lines[0] and 'api_key=***' in request_lines[0]
  assert 'engine=google_lens' in request_lines[0]  # The rest of the URL is kept.
  assert_no_key(logs.text + '\n'.join(rec.getMessage() for rec in logs.records))
  assert_no_key(r.text)


def test_lens_error_body_echoing_the_encoded_key_is_redacted(logs):
  def echo(req):  # 200 with an error field that quotes the key URL-encoded, as SerpApi-like services do.
    return {'error': f'Invalid API key {urllib.parse.quote_plus(req["query"]["api_key"])} '
                     f'({urllib.parse.quote(req["query"]["api_key"], safe="")})'}
  with doubles.ServiceDouble(echo) as srv:
    r = _lens_env(srv.url).call('image_search', {'url': 'http://127.0.0.1:9/taj.jpg'}, [])
  assert (r.ok, r.error_kind) == (False, 'backend_error') and 'Invalid API key *** (***)' in r.text, r.text
  assert_no_key(r.text)
  assert_no_key(logs.text)


@pytest.mark.parametrize('status,kind', [(401, 'http_error'), (500, 'http_error')])
def test_http_error_body_echoing_the_request_url_is_redacted(logs, status, kind):
  with EchoServer(status) as srv:
    r = _lens_env(srv.url).call('image_search', {'url': 'http://127.0.0.1:9/taj.jpg'}, [])
  assert urllib.parse.parse_qs(urllib.parse.urlsplit(srv.targets[0]).query)['api_key'] == [KEY]
  assert (r.ok, r.error_kind) == (False, kind) and f'HTTP {status}' in r.text and 'api_key=***' in r.text, r.text
  assert_no_key(r.text)
  assert_no_key(logs.text)


def test_key_cut_by_the_error_body_truncation_leaves_no_prefix(logs):
  # The echoed key starts a few characters before the 200-character cut of the error body.
  prefix = len('{"error": "') + len('Invalid API key in request /search.json?engine=google_lens&url=') + len(
      urllib.parse.quote('http://127.0.0.1:9/taj.jpg', safe='')) + len('&api_key=')
  with EchoServer(401, pad=200 - prefix - 5) as srv:
    r = _lens_env(srv.url).call('image_search', {'url': 'http://127.0.0.1:9/taj.jpg'}, [])
  assert r.error_kind == 'http_error'
  assert 'sk%2F' not in r.text and 'sk/' not in r.text, r.text
  assert_no_key(r.text)


def test_header_keys_are_redacted_from_echoed_error_bodies(logs):
  """Neighbour: Serper sends its key in a header; a service echoing it back in a 4xx body is redacted too."""
  def echo(req):
    return {'organic': 'not a list', 'echo': req['headers']['x-api-key']}
  with doubles.ServiceDouble(echo) as srv:
    with pytest.raises(base.ToolError) as e:
      remote.SerperClient(_cfg(srv.url)).search('x')
  assert srv.requests[0]['headers']['x-api-key'] == KEY
  assert_no_key(str(e.value))
  assert_no_key(logs.text)


def test_absl_logging_at_debug_prints_no_key():
  """End to end as a binary would run: absl's handler on stderr at DEBUG (more than the INFO default)."""
  code = textwrap.dedent(f"""
      import os, sys
      sys.path[:0] = [{str(ROOT)!r}, {str(ROOT / 'tests' / 'tools')!r}]
      os.environ['OSVL_TEST_KEY'] = {KEY!r}
      from absl import app, logging
      import ml_collections
      import remote_doubles as doubles
      from tools import env as tools_env

      def main(argv):
        logging.info('absl handler is live')
        for respond in (doubles.lens, lambda req: {{'error': 'bad key ' + req['query']['api_key']}}):
          with doubles.ServiceDouble(respond) as srv:
            lens = {{'base_url': srv.url, 'api_key_env': 'OSVL_TEST_KEY', 'timeout': 2.0, 'retries': 0,
                     'allow_private_urls': True}}
            env = tools_env.ToolEnv({{'tool_schema': 'official', 'enabled': ('image_search',),
                                     'image_search': {{'backend': 'remote', 'lens': lens}}}})
            r = env.call('image_search', {{'url': 'http://127.0.0.1:9/taj.jpg'}}, [])
            print('RESULT', r.ok, r.error_kind, r.text)

      app.run(main)
      """)
  out = subprocess.run([sys.executable, '-c', code, '--logtostderr', '--verbosity=1'], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr[-3000:]
  assert 'absl handler is live' in out.stderr and 'HTTP Request: GET' in out.stderr, out.stderr[-3000:]
  assert 'RESULT True None Visual matches' in out.stdout and 'RESULT False backend_error' in out.stdout
  assert_no_key(out.stderr)
  assert_no_key(out.stdout)
