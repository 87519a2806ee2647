"""Images in and out of the tools: decoding files/bytes (typed failure) and the pixel budget."""

import io
import os
import pathlib

import cv2
import numpy as np
from PIL import Image

DEFAULT_MAX_PIXELS = 4096 * 4096


class ImageDecodeError(ValueError):
  """A file or byte string that is not a readable image; the registry reports it as `backend_error`."""


def load_image(source: str | os.PathLike | bytes) -> np.ndarray:
  """Decodes an image file or encoded bytes to `uint8 [H, W, 3]` RGB.

  Raises:
    ImageDecodeError: missing file, empty / truncated / not an image (message gives the reason).
  """
  what = 'image bytes' if isinstance(source, (bytes, bytearray)) else str(source)
  try:
    data = bytes(source) if isinstance(source, (bytes, bytearray)) else pathlib.Path(source).read_bytes()
    if not data:
      raise ImageDecodeError(f'{what} is empty (0 bytes)')
    with Image.open(io.BytesIO(data)) as im:
      im.load()
      return np.asarray(im.convert('RGB'))
  except ImageDecodeError:
    raise
  except Exception as e:  # PIL raises UnidentifiedImageError, OSError (truncated), SyntaxError, ...
    raise ImageDecodeError(f'cannot decode {what}: {type(e).__name__}: {e}') from None


def fit_pixel_budget(image: np.ndarray, max_pixels: int) -> tuple[np.ndarray, str]:
  """Downscales `image` (area interpolation, aspect kept) so that H*W <= `max_pixels`.

  Args:
    image: `uint8 [H, W, 3]`.
    max_pixels: budget, pixels (<= 0: no budget).
  Returns:
    `(image, note)`; note is '' when unchanged, else e.g.
    ` (input 5000x4000 resized to 4579x3663 to fit the 16.8 MP pixel budget)`.
  """
  h, w = image.shape[:2]
  if max_pixels <= 0 or h * w <= max_pixels:
    return image, ''
  s = (max_pixels / (h * w)) ** 0.5
  nw, nh = max(1, int(w * s)), max(1, int(h * s))
  out = cv2.resize(image, (nw, nh), interpolation=cv2.INTER_AREA)
  return out, f' (input {w}x{h} resized to {nw}x{nh} to fit the {max_pixels / 1e6:.3g} MP pixel budget)'
