"""Images as the model sees them: `ImageRef` and the Qwen3-VL `ImageProcessor` (DESIGN.md §4)."""

import dataclasses
import io
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from PIL import Image

# Qwen3-VL preprocessor_config.json: size.shortest_edge / size.longest_edge, mean = std = 0.5.
QWEN3_VL_MIN_PIXELS = 65536
QWEN3_VL_MAX_PIXELS = 16777216
QWEN3_VL_IMAGE_MEAN = (0.5, 0.5, 0.5)
QWEN3_VL_IMAGE_STD = (0.5, 0.5, 0.5)


@dataclasses.dataclass(eq=False)
class ImageRef:
  """One image of a trajectory, as the model sees it.

  Attributes:
    pixels: uint8 [H, W, 3] RGB, the original (tools crop/sharpen these; stored as PNG in records).
    pixel_values: float32 [N, 3 * temporal_patch_size * patch_size**2] (= [N, 1536]), N = prod(grid_thw);
      patches in the Qwen2-VL/Qwen3-VL order (merge-window major), normalised with mean = std = 0.5.
    grid_thw: int32 [3] = (1, H' / patch_size, W' / patch_size) of the resized image.
    patch_size, temporal_patch_size, merge_size: the vision tower's patching (16, 2, 2 for Qwen3-VL).
  """
  pixels: np.ndarray
  pixel_values: np.ndarray
  grid_thw: np.ndarray
  patch_size: int = 16
  temporal_patch_size: int = 2
  merge_size: int = 2

  @property
  def num_tokens(self) -> int:
    """Number of `<|image_pad|>` tokens: prod(grid_thw) // merge_size**2."""
    return int(np.prod(self.grid_thw)) // (self.merge_size ** 2)

  def to_png(self) -> bytes:
    """The original pixels as PNG bytes."""
    buf = io.BytesIO()
    Image.fromarray(self.pixels).save(buf, format='PNG', compress_level=3)
    return buf.getvalue()

  @classmethod
  def from_pixels_and_grid(cls, pixels: np.ndarray, grid_thw: Sequence[int], patch_size: int = 16,
                           temporal_patch_size: int = 2, merge_size: int = 2) -> 'ImageRef':
    """Rebuilds the ImageRef of `pixels` at a known grid (e.g. from a stored record); bit-identical to process()."""
    pixels = _check_rgb(pixels, 'stored image')
    grid = np.asarray(grid_thw, np.int32).reshape(3)
    pv = _pixel_values(pixels, int(grid[1]) * patch_size, int(grid[2]) * patch_size, patch_size,
                       temporal_patch_size, merge_size)
    return cls(pixels, pv, grid, patch_size, temporal_patch_size, merge_size)


def _check_rgb(image: Any, name: str) -> np.ndarray:
  """`image` as a contiguous uint8 [H, W, 3] array, or a ValueError naming `name` and what is wrong."""
  if isinstance(image, Image.Image):
    if image.mode != 'RGB':
      raise ValueError(f'{name}: PIL image in mode {image.mode!r}; expected RGB')
    image = np.asarray(image)
  if not isinstance(image, np.ndarray):
    raise ValueError(f'{name}: expected a numpy uint8 [H, W, 3] RGB array, got {type(image).__name__}')
  if image.dtype != np.uint8:
    raise ValueError(f'{name}: dtype {image.dtype}, expected uint8 [H, W, 3] RGB')
  if image.ndim != 3 or image.shape[2] != 3:
    raise ValueError(f'{name}: shape {image.shape}, expected [H, W, 3] RGB')
  if image.shape[0] == 0 or image.shape[1] == 0:
    raise ValueError(f'{name}: empty image of shape {image.shape}')
  return np.ascontiguousarray(image)


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
  """(H', W'), multiples of `factor` pixels, as close to the image's aspect ratio as the area bounds allow:
  each side rounded to the nearest multiple, then, when the area leaves [min_pixels, max_pixels], both sides
  scaled by the same factor (rounded down under the maximum, up over the minimum). Mirrors transformers'
  `qwen2_vl.image_processing_pil_qwen2_vl.smart_resize` (equal on every shape: tests/trajectory); written here
  because importing that module imports torch, which costs each process that builds trajectories 10-25 s.

  Raises:
    ValueError: the aspect ratio exceeds 200 (as transformers).
  """
  if max(height, width) / min(height, width) > 200:
    raise ValueError(f'absolute aspect ratio must be smaller than 200, got {max(height, width) / min(height, width)}')
  h, w = round(height / factor) * factor, round(width / factor) * factor
  if h * w > max_pixels:
    scale = math.sqrt(height * width / max_pixels)
    h = max(factor, math.floor(height / scale / factor) * factor)
    w = max(factor, math.floor(width / scale / factor) * factor)
  elif h * w < min_pixels:
    scale = math.sqrt(min_pixels / (height * width))
    h, w = math.ceil(height * scale / factor) * factor, math.ceil(width * scale / factor) * factor
  return h, w


def _pixel_values(pixels: np.ndarray, height: int, width: int, patch_size: int, temporal_patch_size: int,
                  merge_size: int) -> np.ndarray:
  """float32 [N, 3*T*P*P]: `pixels` resized (bicubic) to height x width, rescaled to [0, 1], normalised by the
  Qwen3-VL mean and std, and cut into patches in the merge order: rows of N = (H/P)(W/P) patches, each 2x2 block
  of merged patches consecutive, a patch's values ordered (channel, time, y, x) with the frame repeated over T.
  Bit-identical to transformers' `Qwen2VLImageProcessorPil` (`do_resize=False` after the same PIL resize;
  tests/trajectory/test_traj_images.py), computed here without importing it (see `smart_resize`)."""
  resized = np.asarray(Image.fromarray(pixels).resize((width, height), resample=Image.Resampling.BICUBIC))
  image = (resized.transpose(2, 0, 1).astype(np.float64) * (1 / 255)).astype(np.float32)  # [C, H, W]
  mean, std = np.asarray(QWEN3_VL_IMAGE_MEAN, np.float32), np.asarray(QWEN3_VL_IMAGE_STD, np.float32)
  image = (image - mean[:, None, None]) / std[:, None, None]
  gh, gw, m, p = height // patch_size, width // patch_size, merge_size, patch_size
  patches = image.reshape(3, gh // m, m, p, gw // m, m, p).transpose(1, 4, 2, 5, 0, 3, 6)  # [gh/m, gw/m, m, m, C, p, p]
  patches = np.broadcast_to(patches[:, :, :, :, :, None], (*patches.shape[:5], temporal_patch_size, p, p))
  return np.ascontiguousarray(patches.reshape(gh * gw, 3 * temporal_patch_size * p * p), dtype=np.float32)


class ImageProcessor:
  """Qwen3-VL image preprocessing: what transformers' `Qwen2VLImageProcessorPil` computes with Qwen3-VL settings.

  The image is resized so that both sides are multiples of patch_size * merge_size (32) and its area lies in
  [min_pixels, max_pixels] (HF `smart_resize`), then cut into patches. Defaults are the Qwen3-VL
  preprocessor_config values; CPU demos pass a smaller `max_pixels`/`min_pixels`.
  """

  def __init__(self, patch_size: int = 16, merge_size: int = 2, temporal_patch_size: int = 2,
               min_pixels: int = QWEN3_VL_MIN_PIXELS, max_pixels: int = QWEN3_VL_MAX_PIXELS):
    if min_pixels > max_pixels:
      raise ValueError(f'min_pixels={min_pixels} > max_pixels={max_pixels}')
    self.patch_size = patch_size
    self.merge_size = merge_size
    self.temporal_patch_size = temporal_patch_size
    self.min_pixels = min_pixels
    self.max_pixels = max_pixels

  def resized_shape(self, height: int, width: int) -> tuple[int, int]:
    """(H', W') the model sees for an H x W image (HF `smart_resize`)."""
    return smart_resize(height, width, self.patch_size * self.merge_size, self.min_pixels, self.max_pixels)

  def process(self, image: np.ndarray, name: str = 'image') -> ImageRef:
    """Preprocesses one image.

    Args:
      image: uint8 [H, W, 3] RGB (or an RGB PIL image).
      name: how errors refer to the image (e.g. 'img_2').
    Returns:
      ImageRef with pixel_values float32 [N, 1536] and grid_thw int32 [3]; num_tokens = N // 4.
    Raises:
      ValueError: naming `name`, for a non-RGB, non-uint8, empty or too elongated (aspect > 200) image.
    """
    pixels = _check_rgb(image, name)
    try:
      height, width = self.resized_shape(*pixels.shape[:2])
    except ValueError as e:
      raise ValueError(f'{name}: cannot resize image of shape {pixels.shape}: {e}') from e
    pv = _pixel_values(pixels, height, width, self.patch_size, self.temporal_patch_size, self.merge_size)
    grid = np.array([1, height // self.patch_size, width // self.patch_size], np.int32)
    return ImageRef(pixels, pv, grid, self.patch_size, self.temporal_patch_size, self.merge_size)
