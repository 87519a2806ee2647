"""Tool registry and `ToolEnv`: one definition per tool (name, description, parameters, backend) -> schema + call.

Each tool is a `ToolSpec` registered by name in `TOOLS`. Its `params` are the one source of truth for both the
Hermes/OpenAI function schema the model sees (`ToolEnv.schemas()`) and the argument checks `ToolEnv.call` runs
before the backend. The config (`default_config()`, overridable in part) picks the enabled tools and their
backend options. Heavy indexes (BM25, SIFT) are built lazily on the first call and shared by every `ToolEnv` in
the process (`text_search.get_index`, `image_search.get_index`).

Error kinds `ToolEnv.call` returns (DESIGN.md §5), with `text` naming the culprit:
  unknown_tool   `name` is not an enabled tool.
  bad_arguments  arguments not a dict; a missing required or unexpected argument; wrong JSON type; out of range;
                 an image reference that is not `img_k` or points past the images given; a crop box outside
                 the image.
  backend_error  the backend raised (message: exception type and text); an image that cannot be decoded.
  timeout, http_error, backend_error  from a remote backend (`tools.remote`).
  no_result      (ok=True) a search found nothing.
  any kind       injected by `config.failure_injection` (see `FailureInjector`), counted in `env.injected_counts`.

Images: image arguments larger than `config.max_image_pixels` are downscaled first and the result text says so.
"""

import dataclasses
import os
import re
import threading
import time
from typing import Any, Callable, Sequence

import ml_collections
import numpy as np

from tools import base
from tools import image_io
from tools import image_ops

IMAGE_REF_RE = re.compile(r'^img_([0-9]+)$')
_JSON_TYPES = {'string': 'string', 'integer': 'integer', 'number': 'number', 'image': 'string',
               'boolean': 'boolean'}


class ArgumentError(ValueError):
  """Raised by a tool body for a semantically bad argument; reported as `bad_arguments`."""


@dataclasses.dataclass(frozen=True)
class Param:
  """One tool parameter.

  Attributes:
    name: argument name.
    type: `string`, `integer`, `number`, `boolean`, or `image` (a string reference `img_k`, resolved to
      `uint8 [H, W, 3]`).
    description: shown to the model.
    required: whether the call must give it.
    default: value used when not required and absent.
    minimum, maximum: inclusive bounds for integer/number (None = unbounded).
  """
  name: str
  type: str
  description: str
  required: bool = True
  default: Any = None
  minimum: float | None = None
  maximum: float | None = None

  def json_schema(self) -> dict:
    schema = {'type': _JSON_TYPES[self.type], 'description': self.description}
    if self.minimum is not None:
      schema['minimum'] = self.minimum
    if self.maximum is not None:
      schema['maximum'] = self.maximum
    if not self.required and self.default is not None:
      schema['default'] = self.default
    return schema


@dataclasses.dataclass(frozen=True)
class ToolSpec:
  """A tool: its schema and a factory of its body.

  Attributes:
    name: tool name the model calls.
    description: one paragraph for the model.
    params: parameters, in schema order.
    make: `make(tool_config) -> body`, where `body(**arguments) -> ToolResult` gets validated arguments
      (images resolved to arrays). It may raise `ArgumentError` (-> bad_arguments); anything else it raises
      becomes backend_error. It should build heavy state lazily, on its first call.
    budget: whether image arguments are downscaled to `config.max_image_pixels` first (crop is exempt: its
      box is in the input's pixels and its output is smaller).
  """
  name: str
  description: str
  params: tuple[Param, ...]
  make: Callable[[ml_collections.ConfigDict], Callable[..., base.ToolResult]]
  budget: bool = True

  def schema(self) -> dict:
    """The Hermes / OpenAI function schema `{"type": "function", "function": {name, description, parameters}}`."""
    return _schema(self.name, self.description, self.params)


def _schema(name: str, description: str, params: Sequence[Param]) -> dict:
  return {
      'type': 'function',
      'function': {
          'name': name,
          'description': description,
          'parameters': {
              'type': 'object',
              'properties': {p.name: p.json_schema() for p in params},
              'required': [p.name for p in params if p.required],
          },
      },
  }


@dataclasses.dataclass(frozen=True)
class OfficialSchema:
  """How a tool is named and called in the `official` profile (the official OpenSearch-VL release).

  Attributes:
    name: official tool name (e.g. `layout_parsing` for `ocr`).
    params: official parameters, checked like ours.
    rename: official argument name -> ours (e.g. `{'q': 'query'}`); official arguments not renamed and not
      ours (e.g. `hl`) are passed in `extra` when the body takes it, else checked then dropped.
  """
  name: str
  params: tuple[Param, ...]
  rename: dict = dataclasses.field(default_factory=dict)


TOOLS: dict[str, ToolSpec] = {}
OFFICIAL: dict[str, OfficialSchema] = {}  # our tool name -> its official schema.
PROFILES = ('osvl', 'official')


def register(spec: ToolSpec) -> ToolSpec:
  """Adds `spec` to `TOOLS` (a name registered twice is an error)."""
  if spec.name in TOOLS:
    raise ValueError(f'tool {spec.name!r} is already registered')
  TOOLS[spec.name] = spec
  return spec


def default_config() -> ml_collections.ConfigDict:
  """Tool settings. Pass a partial ConfigDict/dict to `ToolEnv`; it is merged over these.

  Fields:
    tool_schema: schema profile, `osvl` (DESIGN.md §5 names) or `official` (the official release's names).
    enabled: tool names offered to the model, in schema order (all seven: text_search, image_search, ocr, crop,
      sharpen, super_resolution, perspective_correct).
    data_dir: shared data folder; '' = `osvl_jax.paths.data_dir()`.
    max_image_pixels: pixel budget of image inputs (H*W); larger inputs are downscaled, the text says so.
    failure_injection: `{'rate': p, 'kind': str | tuple[str, ...], 'seed': int}`; rate 0 = off (`FailureInjector`).
    text_search.backend: `local` (BM25 over Wikispeedia) or `remote` (Serper + Jina reader + optional LLM summary;
      `serper`, `jina`, `summarizer` each `{base_url, api_key_env, timeout, retries, backoff}`; `read_top` =
      pages read per search).
    image_search.backend: `local` (global-descriptor shortlist + SIFT verification) or `remote` (Lens-style API,
      `lens.*`; needs the image as a public URL, i.e. the official profile's `url`). image_search.image_dir: ''
      = `<data_dir>/images/landmarks`; image_search.image_dirs: a list of folders (wins over image_dir).
    ocr.backend: `local` (rapidocr PP-OCRv6) or `remote` (PaddleX serving, `paddlex.*`); ocr.min_score.
    sharpen.sigma: unsharp-mask Gaussian sigma, pixels.
    super_resolution.model_dir / model: folder of cv2.dnn_superres `.pb` files and the algorithm (`FSRCNN`,
      `ESPCN`, `LapSRN`, `EDSR`) whose `<ALGO>_x<scale>.pb` is used; '' / missing file = bicubic (said so).
  Argument bounds (top_k in [1, 20], amount in (0, 10]) live in the tool's `Param`s, the one source of truth.
  """
  c = ml_collections.ConfigDict()
  c.tool_schema = 'osvl'
  c.enabled = ('text_search', 'image_search', 'crop', 'sharpen')
  c.data_dir = ''
  c.max_image_pixels = image_io.DEFAULT_MAX_PIXELS
  c.failure_injection = ml_collections.ConfigDict({'rate': 0.0, 'kind': 'backend_error', 'seed': 0})
  remote = lambda url, key: {'base_url': url, 'api_key_env': key, 'timeout': 10.0, 'retries': 2, 'backoff': 0.5}
  c.text_search = ml_collections.ConfigDict({
      'backend': 'local', 'read_top': 2,
      'serper': remote('https://google.serper.dev', 'SERPER_API_KEY'),
      'jina': {**remote('https://r.jina.ai', 'JINA_API_KEY'), 'allow_private_urls': False, 'max_chars': 4000},
      'summarizer': {**remote('', 'OPENAI_API_KEY'), 'model': 'gpt-4o-mini'}})
  c.image_search = ml_collections.ConfigDict({
      'backend': 'local', 'image_dir': '', 'image_dirs': (),
      'lens': {**remote('https://serpapi.com', 'SERPAPI_API_KEY'), 'allow_private_urls': False}})
  c.ocr = ml_collections.ConfigDict({'backend': 'local', 'min_score': 0.5,
                                     'paddlex': remote('http://localhost:8080', 'PADDLEX_API_KEY')})
  c.sharpen = ml_collections.ConfigDict({'sigma': 1.0})
  c.crop = ml_collections.ConfigDict()
  c.super_resolution = ml_collections.ConfigDict({'model_dir': '', 'model': 'FSRCNN'})
  c.perspective_correct = ml_collections.ConfigDict({'min_area_frac': 0.1})
  return c


# --------------------------------------------------------------------------------------------------------------
# Tool definitions.

def _data_dir(cfg) -> str | None:
  return cfg.get('data_dir') or None


def _check_backend(tool: str, backend: str) -> None:
  if backend not in ('local', 'remote'):
    raise NotImplementedError(f'{tool} backend {backend!r} is not implemented (local or remote)')


def _make_text_search(cfg: ml_collections.ConfigDict):
  from tools import text_search
  _check_backend('text_search', cfg.text_search.backend)

  def body(query: str, top_k: int = 5, hl: str | None = None) -> base.ToolResult:
    if not query.strip():
      raise ArgumentError("argument 'query' is empty")
    if cfg.text_search.backend == 'remote':
      from tools import remote
      text = remote.web_search(cfg.text_search, query, top_k, hl)
      return base.ToolResult(ok=True, text=text) if text else base.error('no_result', f'No results for {query!r}.')
    hits = text_search.get_index(_data_dir(cfg)).search(query, top_k)
    if not hits:
      return base.error('no_result', f'No results for {query!r}.')
    return base.ToolResult(ok=True, text=text_search.format_hits(hits))
  return body


def image_dirs(cfg) -> list[str] | None:
  """The folders the local image_search indexes (None = the default landmark folder)."""
  if cfg.image_search.get('image_dirs'):
    return [str(d) for d in cfg.image_search.image_dirs]
  if cfg.image_search.image_dir:
    return [cfg.image_search.image_dir]
  if _data_dir(cfg):
    return [f'{_data_dir(cfg)}/images/landmarks']
  return None


def _make_image_search(cfg: ml_collections.ConfigDict):
  from tools import image_search
  _check_backend('image_search', cfg.image_search.backend)

  def body(image: np.ndarray | str) -> base.ToolResult:
    if cfg.image_search.backend == 'remote':
      from tools import remote
      if not isinstance(image, str):
        raise base.ToolError('backend_error', 'the remote image_search needs the image as a public http(s) URL '
                                              '(official profile: url); this image has none')
      matches = remote.LensClient(cfg.image_search.lens).search(image)
      if not matches:
        return base.error('no_result', 'No visual matches for this image.')
      return base.ToolResult(ok=True, text=remote.format_lens(matches))
    if isinstance(image, str):
      raise ArgumentError(f"argument 'image' must be an image reference like \"img_1\" for the local "
                          f'image_search, got {image!r:.60}')
    index = image_search.get_index(image_dirs(cfg))
    match = index.best(image)
    if match is None:
      return base.error('no_result', 'No confident match for this image in the image collection.')
    return base.ToolResult(ok=True, text=image_search.describe(match, index.names[match.stem]))
  return body


def _make_ocr(cfg: ml_collections.ConfigDict):
  from tools import ocr
  _check_backend('ocr', cfg.ocr.backend)

  def body(image: np.ndarray) -> base.ToolResult:
    if cfg.ocr.backend == 'remote':
      from tools import remote
      raw = remote.PaddleOCRClient(cfg.ocr.paddlex).ocr(image)
      regions = ocr.reading_order([(t, s, (x0, y0, x1 - x0, y1 - y0)) for t, s, (x0, y0, x1, y1) in raw
                                   if s >= cfg.ocr.min_score and t.strip()])
    else:
      regions = ocr.run_local(image, cfg.ocr.min_score)
    return base.ToolResult(ok=True, text=ocr.format_regions(regions))
  return body


def _make_crop(cfg: ml_collections.ConfigDict):
  del cfg

  def body(image: np.ndarray, x: int, y: int, width: int, height: int) -> base.ToolResult:
    try:
      out, (x0, y0, x1, y1) = image_ops.crop(image, x, y, width, height)
    except image_ops.BadBox as e:
      raise ArgumentError(str(e)) from None
    note = '' if (x0, y0, x1 - x0, y1 - y0) == (x, y, width, height) else (
        f' (requested x={x}, y={y}, width={width}, height={height}, clamped to the image)')
    return base.ToolResult(
        ok=True, images=[out],
        text=f'Cropped the region x={x0}, y={y0}, width={x1 - x0}, height={y1 - y0} of the '
             f'{image.shape[1]}x{image.shape[0]} image{note}; the crop is returned as a new image.')
  return body


def _make_sharpen(cfg: ml_collections.ConfigDict):
  sigma = float(cfg.sharpen.sigma)

  def body(image: np.ndarray, amount: float = 1.5) -> base.ToolResult:
    if amount <= 0:
      raise ArgumentError(f"argument 'amount' must be > 0, got {amount:g}")
    out = image_ops.sharpen(image, amount=amount, sigma=sigma)
    return base.ToolResult(
        ok=True, images=[out],
        text=f'Sharpened the {image.shape[1]}x{image.shape[0]} image (unsharp mask, amount {amount:g}, '
             f'sigma {sigma:g} px); the result is returned as a new image.')
  return body


def _make_super_resolution(cfg: ml_collections.ConfigDict):
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


def _make_perspective_correct(cfg: ml_collections.ConfigDict):
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


_IMAGE_DESC = 'Image reference, e.g. "img_1" (k-th image of the conversation).'

register(ToolSpec(
    name='text_search',
    description='Web/Wikipedia text search; returns "[k] Title: snippet" lines.',
    params=(
        Param('query', 'string', 'Search keywords.'),
        Param('top_k', 'integer', 'Number of results.', required=False, default=5, minimum=1,
              maximum=20),
    ),
    make=_make_text_search))

register(ToolSpec(
    name='image_search',
    description='Reverse image search: names the landmark in an image and its Wikipedia article.',
    params=(Param('image', 'image', _IMAGE_DESC),),
    make=_make_image_search))

register(ToolSpec(
    name='ocr',
    description='Read the text in an image (OCR); returns the text regions in reading order with their boxes.',
    params=(Param('image', 'image', _IMAGE_DESC),),
    make=_make_ocr))

register(ToolSpec(
    name='crop',
    description='Crop a box (pixels, clamped to the image) out of an image; returns it as a new image.',
    params=(
        Param('image', 'image', _IMAGE_DESC),
        Param('x', 'integer', 'Left edge.'),
        Param('y', 'integer', 'Top edge.'),
        Param('width', 'integer', 'Box width.', minimum=1),
        Param('height', 'integer', 'Box height.', minimum=1),
    ),
    make=_make_crop, budget=False))

register(ToolSpec(
    name='sharpen',
    description='Sharpen a blurry image (unsharp mask); returns a new image.',
    params=(
        Param('image', 'image', _IMAGE_DESC),
        Param('amount', 'number', 'Strength.', required=False, default=1.5,
              minimum=0, maximum=10),
    ),
    make=_make_sharpen))

register(ToolSpec(
    name='super_resolution',
    description='Upscale a small or low-resolution image (learned super-resolution); returns a new image.',
    params=(
        Param('image', 'image', _IMAGE_DESC),
        Param('scale', 'integer', 'Upscaling factor.', required=False, default=2, minimum=2, maximum=4),
    ),
    make=_make_super_resolution))

register(ToolSpec(
    name='perspective_correct',
    description='Find a document, card or screen photographed at an angle and warp it upright; returns a new '
                'image.',
    params=(Param('image', 'image', _IMAGE_DESC),),
    make=_make_perspective_correct))

# The official OpenSearch-VL release's names and arguments (DESIGN.md §5, `tool_schema='official'`).
OFFICIAL.update({
    'text_search': OfficialSchema('text_search', (
        Param('q', 'string', 'Search query.'),
        Param('hl', 'string', 'Interface language, e.g. "en".', required=False),
        Param('top_k', 'integer', 'Number of results.', required=False, default=5, minimum=1, maximum=20),
    ), rename={'q': 'query'}),
    'image_search': OfficialSchema('image_search', (
        Param('url', 'string', 'Image URL, or an image reference such as "img_1".'),), rename={'url': 'image'}),
    'ocr': OfficialSchema('layout_parsing', (
        Param('image', 'image', _IMAGE_DESC),
        Param('use_chart_recognition', 'boolean', 'Also parse charts.', required=False),
        Param('use_doc_orientation_classify', 'boolean', 'Fix the page orientation first.', required=False),
    )),
    'crop': OfficialSchema('crop', TOOLS['crop'].params),
    'sharpen': OfficialSchema('sharpen', TOOLS['sharpen'].params),
    'super_resolution': OfficialSchema('super_resolution', TOOLS['super_resolution'].params),
    'perspective_correct': OfficialSchema('perspective_correct', TOOLS['perspective_correct'].params),
})


# --------------------------------------------------------------------------------------------------------------
# Argument checks.

def _as_rgb(obj: Any) -> np.ndarray:
  """`uint8 [H, W, 3]` from an array (gray / RGBA / float in [0, 255] accepted), an object with `.pixels`, or an
  encoded image (bytes, or a file path as str / PathLike).

  Raises:
    ValueError: an array of the wrong shape.
    base.ToolError(backend_error): bytes / a file that cannot be decoded (the reason is in the message).
  """
  if isinstance(obj, (bytes, bytearray, str, os.PathLike)):
    try:
      return image_io.load_image(obj)
    except image_io.ImageDecodeError as e:
      raise base.ToolError('backend_error', f'corrupt or unreadable image: {e}') from None
  arr = np.asarray(getattr(obj, 'pixels', obj))
  if arr.ndim == 2:
    arr = np.repeat(arr[..., None], 3, axis=-1)
  if arr.ndim != 3 or arr.shape[-1] not in (3, 4) or arr.shape[0] == 0 or arr.shape[1] == 0:
    raise ValueError(f'image has shape {arr.shape}, expected [H, W, 3]')
  arr = arr[..., :3]
  if arr.dtype != np.uint8:
    arr = np.clip(np.rint(arr), 0, 255).astype(np.uint8)
  return np.ascontiguousarray(arr)


def _resolve_image(pname: str, v: str, images: Sequence[Any]) -> np.ndarray:
  k = int(IMAGE_REF_RE.match(v.strip()).group(1))
  if not 1 <= k <= len(images):
    raise ArgumentError(f'argument {pname!r}: image reference {v.strip()!r} does not exist '
                        f'({len(images)} image(s) available: img_1..img_{len(images)})')
  try:
    return _as_rgb(images[k - 1])
  except ValueError as e:
    raise ArgumentError(f'argument {pname!r}: {v.strip()} is not a usable image: {e}') from None


def _check(tool: str, params: Sequence[Param], arguments: Any, images: Sequence[Any]) -> dict:
  """Validated keyword arguments for a tool with `params`. Raises ArgumentError naming the bad argument.

  Image parameters become `uint8 [H, W, 3]` arrays; a `string` parameter holding an image reference `img_k`
  (the official `url`) is resolved too.
  """
  if not isinstance(arguments, dict):
    raise ArgumentError(f'arguments must be a JSON object, got {type(arguments).__name__}')
  known = {p.name for p in params}
  extra = sorted(set(arguments) - known)
  if extra:
    raise ArgumentError(f'unexpected argument(s) {", ".join(map(repr, extra))} for {tool}; '
                        f'expected {", ".join(p.name for p in params)}')
  out = {}
  for p in params:
    if p.name not in arguments or arguments[p.name] is None:
      if p.required:
        raise ArgumentError(f'missing required argument {p.name!r}')
      out[p.name] = p.default
      continue
    v = arguments[p.name]
    if p.type in ('string', 'image'):
      if not isinstance(v, str):
        raise ArgumentError(f'argument {p.name!r} must be a string, got {type(v).__name__} {v!r:.40}')
      if IMAGE_REF_RE.match(v.strip()):
        v = _resolve_image(p.name, v, images)
      elif p.type == 'image':
        raise ArgumentError(f'argument {p.name!r} must be an image reference like "img_1", got {v!r:.40}')
    elif p.type == 'boolean':
      if not isinstance(v, bool):
        raise ArgumentError(f'argument {p.name!r} must be true or false, got {type(v).__name__} {v!r:.40}')
    else:
      if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v):
        raise ArgumentError(f'argument {p.name!r} must be {"an integer" if p.type == "integer" else "a number"}, got {type(v).__name__} {v!r:.40}')
      if p.type == 'integer':
        if float(v) != int(v):
          raise ArgumentError(f'argument {p.name!r} must be an integer, got {v!r}')
        v = int(v)
      else:
        v = float(v)
      if (p.minimum is not None and v < p.minimum) or (p.maximum is not None and v > p.maximum):
        raise ArgumentError(f'argument {p.name!r} must be in [{p.minimum}, {p.maximum}], got {v}')
    out[p.name] = v
  return out


# --------------------------------------------------------------------------------------------------------------
# Failure injection (RL ablations).

_INJECTED_TEXT = {
    'timeout': '{name} timed out after 10 s.',
    'http_error': '{name} failed: the service returned HTTP 503 Service Unavailable.',
    'backend_error': '{name} failed: the backend reported an internal error.',
    'malformed_call': 'Malformed tool call for {name}.',
    'unknown_tool': 'Unknown tool {name!r}.',
    'bad_arguments': 'Bad arguments for {name}.',
    'no_result': 'No results from {name}.',
}


class FailureInjector:
  """Fails tool calls at random, deterministically given the seed and the call order.

  Config `failure_injection = {'rate': p, 'kind': k, 'seed': s}`: each call of an enabled tool fails with
  probability `p` (before its body runs) with error kind `k`, or, when `k` is a tuple/list of kinds, one drawn
  uniformly. The result looks like a real failure of that kind (the text does not say it was injected).

  Attributes:
    rate: probability in [0, 1].
    kinds: tuple of error kinds to draw from.
    counts: kind -> number of calls failed so far.
  """

  def __init__(self, rate: float = 0.0, kind: str | Sequence[str] = 'backend_error', seed: int = 0):
    kinds = (kind,) if isinstance(kind, str) else tuple(kind)
    bad = [k for k in kinds if k not in base.ERROR_KINDS]
    if not kinds or bad or not 0.0 <= float(rate) <= 1.0:
      raise ValueError(f'failure_injection needs rate in [0, 1] and kinds in {base.ERROR_KINDS}; got rate={rate}, '
                       f'kind={kind!r}')
    self.rate, self.kinds = float(rate), kinds
    self.counts: dict[str, int] = {}
    self._rng = np.random.default_rng(seed)
    self._lock = threading.Lock()

  def draw(self, name: str) -> base.ToolResult | None:
    """The injected failure for this call of tool `name`, or None (the call runs normally)."""
    if self.rate <= 0:
      return None
    with self._lock:
      if self._rng.random() >= self.rate:
        return None
      kind = self.kinds[int(self._rng.integers(len(self.kinds)))]
      self.counts[kind] = self.counts.get(kind, 0) + 1
    return base.error(kind, _INJECTED_TEXT[kind].format(name=name))


class ToolEnv:
  """The enabled tools, their schemas and a call that never raises.

  Example:
    env = ToolEnv()
    r = env.call('crop', {'image': 'img_1', 'x': 0, 'y': 0, 'width': 64, 'height': 32}, [photo])
    r.images[0].shape == (32, 64, 3)

  Attributes:
    config: the merged ConfigDict.
    names: enabled tools (our names), schema order.
    injected_counts: error kind -> calls failed by `config.failure_injection` (empty when off).
  """

  def __init__(self, config: ml_collections.ConfigDict | dict | None = None):
    """Args: config: partial settings merged over `default_config()`.

    Raises:
      ValueError: an unknown tool name in `enabled`, a `tool_schema` not in PROFILES, bad failure_injection.
      NotImplementedError: a backend other than `local` / `remote`.
    """
    cfg = default_config()
    if config is not None:
      config = config.to_dict() if isinstance(config, ml_collections.ConfigDict) else dict(config)
      with cfg.unlocked():
        _merge(cfg, config)
    if cfg.tool_schema not in PROFILES:
      raise ValueError(f'tool_schema {cfg.tool_schema!r} is not one of {PROFILES}')
    unknown = [n for n in cfg.enabled if n not in TOOLS]
    if unknown:
      raise ValueError(f'unknown tool(s) in config.enabled: {unknown}; registered: {sorted(TOOLS)}')
    self.config = cfg
    self.names = tuple(cfg.enabled)
    self.profile = cfg.tool_schema
    self._bodies = {n: TOOLS[n].make(cfg) for n in self.names}
    fi = cfg.failure_injection
    self._injector = FailureInjector(fi.get('rate', 0.0), fi.get('kind', 'backend_error'), fi.get('seed', 0))
    self._official_to_ours = {OFFICIAL[n].name: n for n in self.names if n in OFFICIAL}

  @property
  def injected_counts(self) -> dict[str, int]:
    return dict(self._injector.counts)

  def schemas(self) -> list[dict]:
    """Function schemas of the enabled tools, in `config.enabled` order (see `ToolSpec.schema`); in the
    `official` profile, the official names and arguments."""
    if self.profile == 'official':
      return [_schema(OFFICIAL[n].name, TOOLS[n].description, OFFICIAL[n].params) if n in OFFICIAL
              else TOOLS[n].schema() for n in self.names]
    return [TOOLS[n].schema() for n in self.names]

  def _resolve(self, name: str, arguments: Any, images: Sequence[Any]) -> tuple[str, dict]:
    """(our tool name, validated kwargs for its body) from a call in either profile's namespace."""
    if self.profile == 'official' and name in self._official_to_ours and isinstance(arguments, dict) and (
        name not in self._bodies or set(arguments) - {p.name for p in TOOLS[name].params}):
      ours = self._official_to_ours[name]
      off = OFFICIAL[ours]
      checked = _check(name, off.params, arguments, images)
      body_params = {p.name for p in TOOLS[ours].params} | ({'hl'} if ours == 'text_search' else set())
      kwargs = {}
      for k, v in checked.items():
        k = off.rename.get(k, k)
        if k in body_params and (v is not None or k == 'hl'):
          kwargs[k] = v
      return ours, kwargs
    if name not in self._bodies:
      raise KeyError(name)
    return name, _check(name, TOOLS[name].params, arguments, images)

  def call(self, name: str, arguments: dict, images: Sequence[np.ndarray] = ()) -> base.ToolResult:
    """Runs one tool call; never raises.

    Args:
      name: tool name (ours, or in the official profile also the official one, e.g. `layout_parsing`).
      arguments: parsed JSON arguments; image arguments are references `"img_k"`.
      images: the conversation's images so far, `img_k` = `images[k-1]`, each `uint8 [H, W, 3]` RGB (or an
        object with `.pixels`, e.g. a trajectory ImageRef, or encoded bytes / a file path).
    Returns:
      A `ToolResult` with `seconds` = wall time of the whole call; see the module docstring for error kinds.
    """
    t0 = time.perf_counter()
    try:
      if name not in self._bodies and name not in self._official_to_ours:
        return base.error('unknown_tool', f'Unknown tool {name!r}; available tools: {", ".join(self.names)}.',
                          seconds=time.perf_counter() - t0)
      injected = self._injector.draw(name)
      if injected is not None:
        injected.seconds = time.perf_counter() - t0
        return injected
      note = ''
      try:
        ours, kwargs = self._resolve(name, arguments, images)
        if TOOLS[ours].budget:
          for k, v in kwargs.items():
            if isinstance(v, np.ndarray):
              kwargs[k], n = image_io.fit_pixel_budget(v, int(self.config.max_image_pixels))
              note += n
        result = self._bodies[ours](**kwargs)
      except ArgumentError as e:
        return base.error('bad_arguments', f'Bad arguments for {name}: {e}.', seconds=time.perf_counter() - t0)
      except base.ToolError as e:
        return base.error(e.kind, f'{name} failed: {e}' if e.kind != 'bad_arguments' else
                          f'Bad arguments for {name}: {e}.', seconds=time.perf_counter() - t0)
      except Exception as e:  # pylint: disable=broad-except
        return base.error('backend_error', f'{name} failed: {type(e).__name__}: {e}',
                          seconds=time.perf_counter() - t0)
      if note and result.ok:
        result.text = f'{result.text}{note}' if not result.text.endswith('.') else f'{result.text[:-1]}{note}.'
      result.seconds = time.perf_counter() - t0
      return result
    except Exception as e:  # pylint: disable=broad-except  # E.g. an unhashable `name`.
      return base.error('malformed_call', f'Malformed tool call: {type(e).__name__}: {e}',
                        seconds=time.perf_counter() - t0)

  def warmup(self) -> None:
    """Builds the heavy indexes of the enabled search tools now instead of on their first call."""
    from tools import image_search, text_search
    if 'text_search' in self.names and self.config.text_search.backend == 'local':
      text_search.get_index(_data_dir(self.config))
    if 'image_search' in self.names and self.config.image_search.backend == 'local':
      image_search.get_index(image_dirs(self.config))


def _merge(cfg: ml_collections.ConfigDict, update: dict) -> None:
  """Merges a (nested) dict over `cfg` in place: nested dicts merge field by field, other values replace."""
  for k, v in update.items():
    if isinstance(v, dict) and k in cfg and isinstance(cfg[k], ml_collections.ConfigDict):
      _merge(cfg[k], v)
    else:
      try:
        cfg[k] = v
      except TypeError:  # A different type than the default's (e.g. a tuple of kinds for a str): replace it.
        del cfg[k]
        cfg[k] = v
