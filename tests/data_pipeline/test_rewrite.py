"""Fuzzy rewrite order and the non-leakage check."""

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
