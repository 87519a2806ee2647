"""Qwen3 text decoder in Flax NNX (mirrors HF `Qwen3VLTextModel`): RMSNorm, q_norm/k_norm, GQA, SwiGLU,
interleaved MRoPE, DeepStack injection, and a static-shape KV cache with per-row write offsets.

KV cache (a pytree of jax arrays, see `init_cache`):
  {'k': [L, B, Hkv, S, D], 'v': [L, B, Hkv, S, D], 'mask': bool [B, S]}
A call with `cache` and `cache_index [B]` writes the new T keys/values of row b at slots
cache_index[b] .. cache_index[b]+T-1 (out-of-range slots are dropped) and records `attention_mask` for them in
`mask`. Query i of row b attends to slots s with mask[b, s] and s <= cache_index[b] + i. Slots beyond the causal
frontier may hold stale data; they are never read before being overwritten.

Cost of a decode step under jit with the cache donated: layer i scatters its new keys/values straight into the
whole [L, ...] buffer and then reads its own slice, so every write depends on the previous layer's reads and XLA
updates the buffer in place (writing after the reads, as a single scatter at the end would, makes it copy the
whole cache first); the head-major layout is the one the attention dots read without a transpose. The compiled
decode step then holds no cache-sized copy or transpose: the cache is only read (bench/sampler_speed.py).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from osvl_jax.models.qwen3_vl import attention as attention_lib
from osvl_jax.models.qwen3_vl import moe
from osvl_jax.models.qwen3_vl import rope
from osvl_jax.models.qwen3_vl import sharding
from osvl_jax.models.qwen3_vl.config import TextConfig

# `jax.nn.dot_product_attention`'s implementation behind attention_impl 'cudnn' ('xla' runs the same masks on any
# backend: the CPU tests set it).
FUSED_IMPLEMENTATION = 'cudnn'


class RMSNorm(nnx.Module):
  """HF `Qwen3VLTextRMSNorm`: weight * (x / sqrt(mean(x^2) + eps)), statistics in float32.

  Computed on x flattened to 2-D [N, dim]: the weight gradient is then a reduction over one axis, which XLA:CPU
  runs ~20x faster than the same reduction over (B, T[, heads]) (bench/step_speed.py). Same values.
  """

  def __init__(self, dim: int, eps: float, *, dtype=jnp.float32, param_dtype=jnp.float32):
    self.weight = nnx.Param(jnp.ones((dim,), param_dtype))
    self.eps = eps
    self.dtype = dtype

  def __call__(self, x):
    """x [..., dim] -> [..., dim] (`dtype`)."""
    xf = x.reshape(-1, x.shape[-1]).astype(jnp.float32)
    y = xf * jax.lax.rsqrt(jnp.mean(jnp.square(xf), axis=-1, keepdims=True) + self.eps)
    return (self.weight[...].astype(self.dtype) * y.astype(self.dtype)).reshape(x.shape)


def _linear(din, dout, rngs, dtype, param_dtype, use_bias=False):
  return nnx.Linear(din, dout, use_bias=use_bias, dtype=dtype, param_dtype=param_dtype, rngs=rngs)


RESIDUAL_AXES = ('batch', 'length', 'activation_embed')   # logical axes of the residual stream [B, T, hidden]


def embed_lookup(embed: nnx.Embed, input_ids):
  """input_ids int [B, T] -> [B, T, hidden] in the compute dtype (`nnx.Embed`), with the table's FSDP-sharded hidden
  dim gathered first under a set mesh (as FSDP does for every weight), so the rows land in the batch-sharded
  residual layout without XLA's involuntary full rematerialisation of the lookup.

  A table stored in a wider dtype than the compute dtype (float32 parameters, bfloat16 compute) is cast before the
  gather, so the gathered copy is in the compute dtype; its gradient is still accumulated in the parameter dtype
  (`_take_rows_cast`). Same values as casting the looked-up rows."""
  table = embed.embedding[...]
  if table.dtype.itemsize <= jnp.dtype(embed.dtype).itemsize:
    return jnp.take(sharding.constrain(table, ('vocab', None)), input_ids, axis=0).astype(embed.dtype)
  return _take_rows_cast(table, input_ids, jnp.dtype(embed.dtype))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _take_rows_cast(table, ids, dtype):
  """table [V, hidden] (parameter dtype), ids int [B, T] -> rows [B, T, hidden] in `dtype`, gathered from the table
  cast to `dtype` and laid out ('vocab', None). Backward: the rows' cotangents scatter-added into a [V, hidden]
  gradient in the table's dtype (a bfloat16 scatter-add would round every repeated token's sum)."""
  return jnp.take(sharding.constrain(table.astype(dtype), ('vocab', None)), ids, axis=0)


def _take_rows_cast_fwd(table, ids, dtype):
  return _take_rows_cast(table, ids, dtype), (table, ids)


def _take_rows_cast_bwd(dtype, residuals, g):
  del dtype
  table, ids = residuals
  grad = sharding.constrain(jnp.zeros(table.shape, table.dtype), ('vocab', None))
  return grad.at[ids].add(g.astype(table.dtype)), None


_take_rows_cast.defvjp(_take_rows_cast_fwd, _take_rows_cast_bwd)


def _write_rows(buf, new, index):
  """buf [B, S, ...] <- new [B, T, ...] at slots index[b] + arange(T); out-of-range slots are dropped."""
  b, t = new.shape[:2]
  rows = jnp.arange(b)[:, None]
  cols = index[:, None] + jnp.arange(t)[None, :]
  return buf.at[rows, cols].set(new.astype(buf.dtype), mode='drop')


def _write_layer(buf, layer, new, index):
  """buf [L, B, Hkv, S, D] <- new [B, T, Hkv, D] at [layer, b, :, index[b] + arange(T)]; out-of-range slots are
  dropped. `layer`: int or int32 scalar."""
  b, t = new.shape[:2]
  rows = jnp.arange(b)[:, None]
  cols = index[:, None] + jnp.arange(t)[None, :]
  return buf.at[layer, rows, :, cols].set(new.astype(buf.dtype), mode='drop')


class Attention(nnx.Module):
  """GQA self-attention with per-head RMSNorm on q and k (HF `Qwen3VLTextAttention`)."""

  def __init__(self, config: TextConfig, *, rngs, dtype, param_dtype):
    h, kv, d = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    self.num_heads, self.num_kv_heads, self.head_dim = h, kv, d
    bias = config.attention_bias
    self.q_proj = _linear(config.hidden_size, h * d, rngs, dtype, param_dtype, bias)
    self.k_proj = _linear(config.hidden_size, kv * d, rngs, dtype, param_dtype, bias)
    self.v_proj = _linear(config.hidden_size, kv * d, rngs, dtype, param_dtype, bias)
    self.o_proj = _linear(h * d, config.hidden_size, rngs, dtype, param_dtype, bias)
    self.q_norm = RMSNorm(d, config.rms_norm_eps, dtype=dtype, param_dtype=param_dtype)
    self.k_norm = RMSNorm(d, config.rms_norm_eps, dtype=dtype, param_dtype=param_dtype)

  def __call__(self, x, cos, sin, mask, kv_cache=None, cache_index=None, block: int = 128, impl: str = 'blockwise'):
    """
    Args:
      x: [B, T, hidden]; cos/sin: [B, T, head_dim].
      mask: bool [B, T, S] explicit mask (S = T, or cache length), or bool [B, T] key-padding mask (no cache
        only): causal + padding, computed blockwise (`attention.causal_attention`) without a [T, T] tensor.
        With impl 'cudnn' (no cache): None (all real), or a bool / segment-id [B, T] mask
        (`attention.fused_causal_attention`).
      kv_cache: optional (k, v, layer): the whole cache's k, v, each [L, B, Hkv, S, D], and this layer's index
        (int or int32 scalar); the new keys/values are written at [layer, b, :, cache_index[b] + t], then
        attention reads that layer (`attention.cache_attention`). cache_index: int32 [B] write offsets.
      block: query block length of the blockwise path.
      impl: 'blockwise' or 'cudnn' (`Qwen3VLText.attention_impl`; only read without a cache).

    Returns:
      out [B, T, hidden], the updated whole (k, v) or None.
    """
    b, t, _ = x.shape
    x2 = x.reshape(b * t, -1)                     # 2-D projections: faster backward on XLA:CPU (see MLP)
    q = self.q_norm(self.q_proj(x2).reshape(b, t, self.num_heads, self.head_dim))
    k = self.k_norm(self.k_proj(x2).reshape(b, t, self.num_kv_heads, self.head_dim))
    v = self.v_proj(x2).reshape(b, t, self.num_kv_heads, self.head_dim)
    q = rope.apply_rotary(q, cos, sin)
    k = rope.apply_rotary(k, cos, sin)
    groups = self.num_heads // self.num_kv_heads
    q = q.reshape(b, t, self.num_kv_heads, groups, self.head_dim)
    new_cache = None
    if kv_cache is not None:
      if mask.ndim == 2:
        raise ValueError('a [B, T] key mask is only valid without a KV cache')
      k_all, v_all, layer = kv_cache
      new_cache = (_write_layer(k_all, layer, k, cache_index), _write_layer(v_all, layer, v, cache_index))
      out = attention_lib.cache_attention(q, new_cache[0][layer], new_cache[1][layer], mask)
    elif impl == 'cudnn':
      out = attention_lib.fused_causal_attention(q, k, v, mask, implementation=FUSED_IMPLEMENTATION)
    elif mask.ndim == 2:
      out = attention_lib.causal_attention(q, k, v, mask, block)
    else:
      out = attention_lib.dense_attention(q, k, v, mask)
    out = out.reshape(b * t, self.num_heads * self.head_dim)
    return self.o_proj(out.astype(x.dtype)).reshape(b, t, -1), new_cache


class MLP(nnx.Module):
  """SwiGLU: down(silu(gate(x)) * up(x)), x [..., hidden] -> [..., hidden].

  Computed on x flattened to 2-D [N, hidden]: XLA:CPU fuses the activation's backward into a transposing copy for
  the weight gradient, which is ~1.5x slower with the leading batch axis kept (bench/step_speed.py). Same values.
  """

  def __init__(self, config: TextConfig, *, rngs, dtype, param_dtype):
    self.gate_proj = _linear(config.hidden_size, config.intermediate_size, rngs, dtype, param_dtype)
    self.up_proj = _linear(config.hidden_size, config.intermediate_size, rngs, dtype, param_dtype)
    self.down_proj = _linear(config.intermediate_size, config.hidden_size, rngs, dtype, param_dtype)

  def __call__(self, x):
    x2 = x.reshape(-1, x.shape[-1])
    return self.down_proj(jax.nn.silu(self.gate_proj(x2)) * self.up_proj(x2)).reshape(x.shape)


class DecoderLayer(nnx.Module):
  def __init__(self, config: TextConfig, *, rngs, dtype, param_dtype, layer_index: int = 0):
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.self_attn = Attention(config, **kw)
    self.mlp = moe.SparseMoeBlock(config, **kw) if config.is_sparse_layer(layer_index) else MLP(config, **kw)
    self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype=dtype, param_dtype=param_dtype)
    self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype=dtype,
                                            param_dtype=param_dtype)

  def __call__(self, x, cos, sin, mask, kv_cache=None, cache_index=None, block: int = 128, router_mask=None,
               impl: str = 'blockwise'):
    """-> (x [B, T, hidden], new cache or None, router stats or None): the stats (`moe.router_stats`) of a sparse
    layer given `router_mask` (float32 [B, T]), else None. `block`, `impl`: `Attention.__call__`."""
    h, new_cache = self.self_attn(self.input_layernorm(x), cos, sin, mask, kv_cache, cache_index, block, impl)
    x = x + h
    h = self.post_attention_layernorm(x)
    if router_mask is not None and isinstance(self.mlp, moe.SparseMoeBlock):
      h, stats = self.mlp(h, router_mask)
      return x + h, new_cache, stats
    return x + self.mlp(h), new_cache, None


def init_cache(config: TextConfig, batch: int, max_len: int, dtype=jnp.float32) -> dict:
  """Empty KV cache: {'k','v': dtype [L, B, Hkv, S, D] (head-major), 'mask': bool [B, S] (all False)}."""
  shape = (config.num_hidden_layers, batch, config.num_key_value_heads, max_len, config.head_dim)
  return {'k': jnp.zeros(shape, dtype), 'v': jnp.zeros(shape, dtype), 'mask': jnp.zeros((batch, max_len), bool)}


def attention_mask_for(attention_mask, batch: int, length: int, cache=None, cache_index=None):
  """bool [B, T, S]: causal + padding, or causal within packed segments for int segment ids (no cache, S = T;
  `attention.segment_mask`), or cache-slot validity + causal (S = cache length; bool attention_mask only).

  Returns (mask, new_cache_mask or None).
  """
  if attention_mask is None:
    attention_mask = jnp.ones((batch, length), bool)
  if cache is None:   # causal within each packed segment (`attention.segment_mask`; a bool mask is one segment)
    return attention_lib.segment_mask(jnp.asarray(attention_mask)), None
  attention_mask = jnp.asarray(attention_mask).astype(bool)
  slot_mask = _write_rows(cache['mask'], attention_mask, cache_index)      # [B, S]
  slots = jnp.arange(slot_mask.shape[1])
  frontier = cache_index[:, None] + jnp.arange(length)[None, :]          # [B, T]
  mask = slot_mask[:, None, :] & (slots[None, None, :] <= frontier[:, :, None])
  return mask, slot_mask


class Qwen3VLText(nnx.Module):
  """Embedding + decoder layers + final norm (HF `Qwen3VLTextModel`).

  Without a cache, attention is causal + padding and by default computed blockwise (`attention_impl =
  'blockwise'`, query blocks of `attention_block`, `attention.causal_attention`); `attention_impl = 'dense'`
  builds the [B, T, T] mask and the full score matrix (reference); `attention_impl = 'cudnn'` (NVIDIA GPUs) runs
  cuDNN's fused flash attention through `jax.nn.dot_product_attention` (`attention.fused_causal_attention`, with
  `FUSED_IMPLEMENTATION`). Both are plain attributes that may be set after
  construction. With a cache the dense path is always used.

  `remat = True` (also a plain attribute) rematerialises each decoder layer in the backward pass
  (`nnx.remat` / `jax.checkpoint`, same numerics, activation memory of one layer instead of all).

  `scan_layers = True` (constructor argument: it fixes the parameter layout) stores the L decoder layers as one
  `DecoderLayer` whose parameters carry a leading layer axis ([L, ...], MaxText's `scan_layers`) and runs them with
  `jax.lax.scan`: one compiled layer body instead of L, so compile time and program size do not grow with depth.
  Same initial values (the layers are built one by one from the same `rngs`, then stacked) and the same outputs as
  the unrolled loop. Needs identical layers: a MoE config mixing dense and sparse layers raises ValueError.
  `weights.py` and `sharding.py` read and write the stacked layout under the per-layer HF names.
  """

  attention_impl: str = 'blockwise'
  attention_block: int = 128
  remat: bool = False

  def __init__(self, config: TextConfig, *, rngs: nnx.Rngs, dtype=jnp.float32, param_dtype=jnp.float32,
               scan_layers: bool = False):
    self.config = config
    self.scan_layers = scan_layers
    self.embed_tokens = nnx.Embed(config.table_rows, config.hidden_size, dtype=dtype, param_dtype=param_dtype,
                                  rngs=rngs)
    if scan_layers and len({config.is_sparse_layer(i) for i in range(config.num_hidden_layers)}) > 1:
      raise ValueError('scan_layers needs identical decoder layers; this MoE config mixes dense and sparse layers '
                       f'(mlp_only_layers={config.mlp_only_layers}, decoder_sparse_step={config.decoder_sparse_step})')
    layers = [DecoderLayer(config, rngs=rngs, dtype=dtype, param_dtype=param_dtype, layer_index=i)
              for i in range(config.num_hidden_layers)]
    if scan_layers:
      graphdef = nnx.graphdef(layers[0])
      stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *(nnx.state(layer) for layer in layers))
      self.layers = nnx.merge(graphdef, stacked)
    else:
      self.layers = nnx.List(layers)
    self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype=dtype, param_dtype=param_dtype)

  def __call__(self, inputs_embeds, position_ids, attention_mask=None, visual_pos_mask=None, deepstack=(),
               cache=None, cache_index=None, router_stats: bool = False):
    """
    Args:
      inputs_embeds: [B, T, hidden] (image features already scattered in).
      position_ids: int [3, B, T].
      attention_mask: [B, T] bool (True = real token), int segment ids of packed rows (0 = padding, 1, 2, ...
        the sequences of a row: each attends within itself; `attention.segment_mask`; no cache), or None.
      visual_pos_mask: bool [B, T] image-token positions (for DeepStack) or None.
      deepstack: sequence of [N_img_tokens, hidden] added at `visual_pos_mask` after layers 0, 1, ...
        (HF `Qwen3VLTextModel._deepstack_process`).
      cache, cache_index: see module docstring.
      router_stats: also return the router-loss statistics of the sparse layers (`moe.router_stats` stacked over
        them: [L_sparse, E] / [L_sparse], over the tokens of `attention_mask`, as HF `load_balancing_loss_func`
        counts them); None for a model without sparse layers. False: the forward and its return as without it.

    Returns:
      hidden [B, T, hidden] after the final norm, updated cache (or None)[, router stats (dict) or None].
    """
    c = self.config
    x = sharding.constrain(inputs_embeds, RESIDUAL_AXES)
    b, t, _ = x.shape
    cos, sin = rope.mrope_cos_sin(position_ids, c.head_dim, c.rope_theta, c.mrope_section, c.mrope_interleaved,
                                  dtype=x.dtype)
    if cache is None and self.attention_impl == 'blockwise':
      mask = jnp.ones((b, t), bool) if attention_mask is None else _key_mask(attention_mask)
      slot_mask = None
    elif cache is None and self.attention_impl == 'cudnn':
      mask = None if attention_mask is None else _key_mask(attention_mask)
      slot_mask = None
    elif self.attention_impl in ('blockwise', 'dense', 'cudnn'):
      mask, slot_mask = attention_mask_for(attention_mask, b, t, cache, cache_index)
    else:
      raise ValueError(f'unknown attention_impl {self.attention_impl!r}')
    if cache is not None:
      cache_index = jnp.asarray(cache_index, jnp.int32)
    kv_all = None if cache is None else (cache['k'], cache['v'])
    router_mask = None
    if router_stats and any(c.is_sparse_layer(i) for i in range(c.num_hidden_layers)):
      router_mask = (jnp.ones((b, t), jnp.float32) if attention_mask is None
                     else (jnp.asarray(attention_mask) > 0).astype(jnp.float32))
    if self.scan_layers:
      x, kv_all, stats = self._scan(x, cos, sin, mask, kv_all, cache_index, visual_pos_mask, deepstack, router_mask)
    else:
      x, kv_all, stats = self._unrolled(x, cos, sin, mask, kv_all, cache_index, visual_pos_mask, deepstack,
                                        router_mask)
    new_cache = None if cache is None else {'k': kv_all[0], 'v': kv_all[1], 'mask': slot_mask}
    if router_stats:
      return self.norm(x), new_cache, stats
    return self.norm(x), new_cache

  def _unrolled(self, x, cos, sin, mask, kv_all, cache_index, visual_pos_mask, deepstack, router_mask=None):
    """Python loop over the layer list; kv_all: ([L, B, Hkv, S, D],) * 2, updated layer by layer, or None.
    Returns (x, kv_all, router stats stacked over the sparse layers, or None without router_mask)."""
    block, impl = self.attention_block, self.attention_impl
    call = lambda lyr, x, cos, sin, mask, kv, index, rmask: lyr(x, cos, sin, mask, kv, index, block, rmask, impl)
    run = nnx.remat(call) if self.remat else call
    per_layer = []
    for i, layer in enumerate(self.layers):
      kv = None if kv_all is None else (kv_all[0], kv_all[1], i)
      x, kv, stats = run(layer, x, cos, sin, mask, kv, cache_index, router_mask)
      kv_all = kv
      if stats is not None:
        per_layer.append(stats)
      if i < len(deepstack):
        x = scatter_add_rows(x, visual_pos_mask, deepstack[i])
      x = sharding.constrain(x, RESIDUAL_AXES)
    return x, kv_all, (jax.tree.map(lambda *s: jnp.stack(s), *per_layer) if per_layer else None)

  def _scan(self, x, cos, sin, mask, kv_all, cache_index, visual_pos_mask, deepstack, router_mask=None):
    """`jax.lax.scan` over the stacked layer; DeepStack features are added after layer i < len(deepstack).
    Returns (x, kv_all, router stats stacked over the layers (the scan's outputs), or None without router_mask)."""
    block, impl = self.attention_block, self.attention_impl
    graphdef, stacked = nnx.split(self.layers)
    ds = jnp.stack([d.astype(x.dtype) for d in deepstack]) if deepstack else None   # [n_ds, N, hidden]

    def body(carry, xs):   # the cache (whole, [L, ...]) is carried: each layer writes its slots in place
      h, kv = carry
      layer_state, i = xs
      h, kv, stats = nnx.merge(graphdef, layer_state)(h, cos, sin, mask, None if kv is None else (*kv, i),
                                                      cache_index, block, router_mask, impl)
      if ds is not None:   # only layers i < len(deepstack) pay for the scatter
        h = jax.lax.cond(i < ds.shape[0],
                         lambda h: scatter_add_rows(h, visual_pos_mask, ds[jnp.minimum(i, ds.shape[0] - 1)]),
                         lambda h: h, h)
      return (sharding.constrain(h, RESIDUAL_AXES), kv), stats

    if self.remat:
      body = jax.checkpoint(body)
    (x, kv_all), stats = jax.lax.scan(body, (x, kv_all), (stacked, jnp.arange(self.config.num_hidden_layers)))
    return x, kv_all, stats


def _key_mask(attention_mask):
  """The blockwise path's mask: bool as given, any integer mask as int32 segment ids."""
  mask = jnp.asarray(attention_mask)
  return mask if mask.dtype == jnp.bool_ else mask.astype(jnp.int32)


def _gather_index(pos_mask, n: int):
  """For each True in pos_mask [B, T] (row-major), the index of its row in an [n, ...] feature array."""
  flat = pos_mask.reshape(-1)
  return jnp.clip(jnp.cumsum(flat) - 1, 0, max(n - 1, 0)).reshape(pos_mask.shape)


def scatter_rows(x, pos_mask, features):
  """x [B, T, H] with positions where pos_mask is True replaced, in row-major order, by features [N, H]
  (HF `masked_scatter`). The caller guarantees pos_mask.sum() == N."""
  gathered = features[_gather_index(pos_mask, features.shape[0])].astype(x.dtype)
  return jnp.where(pos_mask[..., None], gathered, x)


def scatter_add_rows(x, pos_mask, features):
  """x [B, T, H] plus features [N, H] at the True positions of pos_mask (HF `_deepstack_process`)."""
  gathered = features[_gather_index(pos_mask, features.shape[0])].astype(x.dtype)
  return jnp.where(pos_mask[..., None], x + gathered, x)
