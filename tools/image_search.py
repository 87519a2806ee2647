"""Local `image_search` backend: near-duplicate lookup over the landmark photos (`images/landmarks/*.jpg`).

Method: SIFT keypoints (OpenCV) of every reference photo; for a query, Lowe's ratio test (0.8) against each
reference, then a RANSAC 4-DOF similarity fit (`cv2.estimateAffinePartial2D`, 4 px) whose inliers are the
evidence; fits with an implausible scale (outside 0.1..10) count as 0. A match is confident when the best
reference has at least `MIN_INLIERS` inliers and `score = best / (best + second + 5) >= MIN_SCORE`, i.e. it
stands out from the runner-up. Queries are downscaled to at most `MAX_QUERY_SIDE` px (speed; points are mapped
back). On the 25 photos: top-1 right for the photo itself (score >= 0.93), Gaussian blur sigma 2 (>= 0.72),
50 % downscale (>= 0.85), both (>= 0.73), 75 % centre crop, 15 deg rotation, JPEG q30, mild perspective;
non-landmark photos (astronaut, documents, OCR scenes) score <= 0.44 with <= 8 inliers.

Result text:
  `Best match: Taj Mahal (Wikipedia article: Taj_Mahal), score 0.93 (243 matched keypoints).`
  `Best match: Eiffel Tower (no Wikipedia article for it in the local corpus; related article: Paris), ...`
  `Best match: Tower at sunset (no Wikipedia article for it in the local corpus), ...`
"""

import dataclasses
import functools
import os
import pathlib
import threading

import cv2
import numpy as np
from PIL import Image

from tools import landmarks

RATIO = 0.8
RANSAC_PX = 4.0
MIN_INLIERS = 8
MIN_SCORE = 0.55
MAX_QUERY_SIDE = 400


@dataclasses.dataclass
class Match:
  """One reference photo's evidence for a query.

  Attributes:
    stem: file stem of the reference photo, e.g. `taj-mahal`.
    inliers: RANSAC inlier count (matched keypoints consistent with one similarity transform).
    score: `inliers / (inliers + runner_up_inliers + 5)`, in [0, 1); only set on the best match.
  """
  stem: str
  inliers: int
  score: float = 0.0


def _features(sift, image: np.ndarray, max_side: int | None = None) -> tuple[np.ndarray, np.ndarray | None]:
  """SIFT keypoints `float32 [K, 2]` (x, y in the input's pixels) and descriptors `float32 [K, 128]` or None."""
  if image.ndim == 2:
    gray = image
  else:
    gray = cv2.cvtColor(np.ascontiguousarray(image[..., :3]), cv2.COLOR_RGB2GRAY)
  scale = 1.0
  if max_side is not None and max(gray.shape) > max_side:
    scale = max_side / max(gray.shape)
    gray = cv2.resize(gray, None, fx=scale, fy=scale, interpolation=cv2.INTER_AREA)
  kps, desc = sift.detectAndCompute(gray, None)
  pts = np.float32([k.pt for k in kps]).reshape(-1, 2) / scale
  return pts, desc


class LandmarkIndex:
  """SIFT index of a folder of photos (default: the landmark photos).

  Attributes:
    stems: file stems, index order.
    names: stem -> display name (`landmarks.LANDMARK_NAMES`, else the stem).
  """

  def __init__(self, image_dir: str | os.PathLike):
    self._sift = cv2.SIFT_create()
    self._matcher = cv2.BFMatcher(cv2.NORM_L2)
    self._lock = threading.Lock()  # OpenCV objects are not shared across threads safely.
    self.stems, self._feats = [], []
    for path in sorted(pathlib.Path(image_dir).glob('*')):
      if path.suffix.lower() not in ('.jpg', '.jpeg', '.png'):
        continue
      image = np.asarray(Image.open(path).convert('RGB'))
      pts, desc = _features(self._sift, image)
      if desc is None or len(pts) < 2:
        continue
      self.stems.append(path.stem)
      self._feats.append((pts, desc))
    if not self.stems:
      raise FileNotFoundError(f'no indexable .jpg/.png photos in {image_dir}')
    self.names = {s: landmarks.LANDMARK_NAMES.get(s, s) for s in self.stems}

  def _inliers(self, q_pts, q_desc, r_pts, r_desc) -> int:
    pairs = self._matcher.knnMatch(q_desc, r_desc, k=2)
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

  def rank(self, image: np.ndarray) -> list[Match]:
    """All references ranked by inliers for `image` (`uint8 [H, W, 3]` RGB or `[H, W]` gray), best first.

    The best entry carries `score`; the list is empty when the query has fewer than 2 keypoints.
    """
    with self._lock:
      q_pts, q_desc = _features(self._sift, image, MAX_QUERY_SIDE)
      if q_desc is None or len(q_pts) < 2:
        return []
      counts = [self._inliers(q_pts, q_desc, p, d) for p, d in self._feats]
    order = np.argsort(counts, kind='stable')[::-1]
    matches = [Match(self.stems[i], counts[i]) for i in order]
    second = matches[1].inliers if len(matches) > 1 else 0
    matches[0].score = matches[0].inliers / (matches[0].inliers + second + 5)
    return matches

  def best(self, image: np.ndarray) -> Match | None:
    """The confident top match (>= MIN_INLIERS inliers and score >= MIN_SCORE), else None."""
    ranked = self.rank(image)
    if not ranked or ranked[0].inliers < MIN_INLIERS or ranked[0].score < MIN_SCORE:
      return None
    return ranked[0]


def describe(match: Match, name: str) -> str:
  """The tool's result text for a confident match (see module docstring)."""
  article = landmarks.LANDMARK_ARTICLES.get(match.stem)
  if article is not None:
    where = f'Wikipedia article: {article}'
  else:
    where = 'no Wikipedia article for it in the local corpus'
    related = landmarks.LANDMARK_RELATED.get(match.stem)
    if related is not None:
      where += f'; related article: {related}'
  return f'Best match: {name} ({where}), score {match.score:.2f} ({match.inliers} matched keypoints).'


_LOCK = threading.Lock()


@functools.lru_cache(maxsize=4)
def _index_for(image_dir: str) -> LandmarkIndex:
  return LandmarkIndex(image_dir)


def get_index(image_dir: str | os.PathLike | None = None) -> LandmarkIndex:
  """The process-wide index of `image_dir` (default `<data>/images/landmarks`), built on first use (~0.3 s)."""
  if image_dir is None:
    from osvl_jax import paths
    image_dir = paths.data_dir() / 'images' / 'landmarks'
  with _LOCK:
    return _index_for(str(pathlib.Path(image_dir).resolve()))
