"""Stage `degrade`: a seeded subset of the accepted items gets a degraded anchor image, paired with the tool that
repairs it (DESIGN.md §7.7; paper Sec. 3: "10% of items get a degraded image (blur, downsampling, perspective
skew) paired with the repairing tool").

Kinds (`KINDS`), their parameters (all recorded, so `apply(original, kind, params)` reproduces the saved image
bit for bit) and repair tools (`REPAIR_TOOLS`, names of `tools.schema.TOOLS`):
  blur         Gaussian (`sigma` px, odd `ksize`) -> `sharpen`. Only the blur the repair tool undoes: on the
               27 shared landmark / CC0 photos, `sharpen` (amount 1.5, sigma 1 px) raised PSNR against the original
               for 81/81 Gaussian blurs (+0.39 dB mean) but lowered it for 78/81 motion blurs (-0.37 dB), so
               motion blur is not drawn (an item whose repair tool cannot repair it teaches the wrong habit)
  downsample   `factor` in {2, 3, 4}, area interpolation (the image is saved at the small size) ->
               `super_resolution` (argument `scale` = factor)
  perspective  the 4 image corners moved inward by `corner_offsets` ([4, 2] fractions of W, H; TL, TR, BR, BL),
               the image warped onto that quadrilateral over a black background -> `perspective_correct`

The subset: `round(fraction * accepted)` accepted items, drawn without replacement by
`default_rng([seed, 7])`; the kinds cycle over the drawn items in `KINDS` order (as even a split as the count
allows); the parameters of item i come from `default_rng([seed, 7, i])`. The degraded image is written as PNG
(lossless) to `<image_dir>/<prompt_id>.png`; the item's `image_path` becomes that file's path relative to the
dataset folder (`image_dir`'s parent: 'degraded/<prompt_id>.png', read through
`osvl_jax.data.pipeline.image_file`, so the built folder can be moved) and the original stays in
`original_image_path`. Rejected items pass through untouched.
"""

import json
import os
import pathlib

import cv2
import numpy as np

from tools import image_io

KINDS = ('blur', 'downsample', 'perspective')
REPAIR_TOOLS = {'blur': 'sharpen', 'downsample': 'super_resolution', 'perspective': 'perspective_correct'}
DOWNSAMPLE_FACTORS = (2, 3, 4)
MAX_CORNER_OFFSET = 0.15   # fraction of W (x) and H (y) a corner moves inward, at most
MIN_CORNER_OFFSET = 0.04


def draw_params(kind: str, rng: np.random.Generator) -> dict:
  """Random parameters of one degradation (JSON-serialisable).

  Args:
    kind: one of `KINDS`.
    rng: the item's generator.
  Returns:
    blur: {'blur': 'gaussian', 'sigma': float px in [1.5, 3], 'ksize': odd int}; downsample: {'factor': int};
    perspective: {'corner_offsets': [[dx, dy] x 4] fractions, inward, TL TR BR BL}.
  Raises:
    ValueError: naming an unknown kind.
  """
  if kind == 'blur':
    sigma = round(float(rng.uniform(1.5, 3.0)), 3)
    return {'blur': 'gaussian', 'sigma': sigma, 'ksize': 2 * int(np.ceil(3 * sigma)) + 1}
  if kind == 'downsample':
    return {'factor': int(rng.choice(DOWNSAMPLE_FACTORS))}
  if kind == 'perspective':
    off = rng.uniform(MIN_CORNER_OFFSET, MAX_CORNER_OFFSET, size=(4, 2))
    return {'corner_offsets': [[round(float(x), 4), round(float(y), 4)] for x, y in off]}
  raise ValueError(f'degradation kind {kind!r} is not one of {KINDS}')


def perspective_quad(shape: tuple[int, ...], corner_offsets) -> np.ndarray:
  """float32 [4, 2] (x, y) target corners TL, TR, BR, BL of a W x H image whose corners move inward."""
  h, w = shape[:2]
  off = np.asarray(corner_offsets, np.float64).reshape(4, 2) * [w - 1, h - 1]
  sign = np.array([[1, 1], [-1, 1], [-1, -1], [1, -1]])
  corners = np.array([[0, 0], [w - 1, 0], [w - 1, h - 1], [0, h - 1]], np.float64)
  return np.float32(corners + sign * off)


def apply(image: np.ndarray, kind: str, params: dict) -> np.ndarray:
  """The degraded image: uint8 [H, W, 3] RGB in, uint8 RGB out ([H/f, W/f, 3] for a downsample by f, else
  [H, W, 3]). Deterministic in (image, kind, params).

  Raises:
    ValueError: naming an unknown kind or blur type.
  """
  if kind == 'blur':
    if params['blur'] == 'gaussian':
      k = int(params['ksize'])
      return cv2.GaussianBlur(image, (k, k), float(params['sigma']), borderType=cv2.BORDER_REFLECT)
    raise ValueError(f"blur type {params['blur']!r} is not 'gaussian'")
  if kind == 'downsample':
    f = int(params['factor'])
    h, w = image.shape[:2]
    return cv2.resize(image, (max(1, round(w / f)), max(1, round(h / f))), interpolation=cv2.INTER_AREA)
  if kind == 'perspective':
    h, w = image.shape[:2]
    src = np.float32([[0, 0], [w - 1, 0], [w - 1, h - 1], [0, h - 1]])
    m = cv2.getPerspectiveTransform(src, perspective_quad(image.shape, params['corner_offsets']))
    return cv2.warpPerspective(image, m, (w, h), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT,
                               borderValue=(0, 0, 0))
  raise ValueError(f'degradation kind {kind!r} is not one of {KINDS}')


def repair_arguments(kind: str, params: dict) -> dict:
  """The repair tool's arguments (besides the image): {'scale': factor} for a downsample, else {}."""
  return {'scale': int(params['factor'])} if kind == 'downsample' else {}


def save_png(image: np.ndarray, path: str | os.PathLike) -> None:
  """Writes uint8 [H, W, 3] RGB losslessly (PNG). Raises OSError naming the path when OpenCV cannot write it."""
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  if not cv2.imwrite(str(path), cv2.cvtColor(image, cv2.COLOR_RGB2BGR)):
    raise OSError(f'could not write the degraded image {path}')


def degrade(records: list[dict], data_dir: str | os.PathLike, image_dir: str | os.PathLike, seed: int,
            fraction: float = 0.1, enabled: bool = True) -> tuple[list[dict], dict]:
  """Degrades the anchor image of a seeded `fraction` of the accepted records (see the module docstring).

  Args:
    records: output of `ground.ground` (or of `filter`): dicts with prompt_id, image_path (relative to
      `data_dir`), rejected.
    data_dir: the shared data folder.
    image_dir: where the degraded PNGs go (created), a folder of the dataset folder (its parent), normally
      `<dataset>/degraded`.
    seed: the build seed.
    fraction: share of the accepted items to degrade, in [0, 1].
    enabled: False (the Table 3a "no degradation" ablation) passes every record through.
  Returns:
    (records, each with `degradation` ({'kind', 'params' (JSON text), 'repair_tool'} or None; a degraded one's
    `image_path` is then relative to `image_dir`'s parent) and
    `original_image_path` (the anchor's path relative to `data_dir`); counts {'in', 'accepted', 'degraded',
    'kinds' (kind -> n), 'repair_tools' (tool -> n), 'passed' (accepted, not degraded), 'skipped_rejected',
    'enabled', 'fraction'}).
  Raises:
    ValueError: `fraction` outside [0, 1].
  """
  if not 0 <= fraction <= 1:
    raise ValueError(f'data.degrade_fraction={fraction}: expected a fraction in [0, 1]')
  out = [dict(r, degradation=None, original_image_path=r['image_path']) for r in records]
  ok = [i for i, r in enumerate(out) if not r['rejected']]
  n = int(round(fraction * len(ok))) if enabled else 0
  chosen = np.random.default_rng([seed, 7]).choice(ok, size=n, replace=False) if n else []
  counts = {'in': len(records), 'accepted': len(ok), 'degraded': n, 'kinds': {k: 0 for k in KINDS},
            'repair_tools': {REPAIR_TOOLS[k]: 0 for k in KINDS}, 'passed': len(ok) - n,
            'skipped_rejected': len(records) - len(ok), 'enabled': bool(enabled), 'fraction': float(fraction)}
  for j, i in enumerate(chosen):
    rec, kind = out[int(i)], KINDS[j % len(KINDS)]
    params = draw_params(kind, np.random.default_rng([seed, 7, int(i)]))
    image = image_io.load_image(pathlib.Path(data_dir) / rec['image_path'])
    image_dir = pathlib.Path(image_dir)
    save_png(apply(image, kind, params), image_dir / f"{rec['prompt_id']}.png")
    rec.update(image_path=f"{image_dir.name}/{rec['prompt_id']}.png",
               degradation={'kind': kind, 'params': json.dumps(params, sort_keys=True),
                                                  'repair_tool': REPAIR_TOOLS[kind]})
    counts['kinds'][kind] += 1
    counts['repair_tools'][REPAIR_TOOLS[kind]] += 1
  return out, counts
