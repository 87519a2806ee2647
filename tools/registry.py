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
  backend_error  the backend raised (message: exception type and text).
  no_result      (ok=True) a search found nothing.
"""

import dataclasses
import re
import time
from typing import Any, Callable, Sequence

import ml_collections
import numpy as np

from tools import base
from tools import image_ops

IMAGE_REF_RE = re.compile(r'^img_([0-9]+)$')
_JSON_TYPES = {'string': 'string', 'integer': 'integer', 'number': 'number', 'image': 'string'}


class ArgumentError(ValueError):
  """Raised by a tool body for a semantically bad argument; reported as `bad_arguments`."""


@dataclasses.dataclass(frozen=True)
class Param:
  """One tool parameter.

  Attributes:
    name: argument name.
    type: `string`, `integer`, `number`, or `image` (a string reference `img_k`, resolved to `uint8 [H, W, 3]`).
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
  """
  name: str
  description: str
  params: tuple[Param, ...]
  make: Callable[[ml_collections.ConfigDict], Callable[..., base.ToolResult]]

  def schema(self) -> dict:
    """The Hermes / OpenAI function schema `{"type": "function", "function": {name, description, parameters}}`."""
    return {
        'type': 'function',
        'function': {
            'name': self.name,
            'description': self.description,
            'parameters': {
                'type': 'object',
                'properties': {p.name: p.json_schema() for p in self.params},
                'required': [p.name for p in self.params if p.required],
            },
        },
    }


TOOLS: dict[str, ToolSpec] = {}


def register(spec: ToolSpec) -> ToolSpec:
  """Adds `spec` to `TOOLS` (a name registered twice is an error)."""
  if spec.name in TOOLS:
    raise ValueError(f'tool {spec.name!r} is already registered')
  TOOLS[spec.name] = spec
  return spec


def default_config() -> ml_collections.ConfigDict:
  """Tool settings. Pass a partial ConfigDict/dict to `ToolEnv`; it is merged over these.

  Fields:
    tool_schema: schema profile; only `osvl` (DESIGN.md §5 names) is implemented.
    enabled: tool names offered to the model, in schema order.
    data_dir: shared data folder; '' = `osvl_jax.paths.data_dir()`.
    text_search.backend: `local` (BM25 over Wikispeedia).
    image_search.backend: `local` (SIFT over the landmark photos). image_search.image_dir: '' =
      `<data_dir>/images/landmarks`.
    sharpen.sigma: unsharp-mask Gaussian sigma, pixels.
  Argument bounds (top_k in [1, 20], amount in (0, 10]) live in the tool's `Param`s, the one source of truth.
  """
  c = ml_collections.ConfigDict()
  c.tool_schema = 'osvl'
  c.enabled = ('text_search', 'image_search', 'crop', 'sharpen')
  c.data_dir = ''
  c.text_search = ml_collections.ConfigDict({'backend': 'local'})
  c.image_search = ml_collections.ConfigDict({'backend': 'local', 'image_dir': ''})
  c.sharpen = ml_collections.ConfigDict({'sigma': 1.0})
  c.crop = ml_collections.ConfigDict()
  return c


# --------------------------------------------------------------------------------------------------------------
# Tool definitions.

def _data_dir(cfg) -> str | None:
  return cfg.get('data_dir') or None


def _make_text_search(cfg: ml_collections.ConfigDict):
  from tools import text_search
  if cfg.text_search.backend != 'local':
    raise NotImplementedError(f'text_search backend {cfg.text_search.backend!r} is not implemented (only local)')

  def body(query: str, top_k: int = 5) -> base.ToolResult:
    if not query.strip():
      raise ArgumentError("argument 'query' is empty")
    hits = text_search.get_index(_data_dir(cfg)).search(query, top_k)
    if not hits:
      return base.error('no_result', f'No results for {query!r}.')
    return base.ToolResult(ok=True, text=text_search.format_hits(hits))
  return body


def _make_image_search(cfg: ml_collections.ConfigDict):
  from tools import image_search
  if cfg.image_search.backend != 'local':
    raise NotImplementedError(f'image_search backend {cfg.image_search.backend!r} is not implemented (only local)')

  def body(image: np.ndarray) -> base.ToolResult:
    image_dir = cfg.image_search.image_dir
    if not image_dir and _data_dir(cfg):
      image_dir = f'{_data_dir(cfg)}/images/landmarks'
    index = image_search.get_index(image_dir or None)
    match = index.best(image)
    if match is None:
      return base.error('no_result', 'No confident match for this image in the image collection.')
    return base.ToolResult(ok=True, text=image_search.describe(match, index.names[match.stem]))
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


_IMAGE_DESC = 'Image reference, e.g. "img_1" (k-th image of the conversation).'

register(ToolSpec(
    name='text_search',
    description='BM25 search over a Wikipedia corpus; returns "[k] Title: snippet" lines.',
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
    name='crop',
    description='Crop a box (pixels, clamped to the image) out of an image; returns it as a new image.',
    params=(
        Param('image', 'image', _IMAGE_DESC),
        Param('x', 'integer', 'Left edge.'),
        Param('y', 'integer', 'Top edge.'),
        Param('width', 'integer', 'Box width.', minimum=1),
        Param('height', 'integer', 'Box height.', minimum=1),
    ),
    make=_make_crop))

register(ToolSpec(
    name='sharpen',
    description='Sharpen a blurry image (unsharp mask); returns a new image.',
    params=(
        Param('image', 'image', _IMAGE_DESC),
        Param('amount', 'number', 'Strength.', required=False, default=1.5,
              minimum=0, maximum=10),
    ),
    make=_make_sharpen))


# --------------------------------------------------------------------------------------------------------------
# Argument checks.

def _as_rgb(obj: Any) -> np.ndarray:
  """`uint8 [H, W, 3]` from an array (gray / RGBA / float in [0, 255] accepted) or an object with `.pixels`."""
  arr = np.asarray(getattr(obj, 'pixels', obj))
  if arr.ndim == 2:
    arr = np.repeat(arr[..., None], 3, axis=-1)
  if arr.ndim != 3 or arr.shape[-1] not in (3, 4) or arr.shape[0] == 0 or arr.shape[1] == 0:
    raise ValueError(f'image has shape {arr.shape}, expected [H, W, 3]')
  arr = arr[..., :3]
  if arr.dtype != np.uint8:
    arr = np.clip(np.rint(arr), 0, 255).astype(np.uint8)
  return np.ascontiguousarray(arr)


def _check(spec: ToolSpec, arguments: Any, images: Sequence[Any]) -> dict:
  """Validated keyword arguments for `spec`'s body. Raises ArgumentError naming the bad argument."""
  if not isinstance(arguments, dict):
    raise ArgumentError(f'arguments must be a JSON object, got {type(arguments).__name__}')
  known = {p.name for p in spec.params}
  extra = sorted(set(arguments) - known)
  if extra:
    raise ArgumentError(f'unexpected argument(s) {", ".join(map(repr, extra))} for {spec.name}; '
                        f'expected {", ".join(p.name for p in spec.params)}')
  out = {}
  for p in spec.params:
    if p.name not in arguments or arguments[p.name] is None:
      if p.required:
        raise ArgumentError(f'missing required argument {p.name!r}')
      out[p.name] = p.default
      continue
    v = arguments[p.name]
    if p.type in ('string', 'image'):
      if not isinstance(v, str):
        raise ArgumentError(f'argument {p.name!r} must be a string, got {type(v).__name__} {v!r:.40}')
      if p.type == 'image':
        m = IMAGE_REF_RE.match(v.strip())
        if m is None:
          raise ArgumentError(f'argument {p.name!r} must be an image reference like "img_1", got {v!r:.40}')
        k = int(m.group(1))
        if not 1 <= k <= len(images):
          raise ArgumentError(f'argument {p.name!r}: image reference {v.strip()!r} does not exist '
                              f'({len(images)} image(s) available: img_1..img_{len(images)})')
        try:
          v = _as_rgb(images[k - 1])
        except ValueError as e:
          raise ArgumentError(f'argument {p.name!r}: {v.strip()} is not a usable image: {e}') from None
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


class ToolEnv:
  """The enabled tools, their schemas and a call that never raises.

  Example:
    env = ToolEnv()
    r = env.call('crop', {'image': 'img_1', 'x': 0, 'y': 0, 'width': 64, 'height': 32}, [photo])
    r.images[0].shape == (32, 64, 3)
  """

  def __init__(self, config: ml_collections.ConfigDict | dict | None = None):
    """Args: config: partial settings merged over `default_config()`.

    Raises:
      ValueError: an unknown tool name in `enabled`, or a `tool_schema` other than `osvl`.
      NotImplementedError: a backend other than `local`.
    """
    cfg = default_config()
    if config is not None:
      cfg.update(dict(config) if not isinstance(config, ml_collections.ConfigDict) else config)
    if cfg.tool_schema != 'osvl':
      raise ValueError(f'tool_schema {cfg.tool_schema!r} is not implemented (only osvl)')
    unknown = [n for n in cfg.enabled if n not in TOOLS]
    if unknown:
      raise ValueError(f'unknown tool(s) in config.enabled: {unknown}; registered: {sorted(TOOLS)}')
    self.config = cfg
    self.names = tuple(cfg.enabled)
    self._bodies = {n: TOOLS[n].make(cfg) for n in self.names}

  def schemas(self) -> list[dict]:
    """Function schemas of the enabled tools, in `config.enabled` order (see `ToolSpec.schema`)."""
    return [TOOLS[n].schema() for n in self.names]

  def call(self, name: str, arguments: dict, images: Sequence[np.ndarray] = ()) -> base.ToolResult:
    """Runs one tool call; never raises.

    Args:
      name: tool name.
      arguments: parsed JSON arguments; image arguments are references `"img_k"`.
      images: the conversation's images so far, `img_k` = `images[k-1]`, each `uint8 [H, W, 3]` RGB (or an
        object with `.pixels`, e.g. a trajectory ImageRef).
    Returns:
      A `ToolResult` with `seconds` = wall time of the whole call; see the module docstring for error kinds.
    """
    t0 = time.perf_counter()
    try:
      if name not in self._bodies:
        return base.error('unknown_tool', f'Unknown tool {name!r}; available tools: {", ".join(self.names)}.',
                          seconds=time.perf_counter() - t0)
      spec = TOOLS[name]
      try:
        kwargs = _check(spec, arguments, images)
        result = self._bodies[name](**kwargs)
      except ArgumentError as e:
        return base.error('bad_arguments', f'Bad arguments for {name}: {e}.', seconds=time.perf_counter() - t0)
      except Exception as e:  # pylint: disable=broad-except
        return base.error('backend_error', f'{name} failed: {type(e).__name__}: {e}',
                          seconds=time.perf_counter() - t0)
      result.seconds = time.perf_counter() - t0
      return result
    except Exception as e:  # pylint: disable=broad-except  # E.g. an unhashable `name`.
      return base.error('malformed_call', f'Malformed tool call: {type(e).__name__}: {e}',
                        seconds=time.perf_counter() - t0)

  def warmup(self) -> None:
    """Builds the heavy indexes of the enabled search tools now instead of on their first call."""
    from tools import image_search, text_search
    if 'text_search' in self.names:
      text_search.get_index(_data_dir(self.config))
    if 'image_search' in self.names:
      d = self.config.image_search.image_dir or (f'{_data_dir(self.config)}/images/landmarks'
                                                 if _data_dir(self.config) else None)
      image_search.get_index(d)
