"""`perspective_correct{image}` (same in both profiles): Canny + largest quadrilateral + warp.

When no quadrilateral covering at least `cfg.perspective_correct.min_area_frac` of the image is found, the
result is ok, has no image, and its text says so.
"""

import ml_collections
import numpy as np

from tools import base
from tools import image_ops
from tools import schema


def _make(cfg: ml_collections.ConfigDict):
  min_area = float(cfg.perspective_correct.min_area_frac)

  def body(image: np.ndarray) -> base.ToolResult:
    quad = image_ops.find_document_quad(image, min_area)
    if quad is None:
      return base.ToolResult(ok=True, text='No document or card outline (quadrilateral) was found in the '
                                           f'{image.shape[1]}x{image.shape[0]} image; nothing was changed.')
    out, _ = image_ops.warp_quad(image, quad)
    corners = ', '.join(f'({x:.0f}, {y:.0f})' for x, y in quad)
    return base.ToolResult(
        ok=True, images=[out],
        text=f'Found a quadrilateral with corners {corners} (TL, TR, BR, BL) and warped it to an upright '
             f'{out.shape[1]}x{out.shape[0]} image, returned as a new image.')
  return body


PARAMS = (schema.Param('image', 'image', schema.IMAGE_DESC),)
SPEC = schema.register(schema.ToolSpec(
    name='perspective_correct',
    description='Find a document, card or screen photographed at an angle and warp it upright; returns a new '
                'image.',
    params=PARAMS,
    make=_make,
    official=schema.OfficialSchema('perspective_correct', PARAMS)))
