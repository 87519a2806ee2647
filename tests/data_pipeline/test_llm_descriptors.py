"""LLM descriptor proposals checked in code and the per-step unique-referent judge (`llm_descriptors.py`), on the
real Wikispeedia walks of seed 0 and against `ChatDouble`, a real OpenAI-compatible HTTP server on 127.0.0.1
whose chat-completions replies each test scripts."""

import json
import re

import ml_collections
import pytest

from data_pipeline import build, llm_descriptors as ld, paths, qa, review, rewrite
from osvl_jax.judges import prompts
from tests.rollout.openai_double import ChatDouble, Reply

CUBA = ['Taj_Mahal', 'Iran', 'Cuba']
CANYON = ['Grand_Canyon', 'Colorado_River', 'Mexico']
TORONTO = ['Toronto', 'Iron', 'Earth', 'Ecuador', 'Peru']
YES = '{"verdict": "yes", "reason": "only one fits"}'


PISA = ['Leaning_Tower_of_Pisa', 'Superman', 'Human', 'Guatemala']
NIAGARA = ['Niagara_Falls', 'Nikola_Tesla', 'Mark_Twain', 'Philippines']


@pytest.fixture(scope='module')
def records(graph, small_config):
  """5 real paths (walks of seed 0 and 1) through the `paths` checks and `qa` (the input of the rewrite stage),
  fixed so that the tests do not follow the walker's draws."""
  recs = []
  for k, path in enumerate((CUBA, PISA, CANYON, TORONTO, NIAGARA)):
    checked = paths.check_path(graph, path)
    assert not isinstance(checked, str), (path, checked)
    recs.append({'prompt_id': f'wiki-s0-{k:05d}', 'landmark': graph.images(path[0])[0].rsplit('.', 1)[0],
                 'image_path': f'{small_config.image_dir}/{graph.images(path[0])[0]}', 'path': path,
                 'hops': len(path) - 1, 'descriptors': checked[0], 'relations': checked[1],
                 'domain': graph.domain(path[0])})
  recs, _ = qa.add_qa(recs, graph, small_config.seed)
  assert recs[0]['descriptors'] == ['Middle Eastern country', 'Caribbean country']
  assert recs[0]['relations'] == ['mentioned most often in', 'mentioned in'] and recs[0]['answers'] == ['Havana']
  return recs


def _config(url='', **kw):
  c = ld.default_config()
  c.update(base_url=url, model='m' if url else '', max_retries=0, retry_backoff_s=0.0, **kw)
  return c


def _judge_fields(body):
  """(question, phrase) of a per-step judge request, None for a proposal request."""
  text = body['messages'][0]['content']
  got = re.search(r'Question so far: (.*)\nDescription just introduced: (.*)\n', text)
  return (got[1], got[2]) if got else None


def _entity(body):
  return re.search(r'^Entity: (.*)$', body['messages'][0]['content'], re.M)[1]


def _run(records, graph, answer, **kw):
  double = ChatDouble(answer)
  with double.serve() as url:
    out, counts = ld.choose_descriptors(records, graph, _config(url, **kw))
  return out, counts, double


def test_check_candidate_decides_each_rule(graph, records):
  rec, persons = records[0], [False, False]
  cases = {
      'island nation of Cuba': "leak (alias of Cuba: 'Cuba')",
      'the Havana-ruled Caribbean country': "leak (answer: 'Havana')",
      'Persian Caribbean country': '',                               # a word, not a name of Iran: no leak
      'Caribbean country (island)': "bad characters ('()')",
      'Caribbean or Latin American country': "'X or Y' ('Caribbean or Latin American country')",
      'Caribbean country that Castro ruled': "relative clause ('Caribbean country that Castro ruled')",
      'Caribbean country': "not more specific ('Caribbean country' does not end with more words before "
                           "'Caribbean country')",
      'communist island nation': "not more specific ('communist island nation' does not end with more words "
                                 "before 'Caribbean country')",
      'very large communist socialist Caribbean country': "too long (4 words before 'Caribbean country', at "
                                                          'most 3)',
  }
  for phrase, why in cases.items():
    got = ld.check_candidate(phrase, 2, rec, graph, persons, 3)
    assert got == ((None, why) if why else (phrase, '')), phrase
  assert ld.check_candidate('The  communist Caribbean country', 2, rec, graph, persons, 3) == (
      'communist Caribbean country', '')
  # The class must be the one the code verified for the hop: Iran's text names Cuba and Venezuela, so
  # 'Latin American country' does not pick Cuba out, and no narrowing of it is accepted.
  other = dict(rec, descriptors=['Middle Eastern country', 'Latin American country'])
  assert ld.check_candidate('communist Latin American country', 2, other, graph, persons, 3) == (
      None, "class not verified ('Latin American country' does not pick Cuba out)")
  assert 'Venezuela' in dict(graph.competitors('Iran', 'Cuba', 'Latin American country'))
  assert dict(graph.competitors('Iran', 'Cuba', 'Caribbean country')) == {'Cuba': 2}


def test_parse_candidates_and_class_of():
  assert ld.parse_candidates('["Mughal  building", "white marble building"]', 3) == (
      ['Mughal building', 'white marble building'], '')
  assert ld.parse_candidates('<think>hm</think>```json\n["a b", "", "c d", "e f"]\n```', 2) == (['a b', 'c d'], '')
  assert ld.parse_candidates('[]', 3) == ([], '')
  assert ld.parse_candidates('Mughal building', 3) == (None, 'not JSON')
  assert ld.parse_candidates('{"descriptors": ["Mughal building"]}', 3) == (None, 'not a list of strings')
  assert ld.parse_candidates('["Mughal building", 3]', 3) == (None, 'not a list of strings')
  assert ld.parse_candidates(None, 3) == (None, 'no reply')
  cuba = ('Latin American country', 'Caribbean country', 'country')
  assert ld.class_of('communist Caribbean country', cuba) == 'Caribbean country'
  assert ld.class_of('Caribbean country', cuba) == 'Caribbean country'
  assert ld.class_of('island nation', cuba) is None


def test_proposals_are_checked_in_code_and_a_good_one_is_used_in_the_question(graph, records):
  def answer(body, n):
    if _judge_fields(body):
      return YES
    return {'Cuba': '["island nation of Cuba", "Caribbean or Latin American country", "communist Caribbean country"]',
            'Iran': 'Iran is a Persian country.'}.get(_entity(body), '[]')
  out, counts, double = _run(records, graph, answer)
  assert out[0]['descriptors'] == ['Middle Eastern country', 'communist Caribbean country']
  assert out[0]['descriptor_sources'] == ['code', 'llm']
  checks = json.loads(out[0]['descriptor_checks'])
  assert checks[0]['error'] == 'llm_descriptor: malformed reply (not JSON)' and checks[0]['proposed'] == []
  assert checks[1]['refused'] == [['island nation of Cuba', "leak (alias of Cuba: 'Cuba')"],
                                  ['Caribbean or Latin American country',
                                   "'X or Y' ('Caribbean or Latin American country')"]]
  assert checks[1]['judged'] == [['communist Caribbean country', 'yes', 'only one fits']]
  # The other items keep the code's descriptors ([] proposed), all judged unique.
  for got, rec in zip(out[1:], records[1:]):
    assert got['descriptors'] == rec['descriptors'] and set(got['descriptor_sources']) == {'code'}
  hops = sum(len(r['path']) - 1 for r in records)
  assert hops == 14
  assert counts['hops'] == 14 and counts['proposed'] == 3 and counts['passed'] == 1
  assert counts['refused'] == {'llm_descriptor: leak': 1, "llm_descriptor: 'X or Y'": 1}
  assert counts['fallback'] == {'llm_descriptor: malformed reply': 1, 'llm_descriptor: none proposed': 12}
  assert counts['used'] == {'llm': 1, 'code': 13} and counts['judged_steps'] == 14 and counts['rejected'] == {}
  assert counts['llm']['requests'] == 28 and counts['llm']['errors'] == 0
  # The proposal saw the entity's title, its class and its article's lead; the judge the partial question.
  cuba = next(b['messages'][0]['content'] for b in double.bodies if not _judge_fields(b) and _entity(b) == 'Cuba')
  assert 'Its class: Caribbean country' in cuba and ' '.join(graph.text('Cuba')[:200].split()) in cuba
  asked = [_judge_fields(b) for b in double.bodies if _judge_fields(b) and 'Caribbean' in _judge_fields(b)[0]]
  assert asked == [
      ('What is the capital of the communist Caribbean country mentioned in the article on Iran?',
       'the communist Caribbean country mentioned in the article on Iran'),
      ('What is the capital of the communist Caribbean country mentioned in the article on the Middle Eastern '
       'country mentioned most often in the article on Taj Mahal?',
       'the Middle Eastern country mentioned most often in the article on Taj Mahal')]
  item = rewrite.rewrite(out, graph)[0][0]
  assert item['question'] == asked[-1][0] and item['rejected'] is None
  # The review counts an LLM descriptor's competitors in the class it ends with.
  hops = review.review_item(graph, item, {paths.answer_chain(CUBA): 1})['hops']
  assert [(h['descriptor'], h['referent'], h['descriptor_check'], [(m['key'], m['count']) for m in h['competitors']])
          for h in hops] == [('Middle Eastern country', 'most often', 'fits', [('Iran', 3), ('Syria', 1)]),
                             ('communist Caribbean country', 'unique', 'fits', [('Cuba', 2)])]


def test_a_step_judge_no_tries_the_next_candidate_and_rejects_when_none_is_left(graph, records):
  def answer(body, n):
    fields = _judge_fields(body)
    if fields is None:
      return '["communist Caribbean country"]' if _entity(body) == 'Cuba' else '[]'
    question, phrase = fields
    if phrase.startswith('the communist'):
      return '{"verdict": "no", "reason": "two communist states in the Caribbean"}'
    if phrase.endswith('the article on Grand Canyon'):
      return '```json\n{"verdict": "no", "reason": "several places fit"}\n```'
    return YES
  out, counts, _ = _run(records, graph, answer)
  assert out[0]['descriptors'] == records[0]['descriptors'] and out[0]['descriptor_sources'] == ['code', 'code']
  assert json.loads(out[0]['descriptor_checks'])[1]['judged'] == [
      ['communist Caribbean country', 'no', 'two communist states in the Caribbean'],
      ['Caribbean country', 'yes', 'only one fits']]
  assert out[0]['rejected'] is None
  # Grand Canyon -> Colorado River: the judge refuses the code's descriptor at hop 1 (after hop 2 passed).
  assert out[2]['rejected'] == 'unique_referent_step: ambiguous (hop 1: several places fit)'
  assert [c['judged'] for c in json.loads(out[2]['descriptor_checks'])] == [
      [['North American place', 'no', 'several places fit']], [['Latin American country', 'yes', 'only one fits']]]
  assert out[2]['descriptors'] == records[2]['descriptors'] and out[2]['descriptor_sources'] == []
  assert counts['rejected'] == {'unique_referent_step: ambiguous': 1}
  assert counts['used'] == {'llm': 0, 'code': 12} and counts['judged_steps'] == 15
  rewritten, rw_counts = rewrite.rewrite(out, graph)
  assert rw_counts['rewritten'] == 4 and rw_counts['skipped'] == 1 and rewritten[2]['question'] == ''


def test_failed_requests_are_counted_reasons(graph, records):
  def answer(body, n):
    fields = _judge_fields(body)
    if fields is None:
      return Reply(status=500) if _entity(body) == 'Cuba' else '[]'
    if 'the article on Toronto' in fields[1]:
      return Reply(status=500)
    return YES
  out, counts, _ = _run(records, graph, answer)
  assert json.loads(out[0]['descriptor_checks'])[1]['error'].startswith('llm_descriptor: request failed (')
  assert counts['fallback']['llm_descriptor: request failed'] == 1 and out[0]['rejected'] is None
  assert out[3]['rejected'].startswith('unique_referent_step: judge error (')
  assert [r['rejected'] is None for r in out] == [True, True, True, False, True]
  assert counts['rejected'] == {'unique_referent_step: judge error': 1}
  assert counts['llm']['errors'] == 2


def test_an_unparseable_judge_reply_rejects_the_item(graph, records):
  out, counts, _ = _run(records[:1], graph, lambda body, n: 'Maybe.' if _judge_fields(body) else '[]')
  assert out[0]['rejected'] == 'unique_referent_step: unparseable judge reply'
  assert counts['rejected'] == {'unique_referent_step: unparseable judge reply': 1}


def test_offline_disabled_and_no_rewrite_leave_the_records_as_they_were(graph, records):
  recs = records + [dict(records[0], prompt_id='x', rejected='qa: no answer')]
  for config, rewrite_on, why in ((_config(), True, 'no endpoint'),
                                  (_config('http://127.0.0.1:9/v1', enabled=False), True, 'disabled'),
                                  (_config('http://127.0.0.1:9/v1'), False, 'rewrite disabled')):
    out, counts = ld.choose_descriptors(recs, graph, config, rewrite_on)
    assert out == recs and all(set(a) == set(b) for a, b in zip(out, recs))   # no new field, nothing changed
    assert counts == {'in': 6, 'accepted_in': 5, 'skipped_rejected': 1, 'endpoint': config.base_url,
                      'skipped': {why: 5}}
  # The rewrite of the offline output is the rewrite without this step, record for record.
  assert rewrite.rewrite(ld.choose_descriptors(recs, graph, _config())[0], graph) == rewrite.rewrite(recs, graph)


def test_bad_config_values_are_refused_naming_the_field():
  ld.check_config(_config())
  for field, value, match in (('max_candidates', 0, 'max_candidates=0'), ('max_extra_words', 0, 'max_extra_words=0'),
                              ('lead_chars', 10, 'lead_chars=10'),
                              ('judge_prompt', 'no_such_v1', 'judge_prompt'),
                              ('proposal_prompt', 'no_such_v1', 'proposal_prompt')):
    with pytest.raises(ValueError, match=f'data.llm_descriptors.{match}'):
      ld.check_config(_config(**{field: value}))
  with pytest.raises(ValueError, match="data.llm_descriptors.enabled='yes'"):   # a section written by hand
    ld.check_config(ml_collections.ConfigDict(dict(_config().to_dict(), enabled='yes')))
  config = build.default_config()
  config.llm_descriptors.base_url = 'http://127.0.0.1:9/v1'
  with pytest.raises(ValueError, match='data.llm_descriptors.model is empty'):
    build.check_config(config)
  assert prompts.fields('descriptor_proposal_v1') == {'title', 'descriptor', 'lead', 'max_candidates',
                                                      'max_extra_words'}
  assert prompts.fields('unique_referent_step_v1') == {'question', 'phrase'}
