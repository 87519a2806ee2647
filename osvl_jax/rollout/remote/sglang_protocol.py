"""The wire format of SGLang's native `/generate` (DESIGN.md §6b), as `sglang_client.SGLangEngine` speaks it.

The request (fields of SGLang's `GenerateReqInput` / `SamplingParams`, checked against SGLang 0.5.23's
`io_struct.py` by `tests/serve/test_sglang_client.py`):

  {"input_ids": [int, ...],                       the context, each image's pad run collapsed to ONE pad
   "image_data": ["data:image/png;base64,..."],   one per image, in order (omitted without images)
   "sampling_params": {"max_new_tokens", "temperature", "top_p", "stop" (strings, when any),
                       "stop_token_ids": [<|im_end|>, <|endoftext|>], "skip_special_tokens": false,
                       "no_stop_trim": true,
                       "logit_bias": {"151652": -1e4, "151653": -1e4, "151655": -1e4, "151656": -1e4}},
   "return_logprob": true}

Vision ids out of sampling. The policy never emits `<|vision_start|>`, `<|vision_end|>`, `<|image_pad|>` or
`<|video_pad|>` (`trajectory.VISION_IDS`, DESIGN.md §4). SGLang 0.5.23 bans them with the native
`SamplingParams.logit_bias` (`{str(token_id): bias}`): `SamplingBatchInfo.from_schedule_batch` builds a dense
[B, V] bias row per request and `ModelRunner._preprocess_logits` -> `SamplingBatchInfo.apply_logits_bias` adds it
to the next-token logits before `layers/sampler.py::Sampler.forward` (so before temperature, top-p, argmax and
the returned log-probs), on every server without any flag. A `custom_logit_processor` would need the server
flag `--enable-custom-logit-processor` and a serialized (dill) processor in each request: not needed. The bias is
`BANNED_LOGIT_BIAS` = -1e4, finite (JSON has no -inf; SGLang's `/generate` parses strict JSON) and far below any
logit (exp(-1e4) is 0 in float32, also after dividing by a temperature; it fits float16 / bfloat16 logits).

Images. SGLang's `image_data` takes, per image, a URL, a file path, raw bytes or a base64 string / data URL
(`sglang.srt.utils.load_image`); the client sends the image's ORIGINAL pixels (`ImageRef.pixels`) as a lossless
PNG data URL, encoded once per `ImageRef` (`DataURLCache`: a trajectory's images are re-sent on every turn).
SGLang's multimodal processor resizes them itself, with the folder's `preprocessor_config.json` (which
`export_hf` writes with the training pixel budget), so its grid equals the trajectory's. For pre-tokenized
prompts SGLang 0.5.23 expects ONE `<|image_pad|>` placeholder per image inside `<|vision_start|>...
<|vision_end|>` and, with `SGLANG_MM_AVOID_RETOKENIZE` on (`srt/environ.py`, default true in 0.5.23;
`tpu_scripts/sglang_server.sh` sets it explicitly), keeps the sent ids verbatim and expands the i-th placeholder
into that image's feature count (`BaseMultimodalProcessor.process_and_combine_mm_data` -> `_expand_input_ids`).
Off, or when that expansion fails (it logs a warning and falls back), the ids are decoded and re-tokenized by the
HF processor, which may change them (retokenization drift, sgl-project/sglang#26555). The trajectory's context
holds the expanded run (`ImageRef.num_tokens` pads), so the client collapses each run to one pad (checking its
length against the image) before sending. `osvl_jax.serve` accepts both forms.

The response: `output_ids` (the emitted ids, including the stop id when one matched) and `meta_info` with
`prompt_tokens` (the length of the prompt the server ran, images expanded: `len(req.origin_input_ids)`),
`output_token_logprobs` = [[logprob, token_id, text|null], ...] (one per emitted id), `finish_reason` =
{"type": "stop", "matched": <id | string>} | {"type": "length", "length": n} | {"type": "abort", ...},
`weight_version` and, when an update landed mid-request, `weight_versions` = [{version, start, end}, ...].
`prompt_tokens` must equal the context's length (`len(Context.prompt_ids)`, pads expanded): anything else means
the server ran other ids than the trajectory records (drift, another image expansion), an `EngineError` of kind
'prompt_mismatch'.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import threading
import weakref
from typing import Any, Sequence

import numpy as np

from osvl_jax.rollout import engine as engine_lib
from osvl_jax.trajectory import tokens as tokens_lib

IMAGE_PAD_ID = tokens_lib.IMAGE_PAD_ID
BANNED_LOGIT_BIAS = -1e4  # added to the logits of ids that must never be sampled (see the module docstring).
VISION_LOGIT_BIAS = {str(i): BANNED_LOGIT_BIAS for i in tokens_lib.VISION_IDS}  # SamplingParams.logit_bias

# EngineError.kind values.
ERROR_CONNECTION = 'connection'   # refused / reset / dropped connection
ERROR_TIMEOUT = 'timeout'         # connect, read or write timeout
ERROR_HTTP = 'http_status'        # a non-2xx answer (after retries for 5xx / 429)
ERROR_RESPONSE = 'bad_response'   # a 2xx answer this client cannot read (missing fields, lengths differ)
ERROR_ABORT = 'abort'             # the server aborted the request (finish_reason type 'abort')
ERROR_PROMPT = 'prompt_mismatch'  # meta_info.prompt_tokens differs from the context's length
ERROR_KINDS = (ERROR_CONNECTION, ERROR_TIMEOUT, ERROR_HTTP, ERROR_RESPONSE, ERROR_ABORT, ERROR_PROMPT)


class EngineError(RuntimeError):
  """A generation or admin call that failed after its retries, or an answer that cannot be trusted.

  Attributes:
    kind: one of `ERROR_KINDS`.
    url: the last URL tried.
    status: the HTTP status of the last answer, or None (no answer).
    attempts: how many requests were sent.
  """

  def __init__(self, kind: str, message: str, url: str = '', status: int | None = None, attempts: int = 1):
    super().__init__(f'{kind}: {message} (url={url}, status={status}, attempts={attempts})')
    self.kind, self.url, self.status, self.attempts = kind, url, status, attempts


@dataclasses.dataclass
class SGLangGeneration(engine_lib.Generation):
  """A `Generation` (with `weight_version` / `weight_versions` from `meta_info`) and the rest of what the server
  reported.

  Attributes:
    meta_info: the whole `meta_info` of the answer, minus the per-token log-prob lists.
  """
  meta_info: dict | None = None


def image_data_url(image: Any) -> str:
  """`data:image/png;base64,...` of an `ImageRef`'s original pixels (or of a uint8 [H, W, 3] array).

  Raises:
    ValueError: pixels that are not uint8 [H, W, 3].
  """
  from PIL import Image  # pylint: disable=g-import-not-at-top
  pixels = np.asarray(getattr(image, 'pixels', image))
  if pixels.dtype != np.uint8 or pixels.ndim != 3 or pixels.shape[-1] != 3:
    raise ValueError(f'an image must be an ImageRef or uint8 [H, W, 3], got {pixels.dtype} {pixels.shape}')
  buf = io.BytesIO()
  Image.fromarray(pixels).save(buf, format='PNG', compress_level=1)
  return 'data:image/png;base64,' + base64.b64encode(buf.getvalue()).decode('ascii')


class DataURLCache:
  """`image_data_url` of each `ImageRef`, computed once while that ImageRef lives.

  Keyed weakly by the ImageRef object (identity: `ImageRef` is `eq=False`), so an entry goes when its trajectory
  (builder, record) drops the image. An entry is recomputed when `ImageRef.pixels` was replaced by another array.
  Raw arrays are encoded on every call (not cached). Thread-safe; two threads racing on one new image may both
  encode it (same result).
  """

  def __init__(self):
    self._urls: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # ImageRef -> (pixels, url)
    self._lock = threading.Lock()

  def __len__(self) -> int:
    with self._lock:
      return len(self._urls)

  def url(self, image: Any) -> str:
    """The data URL of `image` (an `ImageRef`, cached; or a uint8 [H, W, 3] array, encoded each call).

    Raises:
      ValueError: pixels that are not uint8 [H, W, 3] (`image_data_url`).
    """
    pixels = getattr(image, 'pixels', None)
    if pixels is None:
      return image_data_url(image)
    with self._lock:
      hit = self._urls.get(image)
    if hit is not None and hit[0] is pixels:
      return hit[1]
    url = image_data_url(image)
    with self._lock:
      self._urls[image] = (pixels, url)
    return url


def collapse_image_pads(prompt_ids: np.ndarray, images: Sequence[Any]) -> list[int]:
  """The context with each image's `<|image_pad|>` run replaced by one pad (SGLang expands it again).

  Args:
    prompt_ids: int [T], the context, with `ImageRef.num_tokens` consecutive pads per image.
    images: the context's images in order (`ImageRef`s; raw arrays are accepted unchecked).
  Returns:
    The ids as a list of ints, one pad per image.
  Raises:
    ValueError: the number of pad runs differs from the number of images, or a run's length differs from its
      image's `num_tokens`.
  """
  ids = [int(i) for i in np.asarray(prompt_ids).reshape(-1)]
  out, k, i = [], 0, 0
  while i < len(ids):
    if ids[i] != IMAGE_PAD_ID:
      out.append(ids[i])
      i += 1
      continue
    j = i
    while j < len(ids) and ids[j] == IMAGE_PAD_ID:
      j += 1
    if k >= len(images):
      raise ValueError(f'context has more <|image_pad|> runs than its {len(images)} image(s)')
    want = getattr(images[k], 'num_tokens', None)
    if want is not None and j - i != want:
      raise ValueError(f'image {k + 1}: a run of {j - i} <|image_pad|> but the image needs {want}')
    out.append(IMAGE_PAD_ID)
    k, i = k + 1, j
  if k != len(images):
    raise ValueError(f'context has {k} <|image_pad|> run(s) but {len(images)} image(s)')
  return out


def check_prompt_tokens(meta: dict, prompt_len: int, sent_len: int, url: str = '') -> None:
  """Checks that the server ran a prompt of the context's length (`meta_info.prompt_tokens`).

  Args:
    meta: the answer's `meta_info`.
    prompt_len: the context's length, `len(Context.prompt_ids)` (each image's pads expanded).
    sent_len: the length of the `input_ids` sent (one pad per image), for the message.
    url: the server, for the error.
  Raises:
    EngineError: kind 'bad_response' when `prompt_tokens` is missing or not an integer; 'prompt_mismatch' naming
      both counts when it differs from `prompt_len`.
  """
  got = meta.get('prompt_tokens')
  if isinstance(got, bool) or not isinstance(got, int):
    raise EngineError(ERROR_RESPONSE, f'meta_info.prompt_tokens={got!r}: not an integer, so the prompt the '
                      'server ran cannot be checked against the context', url)
  if got != prompt_len:
    raise EngineError(ERROR_PROMPT, f'the server reports prompt_tokens={got} but the context has {prompt_len} '
                      f'tokens (sent as {sent_len} input_ids, one <|image_pad|> per image): it ran other ids '
                      'than the trajectory records (retokenization drift: SGLANG_MM_AVOID_RETOKENIZE off? or '
                      'another image size: preprocessor_config.json)', url)


def _finish_reason(meta: dict, url: str) -> str:
  reason = meta.get('finish_reason')
  kind = reason.get('type') if isinstance(reason, dict) else reason
  if kind == 'stop':
    matched = reason.get('matched') if isinstance(reason, dict) else None
    return engine_lib.FINISH_STOP_STRING if isinstance(matched, str) else engine_lib.FINISH_STOP
  if kind == 'length':
    return engine_lib.FINISH_LENGTH
  if kind == 'abort':
    raise EngineError(ERROR_ABORT, f'request aborted by the server: {reason}', url)
  raise EngineError(ERROR_RESPONSE, f'unknown finish_reason {reason!r}', url)


def parse_generate_response(out: Any, tokenizer, url: str = '') -> SGLangGeneration:
  """A `/generate` answer -> `SGLangGeneration` (ids, log-probs, finish reason, weight version).

  Args:
    out: the decoded JSON answer.
    tokenizer: the Qwen tokenizer, for `Generation.text`.
    url: the server, for errors.
  Raises:
    EngineError: kind 'bad_response' for an answer without ids / log-probs or whose lengths differ; 'abort'
      for an aborted request.
  """
  meta = out.get('meta_info') if isinstance(out, dict) else None
  if not isinstance(meta, dict):
    raise EngineError(ERROR_RESPONSE, f'no meta_info in {str(out)[:200]}', url)
  token_lps = meta.get('output_token_logprobs')
  if token_lps is None:
    raise EngineError(ERROR_RESPONSE, 'no output_token_logprobs in meta_info (return_logprob ignored?)', url)
  try:
    lp_ids = [int(entry[1]) for entry in token_lps]
    logprobs = np.asarray([float(entry[0]) for entry in token_lps], np.float32)
  except (TypeError, ValueError, IndexError) as e:
    raise EngineError(ERROR_RESPONSE, f'unreadable output_token_logprobs: {e}', url) from e
  ids = out.get('output_ids')
  ids = lp_ids if ids is None else [int(i) for i in ids]
  if ids != lp_ids:
    raise EngineError(ERROR_RESPONSE, f'output_ids ({len(ids)}) and output_token_logprobs ({len(lp_ids)}) '
                      'disagree', url)
  reason = _finish_reason(meta, url)
  rest = {k: v for k, v in meta.items() if not k.endswith('token_logprobs')}
  return SGLangGeneration(ids=np.asarray(ids, np.int32), logprobs=logprobs,
                          text=engine_lib.decode_text(tokenizer, ids), finish_reason=reason,
                          weight_version=None if meta.get('weight_version') is None
                          else str(meta['weight_version']),
                          weight_versions=meta.get('weight_versions'), meta_info=rest)
