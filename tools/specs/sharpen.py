"""`sharpen{image, amount=1.5}` (same in both profiles): OpenCV unsharp mask, sigma `cfg.sharpen.sigma` px."""

import ml_collections
import numpy as np

from tools import base
from tools import image_ops
from tools import schema


def _make(cfg: ml_collections.ConfigDict):
  sigma = float(cfg.sharpen.sigma)

  def body(image: np.ndarray, amount: float = 1.5) -> base.ToolResult:
    if amount <= 0:
      raise schema.ArgumentError(f"argument 'amount' must be > 0, got {amount:g}")
    out = image_ops.sharpen(image, amount=amount, sigma=sigma)
    return base.ToolResult(
        ok=True, images=[out],
        text=f'Sharpened the {image.shape[1]}x{image.shape[0]} image (unsharp mask, amount {amount:g}, '
             f'sigma {sigma:g} px); the result is returned as a new image.')
  return body


PARAMS = (
    schema.Param('image', 'image', schema.IMAGE_DESC),
    schema.Param('amount', 'number', 'Strength.', required=False, default=1.5, minimum=0, maximum=10),
)
SPEC = schema.register(schema.ToolSpec(
    name='sharpen',
    description='Sharpen a blurry image (unsharp mask); returns a new image.',
    params=PARAMS,
    make=_make,
    official=schema.OfficialSchema('sharpen', PARAMS)))
