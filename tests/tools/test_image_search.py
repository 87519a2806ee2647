"""tools/image_search.py: near-duplicate lookup over the real landmark photos."""

import cv2
import numpy as np
import pytest
from PIL import Image

from osvl_jax import paths
from tools import image_search
from tools import landmarks
from tools import env as tools_env
from tools import specs


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


# --------------------------------------------------------------------------------------------------------------
# The full collection: every image under images/ and benchmarks/fvqa/images (85), queried with degraded photos.

def collection_dirs():
  """The 9 folders: images/* and benchmarks/fvqa/images."""
  root = paths.data_dir()
  return sorted(str(p) for p in (root / 'images').iterdir() if p.is_dir()) + [str(root / 'benchmarks/fvqa/images')]


def query_photos():
  """stem -> uint8 [H, W, 3] of every landmark and FVQA photo (the queries)."""
  root = paths.data_dir()
  files = sorted((root / 'images/landmarks').glob('*.jpg')) + sorted((root / 'benchmarks/fvqa/images').glob('*'))
  return {p.stem: np.asarray(Image.open(p).convert('RGB')) for p in files}


def blur3(im):
  return cv2.GaussianBlur(im, (0, 0), 3)


def down25(im):
  return cv2.resize(im, None, fx=0.25, fy=0.25, interpolation=cv2.INTER_AREA)


def border_crop20(im):
  """Cuts 20 % of the width/height off each side (keeps the central 60 %)."""
  h, w = im.shape[:2]
  return im[int(0.2 * h):h - int(0.2 * h), int(0.2 * w):w - int(0.2 * w)]


def skew(im):
  """A perspective skew: corners moved inwards by up to 10 % of the side."""
  h, w = im.shape[:2]
  src = np.float32([[0, 0], [w, 0], [w, h], [0, h]])
  dst = np.float32([[0.1 * w, 0.05 * h], [0.95 * w, 0], [w, h], [0, 0.9 * h]])
  return cv2.warpPerspective(im, cv2.getPerspectiveTransform(src, dst), (w, h), borderMode=cv2.BORDER_REFLECT)


def blur2_half_jpeg30(im):
  small = cv2.resize(cv2.GaussianBlur(im, (0, 0), 2), None, fx=0.5, fy=0.5, interpolation=cv2.INTER_AREA)
  _, buf = cv2.imencode('.jpg', small[..., ::-1], [cv2.IMWRITE_JPEG_QUALITY, 30])
  return cv2.imdecode(buf, cv2.IMREAD_COLOR)[..., ::-1]


DEGRADATIONS = (blur3, down25, border_crop20, skew, blur2_half_jpeg30)


@pytest.fixture(scope='module')
def collection():
  return image_search.get_index(collection_dirs())


def test_index_takes_a_list_of_folders_with_all_85_images(collection):
  assert len(collection) == 85 and not collection.skipped
  assert 'taj-mahal' in collection.stems and 'fvqa_train_37' in collection.stems
  env_dirs = tools_env.ToolEnv({'image_search': {'image_dirs': collection_dirs()}})
  assert specs.image_search.image_dirs(env_dirs.config) == collection_dirs()


def test_degraded_queries_find_the_right_image_top1(collection):
  # Every photo once, the five degradations in turn (bench/tools_quality.py runs all 5 x 67).
  photos = sorted(query_photos().items())
  wrong = []
  for i, (stem, im) in enumerate(photos):
    degrade = DEGRADATIONS[i % len(DEGRADATIONS)]
    ranked = collection.rank(degrade(im))
    if not ranked or ranked[0].stem != stem:
      wrong.append((stem, degrade.__name__))
  assert len(wrong) <= 0.05 * len(photos), wrong


def test_shortlist_is_global_and_verification_is_local_only_on_it(collection):
  im = query_photos()['taj-mahal']
  short = collection.shortlist(im)
  assert len(short) == image_search.SHORTLIST and collection.stems[short[0][0]] == 'taj-mahal'
  assert len(collection.rank(im)) == image_search.SHORTLIST


def test_synthetic_distractors_do_not_displace_the_right_image():
  index = image_search.ImageIndex(paths.data_dir() / 'images' / 'landmarks')
  rng = np.random.default_rng(0)
  for i in range(500):
    index.add(f'distractor_{i}', image_search.synthetic_distractor(rng))
  photos = _photos()
  for stem in ('taj-mahal', 'big-ben', 'stonehenge'):
    assert index.best(blur2_half_jpeg30(photos[stem])).stem == stem


def test_corrupt_file_in_a_folder_is_skipped_with_reason(tmp_path):
  (tmp_path / 'broken.jpg').write_bytes(b'\xff\xd8\xff garbage')
  Image.fromarray(_photos()['taj-mahal']).save(tmp_path / 'taj.png')
  index = image_search.ImageIndex([tmp_path])
  assert index.stems == ['taj'] and index.skipped[0][0].endswith('broken.jpg')
  assert 'cannot decode' in index.skipped[0][1]
