"""tools/remote.py against test doubles of each service (tests/tools/remote_doubles.py): success, 429, 500, a
response slower than the timeout, malformed JSON; keys from the environment, never in messages; URL checks."""

import numpy as np
import pytest

import remote_doubles as doubles
from tools import base
from tools import env as tools_env
from tools import remote

KEY = 'sk-test-double-SECRET-0123'


def _cfg(url, **kw):
  import ml_collections
  return ml_collections.ConfigDict({'base_url': url, 'api_key_env': 'OSVL_TEST_KEY', 'timeout': 0.5,
                                    'retries': 2, 'backoff': 0.01, **kw})


@pytest.fixture(autouse=True)
def _key(monkeypatch):
  monkeypatch.setenv('OSVL_TEST_KEY', KEY)


def test_serper_success_sends_documented_request():
  with doubles.ServiceDouble(doubles.serper) as srv:
    hits = remote.SerperClient(_cfg(srv.url)).search('Taj Mahal', num=2, hl='en')
  assert [h['title'] for h in hits] == ['Taj Mahal - Wikipedia', 'Visit Taj Mahal']
  req = srv.requests[0]
  assert (req['method'], req['path'], req['body']) == ('POST', '/search', {'q': 'Taj Mahal', 'num': 2, 'hl': 'en'})
  assert req['headers']['x-api-key'] == KEY


def test_429_once_is_retried_then_succeeds():
  with doubles.ServiceDouble(doubles.serper, mode='429_once') as srv:
    hits = remote.SerperClient(_cfg(srv.url)).search('x')
  assert hits and len(srv.requests) == 2


@pytest.mark.parametrize('mode', ['429', '500'])
def test_persistent_429_and_500_are_http_errors_after_bounded_retries(mode):
  with doubles.ServiceDouble(doubles.serper, mode=mode) as srv:
    with pytest.raises(base.ToolError) as e:
      remote.SerperClient(_cfg(srv.url)).search('x')
  assert e.value.kind == 'http_error' and f'HTTP {mode}' in str(e.value)
  assert len(srv.requests) == 3  # 1 + retries


def test_slow_response_past_timeout_is_timeout():
  with doubles.ServiceDouble(doubles.serper, mode='slow', delay=1.0) as srv:
    with pytest.raises(base.ToolError) as e:
      remote.SerperClient(_cfg(srv.url, timeout=0.2, retries=1)).search('x')
  assert e.value.kind == 'timeout' and len(srv.requests) == 2


def test_malformed_json_is_backend_error():
  with doubles.ServiceDouble(doubles.serper, mode='malformed') as srv:
    with pytest.raises(base.ToolError) as e:
      remote.SerperClient(_cfg(srv.url)).search('x')
  assert e.value.kind == 'backend_error' and 'malformed JSON' in str(e.value)


def test_missing_key_is_backend_error_naming_the_variable(monkeypatch):
  monkeypatch.delenv('OSVL_TEST_KEY')
  with pytest.raises(base.ToolError, match='OSVL_TEST_KEY') as e:
    remote.SerperClient(_cfg('http://127.0.0.1:9'))
  assert e.value.kind == 'backend_error'


def test_key_never_appears_in_error_text():
  with doubles.ServiceDouble(doubles.lens, mode='500') as srv:  # The Lens key travels in the query string.
    env = tools_env.ToolEnv({'tool_schema': 'official', 'enabled': ('image_search',), 'image_search': {
        'backend': 'remote', 'lens': dict(_cfg(srv.url, retries=0, allow_private_urls=True))}})
    r = env.call('image_search', {'url': 'http://127.0.0.1:9/taj.jpg'}, [])
  assert r.error_kind == 'http_error' and KEY not in r.text and srv.requests[0]['query']['api_key'] == KEY


def test_text_search_remote_reads_pages_and_summarises():
  with doubles.ServiceDouble(doubles.serper) as s, doubles.ServiceDouble(doubles.jina) as j, \
       doubles.ServiceDouble(doubles.chat) as c:
    env = tools_env.ToolEnv({'enabled': ('text_search',), 'text_search': {
        'backend': 'remote', 'read_top': 1, 'serper': dict(_cfg(s.url)),
        'jina': dict(_cfg(j.url, allow_private_urls=True)), 'summarizer': dict(_cfg(c.url, model='m'))}})
    r = env.call('text_search', {'query': 'Taj Mahal', 'top_k': 2}, [])
  assert r.ok, r.text
  lines = r.text.split('\n')
  assert lines[0] == '[1] Taj Mahal - Wikipedia (http://127.0.0.1:9/wiki): Built 1631-1653 in Agra.'
  assert lines[1].startswith('[2] Visit Taj Mahal (http://127.0.0.1:9/visit): Opening hours')
  assert j.requests[0]['path'] == '/http://127.0.0.1:9/wiki'
  assert c.requests[0]['body']['model'] == 'm'


def test_text_search_remote_without_private_flag_refuses_loopback_pages():
  with doubles.ServiceDouble(doubles.serper) as s, doubles.ServiceDouble(doubles.jina) as j:
    env = tools_env.ToolEnv({'enabled': ('text_search',), 'text_search': {
        'backend': 'remote', 'read_top': 1, 'serper': dict(_cfg(s.url)), 'jina': dict(_cfg(j.url))}})
    r = env.call('text_search', {'query': 'Taj Mahal'}, [])
  assert r.ok and '(page not read: bad_arguments)' in r.text and not j.requests


@pytest.mark.parametrize('url', ['file:///etc/passwd', 'ftp://example.org/x', 'http://127.0.0.1/x',
                                 'http://localhost:8080/', 'http://10.0.0.5/', 'http://169.254.169.254/latest',
                                 'http://[::1]/', 'https:///nohost'])
def test_fetcher_refuses_non_http_and_non_public_urls(url):
  with pytest.raises(base.ToolError) as e:
    remote.check_public_url(url)
  assert e.value.kind == 'bad_arguments'


def test_private_urls_pass_only_with_the_test_flag():
  assert remote.check_public_url('http://127.0.0.1:8000/a', allow_private=True)
  with pytest.raises(base.ToolError):
    remote.check_public_url('file:///etc/passwd', allow_private=True)


def test_lens_success_through_toolenv():
  with doubles.ServiceDouble(doubles.lens) as srv:
    env = tools_env.ToolEnv({'tool_schema': 'official', 'enabled': ('image_search',), 'image_search': {
        'backend': 'remote', 'lens': dict(_cfg(srv.url, allow_private_urls=True))}})
    r = env.call('image_search', {'url': 'http://127.0.0.1:9/taj.jpg'}, [])
  assert r.ok and r.text.startswith('Visual matches:\n[1] Taj Mahal, Agra (Wikipedia, ')
  assert srv.requests[0]['query']['engine'] == 'google_lens'


def test_paddlex_ocr_through_toolenv_in_reading_order():
  with doubles.ServiceDouble(doubles.paddlex_ocr) as srv:
    env = tools_env.ToolEnv({'enabled': ('ocr',), 'ocr': {'backend': 'remote', 'paddlex': dict(_cfg(srv.url))}})
    r = env.call('ocr', {'image': 'img_1'}, [np.zeros((64, 128, 3), np.uint8)])
  assert r.ok, r.text
  assert r.text.split('\n')[1:] == ['[1] (0, 12, 50, 18) HELLO', '[2] (60, 10, 60, 20) WORLD']


@pytest.mark.parametrize('mode,kind', [('500', 'http_error'), ('malformed', 'backend_error'),
                                       ('slow', 'timeout')])
def test_paddlex_failures_are_typed_tool_errors(mode, kind):
  with doubles.ServiceDouble(doubles.paddlex_ocr, mode=mode, delay=0.6) as srv:
    env = tools_env.ToolEnv({'enabled': ('ocr',), 'ocr': {
        'backend': 'remote', 'paddlex': dict(_cfg(srv.url, timeout=0.3, retries=0))}})
    r = env.call('ocr', {'image': 'img_1'}, [np.zeros((16, 16, 3), np.uint8)])
  assert (r.ok, r.error_kind) == (False, kind), r.text
