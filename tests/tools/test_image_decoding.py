"""tools/image_io.load_image decodes the way transformers' image loading does (DESIGN.md §5): EXIF orientation,
alpha on white, 16-bit / float scaled to 8 bits, and the header size refused above the pixel limit before any
full decode (small memory)."""

import io
import json
import pathlib
import struct
import subprocess
import sys
import textwrap
import time
import zlib

import cv2
import numpy as np
from PIL import Image
import pytest

from tools import image_io

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _encode(im: Image.Image, fmt: str, **kw) -> bytes:
  buf = io.BytesIO()
  im.save(buf, fmt, **kw)
  return buf.getvalue()


def _jpeg_with_orientation(orientation: int) -> bytes:
  """A 24 wide x 16 high JPEG: left half red, right half blue; EXIF tag 0x0112 = `orientation`."""
  a = np.zeros((16, 24, 3), np.uint8)
  a[:, :12] = (255, 0, 0)
  a[:, 12:] = (0, 0, 255)
  exif = Image.Exif()
  exif[0x0112] = orientation
  return _encode(Image.fromarray(a), 'JPEG', quality=95, exif=exif.tobytes())


# --- EXIF orientation ---------------------------------------------------------------------------------------

def test_exif_orientation_6_loads_rotated_24_high_16_wide():
  out = image_io.load_image(_jpeg_with_orientation(6))
  assert out.shape == (24, 16, 3) and out.dtype == np.uint8
  # Orientation 6 = rotate 90 deg clockwise to display: the stored left (red) half becomes the top.
  assert out[2, 8, 0] > 200 and out[2, 8, 2] < 60
  assert out[21, 8, 2] > 200 and out[21, 8, 0] < 60


@pytest.mark.parametrize('orientation,shape,top_is_red', [(1, (16, 24, 3), None), (3, (16, 24, 3), None),
                                                          (8, (24, 16, 3), False)])
def test_exif_orientation_neighbours(orientation, shape, top_is_red):
  out = image_io.load_image(_jpeg_with_orientation(orientation))
  assert out.shape == shape
  if orientation == 1:  # Unchanged: red on the left.
    assert out[8, 2, 0] > 200 and out[8, 21, 2] > 200
  if orientation == 3:  # Rotated 180 deg: red on the right.
    assert out[8, 21, 0] > 200 and out[8, 2, 2] > 200
  if orientation == 8:  # Rotated 90 deg counter-clockwise to display: the stored left (red) half at the bottom.
    assert out[21, 8, 0] > 200 and out[2, 8, 2] > 200


# --- Alpha composited on white ------------------------------------------------------------------------------

def test_fully_transparent_rgba_with_black_rgb_loads_white():
  png = _encode(Image.fromarray(np.zeros((8, 8, 4), np.uint8), 'RGBA'), 'PNG')
  out = image_io.load_image(png)
  assert out.shape == (8, 8, 3) and (out == 255).all()


def test_half_transparent_rgba_is_blended_with_white():
  a = np.zeros((4, 4, 4), np.uint8)
  a[..., 0], a[..., 3] = 255, 128  # Red at alpha 128/255.
  out = image_io.load_image(_encode(Image.fromarray(a, 'RGBA'), 'PNG'))
  np.testing.assert_allclose(out[0, 0], (255, 127, 127), atol=1)


def test_transparent_la_loads_white_and_opaque_la_keeps_gray():
  a = np.zeros((4, 6, 2), np.uint8)
  a[:, 3:] = (100, 255)  # Right half: opaque gray 100; left half: transparent black.
  out = image_io.load_image(_encode(Image.fromarray(a, 'LA'), 'PNG'))
  assert (out[:, :3] == 255).all() and (out[:, 3:] == 100).all()


def test_palette_png_with_trns_transparency_loads_white():
  im = Image.new('P', (6, 4), 0)
  im.putpalette([0, 0, 0, 0, 255, 0] + [0] * 762)  # Index 0 black, index 1 green.
  im.paste(1, (3, 0, 6, 4))
  png = _encode(im, 'PNG', transparency=0)  # tRNS: index 0 fully transparent.
  assert Image.open(io.BytesIO(png)).mode == 'P'
  out = image_io.load_image(png)
  assert (out[:, :3] == 255).all() and (out[:, 3:] == (0, 255, 0)).all()


def test_opaque_rgb_is_unchanged():
  a = np.random.default_rng(0).integers(0, 256, (5, 7, 3), dtype=np.uint8)
  np.testing.assert_array_equal(image_io.load_image(_encode(Image.fromarray(a), 'PNG')), a)


# --- 16-bit and float scaled, not clipped -------------------------------------------------------------------

def test_16bit_gray_png_ramp_is_scaled_to_8_bits():
  ramp = np.linspace(0, 65535, 256 * 64).round().astype(np.uint16).reshape(64, 256)
  png = _encode(Image.fromarray(ramp), 'PNG')
  assert Image.open(io.BytesIO(png)).mode.startswith('I;16')
  out = image_io.load_image(png)
  assert out.shape == (64, 256, 3) and out.dtype == np.uint8
  assert abs(out.mean() - 127.5) < 1.0  # Clipping would give ~254.
  assert out.min() == 0 and out.max() == 255
  np.testing.assert_array_equal(out[..., 0], out[..., 2])
  np.testing.assert_array_equal(out[0, ::51, 0], np.rint(ramp[0, ::51] / 257.0).astype(np.uint8))


def test_float_tiff_in_unit_range_is_scaled_to_8_bits():
  ramp = np.linspace(0.0, 1.0, 100 * 10, dtype=np.float32).reshape(10, 100)
  tif = _encode(Image.fromarray(ramp), 'TIFF')
  assert Image.open(io.BytesIO(tif)).mode == 'F'
  out = image_io.load_image(tif)
  assert abs(out.mean() - 127.5) < 1.0 and out.min() == 0 and out.max() == 255  # Not 0/1 after a cast.


def test_16bit_rgb_png_keeps_its_colours():
  a = np.zeros((4, 4, 3), np.uint16)
  a[...] = (0, 32768, 65535)  # BGR for OpenCV: R=65535, G=32768, B=0.
  ok, png = cv2.imencode('.png', a)
  assert ok
  out = image_io.load_image(png.tobytes())
  np.testing.assert_array_equal(out[0, 0], (255, 128, 0))


# --- Pixel limit from the header ----------------------------------------------------------------------------

def _blank_gray_png(width: int, height: int) -> bytes:
  """A valid 8-bit gray PNG of zeros, streamed (never materialises the pixels)."""
  def chunk(tag, data):
    return struct.pack('>I', len(data)) + tag + data + struct.pack('>I', zlib.crc32(tag + data) & 0xffffffff)
  comp, row, parts = zlib.compressobj(9), b'\x00' * (width + 1), []
  for _ in range(height):
    parts.append(comp.compress(row))
  parts.append(comp.flush())
  return (b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', width, height, 8, 0, 0, 0, 0))
          + chunk(b'IDAT', b''.join(parts)) + chunk(b'IEND', b''))


def test_9000x9000_png_refused_from_header_with_small_memory(tmp_path):
  path = tmp_path / 'huge.png'
  path.write_bytes(_blank_gray_png(9000, 9000))
  assert path.stat().st_size < 200_000  # ~80 KB compressed, 81 MB of pixels.
  # A fresh interpreter, so that ru_maxrss measures this load only (a full decode of 81 MP needs >= 81 MB).
  code = textwrap.dedent(f"""
      import json, resource, time
      from tools import image_io
      before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
      t0 = time.perf_counter()
      try:
        image_io.load_image({str(path)!r}, max_pixels=4096 * 4096)
        msg = None
      except image_io.ImageDecodeError as e:
        msg = str(e)
      try:
        image_io.load_image({str(path)!r})  # The default limit refuses it too.
        default_msg = None
      except image_io.ImageDecodeError as e:
        default_msg = str(e)
      print(json.dumps({{'msg': msg, 'default_msg': default_msg, 's': time.perf_counter() - t0,
                         'grew_kib': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before}}))
      """)
  out = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr
  r = json.loads(out.stdout.strip().splitlines()[-1])
  assert r['msg'] is not None and '9000x9000' in r['msg'] and '16777216' in r['msg'], r
  assert r['default_msg'] is not None and str(image_io.DEFAULT_MAX_DECODE_PIXELS) in r['default_msg'], r
  assert r['grew_kib'] < 20 * 1024, r  # Peak RSS grew by < 20 MiB (a decode would add >= 79 MiB).
  assert r['s'] < 1.0, r


def test_pixel_limit_boundary():
  png = _blank_gray_png(100, 100)
  assert image_io.load_image(png, max_pixels=10_000).shape == (100, 100, 3)  # Exactly at the limit: accepted.
  with pytest.raises(image_io.ImageDecodeError, match=r'100x100 = 10000 pixels, above the limit of 9999'):
    image_io.load_image(png, max_pixels=9_999)
  assert image_io.load_image(png, max_pixels=0).shape == (100, 100, 3)  # <= 0: no limit.


def test_limit_refusal_is_fast_without_subprocess(tmp_path):
  png = _blank_gray_png(9000, 9000)
  t0 = time.perf_counter()
  with pytest.raises(image_io.ImageDecodeError, match='9000x9000'):
    image_io.load_image(png, max_pixels=1_000_000)
  assert time.perf_counter() - t0 < 0.5


# --- Typed failures -----------------------------------------------------------------------------------------

@pytest.mark.parametrize('source', [b'', b'not an image', b'\x89PNG\r\n\x1a\n\x00\x00truncated'])
def test_undecodable_bytes_raise_image_decode_error(source):
  with pytest.raises(image_io.ImageDecodeError, match='cannot decode|empty'):
    image_io.load_image(source)


def test_missing_file_raises_image_decode_error(tmp_path):
  with pytest.raises(image_io.ImageDecodeError, match='no such file'):
    image_io.load_image(tmp_path / 'nope.png')
