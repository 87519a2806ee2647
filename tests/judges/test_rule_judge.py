"""Rule-based accuracy and query-quality judges (osvl_jax/judges/rule.py).

Lives under tests/rl because the judges feed r_acc and r_query of the RL reward (DESIGN.md §6).
"""

import pytest

from osvl_jax.judges import rule
from tools import base


@pytest.mark.parametrize('response, answers, expected', [
    (None, ['Paris'], 0.0),                                      # no final response -> 0
    ('', ['Paris'], 0.0),
    ('Paris', ['paris'], 1.0),                                   # case
    ('It is the Eiffel Tower.', ['Eiffel Tower'], 1.0),          # containment, punctuation, article
    ('The answer is Zürich', ['Zurich'], 1.0),                   # accents
    ('Prague', ['Praha', 'Prague'], 1.0),                        # any alias
    ('Parisian cuisine', ['Paris'], 0.0),                        # containment is on word boundaries
    ('Berlin', ['Paris'], 0.0),
    ('about 8.3 million people', ['8,336,817'], 1.0),            # |8.3e6 − 8336817| / 8336817 = 0.0044 < 1e-2
    ('roughly 8 million', ['8,336,817'], 0.0),                   # 0.040 > 1e-2
    ('12.5%', ['12.6 %'], 1.0),                                  # 0.1 / 12.6 = 0.0079
    ('12.5%', ['13%'], 0.0),                                     # 0.5 / 13 = 0.038
    ('The peak is 8,849 m high', ['8848.86 metres'], 1.0),       # units ignored, 0.00002
    ('It opened in 1969.', ['1969'], 1.0),
    ('It opened in 1969.', ['1950'], 0.0),                       # short integers (years) match exactly
    ('March 5, 2001', ['2001-03-05'], 1.0),                      # dates normalised to ISO
    ('on 5th of March 2001', ['March 5, 2001'], 1.0),
    ('5 March 2001', ['03/05/2001'], 1.0),                       # US month-first with slashes
    ('05.03.2001', ['2001-03-05'], 1.0),                         # day-first with dots
    ('March 6, 2001', ['2001-03-05'], 0.0),
    ('in March 2001', ['2001-03'], 1.0),
])
def test_accuracy_examples(response, answers, expected):
  assert rule.accuracy(response, answers) == expected


def test_normalize():
  assert rule.normalize('The Eiffel Tower, in Paris!') == 'eiffel tower in paris'
  assert rule.normalize('Mar. 5th, 2001') == '2001 03 05'
  assert rule.normalize('3.14 and 1,234,567') == '3.14 and 1234567'


QUESTION = 'Which river flows through the city where this bridge stands?'


def test_query_quality_hand_example():
  calls = [('image_search', {'image': 'img_1'}),
           ('text_search', {'query': 'Charles Bridge river'}),
           ('text_search', {'query': 'Charles  bridge River'}),  # duplicate after normalisation
           ('crop', {'image': 'img_9', 'x': 0, 'y': 0, 'width': 5, 'height': 5})]
  results = [base.ToolResult(ok=True, text='Best match: Charles Bridge (article Charles_Bridge)'),
             base.ToolResult(ok=True, text='[1] Vltava: the river through Prague'),
             base.ToolResult(ok=True, text='[1] Vltava: the river through Prague'),
             base.error('bad_arguments', 'no image img_9')]
  # success [1, 1, 1, 0] = 0.75; novelty [1, 1, 0, 1] = 0.75; grounding (2 text queries share 'bridge',
  # 'river' with the question) = 1.0;  mean = (0.75 + 0.75 + 1.0) / 3 = 0.833333
  assert rule.query_quality(calls, results, QUESTION) == pytest.approx(2.5 / 3)


def test_query_quality_grounding_uses_previous_observations():
  calls = [('image_search', {'image': 'img_1'}), ('text_search', {'q': 'Vltava length'}),
           ('text_search', {'query': 'banana bread recipe'})]
  results = [base.ToolResult(ok=True, text='Best match: Vltava river in Prague'),
             base.error('no_result', 'nothing found'),
             base.ToolResult(ok=True, text='[1] Banana bread: ...')]
  # success [1, 0.5, 1] = 2.5/3; novelty 1; grounding: 'vltava' seen in observation 0 -> 1,
  # 'banana bread recipe' shares nothing with the question or earlier observations -> 0; = 0.5
  expected = (2.5 / 3 + 1.0 + 0.5) / 3
  assert rule.query_quality(calls, results, QUESTION) == pytest.approx(expected)


def test_query_quality_edge_cases():
  assert rule.query_quality([], [], QUESTION) == 0.0
  # no text queries: grounding omitted, mean of success 0 (None = error) and novelty 1
  assert rule.query_quality([('crop', {'image': 'img_1'})], [None], QUESTION) == pytest.approx(0.5)
  with pytest.raises(ValueError):
    rule.query_quality([('crop', {})], [], QUESTION)


# ----------------------------------------------------------------------------------------------------------------
# Article-only answers and multiple-choice letters
# ----------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize('response, answers, expected', [
    ('A', ['A'], 1.0),                    # a gold that is an article: kept when it is the whole answer
    ('(A)', ['A'], 1.0),
    ('The answer is A.', ['A'], 1.0),     # a letter reply against a single-letter gold
    ('B', ['A'], 0.0),
    ('a cat', ['A'], 0.0),                # the article of a sentence is not the letter A
    ('The Who', ['The Who'], 1.0),        # neighbours: an article inside a longer answer still drops
    ('Who', ['The Who'], 1.0),
    ('It was The Who.', ['The Who'], 1.0),
    ('An', ['An'], 1.0),                  # a surname that is an article, as the whole answer
    ('Anne', ['An'], 0.0),
    ('5', ['5'], 1.0),                    # numbers are not letters
    ('B', ['5'], 0.0),
    ('1', ['A'], 0.0),
])
def test_article_and_letter_answers(response, answers, expected):
  assert rule.accuracy(response, answers) == expected


def test_normalize_keeps_a_text_made_only_of_articles():
  assert rule.normalize('A') == 'a' and rule.normalize('The') == 'the' and rule.normalize('An') == 'an'
  assert rule.normalize('The Who') == 'who' and rule.normalize('a the') == 'a the'


@pytest.mark.parametrize('reply', ['B', '(B)', 'B.', 'b', 'B)', '**B**', 'Answer: B', 'The answer is B',
                                   'Option B', 'Final answer: (B)', '  [B]  '])
def test_letter_replies(reply):
  assert rule.choice_letter(reply) == 'B'


@pytest.mark.parametrize('reply', ['B. Pebble Beach', 'a cat', 'Bee', 'AB', '', None, 'The answer is Lisbon'])
def test_replies_that_are_not_letter_only(reply):
  assert rule.choice_letter(reply) is None


def test_real_livevqa_official_items_score_letter_replies():
  from osvl_jax.data import benchmarks
  items = benchmarks.load_benchmark('livevqa_official')
  first = items[0]  # '0_20250507132827113360-l1': gold B, 'CBS News vice presidential debate'
  assert first.metadata['gold_letter'] == 'B' and rule.gold_choice(first.question, first.answers) == 'B'
  for reply in ('B', '(B)', 'B.', 'Answer: B'):
    assert rule.accuracy(reply, first.answers, gold_letter='B') == 1.0
    assert rule.RuleJudge().accuracy(first.question, reply, first.answers).score == 1.0  # letter from the question
  for reply in ('A', '(C)', 'E.', 'Answer: D'):
    assert rule.accuracy(reply, first.answers, gold_letter='B') == 0.0
    assert rule.RuleJudge().accuracy(first.question, reply, first.answers).score == 0.0
  assert rule.accuracy('B. CBS News vice presidential debate', first.answers, gold_letter='B') == 1.0
  # Over every real item, the gold letter reply is right and every other option letter wrong.
  for it in items:
    gold = it.metadata['gold_letter']
    letters = rule.choices(it.question)
    assert gold in letters
    assert all(rule.accuracy(k, it.answers, gold_letter=gold) == float(k == gold) for k in letters)


def test_real_webwatcher_livevqa_gold_letter_comes_from_the_options_in_the_prompt():
  from osvl_jax.data import benchmarks
  items = benchmarks.load_benchmark('livevqa')
  augusta = next(it for it in items if it.id == '1')
  assert rule.gold_choice(augusta.question, augusta.answers) == 'A'  # 'A. Augusta National Golf Club'
  assert rule.RuleJudge().accuracy(augusta.question, 'A', augusta.answers).score == 1.0
  assert rule.RuleJudge().accuracy(augusta.question, '(B)', augusta.answers).score == 0.0
  jobs = next(it for it in items if it.id == '4')  # options '109,000' is B: a number gold, a letter reply
  assert rule.RuleJudge().accuracy(jobs.question, 'B.', jobs.answers).score == 1.0
  assert rule.RuleJudge().accuracy(jobs.question, '109,000', jobs.answers).score == 1.0
  # The gold option is found for nearly every item (exact, else unique containment: 'To honor ...').
  assert sum(rule.gold_choice(it.question, it.answers) is not None for it in items) == 193 and len(items) == 205
  ambiguous = 'Which?\nA. 0.02\nB. -0.02'  # normalisation drops the sign: two candidates, no gold letter
  assert rule.gold_choice(ambiguous, ['0.02']) is None
