"""Image degradations of the `degrade` eval mode: the failures the enhancement tools exist to repair (Sec. 3).

  blur       Gaussian blur, sigma = 2.5% of the shorter side (>= 1.5 px)          repaired by `sharpen`
  downscale  area-downscale to 1/4 per side (>= 16 px), then back up (nearest)     repaired by `crop` / `super_resolution`
  skew       perspective warp: two corners pulled in by 18% of the width/height   repaired by `perspective_correct`

All are deterministic functions of the image and the kind (no randomness), uint8 [H, W, 3] in and out, same size.
"""

import hashlib
from collections.abc import Sequence

import cv2
import numpy as np

KINDS = ('blur', 'downscale', 'skew')


def degrade(image: np.ndarray, kind: str) -> np.ndarray:
  """The degraded copy of `image` (uint8 [H, W, 3]; same shape).

  Raises:
    ValueError: unknown `kind`, or an image that is not uint8 [H, W, 3].
  """
  if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
    raise ValueError(f'expected uint8 [H, W, 3], got {image.dtype} {image.shape}')
  h, w = image.shape[:2]
  if kind == 'blur':
    sigma = max(1.5, 0.025 * min(h, w))
    return cv2.GaussianBlur(image, (0, 0), sigmaX=sigma)
  if kind == 'downscale':
    small = cv2.resize(image, (max(16, w // 4), max(16, h // 4)), interpolation=cv2.INTER_AREA)
    return cv2.resize(small, (w, h), interpolation=cv2.INTER_NEAREST)
  if kind == 'skew':
    src = np.float32([[0, 0], [w - 1, 0], [w - 1, h - 1], [0, h - 1]])
    dx, dy = 0.18 * w, 0.18 * h
    dst = np.float32([[dx, dy], [w - 1, 0], [w - 1, h - 1], [dx, h - 1 - dy]])
    matrix = cv2.getPerspectiveTransform(src, dst)
    return cv2.warpPerspective(image, matrix, (w, h), borderMode=cv2.BORDER_CONSTANT, borderValue=(255, 255, 255))
  raise ValueError(f'degradation {kind!r} is not one of {KINDS}')


def kind_for(item_id: str, kinds: Sequence[str] = KINDS) -> str:
  """The degradation of an item: kinds[sha1(id) mod len(kinds)], stable across runs and machines."""
  return kinds[int(hashlib.sha1(item_id.encode()).hexdigest(), 16) % len(kinds)]
