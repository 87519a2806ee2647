"""tools/image_ops.py: crop and sharpen."""

import cv2
import numpy as np
import pytest
from PIL import Image

from osvl_jax import paths
from tools import image_ops


def _psnr(a, b):
  return 10 * np.log10(255.0 ** 2 / np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))


def test_crop_returns_box_in_pixels_row_major():
  image = np.arange(10 * 20 * 3, dtype=np.uint8).reshape(10, 20, 3)
  out, box = image_ops.crop(image, x=5, y=2, width=4, height=3)
  assert out.shape == (3, 4, 3) and out.dtype == np.uint8
  np.testing.assert_array_equal(out, image[2:5, 5:9])
  assert box == (5, 2, 9, 5)


def test_crop_clamps_to_image():
  image = np.zeros((10, 20, 3), np.uint8)
  out, box = image_ops.crop(image, x=-5, y=8, width=10, height=10)
  assert out.shape == (2, 5, 3) and box == (0, 8, 5, 10)


@pytest.mark.parametrize('box', [(0, 0, 0, 5), (0, 0, 5, -1), (20, 0, 5, 5), (0, -10, 5, 10)])
def test_crop_rejects_empty_boxes(box):
  with pytest.raises(image_ops.BadBox):
    image_ops.crop(np.zeros((10, 20, 3), np.uint8), *box)


def test_sharpen_brings_blurred_photo_closer_to_original():
  original = np.asarray(Image.open(paths.data_dir() / 'images/photos/astronaut.png').convert('RGB'))
  blurred = cv2.GaussianBlur(original, (0, 0), 1)
  sharpened = image_ops.sharpen(blurred, amount=1.5)
  assert sharpened.shape == original.shape and sharpened.dtype == np.uint8
  gain = _psnr(original, sharpened) - _psnr(original, blurred)
  assert gain > 2.0  # 29.6 dB -> 33.0 dB.


def test_sharpen_keeps_flat_image():
  flat = np.full((8, 8, 3), 77, np.uint8)
  np.testing.assert_array_equal(image_ops.sharpen(flat, 3.0), flat)
