"""`ocr{image}` (official: `layout_parsing{image, use_chart_recognition, use_doc_orientation_classify}`).

Backends: `local` (`tools.ocr.run_local`, rapidocr PP-OCRv6), `remote` (`tools.remote.PaddleOCRClient`, PaddleX
serving); regions scoring below `cfg.ocr.min_score` are dropped; the text lists regions in reading order.
"""

import ml_collections
import numpy as np

from tools import base
from tools import schema


def _make(cfg: ml_collections.ConfigDict):
  from tools import ocr  # pylint: disable=import-outside-toplevel
  schema.check_backend('ocr', cfg.ocr.backend)

  def body(image: np.ndarray) -> base.ToolResult:
    if cfg.ocr.backend == 'remote':
      from tools import remote  # pylint: disable=import-outside-toplevel
      raw = remote.PaddleOCRClient(cfg.ocr.paddlex).ocr(image)
      regions = ocr.reading_order([(t, s, (x0, y0, x1 - x0, y1 - y0)) for t, s, (x0, y0, x1, y1) in raw
                                   if s >= cfg.ocr.min_score and t.strip()])
    else:
      regions = ocr.run_local(image, cfg.ocr.min_score)
    return base.ToolResult(ok=True, text=ocr.format_regions(regions))
  return body


SPEC = schema.register(schema.ToolSpec(
    name='ocr',
    description='Read the text in an image (OCR); returns the text regions in reading order with their boxes.',
    params=(schema.Param('image', 'image', schema.IMAGE_DESC),),
    make=_make,
    official=schema.OfficialSchema('layout_parsing', (
        schema.Param('image', 'image', schema.IMAGE_DESC),
        schema.Param('use_chart_recognition', 'boolean', 'Also parse charts.', required=False),
        schema.Param('use_doc_orientation_classify', 'boolean', 'Fix the page orientation first.', required=False),
    ))))
