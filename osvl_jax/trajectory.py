"""The Trajectory record, chat rendering, action parsing and masks (DESIGN.md §4).

A trajectory is token-exact: `TrajectoryBuilder` appends the ids the policy emitted and the ids of each rendered
observation, never re-tokenizing earlier turns, so the trainer sees exactly the sequence and images the policy saw.

Chat format (Qwen3-VL markup, Hermes tools)::

  <|im_start|>system
  {instructions}

  # Tools

  You are provided with function signatures within <tools></tools> XML tags:
  <tools>
  {"type": "function", "function": {...}}          one JSON line per tool
  </tools>

  For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
  <tool_call>
  {"name": <function-name>, "arguments": <args-json-object>}
  </tool_call><|im_end|>
  <|im_start|>user
  {question}
  img_1: <|vision_start|><|image_pad|>×N<|vision_end|><|im_end|>
  <|im_start|>assistant
  <think>
  ...
  </think>
  <tool_call>
  {"name": "image_search", "arguments": {"image": "img_1"}}
  </tool_call><|im_end|>                                <- gen_mask 1 on the emitted ids (step 0)
  <|im_start|>user
  <tool_response>
  {tool text}
  img_2: <|vision_start|><|image_pad|>×N<|vision_end|>
  </tool_response><|im_end|>
  <|im_start|>assistant
  <think>...</think>
  <response>answer</response><|im_end|>                <- step 1

`<think>`, `</think>`, `<tool_call>`, `</tool_call>`, `<tool_response>`, `</tool_response>` are single added
tokens of the Qwen3 vocabulary; `<response>` is plain text.

Earlier turns, <think> blocks included, stay in the context exactly as emitted (no chat template re-renders them).
`check_trajectory` / `validate_trajectory` state the invariants the trainer relies on (`train.batching.collate`
validates every trajectory); `python -m osvl_jax.trajectory --check FILE.jsonl` checks a file of `to_json` lines.
"""

import argparse
import base64
import dataclasses
import functools
import io
import json
import os
import pathlib
import re
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from PIL import Image

from osvl_jax import paths
from tools.base import ToolResult

# --------------------------------------------------------------------------------------------------------------
# Token ids (Qwen3 / Qwen3-VL added tokens; data/qwen/configs/qwen3_vl_family_hparams.assembled.json).

# id -> (content, special). 151643-151656 are special=True, 151657-151668 special=False, as in Qwen3 tokenizer.json.
ADDED_TOKENS: dict[int, tuple[str, bool]] = {
    151643: ('<|endoftext|>', True),
    151644: ('<|im_start|>', True),
    151645: ('<|im_end|>', True),
    151646: ('<|object_ref_start|>', True),
    151647: ('<|object_ref_end|>', True),
    151648: ('<|box_start|>', True),
    151649: ('<|box_end|>', True),
    151650: ('<|quad_start|>', True),
    151651: ('<|quad_end|>', True),
    151652: ('<|vision_start|>', True),
    151653: ('<|vision_end|>', True),
    151654: ('<|vision_pad|>', True),
    151655: ('<|image_pad|>', True),
    151656: ('<|video_pad|>', True),
    151657: ('<tool_call>', False),
    151658: ('</tool_call>', False),
    151659: ('<|fim_prefix|>', False),
    151660: ('<|fim_middle|>', False),
    151661: ('<|fim_suffix|>', False),
    151662: ('<|fim_pad|>', False),
    151663: ('<|repo_name|>', False),
    151664: ('<|file_sep|>', False),
    151665: ('<tool_response>', False),
    151666: ('</tool_response>', False),
    151667: ('<think>', False),
    151668: ('</think>', False),
}
ENDOFTEXT_ID = 151643
IM_START_ID = 151644
IM_END_ID = 151645
VISION_START_ID = 151652
VISION_END_ID = 151653
IMAGE_PAD_ID = 151655
TOOL_CALL_ID = 151657
TOOL_CALL_END_ID = 151658
TOOL_RESPONSE_ID = 151665
TOOL_RESPONSE_END_ID = 151666
THINK_ID = 151667
THINK_END_ID = 151668
# Regular BPE tokens used by `check_trajectory` to find assistant turns.
ASSISTANT_ID = 77091  # 'assistant'
NEWLINE_ID = 198  # '\n'
VOCAB_SIZE = 151936  # embedding rows of every Qwen3-VL checkpoint (ids above 151668 are unused padding)


class TrajectoryError(ValueError):
  """A trajectory breaks an invariant the trainer relies on (`validate_trajectory`); the message names each problem."""


class PromptTooLongError(TrajectoryError):
  """A rendered prompt exceeds its token budget; prompts are never cut (a cut could split an image span)."""


# Why an episode stopped (`Trajectory.stop_reason`). The last two mean the token budget cut the episode short.
STOP_REASONS = ('response', 'max_turns', 'fatal', 'token_budget', 'context_full')
TRUNCATION_REASONS = ('token_budget', 'context_full')

# Qwen2 pre-tokenizer regex (single digits, contractions, letters, punctuation runs, newlines, spaces).
QWEN2_PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
    r"\s+(?!\S)|\s+")


# --------------------------------------------------------------------------------------------------------------
# Tokenizer.

def load_tokenizer(data_dir: str | os.PathLike | None = None):
  """The Qwen3-VL tokenizer: Qwen byte-level BPE plus the Qwen3-VL added tokens at their real ids.

  Built from `qwen/tokenizer/{vocab.json, merges.txt}` with the Qwen2 pre-tokenizer regex, NFC and ByteLevel;
  "Hello world" -> [9707, 1879]. Cached per process and per folder: treat the result as read-only.

  Args:
    data_dir: the shared data folder; default `osvl_jax.paths.data_dir()`.
  Returns:
    `transformers.PreTrainedTokenizerFast` with eos `<|im_end|>`, pad `<|endoftext|>`, no bos, `len() == 151669`.
  """
  base = pathlib.Path(data_dir) if data_dir is not None else paths.data_dir()
  return _build_tokenizer(str(base.resolve()))


@functools.lru_cache(maxsize=4)
def _build_tokenizer(base: str):
  import tokenizers  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  folder = pathlib.Path(base) / 'qwen' / 'tokenizer'
  vocab, merges = folder / 'vocab.json', folder / 'merges.txt'
  for f in (vocab, merges):
    if not f.is_file():
      raise FileNotFoundError(f'Qwen tokenizer file {f} is missing (data folder {base})')
  def bare():
    t = tokenizers.Tokenizer(tokenizers.models.BPE.from_file(
        str(vocab), str(merges), unk_token=None, byte_fallback=False, fuse_unk=False))
    t.normalizer = tokenizers.normalizers.NFC()
    t.pre_tokenizer = tokenizers.pre_tokenizers.Sequence([
        tokenizers.pre_tokenizers.Split(tokenizers.Regex(QWEN2_PRETOKENIZE_REGEX), behavior='isolated',
                                        invert=False),
        tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    t.decoder = tokenizers.decoders.ByteLevel()
    t.post_processor = tokenizers.processors.ByteLevel(trim_offsets=False)
    return t
  tok, plain = bare(), bare()
  base_size = tok.get_vocab_size(with_added_tokens=False)
  if base_size != min(ADDED_TOKENS):
    raise ValueError(f'{vocab} has {base_size} tokens; expected {min(ADDED_TOKENS)} (Qwen2/3 BPE)')
  for idx in sorted(ADDED_TOKENS):
    content, special = ADDED_TOKENS[idx]
    added = tokenizers.AddedToken(content, special=special, normalized=False, lstrip=False, rstrip=False,
                                  single_word=False)
    (tok.add_special_tokens if special else tok.add_tokens)([added])
    if tok.token_to_id(content) != idx:
      raise ValueError(f'added token {content!r} got id {tok.token_to_id(content)}, expected {idx}')
  hf = transformers.PreTrainedTokenizerFast(
      tokenizer_object=tok, eos_token='<|im_end|>', pad_token='<|endoftext|>', bos_token=None, unk_token=None,
      clean_up_tokenization_spaces=False, model_max_length=262144, padding_side='left')
  hf.osvl_plain_tokenizer = plain  # no added tokens: encodes untrusted text ('<think>' -> '<', 'think', '>')
  return hf


def _encode(tokenizer, text: str, untrusted: bool = False) -> list[int]:
  """Ids of `text`; `untrusted` text (questions, tool output) never produces added tokens.

  So a web page that contains '</tool_response>' or '<|im_end|>' cannot close the turn it sits in.
  """
  if not text:
    return []
  if untrusted:
    plain = getattr(tokenizer, 'osvl_plain_tokenizer', None)
    if plain is not None:
      return list(plain.encode(text, add_special_tokens=False).ids)
    return list(tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))
  return list(tokenizer.encode(text, add_special_tokens=False))


# --------------------------------------------------------------------------------------------------------------
# Images.

# Qwen3-VL preprocessor_config.json: size.shortest_edge / size.longest_edge, mean = std = 0.5.
QWEN3_VL_MIN_PIXELS = 65536
QWEN3_VL_MAX_PIXELS = 16777216
QWEN3_VL_IMAGE_MEAN = (0.5, 0.5, 0.5)
QWEN3_VL_IMAGE_STD = (0.5, 0.5, 0.5)


@dataclasses.dataclass(eq=False)
class ImageRef:
  """One image of a trajectory, as the model sees it.

  Attributes:
    pixels: uint8 [H, W, 3] RGB, the original (tools crop/sharpen these; stored as PNG in records).
    pixel_values: float32 [N, 3 * temporal_patch_size * patch_size**2] (= [N, 1536]), N = prod(grid_thw);
      patches in the Qwen2-VL/Qwen3-VL order (merge-window major), normalised with mean = std = 0.5.
    grid_thw: int32 [3] = (1, H' / patch_size, W' / patch_size) of the resized image.
    patch_size, temporal_patch_size, merge_size: the vision tower's patching (16, 2, 2 for Qwen3-VL).
  """
  pixels: np.ndarray
  pixel_values: np.ndarray
  grid_thw: np.ndarray
  patch_size: int = 16
  temporal_patch_size: int = 2
  merge_size: int = 2

  @property
  def num_tokens(self) -> int:
    """Number of `<|image_pad|>` tokens: prod(grid_thw) // merge_size**2."""
    return int(np.prod(self.grid_thw)) // (self.merge_size ** 2)

  def to_png(self) -> bytes:
    """The original pixels as PNG bytes."""
    buf = io.BytesIO()
    Image.fromarray(self.pixels).save(buf, format='PNG', compress_level=3)
    return buf.getvalue()

  @classmethod
  def from_pixels_and_grid(cls, pixels: np.ndarray, grid_thw: Sequence[int], patch_size: int = 16,
                           temporal_patch_size: int = 2, merge_size: int = 2) -> 'ImageRef':
    """Rebuilds the ImageRef of `pixels` at a known grid (e.g. from a stored record); bit-identical to process()."""
    pixels = _check_rgb(pixels, 'stored image')
    grid = np.asarray(grid_thw, np.int32).reshape(3)
    pv = _pixel_values(pixels, int(grid[1]) * patch_size, int(grid[2]) * patch_size, patch_size,
                       temporal_patch_size, merge_size)
    return cls(pixels, pv, grid, patch_size, temporal_patch_size, merge_size)


def _check_rgb(image: Any, name: str) -> np.ndarray:
  """`image` as a contiguous uint8 [H, W, 3] array, or a ValueError naming `name` and what is wrong."""
  if isinstance(image, Image.Image):
    if image.mode != 'RGB':
      raise ValueError(f'{name}: PIL image in mode {image.mode!r}; expected RGB')
    image = np.asarray(image)
  if not isinstance(image, np.ndarray):
    raise ValueError(f'{name}: expected a numpy uint8 [H, W, 3] RGB array, got {type(image).__name__}')
  if image.dtype != np.uint8:
    raise ValueError(f'{name}: dtype {image.dtype}, expected uint8 [H, W, 3] RGB')
  if image.ndim != 3 or image.shape[2] != 3:
    raise ValueError(f'{name}: shape {image.shape}, expected [H, W, 3] RGB')
  if image.shape[0] == 0 or image.shape[1] == 0:
    raise ValueError(f'{name}: empty image of shape {image.shape}')
  return np.ascontiguousarray(image)


@functools.lru_cache(maxsize=8)
def _hf_processor(patch_size: int, temporal_patch_size: int, merge_size: int):
  import transformers  # pylint: disable=g-import-not-at-top
  return transformers.Qwen2VLImageProcessorPil(
      patch_size=patch_size, temporal_patch_size=temporal_patch_size, merge_size=merge_size,
      image_mean=list(QWEN3_VL_IMAGE_MEAN), image_std=list(QWEN3_VL_IMAGE_STD), do_resize=False)


def _pixel_values(pixels: np.ndarray, height: int, width: int, patch_size: int, temporal_patch_size: int,
                  merge_size: int) -> np.ndarray:
  """float32 [N, 3*T*P*P]: `pixels` resized (bicubic, as the HF processor) to height x width, then patchified."""
  resized = np.asarray(Image.fromarray(pixels).resize((width, height), resample=Image.Resampling.BICUBIC))
  out = _hf_processor(patch_size, temporal_patch_size, merge_size)(
      images=[resized], do_resize=False, input_data_format='channels_last', return_tensors='np')
  return np.asarray(out['pixel_values'], dtype=np.float32)


class ImageProcessor:
  """Qwen3-VL image preprocessing (transformers `Qwen2VLImageProcessorPil` with Qwen3-VL settings).

  The image is resized so that both sides are multiples of patch_size * merge_size (32) and its area lies in
  [min_pixels, max_pixels] (HF `smart_resize`), then cut into patches. Defaults are the Qwen3-VL
  preprocessor_config values; CPU demos pass a smaller `max_pixels`/`min_pixels`.
  """

  def __init__(self, patch_size: int = 16, merge_size: int = 2, temporal_patch_size: int = 2,
               min_pixels: int = QWEN3_VL_MIN_PIXELS, max_pixels: int = QWEN3_VL_MAX_PIXELS):
    if min_pixels > max_pixels:
      raise ValueError(f'min_pixels={min_pixels} > max_pixels={max_pixels}')
    self.patch_size = patch_size
    self.merge_size = merge_size
    self.temporal_patch_size = temporal_patch_size
    self.min_pixels = min_pixels
    self.max_pixels = max_pixels

  def resized_shape(self, height: int, width: int) -> tuple[int, int]:
    """(H', W') the model sees for an H x W image (HF `smart_resize`)."""
    from transformers.models.qwen2_vl import image_processing_pil_qwen2_vl as hf  # pylint: disable=g-import-not-at-top
    return hf.smart_resize(height, width, factor=self.patch_size * self.merge_size, min_pixels=self.min_pixels,
                        max_pixels=self.max_pixels)

  def process(self, image: np.ndarray, name: str = 'image') -> ImageRef:
    """Preprocesses one image.

    Args:
      image: uint8 [H, W, 3] RGB (or an RGB PIL image).
      name: how errors refer to the image (e.g. 'img_2').
    Returns:
      ImageRef with pixel_values float32 [N, 1536] and grid_thw int32 [3]; num_tokens = N // 4.
    Raises:
      ValueError: naming `name`, for a non-RGB, non-uint8, empty or too elongated (aspect > 200) image.
    """
    pixels = _check_rgb(image, name)
    try:
      height, width = self.resized_shape(*pixels.shape[:2])
    except ValueError as e:
      raise ValueError(f'{name}: cannot resize image of shape {pixels.shape}: {e}') from e
    pv = _pixel_values(pixels, height, width, self.patch_size, self.temporal_patch_size, self.merge_size)
    grid = np.array([1, height // self.patch_size, width // self.patch_size], np.int32)
    return ImageRef(pixels, pv, grid, self.patch_size, self.temporal_patch_size, self.merge_size)


# --------------------------------------------------------------------------------------------------------------
# Parsing model output.

PROFILES = ('osvl', 'official')
# Tool names of the official release -> ours.
TOOL_NAME_ALIASES = {'web_search': 'text_search', 'layout_parsing': 'ocr'}
# Argument names found in public data -> ours (applied only when ours is absent).
ARGUMENT_ALIASES = {'q': 'query', 'url': 'image'}
# Official-profile arguments our tools do not take; dropped so released data runs against local tools.
OFFICIAL_ONLY_ARGUMENTS = ('hl', 'use_chart_recognition', 'use_doc_orientation_classify')


@dataclasses.dataclass
class ParsedAction:
  """What one assistant turn asked for.

  Attributes:
    think: text inside <think>…</think> (stripped), None when absent.
    kind: 'tool_call', 'response', or 'malformed' (no action, or a tool call that cannot be read).
    name: tool name after aliasing (text_search, image_search, ocr, crop, ...), None unless kind == 'tool_call'.
    arguments: tool arguments after aliasing ({} unless kind == 'tool_call').
    response: text inside <response>…</response> (stripped), None unless kind == 'response'.
    error: why the call is malformed (kind == 'malformed'); the rollout returns it as a `malformed_call` result.
    format_ok: exactly one think block, then exactly one well-formed tool_call or response, nothing else.
    problems: every format violation found (empty iff format_ok).
  """
  think: str | None
  kind: str
  name: str | None = None
  arguments: dict = dataclasses.field(default_factory=dict)
  response: str | None = None
  error: str | None = None
  format_ok: bool = False
  problems: list[str] = dataclasses.field(default_factory=list)


_END_TOKENS = ('<|im_end|>', '<|endoftext|>')
_OPEN_RE = re.compile(r'<(tool_call|response)>')
_FENCE_RE = re.compile(r'^```(?:json)?\s*(.*?)\s*```$', re.S)


def parse_action(text: str, profile: str = 'osvl') -> ParsedAction:
  """Parses one assistant turn; never raises on model output.

  Accepts `<think>…</think>` then one `<tool_call>{"name": …, "arguments": {…}}</tool_call>` or
  `<response>…</response>`. Leniency (each noted in `problems` only when it breaks the format):
  - aliases: `parameters`/`args` for `arguments`; arguments given as a JSON string; `{"function": {...}}`
    wrapping; tool names `web_search` -> `text_search`, `layout_parsing` -> `ocr`; arguments `q` -> `query`,
    `url` -> `image`; profile 'official' also drops `hl`, `use_chart_recognition`, `use_doc_orientation_classify`.
  - JSON: code fences, text around the object, trailing commas, single quotes, unquoted keys (the JSON5
    leniencies the official code accepts through `json5`), Python True/False/None, missing closing braces (all
    format-neutral: a readable call is a call).
  - Two or more actions in one turn: format_ok False; the FIRST one (in text order) is the action executed.
  - Missing think block, missing closing tag, text outside the blocks, empty response: format_ok False, the
    action still counts.
  - No action, unreadable JSON, missing/invalid name or non-object arguments: kind 'malformed' with `error`.

  Args:
    text: the decoded assistant turn (a trailing `<|im_end|>`/`<|endoftext|>` is ignored).
    profile: 'osvl' or 'official' (DESIGN.md §5); both map names to the osvl tool namespace.
  Returns:
    ParsedAction.
  Raises:
    ValueError: only for an unknown `profile` (a configuration error, not model output).
  """
  if profile not in PROFILES:
    raise ValueError(f'unknown tool-schema profile {profile!r}; expected one of {PROFILES}')
  try:
    return _parse_action(text if isinstance(text, str) else str(text), profile)
  except Exception as e:  # pylint: disable=broad-except  # a parser bug must not kill a rollout
    return ParsedAction(think=None, kind='malformed', error=f'unparseable output ({type(e).__name__}: {e})',
                        problems=['unparseable output'])


def _parse_action(text: str, profile: str) -> ParsedAction:
  problems: list[str] = []
  text = text.rstrip()
  while text.endswith(_END_TOKENS):
    text = text[:-len(next(t for t in _END_TOKENS if text.endswith(t)))].rstrip()
  # Think block.
  think, rest = None, text
  start, end = text.find('<think>'), text.find('</think>')
  if end >= 0 and 0 <= start < end:
    if text[:start].strip():
      problems.append('text before <think>')
    think, rest = text[start + len('<think>'):end].strip(), text[end + len('</think>'):]
  elif end >= 0:
    problems.append('</think> without <think>')
    think, rest = text[:end].replace('<think>', '').strip(), text[end + len('</think>'):]
  else:
    problems.append('missing <think>…</think>')
  if '<think>' in rest or '</think>' in rest:
    problems.append('more than one think block')
  # Action blocks in text order; an unclosed block runs to the next opening tag or the end.
  blocks, outside, pos = [], [], 0
  opens = list(_OPEN_RE.finditer(rest))
  for i, m in enumerate(opens):
    if m.start() < pos:
      continue  # inside the previous block
    outside.append(rest[pos:m.start()])
    tag = m.group(1)
    next_open = opens[i + 1].start() if i + 1 < len(opens) else len(rest)
    close = rest.find(f'</{tag}>', m.end())
    # A <response> runs to its closing tag whatever it quotes; a <tool_call> must close before the next action.
    if close >= 0 and (tag == 'response' or close < next_open):
      body, pos = rest[m.end():close], close + len(f'</{tag}>')
    else:
      problems.append(f'unclosed <{tag}>')
      body, pos = rest[m.end():next_open], next_open
    blocks.append((tag, body))
  outside.append(rest[pos:])
  leftover = ''.join(outside)
  for tag in ('</tool_call>', '</response>'):
    leftover = leftover.replace(tag, '')
  if leftover.strip():
    problems.append('text outside the think and action blocks')
  if not blocks:
    problems.append('no <tool_call> or <response>')
    return ParsedAction(think=think, kind='malformed', error='no <tool_call> or <response> block found',
                        problems=problems)
  if len(blocks) > 1:
    problems.append(f'{len(blocks)} actions in one turn (the first is executed)')
  tag, body = blocks[0]
  if tag == 'response':
    response = body.strip()
    if not response:
      problems.append('empty <response>')
    return ParsedAction(think=think, kind='response', response=response, format_ok=not problems,
                        problems=problems)
  name, arguments, error, n_calls = _read_tool_call(body, profile)
  if n_calls > 1:
    problems.append(f'{n_calls} calls in one <tool_call> (the first is executed)')
  if error is not None:
    problems.append('malformed tool call')
    return ParsedAction(think=think, kind='malformed', error=error, problems=problems)
  return ParsedAction(think=think, kind='tool_call', name=name, arguments=arguments, format_ok=not problems,
                      problems=problems)


def _read_tool_call(body: str, profile: str) -> tuple[str | None, dict, str | None, int]:
  """(name, arguments, error, number of calls) of one <tool_call> body."""
  try:
    obj = loads_lenient(body)
  except ValueError as e:
    return None, {}, f'tool call is not valid JSON: {e}', 1
  n_calls = 1
  if isinstance(obj, list):
    n_calls = len(obj)
    if not obj:
      return None, {}, 'tool call is an empty list', 1
    obj = obj[0]
  if not isinstance(obj, dict):
    return None, {}, f'tool call must be a JSON object, got {type(obj).__name__}', n_calls
  if isinstance(obj.get('function'), dict):  # OpenAI style {"type": "function", "function": {...}}
    obj = obj['function']
  name = obj.get('name')
  if not isinstance(name, str) or not name.strip():
    return None, {}, 'tool call has no "name"', n_calls
  name = name.strip()
  name = TOOL_NAME_ALIASES.get(name, name)
  arguments = None
  for key in ('arguments', 'parameters', 'args'):
    if key in obj:
      arguments = obj[key]
      break
  if arguments is None:
    arguments = {}
  if isinstance(arguments, str):
    if not arguments.strip():
      arguments = {}
    else:
      try:
        arguments = loads_lenient(arguments)
      except ValueError as e:
        return name, {}, f'arguments of {name} are not valid JSON: {e}', n_calls
  if not isinstance(arguments, dict):
    return name, {}, f'arguments of {name} must be a JSON object, got {type(arguments).__name__}', n_calls
  arguments = dict(arguments)
  for alias, canonical in ARGUMENT_ALIASES.items():
    if alias in arguments and canonical not in arguments:
      arguments[canonical] = arguments.pop(alias)
  if profile == 'official':
    for key in OFFICIAL_ONLY_ARGUMENTS:
      arguments.pop(key, None)
  return name, arguments, None, n_calls


def loads_lenient(text: str) -> Any:
  """json.loads that also reads the JSON-ish objects LLMs write.

  Tries, in order: strict JSON; the outermost {...}/[...] span; that span repaired (single-quoted strings,
  unquoted keys, trailing commas, True/False/None, unclosed braces/brackets).

  Raises:
    ValueError: when none of these parses (message from the strict attempt).
  """
  text = text.strip()
  fence = _FENCE_RE.match(text)
  if fence:
    text = fence.group(1)
  try:
    return json.loads(text, strict=False)
  except json.JSONDecodeError as e:
    first_error = e
  starts = [i for i in (text.find('{'), text.find('[')) if i >= 0]
  if not starts:
    raise ValueError(str(first_error))
  start = min(starts)
  end = max(text.rfind('}'), text.rfind(']'))
  candidates = []
  if end > start:
    candidates.append(text[start:end + 1])
  candidates.append(text[start:])
  for cand in candidates:
    for fixed in (cand, _repair_json(cand)):
      try:
        return json.loads(fixed, strict=False)
      except json.JSONDecodeError:
        continue
  raise ValueError(str(first_error))


_PY_LITERALS = {'True': 'true', 'False': 'false', 'None': 'null'}


def _repair_json(s: str) -> str:
  """Rewrites single-quoted strings and bare identifier keys (as JSON5 allows), drops trailing commas, maps
  Python literals, closes open brackets."""
  out, stack, i, n = [], [], 0, len(s)
  while i < n:
    c = s[i]
    if c in '"\'':
      quote, j, buf = c, i + 1, []
      while j < n and s[j] != quote:
        if s[j] == '\\' and j + 1 < n:
          buf.append("'" if (quote == "'" and s[j + 1] == "'") else s[j:j + 2])
          j += 2
          continue
        buf.append('\\"' if (quote == "'" and s[j] == '"') else s[j])
        j += 1
      out.append('"' + ''.join(buf) + '"')
      i = j + 1
      continue
    if c == ',':
      k = i + 1
      while k < n and s[k].isspace():
        k += 1
      if k >= n or s[k] in '}]':
        i += 1
        continue
    if c.isalpha() or c == '_' or c == '$':
      k = i
      while k < n and (s[k].isalnum() or s[k] in '_$'):
        k += 1
      word = s[i:k]
      colon = k
      while colon < n and s[colon].isspace():
        colon += 1
      if colon < n and s[colon] == ':':
        out.append(json.dumps(word))  # a JSON5 identifier key: {name: ...}
      else:
        out.append(_PY_LITERALS.get(word, word))
      i = k
      continue
    if c in '{[':
      stack.append('}' if c == '{' else ']')
    elif c in '}]' and stack:
      stack.pop()
    out.append(c)
    i += 1
  repaired = ''.join(out).rstrip()
  while repaired.endswith(','):
    repaired = repaired[:-1].rstrip()
  return repaired + ''.join(reversed(stack))


def render_assistant_text(think: str, tool_call: dict | None = None, response: str | None = None) -> str:
  """The canonical assistant turn (oracle expert, SFT data); parse_action(render(...)) is format_ok.

  Args:
    think: the reasoning text.
    tool_call: {"name": str, "arguments": dict}; exactly one of tool_call / response.
    response: the final answer.
  Returns:
    '<think>\\n{think}\\n</think>\\n<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>' or
    '<think>\\n{think}\\n</think>\\n<response>{response}</response>' (no <|im_end|>).
  """
  if (tool_call is None) == (response is None):
    raise ValueError('render_assistant_text needs exactly one of tool_call or response')
  head = f'<think>\n{think.strip()}\n</think>\n'
  if response is not None:
    return head + f'<response>{response}</response>'
  if not isinstance(tool_call, dict) or 'name' not in tool_call:
    raise ValueError(f'tool_call must be a dict with "name" and "arguments", got {tool_call!r}')
  call = {'name': tool_call['name'], 'arguments': dict(tool_call.get('arguments') or {})}
  return head + '<tool_call>\n' + json.dumps(call, ensure_ascii=False) + '\n</tool_call>'


# --------------------------------------------------------------------------------------------------------------
# The record.

@dataclasses.dataclass
class Step:
  """One assistant turn l and what answered it.

  Attributes:
    index: l, 0-based.
    text: the decoded assistant turn (without the closing <|im_end|>).
    action: parse_action(text).
    result: the ToolResult of the call (None for a response, or a call never executed).
    format_ok: r_fmt^(l) of DESIGN §6 = action.format_ok and the result is not a tool-execution error.
    seconds: generation + tool wall time of the step.
  """
  index: int
  text: str
  action: ParsedAction
  result: ToolResult | None = None
  format_ok: bool = False
  seconds: float = 0.0

  @property
  def is_execution_error(self) -> bool:
    """True when the tool result is an execution error (counts towards the fatal cascade)."""
    return self.result is not None and self.result.is_execution_error


@dataclasses.dataclass(eq=False)
class Trajectory:
  """One token-exact episode (DESIGN.md §4); T tokens, L+1 steps, I images.

  Attributes:
    prompt_id: group key (all samples of one prompt share it).
    sample_index: index of the sample within its group.
    token_ids: int32 [T].
    gen_mask: bool [T], True on tokens the policy emitted (Eq. 8's M_gen).
    step_of_token: int32 [T], the step l of each token, -1 on the initial prompt.
    images: I ImageRefs in order of appearance (img_1 = the input image, then tool outputs).
    steps: the steps l = 0..L.
    final_response: the response text of the last step, None if the episode did not answer.
    fatal_step: f_i, None when non-fatal.
    rollout_logprobs: float32 [T] from the engine (0 off gen_mask) or None.
    policy_version: version of the weights that produced it.
    question: the user question.
    answers: accepted answers (may be empty at inference).
    stop_reason: why the episode ended, one of `STOP_REASONS` ('response', 'max_turns', 'fatal',
      'token_budget': the next step would not fit `max_total_tokens`, so the trajectory ends at the last whole
      step; 'context_full': the engine's context is full), or None when not produced by the agent loop (SFT
      data, hand-built). `truncated` is True for the budget reasons.
  """
  prompt_id: str
  sample_index: int
  token_ids: np.ndarray
  gen_mask: np.ndarray
  step_of_token: np.ndarray
  images: list[ImageRef]
  steps: list[Step]
  final_response: str | None = None
  fatal_step: int | None = None
  rollout_logprobs: np.ndarray | None = None
  policy_version: int = 0
  question: str = ''
  answers: list[str] = dataclasses.field(default_factory=list)
  stop_reason: str | None = None

  @property
  def num_tokens(self) -> int:
    return int(self.token_ids.shape[0])

  @property
  def truncated(self) -> bool:
    """True when a token budget ended the episode (the steps that did not fit were dropped whole)."""
    return self.stop_reason in TRUNCATION_REASONS

  @property
  def execution_errors(self) -> list[bool]:
    """Per step: the tool result is an execution error (input of `rl.fatal.fatal_step`)."""
    return [s.is_execution_error for s in self.steps]

  @property
  def step_format_ok(self) -> list[bool]:
    """Per step: r_fmt^(l) (input of `rl.rewards.format_reward`)."""
    return [s.format_ok for s in self.steps]

  @property
  def image_grid_thw(self) -> np.ndarray:
    """int32 [I, 3]."""
    return np.array([im.grid_thw for im in self.images], np.int32).reshape(-1, 3)

  @property
  def pixel_values(self) -> np.ndarray:
    """float32 [sum N_i, 1536], all images' patches concatenated in order."""
    if not self.images:
      return np.zeros((0, 3 * 2 * 16 * 16), np.float32)
    return np.concatenate([im.pixel_values for im in self.images], axis=0)

  def decode(self, tokenizer) -> str:
    """The whole sequence as text (for logs; never re-tokenize it for training)."""
    return tokenizer.decode(self.token_ids.tolist(), skip_special_tokens=False)

  def to_record(self) -> dict:
    """A dict of plain Python values for HF `datasets` (use `record_features()` as the schema).

    Images become PNG bytes + grid (pixel_values are recomputed on load); tool images are not stored twice:
    they are the images after the prompt's, in order, reattached by `from_record`. `to_json` is the same record
    as one JSON line (PNG bytes base64-encoded).
    """
    return {
        'prompt_id': str(self.prompt_id),
        'sample_index': int(self.sample_index),
        'question': self.question,
        'answers': [str(a) for a in self.answers],
        'token_ids': np.asarray(self.token_ids, np.int32).tolist(),
        'gen_mask': np.asarray(self.gen_mask, bool).tolist(),
        'step_of_token': np.asarray(self.step_of_token, np.int32).tolist(),
        'images': [{
            'png': im.to_png(),
            'grid_thw': np.asarray(im.grid_thw, np.int32).tolist(),
            'patch_size': im.patch_size,
            'temporal_patch_size': im.temporal_patch_size,
            'merge_size': im.merge_size,
        } for im in self.images],
        'steps': [_step_to_record(s) for s in self.steps],
        'final_response': self.final_response,
        'fatal_step': -1 if self.fatal_step is None else int(self.fatal_step),
        'rollout_logprobs': (None if self.rollout_logprobs is None else
                             np.asarray(self.rollout_logprobs, np.float32).tolist()),
        'policy_version': int(self.policy_version),
        'stop_reason': self.stop_reason,
    }

  def to_json(self) -> str:
    """`to_record()` as one line of JSON: each `images[i].png` is the base64 (RFC 4648, padded) of the PNG bytes."""
    record = self.to_record()
    record['images'] = [{**im, 'png': base64.b64encode(im['png']).decode('ascii')} for im in record['images']]
    return json.dumps(record, ensure_ascii=False, separators=(',', ':'))

  @classmethod
  def from_json(cls, line: str) -> 'Trajectory':
    """Inverse of `to_json`."""
    return cls.from_record(json.loads(line))

  @classmethod
  def from_record(cls, record: dict) -> 'Trajectory':
    """Inverse of `to_record` (also accepts rows read back from HF `datasets`, and base64 PNG strings)."""
    images = []
    for i, im in enumerate(record['images']):
      png = im['png']
      if isinstance(png, str):
        png = base64.b64decode(png)
      pixels = np.asarray(Image.open(io.BytesIO(png)).convert('RGB'))
      try:
        images.append(ImageRef.from_pixels_and_grid(
            pixels, im['grid_thw'], int(im.get('patch_size', 16)), int(im.get('temporal_patch_size', 2)),
            int(im.get('merge_size', 2))))
      except ValueError as e:
        raise ValueError(f'record {record.get("prompt_id")!r}: image {i + 1}: {e}') from e
    num_prompt_images = len(images) - sum(int(s['result_num_images']) for s in record['steps'] if s.get('has_result'))
    steps, next_image = [], max(num_prompt_images, 0)
    for s in record['steps']:
      step = _step_from_record(s)
      if step.result is not None:
        k = int(s['result_num_images'])
        step.result.images = [im.pixels for im in images[next_image:next_image + k]]
        next_image += k
      steps.append(step)
    logprobs = record.get('rollout_logprobs')
    fatal = record.get('fatal_step')
    return cls(
        prompt_id=record['prompt_id'], sample_index=int(record['sample_index']),
        token_ids=np.asarray(record['token_ids'], np.int32), gen_mask=np.asarray(record['gen_mask'], bool),
        step_of_token=np.asarray(record['step_of_token'], np.int32), images=images, steps=steps,
        final_response=record.get('final_response'),
        fatal_step=None if fatal is None or int(fatal) < 0 else int(fatal),
        rollout_logprobs=None if logprobs is None else np.asarray(logprobs, np.float32),
        policy_version=int(record.get('policy_version', 0)), question=record.get('question', ''),
        answers=list(record.get('answers') or []), stop_reason=record.get('stop_reason'))


def _step_to_record(s: Step) -> dict:
  a, r = s.action, s.result
  return {
      'index': int(s.index), 'text': s.text, 'format_ok': bool(s.format_ok), 'seconds': float(s.seconds),
      'kind': a.kind, 'think': a.think, 'name': a.name,
      'arguments_json': json.dumps(a.arguments, ensure_ascii=False, default=str), 'response': a.response,
      'action_error': a.error, 'action_format_ok': bool(a.format_ok), 'problems': list(a.problems),
      'has_result': r is not None,
      'result_ok': bool(r.ok) if r is not None else False,
      'result_error_kind': r.error_kind if r is not None else None,
      'result_text': r.text if r is not None else '',
      'result_seconds': float(r.seconds) if r is not None else 0.0,
      'result_num_images': len(r.images) if r is not None else 0,
  }


def _step_from_record(s: dict) -> Step:
  action = ParsedAction(
      think=s.get('think'), kind=s['kind'], name=s.get('name'), arguments=json.loads(s.get('arguments_json') or '{}'),
      response=s.get('response'), error=s.get('action_error'), format_ok=bool(s.get('action_format_ok')),
      problems=list(s.get('problems') or []))
  result = None
  if s.get('has_result'):
    result = ToolResult(ok=bool(s['result_ok']), error_kind=s.get('result_error_kind'), text=s.get('result_text', ''),
                        images=[], seconds=float(s.get('result_seconds', 0.0)))
  return Step(index=int(s['index']), text=s['text'], action=action, result=result, format_ok=bool(s['format_ok']),
              seconds=float(s.get('seconds', 0.0)))


def record_features():
  """The `datasets.Features` of `Trajectory.to_record()` (pass it when writing, so None columns keep types)."""
  import datasets  # pylint: disable=g-import-not-at-top
  v = datasets.Value
  step = {
      'index': v('int32'), 'text': v('string'), 'format_ok': v('bool'), 'seconds': v('float64'),
      'kind': v('string'), 'think': v('string'), 'name': v('string'), 'arguments_json': v('string'),
      'response': v('string'), 'action_error': v('string'), 'action_format_ok': v('bool'),
      'problems': datasets.List(v('string')), 'has_result': v('bool'), 'result_ok': v('bool'),
      'result_error_kind': v('string'), 'result_text': v('string'), 'result_seconds': v('float64'),
      'result_num_images': v('int32'),
  }
  image = {'png': v('binary'), 'grid_thw': datasets.List(v('int32')), 'patch_size': v('int32'),
           'temporal_patch_size': v('int32'), 'merge_size': v('int32')}
  return datasets.Features({
      'prompt_id': v('string'), 'sample_index': v('int32'), 'question': v('string'),
      'answers': datasets.List(v('string')), 'token_ids': datasets.List(v('int32')),
      'gen_mask': datasets.List(v('bool')), 'step_of_token': datasets.List(v('int32')),
      'images': datasets.List(image), 'steps': datasets.List(step), 'final_response': v('string'),
      'fatal_step': v('int32'), 'rollout_logprobs': datasets.List(v('float32')), 'policy_version': v('int64'),
      'stop_reason': v('string'),
  })


# --------------------------------------------------------------------------------------------------------------
# Rendering.

DEFAULT_INSTRUCTIONS = (
    "You are a multimodal search agent. Images are named img_1 (the user's), img_2, ... in order of appearance. "
    'Each turn, reason in <think></think>, then give exactly one <tool_call></tool_call>, or '
    '<response>final answer</response> when sure.')

_TOOLS_HEADER = ('\n\n# Tools\n\nYou are provided with function signatures within <tools></tools> XML tags:\n'
                 '<tools>\n')
_TOOLS_FOOTER = ('\n</tools>\n\nFor each function call, return a json object with function name and arguments '
                 'within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, '
                 '"arguments": <args-json-object>}\n</tool_call>')


def render_system_text(tool_schemas: Sequence[dict], system_prompt: str | None = None) -> str:
  """The system turn's content: instructions, then the Hermes/Qwen3 tools section (one JSON line per schema)."""
  text = DEFAULT_INSTRUCTIONS if system_prompt is None else system_prompt
  if tool_schemas:
    text += _TOOLS_HEADER + '\n'.join(json.dumps(s, ensure_ascii=False) for s in tool_schemas) + _TOOLS_FOOTER
  return text


class TrajectoryBuilder:
  """Append-only construction of one Trajectory; the ids after each append start with the ids before it.

  Use: start(question, image); then per step: prompt_ids()/images -> engine -> append_assistant(ids) ->
  (tool call) append_observation(result); finally finish(...). `truncate(n)` drops whole steps from the end
  (token budgets: never a part of a step, an image span or a tool call).
  """

  def __init__(self, tokenizer, image_processor: ImageProcessor, tool_schemas: Sequence[dict],
               system_prompt: str | None = None, profile: str = 'osvl'):
    if profile not in PROFILES:
      raise ValueError(f'unknown tool-schema profile {profile!r}; expected one of {PROFILES}')
    self.tokenizer = tokenizer
    self.image_processor = image_processor
    self.tool_schemas = list(tool_schemas)
    self.system_prompt = system_prompt
    self.profile = profile
    self._ids: list[int] = []
    self._gen: list[bool] = []
    self._step: list[int] = []
    self._logprobs: list[float] = []
    self._step_logprobs: list[bool] = []  # per step: the engine gave log-probs
    self._images: list[ImageRef] = []
    self._steps: list[Step] = []
    self._marks: list[tuple[int, int]] = []  # per step: (tokens, images) before it began
    self.question: str | None = None

  # -- state -------------------------------------------------------------------------------------------------
  @property
  def images(self) -> list[ImageRef]:
    """Images so far, in order (img_1, img_2, ...)."""
    return list(self._images)

  @property
  def steps(self) -> list[Step]:
    return list(self._steps)

  @property
  def num_tokens(self) -> int:
    return len(self._ids)

  @property
  def done(self) -> bool:
    """True once the last step is a response."""
    return bool(self._steps) and self._steps[-1].action.kind == 'response'

  @property
  def awaiting_observation(self) -> bool:
    """True when the last step is a tool call / malformed call without a result yet."""
    return bool(self._steps) and self._steps[-1].action.kind != 'response' and self._steps[-1].result is None

  def prompt_ids(self) -> np.ndarray:
    """int32 [T]: the context for the next model call (ends with '<|im_start|>assistant\\n')."""
    return np.asarray(self._ids, np.int32)

  # -- appends -----------------------------------------------------------------------------------------------
  def _append(self, ids: Sequence[int], gen: bool, step: int, logprobs: Sequence[float] | None = None):
    self._ids.extend(int(i) for i in ids)
    self._gen.extend([gen] * len(ids))
    self._step.extend([step] * len(ids))
    self._logprobs.extend([float(x) for x in logprobs] if logprobs is not None else [0.0] * len(ids))

  def _append_image(self, image: np.ndarray, step: int) -> str:
    name = f'img_{len(self._images) + 1}'
    ref = self.image_processor.process(image, name=name)
    self._images.append(ref)
    self._append(_encode(self.tokenizer, f'{name}: '), False, step)
    self._append([VISION_START_ID] + [IMAGE_PAD_ID] * ref.num_tokens + [VISION_END_ID], False, step)
    return name

  def start(self, question: str, image: np.ndarray | Sequence[np.ndarray] | None,
            max_tokens: int | None = None) -> None:
    """Renders system + user turn + '<|im_start|>assistant\\n' (gen_mask 0, step -1).

    Args:
      question: the user question.
      image: uint8 [H, W, 3] input image (img_1), a list of them (img_1, img_2, ..., each on its own line), or
        None for a text-only question.
      max_tokens: the prompt budget; None for none.
    Raises:
      PromptTooLongError: when the rendered prompt has more than `max_tokens` tokens. A prompt is never cut:
        cutting could leave an image span without the pads its grid needs.
    """
    if self._ids:
      raise RuntimeError('TrajectoryBuilder.start called twice')
    self.question = question
    tok = self.tokenizer
    system = render_system_text(self.tool_schemas, self.system_prompt)
    self._append([IM_START_ID] + _encode(tok, 'system\n' + system) + [IM_END_ID], False, -1)
    self._append(_encode(tok, '\n') + [IM_START_ID] + _encode(tok, 'user\n'), False, -1)
    self._append(_encode(tok, question, untrusted=True), False, -1)
    images = [] if image is None else list(image) if isinstance(image, (list, tuple)) else [image]
    for im in images:
      self._append(_encode(tok, '\n'), False, -1)
      self._append_image(im, -1)
    self._append([IM_END_ID] + _encode(tok, '\n') + [IM_START_ID] + _encode(tok, 'assistant\n'), False, -1)
    if max_tokens is not None and len(self._ids) > max_tokens:
      pads = sum(im.num_tokens + 2 for im in self._images)
      raise PromptTooLongError(
          f'prompt has {len(self._ids)} tokens ({pads} of them in {len(self._images)} image span(s)), over the '
          f'prompt budget of {max_tokens}; prompts and image spans are never cut: drop the prompt, shrink its '
          f'image (ImageProcessor.max_pixels) or raise the budget')

  def append_assistant(self, ids: Sequence[int], logprobs: Sequence[float] | None = None,
                       seconds: float = 0.0, cut: bool = False) -> ParsedAction:
    """Appends the ids the policy emitted for the next step (gen_mask 1) and parses them.

    Args:
      ids: int [n], should end with <|im_end|>; if it does not (length cut), <|im_end|> is appended with
        gen_mask 0.
      logprobs: float [n] engine log-probs of `ids`, or None.
      seconds: generation time of the step.
      cut: the engine stopped at its per-turn limit (`max_new_tokens`, finish_reason 'length') before
        <|im_end|>. The turn is kept as emitted (the policy is accountable for it) but never executed: its
        action becomes 'malformed' with error 'turn cut at the token limit ...' (so a half-written tool call
        cannot run, and a half-written response is not an answer).
    Returns:
      parse_action of the decoded text (the step is recorded; its result comes with append_observation).
    """
    self._check_can_act()
    ids = [int(i) for i in ids]
    if logprobs is not None and len(logprobs) != len(ids):
      raise ValueError(f'{len(logprobs)} logprobs for {len(ids)} ids')
    step = len(self._steps)
    self._begin_step(logprobs is not None)
    self._append(ids, True, step, logprobs)
    if not ids or ids[-1] != IM_END_ID:
      self._append([IM_END_ID], False, step)
    body = ids[:-1] if ids and ids[-1] in (IM_END_ID, ENDOFTEXT_ID) else ids
    text = self.tokenizer.decode(body, skip_special_tokens=False)
    return self._record_step(text, seconds, cut=cut and (not ids or ids[-1] != IM_END_ID))

  def append_assistant_text(self, text: str, seconds: float = 0.0) -> ParsedAction:
    """Appends an expert's assistant turn given as text (SFT data): its ids + <|im_end|>, all gen_mask 1."""
    self._check_can_act()
    step = len(self._steps)
    self._begin_step(False)
    self._append(_encode(self.tokenizer, text) + [IM_END_ID], True, step)
    return self._record_step(text, seconds)

  def _begin_step(self, has_logprobs: bool):
    self._marks.append((len(self._ids), len(self._images)))
    self._step_logprobs.append(has_logprobs)

  def truncate(self, num_steps: int) -> None:
    """Keeps only the first `num_steps` whole steps (assistant turn + observation), dropping the rest.

    The sequence then ends where step `num_steps` began (after an observation's '<|im_start|>assistant\\n'),
    with the images of the kept steps only; no step, tool call or image span is ever split.
    """
    if not 0 <= num_steps <= len(self._steps):
      raise ValueError(f'truncate({num_steps}): the builder has {len(self._steps)} steps')
    if num_steps == len(self._steps):
      return
    tokens, images = self._marks[num_steps]
    for buf in (self._ids, self._gen, self._step, self._logprobs):
      del buf[tokens:]
    del self._images[images:]
    del self._steps[num_steps:]
    del self._marks[num_steps:]
    del self._step_logprobs[num_steps:]

  def _check_can_act(self):
    if not self._ids:
      raise RuntimeError('call TrajectoryBuilder.start first')
    if self.done:
      raise RuntimeError('the episode already ended with a response')
    if self.awaiting_observation:
      raise RuntimeError(f'step {len(self._steps) - 1} is a tool call: call append_observation first')

  def _record_step(self, text: str, seconds: float, cut: bool = False) -> ParsedAction:
    action = parse_action(text, self.profile)
    if cut:
      why = 'turn cut at the token limit (max_new_tokens) before <|im_end|>; not executed'
      action = ParsedAction(think=action.think, kind='malformed', error=why, problems=action.problems + [why])
    self._steps.append(Step(index=len(self._steps), text=text, action=action, result=None,
                            format_ok=action.format_ok, seconds=float(seconds)))
    return action

  def append_observation(self, result: ToolResult) -> list[str]:
    """Appends the tool result of the last step as a user turn, then '<|im_start|>assistant\\n'.

    Renders '\\n<|im_start|>user\\n<tool_response>\\n{text}\\nimg_k: <|vision_start|>…<|vision_end|>\\n
    </tool_response><|im_end|>\\n<|im_start|>assistant\\n' (gen_mask 0, step = the last step's index).

    Args:
      result: the ToolResult of the last step's call (a malformed call gets `error('malformed_call', …)`).
    Returns:
      the names given to the result's images (img_k, ...).
    """
    if not self.awaiting_observation:
      raise RuntimeError('append_observation needs a preceding tool-call step without a result')
    step = self._steps[-1]
    step.result = result
    step.format_ok = step.action.format_ok and not result.is_execution_error
    step.seconds += float(result.seconds)
    tok, l = self.tokenizer, step.index
    text = result.text if (result.text or result.error_kind is None) else f'Error: {result.error_kind}'
    self._append(_encode(tok, '\n') + [IM_START_ID] + _encode(tok, 'user\n') + [TOOL_RESPONSE_ID]
                 + _encode(tok, '\n'), False, l)
    self._append(_encode(tok, text, untrusted=True), False, l)
    names = []
    for image in result.images:
      self._append(_encode(tok, '\n'), False, l)
      names.append(self._append_image(image, l))
    self._append(_encode(tok, '\n') + [TOOL_RESPONSE_END_ID, IM_END_ID] + _encode(tok, '\n') + [IM_START_ID]
                 + _encode(tok, 'assistant\n'), False, l)
    return names

  def finish(self, prompt_id: str = '', sample_index: int = 0, answers: Sequence[str] = (),
             fatal_step: int | None = None, policy_version: int = 0, stop_reason: str | None = None
             ) -> Trajectory:
    """The Trajectory so far (the builder may keep being used; the arrays are copies).

    final_response is the last step's response when it is one. A trailing observation's
    '<|im_start|>assistant\\n' stays in the sequence (gen_mask 0).

    Args:
      prompt_id, sample_index: group key and index in the group.
      answers: accepted answers.
      fatal_step: f_i from `rl.fatal.fatal_step` over `Trajectory.execution_errors`, or None.
      policy_version: weights version that produced the episode.
      stop_reason: one of `STOP_REASONS` or None (see `Trajectory.stop_reason`).
    """
    if stop_reason is not None and stop_reason not in STOP_REASONS:
      raise ValueError(f'stop_reason={stop_reason!r} is not one of {STOP_REASONS}')
    if not self._ids:
      raise RuntimeError('call TrajectoryBuilder.start first')
    if fatal_step is not None and not 0 <= fatal_step < max(len(self._steps), 1):
      raise ValueError(f'fatal_step={fatal_step} outside the {len(self._steps)} steps')
    final = self._steps[-1].action.response if self.done else None
    return Trajectory(
        prompt_id=prompt_id, sample_index=int(sample_index), token_ids=np.asarray(self._ids, np.int32),
        gen_mask=np.asarray(self._gen, bool), step_of_token=np.asarray(self._step, np.int32),
        images=list(self._images), steps=[dataclasses.replace(s) for s in self._steps], final_response=final,
        fatal_step=fatal_step,
        rollout_logprobs=(np.asarray(self._logprobs, np.float32) if (self._steps and all(self._step_logprobs))
                          else None),
        policy_version=int(policy_version), question=self.question or '', answers=list(answers),
        stop_reason=stop_reason)


# --------------------------------------------------------------------------------------------------------------
# Invariants.

def check_trajectory(traj: Trajectory, max_problems: int = 20) -> list[str]:
  """Checks the invariants every consumer relies on; returns the problems found ([] when sound).

  - token_ids / gen_mask / step_of_token (/ rollout_logprobs) are 1-D of equal length T;
  - each image appears as <|vision_start|> + num_tokens × <|image_pad|> + <|vision_end|>, in order, one per
    ImageRef, and pixel_values has prod(grid_thw) rows; no stray pad/vision tokens;
  - gen_mask is 1 only inside assistant turns (after '<|im_start|>assistant\\n', up to its <|im_end|>) and
    never on vision tokens;
  - step_of_token starts at -1, is non-decreasing by steps of at most 1, ends at exactly L (every step has
    tokens), and prompt tokens (-1) are never generated; fatal_step (if any) is a valid step index;
  - each grid is (1, h, w) with h, w multiples of merge_size, pixel_values is [prod(grid), 3*T*P*P];
  - stop_reason is None or one of `STOP_REASONS`.

  `validate_trajectory` raises `TrajectoryError` with these problems; `batching.collate` calls it on every
  trajectory before an update.
  """
  problems: list[str] = []
  ids = np.asarray(traj.token_ids)
  gen = np.asarray(traj.gen_mask)
  sot = np.asarray(traj.step_of_token)
  if ids.ndim != 1 or gen.ndim != 1 or sot.ndim != 1:
    return [f'arrays must be 1-D: token_ids {ids.shape}, gen_mask {gen.shape}, step_of_token {sot.shape}']
  t = ids.shape[0]
  if gen.shape[0] != t or sot.shape[0] != t:
    return [f'lengths differ: token_ids {t}, gen_mask {gen.shape[0]}, step_of_token {sot.shape[0]}']
  if traj.rollout_logprobs is not None and np.asarray(traj.rollout_logprobs).shape != (t,):
    problems.append(f'rollout_logprobs shape {np.asarray(traj.rollout_logprobs).shape} != ({t},)')
  if t and (ids.min() < 0 or ids.max() >= VOCAB_SIZE):
    problems.append(f'token ids outside [0, {VOCAB_SIZE})')
  gen = gen.astype(bool)
  # Images.
  starts = np.flatnonzero(ids == VISION_START_ID)
  if len(starts) != len(traj.images):
    problems.append(f'{len(starts)} <|vision_start|> tokens for {len(traj.images)} images')
  covered = np.zeros(t, bool)
  for i, (pos, im) in enumerate(zip(starts, traj.images)):
    n = im.num_tokens
    end = pos + 1 + n
    if end >= t or not np.all(ids[pos + 1:end] == IMAGE_PAD_ID) or ids[end] != VISION_END_ID:
      run = int(np.argmax(ids[pos + 1:] != IMAGE_PAD_ID)) if pos + 1 < t else 0
      problems.append(f'image {i + 1}: {run} <|image_pad|> tokens after <|vision_start|> at {pos}, '
                      f'grid {np.asarray(im.grid_thw).tolist()} needs {n}')
    else:
      covered[pos:end + 1] = True
  for i, im in enumerate(traj.images):
    grid = np.asarray(im.grid_thw).reshape(-1)
    pv = np.asarray(im.pixel_values)
    width = 3 * im.temporal_patch_size * im.patch_size ** 2
    if grid.shape != (3,) or grid[0] != 1 or grid[1] % im.merge_size or grid[2] % im.merge_size or grid.min() <= 0:
      problems.append(f'image {i + 1}: grid {grid.tolist()} is not (1, h, w) with h, w multiples of '
                      f'merge_size={im.merge_size}')
    elif pv.ndim != 2 or pv.shape != (int(np.prod(grid)), width):
      problems.append(f'image {i + 1}: pixel_values has shape {pv.shape}, grid {grid.tolist()} needs '
                      f'({int(np.prod(grid))}, {width})')
  vision = np.isin(ids, (VISION_START_ID, VISION_END_ID, IMAGE_PAD_ID))
  if np.any(vision & ~covered) and len(starts) == len(traj.images):
    problems.append(f'stray vision tokens at {np.flatnonzero(vision & ~covered)[:5].tolist()}')
  if np.any(gen & vision):
    problems.append(f'gen_mask on vision tokens at {np.flatnonzero(gen & vision)[:5].tolist()}')
  # Assistant turns.
  in_assistant = np.zeros(t, bool)
  heads = np.flatnonzero(ids == IM_START_ID)
  for h in heads:
    if h + 2 < t and ids[h + 1] == ASSISTANT_ID and ids[h + 2] == NEWLINE_ID:
      ends = np.flatnonzero(ids[h + 3:] == IM_END_ID)
      stop = h + 3 + int(ends[0]) + 1 if len(ends) else t
      in_assistant[h + 3:stop] = True
  bad = gen & ~in_assistant
  if np.any(bad):
    problems.append(f'gen_mask outside assistant turns at {np.flatnonzero(bad)[:5].tolist()}')
  # Steps.
  if t:
    if sot[0] != -1:
      problems.append(f'step_of_token starts at {sot[0]}, expected -1')
    d = np.diff(sot)
    if np.any(d < 0):
      problems.append(f'step_of_token decreases at {np.flatnonzero(d < 0)[:5].tolist()}')
    if np.any(d > 1):
      problems.append(f'step_of_token skips a step at {np.flatnonzero(d > 1)[:5].tolist()}')
    if sot.max() != len(traj.steps) - 1:
      problems.append(f'step_of_token reaches {sot.max()} with {len(traj.steps)} steps (expected '
                      f'{len(traj.steps) - 1})')
    if np.any(gen & (sot < 0)):
      problems.append('gen_mask on prompt tokens (step -1)')
  if traj.fatal_step is not None and not 0 <= traj.fatal_step < len(traj.steps):
    problems.append(f'fatal_step {traj.fatal_step} outside the {len(traj.steps)} steps')
  stop_reason = getattr(traj, 'stop_reason', None)
  if stop_reason is not None and stop_reason not in STOP_REASONS:
    problems.append(f'stop_reason {stop_reason!r} is not one of {STOP_REASONS}')
  return problems[:max_problems]


def validate_trajectory(traj: Trajectory) -> Trajectory:
  """`check_trajectory`, raising: returns `traj` when sound.

  Raises:
    TrajectoryError: naming the trajectory (prompt_id, sample_index) and every problem found.
  """
  problems = check_trajectory(traj)
  if problems:
    raise TrajectoryError(f'trajectory prompt_id={traj.prompt_id!r} sample_index={traj.sample_index} is invalid: '
                          + '; '.join(problems))
  return traj


# --------------------------------------------------------------------------------------------------------------
# JSON lines: one `Trajectory.to_json()` per line.

def write_jsonl(trajectories: Sequence[Trajectory], path: str | os.PathLike) -> None:
  """Writes one `Trajectory.to_json()` line per trajectory (UTF-8)."""
  with open(path, 'w', encoding='utf-8') as f:
    for traj in trajectories:
      f.write(traj.to_json() + '\n')


def read_jsonl(path: str | os.PathLike) -> Iterator[Trajectory]:
  """Yields the trajectories of a file written by `write_jsonl` (blank lines skipped)."""
  with open(path, encoding='utf-8') as f:
    for line in f:
      if line.strip():
        yield Trajectory.from_json(line)


def check_jsonl(path: str | os.PathLike) -> tuple[int, list[tuple[int, str, list[str]]]]:
  """Checks every trajectory of a JSON-lines file.

  Returns:
    (number of trajectories, [(line number, 'prompt_id=... sample_index=...', problems)] for the invalid ones);
    a line that does not decode into a Trajectory is invalid with the decoding error as its problem.
  """
  n, invalid = 0, []
  with open(path, encoding='utf-8') as f:
    for line_no, line in enumerate(f, 1):
      if not line.strip():
        continue
      n += 1
      try:
        traj = Trajectory.from_json(line)
      except Exception as e:  # pylint: disable=broad-except  # a broken line is reported, not fatal
        invalid.append((line_no, '?', [f'cannot decode: {type(e).__name__}: {e}']))
        continue
      problems = check_trajectory(traj)
      if problems:
        invalid.append((line_no, f'prompt_id={traj.prompt_id!r} sample_index={traj.sample_index}', problems))
  return n, invalid


def main(argv: Sequence[str] | None = None) -> int:
  """`python -m osvl_jax.trajectory --check FILE.jsonl [...]`: prints each problem, then
  `trajectories=<n> invalid=<m>`; exit status 1 when any trajectory is invalid."""
  parser = argparse.ArgumentParser(prog='python -m osvl_jax.trajectory', description=__doc__.split('\n')[0])
  parser.add_argument('--check', nargs='+', required=True, metavar='FILE.jsonl',
                      help='JSON-lines files of Trajectory.to_json() records to validate')
  args = parser.parse_args(argv)
  total, bad = 0, 0
  for path in args.check:
    n, invalid = check_jsonl(path)
    total, bad = total + n, bad + len(invalid)
    for line_no, who, problems in invalid:
      for problem in problems:
        print(f'{path}:{line_no}: {who}: {problem}')
  print(f'trajectories={total} invalid={bad}')
  return 1 if bad else 0


if __name__ == '__main__':
  sys.exit(main())
