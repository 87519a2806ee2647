"""Fuzzy rewrite order and the non-leakage check."""

import unicodedata

from data_pipeline import entities
from data_pipeline import ground
from data_pipeline import rewrite
from osvl_jax import paths

PATH = ['Taj_Mahal', 'Luftwaffe', 'Adolf_Hitler']


def test_leak_check_rejects_a_question_that_still_names_a_path_node(graph):
  q = 'What is the birth year of the political figure mentioned in the article on Luftwaffe?'
  leaks = rewrite.find_leaks(q, PATH, graph, ['1889'])
  assert leaks and 'Luftwaffe' in leaks[0]
  # Case and accents do not hide a name.
  assert rewrite.find_leaks('... the article on LUFTWAFFE?', PATH, graph)


def test_leak_check_catches_distinctive_words_and_the_answer(graph):
  assert rewrite.find_leaks('Who commissioned the Mahal in the image?', PATH, graph)
  assert rewrite.find_leaks('Was Hitler born in 1889?', PATH, graph, ['1889'])
  assert rewrite.find_leaks('Is the answer 1889?', PATH, graph, ['1889']) == ["answer: '1889'"]


def test_leak_check_accepts_a_fully_rewritten_question(graph):
  q = ('What is the birth year of the political figure mentioned in the article on the Second World War '
       'subject named in the Wikipedia article about the mausoleum in the image?')
  assert rewrite.find_leaks(q, PATH, graph, ['1889', 'April 20, 1889']) == []


def test_rewrite_goes_farthest_to_nearest():
  tmpl, trace = rewrite.fuzzy_rewrite(PATH, ['Second World War subject', 'political figure'], 'born')
  assert trace[0] == 'What is the birth year of Adolf Hitler?'
  assert 'Adolf Hitler' not in trace[1] and 'Luftwaffe' in trace[1]  # vh replaced first
  assert 'Luftwaffe' not in trace[2] and 'Taj Mahal' in trace[2]
  assert '{E0}' in tmpl


def test_items_with_a_leaking_question_are_rejected_with_a_reason(graph):
  rec = {'path': PATH, 'descriptors': ['Luftwaffe unit', 'political figure'], 'answer_attribute': 'born',
         'answers': ['1889'], 'rejected': None, 'landmark': 'taj-mahal'}
  out, counts = rewrite.rewrite([rec], graph)
  assert counts['rejected_leak'] == 1
  assert out[0]['rejected'].startswith('rewrite: leak: alias of Luftwaffe')
  assert out[0]['rewrite_trace'][-1] == ('What is the birth year of the political figure mentioned in the article on '
                                         'the Luftwaffe unit mentioned in the article on Taj Mahal?')


def test_grounded_questions_name_no_path_node(graph, grounded_items):
  accepted = [r for r in grounded_items if not r['rejected']]
  assert len(accepted) >= 5
  for r in accepted:
    assert ground.referring_expression(r['landmark']) in r['question'] == r['question_template'].replace(
        '{E0}', r['anchor_expression'])
    assert rewrite.find_leaks(r['question'], r['path'], graph, r['answers']) == []
    assert (paths.data_dir() / r['image_path']).is_file()


def test_name_spans_fold_case_accents_and_punctuation_whole_tokens_only():
  q = 'Who designed the eiffel tower, near SAO PAULO and St. Louis?'
  assert entities.name_spans(q, ['Eiffel Tower']) == [(17, 29)]
  assert entities.name_spans(q, ['São Paulo', 'St Louis']) == [(36, 45), (50, 59)]
  assert entities.name_spans('Uruguay and Ur', ['Ur']) == [(12, 14)]           # never inside a longer word
  assert entities.name_spans('Sao Tome and Principe', ['Sao Tome', 'São Tomé and Príncipe']) == [(0, 21)]  # longest
  # Decomposed accents (a letter + a combining mark) stay inside their word: no 'Sa' in 'São', no 'Ur' in 'Uŕuguay'.
  nfd = unicodedata.normalize('NFD', 'Who built São Paulo in Uŕuguay?')
  assert entities.names_in_text(nfd, ['Sa', 'Sao Paulo', 'Ur', 'Uruguay']) == ['Sao Paulo', 'Uruguay']
  assert entities.name_spans(nfd, ['Sao Paulo']) == [(10, 20)]


def test_ablation_template_replaces_only_mentions_of_v0(graph):
  """`data.rewrite=False`: v0 found up to case (a plain `str.replace` of 'Eiffel Tower' missed it), not inside
  another path node's name; no mention -> rejected with the reason."""
  assert rewrite.mention_template('In which country is the eiffel tower?', ['Eiffel_Tower', 'France'], graph) == (
      'In which country is the {E0}?')
  q = 'Sao Tome lies in São Tomé and Príncipe. What is the capital of São Tomé and Príncipe?'
  assert rewrite.mention_template(q, ['São_Tomé', 'São_Tomé_and_Príncipe'], graph) == (
      '{E0} lies in São Tomé and Príncipe. What is the capital of São Tomé and Príncipe?')
  assert rewrite.mention_template('What is the capital of São Tomé and Príncipe?',
                                  ['São_Tomé', 'São_Tomé_and_Príncipe'], graph) is None
  recs = [{'path': ['Eiffel_Tower', 'France'], 'canonical_question': q, 'answers': ['Paris'], 'rejected': None}
          for q in ('In which country is the EIFFEL TOWER?', 'What is the capital of France?')]
  out, counts = rewrite.rewrite(recs, graph, enabled=False)
  assert out[0]['question_template'] == 'In which country is the {E0}?' and not out[0]['rejected']
  assert out[1]['rejected'] == 'rewrite: v0 not named in the question (Eiffel_Tower)'
  assert (counts['rewritten'], counts['rejected_unnamed'], counts['rejected_leak']) == (1, 1, 0)
