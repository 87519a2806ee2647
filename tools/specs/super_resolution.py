"""`super_resolution{image, scale=2}` (same in both profiles): `cv2.dnn_superres`, or bicubic (said so).

The model is `<cfg.super_resolution.model_dir>/<MODEL>_x<scale>.pb`; without one the text says the result is
bicubic interpolation only. The input is downscaled first so that the output fits `cfg.max_image_pixels`.
"""

import ml_collections
import numpy as np

from tools import base
from tools import image_io
from tools import image_ops
from tools import schema


def _make(cfg: ml_collections.ConfigDict):
  sr = cfg.super_resolution
  budget = int(cfg.max_image_pixels)

  def body(image: np.ndarray, scale: int = 2) -> base.ToolResult:
    model = image_ops.find_sr_model(sr.model_dir, sr.model, scale)
    note = ''
    if budget > 0 and image.shape[0] * image.shape[1] * scale * scale > budget:
      image, note = image_io.fit_pixel_budget(image, budget // (scale * scale))
      note = note.replace('pixel budget', f'pixel budget after x{scale}')
    h, w = image.shape[:2]
    out, method = image_ops.super_resolve(image, scale, model)
    if model is None:
      why = (f'no {sr.model} x{scale} model file in {sr.model_dir!r}' if sr.model_dir
             else 'no super-resolution model is configured')
      method = f'bicubic interpolation only ({why}; no detail was added)'
    return base.ToolResult(
        ok=True, images=[out],
        text=f'Upscaled the {w}x{h} image x{scale} to {out.shape[1]}x{out.shape[0]} with {method}{note}; '
             'the result is returned as a new image.')
  return body


PARAMS = (
    schema.Param('image', 'image', schema.IMAGE_DESC),
    schema.Param('scale', 'integer', 'Upscaling factor.', required=False, default=2, minimum=2, maximum=4),
)
SPEC = schema.register(schema.ToolSpec(
    name='super_resolution',
    description='Upscale a small or low-resolution image (learned super-resolution); returns a new image.',
    params=PARAMS,
    make=_make,
    official=schema.OfficialSchema('super_resolution', PARAMS)))
