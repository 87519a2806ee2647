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


def _record(graph, path):
  return {'prompt_id': 'x', 'path': path, 'descriptors': [graph.descriptors(t)[0] for t in path[1:]]}


def test_a_fragment_of_infobox_text_as_capital_is_rejected_with_its_attribute(corpus, graph):
  # Mexico_City.txt: "Capital of the Nation" -> the extractor reads 'of the Nation' (the bad item).
  assert _attrs(corpus, 'Mexico_City')['capital']['answer'] == 'of the Nation'
  recs, counts = qa.add_qa([_record(graph, ['Toronto', 'Mexico_City'])], graph, seed=0)
  assert recs[0]['rejected'].startswith('answer_type:capital (')
  assert counts['rejected_answer_type'] == {'capital': 1} and counts['accepted'] == 0
  for bad in ('district Libreville', 'budgeting', 'No official capital', 'nao sei', 'Capital of', 'Paris [1]'):
    assert qa.answer_type_error('capital', bad) is not None, bad
  for good in ('Tokyo', 'Dar es Salaam', 'The Hague', 'Saint-Pierre', "Côte d'Ivoire", 'Mata-Utu'):
    assert qa.answer_type_error('capital', good) is None, good


def test_an_exact_birth_year_is_accepted(corpus, graph):
  recs, counts = qa.add_qa([_record(graph, ['Toronto', 'Albert_Einstein'])], graph, seed=0)
  assert recs[0]['answers'][0] == '1879' and recs[0]['rejected'] is None and counts['accepted'] == 1
  assert qa.answer_type_error('born', '1889', '20 April 1889') is None
  assert qa.answer_type_error('died', '322 BC', '322 BC') is None
  assert qa.answer_type_error('founded', '1882', '1882 as Hotspur F.C.') is None  # 'F.C.' is no 'c.'


def test_approximate_or_implausible_years_are_rejected(corpus):
  # Decision: a year the infobox qualifies as approximate is not an answer (no single year is right).
  assert qa.answer_type_error('born', '1450', 'c. 1450s').startswith('approximate')
  born = _attrs(corpus, 'Christopher_Columbus')['born']  # "Born c. 1451"
  assert qa.answer_type_error('born', born['answer'], qa.raw_value('born', born['line'])).startswith('approximate')
  for raw in ('1030x1038', '1336 BC or 1334 BC', '1483?', 'Before 879', 'circa 1810 BC', '~406'):
    assert qa.answer_type_error('born', raw.split()[0].lstrip('~')[:4].rstrip('x?'), raw) is not None, raw
  assert qa.answer_type_error('born', '2950') == 'implausible year 2950'
  assert qa.answer_type_error('born', '18') == 'not a 3-4 digit year'


def test_a_year_dated_by_a_season_only_is_rejected(corpus, graph):
  # Magellan's infobox: "Born Spring 1480" (c. 1480 in other sources): as vague as 'c. 1451'.
  born = _attrs(corpus, 'Ferdinand_Magellan')['born']
  assert born['answer'] == '1480' and qa.raw_value('born', born['line']) == 'Spring 1480'
  assert qa.answer_type_error('born', '1480', 'Spring 1480') == "approximate or uncertain ('Spring 1480')"
  for raw in ('Summer 1480', 'autumn 1480', 'Fall 1480', 'Winter 1480', 'est. 1480', 'reportedly 1480'):
    assert qa.answer_type_error('born', '1480', raw) is not None, raw
  assert qa.answer_type_error('born', '1480', 'March 1480') is None   # a month is no vaguer than the year
  recs, counts = qa.add_qa([_record(graph, ['Chile', 'Ferdinand_Magellan'])], graph, seed=0)
  assert recs[0]['rejected'].startswith('answer_type:born (approximate') and counts['rejected_answer_type'] == {
      'born': 1}


def test_other_types_and_the_doubled_flag_caption(corpus):
  assert _attrs(corpus, 'Bologna')['country']['answer'] == 'Italy'  # "Country Italy Italy" (flag + name)
  assert qa.answer_type_error('currency', 'rouble') is None and qa.answer_type_error('currency', 'USD') is None
  assert qa.answer_type_error('author', 'Many') == 'vague'
  assert qa.answer_type_error('author', 'E. B. White') is None
  assert qa.answer_type_error('calling_code', '+266') is None and qa.answer_type_error('calling_code', '266')
  assert qa.answer_type_error('tld', '.ls') is None and qa.answer_type_error('tld', 'ls')


def test_every_accepted_item_has_a_well_formed_answer(grounded_items):
  for r in grounded_items:
    if r['rejected'] is None:
      assert qa.answer_type_error(r['answer_attribute'], r['answers'][0]) is None


def test_more_attributes_per_path_ask_the_next_attributes_of_the_answer_node(corpus, graph):
  # Egypt.txt's infobox: capital Cairo, currency Egyptian pound, calling code +20, TLD .eg (a path ending in Egypt).
  path = ['Great_Pyramid_of_Giza', 'Egypt']
  one, counts_one = qa.add_qa([_record(graph, path)], graph, seed=0)
  recs, counts = qa.add_qa([_record(graph, path)], graph, seed=0, attributes_per_path=3)
  assert one == recs[:1] and counts_one['more_attributes'] == 0
  assert [(r['prompt_id'], r['answer_attribute'], r['answers'][0]) for r in recs] == [
      ('x', 'capital', 'Cairo'), ('x-currency', 'currency', 'Egyptian pound'), ('x-calling_code', 'calling_code', '+20')]
  assert recs[1]['canonical_question'].endswith('What is the currency of Egypt?')
  assert all(r['rejected'] is None and r['path'] == path for r in recs)
  assert counts['accepted'] == 3 and counts['more_attributes'] == 2 and counts['answered'] == 1
  # A walk whose first answer is malformed gives no item at all (Mexico City's capital 'of the Nation').
  bad, _ = qa.add_qa([_record(graph, ['Toronto', 'Mexico_City'])], graph, seed=0, attributes_per_path=3)
  assert len(bad) == 1 and bad[0]['rejected'].startswith('answer_type:capital')


def test_an_attribute_repeating_an_earlier_answer_adds_no_item(graph):
  # Israel: capital Jerusalem, currency New Israeli sheqel, largest city Jerusalem (skipped), TLD .il.
  recs, _ = qa.add_qa([_record(graph, ['Egypt', 'Israel'])], graph, seed=0, attributes_per_path=3)
  assert [r['answer_attribute'] for r in recs] == ['capital', 'currency', 'tld']
