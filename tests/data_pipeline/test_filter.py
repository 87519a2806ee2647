"""Stage `filter`: the decision logic (a scripted test double), a real `osvl_jax.serve --tiny` endpoint, and an
endpoint that refuses connections."""

import json

import pytest

from data_pipeline import filter as filter_lib
from data_pipeline import llm
from osvl_jax import paths as osvl_paths
from tests.serve.conftest import free_port, healthy, serve_process, wait_until



class ScriptedChatClient:
  """Test double of `llm.AsyncChatClient` (same async interface): answers from a script keyed by the question,
  the Filter B prompt recognised by its image-search preamble."""

  def __init__(self, script: dict):
    self.script, self.calls = script, []

  async def chat(self, messages):
    text = messages[0]['content'][1]['text']
    question = text.rsplit('Question: ', 1)[1]
    stage = 'b' if text.startswith('An image search') else 'a'
    self.calls.append((stage, question, text))
    got = self.script[question][stage]
    return llm.Reply(error=got[1]) if isinstance(got, tuple) else llm.Reply(text=got, tokens=10)

  def stats(self):
    return {'requests': len(self.calls)}

  async def aclose(self):
    pass


def _records():
  base = {'image_path': 'images/landmarks/taj-mahal.jpg', 'rejected': None}
  return [dict(base, prompt_id='easy', question='Q-easy?', answers=['Agra']),
          dict(base, prompt_id='search', question='Q-search?', answers=['1879']),
          dict(base, prompt_id='hard', question='Q-hard?', answers=['Maseru']),
          dict(base, prompt_id='broken', question='Q-broken?', answers=['x']),
          dict(base, prompt_id='down', question='Q-down?', answers=['y']),
          dict(base, prompt_id='old', question='Q-old?', answers=['z'], rejected='ground: leak: Agra')]


def _config(**kw):
  c = filter_lib.default_config()
  c.update(kw)
  return c


def test_decisions_with_a_scripted_answer_source():
  script = {'Q-easy?': {'a': 'It is in <answer>Agra</answer>.'},
            'Q-search?': {'a': '<answer>1900</answer>', 'b': '<think>the search says...</think><answer>1879</answer>'},
            'Q-hard?': {'a': '<answer>Lusaka</answer>', 'b': '<answer>Gaborone</answer>'},
            'Q-broken?': {'a': 'I think <answer>x'},
            'Q-down?': {'a': (None, 'connection: Connection error.')}}
  client = ScriptedChatClient(script)
  recs, counts = filter_lib.run_filters(_records(), _config(), osvl_paths.data_dir(), client=client)
  by_id = {r['prompt_id']: r for r in recs}
  assert by_id['easy']['rejected'] == 'filter_a_solved'
  assert by_id['search']['rejected'] == 'filter_b_solved'
  assert by_id['hard']['rejected'] is None
  assert by_id['broken']['rejected'] == 'filter_a_unparseable: unclosed <answer> tag'
  assert by_id['down']['rejected'] == 'filter_a_error: connection: Connection error.'
  assert by_id['old']['rejected'] == 'ground: leak: Agra' and by_id['old']['filter_trace'] == ''
  assert counts['rejected'] == {'filter_a_solved': 1, 'filter_b_solved': 1, 'filter_a_unparseable': 1,
                                'filter_a_error': 1}
  assert counts['checked'] == 5 and counts['passed'] == 1 and counts['skipped_rejected'] == 1
  # Filter B ran only on the two items A did not reject, with the real image_search hit in the prompt.
  b_calls = [c for c in client.calls if c[0] == 'b']
  assert sorted(c[1] for c in b_calls) == ['Q-hard?', 'Q-search?']
  assert 'Taj_Mahal' in b_calls[0][2]   # "Best match: ... (Wikipedia article: Taj_Mahal) ..."
  assert counts['image_search']['ok'] == 5
  assert json.loads(by_id['search']['filter_trace'])['filter_b'] == {'answer': '1879', 'score': 1.0}


def test_offline_default_and_disabled_reject_nothing():
  recs, counts = filter_lib.run_filters(_records(), _config(), osvl_paths.data_dir())
  assert counts['skipped'] == {'no endpoint': 5} and counts['passed'] == 5 and counts['rejected'] == {}
  assert [r['rejected'] for r in recs] == [None] * 5 + ['ground: leak: Agra']
  _, counts = filter_lib.run_filters(_records(), _config(enabled=False, base_url='http://x/v1', model='m'),
                                     osvl_paths.data_dir())
  assert counts['skipped'] == {'disabled': 5}


def test_parse_answer():
  assert filter_lib.parse_answer('<think>hmm <answer>no</answer></think> <answer> Cairo </answer>') == ('Cairo', None)
  assert filter_lib.parse_answer('Cairo') == ('Cairo', None)
  assert filter_lib.parse_answer('<answer></answer>') == (None, 'empty answer')
  assert filter_lib.parse_answer(None) == (None, 'no reply')


def test_bad_filter_config_is_refused_naming_the_field():
  with pytest.raises(ValueError, match='data.filter.model is empty'):
    filter_lib.check_config(_config(base_url='http://127.0.0.1:1/v1'))
  with pytest.raises(ValueError, match='data.filter.max_concurrency=0'):
    filter_lib.check_config(_config(max_concurrency=0))



def test_an_endpoint_that_refuses_connections_gives_per_item_reasons():
  config = _config(base_url=f'http://127.0.0.1:{free_port()}/v1', model='m', max_retries=1, retry_backoff_s=0.0)
  recs, counts = filter_lib.run_filters(_records(), config, osvl_paths.data_dir())
  assert [r['rejected'].split(':')[:2] for r in recs[:5]] == [['filter_a_error', ' connection']] * 5
  assert counts['llm']['requests'] == 10 and counts['llm']['retries'] == 5   # 5 items x (1 + 1 retry)
  assert counts['llm']['errors'] == 5 and counts['llm']['error_kinds'] == {'connection': 5}
  assert counts['rejected'] == {'filter_a_error': 5}


def test_request_budget_refuses_without_sending():
  config = _config(base_url=f'http://127.0.0.1:{free_port()}/v1', model='m', max_retries=0, max_requests=2,
                   max_concurrency=1)
  recs, counts = filter_lib.run_filters(_records(), config, osvl_paths.data_dir())
  assert counts['llm']['requests'] == 2 and counts['llm']['budget_refused'] == 3
  assert sorted(r['rejected'] for r in recs[:5]) == (['filter_a_error: budget: requests'] * 3 +
                                                     ['filter_a_error: connection: Connection error.'] * 2)


def test_against_a_real_tiny_policy_server(tmp_path):
  """`python -m osvl_jax.serve --tiny` started as tests/serve/conftest.py's `serve_process` does (random weights:
  its replies are garbage, so items pass unless a garbage reply happens to be unparseable)."""
  log_path = tmp_path / 'serve.log'
  with serve_process(log_path, '--bucket=16', '--max_len=512', '--max_new_tokens=6') as (url, proc):
    wait_until(lambda: healthy(url), 300, 'osvl_jax.serve', proc, log_path)
    config = _config(base_url=url + '/v1', model='osvl-jax', max_tokens=6, max_concurrency=4, timeout_s=300.0)
    recs, counts = filter_lib.run_filters(_records(), config, osvl_paths.data_dir())
    # A token budget of 1: the first request is sent, its usage spends the budget, the rest are refused unsent.
    config.update(max_concurrency=1, max_total_tokens=1)
    tight, tight_counts = filter_lib.run_filters(_records(), config, osvl_paths.data_dir())
  print('tiny server filter counts:', json.dumps(counts))
  assert counts['llm']['errors'] == 0, counts
  assert counts['checked'] == 5 and counts['llm']['requests'] == counts['llm']['replies']
  # Each item: Filter A, then (not rejected by A) Filter B.
  n_b = sum('filter_b' in json.loads(r['filter_trace']) for r in recs[:5])
  assert counts['llm']['requests'] == 5 + n_b and counts['llm']['tokens'] > 0
  assert counts['passed'] + sum(counts['rejected'].values()) == 5
  assert counts['passed'] >= 1
  assert tight_counts['llm']['requests'] == 1 and tight_counts['llm']['tokens'] > 1
  assert tight_counts['llm']['budget_refused'] >= 4
  assert sum(r['rejected'] == 'filter_a_error: budget: tokens' for r in tight) == 4


def test_filter_b_without_a_search_hit_rejects_with_the_reason(monkeypatch):
  """An item whose image search failed was never asked Filter B's question: it cannot pass as hard."""
  def failed_search(todo, records, images, tools_config):
    return {i: (False, 'no_result') for i in todo}, {'no_result': len(todo)}

  monkeypatch.setattr(filter_lib, '_image_search', failed_search)
  client = ScriptedChatClient({'Q-hard?': {'a': '<answer>Lusaka</answer>'}})
  records = [r for r in _records() if r['prompt_id'] == 'hard']
  recs, counts = filter_lib.run_filters(records, _config(), osvl_paths.data_dir(), client=client)
  assert recs[0]['rejected'] == 'filter_b_error: image_search no_result'
  assert [c[0] for c in client.calls] == ['a'] and counts['rejected'] == {'filter_b_error': 1}
