"""`crop{image, x, y, width, height}` (same in both profiles): a box in pixels, clamped to the image.

The image is not downscaled to the pixel budget first (`budget=False`): the box is in the input's pixels.
A box that selects no pixels -> `bad_arguments`.
"""

import ml_collections
import numpy as np

from tools import base
from tools import image_ops
from tools import schema


def _make(cfg: ml_collections.ConfigDict):
  del cfg

  def body(image: np.ndarray, x: int, y: int, width: int, height: int) -> base.ToolResult:
    try:
      out, (x0, y0, x1, y1) = image_ops.crop(image, x, y, width, height)
    except image_ops.BadBox as e:
      raise schema.ArgumentError(str(e)) from None
    note = '' if (x0, y0, x1 - x0, y1 - y0) == (x, y, width, height) else (
        f' (requested x={x}, y={y}, width={width}, height={height}, clamped to the image)')
    return base.ToolResult(
        ok=True, images=[out],
        text=f'Cropped the region x={x0}, y={y0}, width={x1 - x0}, height={y1 - y0} of the '
             f'{image.shape[1]}x{image.shape[0]} image{note}; the crop is returned as a new image.')
  return body


PARAMS = (
    schema.Param('image', 'image', schema.IMAGE_DESC),
    schema.Param('x', 'integer', 'Left edge.'),
    schema.Param('y', 'integer', 'Top edge.'),
    schema.Param('width', 'integer', 'Box width.', minimum=1),
    schema.Param('height', 'integer', 'Box height.', minimum=1),
)
SPEC = schema.register(schema.ToolSpec(
    name='crop',
    description='Crop a box (pixels, clamped to the image) out of an image; returns it as a new image.',
    params=PARAMS,
    make=_make, budget=False,
    official=schema.OfficialSchema('crop', PARAMS)))
