"""LLM canonical questions and the Eq. 6 (ii) unique-referent judge: exact decisions with a scripted double of
`llm.AsyncChatClient`, an endpoint that refuses connections (retries, budgets), and a real `osvl_jax.serve
--tiny` endpoint (gibberish replies: every stage runs and counts its fallbacks / rejections)."""

import asyncio
import json

import numpy as np
import pytest

from data_pipeline import llm
from data_pipeline import llm_questions as lq
from osvl_jax.judges import prompts
from tests.serve.conftest import free_port, healthy, serve_process, wait_until

PATH = ['Taj_Mahal', 'Luftwaffe', 'Adolf_Hitler']


class ScriptedChatClient:
  """Test double of `llm.AsyncChatClient`: the reply is looked up by the first script key found in the prompt
  (a str: the reply text; a tuple (None, error): a failed request). Records the prompts and the most requests
  in flight at once."""

  def __init__(self, script: dict):
    self.script, self.prompts, self.in_flight, self.max_in_flight = script, [], 0, 0

  async def chat(self, messages):
    prompt = messages[0]['content']
    self.prompts.append(prompt)
    self.in_flight += 1
    self.max_in_flight = max(self.max_in_flight, self.in_flight)
    await asyncio.sleep(0.01)
    self.in_flight -= 1
    got = next(v for k, v in self.script.items() if k in prompt)
    return llm.Reply(error=got[1]) if isinstance(got, tuple) else llm.Reply(text=got, tokens=10)

  def stats(self):
    return {'requests': len(self.prompts)}

  async def aclose(self):
    pass


def _record(pid: str, rejected=None, path=PATH, attribute='born', answers=('1889', 'April 20, 1889')):
  # A `qa.canonical_question`-style template, made distinct per record so that the script can tell them apart.
  template = (f'The Wikipedia article on Taj Mahal mentions Luftwaffe, and Adolf Hitler is mentioned in the article '
              f'on Luftwaffe ({pid}). What is the birth year of Adolf Hitler?')
  return {'prompt_id': pid, 'path': list(path), 'descriptors': ['military unit', 'political figure'][:len(path) - 1],
          'answer_attribute': attribute, 'answers': list(answers), 'canonical_question': template,
          'rejected': rejected}


def _config(**kw):
  c = lq.default_config()
  c.update(kw)
  return c


def test_check_question_decides_each_rule():
  good = ('<question>In which year was Adolf Hitler born, who is mentioned in the article on Luftwaffe, which '
          'the article on Taj Mahal mentions?</question>')
  assert lq.check_question(good, PATH, ['1889'])[1] is None
  assert lq.check_question('<think>draft?</think>' + good, PATH, ['1889'])[0].startswith('In which year')
  cases = {
      None: 'no reply',
      'In which year was Adolf Hitler born?': 'no <question> tag',
      '<question>In which year?': 'unclosed <question> tag',
      '<question> </question>': 'empty question',
      '<question>Who is Adolf Hitler? When was he born?</question>':
          "not one question (2 question marks, ends with '?')",
      '<question>Tell me the year Adolf Hitler was born.</question>':
          "not one question (0 question marks, ends with '.')",
      '<question>When was Adolf Hitler, mentioned in the Taj Mahal article, born?</question>':
          'misses a path node (Luftwaffe)',
      '<question>Was Adolf Hitler of the Luftwaffe (see Taj Mahal) born in April 20, 1889?</question>':
          "contains the answer ('1889')",
  }
  for reply, why in cases.items():
    assert lq.check_question(reply, PATH, ['1889', 'April 20, 1889']) == (None, why), reply
  assert lq.check_question(good, PATH, ['1889'], max_chars=50) == (None, f'too long ({len(good) - 21} chars)')


def test_names_node_folds_case_accents_and_parentheticals():
  assert lq.names_node('the city of SAO PAULO?', 'São_Paulo')
  assert lq.names_node('where is mercury?', 'Mercury_(planet)')
  assert not lq.names_node('what is the Taj?', 'Taj_Mahal')           # a partial name does not name the node
  assert not lq.names_node('the Luftwaffes', 'Luftwaffe')               # whole words only
  redirects = {'Luftwaffe': ['Luftwaffe', 'German Air Force']}.get     # a graph's redirect-aware aliases
  assert lq.names_node('units of the German air force?', 'Luftwaffe', redirects)
  assert not lq.names_node('units of the German air force?', 'Luftwaffe')


def test_canonical_questions_with_a_scripted_llm():
  recs = [_record(f'r{k}') for k in range(6)] + [_record('r6', rejected='qa: no answerable attribute')]
  good = ('<question>In which year was Adolf Hitler born, who is mentioned in the article on Luftwaffe, which the '
          'article on Taj Mahal mentions?</question>')
  script = {recs[0]['canonical_question']: good,
            recs[1]['canonical_question']: '<question>When was Adolf Hitler born?</question>',
            recs[2]['canonical_question']: '<question>Taj Mahal, Luftwaffe: was Adolf Hitler born in 1889?</question>',
            recs[3]['canonical_question']: 'Sure! Adolf Hitler? Luftwaffe? Taj Mahal?',
            recs[4]['canonical_question']: (None, 'connection: Connection error.'),
            recs[5]['canonical_question']: '<question>Which year? Taj Mahal Luftwaffe Adolf Hitler</question>'}
  client = ScriptedChatClient(script)
  out, counts = lq.canonical_questions(recs, _config(), client=client)
  assert out[0]['canonical_question'] == good[10:-11] and out[0]['canonical_question_source'] == 'llm'
  assert [r['canonical_question'] for r in out[1:]] == [r['canonical_question'] for r in recs[1:]]
  assert [r['canonical_question_source'] for r in out[1:]] == [
      'template: llm_question: misses a path node (Taj_Mahal)',
      "template: llm_question: contains the answer ('1889')",
      'template: llm_question: no <question> tag',
      'template: llm_question: request failed (connection: Connection error.)',
      "template: llm_question: not one question (1 question marks, ends with 'r')", '']
  assert counts['llm_written'] == 1 and counts['accepted_in'] == 6 and counts['skipped_rejected'] == 1
  assert counts['fallback'] == {'llm_question: misses a path node': 1, 'llm_question: contains the answer': 1,
                                'llm_question: no <question> tag': 1, 'llm_question: request failed': 1,
                                'llm_question: not one question': 1}
  assert client.max_in_flight == 6   # all six sent concurrently (the double sets no limit)
  # The prompt names every node in order, the descriptors, the asked fact and the template question.
  prompt = client.prompts[0]
  assert '1. Taj Mahal\n2. Luftwaffe (a military unit)\n3. Adolf Hitler (a political figure)' in prompt
  assert 'Asked fact: What is the birth year of Adolf Hitler?' in prompt and recs[0]['canonical_question'] in prompt
  assert '1889' not in prompt
  # The hop relations, when the record has them, read 'v(i-1) <relation> vi'.
  rec = dict(recs[0], path=['Taj_Mahal', 'Ustad_Ahmad_Lahauri'], descriptors=['architect'],
             relations=['designed by'], answer_attribute='born')
  assert '2. Ustad Ahmad Lahauri (an architect; Taj Mahal designed by Ustad Ahmad Lahauri)\n' in lq.canonical_prompt(
      rec, prompts.load('canonical_question_v1'))


def test_unique_referent_judge_sees_only_the_question():
  questions = ['Q-yes?', 'Q-no?', 'Q-bare-no?', 'Q-garbage?', 'Q-down?']
  recs = [dict(_record(f'r{k}'), question=q) for k, q in enumerate(questions)]
  recs.append(dict(_record('r9', rejected='rewrite: leak: x'), question='Q-old?'))
  script = {'Q-yes?': '{"verdict": "yes", "reason": "one unit, one person"}',
            'Q-no?': '```json\n{"verdict": "no", "reason": "several  countries fit"}\n```',
            'Q-bare-no?': '<think>hmm, many fit</think> No',
            'Q-garbage?': 'Maybe, who knows.',
            'Q-down?': (None, 'http_500: boom')}
  client = ScriptedChatClient(script)
  out, counts = lq.unique_referent(recs, _config(), client=client)
  assert [r['rejected'] for r in out] == [
      None, 'unique_referent: ambiguous (several countries fit)', 'unique_referent: ambiguous (no reason given)',
      'unique_referent: unparseable judge reply', 'unique_referent: judge error (http_500: boom)',
      'rewrite: leak: x']
  assert json.loads(out[0]['referent_verdict']) == {'verdict': 'yes', 'reason': 'one unit, one person'}
  assert json.loads(out[3]['referent_verdict'])['reply'] == 'Maybe, who knows.' and out[5]['referent_verdict'] == ''
  assert counts['judged'] == 5 and counts['unique'] == 1
  assert counts['rejected'] == {'unique_referent: ambiguous': 2, 'unique_referent: unparseable judge reply': 1,
                                'unique_referent: judge error': 1}
  template = prompts.load('unique_referent_v1')
  assert sorted(client.prompts) == sorted(template.format(question=q) for q in questions)
  assert not any(word in p for p in client.prompts for word in ('1889', 'Hitler', 'Luftwaffe', 'Taj'))


def test_parse_verdict():
  assert lq.parse_verdict('{"verdict": "no", "reason": "two fit"}') == (False, 'two fit')
  assert lq.parse_verdict('Yes') == (True, '')
  assert lq.parse_verdict('{"verdict": "perhaps"}')[0] is None
  assert lq.parse_verdict(None) == (None, 'no reply')


def test_offline_and_disabled_ask_nothing():
  recs = [dict(_record('r0'), question='Q?'), dict(_record('r1', rejected='x'), question='Q?')]
  out, counts = lq.canonical_questions(recs, _config())
  assert counts['skipped'] == {'no endpoint': 1} and counts['llm_written'] == 0
  assert [r['canonical_question_source'] for r in out] == ['template: no endpoint', '']
  assert out[0]['canonical_question'] == recs[0]['canonical_question']
  out, counts = lq.unique_referent(recs, _config(enabled=False, base_url='http://x/v1', model='m'))
  assert counts['skipped'] == {'disabled': 1} and [r['rejected'] for r in out] == [None, 'x']


def test_bad_input_and_config_are_refused_naming_them():
  with pytest.raises(ValueError, match="record 'r0' has no field"):
    lq.unique_referent([_record('r0')], _config(), client=ScriptedChatClient({}))
  with pytest.raises(ValueError, match='data.llm_questions.judge_prompt'):
    lq.check_config(_config(judge_prompt='no_such_prompt_v3'))
  with pytest.raises(ValueError, match='data.llm_questions.model is empty'):
    lq.check_config(_config(base_url='http://127.0.0.1:1/v1'))
  lq.check_config(_config())


def test_refused_connections_and_the_request_budget_become_counted_reasons():
  config = _config(base_url=f'http://127.0.0.1:{free_port()}/v1', model='m', max_retries=1, retry_backoff_s=0.0,
                   max_requests=5, max_concurrency=1)
  recs = [dict(_record(f'r{k}'), question=f'Q{k}?') for k in range(4)]
  out, counts = lq.canonical_questions(recs, config)
  # 2 items x (1 + 1 retry) use 4 requests, the third its last one and no retry, the fourth none.
  assert counts['llm']['requests'] == 5 and counts['llm']['budget_refused'] == 2
  assert counts['fallback'] == {'llm_question: request failed': 4}
  assert sorted(r['canonical_question_source'].split(' (')[1] for r in out) == (
      ['budget: requests)'] * 2 + ['connection: Connection error.)'] * 2)
  out, counts = lq.unique_referent(recs, _config(base_url=config.base_url, model='m', max_retries=0,
                                                 retry_backoff_s=0.0))
  assert counts['rejected'] == {'unique_referent: judge error': 4} and counts['unique'] == 0


def test_against_a_real_tiny_llm_server(tmp_path):
  """`python -m osvl_jax.serve --tiny` (random weights, gibberish replies): both stages run, every accepted item
  gets a counted outcome, nothing raises."""
  recs = [dict(_record(f'r{k}'), question=f'What is the birth year of the person number {k}?') for k in range(3)]
  recs.append(dict(_record('r3', rejected='x'), question='Q?'))
  log_path = tmp_path / 'serve.log'
  with serve_process(log_path, '--bucket=16', '--max_len=512', '--max_new_tokens=8') as (url, proc):
    wait_until(lambda: healthy(url), 300, 'osvl_jax.serve', proc, log_path)
    config = _config(base_url=url + '/v1', model='osvl-jax', max_tokens=8, max_concurrency=3, timeout_s=300.0)
    written, q_counts = lq.canonical_questions(recs, config)
    judged, j_counts = lq.unique_referent(recs, config)
  print('tiny server counts:', json.dumps({'canonical': q_counts, 'unique_referent': j_counts}))
  for counts in (q_counts, j_counts):
    assert counts['llm']['errors'] == 0 and counts['llm']['requests'] == counts['llm']['replies'] == 3, counts
    assert counts['llm']['tokens'] > 0
  assert q_counts['llm_written'] + sum(q_counts['fallback'].values()) == 3
  assert all(r['canonical_question_source'] for r in written[:3]) and written[3]['canonical_question_source'] == ''
  assert j_counts['unique'] + sum(j_counts['rejected'].values()) == 3
  assert all(r['referent_verdict'] for r in judged[:3]) and judged[3]['rejected'] == 'x'


def test_answer_obfuscation_asks_a_seeded_share_for_the_decade():
  ref = 'the political figure mentioned in the article on {x}'
  born = {'answer_attribute': 'born', 'answers': ['1889', 'April 20, 1889'], 'rejected': None,
          'question_template': 'What is the birth year of ' + ref.format(x='{E0}') + '?',
          'question': 'What is the birth year of ' + ref.format(x='Taj Mahal') + '?', 'rewrite_trace': ['t']}
  capital = dict(born, answer_attribute='capital', answers=['Agra'], question='What is the capital of X?',
                 question_template='What is the capital of {E0}?')
  bc = dict(born, answers=['500 BC'])
  out, counts = lq.obfuscate_answers([born, capital, bc, dict(born, rejected='x')], 1.0, seed=0)
  assert out[0]['question'] == 'In which decade was ' + ref.format(x='Taj Mahal') + ' born?'
  assert out[0]['question_template'] == 'In which decade was ' + ref.format(x='{E0}') + ' born?'
  assert out[0]['answers'] == ['1880s', 'the 1880s'] and out[0]['answer_form'] == 'decade'
  assert out[0]['original_answers'] == ['1889', 'April 20, 1889'] and out[0]['rewrite_trace'][-1] == out[0]['question']
  assert [r['answer_form'] for r in out[1:]] == ['', '', ''] and out[1]['question'] == capital['question']
  assert counts == {'in': 4, 'obfuscated': 1, 'not_obfuscatable': 2, 'kept': 0}
  # The share follows `fraction` and the seed, the same on every run.
  many = [born] * 200
  picked = [r['answer_form'] == 'decade' for r in lq.obfuscate_answers(many, 0.25, seed=3)[0]]
  assert picked == [r['answer_form'] == 'decade' for r in lq.obfuscate_answers(many, 0.25, seed=3)[0]]
  assert picked == [np.random.default_rng([3, 6, i]).random() < 0.25 for i in range(200)]
  assert 30 <= sum(picked) <= 70 and lq.obfuscate_answers(many, 0.0, seed=3)[1]['obfuscated'] == 0
  assert lq.decade('987') == '980s' and lq.decade('1889') == '1880s' and lq.decade('12') is None
  assert lq.decade_question('What is the year of death of X?', 'died') == 'In which decade did X die?'
