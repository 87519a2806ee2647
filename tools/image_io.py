"""Images in and out of the tools: THE image decoder of the project (DESIGN.md §5) and the pixel budget.

`load_image` is the one function that turns an encoded image (file or bytes) into pixels, for the tools, the
image processor and the data loaders alike. It decodes the way transformers' image loading does
(`transformers.image_utils.load_image` + `image_transforms.convert_to_rgb`):
  - the size is read from the header (PIL's lazy open) and refused above `max_pixels` BEFORE any full decode;
  - the EXIF orientation is applied (`PIL.ImageOps.exif_transpose`), so a photo stored 24 wide x 16 high with
    orientation 6 loads as 24 high x 16 wide;
  - alpha (RGBA, LA, PA, premultiplied RGBa / La, palette or RGB/L transparency from a tRNS chunk) is composited
    on white, not dropped (dropping exposes whatever RGB a fully transparent pixel happens to hold);
  - 16-bit (`I;16*`, `I`) images are scaled to 8 bits (x 255 / 65535), float (`F`) images from [0, 1] (x 255),
    not clipped; 48-bit RGB PNGs are read at 8 bits by PIL itself (high byte);
  - the first frame of a multi-frame file (GIF, TIFF, APNG) is used.
"""

import io
import os
import pathlib

import cv2
import numpy as np
from PIL import Image
from PIL import ImageOps

# Tool input budget: larger image arguments are downscaled (area) to this many pixels, H*W.
DEFAULT_MAX_PIXELS = 4096 * 4096
# Decode limit: files whose header announces more pixels than this are refused without decoding (67.1 MP;
# a decoded RGB image of that size is 192 MiB). Callers may pass another `max_pixels` (<= 0: no limit).
DEFAULT_MAX_DECODE_PIXELS = 8192 * 8192

_EXIF_ORIENTATION = 0x0112
_ALPHA_MODES = frozenset({'RGBA', 'RGBa', 'LA', 'La', 'PA'})
_HIGH_DEPTH_MODES = frozenset({'I', 'I;16', 'I;16L', 'I;16B', 'I;16N', 'F'})


class ImageDecodeError(ValueError):
  """A file or byte string that is not a readable image, or one above the pixel limit; the tool registry
  reports it as `backend_error`."""


def load_image(source: str | os.PathLike | bytes | bytearray,
               max_pixels: int = DEFAULT_MAX_DECODE_PIXELS) -> np.ndarray:
  """Decodes an image file or encoded bytes to `uint8 [H, W, 3]` RGB (see the module docstring for how).

  Args:
    source: a path (str / PathLike) or the encoded bytes (PNG, JPEG, WebP, TIFF, GIF, BMP, ...).
    max_pixels: largest accepted width*height read from the header, pixels (<= 0: no limit). PIL's own
      decompression-bomb guard (`Image.MAX_IMAGE_PIXELS`, 2x of it raises) still applies on top.
  Returns:
    `uint8 [H, W, 3]` RGB, H x W after the EXIF orientation is applied.
  Raises:
    ImageDecodeError: missing file, empty / truncated / not an image, or a header size above `max_pixels`
      (the message gives the reason: e.g. the W x H size and the limit).
  """
  what = 'image bytes' if isinstance(source, (bytes, bytearray)) else str(source)
  try:
    if isinstance(source, (bytes, bytearray)):
      data = bytes(source)
    else:
      path = pathlib.Path(source)
      if not path.is_file():
        raise ImageDecodeError(f'cannot decode {what}: no such file')
      data = path.read_bytes()
    if not data:
      raise ImageDecodeError(f'{what} is empty (0 bytes)')
    with Image.open(io.BytesIO(data)) as im:  # Lazy: reads the header only.
      w, h = im.size
      if max_pixels > 0 and w * h > max_pixels:
        raise ImageDecodeError(f'{what} is {w}x{h} = {w * h} pixels, above the limit of {max_pixels} pixels '
                               '(refused before decoding)')
      im.load()
      if im.getexif().get(_EXIF_ORIENTATION, 1) not in (0, 1):
        im = ImageOps.exif_transpose(im)  # Copies: only when there is something to undo.
      return to_rgb(im)
  except ImageDecodeError:
    raise
  except Exception as e:  # PIL raises UnidentifiedImageError, OSError (truncated), SyntaxError, ...
    raise ImageDecodeError(f'cannot decode {what}: {type(e).__name__}: {e}') from None


def to_rgb(im: Image.Image) -> np.ndarray:
  """`uint8 [H, W, 3]` RGB of a decoded PIL image: alpha composited on white, 16-bit / float scaled to 8 bits.

  Raises:
    ValueError: a float image with NaN / inf, or a mode PIL cannot convert to RGB.
  """
  if im.mode in _HIGH_DEPTH_MODES:
    return np.repeat(_scale_to_uint8(np.asarray(im), im.mode)[..., None], 3, axis=-1)
  if im.mode in _ALPHA_MODES or 'transparency' in im.info:
    rgba = im.convert('RGBA')
    white = Image.new('RGBA', rgba.size, (255, 255, 255, 255))
    white.alpha_composite(rgba)
    return np.asarray(white.convert('RGB'))
  return np.asarray(im.convert('RGB'))


def _scale_to_uint8(a: np.ndarray, mode: str) -> np.ndarray:
  """`uint8 [H, W]` of a 16-bit / 32-bit integer or float gray image.

  Integers: x 255 / 65535 (the 16-bit range; `I` images with values above 65535 or below 0 are scaled from
  their own [min, max]). Floats: x 255 from [0, 1]; a float image outside [0, 1] is scaled from its own
  [min, max] (so nothing is clipped).
  """
  a = a.astype(np.float64)
  if mode == 'F':
    if not np.isfinite(a).all():
      raise ValueError('float image holds NaN or inf values')
    lo, hi = (0.0, 1.0) if a.size == 0 or (a.min() >= 0.0 and a.max() <= 1.0) else (a.min(), a.max())
  else:
    lo, hi = (0.0, 65535.0) if a.size == 0 or (a.min() >= 0 and a.max() <= 65535) else (a.min(), a.max())
  scaled = (a - lo) * (255.0 / (hi - lo)) if hi > lo else np.zeros_like(a)
  return np.clip(np.rint(scaled), 0, 255).astype(np.uint8)


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


def read_size(data: bytes | bytearray, what: str = 'image bytes') -> tuple[int, int]:
  """(width, height) of encoded image bytes from the header alone (PIL's lazy open: nothing is decoded).

  Raises:
    ImageDecodeError: empty bytes or not an image PIL can identify (the message names `what`).
  """
  if not data:
    raise ImageDecodeError(f'{what} is empty (0 bytes)')
  try:
    with Image.open(io.BytesIO(bytes(data))) as im:
      return im.size
  except Exception as e:  # UnidentifiedImageError, OSError, SyntaxError, ...
    raise ImageDecodeError(f'cannot decode {what}: {type(e).__name__}: {e}') from None
