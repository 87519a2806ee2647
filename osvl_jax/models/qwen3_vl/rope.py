"""3-D multimodal rotary positions (MRoPE) for Qwen3-VL: the single source of truth for position ids.

Host side (numpy): `get_rope_index` (mirrors HF `Qwen3VLModel.get_rope_index`) and `text_position_ids` for decode
steps. Device side (jax): `mrope_cos_sin` (mirrors HF `Qwen3VLTextRotaryEmbedding` incl. the interleaved
frequency layout of `apply_interleaved_mrope`), `vision_cos_sin` (HF `Qwen3VLVisionRotaryEmbedding`) and
`apply_rotary` (HF `apply_rotary_pos_emb`).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np

from osvl_jax.models.qwen3_vl import config as config_lib


def get_rope_index(input_ids, image_grid_thw=None, attention_mask=None, *,
                   image_token_id: int = config_lib.Qwen3VLConfig.image_token_id,
                   spatial_merge_size: int = 2) -> tuple[np.ndarray, np.ndarray]:
  """3-D (temporal, height, width) position ids for text interleaved with images.

  Mirrors HF `Qwen3VLModel.get_rope_index` (images only; `mm_token_type_ids` is derived as
  `input_ids == image_token_id`). Text tokens advance all three axes by 1; an image of grid (t, h, w) occupies
  `t*h*w/merge**2` tokens at (start + t_idx, start + h_idx, start + w_idx) over its merged grid, and the text after
  it resumes at `start + max(h, w) / merge`. Padding positions (attention_mask == 0) get position 0 and are skipped.
  Images are consumed from `image_grid_thw` in row-major order over (batch, time), the order of `pixel_values`.
  A run of image tokens longer than one image (two images without a separator) is split by the grids' sizes.

  Args:
    input_ids: int [B, T].
    image_grid_thw: int [I, 3] patch grids (before merging) or None.
    attention_mask: [B, T] (1/True = real token) or None.
    image_token_id: the `<|image_pad|>` id; default `Qwen3VLConfig.image_token_id` (pass `config.image_token_id`).
    spatial_merge_size: vision `spatial_merge_size`.

  Returns:
    position_ids: int32 [3, B, T].
    rope_deltas: int32 [B, 1] = max position + 1 - number of real tokens; the next generated token of row b has
      position `num_real_tokens[b] + rope_deltas[b]` on all three axes.
  """
  input_ids = np.asarray(input_ids)
  batch, length = input_ids.shape
  mask = np.ones((batch, length), bool) if attention_mask is None else np.asarray(attention_mask).astype(bool)
  grids = iter(np.zeros((0, 3), np.int64) if image_grid_thw is None else np.asarray(image_grid_thw, np.int64))
  position_ids = np.zeros((3, batch, length), np.int32)
  deltas = np.zeros((batch, 1), np.int32)
  m = spatial_merge_size
  for b in range(batch):
    ids = input_ids[b][mask[b]]
    is_image = ids == image_token_id
    pieces, pos, i = [], 0, 0
    while i < len(ids):
      if not is_image[i]:
        j = i
        while j < len(ids) and not is_image[j]:
          j += 1
        pieces.append(np.broadcast_to(np.arange(j - i) + pos, (3, j - i)))
        pos += j - i
        i = j
        continue
      grid = next(grids, None)
      if grid is None:
        raise ValueError(f'row {b}: more images in input_ids than grids in image_grid_thw')
      t, h, w = grid
      gt, gh, gw = t, h // m, w // m
      tt, hh, ww = np.meshgrid(np.arange(gt), np.arange(gh), np.arange(gw), indexing='ij')
      pieces.append(np.stack([tt.ravel(), hh.ravel(), ww.ravel()]) + pos)
      n = gt * gh * gw
      if not is_image[i:i + n].all():
        raise ValueError(f'row {b}: image at token {i} needs {n} image tokens per its grid {(t, h, w)}')
      pos += max(h, w) // m
      i += n
    llm = np.concatenate(pieces, axis=1) if pieces else np.zeros((3, 0), np.int64)
    position_ids[:, b, mask[b]] = llm
    deltas[b, 0] = (llm.max() + 1 if llm.size else 0) - len(ids)
  return position_ids, deltas


def text_position_ids(start, length: int = 1) -> np.ndarray:
  """Position ids for `length` text tokens per row starting at `start [B]` (same on all three axes).

  For decoding after `get_rope_index`: `start = num_real_tokens + rope_deltas[:, 0]`, i.e. max position + 1.

  Returns:
    int32 [3, B, length].
  """
  start = np.asarray(start, np.int64).reshape(-1, 1)
  pos = (start + np.arange(length)[None, :]).astype(np.int32)
  return np.broadcast_to(pos[None], (3,) + pos.shape).copy()


def _inv_freq(dim: int, theta: float) -> np.ndarray:
  """`1 / theta ** (arange(0, dim, 2) / dim)` in float32, as HF computes it."""
  exponent = np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)
  return (np.float32(1.0) / np.power(np.float32(theta), exponent)).astype(np.float32)


def mrope_axis_of_frequency(head_dim: int, mrope_section: Sequence[int], interleaved: bool = True) -> np.ndarray:
  """Which position axis (0=t, 1=h, 2=w) drives each of the head_dim/2 rotary frequencies.

  Interleaved (Qwen3-VL, HF `apply_interleaved_mrope`): frequency j uses axis h if j % 3 == 1 and
  j < 3*section[1], axis w if j % 3 == 2 and j < 3*section[2], else t. Chunked (Qwen2-VL): the first
  section[0] frequencies use t, the next section[1] h, the rest w.
  """
  half = head_dim // 2
  if interleaved:
    axis = np.zeros(half, np.int32)
    for a in (1, 2):
      axis[a:mrope_section[a] * 3:3] = a
  else:
    axis = np.repeat(np.arange(3, dtype=np.int32), mrope_section)
  assert axis.shape == (half,), (axis.shape, half)
  return axis


def mrope_cos_sin(position_ids, head_dim: int, theta: float, mrope_section: Sequence[int], interleaved: bool = True,
                  dtype=jnp.float32):
  """Rotary cos/sin for 3-D positions (HF `Qwen3VLTextRotaryEmbedding.forward`).

  Args:
    position_ids: int [3, B, T].

  Returns:
    (cos, sin), each `dtype` [B, T, head_dim] (the half-dim angles duplicated, for rotate-half application).
  """
  axis = mrope_axis_of_frequency(head_dim, mrope_section, interleaved)
  inv_freq = jnp.asarray(_inv_freq(head_dim, theta))
  pos = jnp.asarray(position_ids).astype(jnp.float32)           # [3, B, T]
  pos = jnp.moveaxis(pos[axis], 0, -1)                           # [B, T, half]
  freqs = pos * inv_freq
  emb = jnp.concatenate([freqs, freqs], axis=-1)
  return jnp.cos(emb).astype(dtype), jnp.sin(emb).astype(dtype)


def vision_cos_sin(hw_positions, head_dim: int, theta: float):
  """Axial 2-D rotary cos/sin for vision patches (HF `Qwen3VLVisionRotaryEmbedding`).

  Args:
    hw_positions: int [N, 2] (row, column) of each patch in its image's patch grid.

  Returns:
    (cos, sin), float32 [N, head_dim]: [h-angles, w-angles, h-angles, w-angles], each head_dim/4 wide.
  """
  inv_freq = jnp.asarray(_inv_freq(head_dim // 2, theta))       # [head_dim/4]
  pos = jnp.asarray(hw_positions).astype(jnp.float32)
  freqs = pos[:, :, None] * inv_freq                             # [N, 2, head_dim/4]
  hw = freqs.reshape(freqs.shape[0], -1)                         # [N, head_dim/2] = [h..., w...]
  emb = jnp.concatenate([hw, hw], axis=-1)
  return jnp.cos(emb), jnp.sin(emb)


def rotate_half(x):
  half = x.shape[-1] // 2
  return jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def apply_rotary(x, cos, sin):
  """x * cos + rotate_half(x) * sin; x: [..., T, H, D], cos/sin: [..., T, D] broadcast over heads."""
  cos = cos[..., None, :]
  sin = sin[..., None, :]
  return x * cos + rotate_half(x) * sin
