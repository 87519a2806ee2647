"""Judging for evaluation: rule-judge hard cases, malformed judge replies, the versioned prompt files."""

import pytest

from osvl_jax.judges import llm, prompts, rule


@pytest.mark.parametrize('response, answers', [
    ('It opened on 20 November 2009.', ['2009-11-20']),
    ('2009-11-20', ['20 November 2009']),
    ('Nov. 20, 2009', ['2009-11-20']),
    ('November 20th, 2009', ['20 November 2009']),
    ('THE EIFFEL TOWER!!', ['Eiffel Tower']),
    ('Tour Eiffel', ['Eiffel Tower', 'Tour Eiffel']),  # an alias
    ('Tejo', ['Tagus River', 'Tajo', 'Tejo']),
    ('Sao Paulo', ['São Paulo']),
    ('the U.S.', ['US']),
    ('1,234,567 people', ['1234567']),
    ('about 2.3 million', ['2,300,000']),
])
def test_rule_judge_accepts(response, answers):
  assert rule.accuracy(response, answers) == 1.0


@pytest.mark.parametrize('response, answers', [
    ('1969', ['1950']),           # small integers (years) must match exactly
    ('Parisian', ['Paris']),     # word boundaries
    ('2009-11-21', ['20 November 2009']),
    ('', ['Agra']),
    (None, ['Agra']),
])
def test_rule_judge_rejects(response, answers):
  assert rule.accuracy(response, answers) == 0.0


def test_numbers_within_ten_percent_as_infoseek_allows():
  assert rule.accuracy('about 1.9 m', ['1.82'], rel_tol=0.1) == 1.0
  assert rule.accuracy('2.1 m', ['1.82'], rel_tol=0.1) == 0.0
  assert rule.accuracy('1.9 m', ['1.82']) == 0.0  # the training default stays at 1%
  ranges = [[163.8, 200.2]]  # InfoSeek answer_eval range of 182
  assert rule.accuracy('It is 195 metres tall', [], ranges=ranges) == 1.0
  assert rule.accuracy('It is 210 metres tall', ['182'], ranges=ranges) == 0.0


@pytest.mark.parametrize('text', [
    '', None, '   ', 'Maybe.', 'Correct or Incorrect', '<think>Correct</think>', 'I have no idea about it',
    '{"score": 1}', '{"verdict": "unsure"}', 'The grader could not decide.', 'The answer matches. Correct',
    'so it is not correct',
])
def test_unparseable_accuracy_replies_are_judge_errors(text):
  with pytest.raises(llm.JudgeParseError):
    llm.parse_binary(text)


@pytest.mark.parametrize('text, want', [
    ('Correct', 1.0), ('**Incorrect**', 0.0), ('no', 0.0), ('Yes.', 1.0), ('{"verdict": "Correct"}', 1.0),
    ('{"is_correct": false}', 0.0),
])
def test_parseable_accuracy_replies(text, want):
  assert llm.parse_binary(text) == want


@pytest.mark.parametrize('text', ['Relevance: 0.8\nSpecificity: 0.6', 'Score: 3/0', 'Score: 250', 'great job'])
def test_unparseable_score_replies_are_judge_errors(text):
  with pytest.raises(llm.JudgeParseError):
    llm.parse_score(text)


def test_four_dimension_reply_reads_the_final_score():
  reply = 'Relevance: 0.8\nSpecificity: 0.6\nProgression: 1\nTool fit: 0.6\nScore: 0.75'
  assert llm.parse_score(reply) == pytest.approx(0.75)


def test_prompt_files_are_versioned_and_formattable():
  assert prompts.versioned_name('accuracy') == 'accuracy_v3'   # the latest: the paper's protocol as described
  assert prompts.versions('accuracy') == [1, 2, 3] and prompts.versions('query_quality') == [1, 2, 3, 4]
  assert llm.ACCURACY_PROMPT == prompts.load('accuracy_v2') and llm.QUERY_PROMPT == prompts.load('query_quality_v3')
  text = prompts.load('query_quality_v2').format(question='q', calls='[1] text_search {}')
  assert all(d in text for d in ('Relevance', 'Specificity', 'Progression', 'Tool fit')) and 'Score:' in text
  text = prompts.load('query_quality_v3').format(question='q', answers='a', final_answer='f', trajectory='Step 1',
                                                  search_tools='text_search, image_search')
  assert all(c in text for c in ('Image-search utility', 'Text-search utility', 'Query progression',
                                 'Image-text complementarity', 'Evidence-to-noise ratio'))
  assert [line.split(' = ')[0] for line in text.splitlines() if ' = ' in line] == ['0.0', '0.3', '0.5', '0.7', '1.0']
  assert prompts.fields('accuracy_v2') == prompts.fields('accuracy_v1') == {'question', 'answers', 'response'}
  assert prompts.fields('query_quality_v1') == {'question', 'calls'}
  text = prompts.load('process_v1').format(question='q', answers='a', transcript='[1] ...')
  assert all(d in text for d in ('Grounding', 'Necessity', 'Coherence', 'Faithfulness'))
  system = prompts.load('agent_system_v1')
  assert "Verify, don't guess" in system and 'crop' in system and 'sharpen' in system
  assert 'perspective_correct' in system
  with pytest.raises(ValueError, match='not found'):
    prompts.load('accuracy_v9')
