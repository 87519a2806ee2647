"""`osvl_jax.openai_client.ChatClient` against a real HTTP endpoint on 127.0.0.1 (`tests/rollout/openai_double.py`):
retries of 503s to success, failures raised after N retries naming the URL, what is not retried, timeouts, budgets
named when spent, usage equal to what the endpoint reported, the concurrency limit, sync and async forms."""

import asyncio
import socket
import threading
import time

import pytest

from osvl_jax import openai_client
from tests.rollout.openai_double import ChatDouble, Reply

MESSAGES = [{'role': 'user', 'content': 'Which river?'}]


def _client(url, **limits):
  return openai_client.ChatClient(url, 'api-model', **{'retry_backoff_s': 0.0, **limits})


def _statuses(*codes):
  """An endpoint answering the n-th request with codes[n] (the last one repeats): 200 is 'Tagus'."""
  return ChatDouble(lambda body, n: Reply('Tagus', status=codes[min(n, len(codes) - 1)]))


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def test_503_twice_then_200_is_retried_to_success():
  double = _statuses(503, 503, 200)
  with double.serve() as url:
    client = _client(url, max_retries=2)
    reply = client.complete(MESSAGES, max_tokens=8, temperature=0.0)
  assert (reply.text, reply.finish_reason, reply.attempts) == ('Tagus', 'stop', 3)
  assert len(double.bodies) == 3 and double.bodies[0] == {'model': 'api-model', 'messages': MESSAGES,
                                                          'max_tokens': 8, 'temperature': 0.0}
  usage = client.usage()
  assert (usage['requests'], usage['retries'], usage['replies'], usage['errors']) == (3, 2, 1, 0)


def test_an_endpoint_that_keeps_failing_raises_after_n_retries_naming_the_url():
  double = _statuses(503)
  with double.serve() as url:
    client = _client(url, max_retries=3)
    with pytest.raises(openai_client.ChatError) as e:
      client.complete(MESSAGES)
  assert len(double.bodies) == 4 and e.value.attempts == 4    # 1 + max_retries, then given up
  assert (e.value.kind, e.value.status, e.value.url) == ('http_503', 503, f'{url}/chat/completions')
  assert f'POST {url}/chat/completions' in str(e.value) and 'InternalServerError' in str(e.value)
  assert client.usage()['errors'] == 1 and client.usage()['error_kinds'] == {'http_503': 1}


def test_the_backoff_doubles_between_retries():
  double = _statuses(503)
  with double.serve() as url:
    client = _client(url, max_retries=2, retry_backoff_s=0.2)
    t0 = time.monotonic()
    with pytest.raises(openai_client.ChatError):
      client.complete(MESSAGES)
  assert time.monotonic() - t0 >= 0.2 + 0.4


def test_a_client_error_is_not_retried_and_429_is():
  double = _statuses(400)
  with double.serve() as url:
    with pytest.raises(openai_client.ChatError) as e:
      _client(url, max_retries=3).complete(MESSAGES)
  assert len(double.bodies) == 1 and e.value.kind == 'http_400' and e.value.attempts == 1
  double = _statuses(429, 200)
  with double.serve() as url:
    assert _client(url, max_retries=1).complete(MESSAGES).attempts == 2


def test_refused_connections_and_timeouts_are_retried_then_raised():
  url = f'http://127.0.0.1:{_free_port()}/v1'
  with pytest.raises(openai_client.ChatError) as e:
    _client(url, max_retries=2).complete(MESSAGES)
  assert e.value.kind == 'connection' and e.value.attempts == 3 and e.value.status is None and url in str(e.value)
  double = ChatDouble(lambda body, n: time.sleep(1.0) or 'late')
  with double.serve() as slow:
    client = _client(slow, max_retries=1, timeout_s=0.2)
    t0 = time.monotonic()
    with pytest.raises(openai_client.ChatError) as e:
      client.complete(MESSAGES)
  assert e.value.kind == 'timeout' and e.value.attempts == 2 and time.monotonic() - t0 < 1.0


def test_a_reply_the_caller_rejects_is_retried_and_its_text_kept():
  def parse(text):
    if text != 'Tagus':
      raise ValueError(f'no river in {text!r}')
    return text.upper()
  replies = ['Maybe.', 'Tagus']
  double = ChatDouble(lambda body, n: replies[min(n, 1)])
  with double.serve() as url:
    assert _client(url, max_retries=1).complete(MESSAGES, parse=parse).parsed == 'TAGUS'
  never = ChatDouble(lambda body, n: 'Maybe.')
  with never.serve() as url:
    with pytest.raises(openai_client.ChatError) as e:
      _client(url, max_retries=1).complete(MESSAGES, parse=parse)
  assert (e.value.kind, e.value.text, e.value.attempts) == ('bad_reply', 'Maybe.', 2)
  assert "ValueError: no river in 'Maybe.'" in str(e.value)


def test_usage_counts_equal_what_the_endpoint_reported():
  usage = [{'prompt_tokens': 11, 'completion_tokens': 3, 'total_tokens': 14},
           {'prompt_tokens': 20, 'completion_tokens': 5, 'total_tokens': 25}]
  double = ChatDouble(lambda body, n: Reply('x', usage=usage[n]))
  with double.serve() as url:
    client = _client(url)
    first, second = client.complete(MESSAGES), client.complete(MESSAGES)
  assert (first.prompt_tokens, first.completion_tokens, first.total_tokens) == (11, 3, 14)
  got = client.usage()
  assert (got['prompt_tokens'], got['completion_tokens'], got['total_tokens']) == (31, 8, 39)
  assert (got['requests'], got['replies']) == (2, 2) and second.total_tokens == 25


def test_a_spent_request_budget_raises_naming_it_and_sends_nothing():
  double = _statuses(503, 200)
  with double.serve() as url:
    client = _client(url, max_retries=3, max_requests=2)
    assert client.complete(MESSAGES).attempts == 2
    with pytest.raises(openai_client.BudgetExceeded, match=r'budget max_requests=2 is spent \(2 requests sent\)'):
      client.complete(MESSAGES)
  assert len(double.bodies) == 2
  assert client.usage()['budget_refused'] == 1 and client.usage()['errors'] == 0


def test_a_spent_token_budget_raises_naming_it():
  double = ChatDouble(lambda body, n: 'x')   # 107 tokens a reply
  with double.serve() as url:
    client = _client(url, max_total_tokens=150)
    client.complete(MESSAGES)
    client.complete(MESSAGES)                # 107 < 150: sent; its reply overshoots the budget
    with pytest.raises(openai_client.BudgetExceeded) as e:
      client.complete(MESSAGES)
  assert (e.value.budget, e.value.limit, e.value.used, e.value.kind) == ('max_total_tokens', 150, 214, 'budget')
  assert 'max_total_tokens=150' in str(e.value) and len(double.bodies) == 2


def test_at_most_max_concurrency_requests_are_in_flight():
  lock, state = threading.Lock(), {'now': 0, 'most': 0}

  def answer(body, n):
    with lock:
      state['now'] += 1
      state['most'] = max(state['most'], state['now'])
    time.sleep(0.1)
    with lock:
      state['now'] -= 1
    return 'x'

  double = ChatDouble(answer)
  with double.serve() as url:
    client = _client(url, max_concurrency=2)
    threads = [threading.Thread(target=client.complete, args=(MESSAGES,)) for _ in range(6)]
    for t in threads:
      t.start()
    for t in threads:
      t.join()
    assert state['most'] == 2 and client.usage()['replies'] == 6

    async def many():
      try:
        return await asyncio.gather(*(client.acomplete(MESSAGES) for _ in range(6)))
      finally:
        await client.aclose()

    state['most'] = 0
    assert [r.text for r in asyncio.run(many())] == ['x'] * 6
  assert state['most'] == 2


def test_async_form_retries_and_raises_like_the_sync_one():
  double = _statuses(503, 200, 503, 503, 200)
  with double.serve() as url:
    client = _client(url, max_retries=1)

    async def first_loop():
      try:
        first = await client.acomplete(MESSAGES)
        with pytest.raises(openai_client.ChatError, match='http_503'):
          await client.acomplete(MESSAGES)
        return first
      finally:
        await client.aclose()

    async def second_loop():   # another event loop: its own connections
      try:
        return await client.acomplete(MESSAGES)
      finally:
        await client.aclose()

    assert asyncio.run(first_loop()).attempts == 2
    assert asyncio.run(second_loop()).attempts == 1
  usage = client.usage()
  assert (usage['requests'], usage['retries'], usage['replies'], usage['errors']) == (5, 2, 2, 1)


def test_the_api_key_comes_from_the_named_variable_and_is_never_shown(monkeypatch):
  monkeypatch.setenv('MY_KEY', 'sk-secret')
  double = ChatDouble(lambda body, n: 'x')
  with double.serve() as url:
    client = openai_client.ChatClient(url, 'm', api_key_env='MY_KEY')
    client.complete(MESSAGES)
    openai_client.ChatClient(url, 'm', api_key_env='UNSET_KEY_VARIABLE').complete(MESSAGES)
  assert double.auth == ['Bearer sk-secret', 'Bearer EMPTY']
  assert 'sk-secret' not in repr(client)


def test_bad_settings_are_refused_naming_them():
  with pytest.raises(ValueError, match='base_url is empty'):
    openai_client.ChatClient('', 'm')
  with pytest.raises(ValueError, match='model is empty'):
    openai_client.ChatClient('http://h/v1', ' ')
  for field, value in (('timeout_s', 0), ('max_retries', -1), ('max_concurrency', 0), ('max_requests', -1)):
    with pytest.raises(ValueError, match=f'{field}='):
      openai_client.ChatClient('http://h/v1', 'm', **{field: value})
  client = openai_client.ChatClient.from_config({'base_url': 'http://h/v1/', 'model': 'm', 'max_requests': 3,
                                                 'unrelated': 1}, timeout_s=5.0)
  assert (client.base_url, client.max_requests, client.timeout_s, client.max_retries) == ('http://h/v1', 3, 5.0, 2)


@pytest.mark.parametrize('header', ['1', 'DATE'])
def test_a_retry_after_answer_is_waited_before_the_retry(header):
  """429 with `Retry-After` (seconds, or an HTTP date): the retry waits that long, not the own 0 s backoff."""
  import email.utils
  value = email.utils.formatdate(time.time() + 2, usegmt=True) if header == 'DATE' else header
  replies = [Reply(status=429, retry_after=value), Reply('Tagus')]
  double = ChatDouble(lambda body, n: replies[n])
  with double.serve() as url:
    client = _client(url, max_retries=1)
    t0 = time.monotonic()
    reply = client.complete(MESSAGES)
  assert reply.text == 'Tagus' and reply.attempts == 2 and time.monotonic() - t0 >= 0.95
  assert openai_client.retry_after_seconds({'retry-after': '9999'}) == openai_client.MAX_RETRY_AFTER_S
  assert openai_client.retry_after_seconds({'retry-after': 'soon'}) is None
