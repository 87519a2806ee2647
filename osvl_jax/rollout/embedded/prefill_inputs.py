"""Host-side inputs of the embedded sampler's prefill (`jax_sampler.JaxSampler`): a batch of contexts as
right-padded ids, 3-D MRoPE positions, rope deltas and pixel patches, each row starting after its cached prefix.

Row b feeds `prompt_ids[starts[b]:]` (`starts[b]` = the length of its prefix already in the KV cache, 0 without
one). Positions come from `rope.get_rope_index` on the WHOLE row (the single source of truth shared with training;
positions of a prefix do not depend on what follows it), then are sliced, so the suffix continues exactly where the
cached prefix stopped. Only the images whose `<|image_pad|>` run lies in the suffix are sent to the vision tower
(features of one image do not depend on the others: vision attention is per image); a prefix never ends inside an
image run (`prefix_cache.PrefixCache.match`).

The images reach the compiled prefill as arrays (`vision_arrays`: the whole batch as one shard of
`vision_layout.shard_vision_inputs`, padded to a power-of-two multiple of the sampler's patch bucket), never as a
static grid: the prefill compiles once per (batch, suffix bucket, cache length, patch bucket), whatever the images.
"""

from typing import Any, NamedTuple, Sequence

import numpy as np

from osvl_jax.models.qwen3_vl import rope
from osvl_jax.models.qwen3_vl import vision_layout
from osvl_jax.trajectory import tokens as tokens_lib

PAD_ID = tokens_lib.ENDOFTEXT_ID  # <|endoftext|>, never attended to by real tokens (right padding).
IMAGE_PAD_ID = tokens_lib.IMAGE_PAD_ID  # <|image_pad|>, one per merged image patch.


class PrefillInputs(NamedTuple):
  """One prefill batch (B rows, T = the suffix length bucket).

  Attributes:
    input_ids: int32 [B, T], the suffixes right-padded with `PAD_ID` (dummy rows: one `PAD_ID`).
    position_ids: int32 [3, B, T], MRoPE positions of the suffix tokens (pads continue the text positions).
    attention_mask: bool [B, T], True on real suffix tokens.
    deltas: int32 [B], HF's `rope_deltas`: the next position of row b is its cache index + deltas[b].
    pixel_values: float32 [N, C*Tp*P*P] patches of the suffix images in order, or None.
    grids: ((t, h, w), ...) of those images (host data: `vision_arrays` lays them out).
  """
  input_ids: np.ndarray
  position_ids: np.ndarray
  attention_mask: np.ndarray
  deltas: np.ndarray
  pixel_values: np.ndarray | None
  grids: tuple


RUNG_GAP = 4   # `length_rung`: powers of two up to 4 buckets, then steps of 4 buckets


def round_up(n: int, multiple: int) -> int:
  """The smallest positive multiple of `multiple` >= n (at least `multiple`)."""
  return max(multiple, -(-n // multiple) * multiple)


def length_rung(n: int, bucket: int, limit: int) -> int:
  """Tokens a prefill suffix or a KV cache of n tokens is padded to (the vLLM TPU runner's token paddings):
  `bucket` times a power of two up to `RUNG_GAP` buckets, then multiples of that gap, capped at the sampler's slot
  length `round_up(limit, bucket)` (and never below n rounded up to `bucket`). A sampler therefore compiles
  log2(RUNG_GAP) + limit / (RUNG_GAP x bucket) lengths whatever its contexts hold, not one per multiple of
  `bucket` (a multi-turn rollout's context grows every turn), and pads at most RUNG_GAP x bucket tokens (a
  power-of-two ladder alone would double the work of a context just past a rung).
  """
  gap = RUNG_GAP * bucket
  rung = vision_layout.patch_slots(max(1, int(n)), bucket) if n <= gap else round_up(n, gap)
  return max(round_up(n, bucket), min(rung, round_up(limit, bucket)))


def check_image_pads(contexts: Sequence[Any], image_token_id: int = IMAGE_PAD_ID) -> None:
  """Every context holds as many `<|image_pad|>` ids as its images need (`ImageRef.num_tokens` each).

  Raises:
    ValueError: naming the first context whose count differs.
  """
  for b, c in enumerate(contexts):
    n_pads = int(np.sum(np.asarray(c.prompt_ids) == image_token_id))
    need = sum(im.num_tokens for im in c.images)
    if n_pads != need:
      raise ValueError(f'context {b}: {n_pads} <|image_pad|> tokens but its {len(c.images)} image(s) need {need}')


def _cached_images(ids: np.ndarray, images: Sequence[Any], start: int, image_token_id: int) -> int:
  """How many of a row's images lie in its first `start` ids (its cached prefix).

  Raises:
    ValueError: the prefix ends inside an image run.
  """
  cached_pads, skip = int(np.sum(np.asarray(ids[:start]) == image_token_id)), 0
  while cached_pads > 0 and skip < len(images):
    cached_pads -= images[skip].num_tokens
    skip += 1
  if cached_pads != 0:
    raise ValueError(f'its cached prefix of {start} ids ends inside an image run')
  return skip


def suffix_patches(contexts: Sequence[Any], starts: Sequence[int], image_token_id: int = IMAGE_PAD_ID) -> int:
  """Image patches `build` sends to the vision tower: those of the images past each row's cached prefix
  (`starts[b]` ids). Raises ValueError as `build` does."""
  return sum(int(np.asarray(im.pixel_values).shape[0]) for c, start in zip(contexts, starts)
             for im in c.images[_cached_images(c.prompt_ids, c.images, int(start), image_token_id):])


def build(contexts: Sequence[Any], batch: int, starts: np.ndarray, bucket: int, limit: int,
          rope_kw: dict) -> PrefillInputs:
  """The prefill inputs of `contexts` (n <= batch rows; rows n.. are dummy one-`PAD_ID` rows).

  Args:
    contexts: n `engine.Context`s (pad counts checked by `check_image_pads`).
    batch: padded batch size B >= n.
    starts: int [B], the cached prefix length of each row (0: none); starts[b] < len(prompt_ids) and never
      inside an image run.
    bucket, limit: the suffix length T is `length_rung(longest suffix, bucket, limit)` (limit: the sampler's
      max_len).
    rope_kw: `image_token_id` / `spatial_merge_size` for `rope.get_rope_index` (empty: its defaults).
  Raises:
    ValueError: a start that cuts an image run or leaves no token to prefill.
  """
  image_token_id = rope_kw.get('image_token_id', IMAGE_PAD_ID)
  rows = [(np.asarray(c.prompt_ids, np.int32), list(c.images)) for c in contexts]
  rows += [(np.asarray([PAD_ID], np.int32), [])] * (batch - len(rows))
  starts = np.asarray(starts, np.int64)
  suffix = np.asarray([len(ids) for ids, _ in rows]) - starts
  if (suffix < 1).any():
    raise ValueError(f'starts leave no token to prefill in rows {np.flatnonzero(suffix < 1).tolist()}')
  pad_len = length_rung(int(suffix.max()), bucket, limit)
  input_ids = np.full((batch, pad_len), PAD_ID, np.int32)
  position_ids = np.zeros((3, batch, pad_len), np.int32)
  attention_mask = np.zeros((batch, pad_len), bool)
  deltas = np.zeros((batch,), np.int32)
  pixel_values, grids = [], []
  for b, (ids, images) in enumerate(rows):
    length, start = len(ids), int(starts[b])
    row_grid = np.asarray([np.asarray(im.grid_thw).reshape(3) for im in images], np.int32).reshape(-1, 3)
    pos, delta = rope.get_rope_index(ids[None], row_grid if images else None, None, **rope_kw)
    deltas[b] = int(np.asarray(delta).reshape(-1)[0])
    n = length - start
    input_ids[b, :n] = ids[start:]
    attention_mask[b, :n] = True
    position_ids[:, b, :n] = np.asarray(pos, np.int32)[:, 0, start:]
    position_ids[:, b, n:] = length + deltas[b] + np.arange(pad_len - n)[None]
    try:
      skip = _cached_images(ids, images, start, image_token_id)
    except ValueError as e:
      raise ValueError(f'row {b}: {e}') from None
    for im in images[skip:]:
      pixel_values.append(np.asarray(im.pixel_values, np.float32))
      grids.append(tuple(int(x) for x in np.asarray(im.grid_thw).reshape(3)))
  pixels = np.concatenate(pixel_values, 0) if pixel_values else None
  return PrefillInputs(input_ids, position_ids, attention_mask, deltas, pixels, tuple(grids))


def vision_arrays(inputs: PrefillInputs, vision_config, patch_bucket: int,
                  image_token_id: int = IMAGE_PAD_ID) -> dict | None:
  """The suffix images of a prefill as the model's per-shard vision inputs with one shard (the whole batch).

  Args:
    inputs: `build`'s output.
    vision_config: the tower's `VisionConfig` (spatial_merge_size, patch geometry).
    patch_bucket: P is `vision_layout.patch_slots(n, patch_bucket)`, a multiple of spatial_merge_size**2.
    image_token_id: the `<|image_pad|>` id.
  Returns:
    None without images; else {'pixel_values': float32 [1, P, D], 'vision_inputs': {interp_indices int32 [1, P, 4],
    interp_weights float32 [1, P, 4], hw_positions int32 [1, P, 2], segment_ids int32 [1, P] (-1 on padding)}}.
  Raises:
    ValueError: images for a model without a vision tower (`vision_config` None); the pad tokens and the images
      disagree on the patch count; P not a multiple of merge_size**2.
  """
  if inputs.pixel_values is None:
    return None
  if vision_config is None:
    raise ValueError(f'{len(inputs.grids)} image(s) in the prefill, but the model has no vision tower')
  merge = vision_config.spatial_merge_size
  per_row = vision_layout.row_patches(inputs.input_ids, merge, image_token_id)
  budget = vision_layout.patch_slots(int(inputs.pixel_values.shape[0]), patch_bucket)
  out = vision_layout.shard_vision_inputs(inputs.pixel_values, np.asarray(inputs.grids, np.int32).reshape(-1, 3),
                                          per_row, 1, vision_config, budget)
  pixels = out.pop('pixel_values')
  return {'pixel_values': pixels, 'vision_inputs': {k[len('vision_'):]: v for k, v in out.items()}}
