"""Local `ocr` backend: PP-OCRv6 detection + recognition models shipped in the `rapidocr` 3.x wheel (onnxruntime,
offline), and the result text shared with the remote (PaddleX) backend.

Result text (reading order: lines top to bottom, boxes within a line left to right; box = x, y, width, height
in pixels of the image the tool saw):

  Text found (3 regions, reading order; box = x, y, width, height px):
  [1] (235, 35, 430, 30) Reduce your risk of coronavirus infection:
  [2] (330, 100, 265, 22) Clean hands with soap and water
"""

import threading

import numpy as np

_ENGINE = None
_LOCK = threading.Lock()


def _engine():
  global _ENGINE
  if _ENGINE is None:
    import logging
    from rapidocr import RapidOCR  # Loads three onnx models (~1 s); only on first use.
    _ENGINE = RapidOCR(params={'Global.log_level': 'error'}) if _accepts_params() else RapidOCR()
    logging.getLogger('RapidOCR').setLevel(logging.ERROR)
  return _ENGINE


def _accepts_params() -> bool:
  import inspect
  from rapidocr import RapidOCR
  return 'params' in inspect.signature(RapidOCR.__init__).parameters


Region = tuple[str, float, tuple[int, int, int, int]]  # text, confidence in [0, 1], (x, y, width, height) px


def reading_order(regions: list[Region]) -> list[Region]:
  """Sorts regions into lines (a box joins a line when its vertical centre lies within the line's first box's
  height band), lines top to bottom, boxes left to right."""
  lines: list[list[Region]] = []
  for r in sorted(regions, key=lambda r: r[2][1] + r[2][3] / 2):
    cy = r[2][1] + r[2][3] / 2
    for line in lines:
      _, _, (x, y, w, h) = line[0]
      if abs(cy - (y + h / 2)) <= h / 2:
        line.append(r)
        break
    else:
      lines.append([r])
  return [r for line in lines for r in sorted(line, key=lambda r: r[2][0])]


def run_local(image: np.ndarray, min_score: float = 0.5) -> list[Region]:
  """PP-OCRv6 text regions of `image` (`uint8 [H, W, 3]` RGB) with confidence >= min_score, reading order."""
  bgr = np.ascontiguousarray(image[..., ::-1])
  with _LOCK:  # One onnxruntime session set, used one call at a time.
    out = _engine()(bgr)
  if out.boxes is None or out.txts is None:
    return []
  regions = []
  for box, text, score in zip(out.boxes, out.txts, out.scores):
    if score < min_score or not text.strip():
      continue
    pts = np.asarray(box, np.float64).reshape(-1, 2)
    x0, y0 = np.floor(pts.min(0)).astype(int)
    x1, y1 = np.ceil(pts.max(0)).astype(int)
    regions.append((text.strip(), float(score), (int(x0), int(y0), int(x1 - x0), int(y1 - y0))))
  return reading_order(regions)


def format_regions(regions: list[Region]) -> str:
  """The tool text (see module docstring); `No text found in the image.` when empty."""
  if not regions:
    return 'No text found in the image.'
  head = f'Text found ({len(regions)} region{"s" * (len(regions) != 1)}, reading order; box = x, y, width, height px):'
  return '\n'.join([head] + [f'[{i}] ({x}, {y}, {w}, {h}) {t}' for i, (t, _, (x, y, w, h)) in enumerate(regions, 1)])


def plain_text(regions: list[Region]) -> str:
  """The recognised text alone, regions joined by single spaces (for CER)."""
  return ' '.join(t for t, _, _ in regions)


def cer(hypothesis: str, reference: str) -> float:
  """Character error rate: Levenshtein distance / len(reference), whitespace runs collapsed, case kept."""
  a, b = ' '.join(hypothesis.split()), ' '.join(reference.split())
  prev = list(range(len(b) + 1))
  for i, ca in enumerate(a, 1):
    cur = [i]
    for j, cb in enumerate(b, 1):
      cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
    prev = cur
  return prev[-1] / max(1, len(b))
