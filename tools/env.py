"""`ToolEnv`: the enabled tools, their schemas and a call that never raises; the tool config; failure injection.

The tools themselves are defined in `tools/specs/` (one module each, imported here, which registers them in
`tools.schema.TOOLS`); `tools.schema` holds the definition types, the profiles and the argument checks. The
config (`default_config()`, overridable in part) picks the enabled tools and their backend options. Heavy
indexes (BM25, SIFT) are built lazily on the first call and shared by every `ToolEnv` in the process
(`text_search.get_index`, `image_search.get_index`).

Error kinds `ToolEnv.call` returns (DESIGN.md §5), with `text` naming the culprit:
  unknown_tool   `name` is not an enabled tool.
  bad_arguments  arguments not a dict; a missing required or unexpected argument; wrong JSON type; out of range;
                 an image reference that is not `img_k` or points past the images given; a crop box outside
                 the image.
  backend_error  the backend raised (message: exception type and text); an image that cannot be decoded.
  timeout, http_error, backend_error  from a remote backend (`tools.remote`).
  timeout        also any call that runs past `config.call_timeout_s` (a hung tool; the process can still exit).
  no_result      (ok=True) a search found nothing.
  any kind       injected by `config.failure_injection` (see `FailureInjector`), counted in `env.injected_counts`.

Images: image arguments larger than `config.max_image_pixels` are downscaled first and the result text says so.
"""

import threading
import time
from typing import Any, Sequence

import ml_collections
import numpy as np

from tools import base
from tools import image_io
from tools import schema
from tools import specs  # pylint: disable=unused-import  # Registers the tools.
from tools.specs import image_search as image_search_spec


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
    lookup.seed: the lookup world's table (`tools/specs/lookup.py`, the learning testbed's tool; never enabled by
      default).
    call_timeout_s: seconds a tool call may run (0 / None = unbounded); past it the call is a `timeout` result and
      is abandoned, its body left running in a daemon thread (no Python thread can be killed), which never keeps
      the process from exiting.
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
  c.lookup = ml_collections.ConfigDict({'seed': 0})   # the lookup world's table (tools/specs/lookup.py)
  c.call_timeout_s = 300.0
  return c


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
      ValueError: an unknown tool name in `enabled`, a `tool_schema` not in `schema.PROFILES`, bad failure_injection.
      NotImplementedError: a backend other than `local` / `remote`.
    """
    cfg = default_config()
    if config is not None:
      config = config.to_dict() if isinstance(config, ml_collections.ConfigDict) else dict(config)
      with cfg.unlocked():
        _merge(cfg, config)
    if cfg.tool_schema not in schema.PROFILES:
      raise ValueError(f'tool_schema {cfg.tool_schema!r} is not one of {schema.PROFILES}')
    unknown = [n for n in cfg.enabled if n not in schema.TOOLS]
    if unknown:
      raise ValueError(f'unknown tool(s) in config.enabled: {unknown}; registered: {sorted(schema.TOOLS)}')
    self.config = cfg
    self.names = tuple(cfg.enabled)
    self.profile = cfg.tool_schema
    self._bodies = {n: schema.TOOLS[n].make(cfg) for n in self.names}
    fi = cfg.failure_injection
    self._injector = FailureInjector(fi.get('rate', 0.0), fi.get('kind', 'backend_error'), fi.get('seed', 0))
    self._official_to_ours = {schema.TOOLS[n].official.name: n for n in self.names
                             if schema.TOOLS[n].official is not None}

  @property
  def injected_counts(self) -> dict[str, int]:
    return dict(self._injector.counts)

  def schemas(self) -> list[dict]:
    """Function schemas of the enabled tools, in `config.enabled` order (see `ToolSpec.schema`); in the
    `official` profile, the official names and arguments."""
    return [schema.TOOLS[n].schema(self.profile) for n in self.names]

  def _resolve(self, name: str, arguments: Any, images: Sequence[Any]) -> tuple[str, dict]:
    """(our tool name, validated kwargs for its body) from a call in either profile's namespace."""
    if self.profile == 'official' and name in self._official_to_ours and isinstance(arguments, dict) and (
        name not in self._bodies or set(arguments) - {p.name for p in schema.TOOLS[name].params}):
      ours = self._official_to_ours[name]
      off = schema.TOOLS[ours].official
      checked = schema.check_arguments(name, off.params, arguments, images)
      body_params = {p.name for p in schema.TOOLS[ours].params} | set(off.passthrough)
      rename = off.rename
      kwargs = {}
      for k, v in checked.items():
        k = rename.get(k, k)
        if k in body_params and (v is not None or k in off.passthrough):
          kwargs[k] = v
      return ours, kwargs
    if name not in self._bodies:
      raise KeyError(name)
    return name, schema.check_arguments(name, schema.TOOLS[name].params, arguments, images)

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
        if schema.TOOLS[ours].budget:
          for k, v in kwargs.items():
            if isinstance(v, np.ndarray):
              kwargs[k], n = image_io.fit_pixel_budget(v, int(self.config.max_image_pixels))
              note += n
        result = _bounded(self._bodies[ours], kwargs, name, self.config.get('call_timeout_s'))
      except schema.ArgumentError as e:
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
    from tools import image_search, text_search  # pylint: disable=import-outside-toplevel
    if 'text_search' in self.names and self.config.text_search.backend == 'local':
      text_search.get_index(schema.data_dir(self.config))
    if 'image_search' in self.names and self.config.image_search.backend == 'local':
      image_search.get_index(image_search_spec.image_dirs(self.config))


def _bounded(body, kwargs: dict, name: str, timeout: float | None) -> base.ToolResult:
  """`body(**kwargs)`, given at most `timeout` seconds (None / 0: unbounded) in a daemon thread.

  Raises:
    base.ToolError: kind 'timeout', naming tools.call_timeout_s, when the body has not returned in time
      (it is abandoned, still running); whatever the body raised, when it raised.
  """
  if not timeout:
    return body(**kwargs)
  out, done = {}, threading.Event()

  def run():
    try:
      out['result'] = body(**kwargs)
    except BaseException as e:  # pylint: disable=broad-except  # re-raised in the caller's thread
      out['error'] = e
    finally:
      done.set()

  threading.Thread(target=run, name=f'tool-{name}', daemon=True).start()
  if not done.wait(float(timeout)):
    raise base.ToolError('timeout', f'did not return within {float(timeout):g} s (tools.call_timeout_s); the call '
                                    'was abandoned')
  if 'error' in out:
    raise out['error']
  return out['result']


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
