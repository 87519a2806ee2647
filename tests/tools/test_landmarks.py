"""tools/landmarks.py: every photo is named; every mapped article exists in Wikispeedia."""

from osvl_jax import paths
from tools import corpus as corpus_lib
from tools import landmarks


def test_every_photo_has_a_name_and_every_name_a_photo():
  stems = {p.stem for p in (paths.data_dir() / 'images' / 'landmarks').glob('*.jpg')}
  assert stems == set(landmarks.LANDMARK_NAMES)


def test_mapped_articles_exist_in_wikispeedia():
  c = corpus_lib.load_wikispeedia()
  for table in (landmarks.LANDMARK_ARTICLES, landmarks.LANDMARK_RELATED):
    for stem, title in table.items():
      assert stem in landmarks.LANDMARK_NAMES, stem
      assert title in c and c.has_text(title), (stem, title)
  assert not set(landmarks.LANDMARK_ARTICLES) & set(landmarks.LANDMARK_RELATED)


def test_known_landmarks_map_to_their_articles():
  a = landmarks.LANDMARK_ARTICLES
  assert a['taj-mahal'] == 'Taj_Mahal'
  assert a['great-wall'] == 'Great_Wall_of_China'
  assert a['great-pyramid-of-khufu'] == 'Great_Pyramid_of_Giza'
  assert a['moai-statues'] == 'Easter_Island'
  assert a['toronto-skyline'] == 'Toronto'
  assert len(a) == 12
  assert 'eiffel-tower' not in a  # No Eiffel_Tower article in the 2007 selection.
