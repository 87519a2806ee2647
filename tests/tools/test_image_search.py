"""tools/image_search.py: near-duplicate lookup over the real landmark photos."""

import cv2
import numpy as np
import pytest
from PIL import Image

from osvl_jax import paths
from tools import image_search
from tools import landmarks


def _photos():
  folder = paths.data_dir() / 'images' / 'landmarks'
  return {p.stem: np.asarray(Image.open(p).convert('RGB')) for p in sorted(folder.glob('*.jpg'))}


def _blur(im):
  return cv2.GaussianBlur(im, (0, 0), 2)


def _half(im):
  return cv2.resize(im, None, fx=0.5, fy=0.5, interpolation=cv2.INTER_AREA)


def _crop(im):
  h, w = im.shape[:2]
  return im[h // 8:h * 7 // 8, w // 8:w * 7 // 8]


@pytest.mark.parametrize('degrade', [lambda im: im, _blur, _half, lambda im: _half(_blur(im)), _crop],
                         ids=['identity', 'blur2', 'half', 'blur2_half', 'crop75'])
def test_every_landmark_photo_is_found_top1_after_degradation(degrade):
  index = image_search.get_index()
  for stem, im in _photos().items():
    match = index.best(degrade(im))
    assert match is not None and match.stem == stem, (stem, index.rank(degrade(im))[:2])
    assert match.score >= 0.6


def test_non_landmark_photos_have_no_confident_match():
  index = image_search.get_index()
  for name in ('photos/astronaut.png', 'photos/coffee.png', 'documents/notecard_perspective.png',
               'ocr/easyocr_korean.png'):
    im = np.asarray(Image.open(paths.data_dir() / 'images' / name).convert('RGB'))
    assert index.best(im) is None, name


def test_describe_names_landmark_and_article():
  index = image_search.get_index()
  photos = _photos()
  m = index.best(_blur(photos['taj-mahal']))
  text = image_search.describe(m, index.names[m.stem])
  assert text.startswith('Best match: Taj Mahal (Wikipedia article: Taj_Mahal), score 0.')
  m = index.best(photos['eiffel-tower'])
  assert 'related article: Paris' in image_search.describe(m, index.names[m.stem])
  assert set(landmarks.LANDMARK_NAMES) == set(index.stems)
