"""Tool definitions: `Param`, `ToolSpec`, the schema profiles, the tool table and the argument checks.

Each tool is a `ToolSpec` registered by name in `TOOLS` (by its module under `tools/specs/`, imported by
`tools.env`). Its `params` are the one source of truth for both the Hermes/OpenAI function schema the model sees
(`ToolSpec.schema()`) and the argument checks (`check_arguments`) `tools.env.ToolEnv.call` runs before the body.

Profiles (`PROFILES`, config `tool_schema`): `osvl`, our names and arguments (DESIGN.md §5); `official`, those of
the official OpenSearch-VL release, given per tool by `ToolSpec.official` (`OfficialSchema`). The release's names
map to ours through the alias tables below, defined here once; the trajectory parser uses the same tables to read
released data:
  TOOL_NAME_ALIASES        tool names found in public data -> ours (`layout_parsing` is the official `ocr`).
  ARGUMENT_ALIASES         argument names found in public data -> ours (the official `q`, `url`).
  OFFICIAL_ONLY_ARGUMENTS  official arguments that none of our tools takes (a body may opt in to receive one,
                           `OfficialSchema.passthrough`; otherwise they are checked, then dropped).
"""

import dataclasses
import os
import re
from typing import Any, Callable, Sequence

import ml_collections
import numpy as np

from tools import base
from tools import image_io

PROFILES = ('osvl', 'official')
# Tool names found in public data -> ours.
TOOL_NAME_ALIASES = {'web_search': 'text_search', 'layout_parsing': 'ocr'}
# Argument names found in public data -> ours (the parser applies them only when ours is absent).
ARGUMENT_ALIASES = {'q': 'query', 'url': 'image'}
# Official-profile arguments our tools do not take.
OFFICIAL_ONLY_ARGUMENTS = ('hl', 'use_chart_recognition', 'use_doc_orientation_classify')

IMAGE_REF_RE = re.compile(r'^img_([0-9]+)$')
IMAGE_DESC = 'Image reference, e.g. "img_1" (k-th image of the conversation).'
_JSON_TYPES = {'string': 'string', 'integer': 'integer', 'number': 'number', 'image': 'string',
               'boolean': 'boolean'}


class ArgumentError(ValueError):
  """Raised for a semantically bad argument (by the checks or a tool body); reported as `bad_arguments`."""


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
class OfficialSchema:
  """How a tool is named and called in the `official` profile (the official OpenSearch-VL release).

  Attributes:
    name: official tool name: ours, or a key of `TOOL_NAME_ALIASES` mapping to ours (`layout_parsing` for `ocr`).
    params: official parameters, checked like ours. Each is ours, a key of `ARGUMENT_ALIASES` mapping to ours,
      or one of `OFFICIAL_ONLY_ARGUMENTS` (checked `register`).
    passthrough: official-only arguments the body takes as keyword arguments (text_search: `hl`); the other
      official-only arguments are checked, then dropped.
  """
  name: str
  params: tuple[Param, ...]
  passthrough: tuple[str, ...] = ()

  @property
  def rename(self) -> dict[str, str]:
    """Official argument name -> ours, for the params that `ARGUMENT_ALIASES` renames (e.g. `{'q': 'query'}`)."""
    return {p.name: ARGUMENT_ALIASES[p.name] for p in self.params if p.name in ARGUMENT_ALIASES}


@dataclasses.dataclass(frozen=True)
class ToolSpec:
  """A tool: its schema and a factory of its body.

  Attributes:
    name: tool name the model calls.
    description: one paragraph for the model.
    params: parameters, in schema order.
    make: `make(tool_config) -> body`, where `body(**arguments) -> ToolResult` gets validated arguments
      (images resolved to arrays). It may raise `ArgumentError` (-> bad_arguments) or `base.ToolError` (its
      kind); anything else it raises becomes backend_error. It should build heavy state lazily, on its first call.
    budget: whether image arguments are downscaled to `config.max_image_pixels` first (crop is exempt: its
      box is in the input's pixels and its output is smaller).
    official: its name and arguments in the `official` profile; None = offered there as in `osvl`.
  """
  name: str
  description: str
  params: tuple[Param, ...]
  make: Callable[[ml_collections.ConfigDict], Callable[..., base.ToolResult]]
  budget: bool = True
  official: OfficialSchema | None = None

  def schema(self, profile: str = 'osvl') -> dict:
    """The Hermes / OpenAI function schema `{"type": "function", "function": {name, description, parameters}}`;
    for `profile='official'` with the official name and parameters (same description)."""
    if profile == 'official' and self.official is not None:
      return render_schema(self.official.name, self.description, self.official.params)
    return render_schema(self.name, self.description, self.params)


def render_schema(name: str, description: str, params: Sequence[Param]) -> dict:
  """The Hermes / OpenAI function schema of a tool `name` with `params` (required ones listed in order)."""
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


TOOLS: dict[str, ToolSpec] = {}


def register(spec: ToolSpec) -> ToolSpec:
  """Adds `spec` to `TOOLS`.

  Raises:
    ValueError: a name registered twice; an official schema that disagrees with the alias tables (a name that
      is neither ours nor a `TOOL_NAME_ALIASES` key for it; a parameter that is neither ours, an
      `ARGUMENT_ALIASES` key for one of ours, nor in `OFFICIAL_ONLY_ARGUMENTS`; a passthrough argument that is
      not an official-only parameter).
  """
  if spec.name in TOOLS:
    raise ValueError(f'tool {spec.name!r} is already registered')
  off = spec.official
  if off is not None:
    if off.name != spec.name and TOOL_NAME_ALIASES.get(off.name) != spec.name:
      raise ValueError(f'official name {off.name!r} of {spec.name!r} is not in TOOL_NAME_ALIASES')
    ours = {p.name for p in spec.params}
    for p in off.params:
      if ARGUMENT_ALIASES.get(p.name, p.name) not in ours and p.name not in OFFICIAL_ONLY_ARGUMENTS:
        raise ValueError(f'official argument {p.name!r} of {off.name!r} is not ours, not in ARGUMENT_ALIASES '
                         'and not in OFFICIAL_ONLY_ARGUMENTS')
    bad = sorted(set(off.passthrough) - ({p.name for p in off.params} & set(OFFICIAL_ONLY_ARGUMENTS)))
    if bad:
      raise ValueError(f'passthrough argument(s) {bad} of {off.name!r} are not official-only parameters')
  TOOLS[spec.name] = spec
  return spec


# --------------------------------------------------------------------------------------------------------------
# Helpers of the tool factories.

def data_dir(cfg: ml_collections.ConfigDict) -> str | None:
  """`cfg.data_dir`, or None (= `osvl_jax.paths.data_dir()`) when empty."""
  return cfg.get('data_dir') or None


def check_backend(tool: str, backend: str) -> None:
  """Raises NotImplementedError unless `backend` is `local` or `remote`."""
  if backend not in ('local', 'remote'):
    raise NotImplementedError(f'{tool} backend {backend!r} is not implemented (local or remote)')


# --------------------------------------------------------------------------------------------------------------
# Argument checks.

def as_rgb(obj: Any) -> np.ndarray:
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
  digits = IMAGE_REF_RE.match(v.strip()).group(1).lstrip('0') or '0'
  # Compare digit counts before int(): Python refuses int() of more than 4300 digits (a ValueError, which would
  # surface as backend_error), and no reference that long can exist.
  k = int(digits) if len(digits) <= len(str(len(images))) else None
  if k is None or not 1 <= k <= len(images):
    raise ArgumentError(f'argument {pname!r}: image reference {v.strip()!r:.40} does not exist '
                        f'({len(images)} image(s) available: img_1..img_{len(images)})')
  try:
    return as_rgb(images[k - 1])
  except ValueError as e:
    raise ArgumentError(f'argument {pname!r}: {v.strip()} is not a usable image: {e}') from None


# |v| above which a JSON number argument is refused: 2**53, the limit of exactly representable integers in the
# IEEE doubles JSON numbers are (RFC 8259 §6). Python's json gives larger integers exactly (10**400 too), and
# those overflow float(): checked before any conversion.
MAX_ABS_NUMBER = 2 ** 53


def _check_number(p: Param, v: Any) -> int | float:
  """`v` as p.type (`integer` | `number`), or ArgumentError naming `p.name` (module docstring of the checks)."""
  kind = 'an integer' if p.type == 'integer' else 'a number'
  if isinstance(v, bool) or not isinstance(v, (int, float)):  # bool is an int subclass: refused
    raise ArgumentError(f'argument {p.name!r} must be {kind}, got {type(v).__name__} {v!r:.40}')
  if isinstance(v, float) and not np.isfinite(v):  # NaN / Infinity (json.loads accepts both)
    raise ArgumentError(f'argument {p.name!r} must be {kind}, got {v!r}')
  if abs(v) > MAX_ABS_NUMBER:  # exact for ints of any size: no float conversion
    text = repr(v) if isinstance(v, float) else f'an integer of {len(str(abs(v)))} digits'
    raise ArgumentError(f'argument {p.name!r} is too large ({text}; |value| must be <= 2**53)')
  if p.type == 'integer':
    if isinstance(v, float):
      if not v.is_integer():
        raise ArgumentError(f'argument {p.name!r} must be an integer, got {v!r}')
      v = int(v)  # 3.0 -> 3; -0.0 -> 0
  else:
    v = float(v) + 0.0  # -0.0 + 0.0 = 0.0
  if (p.minimum is not None and v < p.minimum) or (p.maximum is not None and v > p.maximum):
    raise ArgumentError(f'argument {p.name!r} must be in [{p.minimum}, {p.maximum}], got {v}')
  return v


def check_arguments(tool: str, params: Sequence[Param], arguments: Any, images: Sequence[Any]) -> dict:
  """Validated keyword arguments for a call of `tool` with `params`; absent optional ones get their default.

  Image parameters become `uint8 [H, W, 3]` arrays; a `string` parameter holding an image reference `img_k`
  (the official `url`) is resolved too (leading zeros allowed; a reference of any length past the images is
  refused). Numbers: `bool` is never a number; NaN and ±Infinity are refused; |v| > 2**53 (`MAX_ABS_NUMBER`) is
  refused before any float conversion (10**400 is a valid JSON number); an `integer` accepts an integral float
  (3.0 -> 3) and refuses 3.5; −0.0 becomes 0 (integer) / 0.0 (number); then the Param's bounds apply.

  Args:
    tool: tool name, for messages.
    params: the tool's parameters.
    arguments: the parsed JSON arguments of the call.
    images: the conversation's images, `img_k` = `images[k-1]` (see `as_rgb` for what each may be).
  Raises:
    ArgumentError: naming the bad argument.
    base.ToolError(backend_error): a referenced image that cannot be decoded.
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
      v = _check_number(p, v)
    out[p.name] = v
  return out
