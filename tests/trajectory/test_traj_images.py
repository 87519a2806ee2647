"""ImageProcessor: Qwen3-VL grids, pad counts, parity with transformers, clear errors."""

import numpy as np
import pytest
import transformers

from osvl_jax import trajectory as tj


@pytest.mark.parametrize('hw,grid,tokens', [((64, 64), (1, 4, 4), 4), ((96, 160), (1, 6, 10), 15)])
def test_pad_counts_small_processor(small_processor, rng, hw, grid, tokens):
  ref = small_processor.process(rng.integers(0, 256, (*hw, 3), dtype=np.uint8))
  assert ref.grid_thw.tolist() == list(grid) and ref.grid_thw.dtype == np.int32
  assert ref.num_tokens == tokens
  assert ref.pixel_values.shape == (np.prod(grid), 1536) and ref.pixel_values.dtype == np.float32


@pytest.mark.parametrize('hw,grid,tokens', [((64, 64), (1, 16, 16), 64), ((96, 160), (1, 14, 22), 77)])
def test_pad_counts_qwen3_vl_defaults(rng, hw, grid, tokens):
  # Default min_pixels = 65536 (256x256) upsamples small images.
  ref = tj.ImageProcessor().process(rng.integers(0, 256, (*hw, 3), dtype=np.uint8))
  assert ref.grid_thw.tolist() == list(grid)
  assert ref.num_tokens == tokens


@pytest.mark.parametrize('hw', [(75, 131), (300, 20), (16, 16), (257, 255), (40, 700)])
def test_matches_transformers_processor(small_processor, rng, hw):
  # Shapes that round each side, hit the max-pixel rescale (257x255), the min-pixel one (16x16) and a long strip.
  img = rng.integers(0, 256, (*hw, 3), dtype=np.uint8)
  hf = transformers.Qwen2VLImageProcessorPil(
      patch_size=16, merge_size=2, temporal_patch_size=2, min_pixels=32 * 32, max_pixels=256 * 256,
      image_mean=[0.5] * 3, image_std=[0.5] * 3)
  want = hf(images=[img], return_tensors='np')
  ref = small_processor.process(img)
  np.testing.assert_array_equal(ref.grid_thw, want['image_grid_thw'][0])
  np.testing.assert_array_equal(ref.pixel_values, want['pixel_values'])


def test_smart_resize_equals_transformers_on_every_shape():
  from transformers.models.qwen2_vl import image_processing_pil_qwen2_vl as hf  # pylint: disable=g-import-not-at-top
  budgets = ((32, 32 * 32, 256 * 256), (32, tj.QWEN3_VL_MIN_PIXELS, tj.QWEN3_VL_MAX_PIXELS), (28, 3136, 12845056))
  for factor, lo, hi in budgets:
    for h in range(1, 1200, 7):
      for w in (1, 5, 31, 32, 33, 100, 257, 640, 1023, 4000):
        if max(h, w) / min(h, w) > 200:
          with pytest.raises(ValueError, match='aspect ratio'):
            tj.images.smart_resize(h, w, factor, lo, hi)
          continue
        assert tj.images.smart_resize(h, w, factor, lo, hi) == hf.smart_resize(h, w, factor, lo, hi), (h, w, factor)


def test_rebuild_from_pixels_and_grid_is_bit_identical(small_processor, rng):
  ref = small_processor.process(rng.integers(0, 256, (50, 90, 3), dtype=np.uint8))
  again = tj.ImageRef.from_pixels_and_grid(ref.pixels, ref.grid_thw)
  np.testing.assert_array_equal(again.pixel_values, ref.pixel_values)


@pytest.mark.parametrize('bad,what', [
    (np.zeros((8, 8), np.uint8), 'shape'),
    (np.zeros((8, 8, 4), np.uint8), 'shape'),
    (np.zeros((8, 8, 3), np.float32), 'dtype'),
    (np.zeros((0, 8, 3), np.uint8), 'empty'),
    (np.zeros((1, 300, 3), np.uint8), 'aspect'),
    (b'not an image', 'numpy'),
])
def test_bad_image_error_names_the_input(small_processor, bad, what):
  with pytest.raises(ValueError, match=f'img_7.*{what}'):
    small_processor.process(bad, name='img_7')
