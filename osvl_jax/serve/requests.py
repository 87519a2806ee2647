"""Request handling of `osvl_jax.serve.service`: SGLang `/generate` fields and sampling parameters, images
(base64 / data URLs, pad expansion), OpenAI chat messages rendered as the `TrajectoryBuilder` renders them.
Every refusal is a `RequestError` naming the field (HTTP 400).
"""

import dataclasses
from typing import Any, Sequence

import numpy as np

from osvl_jax.models.qwen3_vl import config as config_lib
from osvl_jax.rollout import engine as engine_lib
from osvl_jax.serve import request_limits
from osvl_jax.serve.request_fields import (
    RequestError, boolean, check_messages, default_like, integer, parse_sampling)
from osvl_jax.trajectory import tokens as tokens_lib

IMAGE_PAD_ID = tokens_lib.IMAGE_PAD_ID

# /generate top-level fields this server reads; any other field must be absent or hold a default-like value
# (None, False, 0, empty), else the request is refused naming it.
GENERATE_FIELDS = ('input_ids', 'image_data', 'sampling_params', 'return_logprob', 'return_text_in_logprobs',
                   'logprob_start_len', 'top_logprobs_num', 'stream', 'rid', 'log_metrics', 'modalities')


@dataclasses.dataclass
class Row:
  """One sequence to generate: context + its own sampling parameters."""
  context: engine_lib.Context
  max_new_tokens: int
  temperature: float
  top_p: float
  stop: tuple[str, ...]
  stop_token_ids: frozenset
  skip_special_tokens: bool = True
  no_stop_trim: bool = False
  return_logprob: bool = False
  return_text_in_logprobs: bool = False



# ---------------------------------------------------------------------------------------------------------------
# Request parsing.
# ---------------------------------------------------------------------------------------------------------------

def decode_image(item: Any, name: str = 'image_data item') -> np.ndarray:
  """An `image_data` item (base64 string or `data:image/...;base64,` URL) -> uint8 [H, W, 3] (no server limits:
  `request_limits.ImageGate` decodes a request's images within them).

  Raises:
    RequestError: naming `name`: not a string, a URL to fetch, not base64, not an image.
  """
  from tools import image_io  # pylint: disable=g-import-not-at-top
  try:
    return image_io.load_image(request_limits._image_bytes(item, name))  # pylint: disable=protected-access
  except ValueError as e:
    raise RequestError(f'{name}: {e}') from e


def expand_image_pads(ids: Sequence[int], refs: Sequence[Any]) -> np.ndarray:
  """input_ids with one pad per image -> one pad per image feature (already-expanded ids pass unchanged).

  Raises:
    RequestError: the pad count matches neither form.
  """
  ids = [int(i) for i in ids]
  n_pads = sum(1 for i in ids if i == IMAGE_PAD_ID)
  need = sum(r.num_tokens for r in refs)
  if n_pads == need:
    return np.asarray(ids, np.int32)
  if n_pads != len(refs):
    raise RequestError(f'input_ids hold {n_pads} <|image_pad|> but {len(refs)} image(s) were given (one '
                       f'placeholder per image, or {need} pads in all)')
  out, k = [], 0
  for i in ids:
    if i == IMAGE_PAD_ID:
      out.extend([IMAGE_PAD_ID] * refs[k].num_tokens)
      k += 1
    else:
      out.append(i)
  return np.asarray(out, np.int32)


def parse_generate_request(body: Any, image_processor: Any, vocab: int, default_max_new_tokens: int,
                           limits: request_limits.RequestLimits | None = None,
                           gate: request_limits.ImageGate | None = None,
                           model_config: Any = None) -> tuple[list[Row], bool]:
  """A SGLang `/generate` body -> (rows, is_batch): ids in [0, vocab) (and in a compact vocabulary of
  `model_config`, the served `Qwen3VLConfig`: `config.check_ids`), images decoded and processed with
  `image_processor` (`ImageProcessor`) through `gate`, pads expanded and their spans checked
  (`request_limits.check_image_spans`); a row without max_new_tokens gets `default_max_new_tokens`.

  Args:
    limits: the server's `RequestLimits` (None: the context is unbounded here, images within the defaults).
    gate: the server's `ImageGate` (None: one of its own over `limits`).
  Raises:
    RequestError: naming the field: one this server cannot honour, a value of the wrong type or range, malformed
      ids or images, image spans that do not match the images, a prompt or max_new_tokens over the limits.
  """
  if not isinstance(body, dict):
    raise RequestError('the body must be a JSON object')
  for key, value in body.items():
    if key not in GENERATE_FIELDS and not default_like(value):
      raise RequestError(f'field {key!r} is not supported by osvl_jax.serve (token ids in, no text prompts)')
  if boolean(body.get('stream'), 'stream', False):
    raise RequestError('stream=true is not supported by osvl_jax.serve')
  if body.get('top_logprobs_num') is not None and integer(body['top_logprobs_num'], 'top_logprobs_num', 0):
    raise RequestError('top_logprobs_num > 0 is not supported by osvl_jax.serve')
  if body.get('logprob_start_len') not in (None, -1) or isinstance(body.get('logprob_start_len'), bool):
    raise RequestError(f'logprob_start_len={body["logprob_start_len"]!r} (prompt log-probs) is not supported by '
                       'osvl_jax.serve (only -1)')
  boolean(body.get('log_metrics'), 'log_metrics', True)
  modalities = body.get('modalities')
  if modalities is not None and not (isinstance(modalities, list) and all(isinstance(m, str) for m in modalities)):
    raise RequestError(f'modalities must be a list of strings, got {modalities!r}')
  text_in_logprobs = boolean(body.get('return_text_in_logprobs'), 'return_text_in_logprobs', False)
  input_ids = body.get('input_ids')
  if not isinstance(input_ids, list) or not input_ids:
    raise RequestError('input_ids must be a non-empty list of token ids (or a list of such lists)')
  is_batch = isinstance(input_ids[0], list)
  batch = input_ids if is_batch else [input_ids]
  n = len(batch)

  def per_row(value, name):
    if is_batch and isinstance(value, list):
      if len(value) != n:
        raise RequestError(f'{name} has {len(value)} entries for {n} rows')
      return value
    return [value] * n

  rid = body.get('rid')
  for k, r in enumerate(per_row(rid, 'rid')):
    if r is not None and not isinstance(r, str):
      raise RequestError(f'rid{f"[{k}]" if isinstance(rid, list) else ""} must be a string, got {r!r}')
  images = body.get('image_data')
  if images is None:
    images = [[] for _ in range(n)]
  elif is_batch:
    if not isinstance(images, list) or len(images) != n:
      raise RequestError(f'image_data must hold one entry per row ({n}), got {type(images).__name__}')
    images = [[] if im is None else im if isinstance(im, list) else [im] for im in images]
  elif isinstance(images, (str, list)):
    images = [images if isinstance(images, list) else [images]]
  else:
    raise RequestError(f'image_data must be a string or a list of strings, got {type(images).__name__}')
  sps = per_row(body.get('sampling_params'), 'sampling_params')
  lps = per_row(body.get('return_logprob'), 'return_logprob')
  gate = gate or request_limits.ImageGate(limits or request_limits.RequestLimits(1 << 62, 1 << 62))
  parsed = []
  for b, (ids, sp, lp) in enumerate(zip(batch, sps, lps)):   # cheap checks of every row before any image
    where = f'input_ids[{b}]' if is_batch else 'input_ids'
    if not isinstance(ids, list) or not ids:
      raise RequestError(f'{where} must be a non-empty list of token ids')
    if limits is not None:
      limits.check_prompt(len(ids), where)   # the ids before the pad expansion: a lower bound
    for k, i in enumerate(ids):
      if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < vocab:
        raise RequestError(f'{where}[{k}]={i!r} is not a token id: integers in [0, {vocab})')
    if getattr(getattr(model_config, 'text', None), 'vocab_ids', None) is not None:
      try:
        config_lib.check_ids(model_config, ids, where)
      except ValueError as e:
        raise RequestError(str(e)) from None
    name = f'sampling_params[{b}]' if is_batch and isinstance(body.get('sampling_params'), list) else 'sampling_params'
    parsed.append((parse_sampling(sp, default_max_new_tokens, limits, name),
                   boolean(lp, f'return_logprob[{b}]' if isinstance(body.get('return_logprob'), list)
                           else 'return_logprob', False)))
  rows = []
  for b, (ids, row_images, (sampling, lp)) in enumerate(zip(batch, images, parsed)):
    where = f'image_data[{b}]' if is_batch else 'image_data'
    refs = gate.decode(row_images, [f'{where}[{k}]' for k in range(len(row_images))], image_processor)
    expanded = expand_image_pads(ids, refs)
    request_limits.check_image_spans(expanded, refs)
    if limits is not None:
      limits.check_prompt(len(expanded), f'input_ids[{b}]' if is_batch else 'input_ids')
    rows.append(Row(context=engine_lib.Context(expanded, refs), return_logprob=lp,
                    return_text_in_logprobs=text_in_logprobs, **sampling))
  return rows, is_batch


# ---------------------------------------------------------------------------------------------------------------
# OpenAI chat messages -> ids (the trajectory builder's rendering).
# ---------------------------------------------------------------------------------------------------------------

def _message_parts(message: dict, where: str) -> tuple[str, list[tuple[str, str]]]:
  """(text, [(image item, its name)]) of a message checked by `request_fields.check_messages`."""
  content = message.get('content')
  if content is None or isinstance(content, str):
    return content or '', []
  texts, images = [], []
  for j, part in enumerate(content):
    if part['type'] == 'text':
      texts.append(part['text'])
    else:
      url = part['image_url']
      images.append((url.get('url') if isinstance(url, dict) else url, f'{where}.content[{j}].image_url'))
  return '\n'.join(texts), images


def render_messages(tokenizer, image_processor, messages: Sequence[dict],
                    gate: request_limits.ImageGate | None = None) -> tuple[np.ndarray, list]:
  """OpenAI chat messages -> (context ids int32 [T] ending '<|im_start|>assistant\\n', ImageRefs).

  The first system (optional) + user message are rendered by `TrajectoryBuilder.start` (system turn = the system
  message's text, without tool schemas; the user's text, then each image on its own line as `img_k: <span>`); later
  turns use the same markup: `<|im_start|>{role}\\n{content}<|im_end|>\\n` (assistant text trusted, so `<think>`
  and `<tool_call>` are their added tokens; user text untrusted), images named on from `img_k`. The images are
  decoded and processed on a decode thread of `gate` (None: one of its own, default limits); the ImageRefs keep
  no decoded original (`request_limits.drop_original`).

  Raises:
    RequestError: naming the field: a malformed message (`check_messages`), no user message first, a system
      message after the first, an image in a system / assistant message, an image over the limits.
  """
  check_messages(messages)
  parts = [(m['role'], *_message_parts(m, f'messages[{k}]')) for k, m in enumerate(messages)]
  for k, (role, _, images) in enumerate(parts):
    if images and role != 'user':
      raise RequestError(f'messages[{k}]: images are only accepted in user messages')
    if role == 'system' and k:
      raise RequestError(f'messages[{k}]: a system message must come first (tool turns are user turns here)')
  system = ''
  if parts[0][0] == 'system':
    system, parts = parts[0][1], parts[1:]
  if not parts or parts[0][0] != 'user':
    raise RequestError('messages must start with a user message (after an optional system message)')
  gate = gate or request_limits.ImageGate(request_limits.RequestLimits(1 << 62, 1 << 62))
  items = [item for _, _, images in parts for item in images]
  if items:   # decoded and processed on a decode thread, the arrays never leave it
    return gate.run(_render, tokenizer, image_processor, system, parts, gate, items)
  return _render(tokenizer, image_processor, system, parts, gate, items)


def _render(tokenizer, image_processor, system: str, parts: list, gate, items: list) -> tuple[np.ndarray, list]:
  from osvl_jax import trajectory as tj  # pylint: disable=g-import-not-at-top
  pixels = iter(gate.decode([i for i, _ in items], [n for _, n in items]))
  builder = tj.TrajectoryBuilder(tokenizer, image_processor, [], system_prompt=system)
  try:
    builder.start(parts[0][1], [next(pixels) for _ in parts[0][2]] or None)
  except ValueError as e:
    raise RequestError(f'cannot render the first user message: {e}') from e
  refs = builder.images
  header = [tokens_lib.IM_START_ID] + tokens_lib._encode(tokenizer, 'assistant\n')  # pylint: disable=protected-access
  ids = [int(i) for i in builder.prompt_ids()]
  ids = ids[:len(ids) - len(header)]
  enc = lambda text, untrusted=False: tokens_lib._encode(tokenizer, text, untrusted)  # pylint: disable=protected-access
  for role, text, images in parts[1:]:
    ids += [tokens_lib.IM_START_ID] + enc(f'{role}\n') + enc(text, untrusted=(role == 'user'))
    for _, name in images:
      try:
        ref = image_processor.process(next(pixels), name=f'img_{len(refs) + 1}')
      except ValueError as e:
        raise RequestError(f'{name}: {e}') from e
      ids += (enc('\n') + enc(f'img_{len(refs) + 1}: ') + [tokens_lib.VISION_START_ID]
              + [IMAGE_PAD_ID] * ref.num_tokens + [tokens_lib.VISION_END_ID])
      refs.append(ref)
    ids += [tokens_lib.IM_END_ID] + enc('\n')
  return np.asarray(ids + header, np.int32), [request_limits.drop_original(r) for r in refs]
