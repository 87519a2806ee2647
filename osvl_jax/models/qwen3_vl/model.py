"""Qwen3-VL (dense or MoE) in Flax NNX: vision tower + text decoder + lm head (mirrors HF
`Qwen3VLForConditionalGeneration` / `Qwen3VLMoeForConditionalGeneration`, logits path).

Typical use:
  position_ids, rope_deltas = rope.get_rope_index(input_ids, grid_thw, attention_mask,
                                                  image_token_id=cfg.image_token_id)
  hidden, _ = model(input_ids, position_ids, attention_mask, pixel_values, grid_thw)
  logits = model.logits(hidden)

Under jit the image grid must be static (host data):
  fwd = nnx.jit(lambda m, ids, pos, mask, pix, grid: m(ids, pos, mask, pix, grid), static_argnums=5)
  fwd(model, ids, pos, mask, pix, vision.as_grid_tuple(grid_thw))

A compact vocabulary (`TextConfig.vocab_ids`) gives the embedding and the output projection one row per listed
Qwen id: `__call__` takes Qwen ids and maps them to rows (`ids_to_rows`), `logits` is over the rows, and a caller
maps sampled rows back (`rows_to_ids`) and loss targets to rows. An id outside the list has no row: it reads a
neighbour's under jit, so hosts refuse it first (`config.check_ids`). Without one, both maps are the identity and
every program is the full model's.

Images are matched to `<|image_pad|>` tokens in row-major (batch, time) order, which is the order their patches
must have in `pixel_values` (and their grids in `image_grid_thw`).

Training on a mesh passes the per-shard layout instead (`vision_inputs`, see `vision`; nothing grid-shaped is
static, so one program serves every batch of the same budgets): shard s's merged image tokens fill the image tokens
of its own rows [s*B/S, (s+1)*B/S), so the vision tower and the scatter into the rows stay on the devices that hold
those rows.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from osvl_jax.models.qwen3_vl import sharding
from osvl_jax.models.qwen3_vl import text as text_lib
from osvl_jax.models.qwen3_vl import vision as vision_lib
from osvl_jax.models.qwen3_vl.config import Qwen3VLConfig


class Qwen3VLModel(nnx.Module):
  """Qwen3-VL with HF parameter names: `visual.*`, `language_model.*`, `lm_head` (absent when tied)."""

  def __init__(self, config: Qwen3VLConfig, rngs: nnx.Rngs, dtype=jnp.float32, param_dtype=jnp.float32,
               scan_layers: bool = False):
    """`scan_layers`: store and run the decoder layers stacked under `jax.lax.scan` (see `text.Qwen3VLText`)."""
    self.config = config
    self.dtype = dtype
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.visual = vision_lib.Qwen3VLVision(config.vision, **kw)
    self.language_model = text_lib.Qwen3VLText(config.text, scan_layers=scan_layers, **kw)
    if not config.tie_word_embeddings:
      self.lm_head = nnx.Linear(config.text.hidden_size, config.text.table_rows, use_bias=False, **kw)

  def ids_to_rows(self, ids):
    """int Qwen ids [...] -> int32 rows of the embedding / output projection [...] (the ids themselves without a
    compact vocabulary). An id outside `vocab_ids` gets some row: check hosts' ids with `config.check_ids`."""
    vocab = self.config.text.vocab_ids
    if vocab is None:
      return ids
    table = jnp.asarray(np.asarray(vocab, np.int32))
    return jnp.clip(jnp.searchsorted(table, jnp.asarray(ids, jnp.int32)), 0, len(vocab) - 1).astype(jnp.int32)

  def rows_to_ids(self, rows):
    """int rows [...] -> int32 Qwen ids [...] (`ids_to_rows`' inverse; the rows themselves without a compact
    vocabulary)."""
    vocab = self.config.text.vocab_ids
    if vocab is None:
      return rows
    return jnp.asarray(np.asarray(vocab, np.int32))[rows]

  def __call__(self, input_ids, position_ids, attention_mask=None, pixel_values=None, image_grid_thw=None,
               cache=None, cache_index=None, vision_inputs=None, router_stats: bool = False):
    """Forward pass up to the final norm.

    Args:
      input_ids: int32 [B, T] Qwen ids (each in `vocab_ids` with a compact vocabulary).
      position_ids: int32 [3, B, T] from `rope.get_rope_index` (prefill) or `rope.text_position_ids` (decode).
      attention_mask: bool/int [B, T] (True / 1 = real token; padding may be left or right), int segment ids of
        packed rows (0 = padding, 1, 2, ... one per sequence; each attends only within itself, `text.Qwen3VLText`;
        its position_ids restart per sequence, `batching.collate(rows=...)`), or None.
      pixel_values: float32 [N, C*Tp*P*P] patches of all images in the batch, or None.
      image_grid_thw: concrete [I, 3] grids (numpy/tuple; static under jit), or None (always with
        `vision_inputs`).
      cache: KV cache from `init_cache` or None. With a cache, keys/values of the T new tokens are written at
        slots cache_index[b] + arange(T) and attention reads all valid slots up to the causal frontier.
      cache_index: int32 [B] per-row write offset (required with a cache).
      vision_inputs: None (pixel_values flat), or with pixel_values [S, P, C*Tp*P*P] the dict of per-shard geometry
        arrays of `vision_layout.shard_vision_inputs` (`vision.GEOMETRY_FIELDS`: interp_indices int32 [S, P, 4],
        interp_weights float32 [S, P, 4], hw_positions int32 [S, P, 2], segment_ids int32 [S, P], -1 on padding;
        S divides B; shard s = rows [s*B/S, (s+1)*B/S)).
      router_stats: also return the MoE router-loss statistics (`text.Qwen3VLText`; None for a dense model), for
        `moe.load_balancing_loss` / `moe.z_loss`.

    Returns:
      hidden: [B, T, hidden] (`dtype`), new cache (None without a cache)[, router stats with router_stats].
    Raises:
      ValueError: pixel_values without image_grid_thw or vision_inputs; image tokens and image features differ in number (flat,
        concrete input_ids); S does not divide B; a cache without cache_index.
    """
    c = self.config
    input_ids = jnp.asarray(input_ids, jnp.int32)
    x = text_lib.embed_lookup(self.language_model.embed_tokens, self.ids_to_rows(input_ids))
    visual_pos_mask, deepstack = None, ()
    if pixel_values is not None:
      if image_grid_thw is None and vision_inputs is None:
        raise ValueError('pixel_values needs image_grid_thw (flat) or vision_inputs (per shard)')
      image_embeds, deepstack = self.visual(jnp.asarray(pixel_values), image_grid_thw, vision_inputs)
      visual_pos_mask = input_ids == c.image_token_id
      if vision_inputs is not None:
        x, deepstack = scatter_shards(x, visual_pos_mask, image_embeds, deepstack)
      else:
        if not isinstance(visual_pos_mask, jax.core.Tracer):
          n_tokens = int(visual_pos_mask.sum())
          if n_tokens != image_embeds.shape[0]:
            raise ValueError(f'{n_tokens} image tokens in input_ids but {image_embeds.shape[0]} image features')
        x = text_lib.scatter_rows(x, visual_pos_mask, image_embeds)
    if cache is not None and cache_index is None:
      raise ValueError('cache needs cache_index')
    return self.language_model(x, position_ids, attention_mask, visual_pos_mask, deepstack, cache, cache_index,
                               router_stats)

  def logits(self, hidden):
    """hidden [B, T, hidden] -> float32 logits [B, T, rows] (`TextConfig.table_rows`: the vocabulary, or one per
    compact `vocab_ids` entry; lm_head, or the embedding when tied; `output_table`)."""
    table = self.output_table(hidden.dtype)
    return jnp.einsum('bth,vh->btv', hidden, table, preferred_element_type=jnp.float32)

  def output_table(self, dtype):
    """The [rows, hidden] output projection in the compute `dtype`: lm_head's kernel transposed, or the embedding
    when tied. A table wider than `dtype` (float32 parameters, bfloat16 compute) is cast first and the cast copy
    laid out ('vocab', None) under a set mesh, so FSDP gathers it in the compute dtype."""
    if self.config.tie_word_embeddings:
      table = self.language_model.embed_tokens.embedding[...]
    else:
      table = self.lm_head.kernel[...].T
    if table.dtype.itemsize > jnp.dtype(dtype).itemsize:
      table = sharding.constrain(table.astype(dtype), ('vocab', None))
    return table.astype(dtype)

  def init_cache(self, batch: int, max_len: int, dtype=None) -> dict:
    """Empty KV cache {'k','v': [L, B, Hkv, max_len, D] (head-major), 'mask': bool [B, max_len]} (dtype defaults
    to the compute dtype)."""
    return text_lib.init_cache(self.config.text, batch, max_len, dtype or self.dtype)


def scatter_shards(x, pos_mask, features, deepstack=()):
  """Per-shard form of HF `masked_scatter`: shard s's image tokens fill the image positions of its own rows.

  Args:
    x: [B, T, H] token embeddings; pos_mask: bool [B, T] image-token positions.
    features: [S, M, H] each shard's merged image tokens in order (then padding), S dividing B.
    deepstack: [S, M, H] arrays laid out like `features`.
  Returns:
    x with the image positions replaced (a gather within each shard: no data crosses shards), and the deepstack
    features as [S*M, H] in the batch's row-major image-token order, the form `text.Qwen3VLText` adds them in
    (this reorder does move merged DeepStack tokens between shards: the text model indexes them by the global
    image-token count).
  Raises:
    ValueError: S does not divide B.
  """
  (b, t), (s, m) = pos_mask.shape, features.shape[:2]
  if b % s:
    raise ValueError(f'{s} image shards do not split the {b} rows')
  local = sharding.constrain(pos_mask.reshape(s, (b // s) * t), ('batch', None))
  index = jnp.clip(jnp.cumsum(local, axis=1) - 1, 0, m - 1)                           # [S, B/S*T]
  gathered = sharding.constrain(jnp.take_along_axis(features, index[..., None], axis=1), ('batch', None, None))
  gathered = gathered.reshape(b, t, -1)
  x = jnp.where(pos_mask[..., None], gathered.astype(x.dtype), x)
  # Global token k sits in shard s(k) at k - (tokens of the shards before it).
  ends = jnp.cumsum(local.sum(1))
  k = jnp.arange(s * m)
  shard = jnp.minimum(jnp.searchsorted(ends, k, side='right'), s - 1)
  source = shard * m + jnp.clip(k - (ends - local.sum(1))[shard], 0, m - 1)
  return x, [d.reshape(s * m, -1)[source] for d in deepstack]


def cache_rows(cache: dict, rows) -> dict:
  """The sub-cache of the given batch rows (e.g. to prefill one row of a batched cache)."""
  rows = jnp.asarray(rows, jnp.int32)
  return {'k': cache['k'][:, rows], 'v': cache['v'][:, rows], 'mask': cache['mask'][rows]}


def set_cache_rows(cache: dict, rows, sub: dict) -> dict:
  """Writes a sub-cache from `cache_rows` back into the batched cache at `rows`."""
  rows = jnp.asarray(rows, jnp.int32)
  return {'k': cache['k'].at[:, rows].set(sub['k']), 'v': cache['v'].at[:, rows].set(sub['v']),
          'mask': cache['mask'].at[rows].set(sub['mask'])}
