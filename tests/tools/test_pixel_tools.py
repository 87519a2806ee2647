"""The pixel tools through ToolEnv: sharpen defaults, super_resolution, perspective_correct, pixel budget, corrupt
images; and ocr on the English sample images against hand-written transcripts."""

import cv2
import numpy as np
import pytest

from osvl_jax import paths
from tools import image_io
from tools import image_ops
from tools import ocr
from tools import env as tools_env

IMAGES = paths.data_dir() / 'images'
SR_MODELS = paths.data_dir() / 'superres' / 'models'

# Hand-written transcripts (read off the images), reading order.
ENGLISH_TRANSCRIPTS = {
    'easyocr_english.jpg': (None, 'Reduce your risk of coronavirus infection: Clean hands with soap and water or '
                                  'alcohol-based hand rub Cover nose and mouth when coughing and sneezing with '
                                  'tissue or flexed elbow Avoid close contact with anyone with cold or flu-like '
                                  'symptoms Thoroughly cook meat and eggs No unprotected contact with live wild or '
                                  'farm animals World Health Organization'),
    # The street-sign photo above its printed result panel (rows 0..224).
    'easyocr_example3.png': (225, '50 40 SPEED LIMIT BASRURKAR MARKET'),
}


def _psnr(a, b):
  return 10 * np.log10(255.0 ** 2 / np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))


def _load(rel):
  return image_io.load_image(IMAGES / rel)


def ocr_cer_english() -> float:
  """Mean CER of the local OCR over ENGLISH_TRANSCRIPTS."""
  cers = []
  for name, (rows, ref) in ENGLISH_TRANSCRIPTS.items():
    im = _load(f'ocr/{name}')
    cers.append(ocr.cer(ocr.plain_text(ocr.run_local(im[:rows] if rows else im)), ref))
  return float(np.mean(cers))


@pytest.fixture(scope='module')
def env():
  return tools_env.ToolEnv({'enabled': ('ocr', 'sharpen', 'super_resolution', 'perspective_correct', 'crop'),
                           'super_resolution': {'model_dir': str(SR_MODELS), 'model': 'FSRCNN'}})


def test_sharpen_default_args_raise_psnr_for_blur_sigma_1_to_2(env):
  original = _load('photos/astronaut.png')
  for sigma in (1, 1.5, 2):
    blurred = cv2.GaussianBlur(original, (0, 0), sigma)
    r = env.call('sharpen', {'image': 'img_1'}, [blurred])
    assert r.ok and _psnr(original, r.images[0]) > _psnr(original, blurred) + 0.5, sigma


def test_sharpen_raises_laplacian_variance_of_motion_blurred_clock(env):
  clock = _load('blur/clock_motion.png')
  r = env.call('sharpen', {'image': 'img_1'}, [clock])
  assert image_ops.laplacian_variance(r.images[0]) > 1.5 * image_ops.laplacian_variance(clock)


def _downscaled_photo():
  original = _load('photos/astronaut.png')
  return original, cv2.resize(original, None, fx=0.5, fy=0.5, interpolation=cv2.INTER_AREA)


def test_super_resolution_fsrcnn_x2_beats_bicubic(env):
  original, small = _downscaled_photo()
  r = env.call('super_resolution', {'image': 'img_1', 'scale': 2}, [small])
  assert r.ok and 'FSRCNN x2' in r.text and r.images[0].shape == original.shape
  bicubic, method = image_ops.super_resolve(small, 2, None)
  assert method == 'bicubic'
  assert _psnr(original, r.images[0]) > _psnr(original, bicubic) + 0.3


def test_super_resolution_without_model_says_bicubic():
  env = tools_env.ToolEnv({'enabled': ('super_resolution',)})
  r = env.call('super_resolution', {'image': 'img_1', 'scale': 3}, [np.zeros((10, 12, 3), np.uint8)])
  assert r.ok and r.images[0].shape == (30, 36, 3)
  assert 'bicubic interpolation only' in r.text and 'no super-resolution model is configured' in r.text


@pytest.mark.parametrize('model', ['ESPCN', 'LapSRN'])
def test_super_resolution_model_chosen_by_config(model):
  env = tools_env.ToolEnv({'enabled': ('super_resolution',),
                          'super_resolution': {'model_dir': str(SR_MODELS), 'model': model}})
  r = env.call('super_resolution', {'image': 'img_1'}, [np.full((8, 8, 3), 100, np.uint8)])
  assert r.ok and f'{model.upper()} x2' in r.text


def card_corner_error_deg(out: np.ndarray) -> float:
  """Max |angle - 90| over the 4 corners of the bright card found (Otsu) in a perspective-corrected image."""
  gray = cv2.cvtColor(out, cv2.COLOR_RGB2GRAY)
  _, mask = cv2.threshold(gray, 0, 255, cv2.THRESH_BINARY + cv2.THRESH_OTSU)
  contour = max(cv2.findContours(mask, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)[0], key=cv2.contourArea)
  quad = cv2.approxPolyDP(contour, 0.02 * cv2.arcLength(contour, True), True).reshape(-1, 2)
  assert len(quad) == 4, quad
  return float(np.max(np.abs(image_ops.quad_corner_angles(quad) - 90)))


def test_perspective_correct_makes_the_notecard_rectangular(env):
  card = _load('documents/notecard_perspective.png')
  r = env.call('perspective_correct', {'image': 'img_1'}, [card])
  assert r.ok and 'Found a quadrilateral' in r.text and len(r.images) == 1
  h, w = r.images[0].shape[:2]
  assert 1.3 < w / h < 1.8  # An index card lies landscape.
  out, _ = image_ops.warp_quad(card, image_ops.find_document_quad(card), margin=0.08)  # Card + some desk.
  assert card_corner_error_deg(out) < 3.0


def test_perspective_correct_says_so_when_no_quad(env):
  r = env.call('perspective_correct', {'image': 'img_1'}, [np.full((40, 50, 3), 128, np.uint8)])
  assert r.ok and r.images == [] and 'No document or card outline' in r.text


def test_inputs_over_the_pixel_budget_are_resized_and_the_text_says_so():
  env = tools_env.ToolEnv({'enabled': ('sharpen', 'crop'), 'max_image_pixels': 10_000})
  r = env.call('sharpen', {'image': 'img_1'}, [np.zeros((200, 400, 3), np.uint8)])
  assert r.ok and r.images[0].shape[0] * r.images[0].shape[1] <= 10_000
  assert 'input 400x200 resized to 141x70 to fit the 0.01 MP pixel budget' in r.text
  r = env.call('crop', {'image': 'img_1', 'x': 300, 'y': 0, 'width': 50, 'height': 50},
               [np.zeros((200, 400, 3), np.uint8)])  # crop keeps the input's pixels.
  assert r.ok and r.images[0].shape == (50, 50, 3) and 'budget' not in r.text


@pytest.mark.parametrize('source', [b'not an image', b'\x89PNG\r\n\x1a\n\x00\x00truncated', b''])
def test_corrupt_image_is_backend_error_with_reason(env, source, tmp_path):
  path = tmp_path / 'bad.png'
  path.write_bytes(source)
  for image in (source, path):
    r = env.call('sharpen', {'image': 'img_1'}, [image])
    assert (r.ok, r.error_kind) == (False, 'backend_error')
    assert 'corrupt or unreadable image' in r.text and ('cannot decode' in r.text or 'empty' in r.text)


def test_ocr_reads_english_samples_with_low_cer(env):
  assert ocr_cer_english() <= 0.15


def test_ocr_text_lists_regions_in_reading_order_with_boxes(env):
  r = env.call('ocr', {'image': 'img_1'}, [_load('ocr/easyocr_english.jpg')])
  lines = r.text.split('\n')
  assert r.ok and lines[0].startswith('Text found (12 regions, reading order')
  assert lines[1].endswith(') Reduce your risk of coronavirus infection:') and lines[1].startswith('[1] (')
  r = env.call('ocr', {'image': 'img_1'}, [np.full((32, 32, 3), 255, np.uint8)])
  assert r.ok and r.text == 'No text found in the image.'
