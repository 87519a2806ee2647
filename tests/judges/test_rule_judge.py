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
