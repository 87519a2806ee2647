"""`python -m data_pipeline.review`: an item's hops with the competitors its texts name, and the verdicts."""

import pathlib

import pytest

from data_pipeline import review

# Accepted by the build before issue 25: copper is not the only element the Taj Mahal's text names (gold x7),
# and the Isle of Man is no place in Britain.
_FLAWED = {'prompt_id': 'old-1', 'path': ['Taj_Mahal', 'Copper', 'Isle_of_Man'],
           'descriptors': ['chemical element', 'place in Britain'], 'relations': ['mentioned in', 'mentioned in'],
           'question': 'What is the capital of the place in Britain mentioned in the article on the chemical '
                       'element mentioned in the article on the mausoleum in the image?',
           'answers': ['Douglas'], 'answer_attribute': 'capital', 'answer_evidence': 'Isle_of_Man: Capital Douglas',
           'image_path': 'images/landmarks/taj-mahal.jpg'}
_GOOD = {'prompt_id': 'new-1', 'path': ['Machu_Picchu', 'Peru', 'Lima'],
         'descriptors': ['Latin American country', 'Latin American place'],
         'relations': ['mentioned most often in', 'mentioned most often in'],
         'question': 'What is the founding year of the Latin American place mentioned most often in the article on '
                     'the Latin American country mentioned most often in the article on the ruins in the image?',
         'answers': ['1535', 'January 18, 1535'], 'answer_attribute': 'founded',
         'answer_evidence': 'Lima: Founded       January 18, 1535', 'image_path': 'images/landmarks/machu-picchu.jpg'}


def test_a_flawed_item_is_flagged_with_the_competitors_the_text_names(graph):
  rec = review.review_item(graph, _FLAWED, {('Copper', 'Isle_of_Man'): 1})
  assert not rec['ok']
  hop1, hop2 = rec['hops']
  assert hop1['referent'] == 'AMBIGUOUS' and hop1['competitors'][:2] == [('Gold', 7), ('Copper', 2)]
  assert hop1['descriptor_check'] == 'fits' and hop2['descriptor_check'] == 'NO EVIDENCE'
  text = review.as_text(dict(rec, image_file='/x/taj-mahal.jpg'))
  assert 'FLAGGED' in text and 'Gold x7, Copper x2' in text and 'referent: AMBIGUOUS' in text


def test_a_good_item_passes_every_check_and_renders_as_html(graph, tmp_path):
  rec = review.review_item(graph, _GOOD, {('Peru', 'Lima'): 1})
  assert rec['ok'] and [h['referent'] for h in rec['hops']] == ['most often', 'most often']
  assert rec['checks'] == {'reading': 'ok', 'leak': 'ok', 'answer': 'ok', 'chain': '1 item(s) end with Peru -> Lima'}
  rec['image_file'] = str(tmp_path / 'images' / 'machu-picchu.jpg')
  page = review.as_html([rec], tmp_path / 'data')
  assert '<img src="../images/machu-picchu.jpg"' in page and 'Peru ×11' in page and 'FLAGGED' not in page


def test_a_folder_without_items_is_named(tmp_path):
  with pytest.raises(FileNotFoundError, match='no items split'):
    review.dataset_folder(tmp_path)
  (tmp_path / 'data' / 'items').mkdir(parents=True)
  (tmp_path / 'data' / 'items' / 'counts.json').write_text('{}')
  assert review.dataset_folder(tmp_path) == pathlib.Path(tmp_path / 'data')
