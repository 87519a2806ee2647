"""Local `image_search` backend: near-duplicate lookup over one or more image folders.

Method (two stages, so the cost of a query does not grow with local features of the whole collection):
  1. Shortlist by a global descriptor. Every indexed image is described by `VIEWS` views (the whole image and
     its central 80 % and 60 %, so border crops still meet a matching view); a view's descriptor is a
     blurred 24x24 CIE-L thumbnail (zero-mean) plus 6x6 a/b colour thumbnails, L2-normalised (`float32 [648]`),
     which survives blur, downscaling, JPEG and mild skew. The query's descriptor is compared to all views by
     one matrix product (exact cosine, `float32 [N*VIEWS, 648]` in memory: ~8 ms for 10k images) and the
     `SHORTLIST` images with the best view go on.
  2. Geometric verification on the shortlist only: SIFT keypoints of the query (upscaled to at least
     `MIN_QUERY_SIDE` px when tiny, downscaled to at most `MAX_QUERY_SIDE`), Lowe's ratio test (0.8) against
     each shortlisted image's stored SIFT features (`uint8 [K, 128]`, references capped at `MAX_REF_SIDE` px and
     `MAX_REF_KEYPOINTS` keypoints),
     then a RANSAC 4-DOF similarity fit (`cv2.estimateAffinePartial2D`, 4 px); fits with an implausible scale
     (outside 0.1..10) count as 0.
Ranking: verified inliers (counted only from `MIN_INLIERS` up), then global similarity. A match is confident
when the best has at least `MIN_INLIERS` inliers and `score = best / (best + second + 5) >= MIN_SCORE`.

On the 85 images of `images/` + `benchmarks/fvqa/images` (bench/tools_quality.py) every landmark and FVQA photo
is top-1 after Gaussian blur sigma 3, 25 % downscale, 20 % border crop, perspective skew, and blur 2 + 50 % +
JPEG q30 (see BENCHMARKS.md for the figure and the time per query with 10,000 synthetic distractors).

Result text:
  `Best match: Taj Mahal (Wikipedia article: Taj_Mahal), score 0.93 (243 matched keypoints).`
  `Best match: Eiffel Tower (no Wikipedia article for it in the local corpus; related article: Paris), ...`
  `Best match: Tower at sunset (no Wikipedia article for it in the local corpus), ...`
"""

import dataclasses
import functools
import logging
import os
import pathlib
import threading
from collections.abc import Sequence

import cv2
import numpy as np

from tools import image_io
from tools import landmarks

RATIO = 0.8
RANSAC_PX = 4.0
MIN_INLIERS = 8
MIN_SCORE = 0.55
MAX_QUERY_SIDE = 320
MIN_QUERY_SIDE = 200
MAX_REF_SIDE = 512
SHORTLIST = 6
MAX_REF_KEYPOINTS = 800
MAX_QUERY_KEYPOINTS = 500
VIEWS = (1.0, 0.8, 0.6)  # Central fractions of each indexed image described globally.
THUMB, COLOR_THUMB = 24, 6
IMAGE_SUFFIXES = ('.jpg', '.jpeg', '.png', '.webp', '.bmp')


@dataclasses.dataclass
class Match:
  """One indexed image's evidence for a query.

  Attributes:
    stem: key of the indexed image (file stem, e.g. `taj-mahal`; `folder/stem` when two folders share a stem).
    inliers: RANSAC inlier count (matched keypoints consistent with one similarity transform).
    score: `inliers / (inliers + runner_up_inliers + 5)`, in [0, 1); only set on the best match.
    similarity: cosine similarity of the global descriptors (best view), in [-1, 1].
  """
  stem: str
  inliers: int
  score: float = 0.0
  similarity: float = 0.0


def _gray(image: np.ndarray) -> np.ndarray:
  return image if image.ndim == 2 else cv2.cvtColor(np.ascontiguousarray(image[..., :3]), cv2.COLOR_RGB2GRAY)


def global_descriptor(image: np.ndarray) -> np.ndarray:
  """The global descriptor of an image, `float32 [THUMB**2 + 2 * COLOR_THUMB**2]`, unit L2 norm.

  Args:
    image: `uint8 [H, W, 3]` RGB (or `[H, W]` gray).
  """
  rgb = image if image.ndim == 3 else np.repeat(image[..., None], 3, -1)
  small = cv2.resize(np.ascontiguousarray(rgb[..., :3]), (4 * THUMB, 4 * THUMB), interpolation=cv2.INTER_AREA)
  small = cv2.GaussianBlur(small, (0, 0), 3.0)  # Equalises blur between query and reference.
  lab = cv2.cvtColor(small, cv2.COLOR_RGB2LAB).astype(np.float32)
  lum = cv2.resize(lab[..., 0], (THUMB, THUMB), interpolation=cv2.INTER_AREA).ravel()
  lum = lum - lum.mean()
  lum /= np.linalg.norm(lum) + 1e-6
  ab = cv2.resize(lab[..., 1:], (COLOR_THUMB, COLOR_THUMB), interpolation=cv2.INTER_AREA).reshape(-1) - 128.0
  ab = ab / 64.0 * 0.1  # Colour matters less than layout; a/b in about [-0.2, 0.2].
  d = np.concatenate([lum, ab]).astype(np.float32)
  return d / (np.linalg.norm(d) + 1e-6)


def _central(image: np.ndarray, frac: float) -> np.ndarray:
  if frac >= 1.0:
    return image
  h, w = image.shape[:2]
  dy, dx = int(round(h * (1 - frac) / 2)), int(round(w * (1 - frac) / 2))
  return image[dy:h - dy, dx:w - dx]


def _features(sift, image: np.ndarray, max_side: int | None = None,
              min_side: int | None = None) -> tuple[np.ndarray, np.ndarray | None]:
  """SIFT keypoints `float32 [K, 2]` (x, y in the input's pixels) and descriptors `uint8 [K, 128]` or None."""
  gray = _gray(image)
  scale = 1.0
  if max_side is not None and max(gray.shape) > max_side:
    scale = max_side / max(gray.shape)
  elif min_side is not None and max(gray.shape) < min_side:
    scale = min_side / max(gray.shape)
  if scale != 1.0:
    gray = cv2.resize(gray, None, fx=scale, fy=scale,
                      interpolation=cv2.INTER_AREA if scale < 1 else cv2.INTER_CUBIC)
  kps, desc = sift.detectAndCompute(gray, None)
  pts = np.float32([k.pt for k in kps]).reshape(-1, 2) / scale
  if desc is not None:
    desc = np.clip(np.rint(desc), 0, 255).astype(np.uint8)
  return pts, desc


class ImageIndex:
  """Global-descriptor shortlist + SIFT verification over one or more folders of images.

  Attributes:
    stems: keys of the indexed images, index order.
    names: key -> display name (`landmarks.LANDMARK_NAMES`, else the key).
    skipped: `(path, reason)` of files that could not be read (corrupt, no keypoints).
  """

  def __init__(self, image_dirs: str | os.PathLike | Sequence[str | os.PathLike] = ()):
    """Args: image_dirs: a folder or a list of folders; their .jpg/.jpeg/.png/.webp/.bmp files are indexed.

    Raises:
      FileNotFoundError: a folder does not exist, or nothing at all could be indexed.
    """
    if isinstance(image_dirs, (str, os.PathLike)):
      image_dirs = [image_dirs]
    self._sift = cv2.SIFT_create(nfeatures=MAX_REF_KEYPOINTS)
    self._query_sift = cv2.SIFT_create(nfeatures=MAX_QUERY_KEYPOINTS)
    self._matcher = cv2.BFMatcher(cv2.NORM_L2)
    self._lock = threading.Lock()  # OpenCV objects are not shared across threads safely.
    self.stems: list[str] = []
    self.names: dict[str, str] = {}
    self.skipped: list[tuple[str, str]] = []
    self._local: list[tuple[np.ndarray, np.ndarray]] = []
    self._global_rows: list[np.ndarray] = []
    self._global = np.zeros((0, THUMB * THUMB + 2 * COLOR_THUMB ** 2), np.float32)
    paths = []
    for folder in image_dirs:
      folder = pathlib.Path(folder)
      if not folder.is_dir():
        raise FileNotFoundError(f'image_search folder {folder} does not exist')
      paths += [p for p in sorted(folder.iterdir()) if p.suffix.lower() in IMAGE_SUFFIXES]
    stem_counts: dict[str, int] = {}
    for p in paths:
      stem_counts[p.stem] = stem_counts.get(p.stem, 0) + 1
    for p in paths:
      key = p.stem if stem_counts[p.stem] == 1 else f'{p.parent.name}/{p.stem}'
      try:
        image = image_io.load_image(p)
      except image_io.ImageDecodeError as e:
        self.skipped.append((str(p), str(e)))
        logging.warning('image_search: skipping %s: %s', p, e)
        continue
      if not self.add(key, image, landmarks.LANDMARK_NAMES.get(p.stem, key)):
        self.skipped.append((str(p), 'fewer than 2 SIFT keypoints'))
    if not self.stems:
      raise FileNotFoundError(f'no indexable images in {[str(d) for d in image_dirs]}')

  def __len__(self) -> int:
    return len(self.stems)

  def add(self, key: str, image: np.ndarray, name: str | None = None) -> bool:
    """Indexes one image (`uint8 [H, W, 3]` RGB) under `key`; False (nothing added) when it has < 2 keypoints."""
    pts, desc = _features(self._sift, image, max_side=MAX_REF_SIDE, min_side=MIN_QUERY_SIDE)
    if desc is None or len(pts) < 2:
      return False
    with self._lock:
      self.stems.append(key)
      self.names[key] = name or key
      self._local.append((pts, desc))
      self._global_rows.extend(global_descriptor(_central(image, f)) for f in VIEWS)
    return True

  def _global_matrix(self) -> np.ndarray:
    if self._global_rows:  # Appended since the last query.
      self._global = np.concatenate([self._global, np.stack(self._global_rows)])
      self._global_rows = []
    return self._global

  def _inliers(self, q_pts, q_desc, r_pts, r_desc) -> int:
    pairs = self._matcher.knnMatch(q_desc, r_desc.astype(np.float32), k=2)
    good = [p[0] for p in pairs if len(p) == 2 and p[0].distance < RATIO * p[1].distance]
    if len(good) < 4:
      return 0
    src = q_pts[[g.queryIdx for g in good]]
    dst = r_pts[[g.trainIdx for g in good]]
    transform, mask = cv2.estimateAffinePartial2D(src, dst, method=cv2.RANSAC, ransacReprojThreshold=RANSAC_PX)
    if transform is None or mask is None:
      return 0
    scale = float(np.sqrt(abs(np.linalg.det(transform[:, :2]))))
    if not 0.1 < scale < 10:
      return 0
    return int(mask.sum())

  def shortlist(self, image: np.ndarray, k: int = SHORTLIST) -> list[tuple[int, float]]:
    """Stage 1: the `k` images whose best view is most similar globally, `[(index, cosine)]`, best first."""
    with self._lock:
      g = self._global_matrix()
    sims = (g @ global_descriptor(image)).reshape(-1, len(VIEWS)).max(axis=1)
    k = min(k, len(sims))
    top = np.argpartition(-sims, k - 1)[:k]
    top = top[np.argsort(-sims[top], kind='stable')]
    return [(int(i), float(sims[i])) for i in top]

  def rank(self, image: np.ndarray) -> list[Match]:
    """The shortlisted images ranked for `image` (`uint8 [H, W, 3]` RGB or `[H, W]` gray), best first.

    Order: verified inliers (counted from MIN_INLIERS up), then global similarity. The best entry carries
    `score`. When the query has fewer than 2 keypoints, the shortlist in global order with 0 inliers.
    """
    short = self.shortlist(image)
    with self._lock:
      q_pts, q_desc = _features(self._query_sift, image, MAX_QUERY_SIDE, MIN_QUERY_SIDE)
      if q_desc is None or len(q_pts) < 2:  # Nothing to verify: the global ranking stands.
        return [Match(self.stems[i], 0, similarity=s) for i, s in short]
      q_desc = q_desc.astype(np.float32)
      matches = [Match(self.stems[i], self._inliers(q_pts, q_desc, *self._local[i]), similarity=s)
                 for i, s in short]
    matches.sort(key=lambda m: (m.inliers if m.inliers >= MIN_INLIERS else 0, m.similarity), reverse=True)
    second = max((m.inliers for m in matches[1:]), default=0)
    matches[0].score = matches[0].inliers / (matches[0].inliers + second + 5)
    return matches

  def best(self, image: np.ndarray) -> Match | None:
    """The confident top match (>= MIN_INLIERS inliers and score >= MIN_SCORE), else None."""
    ranked = self.rank(image)
    if not ranked or ranked[0].inliers < MIN_INLIERS or ranked[0].score < MIN_SCORE:
      return None
    return ranked[0]


LandmarkIndex = ImageIndex  # The former name (the default index is the landmark photos).


def describe(match: Match, name: str) -> str:
  """The tool's result text for a confident match (see module docstring)."""
  stem = match.stem.rsplit('/', 1)[-1]
  article = landmarks.LANDMARK_ARTICLES.get(stem)
  if article is not None:
    where = f'Wikipedia article: {article}'
  elif stem in landmarks.LANDMARK_NAMES:
    where = 'no Wikipedia article for it in the local corpus'
    related = landmarks.LANDMARK_RELATED.get(stem)
    if related is not None:
      where += f'; related article: {related}'
  else:
    where = f'image {match.stem}'
  return f'Best match: {name} ({where}), score {match.score:.2f} ({match.inliers} matched keypoints).'


def synthetic_distractor(rng: np.random.Generator, size: int = 96) -> np.ndarray:
  """A random synthetic photo-like image (smooth colour field + random shapes), `uint8 [size, size, 3]`."""
  field = cv2.resize(rng.integers(0, 256, (4, 4, 3), dtype=np.uint8), (size, size), interpolation=cv2.INTER_CUBIC)
  image = np.ascontiguousarray(field)
  for _ in range(int(rng.integers(3, 9))):
    color = tuple(int(c) for c in rng.integers(0, 256, 3))
    x, y = (int(v) for v in rng.integers(0, size, 2))
    r = int(rng.integers(4, size // 3))
    if rng.random() < 0.5:
      cv2.circle(image, (x, y), r, color, -1)
    else:
      cv2.rectangle(image, (x, y), (x + r, y + int(rng.integers(4, size // 3))), color, -1)
  return image


_LOCK = threading.Lock()


@functools.lru_cache(maxsize=4)
def _index_for(image_dirs: tuple[str, ...]) -> ImageIndex:
  return ImageIndex(image_dirs)


def get_index(image_dir: str | os.PathLike | Sequence[str | os.PathLike] | None = None) -> ImageIndex:
  """The process-wide index of a folder or list of folders (default `<data>/images/landmarks`), built once."""
  if image_dir is None or (not isinstance(image_dir, (str, os.PathLike)) and not image_dir):
    from osvl_jax import paths
    image_dir = paths.data_dir() / 'images' / 'landmarks'
  dirs = [image_dir] if isinstance(image_dir, (str, os.PathLike)) else list(image_dir)
  with _LOCK:
    return _index_for(tuple(str(pathlib.Path(d).resolve()) for d in dirs))
