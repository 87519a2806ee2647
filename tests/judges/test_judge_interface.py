"""The one judge interface (`osvl_jax/judges/base.py`): process scoring, benchmark hints, `describe()` and the
shared OpenAI-compatible client are declared for every judge, so callers never probe a judge's class or attributes.
The LLM judge talks to a real HTTP endpoint on 127.0.0.1 (`tests/rollout/openai_double.py`)."""

import hashlib

import numpy as np
import pytest

from osvl_jax import openai_client
from osvl_jax import trajectory as tj
from osvl_jax.judges import base as judges_base
from osvl_jax.judges import llm, prompts, registry, rule
from tests.rollout.openai_double import ChatDouble, Reply
from tools import base as tools_base

SEARCH = tj.render_assistant_text('Look it up.', tool_call={'name': 'text_search', 'arguments': {'query': 'Agra'}})
ANSWER = tj.render_assistant_text('It is Agra.', response='Agra')


def _trajectory():
  builder = tj.TrajectoryBuilder(tj.load_tokenizer(), tj.ImageProcessor(min_pixels=32 * 32, max_pixels=64 * 64), [])
  builder.start('Which city is this?', np.zeros((32, 32, 3), np.uint8))
  builder.append_assistant_text(SEARCH)
  builder.append_observation(tools_base.ToolResult(ok=True, text='[1] Agra: a city on the Yamuna'))
  builder.append_assistant_text(ANSWER)
  return builder.finish(answers=['Agra'])


def _llm(url, **overrides):
  return registry.get_judge({'name': 'llm', 'base_url': url, 'model': 'judge-model', 'max_retries': 1,
                             'retry_backoff_s': 0.0, **overrides})


def test_process_scoring_is_declared_on_every_judge():
  traj = _trajectory()
  assert judges_base.Judge().process_quality('q', traj.steps, ['Agra']) is None        # the default: none
  assert rule.RuleJudge().process_quality(traj.question, traj.steps, ['Agra']) is None  # the rule judge has none
  double = ChatDouble(lambda body, n: 'Score: 0.8')
  with double.serve() as url:
    verdict = _llm(url).process_quality(traj.question, traj.steps, ['Agra'])
  assert verdict == judges_base.Verdict(0.8, None, 'Score: 0.8')
  prompt = double.bodies[0]['messages'][0]['content']   # process_v1 over the transcript of every step
  assert llm.format_transcript(traj.steps) in prompt and '-> ok: [1] Agra: a city on the Yamuna' in prompt


def test_a_failed_process_judgement_is_an_error_never_a_score():
  traj = _trajectory()
  double = ChatDouble(lambda body, n: Reply(status=503))
  with double.serve() as url:
    verdict = _llm(url).process_quality(traj.question, traj.steps, ['Agra'])
  assert verdict.score == 0.0 and 'http_503' in verdict.error and url in verdict.error and len(double.bodies) == 2


def test_hints_reach_the_rule_judge_and_the_llm_judges_fallback():
  judge = rule.RuleJudge()
  assert judge.accuracy('How many?', 'About 24,000.', ['25000']).score == 0.0           # the default 1e-2 tolerance
  assert judge.accuracy('How many?', 'About 24,000.', ['25000'], hints={'numeric_tolerance': 0.1}).score == 1.0
  assert judge.accuracy('Which?', 'B', ['Paris'], hints={'gold_letter': 'B', 'other': 1}).score == 1.0
  assert judge.accuracy('Which?', '5 km', ['x'], hints={'numeric_ranges': [[4, 6]]}).score == 1.0
  assert judge.stats()['calls'] == 4
  double = ChatDouble(lambda body, n: Reply(status=500))
  with double.serve() as url:
    verdict = _llm(url, max_retries=0).accuracy('Which?', 'B', ['Paris'], hints={'gold_letter': 'B'})
  assert verdict.error is not None and verdict.score == 1.0   # on_error='rule': the rule judge, hints included
  assert 'gold_letter' not in double.bodies[0]['messages'][0]['content']


def test_describe_says_what_decides_a_verdict_and_nothing_else():
  assert rule.RuleJudge().describe() == {'name': 'rule', 'class': 'osvl_jax.judges.rule.RuleJudge',
                                         'prompt_names': {}, 'prompts': {}, 'settings': {}}
  judge = _llm('http://127.0.0.1:1/v1', prompts={'accuracy': 'accuracy_v1'})   # nothing is sent
  d = judge.describe()
  assert (d['name'], d['class']) == ('llm', 'osvl_jax.judges.llm.LLMJudge')
  assert d['prompt_names'] == {'accuracy': 'accuracy_v1', 'process': 'process_v1', 'query_quality': 'query_quality_v3'}
  assert d['prompts']['accuracy'] == hashlib.sha256(prompts.load('accuracy_v1').encode()).hexdigest()[:16]
  assert (d['settings']['model'], d['settings']['base_url'], d['settings']['temperature']) == (
      'judge-model', 'http://127.0.0.1:1/v1', 0.0)
  assert not set(d['settings']) & set(llm.OPERATIONAL_FIELDS)   # how a verdict is reached does not decide it
  assert _llm('http://127.0.0.1:1/v1', timeout_s=5.0, max_retries=7).describe()['settings'] == _llm(
      'http://127.0.0.1:1/v1').describe()['settings']
  assert _llm('http://127.0.0.1:1/v1', model='other').describe() != _llm('http://127.0.0.1:1/v1').describe()


def test_the_llm_judge_uses_the_shared_client_with_its_budget_and_usage():
  double = ChatDouble(lambda body, n: Reply('Correct', usage={'prompt_tokens': 40, 'completion_tokens': 2,
                                                              'total_tokens': 42}))
  with double.serve() as url:
    judge = _llm(url, max_requests=2, max_concurrency=3)
    assert isinstance(judge.client, openai_client.ChatClient) and judge.client.max_concurrency == 3
    assert judge.accuracy('q1', 'Agra', ['Agra']).score == 1.0
    assert judge.accuracy('q2', 'Agra', ['Agra']).score == 1.0
    spent = judge.accuracy('q3', 'It is Agra', ['Agra'])
  assert len(double.bodies) == 2 and 'budget max_requests=2 is spent' in spent.error and spent.score == 1.0
  assert judge.stats() == {'calls': 3, 'errors': 1, 'retries': 0, 'cache_hits': 0}
  usage = judge.client.usage()
  assert (usage['requests'], usage['prompt_tokens'], usage['completion_tokens'], usage['budget_refused']) == (
      2, 80, 4, 1)


@pytest.mark.parametrize('field', ['timeout_s', 'max_concurrency'])
def test_an_out_of_range_client_limit_is_refused_when_the_judge_is_built(field):
  with pytest.raises(ValueError, match=f'{field}=0'):
    _llm('http://127.0.0.1:1/v1', **{field: 0})


def test_usage_counts_what_the_endpoint_reported_and_a_local_judge_costs_nothing():
  assert rule.RuleJudge().usage() == judges_base.Judge().usage() == dict.fromkeys(judges_base.USAGE_FIELDS, 0)
  double = ChatDouble(lambda body, n: Reply(text='Correct', usage={'prompt_tokens': 30, 'completion_tokens': 2,
                                                                   'total_tokens': 32}))
  with double.serve() as url:
    judge = _llm(url)
    judge.accuracy('Which city?', 'Agra', ['Agra'])
    judge.accuracy('Which river?', 'Yamuna', ['Yamuna'])
  assert judge.usage() == {'requests': 2, 'prompt_tokens': 60, 'completion_tokens': 4, 'total_tokens': 64}
