"""Request handling of `osvl_jax.rollout.server`: SGLang `/generate` fields and sampling parameters, images
(base64 / data URLs, pad expansion), OpenAI chat messages rendered as the `TrajectoryBuilder` renders them, and
loading the served policy. Every refusal is a `RequestError` naming the field (HTTP 400).
"""

import base64
import binascii
import dataclasses
import pathlib
from typing import Any, Callable, Sequence

import numpy as np

from osvl_jax.rollout import engine as engine_lib
from osvl_jax.trajectory import tokens as tokens_lib

IMAGE_PAD_ID = tokens_lib.IMAGE_PAD_ID

# /generate top-level fields this server reads; any other field must be absent or hold a default-like value
# (None, False, 0, empty), else the request is refused naming it.
GENERATE_FIELDS = ('input_ids', 'image_data', 'sampling_params', 'return_logprob', 'return_text_in_logprobs',
                   'logprob_start_len', 'top_logprobs_num', 'stream', 'rid', 'log_metrics', 'modalities')
# sampling_params keys read here, and those accepted only at their default (value -> allowed values).
SAMPLING_FIELDS = ('max_new_tokens', 'temperature', 'top_p', 'stop', 'stop_token_ids', 'skip_special_tokens',
                   'no_stop_trim', 'sampling_seed', 'spaces_between_special_tokens', 'stream_interval')
SAMPLING_DEFAULT_ONLY = {'top_k': (None, -1, 0, 1 << 30), 'min_p': (None, 0, 0.0), 'n': (None, 1),
                         'frequency_penalty': (None, 0, 0.0), 'presence_penalty': (None, 0, 0.0),
                         'repetition_penalty': (None, 1, 1.0), 'min_new_tokens': (None, 0), 'ignore_eos': (None, False),
                         'json_schema': (None,), 'regex': (None,), 'ebnf': (None,), 'logit_bias': (None, {}),
                         'custom_params': (None, {}), 'structural_tag': (None,), 'stop_regex': (None, [], ())}


class RequestError(ValueError):
  """A request this server refuses (HTTP 400), with the reason."""


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
# Loading weights.
# ---------------------------------------------------------------------------------------------------------------

def load_policy(path: str | pathlib.Path, workdir: str | None = None, step: int | None = None,
                hf_config: str | None = None):
  """Loads a policy from an orbax checkpoint of the project or from an HF folder.

  Args:
    path: an HF folder (`config.json` + `*.safetensors`), or what `export_hf.resolve_checkpoint` takes:
      'latest' | 'sft' | 'grpo' (with `workdir`), a checkpoint folder (`W/sft_ckpt`) or one step of it.
    workdir: the job folder for the named choices.
    step: checkpoint step (None: the latest).
    hf_config: architecture override (`export_hf.read_config`).
  Returns:
    (model `Qwen3VLModel`, meta dict: the checkpoint's meta with 'step' and 'path', or {'path'} for an HF folder).
  Raises:
    FileNotFoundError: no such checkpoint / folder.
    ValueError: the checkpoint does not fit the architecture.
  """
  from flax import nnx  # pylint: disable=g-import-not-at-top

  from osvl_jax import export_hf  # pylint: disable=g-import-not-at-top
  from osvl_jax.models.qwen3_vl import weights  # pylint: disable=g-import-not-at-top
  from osvl_jax.models.qwen3_vl.model import Qwen3VLModel  # pylint: disable=g-import-not-at-top
  from osvl_jax.train import checkpoint as ckpt_lib  # pylint: disable=g-import-not-at-top
  p = pathlib.Path(str(path))
  if p.is_dir() and (p / 'config.json').is_file():
    model, _ = weights.load_hf_folder(p)
    return model, {'path': str(p)}
  folder, step = export_hf.resolve_checkpoint(workdir, str(path), step)
  mngr = ckpt_lib.manager(folder.parent, folder.name)
  saved = ckpt_lib.read_meta(mngr, step)
  config = export_hf.read_config(hf_config, saved)
  model = Qwen3VLModel(config, nnx.Rngs(0), scan_layers=bool(saved.get('scan_layers', False)))
  try:
    meta = ckpt_lib.restore(mngr, model, step=step)
  except ValueError as e:
    raise ValueError(f'checkpoint {folder} does not fit this architecture: {e}') from e
  return model, {**meta, 'path': f'{folder}/{step}'}


# ---------------------------------------------------------------------------------------------------------------
# Request parsing.
# ---------------------------------------------------------------------------------------------------------------

def decode_image(item: Any) -> np.ndarray:
  """An `image_data` item (base64 string or `data:image/...;base64,` URL) -> uint8 [H, W, 3]."""
  from tools import image_io  # pylint: disable=g-import-not-at-top
  if not isinstance(item, str):
    raise RequestError(f'image_data items must be base64 strings or data URLs, got {type(item).__name__}')
  data = item
  if data.startswith('data:'):
    head, _, data = data.partition(',')
    if ';base64' not in head:
      raise RequestError('image_data data URLs must be base64-encoded')
  elif data.startswith(('http://', 'https://', 'file://', '/')):
    raise RequestError('osvl_jax.serve does not fetch image URLs or files: send base64 / data URLs')
  try:
    raw = base64.b64decode(data, validate=False)
    return image_io.load_image(raw)
  except (binascii.Error, ValueError) as e:
    raise RequestError(f'cannot decode image_data item: {e}') from e


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


def parse_generate(body: Any, image_processor: Any, vocab: int,
                   default_max_new_tokens: int) -> tuple[list[Row], bool]:
  """A SGLang `/generate` body -> (rows, is_batch): ids in [0, vocab), images decoded and processed with
  `image_processor` (`ImageProcessor`), pads expanded; a row without max_new_tokens gets `default_max_new_tokens`.

  Raises:
    RequestError: a field this server cannot honour, malformed ids or images, pad counts that do not match.
  """
  if not isinstance(body, dict):
    raise RequestError('the body must be a JSON object')
  for key, value in body.items():
    if key not in GENERATE_FIELDS and not default_like(value):
      raise RequestError(f'field {key!r} is not supported by osvl_jax.serve (token ids in, no text prompts)')
  if body.get('stream'):
    raise RequestError('stream=true is not supported by osvl_jax.serve')
  if body.get('top_logprobs_num'):
    raise RequestError('top_logprobs_num is not supported by osvl_jax.serve')
  if body.get('logprob_start_len') not in (None, -1):
    raise RequestError('logprob_start_len (prompt log-probs) is not supported by osvl_jax.serve')
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

  images = body.get('image_data')
  if images is None:
    images = [[] for _ in range(n)]
  elif is_batch:
    if not isinstance(images, list) or len(images) != n:
      raise RequestError(f'image_data must hold one entry per row ({n})')
    images = [[] if im is None else im if isinstance(im, list) else [im] for im in images]
  else:
    images = [images if isinstance(images, list) else [images]]
  sps = per_row(body.get('sampling_params'), 'sampling_params')
  lps = per_row(body.get('return_logprob'), 'return_logprob')
  rows = []
  for ids, row_images, sp, lp in zip(batch, images, sps, lps):
    if not isinstance(ids, list) or not ids or not all(
        isinstance(i, int) and not isinstance(i, bool) and 0 <= i < vocab for i in ids):
      raise RequestError(f'input_ids must be non-empty lists of integers in [0, {vocab})')
    refs = []
    for k, item in enumerate(row_images):
      try:
        refs.append(image_processor.process(decode_image(item), name=f'image_data[{k}]'))
      except ValueError as e:
        raise RequestError(str(e)) from e
    context = engine_lib.Context(expand_image_pads(ids, refs), refs)
    rows.append(Row(context=context, return_logprob=bool(lp),
                    return_text_in_logprobs=bool(body.get('return_text_in_logprobs')),
                    **parse_sampling(sp, default_max_new_tokens)))
  return rows, is_batch


def default_like(value: Any) -> bool:
  """True for a value SGLang treats as unset (None, False, 0, [], {}): such an unsupported field is accepted."""
  return value is None or value is False or (isinstance(value, (int, float)) and value == 0) or value in ([], {})


def _number(sp: dict, key: str, default: float, ok: Callable[[float], bool], what: str) -> float:
  value = sp.get(key)
  if value is None:
    return default
  if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(float(value)):
    raise RequestError(f'sampling_params.{key} must be {what}, got {value!r}')
  return float(value)


def parse_sampling(sp: Any, default_max_new: int) -> dict:
  """SGLang `sampling_params` -> the subset this server runs (RequestError for anything it cannot honour)."""
  sp = {} if sp is None else sp
  if not isinstance(sp, dict):
    raise RequestError('sampling_params must be an object')
  for key, value in sp.items():
    if key in SAMPLING_FIELDS:
      continue
    if key in SAMPLING_DEFAULT_ONLY:
      if value not in SAMPLING_DEFAULT_ONLY[key]:
        raise RequestError(f'sampling_params.{key}={value!r} is not supported by osvl_jax.serve')
      continue
    raise RequestError(f'unknown sampling_params field {key!r}')
  max_new = sp.get('max_new_tokens')
  max_new = default_max_new if max_new is None else max_new
  if isinstance(max_new, bool) or not isinstance(max_new, int) or max_new < 1:
    raise RequestError(f'sampling_params.max_new_tokens must be an integer >= 1, got {max_new!r}')
  temperature = _number(sp, 'temperature', 1.0, lambda t: np.isfinite(t) and t >= 0, 'a finite number >= 0')
  top_p = _number(sp, 'top_p', 1.0, lambda p: 0 < p <= 1, 'in (0, 1]')
  stop = sp.get('stop') or ()
  stop = (stop,) if isinstance(stop, str) else tuple(stop)
  if not all(isinstance(s, str) and s for s in stop):
    raise RequestError(f'sampling_params.stop must be non-empty strings, got {stop!r}')
  stop_ids = sp.get('stop_token_ids') or ()
  if not all(isinstance(i, int) and not isinstance(i, bool) for i in stop_ids):
    raise RequestError(f'sampling_params.stop_token_ids must be integers, got {stop_ids!r}')
  return {'max_new_tokens': int(max_new), 'temperature': temperature, 'top_p': top_p, 'stop': stop,
          'stop_token_ids': frozenset(int(i) for i in stop_ids),
          'skip_special_tokens': bool(sp.get('skip_special_tokens', True)),
          'no_stop_trim': bool(sp.get('no_stop_trim', False))}


# ---------------------------------------------------------------------------------------------------------------
# OpenAI chat messages -> ids (the trajectory builder's rendering).
# ---------------------------------------------------------------------------------------------------------------

def _message_parts(message: dict) -> tuple[str, list[np.ndarray]]:
  content = message.get('content')
  if content is None or isinstance(content, str):
    return content or '', []
  if not isinstance(content, list):
    raise RequestError('message content must be a string or a list of parts')
  texts, images = [], []
  for part in content:
    kind = part.get('type') if isinstance(part, dict) else None
    if kind == 'text':
      texts.append(str(part.get('text', '')))
    elif kind == 'image_url':
      url = part.get('image_url')
      url = url.get('url') if isinstance(url, dict) else url
      images.append(decode_image(url))
    else:
      raise RequestError(f'unsupported content part {part!r}')
  return '\n'.join(texts), images


def render_messages(tokenizer, image_processor, messages: Sequence[dict]) -> tuple[np.ndarray, list]:
  """OpenAI chat messages -> (context ids int32 [T] ending '<|im_start|>assistant\\n', ImageRefs).

  The first system (optional) + user message are rendered by `TrajectoryBuilder.start` (system turn = the system
  message's text, without tool schemas; the user's text, then each image on its own line as `img_k: <span>`); later
  turns use the same markup: `<|im_start|>{role}\\n{content}<|im_end|>\\n` (assistant text trusted, so `<think>`
  and `<tool_call>` are their added tokens; user text untrusted), images named on from `img_k`.

  Raises:
    RequestError: no user message first, an unknown role, an image in a system / assistant message.
  """
  from osvl_jax import trajectory as tj  # pylint: disable=g-import-not-at-top
  msgs = list(messages)
  system = ''
  if msgs and msgs[0].get('role') == 'system':
    system, images = _message_parts(msgs[0])
    if images:
      raise RequestError('images are only accepted in user messages')
    msgs = msgs[1:]
  if not msgs or msgs[0].get('role') != 'user':
    raise RequestError('messages must start with a user message (after an optional system message)')
  question, first_images = _message_parts(msgs[0])
  builder = tj.TrajectoryBuilder(tokenizer, image_processor, [], system_prompt=system)
  try:
    builder.start(question, first_images or None)
  except ValueError as e:
    raise RequestError(f'cannot render the first user message: {e}') from e
  refs = builder.images
  header = [tokens_lib.IM_START_ID] + tokens_lib._encode(tokenizer, 'assistant\n')  # pylint: disable=protected-access
  ids = [int(i) for i in builder.prompt_ids()]
  ids = ids[:len(ids) - len(header)]
  enc = lambda text, untrusted=False: tokens_lib._encode(tokenizer, text, untrusted)  # pylint: disable=protected-access
  for message in msgs[1:]:
    role = message.get('role')
    if role not in ('user', 'assistant'):
      raise RequestError(f'unsupported role {role!r} (system must come first; tool turns are user turns here)')
    text, images = _message_parts(message)
    if images and role != 'user':
      raise RequestError('images are only accepted in user messages')
    ids += [tokens_lib.IM_START_ID] + enc(f'{role}\n') + enc(text, untrusted=(role == 'user'))
    for image in images:
      try:
        ref = image_processor.process(image, name=f'img_{len(refs) + 1}')
      except ValueError as e:
        raise RequestError(str(e)) from e
      ids += (enc('\n') + enc(f'img_{len(refs) + 1}: ') + [tokens_lib.VISION_START_ID]
              + [IMAGE_PAD_ID] * ref.num_tokens + [tokens_lib.VISION_END_ID])
      refs.append(ref)
    ids += [tokens_lib.IM_END_ID] + enc('\n')
  return np.asarray(ids + header, np.int32), refs
