"""Answer extraction from the infobox lines kept in the Wikispeedia plaintext (values read from the files)."""

import numpy as np

from data_pipeline import entities
from data_pipeline import qa


def _attrs(corpus, title):
  return entities.infobox_attributes(corpus.text(title), corpus.categories[title])


def test_capital_on_the_line_after_the_key(corpus):
  # Lesotho.txt: "Capital" then "(and largest city)         Maseru".
  a = _attrs(corpus, 'Lesotho')
  assert a['capital']['answer'] == 'Maseru'
  assert a['currency']['answer'] == 'Loti' and a['currency']['aliases'] == ['LSL']  # "Loti ( LSL)"
  assert a['calling_code']['answer'] == '+266'
  assert a['tld']['answer'] == '.ls'


def test_capital_on_the_key_line_and_parenthetical_alias(corpus):
  assert _attrs(corpus, 'Japan')['capital']['answer'] == 'Tokyo'  # "Capital Tokyo"
  egypt = _attrs(corpus, 'Egypt')['capital']  # "(and largest city)      Cairo (Al-Qahirah)"
  assert egypt['answer'] == 'Cairo' and egypt['aliases'] == ['Al-Qahirah']


def test_birth_year_with_full_date_alias(corpus):
  born = _attrs(corpus, 'Albert_Einstein')['born']  # "Born      March 14, 1879"
  assert born['answer'] == '1879' and born['aliases'] == ['March 14, 1879']


def test_column_tables_and_empty_values_are_not_answers(corpus):
  assert 'country' not in _attrs(corpus, 'Moscow')  # "Country\nDistrict\nSubdivision     Russia"
  assert 'capital' not in _attrs(corpus, 'Hong_Kong')  # "Capital none"


def test_answers_are_at_most_six_tokens(graph, grounded_items):
  for r in grounded_items:
    assert 1 <= len(r['answers'][0].split()) <= entities.MAX_ANSWER_TOKENS


def test_canonical_question_names_every_entity():
  q = qa.canonical_question(['Taj_Mahal', 'Luftwaffe', 'Adolf_Hitler'], 'born', np.random.default_rng(0))
  for name in ('Taj Mahal', 'Luftwaffe', 'Adolf Hitler'):
    assert name in q
  assert q.endswith('What is the birth year of Adolf Hitler?')
