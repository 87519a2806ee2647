"""Qwen3-VL vision tower in Flax NNX (mirrors HF `Qwen3VLVisionModel`).

The per-image geometry (grid sizes) is host data: `vision_metadata(grid_thw)` turns a concrete [I, 3] grid into
numpy gather indices / weights / rotary positions / attention segments. On the flat path (HF parity, the samplers)
the grid is therefore static under `jax.jit` (a hashable tuple of tuples passed as a static argument, or a numpy
constant closed over) and each distinct set of grid shapes compiles once; the per-shard path (training) takes the
same geometry as array inputs instead (below).

Patch order: `pixel_values` rows are in the order the HF image processor emits them (spatial-merge-block order:
for each frame, for each 2x2 block in raster order, its 4 patches in raster order), each row the flattened
[C, temporal_patch, patch, patch] voxel, so the Conv3d patch embedding is one matmul.

Per-shard layout (training on a mesh): `pixel_values` [S, P, D] holds, for each of the S batch shards (the row
blocks of the ('data', 'fsdp') axes), that shard's patches, contiguous and zero-padded to P (a config budget), and
`vision_inputs` that shard's host geometry as arrays (`vision_layout.shard_vision_inputs`; `GEOMETRY_FIELDS`):
interp_indices int32 [S, P, 4], interp_weights float32 [S, P, 4], hw_positions int32 [S, P, 2] and segment_ids int32
[S, P] (-1 on padding). Nothing grid-shaped is static, so one program runs whatever the batch's images; attention
is masked by frame (`segment_ids`), not looped over static segments. Under a mesh (`sharding.use_mesh`) the shard
axis of every per-shard array is pinned to the logical 'batch' axis, so the compiler gathers the (FSDP-sharded)
weights, never the patches.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from osvl_jax.models.qwen3_vl import rope
from osvl_jax.models.qwen3_vl import sharding
from osvl_jax.models.qwen3_vl.config import VisionConfig


QUERY_BLOCK = 512  # patches per query block of the per-shard (masked) vision attention
# The per-shard geometry arrays of `vision_inputs` (batch fields 'vision_<name>', `vision_layout.shard_vision_inputs`).
GEOMETRY_FIELDS = ('interp_indices', 'interp_weights', 'hw_positions', 'segment_ids')


def as_grid_tuple(grid_thw) -> tuple[tuple[int, int, int], ...]:
  """Hashable, static form of an [I, 3] grid (for jit static arguments and caches)."""
  if isinstance(grid_thw, jax.core.Tracer):
    raise TypeError('image_grid_thw must be concrete host data (numpy or tuple), not a traced array: pass it as a '
                    'static argument under jit')
  return tuple(tuple(int(v) for v in row) for row in np.asarray(grid_thw).reshape(-1, 3))


@dataclasses.dataclass(frozen=True)
class VisionMetadata:
  """Host-computed geometry for one set of images (numpy arrays, constants under jit).

  Attributes:
    interp_indices: int32 [N, 4] rows of the learned position table mixed into each patch.
    interp_weights: float32 [N, 4] their bilinear weights (HF `fast_pos_embed_interpolate`, align_corners=True).
    hw_positions: int32 [N, 2] (row, col) of each patch in its frame, for the 2-D rotary embedding.
    segments: tuple of int32 [n, L] index arrays; each row is one attention segment (one frame of one image),
      grouped by length so each group is one batched attention.
    merged_sizes: tokens per image after the 2x2 merge, (t*h*w/merge**2 for each image).
    segment_ids: int32 [N], the attention segment (frame of an image, numbered in patch order) of each patch.
  """
  interp_indices: np.ndarray
  interp_weights: np.ndarray
  hw_positions: np.ndarray
  segments: tuple[np.ndarray, ...]
  merged_sizes: tuple[int, ...]
  segment_ids: np.ndarray

  @property
  def num_patches(self) -> int:
    return int(self.hw_positions.shape[0])


def _axis_taps(index: np.ndarray, size: np.ndarray, side: int) -> tuple[np.ndarray, np.ndarray]:
  """Bilinear taps/weights along one axis, align_corners=True, float32 arithmetic as in HF."""
  src = index.astype(np.float32) * np.float32(side - 1) / np.maximum(size - 1, 1).astype(np.float32)
  floor = np.floor(src)
  offsets = np.arange(2)
  taps = np.clip(floor.astype(np.int64)[:, None] + offsets, 0, side - 1)
  weights = np.maximum(np.float32(1) - np.abs(src[:, None] - floor[:, None] - offsets.astype(np.float32)), 0)
  return taps, weights.astype(np.float32)


def vision_metadata(grid_thw, config: VisionConfig) -> VisionMetadata:
  """Computes `VisionMetadata` for concrete grids (HF `get_vision_interpolation_indices_and_weights`,
  `get_vision_position_ids`, `get_vision_cu_seqlens`).

  Args:
    grid_thw: [I, 3] (t, h, w) patch grids, concrete.
  """
  grids = as_grid_tuple(grid_thw)
  m = config.spatial_merge_size
  side = int(config.num_position_embeddings ** 0.5)
  indices, weights, hw, segs, seg_ids = [], [], [], {}, []
  start = 0
  for t, h, w in grids:
    if h % m or w % m:
      raise ValueError(f'grid {(t, h, w)} is not divisible by spatial_merge_size {m}')
    # Patch (row, col) in spatial-merge-block order: [h/m, m, w/m, m] -> [h/m, w/m, m, m].
    rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing='ij')
    rows = rows.reshape(h // m, m, w // m, m).transpose(0, 2, 1, 3).ravel()
    cols = cols.reshape(h // m, m, w // m, m).transpose(0, 2, 1, 3).ravel()
    h_taps, h_w = _axis_taps(rows, np.full_like(rows, h), side)
    w_taps, w_w = _axis_taps(cols, np.full_like(cols, w), side)
    idx = (h_taps[:, :, None] * side + w_taps[:, None, :]).reshape(-1, 4)
    wts = (h_w[:, :, None] * w_w[:, None, :]).reshape(-1, 4)
    for _ in range(t):
      indices.append(idx)
      weights.append(wts)
      hw.append(np.stack([rows, cols], axis=-1))
      segs.setdefault(h * w, []).append(np.arange(start, start + h * w))
      seg_ids.append(np.full(h * w, len(seg_ids), np.int32))
      start += h * w
  return VisionMetadata(
      interp_indices=np.concatenate(indices).astype(np.int32),
      interp_weights=np.concatenate(weights).astype(np.float32),
      hw_positions=np.concatenate(hw).astype(np.int32),
      segments=tuple(np.stack(v).astype(np.int32) for v in segs.values()),
      merged_sizes=tuple(t * h * w // m ** 2 for t, h, w in grids),
      segment_ids=np.concatenate(seg_ids).astype(np.int32))


class LayerNorm(nnx.Module):
  """torch.nn.LayerNorm (biased variance, two-pass), parameters `weight` and `bias` as in HF."""

  def __init__(self, dim: int, eps: float = 1e-6, *, dtype=jnp.float32, param_dtype=jnp.float32):
    self.weight = nnx.Param(jnp.ones((dim,), param_dtype))
    self.bias = nnx.Param(jnp.zeros((dim,), param_dtype))
    self.eps = eps
    self.dtype = dtype

  def __call__(self, x):
    xf = x.astype(jnp.float32)
    mean = xf.mean(-1, keepdims=True)
    var = jnp.square(xf - mean).mean(-1, keepdims=True)
    y = (xf - mean) * jax.lax.rsqrt(var + self.eps)
    return (y * self.weight[...].astype(jnp.float32) + self.bias[...].astype(jnp.float32)).astype(self.dtype)


def _linear(din, dout, rngs, dtype, param_dtype, use_bias=True):
  return nnx.Linear(din, dout, use_bias=use_bias, dtype=dtype, param_dtype=param_dtype, rngs=rngs)


class PatchEmbed(nnx.Module):
  """Conv3d(kernel = stride = [temporal_patch, patch, patch]) as a Linear over the flattened voxel (HF
  `Qwen3VLVisionPatchEmbed`). `proj.kernel` is [C*Tp*P*P, hidden]."""

  def __init__(self, config: VisionConfig, *, rngs, dtype, param_dtype):
    self.proj = _linear(config.patch_dim, config.hidden_size, rngs, dtype, param_dtype)

  def __call__(self, pixel_values):
    return self.proj(pixel_values.astype(self.proj.dtype))


class VisionAttention(nnx.Module):
  """Fused-qkv attention with 2-D rotary, restricted to each segment (HF `Qwen3VLVisionAttention`)."""

  def __init__(self, config: VisionConfig, *, rngs, dtype, param_dtype):
    self.num_heads = config.num_heads
    self.head_dim = config.head_dim
    self.qkv = _linear(config.hidden_size, 3 * config.hidden_size, rngs, dtype, param_dtype)
    self.proj = _linear(config.hidden_size, config.hidden_size, rngs, dtype, param_dtype)

  def __call__(self, x, cos, sin, segments):
    """Attention within segments.

    Args:
      x: [N, hidden] (flat patches) or [S, P, hidden] (per-shard layout).
      cos, sin: float32 [N, head_dim] / [S, P, head_dim].
      segments: for flat patches the static `VisionMetadata.segments`; for the per-shard layout int32 [S, P]
        segment ids (a patch attends to the patches of its own id; padding has id -1).
    """
    qkv = self.qkv(x).reshape(*x.shape[:-1], 3, self.num_heads, self.head_dim)
    q, k, v = qkv[..., 0, :, :], qkv[..., 1, :, :], qkv[..., 2, :, :]
    q = rope.apply_rotary(q.astype(jnp.float32), cos, sin).astype(x.dtype)
    k = rope.apply_rotary(k.astype(jnp.float32), cos, sin).astype(x.dtype)
    if isinstance(segments, tuple):
      out = self._static_segments(q, k, v, segments)
    else:
      out = self._masked(q, k, v, segments)
    return self.proj(out.reshape(*x.shape[:-1], -1))

  def _softmax_values(self, scores, v):
    probs = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(v.dtype)
    return jnp.einsum('shqk,skhd->sqhd', probs, v)

  def _static_segments(self, q, k, v, segments: tuple[np.ndarray, ...]):
    """q, k, v [N, H, D]; one batched attention per group of equal-length segments (static indices)."""
    n, scale, out = q.shape[0], self.head_dim ** -0.5, None
    for seg in segments:                                         # [n_seg, L] static indices
      scores = jnp.einsum('sqhd,skhd->shqk', q[seg], k[seg]) * scale
      res = self._softmax_values(scores, v[seg]).reshape(-1, self.num_heads, self.head_dim)
      if len(segments) == 1 and seg.size == n:                  # one group covering everything, in order
        out = res
      else:
        out = (jnp.zeros_like(q) if out is None else out).at[seg.reshape(-1)].set(res)
    return out

  def _masked(self, q, k, v, segment_ids):
    """q, k, v [S, P, H, D], segment_ids int32 [S, P]: each shard's patches attend within their segment.

    In query blocks of `QUERY_BLOCK` patches (`jax.lax.map`, each block rematerialised in the backward pass), so
    the scores take [S, H, block, P] at a time, not [S, H, P, P]: a shard of four 4,096-patch images would
    otherwise hold 16 GiB of float32 scores per layer at 16 heads.
    """
    s, p = segment_ids.shape
    block = min(QUERY_BLOCK, p)
    n = -(-p // block)
    pad = ((0, 0), (0, n * block - p))
    q_blocks = jnp.pad(q, pad + ((0, 0), (0, 0))).reshape(s, n, block, *q.shape[2:]).swapaxes(0, 1)
    seg_blocks = jnp.pad(segment_ids, pad, mode='edge').reshape(s, n, block).swapaxes(0, 1)  # padded rows: real ids
    scale = self.head_dim ** -0.5

    @jax.checkpoint
    def one(args):   # [S, block, H, D] queries of one block against every key of their shard
      qi, si = args
      scores = jnp.einsum('sqhd,skhd->shqk', qi, k) * scale
      same = si[:, None, :, None] == segment_ids[:, None, None, :]            # [S, 1, block, P]
      scores = jnp.where(same, scores.astype(jnp.float32), -jnp.inf)          # a patch always sees itself
      return self._softmax_values(scores, v)

    out = jax.lax.map(one, (q_blocks, seg_blocks))                              # [n, S, block, H, D]
    return out.swapaxes(0, 1).reshape(s, n * block, *q.shape[2:])[:, :p]


class VisionMLP(nnx.Module):
  def __init__(self, config: VisionConfig, *, rngs, dtype, param_dtype):
    self.linear_fc1 = _linear(config.hidden_size, config.intermediate_size, rngs, dtype, param_dtype)
    self.linear_fc2 = _linear(config.intermediate_size, config.hidden_size, rngs, dtype, param_dtype)

  def __call__(self, x):
    return self.linear_fc2(jax.nn.gelu(self.linear_fc1(x), approximate=True))


class VisionBlock(nnx.Module):
  """Pre-norm transformer block (HF `Qwen3VLVisionBlock`)."""

  def __init__(self, config: VisionConfig, *, rngs, dtype, param_dtype):
    kw = dict(dtype=dtype, param_dtype=param_dtype)
    self.norm1 = LayerNorm(config.hidden_size, **kw)
    self.norm2 = LayerNorm(config.hidden_size, **kw)
    self.attn = VisionAttention(config, rngs=rngs, **kw)
    self.mlp = VisionMLP(config, rngs=rngs, **kw)

  def __call__(self, x, cos, sin, segments):
    x = x + self.attn(self.norm1(x), cos, sin, segments)
    return x + self.mlp(self.norm2(x))


class PatchMerger(nnx.Module):
  """2x2 patch merger: LayerNorm -> concat 4 neighbours -> Linear -> GELU(erf) -> Linear (HF
  `Qwen3VLVisionPatchMerger`). `postshuffle_norm=True` (DeepStack mergers) normalises after the concat."""

  def __init__(self, config: VisionConfig, postshuffle_norm: bool, *, rngs, dtype, param_dtype):
    merged = config.hidden_size * config.spatial_merge_size ** 2
    self.merged = merged
    self.postshuffle_norm = postshuffle_norm
    self.norm = LayerNorm(merged if postshuffle_norm else config.hidden_size, dtype=dtype, param_dtype=param_dtype)
    self.linear_fc1 = _linear(merged, merged, rngs, dtype, param_dtype)
    self.linear_fc2 = _linear(merged, config.out_hidden_size, rngs, dtype, param_dtype)

  def __call__(self, x):
    """x: [..., N, hidden] in merge-block order -> [..., N / merge**2, out_hidden]."""
    shape = (*x.shape[:-2], -1, self.merged)
    if self.postshuffle_norm:
      x = self.norm(x.reshape(shape))
    else:
      x = self.norm(x).reshape(shape)
    return self.linear_fc2(jax.nn.gelu(self.linear_fc1(x), approximate=False))


class Qwen3VLVision(nnx.Module):
  """Vision tower: patch embed + interpolated learned positions + blocks + merger + DeepStack mergers."""

  def __init__(self, config: VisionConfig, *, rngs: nnx.Rngs, dtype=jnp.float32, param_dtype=jnp.float32):
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.config = config
    self.patch_embed = PatchEmbed(config, **kw)
    self.pos_embed = nnx.Embed(config.num_position_embeddings, config.hidden_size, dtype=dtype,
                               param_dtype=param_dtype, rngs=rngs)
    self.blocks = nnx.List([VisionBlock(config, **kw) for _ in range(config.depth)])
    self.merger = PatchMerger(config, postshuffle_norm=False, **kw)
    self.deepstack_merger_list = nnx.List(
        [PatchMerger(config, postshuffle_norm=True, **kw) for _ in config.deepstack_visual_indexes])

  def __call__(self, pixel_values, grid_thw=None, vision_inputs=None) -> tuple[Any, list[Any]]:
    """Encodes all images of a batch, packed (flat), or each batch shard's own images (per-shard layout).

    Args:
      pixel_values: float [N, C*Tp*P*P], N = sum(t*h*w) over images, in HF processor order; or, with
        `vision_inputs`, [S, P, C*Tp*P*P]: each shard's patches, then zero padding (module docstring).
      grid_thw: flat path: concrete [I, 3] (numpy / tuple; static under jit) or a precomputed `VisionMetadata`:
        all images of the batch, in order. Unused (may be None) with `vision_inputs`.
      vision_inputs: None (flat), or a dict of the per-shard geometry arrays `GEOMETRY_FIELDS`:
        interp_indices int32 [S, P, 4], interp_weights float32 [S, P, 4], hw_positions int32 [S, P, 2],
        segment_ids int32 [S, P] (-1 on padding) (`vision_layout.shard_vision_inputs`); traced arrays under jit.

    Returns:
      embeds: [N / merge**2, out_hidden] merged image tokens, images concatenated in order; per-shard layout:
        [S, P / merge**2, out_hidden], each shard's tokens in order, then padding.
      deepstack: list (one per `deepstack_visual_indexes`) of arrays shaped like `embeds`.
    Raises:
      ValueError: the patch count does not match the grids (flat), or the geometry arrays do not match
        `pixel_values`' [S, P].
    """
    per_shard = vision_inputs is not None
    if not per_shard:
      if grid_thw is None:
        raise ValueError('the flat vision path needs grid_thw')
      meta = grid_thw if isinstance(grid_thw, VisionMetadata) else vision_metadata(grid_thw, self.config)
      if pixel_values.shape[0] != meta.num_patches:
        raise ValueError(f'pixel_values has {pixel_values.shape[0]} patches, grids need {meta.num_patches}')
      geometry = (meta.interp_indices, meta.interp_weights, meta.hw_positions)
      segments = meta.segments
    else:
      missing = [k for k in GEOMETRY_FIELDS if k not in vision_inputs]
      if missing:
        raise ValueError(f'vision_inputs lacks {missing}')
      segments = jnp.asarray(vision_inputs['segment_ids'], jnp.int32)
      if pixel_values.ndim != 3 or tuple(segments.shape) != tuple(pixel_values.shape[:2]):
        raise ValueError(f"vision_inputs['segment_ids'] {tuple(segments.shape)} does not match pixel_values "
                         f'{tuple(pixel_values.shape)} (expected [S, P] and [S, P, D])')
      segments = _by_shard(segments)
      geometry = tuple(_by_shard(jnp.asarray(vision_inputs[k])) for k in GEOMETRY_FIELDS[:3])
    pin = _by_shard if per_shard else (lambda x: x)
    interp_indices, interp_weights, hw_positions = geometry
    x = self.patch_embed(pin(pixel_values))
    table = self.pos_embed.embedding[...]
    if per_shard:   # gather the (FSDP-sharded) table, not each shard's indices
      table = sharding.constrain(table, (None, 'activation_embed'))
    pos = (table[interp_indices].astype(jnp.float32) * interp_weights[..., None]).sum(-2)
    x = pin(x + pos.astype(x.dtype))
    cos, sin = rope.vision_cos_sin(hw_positions.reshape(-1, 2), self.config.head_dim, self.config.rope_theta)
    cos, sin = pin(cos.reshape(*hw_positions.shape[:-1], -1)), pin(sin.reshape(*hw_positions.shape[:-1], -1))
    deepstack = []
    for i, block in enumerate(self.blocks):
      x = pin(block(x, cos, sin, segments))
      if i in self.config.deepstack_visual_indexes:
        deepstack.append(pin(self.deepstack_merger_list[self.config.deepstack_visual_indexes.index(i)](x)))
    return pin(self.merger(x)), deepstack


def _by_shard(x):
  """Pins the leading (shard) axis of a per-shard array to the logical 'batch' axis, the rest whole (no-op
  without a mesh)."""
  return sharding.constrain(x, ('batch',) + (None,) * (x.ndim - 1))
