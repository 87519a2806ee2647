"""How a judge's reply is read (issue 48): a table of replies, each with the outcome it must give.

Accuracy replies read as yes (1.0), no (0.0) or a judge error (`JudgeParseError`, never a verdict); query-judge
replies as a score in [0, 1] or a judge error. The rule (`llm.parse_binary`, `llm.parse_score`): the paper's
template line (`correct: <v>` / `score: <x>`, its bracket, quote, markdown and case variants; the LAST such line
decides), a JSON object (fenced or single-quoted too), or a reply that is only the value; free prose never is a
verdict. Each test reports every misread reply at once.
"""

import math

import pytest

from osvl_jax.judges import llm, registry
from tests.rollout.openai_double import ChatDouble

ERROR = 'judge error'

ACCURACY_TABLE = [
    # the paper's template (PAPER.md: a line `correct: yes|no`, then a short reasoning)
    ('correct: yes\nreasoning: The response names Agra.', 'yes'),
    ('correct: no\nreasoning: The response names Delhi.', 'no'),
    ('Correct: Yes\nReasoning: Agra is named.', 'yes'),
    ('CORRECT: NO', 'no'),
    ('correct:no', 'no'),
    ('correct : yes', 'yes'),
    ('CORRECT = NO', 'no'),
    ('Correct: no\r\nReasoning: Delhi.', 'no'),
    ('correct: Yes!', 'yes'),
    # bracket, quote and code variants of the value (Fig. 8 writes `correct: [yes/no]`)
    ('correct: [no]\nreasoning: It names Delhi.', 'no'),
    ('correct: [yes]', 'yes'),
    ('correct: <no>', 'no'),
    ('correct: <yes>', 'yes'),
    ('correct: "no"', 'no'),
    ("correct: 'yes'", 'yes'),
    ('correct: `no`', 'no'),
    ('correct: (no)', 'no'),
    ('correct: [ No ]', 'no'),
    # markdown around the line or its parts
    ('**correct:** no', 'no'),
    ('**Correct: No**\n**Reasoning:** Delhi is not Agra.', 'no'),
    ('correct: **yes**', 'yes'),
    ('__correct__: no', 'no'),
    ('- correct: no\n- reasoning: Delhi.', 'no'),
    ('### Correct: yes', 'yes'),
    ('> correct: yes', 'yes'),
    ('`correct: no`\n`reasoning: Delhi.`', 'no'),
    ('```\ncorrect: no\nreasoning: The response names Delhi.\n```', 'no'),
    # true / false for yes / no
    ('correct: false\nreasoning: Delhi.', 'no'),
    ('correct: True', 'yes'),
    # punctuation or reasoning after the value on its line
    ('correct: no.\nreasoning: Delhi.', 'no'),
    ('correct: yes, the response names Agra.', 'yes'),
    ('correct: no (the response names Delhi, not Agra)', 'no'),
    ('correct: yes reasoning: the response names Agra.', 'yes'),
    # the reasoning's words never decide: the template line does, wherever it stands
    ('correct: no\nreasoning: The response is correct about the city but gives the wrong year.', 'no'),
    ('correct: yes\nreasoning: It is not incorrect to call it Agra; no other city is named.', 'yes'),
    ('correct: no\nreasoning: The correct answer is Agra; the response says Delhi.', 'no'),
    ('correct: no\nreasoning: The response writes "correct: yes" but names Delhi.', 'no'),
    ('reasoning: The response names Agra.\ncorrect: yes', 'yes'),
    # several template lines: the last one (the judge's conclusion) decides
    ('correct: yes\nreasoning: Wait, the response names Delhi in the end.\ncorrect: no', 'no'),
    ('correct: no\nreasoning: On a second reading it settles on Agra.\ncorrect: yes', 'yes'),
    ('correct: <yes or no>\ncorrect: no\nreasoning: Delhi.', 'no'),
    # JSON, bare, fenced, single-quoted (json-repair), embedded in prose over several lines
    ('{"correct": "no", "reasoning": "It names Delhi."}', 'no'),
    ('{"correct": false}', 'no'),
    ('{"correct": true}', 'yes'),
    ('```json\n{"correct": "no", "reasoning": "Delhi"}\n```', 'no'),
    ("{'correct': 'no', 'reasoning': 'Delhi'}", 'no'),
    ("```json\n{'correct': 'yes'}\n```", 'yes'),
    ('{"correct": "[no]"}', 'no'),
    ('{"verdict": "Incorrect"}', 'no'),
    ('{"is_correct": 0}', 'no'),
    ('Here is my verdict:\n```json\n{\n  "correct": "no",\n  "reasoning": "Delhi"\n}\n```', 'no'),
    # a reply that is only the value (accuracy_v1 asks for one word)
    ('Correct', 'yes'),
    ('**Incorrect**', 'no'),
    ('Incorrect.', 'no'),
    ('no', 'no'),
    ('Yes.', 'yes'),
    ('[no]', 'no'),
    ('1', 'yes'),
    ('0', 'no'),
    ('Not correct.', 'no'),
    # reasoning in <think> blocks is dropped
    ('<think>It says Delhi, so correct: no</think>\ncorrect: yes\nreasoning: It settles on Agra.', 'yes'),
    ('<think>maybe incorrect? no</think>Correct', 'yes'),
    ('<think>correct: yes</think>', ERROR),
    ('<think>Correct</think>', ERROR),
    ('<think>unfinished reasoning\ncorrect: yes', ERROR),
    # free prose is never a verdict (a judge that always writes the first one would score 100% Pass@1)
    ('Incorrect. The correct answer is Agra.', ERROR),
    ('The response does not contain the correct answer.', ERROR),
    ('The response contains the correct answer.', ERROR),
    ('The response is correct.', ERROR),
    ('It is not correct.', ERROR),
    ('The answer matches. Correct', ERROR),
    ('Correct or Incorrect', ERROR),
    ('I cannot tell whether the response is correct.', ERROR),
    ('Correct answer: Agra', ERROR),
    ('Verdict: no', ERROR),
    ('yes and no', ERROR),
    ('Maybe.', ERROR),
    # a template line whose value is not one verdict, the last line included
    ('correct: <yes or no>\nreasoning: <one or two sentences on why>', ERROR),
    ('correct: yes/no', ERROR),
    ('correct: yes, no', ERROR),
    ('correct: partially\nreasoning: The year is missing.', ERROR),
    ('correct: yes\nreasoning: The reference is Agra.\ncorrect: maybe', ERROR),
    ('correct: yes\nreasoning: The reference is Agra.\nCorrect: The response names Agra.', ERROR),
    ('correct:\nyes', ERROR),
    ('correct: ✓', ERROR),
    # JSON without a readable verdict
    ('{"correct": "maybe"}', ERROR),
    ('{"reasoning": "It names Agra."}', ERROR),
    ('{"score": 1}', ERROR),
    ('{"correct": 2}', ERROR),
    ('[{"correct": "yes"}]', ERROR),
    # nothing
    ('', ERROR),
    ('   ', ERROR),
    (None, ERROR),
]

SCORE_TABLE = [
    # the paper's template (PAPER.md: a line `score: <float>`, then `reasoning:`)
    ('score: 0.7\nreasoning: Most results are relevant.', 0.7),
    ('Score: 1', 1.0),
    ('SCORE: 0.5\nReasoning: mixed.', 0.5),
    ('score: 0', 0.0),
    ('score: .7', 0.7),
    ('score: 0.7.', 0.7),
    ('score = 0.5', 0.5),
    # bracket, quote and markdown variants
    ('score: [0.7]', 0.7),
    ('score: <0.3>', 0.3),
    ('score: "0.5"', 0.5),
    ('**Score:** 0.7', 0.7),
    ('score: **0.7**', 0.7),
    ('- score: 0.3', 0.3),
    # an explicit scale
    ('score = 7/10', 0.7),
    ('score: 70%', 0.7),
    ('**Score:** 70%', 0.7),
    ('score: 0.7 out of 1', 0.7),
    # reasoning after the value on its line, or on later lines with numbers of its own
    ('score: 0.7 (a good strategy)', 0.7),
    ('score: 0.70, reasoning: most results relevant.', 0.7),
    ('score: 0.3\nreasoning: mostly noise; the score would be 0.7 with one more relevant hit.', 0.3),
    ('reasoning: two good searches.\nscore: 0.7', 0.7),
    ('Relevance: 0.8\nSpecificity: 0.6\nProgression: 1\nTool fit: 0.6\nScore: 0.75', 0.75),
    # several template lines: the last one decides
    ('score: 0.3\nreasoning: on reflection the image search helped.\nscore: 0.5', 0.5),
    ('score: 0.7\nscore: 0.7', 0.7),
    ('<think>score: 0.9</think>\nscore: 0.3', 0.3),
    # JSON, bare, fenced, single-quoted, a numeric string
    ('{"score": 0.25}', 0.25),
    ('```json\n{"score": 0.4, "reasoning": "two relevant hits"}\n```', 0.4),
    ("{'score': 0.6}", 0.6),
    ('{"score": "0.5"}', 0.5),
    # a reply that is only the value
    ('0.4', 0.4),
    ('60%', 0.6),
    # a value outside [0, 1] (no scale is guessed), a broken scale, several values
    ('score: 7', ERROR),
    ('8', ERROR),
    ('score: 1.5', ERROR),
    ('score: -0.2', ERROR),
    ('Score: -1', ERROR),
    ('Score: 250', ERROR),
    ('Score: 3/0', ERROR),
    ('score: 11/10', ERROR),
    ('score: 150%', ERROR),
    ('{"score": 7}', ERROR),
    ('{"score": true}', ERROR),
    ('{"score": NaN}', ERROR),
    ('score: 0,7', ERROR),
    ('score: 0.5-0.7', ERROR),
    ('score: 0.3 or 0.5', ERROR),
    ('score: 0.7\nreasoning: targeted.\nscore: high', ERROR),
    ('score: <a number between 0 and 1>\nreasoning: <2-3 sentences>', ERROR),
    # free prose, other keys
    ('The score is 0.7.', ERROR),
    ('I would say 3 out of 4', ERROR),
    ('A score of 1.0 would need targeted searches; these deserve 0.5.', ERROR),
    ('Final score: 0.7', ERROR),
    ('Image-search score: 0.3\nText-search score: 0.6', ERROR),
    ('Relevance: 0.8\nSpecificity: 0.6', ERROR),
    ('great job', ERROR),
    ('{"reasoning": "good"}', ERROR),
    ('', ERROR),
    (None, ERROR),
]


def _outcome(parse, reply):
  try:
    return parse(reply)
  except llm.JudgeParseError:
    return ERROR


def _misreads(parse, table, same):
  misread = []
  for reply, want in table:
    got = _outcome(parse, reply)
    if not same(got, want):
      misread.append(f'{reply!r}: want {want!r}, got {got!r}')
  return misread


def _same_verdict(got, want):
  return got == {'yes': 1.0, 'no': 0.0, ERROR: ERROR}[want]


def _same_score(got, want):
  if ERROR in (got, want):
    return got == want
  return math.isclose(got, want, abs_tol=1e-9)


def test_every_accuracy_reply_reads_as_its_table_outcome():
  assert len(ACCURACY_TABLE) >= 60
  misread = _misreads(llm.parse_binary, ACCURACY_TABLE, _same_verdict)
  assert not misread, f'{len(misread)} of {len(ACCURACY_TABLE)} replies misread:\n' + '\n'.join(misread)


def test_every_score_reply_reads_as_its_table_outcome():
  misread = _misreads(llm.parse_score, SCORE_TABLE, _same_score)
  assert not misread, f'{len(misread)} of {len(SCORE_TABLE)} replies misread:\n' + '\n'.join(misread)


def test_the_last_verdict_of_a_free_text_reply_decides():
  reply = ('The reference is Agra. At first the response proposes Delhi, so my first reading was\n'
           'correct: no\n'
           'but its final sentence settles on Agra, which is the reference answer.\n'
           'correct: yes\n'
           'reasoning: The response ends on Agra.')
  assert llm.parse_binary(reply) == 1.0
  assert llm.parse_binary(reply.replace('correct: no', 'correct: [maybe]')) == 1.0
  flipped = reply.replace('correct: yes', 'correct: X').replace('correct: no', 'correct: yes').replace('correct: X',
                                                                                                       'correct: no')
  assert llm.parse_binary(flipped) == 0.0


def test_a_judge_error_names_the_reply():
  with pytest.raises(llm.JudgeParseError, match='The correct answer is Agra'):
    llm.parse_binary('Incorrect. The correct answer is Agra.')
  with pytest.raises(llm.JudgeParseError, match=r'outside \[0, 1\]'):
    llm.parse_score('score: 7')


def test_a_judge_that_answers_in_prose_gives_judge_errors_never_a_pass():
  """A judge that always writes "Incorrect. The correct answer is <reference>" once read 1.0 for every item."""
  double = ChatDouble(lambda body, n: 'Incorrect. The correct answer is Agra.')
  with double.serve() as url:
    judge = registry.get_judge({'name': 'llm', 'base_url': url, 'model': 'judge-model', 'max_retries': 1,
                                'retry_backoff_s': 0.0, 'on_error': 'zero'})
    verdict = judge.accuracy('Which city is the Taj Mahal in?', 'It is in Agra.', ['Agra'])
  assert verdict.score == 0.0 and 'The correct answer is Agra' in verdict.error
  assert len(double.bodies) == 2 and judge.stats()['errors'] == 1   # retried once, then a judge error
