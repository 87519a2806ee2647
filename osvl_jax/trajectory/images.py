"""Images as the model sees them: `ImageRef` and the Qwen3-VL `ImageProcessor` (DESIGN.md §4)."""

import dataclasses
import functools
import io
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


@functools.lru_cache(maxsize=8)
def _hf_processor(patch_size: int, temporal_patch_size: int, merge_size: int):
  import transformers  # pylint: disable=g-import-not-at-top
  return transformers.Qwen2VLImageProcessorPil(
      patch_size=patch_size, temporal_patch_size=temporal_patch_size, merge_size=merge_size,
      image_mean=list(QWEN3_VL_IMAGE_MEAN), image_std=list(QWEN3_VL_IMAGE_STD), do_resize=False)


def _pixel_values(pixels: np.ndarray, height: int, width: int, patch_size: int, temporal_patch_size: int,
                  merge_size: int) -> np.ndarray:
  """float32 [N, 3*T*P*P]: `pixels` resized (bicubic, as the HF processor) to height x width, then patchified."""
  resized = np.asarray(Image.fromarray(pixels).resize((width, height), resample=Image.Resampling.BICUBIC))
  out = _hf_processor(patch_size, temporal_patch_size, merge_size)(
      images=[resized], do_resize=False, input_data_format='channels_last', return_tensors='np')
  return np.asarray(out['pixel_values'], dtype=np.float32)


class ImageProcessor:
  """Qwen3-VL image preprocessing (transformers `Qwen2VLImageProcessorPil` with Qwen3-VL settings).

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
    from transformers.models.qwen2_vl import image_processing_pil_qwen2_vl as hf  # pylint: disable=g-import-not-at-top
    return hf.smart_resize(height, width, factor=self.patch_size * self.merge_size, min_pixels=self.min_pixels,
                        max_pixels=self.max_pixels)

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
