"""Qwen3 / Qwen3-VL special token ids, the tokenizer, and `_encode` (DESIGN.md §4).

The single source of Qwen's special token ids: everything outside the model imports them from here; the model
takes them from its config (`models.qwen3_vl.config`, whose defaults come from here). This module is light (no
numpy, transformers or tokenizers at import time) so the model config can import it.
"""

import functools
import os
import pathlib

from osvl_jax import paths

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
ENDOFTEXT_ID = 151643  # <|endoftext|>: pad, and Qwen's second end-of-sequence id.
IM_START_ID = 151644
IM_END_ID = 151645  # <|im_end|>: eos, end of every turn.
VISION_START_ID = 151652
VISION_END_ID = 151653
VISION_PAD_ID = 151654  # <|vision_pad|>: unused by Qwen3-VL; stands in for vision ids the policy emitted.
IMAGE_PAD_ID = 151655  # <|image_pad|>: one per merged image patch.
VIDEO_PAD_ID = 151656
TOOL_CALL_ID = 151657
TOOL_CALL_END_ID = 151658
TOOL_RESPONSE_ID = 151665
TOOL_RESPONSE_END_ID = 151666
THINK_ID = 151667
THINK_END_ID = 151668
# Qwen's two end-of-sequence ids: generation stops at either (DESIGN.md §4).
EOS_IDS = (IM_END_ID, ENDOFTEXT_ID)
# Ids only the environment writes (image spans; video pads are never rendered here). The embedded sampler never
# samples them; one another engine emits is text for the model: see `model_input_ids`.
VISION_IDS = (VISION_START_ID, VISION_END_ID, IMAGE_PAD_ID, VIDEO_PAD_ID)
# Regular BPE tokens used by `check_trajectory` to find assistant turns.
ASSISTANT_ID = 77091  # 'assistant'
NEWLINE_ID = 198  # '\n'
VOCAB_SIZE = 151936  # embedding rows of every Qwen3-VL checkpoint (ids above 151668 are unused padding)

# Qwen2 pre-tokenizer regex (single digits, contractions, letters, punctuation runs, newlines, spaces).
QWEN2_PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
    r"\s+(?!\S)|\s+")


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


class _Untrusted(str):
  """Text from outside (a question, tool output) for `_encode_parts`: never read as added tokens."""


@functools.lru_cache(maxsize=1)
def _added_token_regex():
  import re  # pylint: disable=g-import-not-at-top
  contents = sorted((c for c, _ in ADDED_TOKENS.values()), key=len, reverse=True)  # leftmost-longest, as HF
  return re.compile('(' + '|'.join(re.escape(c) for c in contents) + ')')


def _split_added(text: str) -> list:
  """Trusted text as plain strings and the ids of the added tokens it spells ('a<think>b' -> ['a', 151667, 'b'])."""
  ids = {c: i for i, (c, _) in ADDED_TOKENS.items()}
  return [ids[p] if k % 2 else p for k, p in enumerate(_added_token_regex().split(text)) if p]


def _encode_parts(tokenizer, parts) -> list[int]:
  """Ids of a rendering given as pieces, tokenized as a tokenizer reads the concatenated string.

  Each maximal run of plain text between added tokens is tokenized as ONE string, as a Hugging Face tokenizer
  does with the whole rendered text (it splits at added tokens, then pre-tokenizes each segment): so 'city?'
  followed by a template '\n' gives the one token '?\n', exactly the ids a chat template served by SGLang / vLLM
  produces. Untrusted pieces join the runs as plain text but are never read as added tokens.

  Args:
    tokenizer: the Qwen tokenizer (`load_tokenizer`).
    parts: a sequence of: int (an added token id, e.g. `IM_START_ID`), str (trusted template text: the added
      tokens it spells, e.g. '<tool_call>' in the system text, become their ids), `_Untrusted` (plain text only).
  Returns:
    the ids.
  """
  out, run = [], []
  def flush():
    if run:
      out.extend(_encode(tokenizer, ''.join(run), untrusted=True))
      run.clear()
  for part in parts:
    if isinstance(part, _Untrusted):
      pieces = [str(part)]
    elif isinstance(part, str):
      pieces = _split_added(part)
    else:
      pieces = [int(part)]
    for piece in pieces:
      if isinstance(piece, str):
        run.append(piece)
      else:
        flush()
        out.append(piece)
  flush()
  return out


def model_input_ids(token_ids, gen_mask):
  """The ids the model reads for a trajectory sequence: vision ids the policy emitted become `<|vision_pad|>`.

  A vision id (`VISION_IDS`) under gen_mask is one a non-embedded engine sampled (the embedded sampler never
  does); it is kept in `Trajectory.token_ids` (the loss target, token-exact) but the model must read it as text,
  or the `<|image_pad|>` count would no longer match the image features (DESIGN.md §4). The builder's contexts,
  `check_trajectory` and `train.batching.collate` all apply this one rule, so rollout and training agree.

  Args:
    token_ids: int [T] (or [B, T]).
    gen_mask: bool [T] (or [B, T]), same shape.
  Returns:
    int32 array of the same shape: `token_ids` with every vision id where gen_mask is True replaced by
    `VISION_PAD_ID` (a copy; the inputs are not modified).
  Raises:
    ValueError: when the shapes differ.
  """
  import numpy as np  # pylint: disable=g-import-not-at-top  # this module stays light at import time
  ids = np.array(token_ids, dtype=np.int32, copy=True)
  gen = np.asarray(gen_mask, dtype=bool)
  if ids.shape != gen.shape:
    raise ValueError(f'model_input_ids: token_ids {ids.shape} and gen_mask {gen.shape} differ in shape')
  ids[gen & np.isin(ids, VISION_IDS)] = VISION_PAD_ID
  return ids
