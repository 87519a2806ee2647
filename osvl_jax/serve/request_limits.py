"""Server limits of `osvl_jax.serve.service`'s request path: body size, context and new-token caps, image pixels
and concurrent image decodes; the checks of a row's image spans. Every refusal names the limit (HTTP 400 / 413).

Memory: an image is refused from its header size (`tools.image_io.read_size`) before any decode when it, or the
request's images together, exceed the pixel limits. At most `max_concurrent_decodes` requests decode (and
process) their images at once, one image after another, each holding its decode buffers (at most
`DECODE_BYTES_PER_PIXEL` bytes a pixel: measured 14 for RGB and 22 for RGBA PNGs; 16-bit images go through
float64) and its decoded originals (3 bytes a pixel, dropped once processed), on decode threads of their own. So image decoding adds at most
`decode_memory_bytes()` = max_concurrent_decodes x (max_image_pixels x DECODE_BYTES_PER_PIXEL + max_request_pixels
x 3) bytes to the server's memory; /server_info reports it under `request_limits`.
"""

import binascii
import concurrent.futures
import dataclasses
import os
import sys
import threading
from typing import Any, Sequence

import numpy as np
import pybase64

from osvl_jax.serve.request_fields import RequestError
from osvl_jax.trajectory import tokens as tokens_lib

DECODE_BYTES_PER_PIXEL = 32      # peak decode + process buffers of one image, bytes per pixel (module docstring)
DEFAULT_MAX_IMAGE_PIXELS = 4096 * 4096
DEFAULT_MAX_REQUEST_PIXELS = 4 * 4096 * 4096
DEFAULT_MAX_CONCURRENT_DECODES = 2
DEFAULT_MAX_BODY_BYTES = 64 << 20
DECODE_NICENESS = 10             # decode threads run this much nicer than the server's (Linux; `ImageGate`)


class BodyTooLarge(RequestError):
  """A request body over `max_body_bytes` (HTTP 413)."""


@dataclasses.dataclass(frozen=True)
class RequestLimits:
  """The server's limits on one request (flags of `osvl_jax.serve` of the same names).

  Attributes:
    context_length: prompt + generated ids per row (the sampler's max_len); a prompt needs room for 1 new id.
    max_new_tokens_limit: the largest `max_new_tokens` / `max_tokens` a request may ask for.
    max_image_pixels: largest width x height of one image, read from its header (pixels).
    max_request_pixels: largest sum of width x height over a request's images (pixels).
    max_concurrent_decodes: requests decoding images at once (the others wait).
    max_body_bytes: largest request body (bytes).
  """
  context_length: int
  max_new_tokens_limit: int
  max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS
  max_request_pixels: int = DEFAULT_MAX_REQUEST_PIXELS
  max_concurrent_decodes: int = DEFAULT_MAX_CONCURRENT_DECODES
  max_body_bytes: int = DEFAULT_MAX_BODY_BYTES

  def __post_init__(self):
    for field in dataclasses.fields(self):
      value = getattr(self, field.name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f'--{field.name} must be an integer >= 1, got {value!r}')
    if self.max_new_tokens_limit > self.context_length:
      raise ValueError(f'--max_new_tokens_limit={self.max_new_tokens_limit} is above the context length '
                       f'{self.context_length} (--max_len)')

  def decode_memory_bytes(self) -> int:
    """The most bytes image decoding adds to the server's memory (module docstring)."""
    return self.max_concurrent_decodes * (self.max_image_pixels * DECODE_BYTES_PER_PIXEL
                                          + self.max_request_pixels * 3)

  def info(self) -> dict:
    """The limits and the decode memory bound, for /server_info."""
    return {**dataclasses.asdict(self), 'decode_memory_bytes': self.decode_memory_bytes(),
            'decode_bytes_per_pixel': DECODE_BYTES_PER_PIXEL}

  def check_max_new_tokens(self, value: int, name: str) -> int:
    """`value` (an int >= 1) if within `max_new_tokens_limit`, else a RequestError naming `name` and the limit."""
    if value > self.max_new_tokens_limit:
      raise RequestError(f'{name}={value} is above the server limit --max_new_tokens_limit='
                         f'{self.max_new_tokens_limit}')
    return value

  def check_prompt(self, n_tokens: int, name: str = 'input_ids') -> None:
    """Refuses a prompt of `n_tokens` ids that leaves no room for one new id in the context (as SGLang)."""
    if n_tokens + 1 > self.context_length:
      raise RequestError(f'{name}: the prompt has {n_tokens} tokens; with at least 1 new token it needs '
                         f'{n_tokens + 1}, more than the context length of {self.context_length} tokens')


async def read_body(request, limit: int) -> bytes:
  """The body of a Starlette `request`, refused as soon as it passes `limit` bytes (Content-Length or streamed).

  Raises:
    BodyTooLarge: the body is larger than `limit`.
  """
  announced = request.headers.get('content-length')
  too_large = f'the request body is over the server limit --max_body_bytes={limit}'
  if announced is not None and announced.isdigit() and int(announced) > limit:
    raise BodyTooLarge(f'{too_large} (Content-Length {announced})')
  chunks, size = [], 0
  async for chunk in request.stream():
    size += len(chunk)
    if size > limit:
      raise BodyTooLarge(too_large)
    chunks.append(chunk)
  return b''.join(chunks)


def _image_bytes(item: Any, name: str) -> bytes:
  """An `image_data` item (base64 string or `data:image/...;base64,` URL) -> the encoded bytes."""
  if not isinstance(item, str):
    raise RequestError(f'{name} must be a base64 string or a data URL, got {type(item).__name__}')
  data = item
  if data.startswith('data:'):
    head, _, data = data.partition(',')
    if ';base64' not in head:
      raise RequestError(f'{name}: data URLs must be base64-encoded')
  elif data.startswith(('http://', 'https://', 'file://', '/')):
    raise RequestError(f'{name}: osvl_jax.serve does not fetch image URLs or files: send base64 / data URLs')
  try:   # strict first: SIMD, the GIL released; else the lenient form skips line breaks and other non-alphabet bytes
    return pybase64.b64decode(data, validate=True)
  except (binascii.Error, ValueError):
    pass
  try:
    return pybase64.b64decode(data, validate=False)
  except (binascii.Error, ValueError) as e:
    raise RequestError(f'cannot decode {name}: {e}') from e


def _nicer_thread() -> None:
  """Raises the calling thread's nice value by `DECODE_NICENESS` (at most 19; Linux, where each thread has its
  own; elsewhere nothing)."""
  if sys.platform.startswith('linux'):
    tid = threading.get_native_id()
    os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + DECODE_NICENESS))


class ImageGate:
  """Decodes a request's images within `RequestLimits`: pixel limits from the headers, and all decoding on
  `max_concurrent_decodes` threads of its own (a semaphore over the HTTP threads would bound the live buffers
  but not the memory each thread's malloc arena keeps after them), `DECODE_NICENESS` nicer than the server's
  other threads: on a busy CPU an image flood's decoding yields to the sampler and the HTTP loop, so it does not
  slow the requests already admitted or parsed.

  Thread-safe. `peak_decodes` is the most requests seen decoding at once (<= max_concurrent_decodes); `waiting`
  the requests queued for a decode thread now.
  """

  def __init__(self, limits: RequestLimits):
    self.limits = limits
    self._pool = concurrent.futures.ThreadPoolExecutor(limits.max_concurrent_decodes, 'osvl-decode',
                                                       initializer=_nicer_thread)
    self._lock = threading.Lock()
    self._local = threading.local()
    self._active = 0
    self.peak_decodes = 0
    self.waiting = 0

  def run(self, fn, *args):
    """`fn(*args)` on one of the decode threads (waits for a free one); called from one, runs in place."""
    if getattr(self._local, 'inside', False):
      return fn(*args)
    return self.submit(fn, *args).result()

  def submit(self, fn, *args) -> concurrent.futures.Future:
    """Queues `fn(*args)` for a decode thread; the future holds its result (an event loop awaits it with
    `asyncio.wrap_future`, so a request waiting for a decode thread holds no other thread)."""
    with self._lock:
      self.waiting += 1
    return self._pool.submit(self._inside, fn, args)

  def _inside(self, fn, args):
    with self._lock:
      self.waiting -= 1
      self._active += 1
      self.peak_decodes = max(self.peak_decodes, self._active)
    self._local.inside = True
    try:
      return fn(*args)
    finally:
      self._local.inside = False
      with self._lock:
        self._active -= 1

  def decode(self, items: Sequence[Any], names: Sequence[str], processor=None) -> list:
    """The images of one request, each refused by its header size before anything is decoded, then decoded one
    after another on a decode thread (`run`).

    Args:
      items: `image_data` items (base64 strings / data URLs).
      names: how errors name each item (e.g. 'image_data[0]').
      processor: an `ImageProcessor`: the result is its `ImageRef`s, the decoded originals dropped
        (`drop_original`); None: the decoded uint8 [H, W, 3] arrays.
    Raises:
      RequestError: naming the item: not base64 / not an image, over `max_image_pixels`, or the items together
        over `max_request_pixels`; an image the processor refuses.
    """
    from tools import image_io  # pylint: disable=g-import-not-at-top
    raw, total, limits = [], 0, self.limits
    for item, name in zip(items, names):
      data = _image_bytes(item, name)
      try:
        w, h = image_io.read_size(data, name)
      except image_io.ImageDecodeError as e:
        raise RequestError(str(e)) from None
      if w * h > limits.max_image_pixels:
        raise RequestError(f'{name} is {w}x{h} = {w * h} pixels, above the server limit --max_image_pixels='
                           f'{limits.max_image_pixels} (refused before decoding)')
      total += w * h
      if total > limits.max_request_pixels:
        raise RequestError(f'{name}: the images of the request hold {total} pixels up to it, above the server '
                           f'limit --max_request_pixels={limits.max_request_pixels} (refused before decoding)')
      raw.append(data)
    return self.run(self._decode, raw, list(names[:len(raw)]), processor) if raw else []

  def _decode(self, raw: list, names: list, processor) -> list:
    from tools import image_io  # pylint: disable=g-import-not-at-top
    out = []
    for k, name in enumerate(names):
      data, raw[k] = raw[k], None   # the encoded bytes go as their image is decoded
      try:
        pixels = image_io.load_image(data, max_pixels=self.limits.max_image_pixels)
        out.append(pixels if processor is None else drop_original(processor.process(pixels, name=name)))
      except ValueError as e:   # ImageDecodeError, or the processor refusing the image
        raise RequestError(f'{name}: {e}') from None
      del pixels, data
    return out


def drop_original(ref):
  """`ref` (an `ImageRef`) with its decoded original replaced by a 1x1 stub: a server row needs only the model's
  input (`pixel_values`, `grid_thw`), and a queued row would otherwise hold the full-size decode."""
  return dataclasses.replace(ref, pixels=np.ascontiguousarray(ref.pixels[:1, :1]))


def check_image_spans(ids: np.ndarray, refs: Sequence[Any]) -> None:
  """Each image k is `<|vision_start|>` + exactly `refs[k].num_tokens` `<|image_pad|>` + `<|vision_end|>`, in
  order, and no vision id (`VISION_IDS`) stands outside those spans (the model would misread or fail on it).

  Args:
    ids: int [T], the row's ids with the pads expanded.
    refs: the row's `ImageRef`s in order.
  Raises:
    RequestError: naming the image, the position and what is there instead.
  """
  ids = np.asarray(ids)
  starts = np.flatnonzero(ids == tokens_lib.VISION_START_ID)
  if len(starts) != len(refs):
    raise RequestError(f'input_ids hold {len(starts)} <|vision_start|> tokens for {len(refs)} image(s) in '
                       'image_data (each image: <|vision_start|> <|image_pad|>... <|vision_end|>)')
  covered = np.zeros(len(ids), bool)
  for k, (pos, ref) in enumerate(zip(starts, refs)):
    need, rest = ref.num_tokens, ids[pos + 1:] != tokens_lib.IMAGE_PAD_ID
    run = int(np.argmax(rest)) if rest.any() else len(rest)
    end = pos + 1 + run
    if run != need or end >= len(ids) or ids[end] != tokens_lib.VISION_END_ID:
      after = f'id {int(ids[end])} at position {end}' if end < len(ids) else 'the end of input_ids'
      raise RequestError(f'input_ids: image_data[{k}] (grid {np.asarray(ref.grid_thw).tolist()}) needs '
                         f'{need} contiguous <|image_pad|> between <|vision_start|> at position {pos} and '
                         f'<|vision_end|>; found {run} then {after}')
    covered[pos:pos + need + 2] = True
  stray = np.flatnonzero(np.isin(ids, tokens_lib.VISION_IDS) & ~covered)
  if len(stray):
    raise RequestError(f'input_ids: vision token {int(ids[stray[0]])} at position {int(stray[0])} lies outside '
                       'the image spans (vision ids are only valid in <|vision_start|> <|image_pad|>... '
                       '<|vision_end|> spans of the images given)')
